/* tariff.c: interval costs under a price schedule (see tariff.h). */
#include "gpurent/tariff.h"
#include "gpurent/money.h"

/* The sum over the schedule's periods that overlap [start, end) of
 * piece(price, quantity, seconds): card time and storage walk the same way. */
static int periods_due(const struct price_point *pp, size_t n, int64_t quantity, int64_t start, int64_t end,
                       int (*piece)(int64_t price, int64_t quantity, int64_t seconds, int64_t *out), int64_t *out)
{
    *out = 0;
    if (end < start || quantity < 0)
        return MONEY_ERR_NEGATIVE;
    int64_t total = 0;
    for (size_t k = 0; k < n; k++) {
        int64_t from = pp[k].effective_at > start ? pp[k].effective_at : start;
        int64_t to = k + 1 < n && pp[k + 1].effective_at < end ? pp[k + 1].effective_at : end;
        if (to <= from)
            continue;
        int64_t cost, seconds;
        /* A piece longer than 64 bits of seconds cannot be priced. */
        if (__builtin_sub_overflow(to, from, &seconds))
            return MONEY_ERR_OVERFLOW;
        int rc = piece(pp[k].card_hour, quantity, seconds, &cost);
        if (rc != MONEY_OK || (rc = money_add(total, cost, &total)) != MONEY_OK)
            return rc;
    }
    *out = total;
    return MONEY_OK;
}

int tariff_due(const struct price_point *pp, size_t n, int64_t cards, int64_t start, int64_t end, int64_t *out)
{
    return periods_due(pp, n, cards, start, end, money_accrue, out);
}

int64_t tariff_price_at(const struct price_point *pp, size_t n, int64_t t)
{
    int64_t price = -1;
    for (size_t k = 0; k < n && pp[k].effective_at <= t; k++)
        price = pp[k].card_hour;
    return price;
}

/* floor(price × size × seconds / month), exact with 128-bit intermediates:
 * price and size are bounded far below 2^63 each, but their product with
 * seconds is checked rather than trusted. */
static int storage_piece(int64_t price, int64_t size_gb, int64_t seconds, int64_t *out)
{
    *out = 0;
    if (price < 0 || size_gb < 0 || seconds < 0)
        return MONEY_ERR_NEGATIVE;
    unsigned __int128 rate = (unsigned __int128)price * (unsigned __int128)size_gb;
    if (rate == 0 || seconds == 0)
        return MONEY_OK;
    if ((unsigned __int128)seconds > ~(unsigned __int128)0 / rate)
        return MONEY_ERR_OVERFLOW;
    unsigned __int128 micro = rate * (unsigned __int128)seconds / (unsigned __int128)TARIFF_MONTH_SECONDS;
    if (micro > (unsigned __int128)INT64_MAX)
        return MONEY_ERR_OVERFLOW;
    *out = (int64_t)micro;
    return MONEY_OK;
}

int tariff_storage_due(const struct price_point *pp, size_t n, int64_t size_gb, int64_t start, int64_t end,
                       int64_t *out)
{
    return periods_due(pp, n, size_gb, start, end, storage_piece, out);
}

size_t tariff_storage_schedule(const struct price_point *global, size_t ng, const struct price_point *region,
                               size_t nr, struct price_point *out)
{
    size_t o = 0;
    for (size_t k = 0; k < ng && (nr == 0 || global[k].effective_at < region[0].effective_at); k++)
        out[o++] = global[k];
    for (size_t k = 0; k < nr; k++)
        out[o++] = region[k];
    return o;
}
