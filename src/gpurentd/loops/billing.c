/* billing.c: the billing loop. On its own thread, every billing_interval_ms,
 * it checks every user with running intervals not yet billed in full: what
 * their intervals cost up to now (tariff.c) against what they can spend.
 * Usage is posted to the ledger (the difference from what was already
 * posted, drawing grants before cash) when funds run out, when an interval
 * has ended, when a grant expired, and otherwise at least every
 * billing_post_interval_s per user, spread over the passes: posting every
 * interval every pass would cost a ledger transaction per instance every few
 * seconds. A full pass (billing_pass: at start-up, and when an admin asks)
 * posts everything due. Credit that expires in between is used up to its
 * expiry and then voided. When funds cannot cover what is due, billing ends
 * at the last second they covered: the intervals are closed there and the
 * user's instances are stopped. Passes may be late, repeated or cut short by
 * a crash: each recomputes from the intervals' starts, so totals never
 * change.
 *
 * Storage of volumes (per GB-month, from creation to deletion, running or
 * not) is billed in the same pass and the same way: funds that cannot cover
 * both ran out at the last second they cover both (funds_last_at), and
 * what storage they do not cover stays owed and is charged first when
 * money arrives (bill_storage).
 *
 * Only time known to have run is charged: an open interval on a node that
 * has missed a heartbeat is charged up to that node's last good one
 * (ledger_billable_end), and an interval whose end moved back below what was
 * charged gets the difference refunded.
 *
 * Users whose funds cover everything they owe, with no credit expired and
 * nothing to refund, are billed in batches (bulk_txn): read and posted in a
 * few statements per batch, the same rows the per-user path would post. The
 * others are billed one by one (bill_user). Each user is billed in a savepoint
 * of their own: one whose billing fails (an overflow, a broken row) is
 * skipped for the pass, logged once per change of reason and counted, and
 * everyone else is billed. */
#include "domain/domain.h"
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "gpurent/tariff.h"
#include "loops/loops.h"
#include "store/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define USERS_PER_TXN 200  /* short write locks, few commits */
#define CHECKPOINTS_MAX 64 /* grant expiries handled per user per pass */

struct pass {
    struct price_book prices; /* each type's schedule, read once per pass */
    struct storage_book storage; /* each region's storage schedule, read once per pass */
    int64_t now;              /* pass time */
    int stopped_any;          /* instances were stopped: wake the reconciler */
    int64_t failed;           /* users skipped this pass */
    char why[160];            /* why the user being billed failed, "" if unsaid */
};

/* What interval b costs at t (price_book_due), with a reason when it fails. */
static int due_at(struct store *s, struct pass *p, const struct billable *b, int64_t t, int64_t *out)
{
    int rc = price_book_due(s, &p->prices, b, t, out);
    if (rc != PRICE_OVERFLOW)
        return rc;
    /* Said without the time, which grows every pass: the reason is logged
     * again only when it changes. */
    snprintf(p->why, sizeof p->why, "the cost of interval %lld (%lld x %s) overflows", (long long)b->id,
             (long long)b->card_count, b->gpu_model);
    return STORE_ERROR;
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
        if (due > b[i].billed && money_add(total, due - b[i].billed, &total) != MONEY_OK) {
            snprintf(p->why, sizeof p->why, "the sum of what is owed overflows");
            return STORE_ERROR;
        }
    }
    *out = total;
    return STORE_OK;
}

/* What a user's statement says of a charge for an interval's card time. */
static void usage_reason(char *out, size_t size, const struct billable *b)
{
    snprintf(out, size, "%lld x %s, %s", (long long)b->card_count, b->gpu_model, b->instance_id);
}

/* And of a charge for a volume's storage. */
static void storage_reason(char *out, size_t size, const struct storage_billable *v)
{
    snprintf(out, size, "storage, %lld GB, %s (%s)", (long long)v->size_gb, v->volume_id, v->name);
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
    struct notice_stopped stopped;
    notice_stopped_init(&stopped);
    int rc;
    for (;;) {
        if ((rc = store_instance_list(s, &f, list, 64, &n)) != STORE_OK)
            break;
        for (size_t i = 0; i < n; i++) {
            struct instance *in = &list[i];
            /* An unreachable instance is not billed now, but it would be
             * again the moment its node answers: it stops too. */
            if (strcmp(in->desired, "running") != 0 ||
                (strcmp(in->state, "pending") != 0 && strcmp(in->state, "provisioning") != 0 &&
                 strcmp(in->state, "running") != 0 && strcmp(in->state, "unreachable") != 0))
                continue;
            /* An instance inside a reservation runs on hours already paid. */
            char reservation[ID_MAX];
            if ((rc = store_instance_reservation(s, in->id, reservation)) != STORE_OK)
                break;
            if (reservation[0])
                continue;
            if ((rc = ledger_close_interval(s, in->id, t, "funds exhausted", p->now)) != STORE_OK ||
                (rc = store_instance_set_desired(s, in->id, "stopped", p->now)) != STORE_OK ||
                (rc = store_instance_set_state(s, in->id, "stopping", "", why, p->now)) != STORE_OK)
                break;
            if (notice_stopped_add(&stopped, in->id, in->name) < 0) {
                rc = STORE_ERROR;
                break;
            }
            log_info("billing: stopping %s of %s: %s", in->id, user_id, why);
            p->stopped_any = 1;
        }
        if (rc != STORE_OK || n < 64)
            break;
        f.after_created = list[n - 1].created_at;
        f.after_id = list[n - 1].id;
    }
    /* The renter hears of it by mail, sent once this pass commits. */
    if (rc == STORE_OK)
        rc = notice_stopped_for_funds(s, user_id, &stopped, at, p->now);
    notice_stopped_free(&stopped);
    return rc;
}

