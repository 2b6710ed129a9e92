/* ledger_verify.c: `gpurentd ledger verify`: every invariant the money
 * rules promise, checked from the raw rows, each breach printed with what
 * is wrong. The rules that are queries run in the store (store_verify.c);
 * what each billed interval owes is recomputed here from its stored
 * start, end, cards and the price history, with the tariff's definition and
 * nothing of billing's, and each reservation's payment from its price,
 * cards and hours. Read-only; safe next to a running daemon. */
#include "audit/audit.h"
#include "gpurent/money.h"
#include "gpurent/tariff.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_breach(void *ctx, const char *what, const char *id, const char *detail)
{
    FILE *out = ctx;
    if (!id)
        fprintf(out, "cannot check '%s': %s\n", what, detail);
    else if (!id[0])
        fprintf(out, "breach: %s: %s\n", what, detail);
    else
        fprintf(out, "breach: %s: %s: %s\n", what, id, detail);
}

/* Settled intervals must have been charged exactly what the tariff says,
 * and any other never more than its tariff up to its end or, while it
 * runs, its latest charge: time not known to have run is never kept. They
 * come by GPU type, so each price history is read once. */
struct interval_check {
    FILE *out;
    int breaches;
    char model[33]; /* whose prices pp holds */
    struct price_point *pp;
    size_t n;
    struct store *store; /* to read price histories */
};

static int check_one(void *vctx, const struct charged_interval *iv)
{
    struct interval_check *c = vctx;
    if (strcmp(iv->gpu_model, c->model) != 0) {
        free(c->pp);
        c->pp = NULL;
        c->model[0] = '\0';
        if (store_prices(c->store, iv->gpu_model, &c->pp, &c->n) != STORE_OK)
            return -1;
        snprintf(c->model, sizeof c->model, "%s", iv->gpu_model);
    }
    /* A settled interval owes its tariff to its end; any other at most its
     * tariff to its end or its latest charge, whichever came first. */
    int64_t end = iv->last_charge;
    if (iv->settled || (iv->ended_at && iv->ended_at < end))
        end = iv->ended_at;
    if (end < iv->started_at)
        end = iv->started_at;
    const char *what = iv->settled ? "settled interval billed other than its tariff"
                                   : "interval billed beyond its tariff to its end or latest charge";
    int64_t due;
    int mrc = tariff_due(c->pp, c->n, iv->card_count, iv->started_at, end, &due);
    if (mrc != MONEY_OK) {
        fprintf(c->out, "breach: %s: %lld: billed %lld, its tariff %s\n", what, (long long)iv->id,
                (long long)iv->billed, mrc == MONEY_ERR_OVERFLOW ? "overflows 64-bit integers" : "cannot be computed");
        c->breaches++;
    } else if (iv->settled ? due != iv->billed : iv->billed > due) {
        fprintf(c->out, "breach: %s: %lld: billed %lld, due %lld\n", what, (long long)iv->id, (long long)iv->billed,
                (long long)due);
        c->breaches++;
    }
    return 0;
}

/* Every volume charged for storage: a settled one exactly its tariff from
 * creation to deletion, any other never more than its tariff up to its
 * deletion or, while it exists, its latest charge. Volumes come by region,
 * so each region's schedule (the global prices, then the region's own from
 * its first on) is read once. */
struct volume_check {
    FILE *out;
    int breaches;
    int loaded;       /* pp holds region's schedule */
    char region[64];  /* whose */
    struct price_point *pp;
    size_t n;
    struct store *store;
};

static int load_storage_schedule(struct volume_check *c, const char *region)
{
    struct price_point *g = NULL, *r = NULL;
    size_t ng = 0, nr = 0;
    free(c->pp);
    c->pp = NULL;
    c->n = 0;
    c->loaded = 0;
    int rc = store_storage_prices(c->store, "", &g, &ng);
    if (rc == STORE_OK && region[0])
        rc = store_storage_prices(c->store, region, &r, &nr);
    if (rc == STORE_OK && !(c->pp = malloc((ng + nr ? ng + nr : 1) * sizeof *c->pp)))
        rc = STORE_ERROR;
    if (rc == STORE_OK) {
        c->n = tariff_storage_schedule(g, ng, r, nr, c->pp);
        snprintf(c->region, sizeof c->region, "%s", region);
        c->loaded = 1;
    }
    free(g);
    free(r);
    return rc == STORE_OK ? 0 : -1;
}

