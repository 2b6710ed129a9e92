/* billing.c: the billing loop. On its own thread, every billing_interval_ms
 * (or when asked), for each user with running intervals not yet billed in
 * full, it computes what each interval costs up to now (tariff.c) and posts
 * the difference from what was already posted, drawing grants before cash.
 * Credit that expires in between is used up to its expiry and then voided.
 * When funds cannot cover what is due, billing ends at the last second they
 * covered: the intervals are closed there and the user's instances are
 * stopped. Passes may be late, repeated or cut short by a crash: each
 * recomputes from the intervals' starts, so totals never change. */
#include "clock.h"
#include "daemon.h"
#include "jsonx.h"
#include "ledger.h"
#include "money.h"
#include "store.h"
#include "tariff.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BILLABLES_MAX 256   /* open intervals of one user handled per pass */
#define USERS_PER_TXN 200   /* short write locks, few commits */
#define CHECKPOINTS_MAX 64  /* grant expiries handled per user per pass */

/* Prices per GPU type, loaded once per pass. */
struct price_cache {
    char model[33];            /* type */
    struct price_point *pp;    /* schedule */
    size_t n;                  /* entries */
};

struct pass {
    struct price_cache prices[32]; /* per type seen */
    size_t n_prices;               /* entries */
    int64_t now;                   /* pass time */
    int stopped_any;               /* instances were stopped: wake the reconciler */
};

static int schedule(struct store *s, struct pass *p, const char *model, struct price_point **pp, size_t *n)
{
    for (size_t i = 0; i < p->n_prices; i++)
        if (strcmp(p->prices[i].model, model) == 0) {
            *pp = p->prices[i].pp;
            *n = p->prices[i].n;
            return STORE_OK;
        }
    if (p->n_prices == sizeof p->prices / sizeof p->prices[0])
        return STORE_ERROR;
    struct price_cache *c = &p->prices[p->n_prices];
    int rc = store_prices(s, model, &c->pp, &c->n);
    if (rc != STORE_OK)
        return rc;
    snprintf(c->model, sizeof c->model, "%s", model);
    p->n_prices++;
    *pp = c->pp;
    *n = c->n;
    return STORE_OK;
}

/* What interval b costs from its start to min(its end, t). */
static int due_at(struct store *s, struct pass *p, const struct billable *b, int64_t t, int64_t *out)
{
    struct price_point *pp;
    size_t n;
    int rc = schedule(s, p, b->gpu_model, &pp, &n);
    if (rc != STORE_OK)
        return rc;
    int64_t end = b->ended_at && b->ended_at < t ? b->ended_at : t;
    if (end <= b->started_at) {
        *out = 0;
        return STORE_OK;
    }
    return tariff_due(pp, n, b->card_count, b->started_at, end, out) == MONEY_OK ? STORE_OK : STORE_ERROR;
}

/* Sum over the intervals of what is due at t beyond what was posted. */
static int owed_at(struct store *s, struct pass *p, const struct billable *b, size_t n, int64_t t, int64_t *out)
{
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t due;
        int rc = due_at(s, p, &b[i], t, &due);
        if (rc != STORE_OK)
            return rc;
        if (due > b[i].billed && money_add(total, due - b[i].billed, &total) != MONEY_OK)
            return STORE_ERROR;
    }
    *out = total;
    return STORE_OK;
}

/* Stops every instance of the user that wants to run: funds ran out at t. */
static int stop_for_funds(struct store *s, struct pass *p, const char *user_id, int64_t t)
{
    struct instance list[64];
    size_t n;
    struct instance_filter f = {.user_id = user_id, .after_created = -1, .after_id = ""};
    char at[32] = "";
    json_t *when = json_time(t, 0);
    snprintf(at, sizeof at, "%s", json_string_value(when));
    json_decref(when);
    char why[128];
    snprintf(why, sizeof why, "funds ran out at %s; the volume is kept", at);
    for (;;) {
        int rc = store_instance_list(s, &f, list, 64, &n);
        if (rc != STORE_OK)
            return rc;
        for (size_t i = 0; i < n; i++) {
            struct instance *in = &list[i];
            if (strcmp(in->desired, "running") != 0 ||
                (strcmp(in->state, "pending") != 0 && strcmp(in->state, "provisioning") != 0 &&
                 strcmp(in->state, "running") != 0))
                continue;
            if ((rc = store_interval_close(s, in->id, t, "funds exhausted")) != STORE_OK ||
                (rc = store_instance_set_desired(s, in->id, "stopped", p->now)) != STORE_OK ||
                (rc = store_instance_set_state(s, in->id, "stopping", "", why, p->now)) != STORE_OK)
                return rc;
            log_info("billing: stopping %s of %s: %s", in->id, user_id, why);
            p->stopped_any = 1;
        }
        if (n < 64)
            return STORE_OK;
        f.after_created = list[n - 1].created_at;
        f.after_id = list[n - 1].id;
    }
}