/* Bills the user's intervals b[0..n) up to t; ran_out: the funds ran out
 * at t (their storage took the rest), so the intervals end there even if
 * what is left covers their card time. */
static int bill_intervals(struct store *s, struct pass *p, const char *user_id, struct billable *b, size_t n, int64_t t,
                          int ran_out)
{
    int64_t owed;
    struct funds funds;
    int rc;
    if ((rc = owed_at(s, p, b, n, t, &owed)) != STORE_OK || (rc = ledger_funds(s, user_id, t - 1, &funds)) != STORE_OK)
        return rc;
    int64_t until = t;
    int exhausted = owed > funds.available || ran_out;
    if (owed > funds.available) {
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
        /* Funds that ran out end every interval there, even one the user
         * stopped later but before this pass saw it; one on a node that went
         * quiet ends where it is known to have run, at most there. */
        int settled = (b[i].ended_at && b[i].ended_at <= until) || exhausted;
        int64_t cut = exhausted ? ledger_billable_end(&b[i], until) : -1;
        if (due > b[i].billed) {
            char reason[160];
            usage_reason(reason, sizeof reason, &b[i]);
            if ((rc = ledger_charge(s, user_id, due - b[i].billed, until, b[i].instance_id, b[i].id, reason)) !=
                STORE_OK) {
                snprintf(p->why, sizeof p->why, "cannot post usage of interval %lld", (long long)b[i].id);
                return rc;
            }
            b[i].billed = due;
        } else if (settled && due < b[i].billed) {
            /* It ends below what was charged (a clock stepped back, funds
             * cut it short of an earlier charge, an end moved by a path
             * that did not refund): give it back, so the total never
             * depends on when passes ran. */
            if ((rc = ledger_refund(s, &b[i], b[i].billed - due, p->now, "charged past the interval's end")) !=
                STORE_OK) {
                snprintf(p->why, sizeof p->why, "cannot refund interval %lld", (long long)b[i].id);
                return rc;
            }
            b[i].billed = due;
        }
        if ((rc = store_interval_billed(s, b[i].id, b[i].billed, settled, cut)) != STORE_OK)
            return rc;
    }
    if (exhausted)
        return stop_for_funds(s, p, user_id, until);
    return STORE_OK;
}

/* What volume v's storage costs at t, with a reason when it fails. */
static int storage_due_at(struct store *s, struct pass *p, const struct storage_billable *v, int64_t t, int64_t *out)
{
    int rc = storage_book_due(s, &p->storage, v, t, out);
    if (rc != PRICE_OVERFLOW)
        return rc;
    snprintf(p->why, sizeof p->why, "the storage cost of volume %s (%lld GB) overflows", v->volume_id,
             (long long)v->size_gb);
    return STORE_ERROR;
}

/* Sum over the volumes v[0..n) of what their storage owes at t beyond what
 * was charged. */
static int storage_owed_at(struct store *s, struct pass *p, const struct storage_billable *v, size_t n, int64_t t,
                           int64_t *out)
{
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t due;
        int rc = storage_due_at(s, p, &v[i], t, &due);
        if (rc != STORE_OK)
            return rc;
        if (due > v[i].billed && money_add(total, due - v[i].billed, &total) != MONEY_OK) {
            snprintf(p->why, sizeof p->why, "the sum of what storage owes overflows");
            return STORE_ERROR;
        }
    }
    *out = total;
    return STORE_OK;
}

/* Charges the storage of the volumes v[0..n) up to t, oldest volume first,
 * as far as the user's funds go: what they do not cover stays owed (the
 * volume is kept; ledger_funds_now counts it, so no instance starts until
 * it is paid) and is charged first at the next pass that finds money. A
 * volume is settled once it is deleted and charged its whole tariff. */
static int bill_storage(struct store *s, struct pass *p, const char *user_id, struct storage_billable *v, size_t n,
                        int64_t t)
{
    struct funds funds;
    int rc = n ? ledger_funds(s, user_id, t - 1, &funds) : STORE_OK;
    if (rc != STORE_OK || n == 0)
        return rc;
    int64_t left = funds.available;
    for (size_t i = 0; i < n && rc == STORE_OK; i++) {
        int64_t due;
        if ((rc = storage_due_at(s, p, &v[i], t, &due)) != STORE_OK)
            break;
        int64_t charged = 0;
        if (due > v[i].billed && left > 0) {
            charged = due - v[i].billed < left ? due - v[i].billed : left;
            char reason[160];
            storage_reason(reason, sizeof reason, &v[i]);
            if ((rc = ledger_charge_storage(s, user_id, charged, t, v[i].volume_id, reason)) != STORE_OK) {
                snprintf(p->why, sizeof p->why, "cannot post storage of volume %s", v[i].volume_id);
                break;
            }
            v[i].billed += charged;
            left -= charged;
        }
        /* A pass at a time before the last charge (a clock stepped back)
         * sees less due than was billed: nothing is owed, nothing moves;
         * deletions are never put before the last charge, so it settles
         * at its tariff once the deletion is reached. */
        int settled = v[i].deleted_at && v[i].deleted_at <= t && v[i].billed == due;
        if ((charged || settled) &&
            (rc = store_storage_billed(s, v[i].volume_id, v[i].billed, charged ? t : 0, settled)) != STORE_OK)
            break;
    }
    return rc;
}

/* The last second the user's funds cover both their storage and their card
 * time, or -1 when they cover all that is due at t. Owed is monotonic in
 * time, and the search starts at the earliest interval's start. */
