/* funds.c: the one place an interval's cost is computed (the price book,
 * used by billing, the balance and refunds alike), and whether a user may
 * start cards: funds for a minimum run of them and of everything else they
 * hold, each at its own price, counted in the transaction that claims the
 * cards. ledger verify recomputes costs on its own (audit/), as an auditor
 * should. */
#include "domain/domain.h"
#include "domain/ledger.h"
#include "gpurent/money.h"
#include "gpurent/tariff.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One GPU type's price schedule. */
struct price_book_entry {
    char model[33];         /* type */
    struct price_point *pp; /* schedule, oldest first */
    size_t n;               /* entries */
};

void price_book_free(struct price_book *book)
{
    for (size_t i = 0; i < book->n; i++)
        free(book->entries[i].pp);
    free(book->entries);
    memset(book, 0, sizeof *book);
}

/* The schedule of model, read on first use. Grown as needed: with a fixed
 * table, a pass that met more types than it held would fail every user
 * after. */
static int schedule(struct store *s, struct price_book *book, const char *model, const struct price_book_entry **out)
{
    for (size_t i = 0; i < book->n; i++)
        if (strcmp(book->entries[i].model, model) == 0) {
            *out = &book->entries[i];
            return STORE_OK;
        }
    if (book->n == book->cap) {
        size_t cap = book->cap ? 2 * book->cap : 16;
        struct price_book_entry *grown = realloc(book->entries, cap * sizeof *grown);
        if (!grown)
            return STORE_ERROR;
        book->entries = grown;
        book->cap = cap;
    }
    struct price_book_entry *e = &book->entries[book->n];
    int rc = store_prices(s, model, &e->pp, &e->n);
    if (rc != STORE_OK)
        return rc;
    snprintf(e->model, sizeof e->model, "%s", model);
    book->n++;
    *out = e;
    return STORE_OK;
}

int price_book_due(struct store *s, struct price_book *book, const struct billable *b, int64_t t, int64_t *out)
{
    *out = 0;
    const struct price_book_entry *e;
    int rc = schedule(s, book, b->gpu_model, &e);
    if (rc != STORE_OK)
        return rc;
    int64_t end = ledger_billable_end(b, t);
    if (end <= b->started_at)
        return STORE_OK;
    return tariff_due(e->pp, e->n, b->card_count, b->started_at, end, out) == MONEY_OK ? STORE_OK : PRICE_OVERFLOW;
}

/* One region's storage schedule, merged with the global one. */
struct storage_book_entry {
    char region[64];        /* "" global */
    struct price_point *pp; /* schedule, oldest first */
    size_t n;               /* entries */
};

void storage_book_free(struct storage_book *book)
{
    for (size_t i = 0; i < book->n; i++)
        free(book->entries[i].pp);
    free(book->entries);
    memset(book, 0, sizeof *book);
}

static int storage_schedule(struct store *s, struct storage_book *book, const char *region,
                            const struct storage_book_entry **out)
{
    for (size_t i = 0; i < book->n; i++)
        if (strcmp(book->entries[i].region, region) == 0) {
            *out = &book->entries[i];
            return STORE_OK;
        }
    if (book->n == book->cap) {
        size_t cap = book->cap ? 2 * book->cap : 8;
        struct storage_book_entry *grown = realloc(book->entries, cap * sizeof *grown);
        if (!grown)
            return STORE_ERROR;
        book->entries = grown;
        book->cap = cap;
    }
    struct price_point *g = NULL, *r = NULL;
    size_t ng = 0, nr = 0;
    int rc = store_storage_prices(s, "", &g, &ng);
    if (rc == STORE_OK && region[0])
        rc = store_storage_prices(s, region, &r, &nr);
    struct storage_book_entry *e = &book->entries[book->n];
    e->pp = rc == STORE_OK ? malloc((ng + nr ? ng + nr : 1) * sizeof *e->pp) : NULL;
    if (rc == STORE_OK && !e->pp)
        rc = STORE_ERROR;
    if (rc == STORE_OK) {
        e->n = tariff_storage_schedule(g, ng, r, nr, e->pp);
        snprintf(e->region, sizeof e->region, "%s", region);
        book->n++;
        *out = e;
    }
    free(g);
    free(r);
    return rc;
}

int storage_book_due(struct store *s, struct storage_book *book, const struct storage_billable *v, int64_t t,
                     int64_t *out)
{
    *out = 0;
    const struct storage_book_entry *e;
    int rc = storage_schedule(s, book, v->region, &e);
    if (rc != STORE_OK)
        return rc;
    int64_t end = v->deleted_at && v->deleted_at < t ? v->deleted_at : t;
    if (end <= v->created_at)
        return STORE_OK;
    return tariff_storage_due(e->pp, e->n, v->size_gb, v->created_at, end, out) == MONEY_OK ? STORE_OK
                                                                                             : PRICE_OVERFLOW;
}

int64_t storage_book_price_at(struct store *s, struct storage_book *book, const char *region, int64_t t)
{
    const struct storage_book_entry *e;
    int rc = storage_schedule(s, book, region, &e);
    if (rc != STORE_OK)
        return rc;
    int64_t p = tariff_price_at(e->pp, e->n, t);
    return p < 0 ? 0 : p;
}

int funds_check_minimum_run(struct store *s, const char *user_id, const char *gpu_model, int64_t cards, int64_t at,
                            struct funds *seen, struct op_outcome *o)
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
        if (p > 0 &&
            (money_accrue(p, held[i].cards, seconds, &more) != MONEY_OK || money_add(need, more, &need) != MONEY_OK))
            rc = STORE_ERROR;
    }
    free(held);
    if (rc != STORE_OK)
        return rc;
    struct funds f;
    rc = ledger_funds_now(s, user_id, at, &f);
    if (rc != STORE_OK)
        return rc;
    if (seen)
        *seen = f;
    if (f.available >= need)
        return STORE_OK;
    char need_s[MONEY_FMT_LEN], have_s[MONEY_FMT_LEN], owed_s[MONEY_FMT_LEN];
    money_format(need, need_s);
    money_format(f.available, have_s);
    /* Storage not covered is paid before any card time: say so when it is
     * what the funds go to. */
    int64_t owed = 0;
    if ((rc = ledger_storage_owed(s, user_id, at, &owed)) != STORE_OK)
        return rc;
    money_format(owed, owed_s);
    o->failed = 1;
    o->error = ERR_INSUFFICIENT_FUNDS;
    json_decref(o->extra);
    o->extra = json_pack("{s:s, s:s, s:s}", "needed", need_s, "available", have_s, "currency", daemon_config->currency);
    if (owed > 0)
        json_object_set_new(o->extra, "storage_owed", json_string(owed_s));
    snprintf(o->message, sizeof o->message,
             "%s %s needed for a %lld-minute minimum run (with your other running cards); %s available%s%s%s", need_s,
             daemon_config->currency, (long long)daemon_config->min_run_minutes, have_s,
             owed > 0 ? " after " : "", owed > 0 ? owed_s : "", owed > 0 ? " of storage not yet charged" : "");
    return REFUSED;
}
