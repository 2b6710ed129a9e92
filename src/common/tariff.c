/* tariff.c: interval costs under a price schedule (see tariff.h). */
#include "gpurent/tariff.h"
#include "gpurent/money.h"

int tariff_due(const struct price_point *pp, size_t n, int64_t cards, int64_t start, int64_t end, int64_t *out)
{
    *out = 0;
    if (end < start || cards < 0)
        return MONEY_ERR_NEGATIVE;
    int64_t total = 0;
    for (size_t k = 0; k < n; k++) {
        int64_t from = pp[k].effective_at > start ? pp[k].effective_at : start;
        int64_t to = k + 1 < n && pp[k + 1].effective_at < end ? pp[k + 1].effective_at : end;
        if (to <= from)
            continue;
        int64_t piece, seconds;
        /* A piece longer than 64 bits of seconds cannot be priced. */
        if (__builtin_sub_overflow(to, from, &seconds))
            return MONEY_ERR_OVERFLOW;
        int rc = money_accrue(pp[k].card_hour, cards, seconds, &piece);
        if (rc != MONEY_OK || (rc = money_add(total, piece, &total)) != MONEY_OK)
            return rc;
    }
    *out = total;
    return MONEY_OK;
}

int64_t tariff_price_at(const struct price_point *pp, size_t n, int64_t t)
{
    int64_t price = -1;
    for (size_t k = 0; k < n && pp[k].effective_at <= t; k++)
        price = pp[k].card_hour;
    return price;
}