static int funds_last_at(struct store *s, struct pass *p, const char *user_id, const struct billable *b, size_t nb,
                         const struct storage_billable *v, size_t nv, int64_t t, int64_t *out)
{
    *out = -1;
    struct funds funds;
    int64_t cards, storage, owed;
    int rc = ledger_funds(s, user_id, t - 1, &funds);
    if (rc != STORE_OK || (rc = owed_at(s, p, b, nb, t, &cards)) != STORE_OK ||
        (rc = storage_owed_at(s, p, v, nv, t, &storage)) != STORE_OK)
        return rc;
    if (money_add(cards, storage, &owed) != MONEY_OK) {
        snprintf(p->why, sizeof p->why, "the sum of what is owed overflows");
        return STORE_ERROR;
    }
    if (owed <= funds.available)
        return STORE_OK;
    /* Never after t, though the intervals may all start later (a clock
     * stepped back): storage is not charged ahead of the pass. */
    int64_t lo = t, hi = t;
    for (size_t i = 0; i < nb; i++)
        if (b[i].started_at < lo)
            lo = b[i].started_at;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if ((rc = owed_at(s, p, b, nb, mid, &cards)) != STORE_OK ||
            (rc = storage_owed_at(s, p, v, nv, mid, &storage)) != STORE_OK)
            return rc;
        if (money_add(cards, storage, &owed) == MONEY_OK && owed <= funds.available)
            lo = mid;
        else
            hi = mid - 1;
    }
    *out = lo;
    return STORE_OK;
}

/* Bills the user's storage, then their intervals up to t: all of them,
 * however many, as the second funds run out depends on every one. When
 * the funds cannot cover both up to t, they ran out at the last second
 * they cover both (funds_last_at): storage and card time are charged to
 * there and the instances stop there, and only then does storage take what
 * is left for the time after it. So that second is the same whether passes
 * ran every second or once, late: charging the storage of the whole late
 * stretch first would cut card time short of what funds had covered. */
static int bill_until(struct store *s, struct pass *p, const char *user_id, int64_t t)
{
    struct billable *b = NULL;
    struct storage_billable *v = NULL;
    size_t nb = 0, nv = 0;
    int64_t last = -1;
    int rc = store_billables(s, user_id, &b, &nb);
    if (rc == STORE_OK)
        rc = store_storage_billables(s, user_id, &v, &nv);
    if (rc == STORE_OK && nb > 0 && nv > 0)
        rc = funds_last_at(s, p, user_id, b, nb, v, nv, t, &last);
    if (rc == STORE_OK)
        rc = bill_storage(s, p, user_id, v, nv, last >= 0 ? last : t);
    if (rc == STORE_OK && nb > 0)
        rc = bill_intervals(s, p, user_id, b, nb, last >= 0 ? last : t, last >= 0);
    if (rc == STORE_OK && last >= 0)
        rc = bill_storage(s, p, user_id, v, nv, t);
    free(b);
    free(v);
    return rc;
}

/* expiries 0: the caller knows no grant of the user expired by now. */
static int bill_user(struct store *s, struct pass *p, const char *user_id, int expiries_possible)
{
    /* Credit is spent up to its expiry and only then voided, so a late pass
     * draws on it exactly as a timely one would have. */
    int64_t expiries[CHECKPOINTS_MAX];
    size_t n = 0;
    int rc = expiries_possible ? store_grant_expiries(s, user_id, INT64_MIN, p->now, expiries, CHECKPOINTS_MAX, &n)
                               : STORE_OK;
    if (rc != STORE_OK)
        return rc;
    for (size_t i = 0; i < n; i++)
        if ((rc = bill_until(s, p, user_id, expiries[i])) != STORE_OK ||
            (rc = ledger_expire_grants(s, user_id, expiries[i])) != STORE_OK)
            return rc;
    if ((rc = bill_until(s, p, user_id, p->now)) != STORE_OK)
        return rc;
    return notice_low_balance(s, user_id, p->now);
}

/* Per user of a batch: how billing them went, for after the commit. */
struct user_result {
    int rc;        /* STORE_OK, or why they were skipped */
    char why[160]; /* said when rc is not STORE_OK */
};

struct batch_ctx {
    struct pass *pass;             /* shared state */
    char (*users)[ID_MAX];         /* the batch */
    const unsigned char *expiries; /* per user: 0 if no grant of theirs expired by now; NULL: unknown */
    size_t n;                      /* its length */
    struct user_result *results;   /* n entries */
    size_t current;                /* the user being billed */
    int isolate;                   /* each user in a savepoint of their own */
};

static int user_part(struct store *s, void *vctx)
{
    struct batch_ctx *ctx = vctx;
    size_t i = ctx->current;
    return bill_user(s, ctx->pass, ctx->users[i], !ctx->expiries || ctx->expiries[i]);
}

/* A batch's result when a user failed without savepoints: roll back and
 * bill the batch again, each user in a savepoint of their own. */
#define BATCH_ISOLATE (-60)

/* Bills the batch's users. Nearly always every one succeeds, so the batch
 * first runs as one piece; if a user fails, it is rolled back and run again
 * with each user in a savepoint of their own (ctx->isolate), so that the one
 * who fails is rolled back alone and the others are billed. Savepoints cost
 * two statements a user, which the common case does not pay. Only a busy
 * database (retry it all) or a savepoint that failed ends the batch. */
