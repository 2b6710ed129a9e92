/* bench/billing.c: how long one billing pass takes over many running
 * instances, and how much memory it needs. Not a test.
 *
 * Builds a fresh database with the daemon's own migrations, fills it with
 * users who each hold a sign-up credit of 10.00 per instance (granted
 * through the ledger, so the books balance) and running 1-card MI450 instances with open running
 * intervals (inserted directly with SQL: the fleet and the reconciler are not
 * what is measured), then calls billing_pass() from the daemon library on the
 * testing clock, as the billing thread does every billing_interval_ms:
 *
 *   full    billing_pass() 10 s after every instance started: it posts a
 *           charge for every interval (start-up, or an admin's run)
 *   check   billing_check() every 10 s after that, as the billing thread
 *           does: every user's funds checked against what is due, usage
 *           posted for the share of users whose turn it is (each user at
 *           least every 5 minutes); the last one repeats the same second
 *   full    billing_pass() an hour later: a charge for every interval
 *
 * Each line reports wall time, CPU time (user + system) and the process's
 * peak RSS so far; the pass is single-threaded, so CPU time is one core's.
 * At the end `ledger verify` must pass and revenue must equal the formula.
 *
 *   build/bench/billing [--instances N] [--per-user K] [--dir DIR] [--keep]
 *                       [--sync full|normal] [--shuffled-ids]
 *
 * Users are numbered in the order they are made (usr_000…1, …2), so the
 * order the passes bill them in (by id) is the order of their rows in
 * every table; --shuffled-ids numbers them in no such order, as the
 * daemon's random ids do.
 *
 * BENCH_SQL="PRAGMA ..." runs that statement on the connection first, to
 * try connection settings (mmap_size, cache_size) without rebuilding.
 */
#include "bench_util.h"
#include "gpurentd.h"
#include "domain/ledger.h"
#include "gpurent/money.h"
#include "store/store_sql.h" /* benchmarks fill the database directly */

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define T0 BENCH_T0
#define PRICE INT64_C(1200000) /* MI450 seed price per card-hour */

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec / 1e6;
}

static long max_rss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

struct fill {
    int64_t users;    /* how many */
    int shuffled;     /* user ids in no relation to the order of creation */
    int64_t per_user; /* instances each */
    int64_t from;     /* first user of this batch */
    int64_t to;       /* one past the last */
};

/* Users, volumes, instances and open intervals straight into the tables;
 * the sign-up credit through the ledger, as the daemon grants it. */
