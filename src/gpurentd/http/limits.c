/* limits.c: the money maxima (max_price_per_card_hour, max_topup, max_grant,
 * max_balance) as the API enforces them, in one wording for every route: a
 * 400 invalid_field naming the body field, the amount and the limit; and
 * what a new price's body must be, for card and storage prices alike. */
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "http/api.h"
#include "store/store.h"

void limit_refuse(struct http_request *req, const char *field, int64_t amount, const char *option, int64_t limit)
{
    char a[MONEY_FMT_LEN], l[MONEY_FMT_LEN];
    http_error(req, ERR_INVALID_FIELD, field, "%s %s is over %s %s %s", field, money_format(amount, a), option,
               money_format(limit, l), daemon_config->currency);
}

void limit_refuse_balance(struct http_request *req, const char *field, const char *label, const char *user_id,
                          int64_t amount)
{
    /* The refusal was decided inside the transaction that would have
     * written; this read, after it rolled back, only words the message, so
     * a change in between can make the figure stale but never the verdict. */
    struct store *s = store_thread();
    int64_t cash, credit, held, after;
    char a[MONEY_FMT_LEN], t[MONEY_FMT_LEN], l[MONEY_FMT_LEN];
    money_format(amount, a);
    money_format(daemon_config->max_balance_micro, l);
    if (s && store_user_holdings(s, user_id, &cash, &credit) == STORE_OK &&
        money_add(cash, credit, &held) == MONEY_OK && money_add(held, amount, &after) == MONEY_OK)
        http_error(req, ERR_INVALID_FIELD, field, "%s %s would take the balance of %s to %s, over max_balance %s %s",
                   label ? label : field, a, user_id, money_format(after, t), l, daemon_config->currency);
    else
        http_error(req, ERR_INVALID_FIELD, field, "%s %s would take the balance of %s over max_balance %s %s",
                   label ? label : field, a, user_id, l, daemon_config->currency);
}

int limit_price_body(struct http_request *req, const json_t *body, const char *field, const char *example,
                     const char *option, int64_t max, int64_t now, int64_t *amount, int64_t *effective_at)
{
    const char *eff = json_string_value(json_object_get(body, "effective_at"));
    *effective_at = now;
    if (json_money_value(json_object_get(body, field), amount) < 0)
        http_error(req, ERR_INVALID_FIELD, field, "%s must be an amount like \"%s\" (up to 6 decimals, no sign)", field,
                   example);
    /* Billing multiplies the price by cards (or GB) and seconds: the cap
     * keeps that product far inside 64 bits. */
    else if (*amount > max)
        limit_refuse(req, field, *amount, option, max);
    else if (eff && json_time_parse(eff, effective_at) < 0)
        http_error(req, ERR_INVALID_FIELD, "effective_at", "effective_at must be a UTC time like 2026-12-01T00:00:00Z");
    else if (*effective_at < now)
        http_error(req, ERR_INVALID_FIELD, "effective_at", "prices never change backwards: effective_at is in the past");
    else
        return 0;
    return -1;
}