/* Bills the user's intervals up to t. */
static int bill_until(struct store *s, struct pass *p, const char *user_id, int64_t t)
{
    struct billable b[BILLABLES_MAX];
    size_t n;
    int rc = store_billables(s, user_id, b, BILLABLES_MAX, &n);
    if (rc != STORE_OK || n == 0)
        return rc;
    int64_t owed;
    struct funds funds;
    if ((rc = owed_at(s, p, b, n, t, &owed)) != STORE_OK || (rc = ledger_funds(s, user_id, t - 1, &funds)) != STORE_OK)
        return rc;
    int64_t until = t;
    int exhausted = owed > funds.available;
    if (exhausted) {
        /* The last second the funds cover: owed is monotonic in time. */
        int64_t lo = b[0].started_at, hi = t;
        for (size_t i = 1; i < n; i++)
            if (b[i].started_at < lo)
                lo = b[i].started_at;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo + 1) / 2;
            if ((rc = owed_at(s, p, b, n, mid, &owed)) != STORE_OK)
                return rc;
            if (owed <= funds.available)
                lo = mid;
            else
                hi = mid - 1;
        }
        until = lo;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t due;
        if ((rc = due_at(s, p, &b[i], until, &due)) != STORE_OK)
            return rc;
        if (due > b[i].billed) {
            char reason[160];
            snprintf(reason, sizeof reason, "%lld x %s, %s", (long long)b[i].card_count, b[i].gpu_model,
                     b[i].instance_id);
            if ((rc = ledger_charge(s, user_id, due - b[i].billed, until, b[i].instance_id, b[i].id, reason)) !=
                STORE_OK)
                return rc;
            b[i].billed = due;
        }
        int settled = (b[i].ended_at && b[i].ended_at <= until) || exhausted;
        if ((rc = store_interval_billed(s, b[i].id, b[i].billed, settled)) != STORE_OK)
            return rc;
    }
    if (exhausted)
        return stop_for_funds(s, p, user_id, until);
    return STORE_OK;
}

static int bill_user(struct store *s, struct pass *p, const char *user_id)
{
    /* Credit is spent up to its expiry and only then voided, so a late pass
     * draws on it exactly as a timely one would have. */
    int64_t expiries[CHECKPOINTS_MAX];
    size_t n;
    int rc = store_grant_expiries(s, user_id, INT64_MIN, p->now, expiries, CHECKPOINTS_MAX, &n);
    if (rc != STORE_OK)
        return rc;
    for (size_t i = 0; i < n; i++)
        if ((rc = bill_until(s, p, user_id, expiries[i])) != STORE_OK ||
            (rc = ledger_expire_grants(s, user_id, expiries[i])) != STORE_OK)
            return rc;
    return bill_until(s, p, user_id, p->now);
}

struct batch_ctx {
    struct pass *pass;         /* shared state */
    char (*users)[ID_MAX];     /* the batch */
    size_t n;                  /* its length */
};

static int batch_txn(struct store *s, void *vctx)
{
    struct batch_ctx *ctx = vctx;
    ctx->pass->stopped_any = 0;
    for (size_t i = 0; i < ctx->n; i++) {
        int rc = bill_user(s, ctx->pass, ctx->users[i]);
        if (rc != STORE_OK) {
            log_error("billing: cannot bill user %s (rc %d)", ctx->users[i], rc);
            return rc;
        }
    }
    /* Grants of users with nothing to bill expire too. */
    return ledger_expire_grants(s, NULL, ctx->pass->now);
}

