/* migrate.c: applies the numbered migrations compiled into the binary, all
 * that are due in one transaction, and records every applied version: an
 * upgrade that fails at one leaves the database as it was, at the version
 * the release before can still run, rather than half-way between. */
#include "embedded.h"
#include "gpurent/clock.h"
#include "gpurent/log.h"
#include "store/store_sql.h"

#include <stdio.h>
#include <string.h>

static const char SQL_CREATE_VERSIONS[] = "CREATE TABLE IF NOT EXISTS schema_migrations ("
                                          " version INTEGER PRIMARY KEY," /* NNNN of migrations/NNNN_name.sql */
                                          " name TEXT NOT NULL,"          /* the file name without .sql */
                                          " applied_at INTEGER NOT NULL"  /* epoch seconds */
                                          ") STRICT";

int store_latest_version(void)
{
    int latest = 0;
    for (const struct embedded_migration *m = embedded_migrations; m->name; m++)
        if (m->version > latest)
            latest = m->version;
    return latest;
}

int store_schema_version(struct store *s)
{
    sqlite3_stmt *st = NULL;
    int version = -1;
    if (sqlite3_prepare_v2(store_db(s), "SELECT coalesce(max(version), 0) FROM schema_migrations", -1, &st, NULL) !=
        SQLITE_OK) {
        /* No table yet: a new database. */
        sqlite3_finalize(st);
        return 0;
    }
    if (sqlite3_step(st) == SQLITE_ROW)
        version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return version;
}

struct apply_ctx {
    const struct embedded_migration *m; /* the migration being applied */
    int target;                         /* the last version to apply */
    char *err;                          /* where to say why it failed */
    size_t errlen;
};

static int apply_one(struct store *s, struct apply_ctx *ctx)
{
    sqlite3 *db = store_db(s);
    char *msg = NULL;
    int rc = sqlite3_exec(db, ctx->m->sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) {
        snprintf(ctx->err, ctx->errlen, "migration %s failed: %s", ctx->m->name, msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return (rc & 0xff) == SQLITE_BUSY ? STORE_BUSY : STORE_ERROR;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)", -1, &st,
                           NULL) != SQLITE_OK) {
        snprintf(ctx->err, ctx->errlen, "cannot record migration: %s", sqlite3_errmsg(db));
        return STORE_ERROR;
    }
    sqlite3_bind_int(st, 1, ctx->m->version);
    sqlite3_bind_text(st, 2, ctx->m->name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, clock_now());
    rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        snprintf(ctx->err, ctx->errlen, "cannot record migration: %s", sqlite3_errmsg(db));
        return STORE_ERROR;
    }
    return STORE_OK;
}

/* Every migration due, in order; the version is read again inside the
 * transaction, as another process may have applied some since. */
static int apply_due(struct store *s, void *vctx)
{
    struct apply_ctx *ctx = vctx;
    int current = store_schema_version(s);
    for (const struct embedded_migration *m = embedded_migrations; m->name; m++) {
        if (m->version <= current || m->version > ctx->target)
            continue;
        ctx->m = m;
        int rc = apply_one(s, ctx);
        if (rc != STORE_OK)
            return rc;
    }
    return STORE_OK;
}

int store_migrate(struct store *s, int target, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(store_db(s), SQL_CREATE_VERSIONS, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "cannot create schema_migrations: %s", msg ? msg : "?");
        sqlite3_free(msg);
        return -1;
    }
    int latest = store_latest_version();
    int current = store_schema_version(s);
    if (current < 0) {
        snprintf(err, errlen, "cannot read the schema version");
        return -1;
    }
    if (current > latest) {
        snprintf(err, errlen,
                 "the database is at schema version %d but this gpurentd knows only up to %d: "
                 "it was written by a newer release; run that release or restore a backup",
                 current, latest);
        return -1;
    }
    if (target <= 0 || target > latest)
        target = latest;
    if (current >= target)
        return 0;
    struct apply_ctx ctx = {.target = target, .err = err, .errlen = errlen};
    err[0] = '\0';
    if (store_txn(s, apply_due, &ctx) < 0) {
        if (!err[0])
            snprintf(err, errlen, "migrations from version %d failed (database busy?)", current + 1);
        /* Said here: whoever prints err may not say that nothing changed. */
        snprintf(err + strlen(err), errlen - strlen(err), "; nothing was applied: the database is still at version %d",
                 current);
        return -1;
    }
    for (const struct embedded_migration *m = embedded_migrations; m->name; m++)
        if (m->version > current && m->version <= target)
            log_info("store: applied migration %s", m->name);
    return 0;
}
