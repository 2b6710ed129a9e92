/* ledger.c: money operations on the double-entry ledger (see ledger.h). */
#include "domain/ledger.h"
#include "domain/domain.h"
#include "gpurent/log.h"
#include "gpurent/money.h"
#include "gpurent/tariff.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GRANTS_MAX 64 /* grants read at once */

int ledger_funds(struct store *s, const char *user_id, int64_t at, struct funds *out)
{
    memset(out, 0, sizeof *out);
    int rc = store_user_funds(s, user_id, at, &out->cash, &out->credit);
    if (rc != STORE_OK) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->available = out->cash + out->credit;
    return STORE_OK;
}

int ledger_unbilled(struct store *s, const char *user_id, int64_t at, int64_t *out)
{
    *out = 0;
    struct billable *b;
    size_t n;
    struct price_book book = {0};
    int rc = store_billables(s, user_id, &b, &n);
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        int64_t due;
        if ((rc = price_book_due(s, &book, &b[i], at, &due)) == STORE_OK && due > b[i].billed &&
            money_add(*out, due - b[i].billed, out) != MONEY_OK)
            rc = STORE_ERROR;
    }
    price_book_free(&book);
    free(b);
    int64_t storage = 0;
    if (rc == STORE_OK && (rc = ledger_storage_owed(s, user_id, at, &storage)) == STORE_OK &&
        money_add(*out, storage, out) != MONEY_OK)
        rc = STORE_ERROR;
    if (rc != STORE_OK) {
        *out = 0;
        return rc == PRICE_OVERFLOW ? STORE_ERROR : rc;
    }
    return STORE_OK;
}

int ledger_storage_owed(struct store *s, const char *user_id, int64_t at, int64_t *out)
{
    *out = 0;
    struct storage_billable *v;
    size_t n;
    struct storage_book book = {0};
    int rc = store_storage_billables(s, user_id, &v, &n);
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        int64_t due;
        if ((rc = storage_book_due(s, &book, &v[i], at, &due)) == STORE_OK && due > v[i].billed &&
            money_add(*out, due - v[i].billed, out) != MONEY_OK)
            rc = STORE_ERROR;
    }
    storage_book_free(&book);
    free(v);
    if (rc != STORE_OK) {
        *out = 0;
        return rc == PRICE_OVERFLOW ? STORE_ERROR : rc;
    }
    return STORE_OK;
}

int ledger_storage_burn(struct store *s, const char *user_id, int64_t at, int64_t *per_hour)
{
    *per_hour = 0;
    struct storage_billable *v;
    size_t n;
    struct storage_book book = {0};
    int rc = store_storage_billables(s, user_id, &v, &n);
    /* The rate of every live volume at its price now, then the hour of it
     * floored once: what an hour of them all costs. */
    __int128 rate = 0;
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        if (v[i].deleted_at)
            continue;
        int64_t p = storage_book_price_at(s, &book, v[i].region, at);
        if (p < 0)
            rc = (int)p;
        else
            rate += (__int128)p * v[i].size_gb;
    }
    storage_book_free(&book);
    free(v);
    if (rc != STORE_OK)
        return rc;
    __int128 hour = rate * 3600 / TARIFF_MONTH_SECONDS;
    if (hour > INT64_MAX)
        return STORE_ERROR;
    *per_hour = (int64_t)hour;
    return STORE_OK;
}

int ledger_funds_now(struct store *s, const char *user_id, int64_t at, struct funds *out)
{
    int rc = ledger_funds(s, user_id, at, out);
    if (rc != STORE_OK || (rc = ledger_unbilled(s, user_id, at, &out->unbilled)) != STORE_OK) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->available = out->unbilled < out->cash + out->credit ? out->cash + out->credit - out->unbilled : 0;
    return STORE_OK;
}

