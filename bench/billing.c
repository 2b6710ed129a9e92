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
 *                       [--sync full|normal]
 *
 * BENCH_SQL="PRAGMA ..." runs that statement on the connection first, to
 * try connection settings (mmap_size, cache_size) without rebuilding.
 */
#include "clock.h"
#include "daemon.h"
#include "ledger.h"
#include "log.h"
#include "money.h"
#include "store.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define T0 INT64_C(1800000000) /* the testing clock's start, as in the e2e tests */
#define PRICE INT64_C(1200000) /* MI450 seed price per card-hour */

static char clock_path[1200];

static void set_clock(int64_t t)
{
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%s.tmp", clock_path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%" PRId64 "\n", t) < 0 || fclose(f) != 0 || rename(tmp, clock_path) != 0) {
        fprintf(stderr, "bench: cannot write %s: %s\n", clock_path, strerror(errno));
        exit(1);
    }
}

static double now_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

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

static void exec_or_die(struct store *s, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(store_db(s), sql, NULL, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "bench: %s: %s\n", sql, err ? err : "?");
        exit(1);
    }
}

struct fill {
    int64_t users;    /* how many */
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

static int count_stmt(unsigned type, void *ctx, void *p, void *x)
{
    (void)type, (void)ctx, (void)p, (void)x;
    statements++;
    return 0;
}

/* Runs one pass at t: full (billing_pass) or the thread's periodic check. */
static void pass(struct store *s, const char *label, int full, int64_t t, int64_t instances)
{
    set_clock(t);
    statements = 0;
    sqlite3_trace_v2(store_db(s), SQLITE_TRACE_STMT, count_stmt, NULL);
    double w0 = now_s(CLOCK_MONOTONIC), c0 = cpu_s();
    struct billing_summary sum;
    if ((full ? billing_pass(s, &sum) : billing_check(s, &sum)) != STORE_OK) {
        fprintf(stderr, "bench: billing pass failed\n");
        exit(1);
    }
    double wall = now_s(CLOCK_MONOTONIC) - w0, cpu = cpu_s() - c0;
    sqlite3_trace_v2(store_db(s), 0, NULL, NULL);
    printf("%-6s t=+%-5" PRId64 " %6" PRId64 " users checked %6" PRId64 " posted  wall %7.3f s  cpu %7.3f s"
           "  %6.2f us/instance  %8" PRId64 " SQL statements  max RSS %6.1f MiB\n",
           label, t - T0, sum.checked, sum.users, wall, cpu, wall * 1e6 / (double)instances, statements,
           (double)max_rss_kb() / 1024.0);
    fflush(stdout);
}

static int64_t one_int(struct store *s, const char *sql)
{
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (sqlite3_prepare_v2(store_db(s), sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

int main(int argc, char **argv)
{
    int64_t instances = 10000, per_user = 1;
    const char *dir_arg = NULL, *sync = "full";
    int keep = 0;
    static const struct option opts[] = {
        {"instances", required_argument, NULL, 'n'}, {"per-user", required_argument, NULL, 'k'},
        {"dir", required_argument, NULL, 'd'},       {"keep", no_argument, NULL, 'K'},
        {"sync", required_argument, NULL, 's'},      {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'n': instances = strtoll(optarg, NULL, 10); break;
        case 'k': per_user = strtoll(optarg, NULL, 10); break;
        case 'd': dir_arg = optarg; break;
        case 'K': keep = 1; break;
        case 's': sync = optarg; break;
        default:
            fprintf(stderr, "usage: %s [--instances N] [--per-user K] [--dir DIR] [--keep] [--sync full|normal]\n",
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
    char dir[1024];
    if (dir_arg) {
        snprintf(dir, sizeof dir, "%s", dir_arg);
        mkdir(dir, 0700);
    } else {
        snprintf(dir, sizeof dir, "/tmp/gpurent-bench-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("bench: mkdtemp");
            return 1;
        }
    }
    char db_path[1100], override_db[1200], override_clock[1300];
    snprintf(db_path, sizeof db_path, "%s/gpurent.db", dir);
    snprintf(clock_path, sizeof clock_path, "%s/clock", dir);
    unlink(db_path);
    set_clock(T0);
    snprintf(override_db, sizeof override_db, "database=%s", db_path);
    snprintf(override_clock, sizeof override_clock, "clock_file=%s", clock_path);
    char override_log[] = "log_level=warn";
    char *overrides[] = {override_db, override_clock, override_log};
    static struct daemon_conf conf;
    if (daemon_load_config(&conf, NULL, overrides, 3) < 0)
        return 1;
    daemon_config = &conf;
    log_set_level(LOG_LVL_WARN);
    if (clock_use_file(clock_path) < 0) {
        fprintf(stderr, "bench: cannot use the clock file\n");
        return 1;
    }

    char err[1024];
    struct store *s = store_open(db_path, err, sizeof err);
    if (!s || store_migrate(s, 0, err, sizeof err) < 0) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    if (strcmp(sync, "normal") == 0)
        exec_or_die(s, "PRAGMA synchronous=NORMAL");
    if (getenv("BENCH_SQL"))
        exec_or_die(s, getenv("BENCH_SQL"));
    double f0 = now_s(CLOCK_MONOTONIC);
    for (int64_t from = 0; from < users; from += 5000) {
        struct fill f = {users, per_user, from, from + 5000 < users ? from + 5000 : users};
        if (store_txn(s, fill_txn, &f) != STORE_OK) {
            fprintf(stderr, "bench: cannot fill the database\n");
            return 1;
        }
    }
    exec_or_die(s, "ANALYZE");
    printf("billing bench: %" PRId64 " running 1-card MI450 instances, %" PRId64 " per user, %" PRId64
           " users; synchronous=%s; database %s (filled in %.1f s, RSS so far %.1f MiB)\n",
           instances, per_user, users, sync, db_path, now_s(CLOCK_MONOTONIC) - f0, (double)max_rss_kb() / 1024.0);

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
    int64_t revenue = one_int(s, "SELECT balance FROM ledger_accounts WHERE id = 'revenue'");
    FILE *sink = fopen("/dev/null", "w");
    double v0 = now_s(CLOCK_MONOTONIC);
    int breaches = ledger_verify(s, sink ? (void *)sink : (void *)stderr);
    double vt = now_s(CLOCK_MONOTONIC) - v0;
    if (sink)
        fclose(sink);
    printf("check   revenue %" PRId64 " micro (want %" PRId64 "), ledger verify: %d breaches in %.2f s\n", revenue,
           want, breaches, vt);
    store_close(s);
    if (!keep) {
        char p[1300];
        const char *suffixes[] = {"", "-wal", "-shm"};
        for (size_t i = 0; i < 3; i++) {
            snprintf(p, sizeof p, "%s%s", db_path, suffixes[i]);
            unlink(p);
        }
        unlink(clock_path);
        rmdir(dir);
    }
    return revenue == want && breaches == 0 ? 0 : 1;
}
