/* store_fixtures.h: what the store and ledger unit tests share. Header-only
 * (static inline), because the Makefile builds each tests/unit/test_*.c
 * alone: a database migrated once per program (the template) and copied
 * afresh for every test, the daemon's default configuration in
 * daemon_config, and the rows tests need, made through store_* calls.
 *
 * Raw SQL appears only where no store call says what a test must see (the
 * postings of one transaction, a capacity row) or where a test corrupts the
 * database on purpose; such helpers are named fx_sql_*. Include after
 * cmocka.h. */
#ifndef GPURENT_TESTS_STORE_FIXTURES_H
#define GPURENT_TESTS_STORE_FIXTURES_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpurentd.h"
#include "store/store_sql.h" /* tests of the store read raw rows to check its work */

struct fx_state {
    char dir[64];                /* the program's temporary folder */
    char template_path[128];     /* migrated once */
    char path[160];              /* this test's copy */
    int seq;                     /* tests run so far, for file names */
    struct store *s;             /* this test's connection */
    struct daemon_conf conf;     /* defaults; daemon_config points here */
};
static struct fx_state fx;

static inline int fx_copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int ok = in >= 0 && out >= 0;
    char buf[65536];
    ssize_t n;
    while (ok && (n = read(in, buf, sizeof buf)) > 0)
        ok = write(out, buf, (size_t)n) == n;
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return ok ? 0 : -1;
}

static inline void fx_unlink_db(const char *path)
{
    static const char *const suffixes[] = {"", "-wal", "-shm", ".partial"};
    char p[256];
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
        unlink(p);
    }
}

/* Group set-up: the configuration's defaults and the migrated template. */
static inline int fx_group_setup(void **state)
{
    (void)state;
    char err[512];
    log_set_level(LOG_LVL_WARN);
    if (daemon_read_config(&fx.conf, NULL, NULL, 0, err, sizeof err) != 0) {
        fprintf(stderr, "config: %s\n", err);
        return -1;
    }
    daemon_config = &fx.conf;
    snprintf(fx.dir, sizeof fx.dir, "/tmp/gpurent-unit-XXXXXX");
    if (!mkdtemp(fx.dir))
        return -1;
    snprintf(fx.template_path, sizeof fx.template_path, "%s/template.db", fx.dir);
    struct store *s = store_open(fx.template_path, err, sizeof err);
    if (!s) {
        fprintf(stderr, "open: %s\n", err);
        return -1;
    }
    int rc = store_migrate(s, 0, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "migrate: %s\n", err);
    store_close(s); /* the last connection: the WAL is folded into the file */
    return rc;
}

static inline int fx_group_teardown(void **state)
{
    (void)state;
    fx_unlink_db(fx.template_path);
    rmdir(fx.dir);
    return 0;
}

/* Per test: a fresh copy of the template. Synchronous off, for speed only:
 * no test here crashes the machine. */