static int batch_txn(struct store *s, void *vctx)
{
    struct batch_ctx *ctx = vctx;
    ctx->pass->stopped_any = 0;
    for (ctx->current = 0; ctx->current < ctx->n; ctx->current++) {
        int stopped = ctx->pass->stopped_any;
        ctx->pass->why[0] = '\0';
        int rc;
        if (!ctx->isolate) {
            rc = user_part(s, ctx);
            if (rc == STORE_OK || rc == STORE_BUSY) {
                ctx->results[ctx->current].rc = rc;
                if (rc == STORE_BUSY)
                    return rc;
                continue;
            }
            return BATCH_ISOLATE;
        }
        if (store_part(s, user_part, ctx, &rc) < 0)
            return rc == STORE_BUSY ? rc : STORE_ERROR;
        if (rc == STORE_BUSY)
            return rc; /* the whole batch is retried */
        struct user_result *r = &ctx->results[ctx->current];
        r->rc = rc;
        if (rc != STORE_OK) {
            ctx->pass->stopped_any = stopped; /* its stops were rolled back too */
            snprintf(r->why, sizeof r->why, "%s", ctx->pass->why[0] ? ctx->pass->why : "a store error (logged)");
        }
    }
    return STORE_OK;
}

/* ------------------------------------------------------------ failing users */

/* Users whose billing failed, with their streak of failed passes and the
 * last reason: so a failure is logged once per change, not every pass.
 * Only the billing thread touches the table; the counts are read by
 * /metrics and /readyz. */
struct failing_user {
    char user_id[ID_MAX];
    int64_t streak; /* passes in a row that failed them */
    char why[160];  /* the last reason */
};
static struct failing_user *failing;
static size_t n_failing, cap_failing;
static atomic_llong failures_total;      /* user billings that failed, all time */
static atomic_llong users_failing;       /* users whose last billing failed */
static atomic_llong users_failing_again; /* of them, failed more than one pass in a row */

static struct failing_user *failing_find(const char *user_id)
{
    for (size_t i = 0; i < n_failing; i++)
        if (strcmp(failing[i].user_id, user_id) == 0)
            return &failing[i];
    return NULL;
}

static void note_result(const char *user_id, const struct user_result *r)
{
    struct failing_user *f = failing_find(user_id);
    if (r->rc == STORE_OK) {
        if (f) {
            log_info("billing: user %s is billed again after %lld failed passes", user_id, (long long)f->streak);
            *f = failing[--n_failing];
        }
        return;
    }
    atomic_fetch_add(&failures_total, 1);
    if (!f) {
        if (n_failing == cap_failing) {
            size_t cap = cap_failing ? 2 * cap_failing : 16;
            struct failing_user *grown = realloc(failing, cap * sizeof *grown);
            if (!grown) {
                log_error("billing: cannot bill user %s: %s", user_id, r->why);
                return;
            }
            failing = grown;
            cap_failing = cap;
        }
        f = &failing[n_failing++];
        memset(f, 0, sizeof *f);
        snprintf(f->user_id, sizeof f->user_id, "%s", user_id);
    }
    if (f->streak == 0 || strcmp(f->why, r->why) != 0)
        log_error("billing: cannot bill user %s, skipped until it can be: %s", user_id, r->why);
    snprintf(f->why, sizeof f->why, "%s", r->why);
    f->streak++;
}

static void count_failing(void)
{
    int64_t again = 0;
    for (size_t i = 0; i < n_failing; i++)
        again += failing[i].streak > 1;
    atomic_store(&users_failing, (long long)n_failing);
    atomic_store(&users_failing_again, (long long)again);
}

void billing_failures(struct billing_failures *out)
{
    out->total = atomic_load(&failures_total);
    out->users = atomic_load(&users_failing);
    out->users_repeated = atomic_load(&users_failing_again);
}

/* ------------------------------------------------------------ batches */

/* Users posted per transaction: fewer commits (each an fsync) and fewer
 * index pages written twice, against a longer write lock. A periodic check
 * keeps the lock short (about 30 ms a batch at 100 000 users); a full pass,
 * at start-up or when an admin asks, takes it longer (about 250 ms) and
 * ends sooner: 5.3 s rather than 7.2 s over 100 000 users (BENCHMARKS.md). */
#define BATCH_USERS 500
#define FULL_PASS_BATCH_USERS 5000

/* What a batch posts (struct charge_batch), as it is planned. */
struct batch_plan {
    struct ledger_entry *entries; /* room for every interval and volume of the batch */
    char (*reasons)[160];         /* entries[i].reason points at reasons[i] */
    size_t *first_leg;            /* n_entries + 1 */
    size_t n_entries;
    struct ledger_leg *legs;
    size_t n_legs, cap_legs;
    struct billed_interval *intervals;
    size_t n_intervals;
    struct billed_volume *volumes;
    size_t n_volumes;
    const char **low; /* users whose funds may last under low_balance_minutes (notice_low_balance decides) */
    size_t n_low;
};

/* Whether what is left of a user's funds after a batch's charges may last
 * less than low_balance_minutes at what the next hour of their open
 * intervals and kept volumes costs. Only a first sieve, in C over what the
 * batch read: notice_low_balance reads the runway as GET /v1/balance does,
 * at the rate now. The sieve lets through twice the runway, so that a
 * price falling within the hour does not hide a user it should pass. */
static int may_run_low(struct store *s, struct pass *p, int64_t left, const struct billable *b, size_t nb,
                       const struct storage_billable *v, size_t nv)
{
    int64_t hour = 0, now, later;
    for (size_t i = 0; i < nb; i++)
        if (!b[i].ended_at && due_at(s, p, &b[i], p->now, &now) == STORE_OK &&
            due_at(s, p, &b[i], p->now + 3600, &later) == STORE_OK)
            hour += later - now;
    for (size_t i = 0; i < nv; i++)
        if (!v[i].deleted_at && storage_due_at(s, p, &v[i], p->now, &now) == STORE_OK &&
            storage_due_at(s, p, &v[i], p->now + 3600, &later) == STORE_OK)
            hour += later - now;
    return hour > 0 && (__int128)left * 60 < (__int128)hour * daemon_config->low_balance_minutes * 2;
}

