/* store_sql.h: what the store_*.c files share and nothing outside store/
 * may include (make check-layers says so): SQLite itself, a connection's
 * handle and statement cache, and the helpers that step statements and read
 * rows. Everything above the store sees only store.h. */
#ifndef GPURENT_STORE_SQL_H
#define GPURENT_STORE_SQL_H

#include <sqlite3.h>

#include "store/store.h"

/* Volumes have storage to bill only once some storage price above 0 was
 * set (migration 0020): until then billing reads no volume at all. */
#define STORE_STORAGE_PRICED "EXISTS (SELECT 1 FROM storage_prices WHERE gb_month > 0)"

/* The connection's handle, for the store_*.c files only. */
sqlite3 *store_db(struct store *s);
/* A prepared statement for sql from this connection's cache, reset and with
 * its bindings cleared. sql must be a string with static storage: the cache
 * is keyed by its address. NULL on error (logged). */
sqlite3_stmt *store_stmt(struct store *s, const char *sql);
/* store_rows.c: an array held in C that one statement reads as a table,
 * `store_rows(?N)` with columns c0 … c9: column() sets ctx to column col
 * (0 … STORE_ROWS_COLUMNS - 1) of row i of array. */
#define STORE_ROWS_COLUMNS 10
struct store_rows {
    const void *array;
    size_t n;
    void (*column)(const void *array, size_t i, int col, sqlite3_context *ctx);
};
/* A list of ids as rows of one column, c0. */
struct store_rows store_rows_of_ids(const char (*ids)[ID_MAX], size_t n);
/* Makes store_rows known to a connection (at open). */
int store_rows_register(sqlite3 *db);
/* Binds rows to parameter param of st; rows must outlive the statement's
 * steps. */
void store_bind_rows(sqlite3_stmt *st, int param, const struct store_rows *rows);
/* Copies a text column into dst (n bytes), "" for NULL, cut to fit. */
void store_column_text(char *dst, size_t n, sqlite3_stmt *st, int col);
/* Steps a statement that writes, then resets it: a store_rc. */
int store_step_write(struct store *s, sqlite3_stmt *st, const char *what);
/* The same, but STORE_NOT_FOUND when it changed no row. */
int store_step_change(struct store *s, sqlite3_stmt *st, const char *what);
/* Steps st once: reads the row into out, or STORE_NOT_FOUND if there is none. */
int store_read_one(struct store *s, sqlite3_stmt *st, void *out, void (*read)(sqlite3_stmt *st, void *row),
                   const char *what);
/* Reads up to max rows into out (size-byte elements); *n gets the count. */
int store_read_rows(struct store *s, sqlite3_stmt *st, void *out, size_t size, size_t max, size_t *n,
                    void (*read)(sqlite3_stmt *st, void *row), const char *what);
/* Steps st to its end, reading each row with read() into a malloc'd array
 * of size-byte elements (*out, caller frees; *n rows). */
int store_collect(struct store *s, sqlite3_stmt *st, size_t size, void **out, size_t *n,
                  void (*read)(sqlite3_stmt *st, void *row), const char *what);
/* store_users.c: the users columns every read selects, in order, and a
 * read() for them (struct user). */
#define USER_COLUMNS                                                                                           \
    "id, email, password_hash, role, status, invite_code, created_at, coalesce(email_key, ''), email_display," \
    " coalesce(email_verified_at, 0), coalesce(trial_at, 0), signup_address"
void store_read_user(sqlite3_stmt *st, void *row);
/* store_money.c and store_storage.c: the columns billing reads, in order,
 * and a read() for each (struct grant, struct billable, struct user_funds,
 * struct storage_billable); store_batch.c reads them for many users at once. */
#define GRANT_COLUMNS \
    "id, user_id, source, amount, remaining, coalesce(expires_at, 0), coalesce(voided_at, 0), created_at"
/* An open interval on a node that has missed a heartbeat is known to have
 * run only until that node's last good one: billing stops there until the
 * node answers again (its missed_beats back to 0). Whether any quiet node
 * holds a placement is asked once per statement (an uncorrelated subquery,
 * through the node_liveness_quiet index of 0034 and instance_nodes by node):
 * nearly always none does, and then no interval pays for looking up its
 * nodes. Offline and removed nodes stay quiet for good, but their instances
 * were moved or ended and hold nothing there, so a fleet with dead nodes in
 * it keeps the short way. */