/* What the user's running cards and live volumes cost an hour at `at`. */
static int burn_rate(struct store *s, const char *user_id, int64_t at, int64_t *rate)
{
    int64_t cards = store_user_burn_rate(s, user_id, at), storage;
    if (cards < 0)
        return (int)cards;
    int rc = ledger_storage_burn(s, user_id, at, &storage);
    if (rc != STORE_OK)
        return rc;
    return money_add(cards, storage, rate) == MONEY_OK ? STORE_OK : STORE_ERROR;
}

/* Minutes that `available` lasts at `rate` an hour (-1: nothing burns), and
 * whether that is under low_balance_minutes. */
static void runway_of(int64_t available, int64_t rate, int64_t *minutes, int *low)
{
    *minutes = rate > 0 ? (int64_t)((__int128)available * 60 / rate) : -1;
    *low = rate > 0 && *minutes < daemon_config->low_balance_minutes;
}

int ledger_runway(struct store *s, const char *user_id, int64_t at, struct funds *f, int64_t *burn,
                  int64_t *runway_minutes, int *low)
{
    struct funds mine;
    if (!f)
        f = &mine;
    int64_t rate;
    int rc = burn_rate(s, user_id, at, &rate);
    if (rc != STORE_OK || (rc = ledger_funds_now(s, user_id, at, f)) != STORE_OK)
        return rc;
    if (burn)
        *burn = rate;
    runway_of(f->available, rate, runway_minutes, low);
    return STORE_OK;
}

int ledger_low_balance(struct store *s, const char *user_id, int64_t at, const struct funds *known, int *low)
{
    *low = 0;
    int64_t rate, minutes;
    struct funds f;
    int rc = burn_rate(s, user_id, at, &rate);
    if (rc != STORE_OK || rate == 0)
        return rc;
    if (!known && (rc = ledger_funds_now(s, user_id, at, &f)) != STORE_OK)
        return rc;
    runway_of(known ? known->available : f.available, rate, &minutes, low);
    return STORE_OK;
}

/* Refuses money that would take what the user holds (cash and credit not
 * voided) over max_balance. Read in the caller's transaction, before its
 * write: writers take turns, so no other top-up or grant can slip in
 * between the check and the write. */
static int within_max_balance(struct store *s, const char *user_id, int64_t amount)
{
    int64_t cash, credit, held;
    int rc = store_user_holdings(s, user_id, &cash, &credit);
    if (rc != STORE_OK)
        return rc;
    if (money_add(cash, credit, &held) != MONEY_OK || money_add(held, amount, &held) != MONEY_OK ||
        held > daemon_config->max_balance_micro)
        return LEDGER_OVER_BALANCE;
    return STORE_OK;
}

int ledger_grant(struct store *s, const char *user_id, const char *source, int64_t amount, int64_t expires_at,
                 int64_t at, const char *reason, char id_out[ID_MAX])
{
    struct grant g = {.amount = amount, .remaining = amount, .expires_at = expires_at, .created_at = at};
    if (amount <= 0 || id_new("grt", g.id) < 0)
        return STORE_ERROR;
    int rc = within_max_balance(s, user_id, amount);
    if (rc != STORE_OK)
        return rc;
    snprintf(g.user_id, sizeof g.user_id, "%s", user_id);
    snprintf(g.source, sizeof g.source, "%s", source);
    rc = store_grant_insert(s, &g);
    if (rc != STORE_OK)
        return rc;
    struct ledger_leg legs[2] = {{.amount = amount}, {.amount = -amount}};
    snprintf(legs[0].account_id, sizeof legs[0].account_id, "grant:%s", g.id);
    snprintf(legs[0].grant_id, sizeof legs[0].grant_id, "%s", g.id);
    snprintf(legs[1].account_id, sizeof legs[1].account_id, "promotion");
    struct ledger_entry e = {.at = at, .kind = "grant", .user_id = user_id, .reason = reason, .grant_id = g.id};
    /* Money came in: the next time the funds run low is worth a notice. */
    if ((rc = store_ledger_post(s, &e, legs, 2, at)) != STORE_OK ||
        (rc = store_user_set_low_balance_noticed(s, user_id, 0)) != STORE_OK)
        return rc;
    if (id_out)
        memcpy(id_out, g.id, ID_MAX);
    return STORE_OK;
}

