/* store_storage.c: SQL for storage billing (migration 0020): storage prices
 * per GB-month (global or per region), each volume's billing state, and
 * the storage lines of a statement. */
#include "gpurent/tariff.h"
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_STORAGE_PRICES[] =
    "SELECT effective_at, gb_month FROM storage_prices WHERE region = ? ORDER BY effective_at";
static const char SQL_STORAGE_PRICE_INSERT[] =
    "INSERT INTO storage_prices (region, effective_at, gb_month, created_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (region, effective_at) DO UPDATE SET gb_month = excluded.gb_month, created_at = excluded.created_at";
static const char SQL_STORAGE_PRICE_HISTORY[] =
    "SELECT region, effective_at, gb_month, created_at FROM storage_prices WHERE (?1 IS NULL OR region = ?1)"
    " ORDER BY region, effective_at LIMIT ?2";
/* How far storage has been charged: of every volume for the global price
 * (it may apply to any), of the region's for a region's. */
static const char SQL_STORAGE_BILLED_UNTIL[] =
    "SELECT coalesce(max(storage_billed_to), 0) FROM volumes WHERE ?1 = '' OR region = ?1";
static const char SQL_STORAGE_BILLABLES[] = "SELECT " STORAGE_COLUMNS " FROM volumes WHERE user_id = ?"
                                            " AND storage_settled = 0 AND " STORE_STORAGE_PRICED
                                            " ORDER BY created_at, id";
static const char SQL_STORAGE_BILLABLES_ALL[] = "SELECT " STORAGE_COLUMNS " FROM volumes WHERE storage_settled = 0"
                                                " AND " STORE_STORAGE_PRICED " ORDER BY user_id, created_at, id";
static const char SQL_STORAGE_BILLED[] =
    "UPDATE volumes SET storage_billed = ?2, storage_billed_to = max(storage_billed_to, ?3), storage_settled = ?4"
    " WHERE id = ?1";
static const char SQL_REGION_KNOWN[] =
    "SELECT EXISTS (SELECT 1 FROM nodes WHERE region = ?1 AND removed_at IS NULL)"
    " OR EXISTS (SELECT 1 FROM storage_prices WHERE region = ?1)";
/* Storage charged in [from, to) per volume, split into credit and cash
 * (sum(-x), not -sum(x): sum() fails on overflow). */
static const char SQL_STORAGE_STATEMENT[] =
    "SELECT t.volume_id, v.name, v.region, v.size_gb, sum(-p.amount), coalesce(sum(-p.amount) FILTER"
    " (WHERE a.kind = 'grant'), 0), coalesce(sum(-p.amount) FILTER (WHERE a.kind = 'cash'), 0)"
    " FROM ledger_transactions t JOIN ledger_postings p ON p.transaction_id = t.id"
    " JOIN ledger_accounts a ON a.id = p.account_id JOIN volumes v ON v.id = t.volume_id"
    " WHERE t.user_id = ?1 AND t.kind = 'storage' AND t.at >= ?2 AND t.at < ?3 AND a.kind IN ('cash', 'grant')"
    " GROUP BY t.volume_id ORDER BY v.created_at, t.volume_id LIMIT ?4";

static void read_point(sqlite3_stmt *st, void *row)
{
    struct price_point *p = row;
    p->effective_at = sqlite3_column_int64(st, 0);
    p->card_hour = sqlite3_column_int64(st, 1);
}

int store_storage_prices(struct store *s, const char *region, struct price_point **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_STORAGE_PRICES);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, region, -1, SQLITE_STATIC);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_point, "storage prices");
    *out = rows;
    return rc;
}

int store_storage_price_insert(struct store *s, const char *region, int64_t effective_at, int64_t gb_month,
                               int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_STORAGE_PRICE_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, region, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, effective_at);
    sqlite3_bind_int64(st, 3, gb_month);
    sqlite3_bind_int64(st, 4, now);
    return store_step_write(s, st, "insert storage price");
}

static void read_storage_price_row(sqlite3_stmt *st, void *row)
{
    struct storage_price_row *p = row;
    store_column_text(p->region, sizeof p->region, st, 0);
    p->effective_at = sqlite3_column_int64(st, 1);
    p->gb_month = sqlite3_column_int64(st, 2);
    p->created_at = sqlite3_column_int64(st, 3);
}

int store_storage_price_history(struct store *s, const char *region, struct storage_price_row *out, size_t max,
                                size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_STORAGE_PRICE_HISTORY);
    if (!st)
        return STORE_ERROR;
    if (region)
        sqlite3_bind_text(st, 1, region, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_storage_price_row, "storage price history");
}

int64_t store_storage_billed_until(struct store *s, const char *region)
{
    return store_int64_by_text(s, SQL_STORAGE_BILLED_UNTIL, region, "storage billed until");
}

void store_read_storage_billable(sqlite3_stmt *st, void *row)
{
    struct storage_billable *v = row;
    store_column_text(v->volume_id, sizeof v->volume_id, st, 0);
    store_column_text(v->user_id, sizeof v->user_id, st, 1);
    store_column_text(v->name, sizeof v->name, st, 2);
    store_column_text(v->region, sizeof v->region, st, 3);
    v->size_gb = sqlite3_column_int64(st, 4);
    v->created_at = sqlite3_column_int64(st, 5);
    v->deleted_at = sqlite3_column_int64(st, 6);
    v->billed = sqlite3_column_int64(st, 7);
    v->billed_to = sqlite3_column_int64(st, 8);
}

int store_storage_billables(struct store *s, const char *user_id, struct storage_billable **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_STORAGE_BILLABLES);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    return store_collect(s, st, sizeof **out, (void **)out, n, store_read_storage_billable, "storage billables");
}

int store_storage_billables_all(struct store *s, struct storage_billable **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_STORAGE_BILLABLES_ALL);
    if (!st)
        return STORE_ERROR;
    return store_collect(s, st, sizeof **out, (void **)out, n, store_read_storage_billable, "all storage billables");
}

int store_storage_billed(struct store *s, const char *volume_id, int64_t billed, int64_t billed_to, int settled)
{
    sqlite3_stmt *st = store_stmt(s, SQL_STORAGE_BILLED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, volume_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, billed);
    sqlite3_bind_int64(st, 3, billed_to);
    sqlite3_bind_int(st, 4, settled);
    return store_step_change(s, st, "storage billed");
}

int store_region_known(struct store *s, const char *region)
{
    sqlite3_stmt *st = store_stmt(s, SQL_REGION_KNOWN);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, region, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int v = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : store_rc_from_sqlite(s, rc, "region known");
    sqlite3_reset(st);
    return v;
}

static void read_storage_line(sqlite3_stmt *st, void *row)
{
    struct storage_line *l = row;
    store_column_text(l->volume_id, sizeof l->volume_id, st, 0);
    store_column_text(l->name, sizeof l->name, st, 1);
    store_column_text(l->region, sizeof l->region, st, 2);
    l->size_gb = sqlite3_column_int64(st, 3);
    l->cost = sqlite3_column_int64(st, 4);
    l->from_credit = sqlite3_column_int64(st, 5);
    l->from_cash = sqlite3_column_int64(st, 6);
}

int store_storage_lines(struct store *s, const char *user_id, int64_t from, int64_t to, struct storage_line *out,
                        size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_STORAGE_STATEMENT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, from);
    sqlite3_bind_int64(st, 3, to);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_storage_line, "storage lines");
}
