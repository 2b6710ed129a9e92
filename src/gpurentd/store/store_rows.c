/* store_rows.c: store_rows(?), a table-valued function through which one
 * statement reads an array held in C, so that a batch write inserts or
 * updates thousands of rows in one statement instead of one statement a row
 * (issue 15: a statement's own start, its cursors and the AUTOINCREMENT
 * counter it reads and writes back cost more than the row it writes).
 *
 * The array is bound with sqlite3_bind_pointer under a type name of its own,
 * so SQL text cannot make one up: a statement that names store_rows without
 * such a binding reads no rows. */
#include "store/store_sql.h"

#include <stdint.h>
#include <string.h>

#define POINTER_TYPE "gpurent_store_rows"
#define SOURCE_COLUMN STORE_ROWS_COLUMNS /* the hidden argument, after c0 … c9 */

struct rows_cursor {
    sqlite3_vtab_cursor base;
    const struct store_rows *rows; /* NULL: no array bound, no rows */
    size_t at;
};

static int rows_connect(sqlite3 *db, void *aux, int argc, const char *const *argv, sqlite3_vtab **out, char **err)
{
    int rc = sqlite3_declare_vtab(db, "CREATE TABLE x(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, source HIDDEN)");
    if (rc != SQLITE_OK)
        return rc;
    /* Only statements the store prepares may use it, not triggers or views. */
    sqlite3_vtab_config(db, SQLITE_VTAB_DIRECTONLY);
    sqlite3_vtab *t = sqlite3_malloc(sizeof *t);
    if (!t)
        return SQLITE_NOMEM;
    memset(t, 0, sizeof *t);
    *out = t;
    return SQLITE_OK;
}

static int rows_disconnect(sqlite3_vtab *t)
{
    sqlite3_free(t);
    return SQLITE_OK;
}

static int rows_open(sqlite3_vtab *t, sqlite3_vtab_cursor **out)
{
    struct rows_cursor *c = sqlite3_malloc(sizeof *c);
    if (!c)
        return SQLITE_NOMEM;
    memset(c, 0, sizeof *c);
    *out = &c->base;
    return SQLITE_OK;
}

static int rows_close(sqlite3_vtab_cursor *c)
{
    sqlite3_free(c);
    return SQLITE_OK;
}

/* A plan must have the array as its argument: one where the argument is
 * not yet known is refused, so that the planner never picks a plan that
 * reads nothing. Named without an argument, the table is empty. */
static int rows_best_index(sqlite3_vtab *t, sqlite3_index_info *info)
{
    int has_source = 0;
    for (int i = 0; i < info->nConstraint; i++) {
        const struct sqlite3_index_constraint *k = &info->aConstraint[i];
        if (k->iColumn != SOURCE_COLUMN || k->op != SQLITE_INDEX_CONSTRAINT_EQ)
            continue;
        has_source = 1;
        if (k->usable) {
            info->aConstraintUsage[i].argvIndex = 1;
            info->aConstraintUsage[i].omit = 1;
            info->estimatedCost = 1000;
            info->estimatedRows = 1000;
            info->idxNum = 1;
            return SQLITE_OK;
        }
    }
    if (has_source)
        return SQLITE_CONSTRAINT;
    info->estimatedCost = 1;
    info->estimatedRows = 1;
    info->idxNum = 0;
    return SQLITE_OK;
}

static int rows_filter(sqlite3_vtab_cursor *vc, int idx_num, const char *idx_str, int argc, sqlite3_value **argv)
{
    struct rows_cursor *c = (struct rows_cursor *)vc;
    c->rows = idx_num == 1 && argc == 1 ? sqlite3_value_pointer(argv[0], POINTER_TYPE) : NULL;
    c->at = 0;
    return SQLITE_OK;
}

static int rows_next(sqlite3_vtab_cursor *vc)
{
    ((struct rows_cursor *)vc)->at++;
    return SQLITE_OK;
}

static int rows_eof(sqlite3_vtab_cursor *vc)
{
    const struct rows_cursor *c = (const struct rows_cursor *)vc;
    return !c->rows || c->at >= c->rows->n;
}

static int rows_column(sqlite3_vtab_cursor *vc, sqlite3_context *ctx, int col)
{
    const struct rows_cursor *c = (const struct rows_cursor *)vc;
    if (col == SOURCE_COLUMN)
        sqlite3_result_null(ctx);
    else
        c->rows->column(c->rows->array, c->at, col, ctx);
    return SQLITE_OK;
}

static int rows_rowid(sqlite3_vtab_cursor *vc, sqlite3_int64 *rowid)
{
    *rowid = (sqlite3_int64)((const struct rows_cursor *)vc)->at + 1;
    return SQLITE_OK;
}

/* Eponymous only (no xCreate): it exists on every connection under its
 * name and cannot be made into a table of the schema. */
static const sqlite3_module rows_module = {
    .iVersion = 0,
    .xConnect = rows_connect,
    .xBestIndex = rows_best_index,
    .xDisconnect = rows_disconnect,
    .xOpen = rows_open,
    .xClose = rows_close,
    .xFilter = rows_filter,
    .xNext = rows_next,
    .xEof = rows_eof,
    .xColumn = rows_column,
    .xRowid = rows_rowid,
};

static void id_column(const void *array, size_t i, int col, sqlite3_context *ctx)
{
    if (col == 0)
        sqlite3_result_text(ctx, (const char *)array + i * ID_MAX, -1, SQLITE_STATIC);
    else
        sqlite3_result_null(ctx);
}

struct store_rows store_rows_of_ids(const char (*ids)[ID_MAX], size_t n)
{
    return (struct store_rows){ids, n, id_column};
}

int store_rows_register(sqlite3 *db)
{
    return sqlite3_create_module(db, "store_rows", &rows_module, NULL);
}

void store_bind_rows(sqlite3_stmt *st, int param, const struct store_rows *rows)
{
    /* SQLite hands the pointer back as given and never writes through it. */
    sqlite3_bind_pointer(st, param, (void *)(uintptr_t)rows, POINTER_TYPE, NULL);
}
