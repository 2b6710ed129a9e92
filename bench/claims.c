/* bench/claims.c: how many placement claims per second the daemon's create
 * transaction sustains, and how long each waits. Not a test.
 *
 * A claim is what POST /v1/instances does inside its transaction, and what
 * decides whether two users could ever get the same card: instance_create()
 * from the daemon library checks the type, image, volume, funds and quota,
 * inserts the instance and claims its cards best-fit through the placement
 * index. This bench runs exactly that, without HTTP and without agents, so
 * the figure is the store's and the placement's, not the clients'.
 *
 * For each thread count it builds a fresh database with the daemon's own
 * migrations: N ready 8-card MI450 nodes (inserted with SQL; their free-card
 * counts kept by the migration's triggers) and one user per 8 claims, funded
 * through the ledger. Then every thread, on its own connection as the daemon's
 * HTTP threads are, claims cards through store_txn() as fast as it can until
 * the claims are done. It reports claims per second and each claim's latency
 * (p50, p99), then checks that every
 * instance holds exactly its cards, that no card is counted twice, and that
 * `ledger verify` passes.
 *
 *   build/bench/claims [--nodes N] [--claims M] [--cards C] [--threads 1,8,...]
 *                      [--history H] [--dir DIR] [--keep]
 *
 * --history H gives every user H terminated 8-card instances first, as
 * months of use leave behind, to see what a bigger database costs a claim.
 * --live L makes L running instances first (claimed the same way, untimed),
 * to see what a claim costs with that many already holding cards: the
 * in-process reference for bench/instances.py --live.
 *
 * Each line also gives the pages the writer wrote to the WAL and read from
 * outside its cache per claim (SQLite's CACHE_WRITE and CACHE_MISS): counts
 * that, unlike times on a shared VM, barely move between runs.
 * BENCH_PROFILE=1 prints each statement's summed time after the run.
 */
#include "bench_util.h"
#include "gpurentd.h"
#include "domain/ledger.h"
#include "gpurent/money.h"
#include "store/store_sql.h" /* benchmarks fill the database directly */

#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T0 BENCH_T0
#define THREADS_MAX 64

struct fill {
    int64_t nodes;
    int users;
    int64_t history;    /* terminated instances each user already has */
};

/* Ready nodes and their cards straight into the tables; each user's money
 * through the ledger, as the daemon grants it. */