int ledger_topup(struct store *s, const char *user_id, const char *payment_id, int64_t amount, const char *source,
                 int64_t at, char id_out[ID_MAX], int *duplicate)
{
    *duplicate = 0;
    struct topup t;
    int rc = store_topup_by_payment(s, payment_id, &t);
    if (rc == STORE_OK) {
        if (strcmp(t.user_id, user_id) != 0 || t.amount != amount)
            return STORE_CONFLICT;
        *duplicate = 1;
        memcpy(id_out, t.id, ID_MAX);
        return STORE_OK;
    }
    if (rc != STORE_NOT_FOUND)
        return rc;
    memset(&t, 0, sizeof t);
    if (amount <= 0 || id_new("top", t.id) < 0)
        return STORE_ERROR;
    if ((rc = within_max_balance(s, user_id, amount)) != STORE_OK)
        return rc;
    snprintf(t.user_id, sizeof t.user_id, "%s", user_id);
    snprintf(t.payment_id, sizeof t.payment_id, "%s", payment_id);
    snprintf(t.source, sizeof t.source, "%s", source);
    t.amount = amount;
    t.created_at = at;
    /* The payment id was found unused in this same transaction, so a
     * conflict from here on is not a repeated payment: it fails as the
     * error it is, and is never reported as a collision. */
    if ((rc = store_topup_insert(s, &t)) != STORE_OK)
        return rc == STORE_CONFLICT ? STORE_ERROR : rc;
    struct ledger_leg legs[2] = {{.amount = amount}, {.amount = -amount}};
    snprintf(legs[0].account_id, sizeof legs[0].account_id, "cash:%s", user_id);
    snprintf(legs[1].account_id, sizeof legs[1].account_id, "payments");
    char reason[200];
    snprintf(reason, sizeof reason, "top-up (payment %.128s)", payment_id);
    struct ledger_entry e = {.at = at, .kind = "topup", .user_id = user_id, .reason = reason, .topup_id = t.id};
    if ((rc = store_ledger_post(s, &e, legs, 2, at)) != STORE_OK)
        return rc == STORE_CONFLICT ? STORE_ERROR : rc;
    if ((rc = store_user_set_low_balance_noticed(s, user_id, 0)) != STORE_OK)
        return rc;
    memcpy(id_out, t.id, ID_MAX);
    return STORE_OK;
}

/* Draws amount from the user's grants then cash into revenue, posted as e
 * (its kind and what it names). */
static int charge(struct store *s, const char *user_id, int64_t amount, int64_t at, const struct ledger_entry *e);
/* The same into the n_dest legs of dest (their amounts sum to amount). */
static int charge_to(struct store *s, const char *user_id, int64_t amount, int64_t at, const struct ledger_entry *e,
                     const struct ledger_leg *dest, size_t n_dest);

int ledger_charge_app_call(struct store *s, const char *consumer_id, const char *publisher_id, int64_t charge_amount,
                           int64_t fee, int64_t at, const char *call_id, const char *reason)
{
    if (fee < 0 || fee > charge_amount)
        return STORE_ERROR;
    struct ledger_leg dest[2] = {{.amount = charge_amount - fee}, {.amount = fee}};
    snprintf(dest[0].account_id, sizeof dest[0].account_id, "cash:%s", publisher_id);
    snprintf(dest[1].account_id, sizeof dest[1].account_id, "revenue");
    struct ledger_entry e = {.at = at, .kind = "app_call", .user_id = consumer_id, .reason = reason,
                             .app_call_id = call_id, .payee_id = charge_amount > fee ? publisher_id : NULL};
    int rc = charge_to(s, consumer_id, charge_amount, at, &e, dest, 2);
    /* The publisher earned: as for a top-up, their next low balance is
     * worth a notice. */
    if (rc == STORE_OK && e.payee_id)
        rc = store_user_set_low_balance_noticed(s, publisher_id, 0);
    return rc;
}