/* Plans a charge of amount to the user as charge_to() posts one: drawn from
 * their grants g[0..ng) in order, then from their cash. -1 if it cannot be
 * (the funds read do not cover it, or no memory). */
static int plan_charge(struct batch_plan *pl, const struct ledger_entry *e, int64_t amount, struct grant *g, size_t ng,
                       int64_t *cash)
{
    if (pl->n_legs + ng + 2 > pl->cap_legs) {
        size_t cap = 2 * (pl->n_legs + ng + 2);
        struct ledger_leg *grown = realloc(pl->legs, cap * sizeof *grown);
        if (!grown)
            return -1;
        pl->legs = grown;
        pl->cap_legs = cap;
    }
    int64_t left = amount;
    for (size_t i = 0; i < ng && left > 0; i++) {
        int64_t take = g[i].remaining < left ? g[i].remaining : left;
        if (take == 0)
            continue;
        struct ledger_leg *l = &pl->legs[pl->n_legs++];
        memset(l, 0, sizeof *l);
        snprintf(l->account_id, sizeof l->account_id, "grant:%.31s", g[i].id);
        snprintf(l->grant_id, sizeof l->grant_id, "%.31s", g[i].id);
        l->amount = -take;
        g[i].remaining -= take;
        left -= take;
    }
    if (left > 0) {
        if (*cash < left)
            return -1;
        struct ledger_leg *l = &pl->legs[pl->n_legs++];
        memset(l, 0, sizeof *l);
        snprintf(l->account_id, sizeof l->account_id, "cash:%s", e->user_id);
        l->amount = -left;
        *cash -= left;
    }
    struct ledger_leg *l = &pl->legs[pl->n_legs++];
    memset(l, 0, sizeof *l);
    snprintf(l->account_id, sizeof l->account_id, "revenue");
    l->amount = amount;
    pl->entries[pl->n_entries++] = *e;
    pl->first_leg[pl->n_entries] = pl->n_legs;
    return 0;
}

/* Plans the user's storage and card time up to now, as bill_until() would
 * post them, if the user is simple: their funds cover everything owed (each
 * charge can be drawn from the grants and cash read), no credit of theirs
 * expired unspent, and nothing is to be refunded. 0 when planned; -1 when
 * the user must be billed one by one (bill_user), and the caller drops what
 * was planned of them. */
static int plan_user(struct store *s, struct pass *p, struct batch_plan *pl, const struct user_funds *f,
                     const struct billable *b, size_t nb, const struct storage_billable *v, size_t nv,
                     struct grant *g, size_t ng)
{
    if (!f || f->expired_grants)
        return -1;
    int64_t cash = f->cash, due;
    /* Storage first, oldest volume first, then card time, as bill_until. */
    for (size_t i = 0; i < nv; i++) {
        if (storage_due_at(s, p, &v[i], p->now, &due) != STORE_OK || due < v[i].billed)
            return -1;
        int settled = v[i].deleted_at && v[i].deleted_at <= p->now;
        if (due > v[i].billed) {
            storage_reason(pl->reasons[pl->n_entries], sizeof pl->reasons[0], &v[i]);
            struct ledger_entry e = {.at = p->now,
                                     .kind = "storage",
                                     .user_id = v[i].user_id,
                                     .reason = pl->reasons[pl->n_entries],
                                     .volume_id = v[i].volume_id};
            if (plan_charge(pl, &e, due - v[i].billed, g, ng, &cash) != 0)
                return -1;
        }
        if (due > v[i].billed || settled)
            pl->volumes[pl->n_volumes++] = (struct billed_volume){
                .volume_id = v[i].volume_id, .billed = due, .billed_to = due > v[i].billed ? p->now : 0,
                .settled = settled};
    }
    for (size_t i = 0; i < nb; i++) {
        if (due_at(s, p, &b[i], p->now, &due) != STORE_OK || due < b[i].billed)
            return -1;
        int settled = b[i].ended_at && b[i].ended_at <= p->now;
        if (due > b[i].billed) {
            usage_reason(pl->reasons[pl->n_entries], sizeof pl->reasons[0], &b[i]);
            struct ledger_entry e = {.at = p->now,
                                     .kind = "usage",
                                     .user_id = b[i].user_id,
                                     .reason = pl->reasons[pl->n_entries],
                                     .instance_id = b[i].instance_id,
                                     .interval_id = b[i].id};
            if (plan_charge(pl, &e, due - b[i].billed, g, ng, &cash) != 0)
                return -1;
        }
        if (due > b[i].billed || settled)
            pl->intervals[pl->n_intervals++] = (struct billed_interval){b[i].id, due, settled};
    }
    int64_t left = cash;
    for (size_t i = 0; i < ng; i++)
        left += g[i].remaining;
    if (may_run_low(s, p, left, b, nb, v, nv))
        pl->low[pl->n_low++] = f->user_id;
    return 0;
}

struct bulk_ctx {
    struct pass *pass;
    char (*users)[ID_MAX]; /* the batch, sorted */
    size_t n;
    unsigned char *billed; /* out, per user: 1 if billed by the batch */
};

/* The end of the run of rows from i whose user is user_id, in a list sorted
 * by user (rows of size bytes, the user id at offset off). */