#define BILLABLE_COLUMNS                                                                                          \
    "r.id, r.instance_id, r.user_id, r.gpu_model, r.card_count, r.started_at, coalesce(r.ended_at, 0), r.billed," \
    " CASE WHEN r.ended_at IS NULL AND EXISTS (SELECT 1 FROM node_liveness q WHERE q.missed_beats > 0"            \
    "   AND EXISTS (SELECT 1 FROM instance_nodes h WHERE h.node_id = q.node_id))"                                 \
    "   THEN coalesce((SELECT min(coalesce(l.last_seen_at, 0)) FROM instance_nodes p JOIN node_liveness l"        \
    "   ON l.node_id = p.node_id WHERE p.instance_id = r.instance_id AND l.missed_beats > 0), -1) ELSE -1 END"
#define STORAGE_COLUMNS \
    "id, user_id, name, region, size_gb, created_at, coalesce(deleted_at, 0), storage_billed, storage_billed_to"
/* Asserts that legs make a transaction: at least two, summing to zero. */
void store_legs_balanced(const struct ledger_leg *legs, size_t n);
/* A ledger transaction's row (*id: its id) and one of its postings, as
 * store_ledger_post inserts them; balances are the caller's to move. */
int store_ledger_insert(struct store *s, const struct ledger_entry *e, int64_t now, int64_t *id);
int store_posting_insert(struct store *s, int64_t txn, const struct ledger_leg *leg);
void store_read_grant(sqlite3_stmt *st, void *row);
void store_read_billable(sqlite3_stmt *st, void *row);
void store_read_user_funds(sqlite3_stmt *st, void *row);
void store_read_storage_billable(sqlite3_stmt *st, void *row);
/* A read() for store_collect: column 0 as an id (char[ID_MAX]). */
void store_read_id(sqlite3_stmt *st, void *row);
/* n ids as one JSON array, for statements that read a set of rows through
 * json_each(?); malloc'd text, NULL when out of memory. */
char *store_ids_json(const char (*ids)[ID_MAX], size_t n);
/* store_nodes.c: steps st, an UPDATE of node id that changes a row only
 * when its values differ (written only when facts change): STORE_OK when
 * it wrote or the node already had them, STORE_NOT_FOUND when there is no
 * such node. */
int store_node_update_if_changed(struct store *s, sqlite3_stmt *st, const char *id, const char *what);
/* The instance columns of 0018 (store_jobs.c), selected after the others,
 * and their reader from column `first`. */
#define STORE_JOB_COLUMNS                                                                            \
    "restart_policy, coalesce(max_runtime_minutes, 0), restart_count, restart_backoff_s, exit_code," \
    " coalesce(run_started_at, 0), coalesce(runtime_warned_at, 0), coalesce(ranks_exited_at, 0)"
#define STORE_JOB_NCOLS 8 /* columns in STORE_JOB_COLUMNS */
void store_read_job_columns(sqlite3_stmt *st, int first, struct instance *in);
/* Maps an SQLite result code to a store_rc, logging unexpected ones. */
int store_rc_from_sqlite(struct store *s, int rc, const char *what);
/* Runs sql, with arg bound to its one parameter, and returns the integer in
 * its one row's first column, or a negative store_rc (what names it). */
int64_t store_int64_by_text(struct store *s, const char *sql, const char *arg, const char *what);

/* Whether node alias a belongs to pool p (an SQL text expression, 0024):
 * a node of a reservation-required type is always in the reserved pool, as
 * such a type has no on-demand capacity whatever its nodes' pool says. */
#define STORE_POOL_IS(a, p)                                                                                    \
    "(CASE WHEN " a ".pool = 'reserved' OR EXISTS (SELECT 1 FROM gpu_types rt WHERE rt.code = " a ".gpu_model" \
    " AND rt.reservation_required = 1) THEN 'reserved' ELSE 'on_demand' END) = " p
/* A node of model m (SQL text) whose free cards an on-demand create may
 * take now: up, active, answering, in the on-demand pool. The node is "n". */
#define STORE_NODE_TAKES_ON_DEMAND(m)                                                                      \
    "n.gpu_model = " m " AND n.removed_at IS NULL AND n.health = 'up' AND n.admin_state = 'active'"       \
    " AND n.unreachable_since IS NULL AND " STORE_POOL_IS("n", "'on_demand'")
#endif