int ledger_charge(struct store *s, const char *user_id, int64_t amount, int64_t at, const char *instance_id,
                  int64_t interval_id, const char *reason)
{
    struct ledger_entry e = {.at = at,
                             .kind = "usage",
                             .user_id = user_id,
                             .reason = reason,
                             .instance_id = instance_id,
                             .interval_id = interval_id};
    return charge(s, user_id, amount, at, &e);
}

int ledger_charge_storage(struct store *s, const char *user_id, int64_t amount, int64_t at, const char *volume_id,
                          const char *reason)
{
    struct ledger_entry e = {.at = at, .kind = "storage", .user_id = user_id, .reason = reason, .volume_id = volume_id};
    return charge(s, user_id, amount, at, &e);
}

static int charge(struct store *s, const char *user_id, int64_t amount, int64_t at, const struct ledger_entry *e)
{
    struct ledger_leg revenue = {.account_id = "revenue", .amount = amount};
    return charge_to(s, user_id, amount, at, e, &revenue, 1);
}

static int charge_to(struct store *s, const char *user_id, int64_t amount, int64_t at, const struct ledger_entry *e,
                     const struct ledger_leg *dest, size_t n_dest)
{
    if (amount == 0)
        return STORE_OK;
    if (amount < 0)
        return STORE_ERROR;
    /* One leg per grant drawn, then cash, then revenue: grown as needed, as
     * a user may hold more grants than one read returns. */
    size_t cap = GRANTS_MAX + 2, nl = 0;
    struct ledger_leg *legs = calloc(cap, sizeof *legs);
    if (!legs)
        return STORE_ERROR;
    int64_t left = amount;
    int rc = STORE_OK;
    while (left > 0) {
        /* Usage of the second before `at` may still draw on a grant expiring at `at`. */
        struct grant g[GRANTS_MAX];
        size_t n;
        if ((rc = store_grants_spendable(s, user_id, at - 1, g, GRANTS_MAX, &n)) != STORE_OK)
            goto done;
        for (size_t i = 0; i < n && left > 0; i++) {
            int64_t take = g[i].remaining < left ? g[i].remaining : left;
            if ((rc = store_grant_spend(s, g[i].id, take)) != STORE_OK)
                goto done;
            if (nl + 1 + n_dest >= cap) {
                struct ledger_leg *grown = realloc(legs, 2 * cap * sizeof *legs);
                if (!grown) {
                    rc = STORE_ERROR;
                    goto done;
                }
                memset(grown + cap, 0, cap * sizeof *legs);
                legs = grown;
                cap *= 2;
            }
            snprintf(legs[nl].account_id, sizeof legs[nl].account_id, "grant:%.31s", g[i].id);
            snprintf(legs[nl].grant_id, sizeof legs[nl].grant_id, "%.31s", g[i].id);
            legs[nl++].amount = -take;
            left -= take;
        }
        if (n < GRANTS_MAX) /* every grant drawn; the rest is cash */
            break;
    }
    if (left > 0) {
        char cash[48];
        snprintf(cash, sizeof cash, "cash:%s", user_id);
        if (store_account_balance(s, cash) < left) {
            rc = STORE_CONFLICT;
            goto done;
        }
        snprintf(legs[nl].account_id, sizeof legs[nl].account_id, "%s", cash);
        legs[nl++].amount = -left;
    }
    for (size_t i = 0; i < n_dest; i++)
        legs[nl++] = dest[i];
    rc = store_ledger_post(s, e, legs, nl, at);
done:
    free(legs);
    return rc;
}

