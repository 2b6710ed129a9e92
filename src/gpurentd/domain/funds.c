/* funds.c: whether a user may start cards: funds for a minimum run of
 * them and of everything else they hold, each at its own price, counted in
 * the transaction that claims the cards. */
#include "domain/domain.h"
#include "domain/ledger.h"
#include "gpurent/money.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>

int funds_check_minimum_run(struct store *s, const char *user_id, const char *gpu_model, int64_t cards,
                            int64_t at, struct op_outcome *o)
{
    int64_t price = ledger_price_at(s, gpu_model, at);
    if (price < 0) {
        o->failed = 1;
        o->error = ERR_INVALID_FIELD;
        snprintf(o->field, sizeof o->field, "gpu_type");
        snprintf(o->message, sizeof o->message, "%s has no price yet", gpu_model);
        return REFUSED;
    }
    /* Funds must cover a minimum run of this instance and of every other
     * one the user already holds cards for, each at its own price, so that
     * concurrent starts cannot count the same money twice. */
    int64_t seconds = daemon_config->min_run_minutes * 60, need;
    if (money_accrue(price, cards, seconds, &need) != MONEY_OK)
        return STORE_ERROR;
    struct model_cards *held;
    size_t n_held;
    int rc = store_user_cards_by_model(s, user_id, &held, &n_held);
    if (rc != STORE_OK)
        return rc;
    for (size_t i = 0; i < n_held && rc == STORE_OK; i++) {
        int64_t p = ledger_price_at(s, held[i].gpu_model, at), more;
        if (p > 0 && (money_accrue(p, held[i].cards, seconds, &more) != MONEY_OK || money_add(need, more, &need) != MONEY_OK))
            rc = STORE_ERROR;
    }
    free(held);
    if (rc != STORE_OK)
        return rc;
    struct funds f;
    rc = ledger_funds_now(s, user_id, at, &f);
    if (rc != STORE_OK)
        return rc;
    if (f.available >= need)
        return STORE_OK;
    char need_s[MONEY_FMT_LEN], have_s[MONEY_FMT_LEN];
    money_format(need, need_s);
    money_format(f.available, have_s);
    o->failed = 1;
    o->error = ERR_INSUFFICIENT_FUNDS;
    json_decref(o->extra);
    o->extra = json_pack("{s:s, s:s, s:s}", "needed", need_s, "available", have_s, "currency",
                         daemon_config->currency);
    snprintf(o->message, sizeof o->message,
             "%s %s needed for a %lld-minute minimum run (with your other running cards); %s available",
             need_s, daemon_config->currency, (long long)daemon_config->min_run_minutes, have_s);
    return REFUSED;
}