static int check_volume(void *vctx, const struct volume_charge *vc)
{
    struct volume_check *c = vctx;
    if ((!c->loaded || strcmp(vc->region, c->region) != 0) && load_storage_schedule(c, vc->region) < 0)
        return -1;
    int64_t end = vc->deleted_at ? vc->deleted_at : vc->last_charge;
    if (end < vc->created_at)
        end = vc->created_at;
    int64_t due;
    int mrc = tariff_storage_due(c->pp, c->n, vc->size_gb, vc->created_at, end, &due);
    if (mrc != MONEY_OK) {
        fprintf(c->out, "breach: volume's storage billed beyond its tariff: %s: billed %lld, its tariff %s\n",
                vc->volume_id, (long long)vc->billed,
                mrc == MONEY_ERR_OVERFLOW ? "overflows 64-bit integers" : "cannot be computed");
        c->breaches++;
    } else if (vc->settled && due != vc->billed) {
        fprintf(c->out, "breach: deleted volume's storage billed other than its tariff: %s: billed %lld, due %lld\n",
                vc->volume_id, (long long)vc->billed, (long long)due);
        c->breaches++;
    } else if (!vc->settled && vc->billed > due) {
        fprintf(c->out, "breach: volume's storage billed beyond its tariff: %s: billed %lld, due %lld\n",
                vc->volume_id, (long long)vc->billed, (long long)due);
        c->breaches++;
    }
    return 0;
}

/* Every reservation (0024), recomputed here: paid exactly price x cards x
 * whole hours; refunded and credited never more than that; a refund only
 * for a cancellation made before the start. */
struct reservation_check {
    FILE *out;
    int breaches;
};

static void reservation_breach(struct reservation_check *c, const struct reservation *r, const char *what)
{
    fprintf(c->out, "breach: reservation %s: %s: %s (paid %lld, refunded %lld, credited %lld)\n", what, r->id,
            r->state, (long long)r->amount, (long long)r->refunded, (long long)r->credited);
    c->breaches++;
}

static int check_reservation(void *vctx, const struct reservation *r)
{
    struct reservation_check *c = vctx;
    __int128 due = r->ends_at > r->starts_at && (r->ends_at - r->starts_at) % 3600 == 0
                       ? (__int128)r->card_hour * r->card_count * ((r->ends_at - r->starts_at) / 3600)
                       : -1;
    if (due != r->amount)
        reservation_breach(c, r, "paid other than its tariff");
    if (r->refunded < 0 || r->refunded > r->amount)
        reservation_breach(c, r, "refunded more than it was paid");
    if (r->credited < 0 || r->credited > r->amount)
        reservation_breach(c, r, "credited more than it was paid");
    if (r->refunded > 0 && (strcmp(r->state, "cancelled") != 0 || r->cancelled_at >= r->starts_at))
        reservation_breach(c, r, "refunded without a cancellation before its start");
    return 0;
}

int ledger_verify(struct store *s, void *stream)
{
    FILE *out = stream;
    int breaches = store_verify_rules(s, print_breach, out);
    if (breaches < 0)
        return -1;
    struct interval_check c = {.out = out, .store = s};
    int rc = store_charged_intervals(s, check_one, &c);
    free(c.pp);
    struct volume_check vc = {.out = out, .store = s};
    if (rc == STORE_OK)
        rc = store_volume_charges(s, check_volume, &vc);
    free(vc.pp);
    struct reservation_check rv = {.out = out};
    if (rc == STORE_OK)
        rc = store_reservation_each(s, check_reservation, &rv);
    return rc == STORE_OK ? breaches + c.breaches + vc.breaches + rv.breaches : -1;
}