int ledger_expire_grants(struct store *s, const char *user_id, int64_t at)
{
    for (;;) {
        struct grant g[GRANTS_MAX];
        size_t n = 0;
        int rc = store_grants_expired(s, user_id, at, g, GRANTS_MAX, &n);
        if (rc != STORE_OK)
            return rc;
        for (size_t i = 0; i < n; i++) {
            struct ledger_leg legs[2] = {{.amount = -g[i].remaining}, {.amount = g[i].remaining}};
            snprintf(legs[0].account_id, sizeof legs[0].account_id, "grant:%.31s", g[i].id);
            snprintf(legs[0].grant_id, sizeof legs[0].grant_id, "%.31s", g[i].id);
            snprintf(legs[1].account_id, sizeof legs[1].account_id, "promotion");
            struct ledger_entry e = {.at = g[i].expires_at,
                                     .kind = "expiry",
                                     .user_id = g[i].user_id,
                                     .reason = "credit expired; the unspent remainder is void",
                                     .grant_id = g[i].id};
            if ((rc = store_ledger_post(s, &e, legs, 2, at)) != STORE_OK ||
                (rc = store_grant_void(s, g[i].id, g[i].expires_at)) != STORE_OK)
                return rc;
        }
        if (n < GRANTS_MAX)
            return STORE_OK;
    }
}

int ledger_unexpire_early_grants(struct store *s, int64_t at)
{
    for (;;) {
        struct grant g[GRANTS_MAX];
        size_t n = 0;
        int rc = store_grants_voided_early(s, at, g, GRANTS_MAX, &n);
        if (rc != STORE_OK)
            return rc;
        for (size_t i = 0; i < n; i++) {
            int64_t back = g[i].remaining;
            if (back < 0 || back > g[i].amount) {
                log_error("ledger: grant %s was voided %lld, outside 0..%lld", g[i].id, (long long)back,
                          (long long)g[i].amount);
                return STORE_ERROR;
            }
            if (back > 0) {
                struct ledger_leg legs[2] = {{.amount = back}, {.amount = -back}};
                snprintf(legs[0].account_id, sizeof legs[0].account_id, "grant:%.31s", g[i].id);
                snprintf(legs[0].grant_id, sizeof legs[0].grant_id, "%.31s", g[i].id);
                snprintf(legs[1].account_id, sizeof legs[1].account_id, "promotion");
                struct ledger_entry e = {.at = at,
                                         .kind = "expiry",
                                         .user_id = g[i].user_id,
                                         .reason = "the clock had run ahead of this credit's expiry; its void is undone",
                                         .grant_id = g[i].id};
                if ((rc = store_ledger_post(s, &e, legs, 2, at)) != STORE_OK)
                    return rc;
            }
            /* Live again, so that one void more comes at its real expiry. */
            if ((rc = store_grant_unvoid(s, g[i].id, back)) != STORE_OK)
                return rc;
            log_warn("ledger: grant %s of %s was voided at %lld, which is still ahead: %lld micro-yuan given back",
                     g[i].id, g[i].user_id, (long long)g[i].expires_at, (long long)back);
        }
        if (n < GRANTS_MAX)
            return STORE_OK;
    }
}

int ledger_redeem_invite(struct store *s, const char *user_id, const char *code, int64_t at, char grant_out[ID_MAX])
{
    struct invite_code c;
    int rc = store_invite_get(s, code, &c);
    if (rc != STORE_OK)
        return rc;
    if ((c.expires_at && c.expires_at <= at) || (c.max_uses && c.uses >= c.max_uses))
        return STORE_NOT_FOUND;
    char source[48], reason[96];
    snprintf(source, sizeof source, "invite:%s", c.code);
    snprintf(reason, sizeof reason, "invite code %s", c.code);
    int64_t expires = c.credit_days ? at + c.credit_days * 86400 : 0;
    if ((rc = ledger_grant(s, user_id, source, c.amount, expires, at, reason, grant_out)) != STORE_OK)
        return rc;
    /* The redemption row's primary key makes a second redemption by the
     * same account fail, whatever the concurrency. */
    return store_invite_redeem(s, c.code, user_id, grant_out, at);
}

int64_t ledger_billable_end(const struct billable *b, int64_t t)
{
    int64_t end = b->ended_at && b->ended_at < t ? b->ended_at : t;
    if (!b->ended_at && b->confirmed_until >= 0 && b->confirmed_until < end)
        end = b->confirmed_until;
    return end;
}