int billing_pass(struct store *s, struct billing_summary *out)
{
    int64_t started = clock_mono_ms();
    struct pass p = {.now = clock_now()};
    char(*users)[ID_MAX] = NULL;
    size_t n = 0;
    int rc = store_users_to_bill(s, &users, &n);
    int stopped = 0;
    for (size_t off = 0; rc == STORE_OK && off < n; off += USERS_PER_TXN) {
        struct batch_ctx ctx = {&p, users + off, n - off < USERS_PER_TXN ? n - off : USERS_PER_TXN};
        rc = store_txn(s, batch_txn, &ctx);
        stopped |= p.stopped_any;
    }
    if (rc == STORE_OK && n == 0) {
        struct batch_ctx ctx = {&p, NULL, 0};
        rc = store_txn(s, batch_txn, &ctx);
    }
    for (size_t i = 0; i < p.n_prices; i++)
        free(p.prices[i].pp);
    free(users);
    if (stopped)
        reconciler_wake();
    if (out) {
        out->users = (int64_t)n;
        out->at = p.now;
        out->duration_ms = clock_mono_ms() - started;
    }
    return rc;
}

int billing_check_funds(struct store *s, const char *user_id, const char *gpu_model, int64_t cards, int64_t at,
                        struct op_outcome *o)
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
    struct model_cards held[32];
    size_t n_held;
    int rc = store_user_cards_by_model(s, user_id, held, 32, &n_held);
    if (rc != STORE_OK)
        return rc;
    for (size_t i = 0; i < n_held; i++) {
        int64_t p = ledger_price_at(s, held[i].gpu_model, at), more;
        if (p > 0 && (money_accrue(p, held[i].cards, seconds, &more) != MONEY_OK || money_add(need, more, &need) != MONEY_OK))
            return STORE_ERROR;
    }
    struct funds f;
    rc = ledger_funds(s, user_id, at, &f);
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

/* ------------------------------------------------------------ the thread */

static pthread_t thread;
static int running;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static int stop_requested, wake_requested; /* guarded by lock */
static int64_t passes_done;                /* guarded by lock */
static struct billing_summary last;        /* guarded by lock */

static void *billing_main(void *arg)
{
    (void)arg;
    struct store *s = store_thread();
    if (!s) {
        log_error("billing: no database connection; billing stopped");
        return NULL;
    }
    for (;;) {
        struct billing_summary sum = {0};
        if (billing_pass(s, &sum) != STORE_OK)
            log_error("billing: pass failed; it will be retried");
        metrics_billing_pass(sum.duration_ms * 1000);
        watchdog_loop_alive(LOOP_BILLING);
        pthread_mutex_lock(&lock);
        last = sum;
        passes_done++;
        pthread_cond_broadcast(&done_cond);
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        int64_t ms = daemon_config->billing_interval_ms;
        deadline.tv_sec += ms / 1000;
        deadline.tv_nsec += (ms % 1000) * 1000000;
        if (deadline.tv_nsec >= 1000000000) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000;
        }
        while (!stop_requested && !wake_requested)
            if (pthread_cond_timedwait(&cond, &lock, &deadline) == ETIMEDOUT)
                break;
        int stop = stop_requested;
        wake_requested = 0;
        pthread_mutex_unlock(&lock);
        if (stop)
            break;
    }
    return NULL;
}

int billing_start(void)
{
    stop_requested = 0;
    if (pthread_create(&thread, NULL, billing_main, NULL) != 0) {
        log_error("billing: cannot start thread");
        return -1;
    }
    running = 1;
    return 0;
}

int billing_run_now(struct billing_summary *out, int timeout_ms)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (deadline.tv_nsec >= 1000000000) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&lock);
    /* A pass already under way may have read the clock before the caller
     * moved it: wait for the one after it. */
    int64_t target = passes_done + 2;
    wake_requested = 1;
    pthread_cond_signal(&cond);
    int rc = 0;
    while (passes_done < target && rc == 0) {
        if (passes_done == target - 1) {
            wake_requested = 1;
            pthread_cond_signal(&cond);
        }
        rc = pthread_cond_timedwait(&done_cond, &lock, &deadline);
    }
    if (out)
        *out = last;
    int ok = passes_done >= target;
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

void billing_stop(void)
{
    if (!running)
        return;
    pthread_mutex_lock(&lock);
    stop_requested = 1;
    pthread_cond_signal(&cond);
    pthread_mutex_unlock(&lock);
    pthread_join(thread, NULL);
    running = 0;
}