static inline int fx_setup(void **state)
{
    (void)state;
    snprintf(fx.path, sizeof fx.path, "%s/t%d.db", fx.dir, ++fx.seq);
    if (fx_copy_file(fx.template_path, fx.path) != 0)
        return -1;
    char err[512];
    fx.s = store_open(fx.path, err, sizeof err);
    if (!fx.s) {
        fprintf(stderr, "open: %s\n", err);
        return -1;
    }
    return sqlite3_exec(store_db(fx.s), "PRAGMA synchronous=OFF", NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

static inline int fx_teardown(void **state)
{
    (void)state;
    store_close(fx.s);
    fx.s = NULL;
    fx_unlink_db(fx.path);
    /* Limits a test lowered come back for the next one. */
    char err[512];
    return daemon_read_config(&fx.conf, NULL, NULL, 0, err, sizeof err) == 0 ? 0 : -1;
}

#define fx_test(f) cmocka_unit_test_setup_teardown(f, fx_setup, fx_teardown)

/* ---------------------------------------------------------------- raw reads */

/* The first column of the first row of sql, with ?1 bound to arg (text,
 * may be NULL); -999 if there is no row or the SQL fails. */
static inline int64_t fx_sql_int(struct store *s, const char *sql, const char *arg)
{
    sqlite3_stmt *st = NULL;
    int64_t v = -999;
    if (sqlite3_prepare_v2(store_db(s), sql, -1, &st, NULL) == SQLITE_OK) {
        if (arg)
            sqlite3_bind_text(st, 1, arg, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
            v = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    return v;
}

/* The same with ?1 bound to an integer. */
static inline int64_t fx_sql_int_n(struct store *s, const char *sql, int64_t arg)
{
    sqlite3_stmt *st = NULL;
    int64_t v = -999;
    if (sqlite3_prepare_v2(store_db(s), sql, -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, arg);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
            v = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    return v;
}

/* The same for a text column, into out ("" when none). */
static inline void fx_sql_text(struct store *s, const char *sql, const char *arg, char *out, size_t n)
{
    sqlite3_stmt *st = NULL;
    out[0] = '\0';
    if (sqlite3_prepare_v2(store_db(s), sql, -1, &st, NULL) == SQLITE_OK) {
        if (arg)
            sqlite3_bind_text(st, 1, arg, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
            snprintf(out, n, "%s", (const char *)sqlite3_column_text(st, 0));
    }
    sqlite3_finalize(st);
}

/* Runs sql as it is (corrupting a database on purpose). */
static inline void fx_sql_exec(struct store *s, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(store_db(s), sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("%s: %s", sql, msg ? msg : "?");
    sqlite3_free(msg);
}

/* The newest ledger transaction's id (0 if none). */
static inline int64_t fx_last_txn(struct store *s)
{
    return fx_sql_int(s, "SELECT coalesce(max(id), 0) FROM ledger_transactions", NULL);
}

/* ---------------------------------------------------------------- rows through the store */

static inline void fx_user(struct store *s, const char *email, enum user_role role, char id[ID_MAX])
{
    struct user u = {.role = role, .active = 1, .created_at = 100};
    assert_int_equal(id_new("usr", u.id), 0);
    snprintf(u.email, sizeof u.email, "%s", email);
    assert_int_equal(store_user_insert(s, &u), STORE_OK);
    memcpy(id, u.id, ID_MAX);
}

static inline void fx_gpu_type(struct store *s, const char *code, const char *vendor, const char *stack)
{
    struct gpu_type t = {.memory_gb = 64};
    snprintf(t.code, sizeof t.code, "%s", code);
    snprintf(t.vendor, sizeof t.vendor, "%s", vendor);
    snprintf(t.memory_type, sizeof t.memory_type, "HBM3");
    snprintf(t.stack, sizeof t.stack, "%s", stack);
    snprintf(t.features, sizeof t.features, "[]");
    snprintf(t.description, sizeof t.description, "test type %s", code);
    int created = -1;
    assert_int_equal(store_gpu_type_put(s, &t, 50, &created), STORE_OK);
}

/* A type "TST" costing 1000 micro a card-second (3.60 a card-hour) from 0:
 * costs in the tests read at a glance. */
#define FX_TST "TST"
#define FX_TST_PER_SECOND 1000
static inline void fx_tst_type(struct store *s)
{
    fx_gpu_type(s, FX_TST, "AMD", "ROCm");
    assert_int_equal(store_price_insert(s, FX_TST, 0, 3600 * FX_TST_PER_SECOND, 50), STORE_OK);
}

static inline void fx_node_init(struct node *n, const char *name, const char *model, int64_t cards,
                                const char *fabric, int64_t created_at)
{
    memset(n, 0, sizeof *n);
    assert_int_equal(id_new("node", n->id), 0);
    snprintf(n->name, sizeof n->name, "%s", name);
    snprintf(n->agent_url, sizeof n->agent_url, "http://10.0.0.1:8081/%s", name);
    memset(n->secret, 'a', 64);
    snprintf(n->gpu_model, sizeof n->gpu_model, "%s", model);
    n->card_count = cards;
    snprintf(n->fabric, sizeof n->fabric, "%s", fabric);
    snprintf(n->region, sizeof n->region, "test-1");
    snprintf(n->labels, sizeof n->labels, "{}");
    n->created_at = created_at;
}

/* A registered node (pending: never reached). */
static inline void fx_node(struct store *s, const char *name, const char *model, int64_t cards, const char *fabric,
                           int64_t created_at, char id[ID_MAX])
{
    struct node n;
    fx_node_init(&n, name, model, cards, fabric, created_at);
    assert_int_equal(store_node_insert(s, &n), STORE_OK);
    memcpy(id, n.id, ID_MAX);
}

/* Facts text that changes with what it describes, as the heartbeat's
 * canonical facts do. */
static inline void fx_facts(char *out, size_t n, const char *model, size_t cards, uint64_t unhealthy)
{
    snprintf(out, n, "{\"model\":\"%s\",\"cards\":%zu,\"unhealthy\":%llu}", model, cards,
             (unsigned long long)unhealthy);
}

/* A good heartbeat with accepted facts: cards 0..n-1 of model, those in
 * the unhealthy mask failed. */
static inline int fx_beat(struct store *s, const char *node_id, int64_t now, const char *model, size_t n_cards,
                          uint64_t unhealthy)
{
    struct node_card cards[64];
    memset(cards, 0, sizeof cards);
    for (size_t i = 0; i < n_cards && i < 64; i++) {
        cards[i].idx = (int64_t)i;
        snprintf(cards[i].model, sizeof cards[i].model, "%s", model);
        cards[i].memory_gb = 64;
        cards[i].healthy = !(unhealthy & ((uint64_t)1 << i));
        if (!cards[i].healthy)
            snprintf(cards[i].health_reason, sizeof cards[i].health_reason, "ECC errors");
    }
    char facts[256];
    fx_facts(facts, sizeof facts, model, n_cards, unhealthy);
    return store_node_beat_ok(s, node_id, now, facts, 1, "", "drv-1", "stack-1", cards, n_cards, 0);
}

/* A registered node whose facts were accepted at `now`: ready. */
static inline void fx_ready_node(struct store *s, const char *name, const char *model, int64_t cards,
                                 const char *fabric, int64_t now, char id[ID_MAX])
{
    fx_node(s, name, model, cards, fabric, now, id);
    assert_int_equal(fx_beat(s, id, now, model, (size_t)cards, 0), STORE_OK);
}

/* The user's volume called name, made if missing. */
static inline void fx_volume(struct store *s, const char *user_id, const char *name, char id[ID_MAX])
{
    if (store_volume_id_by_name(s, user_id, name, id) == STORE_OK)
        return;
    struct volume v = {0};
    assert_int_equal(id_new("vol", v.id), 0);
    snprintf(v.user_id, sizeof v.user_id, "%s", user_id);
    snprintf(v.name, sizeof v.name, "%s", name);
    v.size_gb = 100;
    snprintf(v.source, sizeof v.source, "nfs://store/%s", v.id);
    v.created_at = 100;
    assert_int_equal(store_volume_insert(s, &v), STORE_OK);
    memcpy(id, v.id, ID_MAX);
}

/* An instance of user_id in `state` (on the user's "shared" volume). */
static inline void fx_instance(struct store *s, const char *user_id, const char *model, int64_t cards,
                               const char *state, int64_t now, struct instance *out)
{
    memset(out, 0, sizeof *out);
    assert_int_equal(id_new("ins", out->id), 0);
    snprintf(out->user_id, sizeof out->user_id, "%s", user_id);
    snprintf(out->name, sizeof out->name, "job");
    snprintf(out->gpu_model, sizeof out->gpu_model, "%s", model);
    out->card_count = cards;
    snprintf(out->image, sizeof out->image, "rocm/pytorch:2.3-rocm6.2");
    fx_volume(s, user_id, "shared", out->volume_id);
    snprintf(out->desired, sizeof out->desired, "%s", strcmp(state, "stopped") == 0 ? "stopped" : "running");
    snprintf(out->state, sizeof out->state, "%s", state);
    out->state_since = out->created_at = out->updated_at = now;
    assert_int_equal(store_instance_insert(s, out), STORE_OK);
}

/* A running instance with its interval open from started_at; *interval
 * gets the interval's id. */
static inline void fx_running(struct store *s, const char *user_id, const char *model, int64_t cards,
                              int64_t started_at, struct instance *in, int64_t *interval)
{
    fx_instance(s, user_id, model, cards, "running", started_at, in);
    assert_int_equal(store_interval_open(s, in, started_at), STORE_OK);
    struct billable b;
    assert_int_equal(store_interval_get_open(s, in->id, &b), STORE_OK);
    *interval = b.id;
}

/* Puts cards (mask) of node_id under the instance at rank; a store_rc. */
static inline int fx_claim(struct store *s, const char *instance_id, int64_t rank, const char *node_id, uint64_t mask)
{
    char wl[ID_MAX];
    assert_int_equal(id_new("wl", wl), 0);
    return store_instance_claim(s, instance_id, rank, node_id, wl, mask);
}

#endif