/* Gives amount back to the payers (in their order: the account drawn last
 * first) as one transaction e, revenue paying it: a grant not voided gets
 * its remaining back; credit voided since it paid is voided again (an
 * 'expiry'), as it would have been had it never been spent. what names
 * what was paid for, for the error when amount is more than they paid. */
static int refund_payers(struct store *s, const struct interval_payer *payers, size_t n, int64_t amount,
                         const struct ledger_entry *e, const char *what)
{
    struct ledger_leg *legs = calloc(n + 1, sizeof *legs);
    int64_t *taken = calloc(n ? n : 1, sizeof *taken);
    int rc = STORE_OK;
    if (!legs || !taken) {
        rc = STORE_ERROR;
        goto done;
    }
    int64_t left = amount;
    size_t nl = 0;
    for (size_t i = 0; i < n && left > 0; i++) {
        int64_t take = payers[i].paid < left ? payers[i].paid : left;
        if (payers[i].grant_id[0] && !payers[i].grant_voided_at &&
            (rc = store_grant_restore(s, payers[i].grant_id, take)) != STORE_OK)
            goto done;
        snprintf(legs[nl].account_id, sizeof legs[nl].account_id, "%s", payers[i].account_id);
        snprintf(legs[nl].grant_id, sizeof legs[nl].grant_id, "%s", payers[i].grant_id);
        legs[nl++].amount = take;
        taken[i] = take;
        left -= take;
    }
    if (left > 0) {
        log_error("ledger: refund of %lld to %s is more than it was paid", (long long)amount, what);
        rc = STORE_ERROR;
        goto done;
    }
    snprintf(legs[nl].account_id, sizeof legs[nl].account_id, "revenue");
    legs[nl++].amount = -amount;
    if ((rc = store_ledger_post(s, e, legs, nl, e->at)) != STORE_OK)
        goto done;
    for (size_t i = 0; i < n && rc == STORE_OK; i++) {
        if (!taken[i] || !payers[i].grant_voided_at)
            continue;
        struct ledger_leg v[2] = {{.amount = -taken[i]}, {.amount = taken[i]}};
        snprintf(v[0].account_id, sizeof v[0].account_id, "%s", payers[i].account_id);
        snprintf(v[0].grant_id, sizeof v[0].grant_id, "%s", payers[i].grant_id);
        snprintf(v[1].account_id, sizeof v[1].account_id, "promotion");
        struct ledger_entry x = {.at = e->at,
                                 .kind = "expiry",
                                 .user_id = e->user_id,
                                 .reason = "refunded credit had expired; it is void",
                                 .grant_id = payers[i].grant_id};
        rc = store_ledger_post(s, &x, v, 2, e->at);
    }
    /* Money came back: the next time the funds run low is worth a notice. */
    if (rc == STORE_OK)
        rc = store_user_set_low_balance_noticed(s, e->user_id, 0);
done:
    free(taken);
    free(legs);
    return rc;
}

int ledger_refund(struct store *s, const struct billable *b, int64_t amount, int64_t at, const char *why)
{
    if (amount <= 0)
        return amount == 0 ? STORE_OK : STORE_ERROR;
    struct interval_payer *payers;
    size_t n;
    int rc = store_interval_payers(s, b->id, &payers, &n);
    if (rc != STORE_OK)
        return rc;
    char reason[256], what[48];
    snprintf(reason, sizeof reason, "refund, %lld x %s, %s: %.160s", (long long)b->card_count, b->gpu_model,
             b->instance_id, why);
    snprintf(what, sizeof what, "interval %lld", (long long)b->id);
    struct ledger_entry e = {.at = at,
                             .kind = "refund",
                             .user_id = b->user_id,
                             .reason = reason,
                             .instance_id = b->instance_id,
                             .interval_id = b->id};
    rc = refund_payers(s, payers, n, amount, &e, what);
    free(payers);
    return rc;
}

/* Funds that ran out end an interval at the second they covered, which
 * is before the instance is seen to stop, unless the clock was ahead when
 * billing cut it and has stepped back since: then the instance stopped
 * (at ended_at) before the second it was charged to, and the interval ends
 * there instead, what was charged beyond given back. Only when that
 * interval is the instance's last: one started since (and stopped now,
 * with the clock stepped back below the old cut) leaves the old one as it
 * was billed, which once refunded it whole. */