static size_t run_end(const void *rows, size_t n, size_t size, size_t off, size_t i, const char *user_id)
{
    while (i < n && strcmp((const char *)rows + i * size + off, user_id) == 0)
        i++;
    return i;
}

static int by_interval_id(const void *a, const void *b)
{
    const struct billed_interval *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* Reads the batch's users, plans every simple one and posts them all in a
 * few statements; the others are left to be billed one by one. */
static int bulk_txn(struct store *s, void *vctx)
{
    struct bulk_ctx *ctx = vctx;
    struct pass *p = ctx->pass;
    memset(ctx->billed, 0, ctx->n);
    struct billing_batch rd;
    int rc = store_billing_batch_read(s, ctx->users, ctx->n, p->now, &rd);
    if (rc != STORE_OK)
        return rc;
    size_t room = rd.n_intervals + rd.n_volumes;
    struct batch_plan pl = {.entries = calloc(room + 1, sizeof *pl.entries),
                            .reasons = calloc(room + 1, sizeof *pl.reasons),
                            .first_leg = calloc(room + 1, sizeof *pl.first_leg),
                            .intervals = calloc(rd.n_intervals + 1, sizeof *pl.intervals),
                            .volumes = calloc(rd.n_volumes + 1, sizeof *pl.volumes),
                            .low = calloc(ctx->n + 1, sizeof *pl.low)};
    if (!pl.entries || !pl.reasons || !pl.first_leg || !pl.intervals || !pl.volumes || !pl.low)
        rc = STORE_ERROR;
    size_t bi = 0, vi = 0, fi = 0, gi = 0;
    for (size_t u = 0; rc == STORE_OK && u < ctx->n; u++) {
        const char *id = ctx->users[u];
        /* Every list is sorted by user: skip rows of no user of the batch
         * (there are none), then take this user's run of each. */
        while (bi < rd.n_intervals && strcmp(rd.intervals[bi].user_id, id) < 0)
            bi++;
        while (vi < rd.n_volumes && strcmp(rd.volumes[vi].user_id, id) < 0)
            vi++;
        while (fi < rd.n_funds && strcmp(rd.funds[fi].user_id, id) < 0)
            fi++;
        while (gi < rd.n_grants && strcmp(rd.grants[gi].user_id, id) < 0)
            gi++;
        size_t bj = run_end(rd.intervals, rd.n_intervals, sizeof *rd.intervals, offsetof(struct billable, user_id),
                            bi, id);
        size_t vj = run_end(rd.volumes, rd.n_volumes, sizeof *rd.volumes, offsetof(struct storage_billable, user_id),
                            vi, id);
        size_t gj = run_end(rd.grants, rd.n_grants, sizeof *rd.grants, offsetof(struct grant, user_id), gi, id);
        const struct user_funds *f = fi < rd.n_funds && strcmp(rd.funds[fi].user_id, id) == 0 ? &rd.funds[fi] : NULL;
        struct batch_plan mark = pl;
        if (plan_user(s, p, &pl, f, rd.intervals + bi, bj - bi, rd.volumes + vi, vj - vi, rd.grants + gi, gj - gi) == 0)
            ctx->billed[u] = 1;
        else { /* left for bill_user: what was planned of them is dropped */
            pl.n_entries = mark.n_entries;
            pl.n_legs = mark.n_legs;
            pl.n_intervals = mark.n_intervals;
            pl.n_volumes = mark.n_volumes;
        }
        bi = bj;
        vi = vj;
        gi = gj;
    }
    /* Marked in the order of their rows, not their users': each page of
     * the intervals' table is then written once. */
    qsort(pl.intervals, pl.n_intervals, sizeof *pl.intervals, by_interval_id);
    struct charge_batch batch = {pl.entries, pl.first_leg, pl.n_entries, pl.legs,
                                 pl.intervals, pl.n_intervals, pl.volumes, pl.n_volumes};
    if (rc == STORE_OK)
        rc = store_charge_batch_post(s, &batch, p->now);
    for (size_t i = 0; rc == STORE_OK && i < pl.n_low; i++)
        rc = notice_low_balance(s, pl.low[i], p->now);
    free(pl.low);
    free(pl.entries);
    free(pl.reasons);
    free(pl.first_leg);
    free(pl.legs);
    free(pl.intervals);
    free(pl.volumes);
    store_billing_batch_free(&rd);
    return rc;
}

/* Grants of users with nothing to bill expire too; after all the batches,
 * so that no user's credit is voided before their usage up to its expiry
 * was drawn from it (bill_user voids the grants of those it bills). And
 * credit a clock that ran ahead voided before its expiry is given back. */
static int expire_txn(struct store *s, void *vctx)
{
    struct pass *p = vctx;
    int rc = ledger_unexpire_early_grants(s, p->now);
    return rc == STORE_OK ? ledger_expire_grants(s, NULL, p->now) : rc;
}

/* Bills users (sorted) one by one, in transactions of USERS_PER_TXN. */
static int bill_one_by_one(struct store *s, struct pass *p, char (*users)[ID_MAX], const unsigned char *expiries,
                           size_t n, int *stopped)
{
    int rc = STORE_OK;
    struct user_result results[USERS_PER_TXN];
    for (size_t off = 0; rc == STORE_OK && off < n; off += USERS_PER_TXN) {
        struct batch_ctx ctx = {p,
                                users + off,
                                expiries ? expiries + off : NULL,
                                n - off < USERS_PER_TXN ? n - off : USERS_PER_TXN,
                                results,
                                0,
                                0};
        rc = store_txn(s, batch_txn, &ctx);
        if (rc == BATCH_ISOLATE) {
            ctx.isolate = 1;
            rc = store_txn(s, batch_txn, &ctx);
        }
        if (rc == STORE_OK)
            for (size_t i = 0; i < ctx.n; i++) {
                note_result(ctx.users[i], &results[i]);
                p->failed += results[i].rc != STORE_OK;
            }
        *stopped |= p->stopped_any;
    }
    return rc;
}

/* Bills users (sorted): those whose funds cover what they owe in batches of
 * batch users (bulk_txn; at most FULL_PASS_BATCH_USERS), the others one by
 * one; then voids the credit of users with nothing left to bill. A batch
 * that cannot be posted (a row not as read, a balance that would overflow)
 * is billed one by one too, where the user at fault is found and skipped
 * alone. */
static int bill_users(struct store *s, struct pass *p, char (*users)[ID_MAX], const unsigned char *expiries, size_t n,
                      size_t batch)
{
    char(*rest)[ID_MAX] = n ? malloc(n * sizeof *rest) : NULL;
    unsigned char *rest_expiries = n ? malloc(n) : NULL;
    size_t n_rest = 0;
    int rc = STORE_OK, stopped = 0;
    if (rest && rest_expiries) {
        unsigned char billed[FULL_PASS_BATCH_USERS];
        for (size_t off = 0; off < n; off += batch) {
            struct bulk_ctx ctx = {p, users + off, n - off < batch ? n - off : batch, billed};
            if (store_txn(s, bulk_txn, &ctx) != STORE_OK) {
                log_warn("billing: a batch of %zu users could not be posted at once; they are billed one by one",
                         ctx.n);
                memset(billed, 0, ctx.n);
            }
            struct user_result ok = {.rc = STORE_OK};
            for (size_t i = 0; i < ctx.n; i++)
                if (billed[i]) {
                    note_result(ctx.users[i], &ok);
                } else {
                    memcpy(rest[n_rest], ctx.users[i], ID_MAX);
                    rest_expiries[n_rest++] = !expiries || expiries[off + i];
                }
        }
        rc = bill_one_by_one(s, p, rest, rest_expiries, n_rest, &stopped);
    } else {
        rc = bill_one_by_one(s, p, users, expiries, n, &stopped);
    }
    free(rest);
    free(rest_expiries);
    count_failing();
    if (rc == STORE_OK)
        rc = store_txn(s, expire_txn, p);
    if (stopped)
        reconciler_wake();
    return rc;
}

static void pass_done(struct pass *p, int64_t started, int64_t checked, int64_t billed, struct billing_summary *out)
{
    price_book_free(&p->prices);
    storage_book_free(&p->storage);
    if (out) {
        out->users = billed;
        out->checked = checked;
        out->at = p->now;
        out->duration_ms = clock_mono_ms() - started;
        out->failed = p->failed;
    }
}

/* When every user's usage was last looked at (a full pass or a check);
 * only the thread that runs the passes touches it. */
static int64_t last_check = -1;

int billing_pass(struct store *s, struct billing_summary *out)
{
    int64_t started = clock_mono_ms();
    struct pass p = {.now = clock_now()};
    char(*users)[ID_MAX] = NULL;
    size_t n = 0;
    int rc = store_users_to_bill(s, &users, &n);
    if (rc == STORE_OK)
        rc = bill_users(s, &p, users, NULL, n, FULL_PASS_BATCH_USERS);
    free(users);
    if (rc == STORE_OK)
        last_check = p.now;
    pass_done(&p, started, (int64_t)n, (int64_t)n, out);
    return rc;
}

/* Whether the user's regular posting falls between two passes: each user
 * at their own offset in a billing_post_interval_s cycle, so that every pass
 * posts an even share of users. */
static int posting_due(const char *user_id, int64_t prev, int64_t now)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (const char *c = user_id; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211u;
    int64_t every = daemon_config->billing_post_interval_s;
    int64_t off = (int64_t)(h % (uint64_t)every);
    return (now + off) / every != (prev + off) / every;
}

int billing_check(struct store *s, struct billing_summary *out)
{
    int64_t started = clock_mono_ms();
    struct pass p = {.now = clock_now()};
    int64_t prev = last_check >= 0 && last_check <= p.now ? last_check : p.now - 1;
    struct billable *b = NULL;
    struct user_funds *f = NULL;
    char(*users)[ID_MAX] = NULL;
    size_t nb = 0, nf = 0, nu = 0, checked = 0;
    /* Funds first: a top-up landing between the two reads only makes a
     * user look poorer, which bills them now rather than later. */
    struct storage_billable *v = NULL;
    size_t nv = 0;
    int rc = store_funds_to_bill(s, p.now, &f, &nf);
    if (rc == STORE_OK)
        rc = store_billables_all(s, &b, &nb);
    if (rc == STORE_OK)
        rc = store_storage_billables_all(s, &v, &nv);
    unsigned char *expiries = NULL;
    if (rc == STORE_OK && nb + nv &&
        (!(users = malloc((nb + nv) * sizeof *users)) || !(expiries = malloc(nb + nv))))
        rc = STORE_ERROR;
    size_t fi = 0;
    /* Both lists are sorted by user: each user's intervals and volumes are
     * looked at together. */
    for (size_t i = 0, k = 0; rc == STORE_OK && (i < nb || k < nv);) {
        const char *user_id =
            i < nb && (k >= nv || strcmp(b[i].user_id, v[k].user_id) <= 0) ? b[i].user_id : v[k].user_id;
        int64_t owed = 0, storage = 0;
        int ended = 0, uncertain = 0, deleted = 0, cards = 0;
        size_t j = i;
        for (; j < nb && strcmp(b[j].user_id, user_id) == 0; j++) {
            int64_t due;
            /* A cost that cannot be computed goes to the full path, which
             * fails (and reports) this user alone. */
            if (due_at(s, &p, &b[j], p.now, &due) != STORE_OK ||
                (due > b[j].billed && money_add(owed, due - b[j].billed, &owed) != MONEY_OK))
                uncertain = 1;
            ended |= b[j].ended_at != 0;
            cards = 1;
        }
        size_t m = k;
        for (; m < nv && strcmp(v[m].user_id, user_id) == 0; m++) {
            int64_t due;
            if (storage_due_at(s, &p, &v[m], p.now, &due) != STORE_OK ||
                (due > v[m].billed && money_add(storage, due - v[m].billed, &storage) != MONEY_OK))
                uncertain = 1;
            deleted |= v[m].deleted_at != 0;
        }
        if (money_add(owed, storage, &owed) != MONEY_OK)
            uncertain = 1;
        while (fi < nf && strcmp(f[fi].user_id, user_id) < 0)
            fi++;
        const struct user_funds *uf = fi < nf && strcmp(f[fi].user_id, user_id) == 0 ? &f[fi] : NULL;
        __int128 funds = uf ? (__int128)uf->cash + uf->credit : 0;
        /* Storage owed beyond funds stops nothing: it is worth a pass only
         * when there is money to charge it from (or cards to stop), and a
         * deleted volume only when it can be settled. */
        int short_of_funds = (__int128)owed > funds && (cards || funds > 0);
        int settle = deleted && (storage == 0 || funds > 0);
        /* Anything uncertain bills now: the full path decides exactly. */
        if (!uf || uncertain || short_of_funds || ended || settle || uf->expired_grants ||
            (owed > 0 && posting_due(user_id, prev, p.now))) {
            expiries[nu] = !uf || uf->expired_grants;
            memcpy(users[nu++], user_id, ID_MAX);
        }
        checked++;
        i = j;
        k = m;
    }
    free(b);
    free(v);
    free(f);
    if (rc == STORE_OK)
        rc = bill_users(s, &p, users, expiries, nu, BATCH_USERS);
    free(users);
    free(expiries);
    if (rc == STORE_OK)
        last_check = p.now;
    pass_done(&p, started, (int64_t)checked, (int64_t)nu, out);
    return rc;
}

/* ------------------------------------------------------------ the thread */

static struct bg_loop loop = BG_LOOP_INIT("billing");
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER; /* a pass ended */
static int64_t passes_done;                                 /* guarded by loop.lock */
static int64_t full_asked, full_done; /* guarded by loop.lock: full passes asked for, and served up to */
static struct billing_summary last;   /* guarded by loop.lock: of the last full pass */
static int last_rc;                   /* guarded by loop.lock: how the last full pass ended */

/* Reservations' clock (issue 16): warnings before a block ends, its
 * instances stopped at the end, credits for hours lost to failed reserved
 * hardware. Run before each billing pass, in its own transaction. */
struct reservations_ctx {
    int64_t now;
    int stopped; /* out: some instance was stopped */
};

static int reservations_txn(struct store *s, void *vctx)
{
    struct reservations_ctx *ctx = vctx;
    return reservation_pass(s, ctx->now, &ctx->stopped);
}

static void reservations_run(struct store *s)
{
    struct reservations_ctx ctx = {.now = clock_now()};
    if (store_txn(s, reservations_txn, &ctx) != STORE_OK)
        log_error("billing: the reservations pass failed; it will be retried");
    else if (ctx.stopped)
        reconciler_wake();
}

static void *billing_main(void *arg)
{
    (void)arg;
    struct store *s = store_thread();
    if (!s) {
        log_error("billing: no database connection; billing stopped");
        return NULL;
    }
    /* The first pass after start-up posts everything due. */
    int first = 1;
    for (;;) {
        /* Requests made before this read are served by this pass, which
         * reads the clock after it. */
        loop_lock(&loop);
        int64_t asked = full_asked;
        loop_unlock(&loop);
        int full = first || asked > full_done;
        reservations_run(s);
        struct billing_summary sum = {0};
        int rc = full ? billing_pass(s, &sum) : billing_check(s, &sum);
        if (rc != STORE_OK)
            log_error("billing: pass failed; it will be retried");
        else
            first = 0;
        metrics_billing_pass(sum.duration_ms * 1000);
        watchdog_loop_alive(LOOP_BILLING);
        loop_lock(&loop);
        if (full) {
            last = sum;
            last_rc = rc;
            full_done = asked;
        }
        passes_done++;
        pthread_cond_broadcast(&done_cond);
        int stop = loop_sleep_locked(&loop, daemon_config->billing_interval_ms);
        loop_unlock(&loop);
        if (stop)
            break;
    }
    return NULL;
}

int billing_start(void)
{
    return loop_start(&loop, billing_main);
}

int billing_run_now(struct billing_summary *out, int timeout_ms)
{
    struct timespec deadline;
    loop_deadline_us((int64_t)timeout_ms * 1000, &deadline);
    loop_lock(&loop);
    /* A pass already under way read the clock before this call: the full
     * pass that serves it starts after it. */
    int64_t target = ++full_asked;
    int rc = 0;
    while (full_done < target && rc == 0) {
        loop.wake_requested = 1;
        pthread_cond_signal(&loop.cond);
        rc = pthread_cond_timedwait(&done_cond, &loop.lock, &deadline);
    }
    if (out)
        *out = last;
    int ok = full_done >= target && last_rc == STORE_OK;
    loop_unlock(&loop);
    return ok ? 0 : -1;
}

void billing_stop(void)
{
    loop_stop(&loop);
}