static int fill_txn(struct store *s, void *vctx)
{
    struct fill *f = vctx;
    sqlite3 *db = store_db(s);
    sqlite3_stmt *u = NULL, *v = NULL, *in = NULL, *iv = NULL;
    int rc = STORE_ERROR;
    if (sqlite3_prepare_v2(db, "INSERT INTO users (id, email, created_at) VALUES (?1, ?1 || '@bench.test', ?2)", -1,
                           &u, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO volumes (id, user_id, name, size_gb, source, created_at)"
                               " VALUES (?1, ?2, 'shared', 100, '/srv/' || ?1, ?3)", -1, &v, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO instances (id, user_id, name, gpu_model, card_count, image, volume_id,"
                               " desired, state, state_since, created_at, updated_at) VALUES (?1, ?2, '', 'MI450', 1,"
                               " 'rocm/pytorch:2.3-rocm6.2', ?3, 'running', 'running', ?4, ?4, ?4)", -1, &in,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO running_intervals (instance_id, user_id, gpu_model, card_count, started_at)"
                               " VALUES (?1, ?2, 'MI450', 1, ?3)", -1, &iv, NULL) != SQLITE_OK) {
        fprintf(stderr, "bench: prepare: %s\n", sqlite3_errmsg(db));
        goto done;
    }
    for (int64_t i = f->from; i < f->to; i++) {
        char uid[ID_MAX], vid[ID_MAX];
        /* Multiplying by an odd constant is a bijection of 64-bit numbers:
         * distinct ids whose order is not the rows' order, as a daemon's
         * random ids are not. */
        if (f->shuffled)
            snprintf(uid, sizeof uid, "usr_%020" PRIu64, (uint64_t)i * UINT64_C(0x9E3779B97F4A7C15));
        else
            snprintf(uid, sizeof uid, "usr_%020" PRId64, i);
        snprintf(vid, sizeof vid, "vol_%020" PRId64, i);
        sqlite3_bind_text(u, 1, uid, -1, SQLITE_STATIC);
        sqlite3_bind_int64(u, 2, T0);
        sqlite3_bind_text(v, 1, vid, -1, SQLITE_STATIC);
        sqlite3_bind_text(v, 2, uid, -1, SQLITE_STATIC);
        sqlite3_bind_int64(v, 3, T0);
        if (sqlite3_step(u) != SQLITE_DONE || sqlite3_step(v) != SQLITE_DONE)
            goto fail;
        sqlite3_reset(u);
        sqlite3_reset(v);
        /* 10.00 per instance: an hour and more of 1 card, so no one runs out. */
        if ((rc = ledger_grant(s, uid, "signup", f->per_user * 10 * MONEY_UNIT, 0, T0, "trial credit", NULL)) !=
            STORE_OK)
            goto done;
        rc = STORE_ERROR;
        for (int64_t k = 0; k < f->per_user; k++) {
            char iid[64];
            snprintf(iid, sizeof iid, "ins_%014" PRId64 "%06" PRId64, i % INT64_C(100000000000000), k % 1000000);
            sqlite3_bind_text(in, 1, iid, -1, SQLITE_STATIC);
            sqlite3_bind_text(in, 2, uid, -1, SQLITE_STATIC);
            sqlite3_bind_text(in, 3, vid, -1, SQLITE_STATIC);
            sqlite3_bind_int64(in, 4, T0);
            sqlite3_bind_text(iv, 1, iid, -1, SQLITE_STATIC);
            sqlite3_bind_text(iv, 2, uid, -1, SQLITE_STATIC);
            sqlite3_bind_int64(iv, 3, T0);
            if (sqlite3_step(in) != SQLITE_DONE || sqlite3_step(iv) != SQLITE_DONE)
                goto fail;
            sqlite3_reset(in);
            sqlite3_reset(iv);
        }
    }
    rc = STORE_OK;
    goto done;
fail:
    fprintf(stderr, "bench: insert: %s\n", sqlite3_errmsg(db));
done:
    sqlite3_finalize(u);
    sqlite3_finalize(v);
    sqlite3_finalize(in);
    sqlite3_finalize(iv);
    return rc;
}

static int64_t statements;

/* Counts the statements a pass runs; with BENCH_PROFILE=1 also times them. */
static int count_stmt(unsigned type, void *ctx, void *p, void *x)
{
    if (type == SQLITE_TRACE_STMT) {
        statements++;
        return 0;
    }
    return bench_profile_trace(type, ctx, p, x);
}

/* Runs one pass at t: full (billing_pass) or the thread's periodic check. */
static void pass(struct store *s, const char *label, int full, int64_t t, int64_t instances)
{
    bench_set_clock(t);
    statements = 0;
    int profile = getenv("BENCH_PROFILE") != NULL;
    sqlite3_trace_v2(store_db(s), SQLITE_TRACE_STMT | (profile ? SQLITE_TRACE_PROFILE : 0), count_stmt, NULL);
    /* Pages written and read from outside the cache: counts that, unlike
     * times on a shared VM, do not vary from run to run. */
    int cur, high;
    sqlite3_db_status(store_db(s), SQLITE_DBSTATUS_CACHE_WRITE, &cur, &high, 1);
    sqlite3_db_status(store_db(s), SQLITE_DBSTATUS_CACHE_MISS, &cur, &high, 1);
    double w0 = bench_now(), c0 = cpu_s();
    struct billing_summary sum;
    if ((full ? billing_pass(s, &sum) : billing_check(s, &sum)) != STORE_OK) {
        fprintf(stderr, "bench: billing pass failed\n");
        exit(1);
    }
    double wall = bench_now() - w0, cpu = cpu_s() - c0;
    sqlite3_trace_v2(store_db(s), 0, NULL, NULL);
    int written, missed;
    sqlite3_db_status(store_db(s), SQLITE_DBSTATUS_CACHE_WRITE, &written, &high, 0);
    sqlite3_db_status(store_db(s), SQLITE_DBSTATUS_CACHE_MISS, &missed, &high, 0);
    printf("%-6s t=+%-5" PRId64 " %6" PRId64 " users checked %6" PRId64 " posted  wall %7.3f s  cpu %7.3f s"
           "  %6.2f us/instance  %8" PRId64 " SQL statements  %7d pages written %7d read  max RSS %6.1f MiB\n",
           label, t - T0, sum.checked, sum.users, wall, cpu, wall * 1e6 / (double)instances, statements, written,
           missed, (double)max_rss_kb() / 1024.0);
    if (profile)
        bench_profile_print();
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int64_t instances = 10000, per_user = 1;
    const char *dir_arg = NULL, *sync = "full";
    int keep = 0, shuffled = 0;
    static const struct option opts[] = {
        {"instances", required_argument, NULL, 'n'}, {"per-user", required_argument, NULL, 'k'},
        {"dir", required_argument, NULL, 'd'},       {"keep", no_argument, NULL, 'K'},
        {"sync", required_argument, NULL, 's'},      {"shuffled-ids", no_argument, NULL, 'S'},
        {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'n': instances = strtoll(optarg, NULL, 10); break;
        case 'k': per_user = strtoll(optarg, NULL, 10); break;
        case 'd': dir_arg = optarg; break;
        case 'K': keep = 1; break;
        case 's': sync = optarg; break;
        case 'S': shuffled = 1; break;
        default:
            fprintf(stderr,
                    "usage: %s [--instances N] [--per-user K] [--dir DIR] [--keep] [--sync full|normal]"
                    " [--shuffled-ids]\n",
                    argv[0]);
            return 2;
        }
    }
    if (instances < 1 || per_user < 1 || instances % per_user != 0 ||
        (strcmp(sync, "full") != 0 && strcmp(sync, "normal") != 0)) {
        fprintf(stderr, "bench: --instances must be a positive multiple of --per-user; --sync full or normal\n");
        return 2;
    }
    int64_t users = instances / per_user;
    char dir[1024], db_path[1100];
    if (bench_workdir(dir_arg, dir, sizeof dir) < 0 || bench_daemon_config(dir, NULL, 0) < 0)
        return 1;
    snprintf(db_path, sizeof db_path, "%s/gpurent.db", dir);
    unlink(db_path);

    char err[1024];
    struct store *s = store_open(db_path, err, sizeof err);
    if (!s || store_migrate(s, 0, err, sizeof err) < 0) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    if (strcmp(sync, "normal") == 0)
        bench_exec(s, "PRAGMA synchronous=NORMAL");
    if (getenv("BENCH_SQL"))
        bench_exec(s, getenv("BENCH_SQL"));
    double f0 = bench_now();
    for (int64_t from = 0; from < users; from += 5000) {
        struct fill f = {users, shuffled, per_user, from, from + 5000 < users ? from + 5000 : users};
        if (store_txn(s, fill_txn, &f) != STORE_OK) {
            fprintf(stderr, "bench: cannot fill the database\n");
            return 1;
        }
    }
    bench_exec(s, "ANALYZE");
    printf("billing bench: %" PRId64 " running 1-card MI450 instances, %" PRId64 " per user, %" PRId64
           " users%s; synchronous=%s; database %s (filled in %.1f s, RSS so far %.1f MiB)\n",
           instances, per_user, users, shuffled ? " (ids shuffled)" : "", sync, db_path, bench_now() - f0,
           (double)max_rss_kb() / 1024.0);

    /* What the daemon does: a full pass at start-up, then a check every
     * 10 s (billing_interval_ms), each posting the users whose turn it is;
     * then an admin's full pass an hour later. */
    pass(s, "full", 1, T0 + 10, instances);
    for (int64_t t = T0 + 20; t <= T0 + 70; t += 10)
        pass(s, "check", 0, t, instances);
    pass(s, "check", 0, T0 + 70, instances);
    pass(s, "full", 1, T0 + 3620, instances);

    /* The books must still balance, and every interval be charged exactly. */
    int64_t want = per_user * users * ((PRICE * 3620) / 3600);
    int64_t revenue = bench_int(s, "SELECT balance FROM ledger_accounts WHERE id = 'revenue'");
    FILE *sink = fopen("/dev/null", "w");
    double v0 = bench_now();
    int breaches = ledger_verify(s, sink ? (void *)sink : (void *)stderr);
    double vt = bench_now() - v0;
    if (sink)
        fclose(sink);
    printf("check   revenue %" PRId64 " micro (want %" PRId64 "), ledger verify: %d breaches in %.2f s\n", revenue,
           want, breaches, vt);
    store_close(s);
    if (!keep) {
        bench_remove_db(db_path);
        bench_remove_workdir(dir);
    }
    return revenue == want && breaches == 0 ? 0 : 1;
}