static int pull_back_funds_cut(struct store *s, const char *instance_id, int64_t ended_at, const char *reason,
                               int64_t now)
{
    struct billable b;
    int rc = store_interval_get_cut_after(s, instance_id, ended_at, &b);
    if (rc != STORE_OK)
        return rc == STORE_NOT_FOUND ? STORE_OK : rc;
    b.ended_at = ended_at > b.started_at ? ended_at : b.started_at;
    struct price_book book = {0};
    int64_t due;
    rc = price_book_due(s, &book, &b, b.ended_at, &due);
    price_book_free(&book);
    if (rc != STORE_OK)
        return rc == PRICE_OVERFLOW ? STORE_ERROR : rc;
    if (due < b.billed && (rc = ledger_refund(s, &b, b.billed - due, now, reason)) != STORE_OK)
        return rc;
    return store_interval_billed(s, b.id, due < b.billed ? due : b.billed, 1, b.ended_at);
}

int ledger_close_interval(struct store *s, const char *instance_id, int64_t ended_at, const char *reason, int64_t now)
{
    struct billable b;
    int rc = store_interval_get_open(s, instance_id, &b);
    if (rc == STORE_NOT_FOUND)
        return pull_back_funds_cut(s, instance_id, ended_at, reason, now);
    if (rc != STORE_OK)
        return rc;
    /* Whoever ends it (a stop, an exit, funds), an interval on a node that
     * has missed a heartbeat is known to have run only to its last good
     * one. */
    if (b.confirmed_until >= 0 && ended_at > b.confirmed_until)
        ended_at = b.confirmed_until;
    if ((rc = store_interval_close(s, instance_id, ended_at, reason)) != STORE_OK)
        return rc;
    if (b.billed == 0)
        return STORE_OK;
    /* What is due at the end it now has (store_interval_close never puts it
     * before the start). */
    b.ended_at = ended_at > b.started_at ? ended_at : b.started_at;
    struct price_book book = {0};
    int64_t due;
    rc = price_book_due(s, &book, &b, b.ended_at, &due);
    price_book_free(&book);
    if (rc != STORE_OK)
        return rc == PRICE_OVERFLOW ? STORE_ERROR : rc;
    if (due >= b.billed)
        return STORE_OK;
    if ((rc = ledger_refund(s, &b, b.billed - due, now, reason)) != STORE_OK)
        return rc;
    return store_interval_billed(s, b.id, due, 0, -1);
}

int64_t ledger_price_at(struct store *s, const char *gpu_model, int64_t t)
{
    struct price_point *pp;
    size_t n;
    if (store_prices(s, gpu_model, &pp, &n) != STORE_OK)
        return -1;
    int64_t p = tariff_price_at(pp, n, t);
    free(pp);
    return p;
}

int ledger_charge_reservation(struct store *s, const char *user_id, int64_t amount, int64_t at,
                              const char *reservation_id, const char *reason)
{
    struct ledger_entry e = {
        .at = at, .kind = "reservation", .user_id = user_id, .reason = reason, .reservation_id = reservation_id};
    return charge(s, user_id, amount, at, &e);
}

int ledger_refund_reservation(struct store *s, const char *user_id, const char *reservation_id, int64_t amount,
                              int64_t at, const char *reason)
{
    if (amount <= 0)
        return amount == 0 ? STORE_OK : STORE_ERROR;
    struct interval_payer *payers;
    size_t n;
    int rc = store_reservation_payers(s, reservation_id, &payers, &n);
    if (rc != STORE_OK)
        return rc;
    char what[64];
    snprintf(what, sizeof what, "reservation %s", reservation_id);
    struct ledger_entry e = {
        .at = at, .kind = "reservation_refund", .user_id = user_id, .reason = reason, .reservation_id = reservation_id};
    rc = refund_payers(s, payers, n, amount, &e, what);
    free(payers);
    return rc;
}