static int fill_txn(struct store *s, void *vctx)
{
    struct fill *f = vctx;
    sqlite3 *db = store_db(s);
    sqlite3_stmt *node = NULL, *liveness = NULL, *card = NULL, *user = NULL, *volume = NULL, *old = NULL;
    int rc = STORE_ERROR;
    if (sqlite3_prepare_v2(db, "INSERT INTO nodes (id, name, agent_url, secret, gpu_model, card_count, fabric, region,"
                               " health, created_at, updated_at) VALUES (?1, ?2, 'http://127.0.0.1:9',"
                               " printf('%064d', 0), 'MI450', 8, 'fabric-' || (?3 % 4), 'bench', 'up', ?4, ?4)",
                           -1, &node, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO node_liveness (node_id, last_seen_at) VALUES (?1, ?2)", -1, &liveness,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO node_cards (node_id, idx, model, memory_gb, healthy)"
                               " VALUES (?1, ?2, 'MI450', 192, 1)", -1, &card, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO users (id, email, created_at) VALUES (?1, ?1 || '@bench.test', ?2)", -1,
                           &user, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO volumes (id, user_id, name, size_gb, source, created_at)"
                               " VALUES ('vol_' || substr(?1, 5), ?1, 'shared', 100, '/srv/' || ?1, ?2)", -1, &volume,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO instances (id, user_id, name, gpu_model, card_count, image, volume_id,"
                               " desired, state, state_since, created_at, updated_at) VALUES (printf('ins_%s_%d',"
                               " substr(?1, 5), ?2), ?1, '', 'MI450', 8, 'rocm/pytorch:2.3-rocm6.2', 'vol_' ||"
                               " substr(?1, 5), 'terminated', 'terminated', ?3, ?3, ?3)", -1, &old,
                           NULL) != SQLITE_OK) {
        fprintf(stderr, "bench: prepare: %s\n", sqlite3_errmsg(db));
        goto done;
    }
    for (int64_t i = 0; i < f->nodes; i++) {
        char id[ID_MAX], name[32];
        snprintf(id, sizeof id, "node_%020" PRId64, i);
        snprintf(name, sizeof name, "bench-%06" PRId64, i);
        sqlite3_bind_text(node, 1, id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(node, 2, name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(node, 3, i);
        sqlite3_bind_int64(node, 4, T0);
        if (sqlite3_step(node) != SQLITE_DONE)
            goto fail;
        sqlite3_reset(node);
        sqlite3_bind_text(liveness, 1, id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(liveness, 2, T0);
        if (sqlite3_step(liveness) != SQLITE_DONE)
            goto fail;
        sqlite3_reset(liveness);
        for (int k = 0; k < 8; k++) {
            sqlite3_bind_text(card, 1, id, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int(card, 2, k);
            if (sqlite3_step(card) != SQLITE_DONE)
                goto fail;
            sqlite3_reset(card);
        }
    }
    for (int u = 0; u < f->users; u++) {
        char uid[ID_MAX];
        snprintf(uid, sizeof uid, "usr_%020d", u);
        sqlite3_bind_text(user, 1, uid, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(user, 2, T0);
        sqlite3_bind_text(volume, 1, uid, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(volume, 2, T0);
        if (sqlite3_step(user) != SQLITE_DONE || sqlite3_step(volume) != SQLITE_DONE)
            goto fail;
        sqlite3_reset(user);
        sqlite3_reset(volume);
        for (int64_t h = 0; h < f->history; h++) {
            sqlite3_bind_text(old, 1, uid, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(old, 2, h);
            sqlite3_bind_int64(old, 3, T0 - 1);
            if (sqlite3_step(old) != SQLITE_DONE)
                goto fail;
            sqlite3_reset(old);
        }
        /* A million yuan each: funds never refuse a claim here. */
        if ((rc = ledger_grant(s, uid, "admin", INT64_C(1000000) * MONEY_UNIT, 0, T0, "bench funds", NULL)) !=
            STORE_OK)
            goto done;
        rc = STORE_ERROR;
    }
    rc = STORE_OK;
    goto done;
fail:
    fprintf(stderr, "bench: insert: %s\n", sqlite3_errmsg(db));
done:
    sqlite3_finalize(node);
    sqlite3_finalize(liveness);
    sqlite3_finalize(card);
    sqlite3_finalize(user);
    sqlite3_finalize(volume);
    sqlite3_finalize(old);
    return rc;
}

struct worker {
    pthread_t thread;
    int first_user;     /* this thread's users are first_user + k * stride */
    int stride;         /* the number of threads */
    int users;          /* how many users there are in all */
    int64_t claims;     /* how many to make */
    int64_t cards;      /* per claim */
    double *latency;    /* seconds, one per claim */
    int64_t made;       /* claims that succeeded */
    int64_t refused;    /* claims refused (no capacity, quota, funds) */
};

struct claim {
    struct instance_create in;
    char id[ID_MAX];
    struct op_outcome o;
};

/* The connection the timed claims run on (the writer every thread's batch
 * goes to), once profiling is asked for: BENCH_PROFILE=1 times each of its
 * statements, and the pages it writes are counted either way. */
static _Atomic(sqlite3 *) writer_db;
static int profiling; /* set once the untimed claims are done */

static int claim_txn(struct store *s, void *vctx)
{
    struct claim *c = vctx;
    sqlite3 *expected = NULL;
    if (profiling && atomic_compare_exchange_strong(&writer_db, &expected, store_db(s))) {
        int cur, high;
        sqlite3_db_status(store_db(s), SQLITE_DBSTATUS_CACHE_WRITE, &cur, &high, 1);
        sqlite3_db_status(store_db(s), SQLITE_DBSTATUS_CACHE_MISS, &cur, &high, 1);
        if (getenv("BENCH_PROFILE"))
            sqlite3_trace_v2(store_db(s), SQLITE_TRACE_PROFILE, bench_profile_trace, NULL);
    }
    json_decref(c->o.extra);
    memset(&c->o, 0, sizeof c->o);
    return instance_create(s, &c->in, c->id, NULL, &c->o);
}

static void *work(void *arg)
{
    struct worker *w = arg;
    struct store *s = store_thread();
    if (!s)
        return NULL;
    char uid[ID_MAX];
    for (int64_t i = 0; i < w->claims; i++) {
        snprintf(uid, sizeof uid, "usr_%020d", (int)((w->first_user + i * w->stride) % w->users));
        struct claim c = {.in = {.user_id = uid, .name = "", .gpu_type = "MI450", .card_count = w->cards,
                                 .image = "rocm/pytorch:2.3-rocm6.2", .volume_id = NULL}};
        double t = bench_now();
        int rc = store_txn(s, claim_txn, &c);
        w->latency[i] = bench_now() - t;
        json_decref(c.o.extra);
        if (rc == STORE_OK)
            w->made++;
        else if (rc == REFUSED)
            w->refused++;
        else {
            fprintf(stderr, "bench: claim failed: %d\n", rc);
            break;
        }
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One run on a fresh database in dir; returns 0 if every check held. */
static int run(const char *dir, int64_t nodes, int64_t claims, int64_t cards, int64_t history, int64_t live, int threads,
               int keep)
{
    char db_path[1100];
    snprintf(db_path, sizeof db_path, "%s/claims-%d.db", dir, threads);
    unlink(db_path);
    char err[1024];
    struct store *s = store_open(db_path, err, sizeof err);
    if (!s || store_migrate(s, 0, err, sizeof err) < 0) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    /* Users hold a few instances each, as quotas keep them in the daemon. */
    int users = (claims + live) / 8 > threads ? (int)((claims + live) / 8) : threads;
    struct fill f = {nodes, users, history};
    if (store_txn(s, fill_txn, &f) != STORE_OK)
        return 1;
    bench_exec(s, "ANALYZE");
    store_set_path(db_path);

    struct worker w[THREADS_MAX];
    int64_t live_made = 0;
    if (live > 0) {
        double *untimed = calloc((size_t)live, sizeof *untimed);
        if (!untimed)
            return 1;
        w[0] = (struct worker){.first_user = 0, .stride = 1, .users = users, .claims = live, .cards = cards,
                               .latency = untimed};
        work(&w[0]);
        free(untimed);
        live_made = w[0].made;
        bench_exec(s, "UPDATE instances SET state = 'running', phase = '' WHERE state = 'pending'");
    }
    double *latency = calloc((size_t)claims, sizeof *latency);
    if (!latency)
        return 1;
    int64_t given = 0;
    for (int i = 0; i < threads; i++) {
        int64_t share = claims / threads + (i < claims % threads);
        w[i] = (struct worker){.first_user = i, .stride = threads, .users = users, .claims = share, .cards = cards, .latency = latency + given};
        given += share;
    }
    atomic_store(&writer_db, NULL);
    profiling = 1;
    double t0 = bench_now();
    for (int i = 0; i < threads; i++)
        pthread_create(&w[i].thread, NULL, work, &w[i]);
    for (int i = 0; i < threads; i++)
        pthread_join(w[i].thread, NULL);
    double wall = bench_now() - t0;
    profiling = 0;
    int pages = 0, missed = 0, high;
    if (atomic_load(&writer_db)) {
        sqlite3_db_status(atomic_load(&writer_db), SQLITE_DBSTATUS_CACHE_WRITE, &pages, &high, 0);
        sqlite3_db_status(atomic_load(&writer_db), SQLITE_DBSTATUS_CACHE_MISS, &missed, &high, 0);
        sqlite3_trace_v2(atomic_load(&writer_db), 0, NULL, NULL);
    }
    store_close_threads();

    int64_t made = 0, refused = 0;
    for (int i = 0; i < threads; i++)
        made += w[i].made, refused += w[i].refused;
    qsort(latency, (size_t)claims, sizeof *latency, cmp_double);
    double p50 = latency[claims / 2] * 1e3, p99 = latency[(claims * 99) / 100] * 1e3;
    free(latency);

    /* Every instance holds exactly its cards, and the claimed cards add up. */
    int64_t wrong = bench_int(s, "SELECT count(*) FROM instances i WHERE state <> 'terminated' AND card_count <>"
                               " (SELECT count(*) FROM node_cards c WHERE c.instance_id = i.id)");
    int64_t held = bench_int(s, "SELECT count(*) FROM node_cards WHERE instance_id IS NOT NULL");
    int64_t free_ok = bench_int(s, "SELECT count(*) FROM nodes n WHERE free_cards <> (SELECT count(*) FROM node_cards c"
                                 " WHERE c.node_id = n.id AND c.healthy = 1 AND c.instance_id IS NULL)");
    FILE *sink = fopen("/dev/null", "w");
    int breaches = ledger_verify(s, sink ? (void *)sink : (void *)stderr);
    if (sink)
        fclose(sink);
    store_close(s);
    int ok = live_made == live && made + refused == claims && wrong == 0 && held == (made + live_made) * cards &&
             free_ok == 0 && breaches == 0;
    printf("%6" PRId64 " nodes  %2d threads  %6" PRId64 " claims of %" PRId64 " card%s: %7.0f claims/s"
           "  latency p50 %6.2f ms  p99 %6.2f ms  %5.1f pages written, %5.1f read each  (%" PRId64 " refused, %" PRId64
           " live before)  checks %s\n",
           nodes, threads, made, cards, cards == 1 ? "" : "s", (double)made / wall, p50, p99,
           made ? (double)pages / (double)made : 0.0, made ? (double)missed / (double)made : 0.0, refused, live_made, ok ? "ok" : "FAILED");
    if (getenv("BENCH_PROFILE"))
        bench_profile_print();
    if (!ok)
        fprintf(stderr, "bench: made %" PRId64 " refused %" PRId64 " wrong %" PRId64 " held %" PRId64
                        " bad free counts %" PRId64 " ledger breaches %d\n",
                made, refused, wrong, held, free_ok, breaches);
    if (!keep)
        bench_remove_db(db_path);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    int64_t nodes = 100, claims = 0, cards = 1, history = 0, live = 0;
    const char *threads_arg = "1,4,16", *dir_arg = NULL;
    int keep = 0;
    static const struct option opts[] = {
        {"nodes", required_argument, NULL, 'n'}, {"claims", required_argument, NULL, 'c'},
        {"cards", required_argument, NULL, 'k'}, {"threads", required_argument, NULL, 't'},
        {"dir", required_argument, NULL, 'd'},   {"keep", no_argument, NULL, 'K'},
        {"history", required_argument, NULL, 'h'}, {"live", required_argument, NULL, 'l'},
        {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'n': nodes = strtoll(optarg, NULL, 10); break;
        case 'c': claims = strtoll(optarg, NULL, 10); break;
        case 'k': cards = strtoll(optarg, NULL, 10); break;
        case 't': threads_arg = optarg; break;
        case 'd': dir_arg = optarg; break;
        case 'K': keep = 1; break;
        case 'h': history = strtoll(optarg, NULL, 10); break;
        case 'l': live = strtoll(optarg, NULL, 10); break;
        default:
            fprintf(stderr, "usage: %s [--nodes N] [--claims M] [--cards 1..8] [--threads 1,8,...] [--dir DIR]"
                            " [--history H] [--live L] [--keep]\n", argv[0]);
            return 2;
        }
    }
    /* Default: fill three quarters of the fleet, at most 20 000 claims. */
    if (claims == 0)
        claims = nodes * 8 * 3 / 4 / (cards > 0 ? cards : 1) < 20000 ? nodes * 8 * 3 / 4 / (cards > 0 ? cards : 1)
                                                                     : 20000;
    if (nodes < 1 || history < 0 || live < 0 || cards < 1 || cards > 8 || claims < 1 ||
        (claims + live) * cards > nodes * 8) {
        fprintf(stderr, "bench: need --nodes >= 1, --cards 1..8 and (claims + live) x cards within the fleet's cards\n");
        return 2;
    }
    int counts[THREADS_MAX], ncounts = 0;
    for (const char *p = threads_arg; *p && ncounts < THREADS_MAX;) {
        char *end;
        long t = strtol(p, &end, 10);
        if (end == p || t < 1 || t > THREADS_MAX) {
            fprintf(stderr, "bench: --threads is a comma-separated list of 1..%d\n", THREADS_MAX);
            return 2;
        }
        counts[ncounts++] = (int)t;
        p = *end == ',' ? end + 1 : end;
    }

    char dir[1024], quota[] = "default_max_cards=100000";
    char *overrides[] = {quota};
    if (bench_workdir(dir_arg, dir, sizeof dir) < 0 || bench_daemon_config(dir, overrides, 1) < 0)
        return 1;
    printf("claims bench: instance_create() through store_txn(), synchronous=FULL, directory %s\n", dir);
    int failed = 0;
    for (int i = 0; i < ncounts; i++)
        failed |= run(dir, nodes, claims, cards, history, live, counts[i], keep);
    if (!keep)
        bench_remove_workdir(dir);
    return failed;
}
