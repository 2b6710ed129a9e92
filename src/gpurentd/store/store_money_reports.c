/* store_money_reports.c: SQL behind the user's balance, transactions,
 * usage and statements. Everything is read from the ledger and the running
 * intervals, so what users see always agrees with what was posted. */
#include "gpurent/log.h"
#include "gpurent/money.h"
#include "store/store_sql.h"

#include <stdio.h>
#include <string.h>

/* A user's transactions: those of their own money (user_id) and the app
 * calls that paid them (payee_id), each side read in id order through its
 * own index and cut at the page; the amounts are the user's own legs only
 * (an app call's line for its consumer is what they paid, for its
 * publisher what they earned). */
#define TXNS_OF(column)                                                                                        \
    "SELECT id FROM (SELECT id FROM ledger_transactions WHERE " column " = ?1 AND (?2 IS NULL OR kind = ?2)"  \
    " AND at >= ?3 AND at < ?4 AND id > ?5 ORDER BY id LIMIT ?6)"
static const char SQL_TXNS[] =
    "SELECT t.id, t.at, t.kind, t.reason, coalesce(t.instance_id, ''), coalesce(t.volume_id, ''),"
    " coalesce(sum(p.amount) FILTER (WHERE a.kind IN ('cash', 'grant') AND a.user_id = ?1), 0),"
    " coalesce(sum(p.amount) FILTER (WHERE a.kind = 'grant' AND a.user_id = ?1), 0),"
    " coalesce(sum(p.amount) FILTER (WHERE a.kind = 'cash' AND a.user_id = ?1), 0)"
    " FROM (" TXNS_OF("user_id") " UNION " TXNS_OF("payee_id") ") mine"
    " JOIN ledger_transactions t ON t.id = mine.id JOIN ledger_postings p ON p.transaction_id = t.id"
    " JOIN ledger_accounts a ON a.id = p.account_id"
    " GROUP BY t.id ORDER BY t.id LIMIT ?6";
/* Usage: card-seconds from intervals clipped to the period (found through
 * the user's instances, 0041, not by reading every interval), money from the
 * usage transactions posted for the period. Money is summed as sum(-x), not
 * -sum(x): sum() fails on an overflow, where negating INT64_MIN would
 * quietly give a REAL. */
static const char SQL_USAGE_BY_INSTANCE[] =
    "WITH secs AS (SELECT r.instance_id AS k, r.gpu_model, sum(r.card_count * (min(coalesce(r.ended_at, ?4), ?3)"
    "   - max(r.started_at, ?2))) AS cs FROM instances i JOIN running_intervals r ON r.instance_id = i.id"
    "   WHERE i.user_id = ?1 AND r.user_id = ?1 AND r.started_at < ?3 AND coalesce(r.ended_at, ?4) > ?2"
    "   GROUP BY r.instance_id),"
    " money AS (SELECT t.instance_id AS k, sum(-p.amount) FILTER (WHERE a.kind IN ('cash', 'grant')) AS cost,"
    "   coalesce(sum(-p.amount) FILTER (WHERE a.kind = 'grant'), 0) AS credit,"
    "   coalesce(sum(-p.amount) FILTER (WHERE a.kind = 'cash'), 0) AS cash"
    "   FROM ledger_transactions t JOIN ledger_postings p ON p.transaction_id = t.id"
    "   JOIN ledger_accounts a ON a.id = p.account_id"
    "   WHERE t.user_id = ?1 AND t.kind IN ('usage', 'refund') AND t.at >= ?2 AND t.at < ?3 GROUP BY t.instance_id)"
    " SELECT k, (SELECT gpu_model FROM instances WHERE id = k), coalesce((SELECT cs FROM secs WHERE secs.k = keys.k), "
    "0),"
    " coalesce((SELECT cost FROM money WHERE money.k = keys.k), 0), coalesce((SELECT credit FROM money WHERE money.k = "
    "keys.k), 0),"
    " coalesce((SELECT cash FROM money WHERE money.k = keys.k), 0)"
    " FROM (SELECT k FROM secs UNION SELECT k FROM money) keys ORDER BY k LIMIT ?5";
static const char SQL_FUNDS_BEFORE[] =
    "SELECT coalesce(sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    " JOIN ledger_accounts a ON a.id = p.account_id WHERE a.user_id = ?1 AND t.at < ?2";
/* Every open interval is unsettled: saying so lets SQLite find them in
 * running_intervals_unsettled, which holds all this reads (0040). */
static const char SQL_BURN[] =
    "SELECT coalesce(sum(r.card_count * (SELECT card_hour FROM prices pr WHERE pr.gpu_model = r.gpu_model"
    "   AND pr.effective_at <= ?2 ORDER BY pr.effective_at DESC LIMIT 1)), 0)"
    " FROM running_intervals r WHERE r.user_id = ?1 AND r.settled = 0 AND r.ended_at IS NULL";

static void read_txn_row(sqlite3_stmt *st, void *row)
{
    struct ledger_txn_row *r = row;
    r->id = sqlite3_column_int64(st, 0);
    r->at = sqlite3_column_int64(st, 1);
    store_column_text(r->kind, sizeof r->kind, st, 2);
    store_column_text(r->reason, sizeof r->reason, st, 3);
    store_column_text(r->instance_id, sizeof r->instance_id, st, 4);
    store_column_text(r->volume_id, sizeof r->volume_id, st, 5);
    r->user_delta = sqlite3_column_int64(st, 6);
    r->credit_delta = sqlite3_column_int64(st, 7);
    r->cash_delta = sqlite3_column_int64(st, 8);
}

int store_ledger_transactions(struct store *s, const struct ledger_txn_filter *f, struct ledger_txn_row *out,
                              size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_TXNS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, f->user_id, -1, SQLITE_STATIC);
    if (f->kind)
        sqlite3_bind_text(st, 2, f->kind, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, f->from);
    sqlite3_bind_int64(st, 4, f->to);
    sqlite3_bind_int64(st, 5, f->after_id);
    sqlite3_bind_int64(st, 6, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_txn_row, "transactions");
}

int store_usage(struct store *s, const char *user_id, int64_t from, int64_t to, int64_t now, int by_type,
                struct usage_row *out, size_t max, size_t *n)
{
    *n = 0;
    struct usage_row rows[512];
    size_t nr = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_USAGE_BY_INSTANCE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, from);
    sqlite3_bind_int64(st, 3, to);
    sqlite3_bind_int64(st, 4, now < to ? now : to);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)(by_type ? sizeof rows / sizeof rows[0] : max));
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && nr < sizeof rows / sizeof rows[0]) {
        struct usage_row *r = &rows[nr++];
        store_column_text(r->key, sizeof r->key, st, 0);
        store_column_text(r->gpu_model, sizeof r->gpu_model, st, 1);
        r->card_seconds = sqlite3_column_int64(st, 2);
        r->cost = sqlite3_column_int64(st, 3);
        r->from_credit = sqlite3_column_int64(st, 4);
        r->from_cash = sqlite3_column_int64(st, 5);
    }
    int result = rc == SQLITE_DONE || rc == SQLITE_ROW ? STORE_OK : store_rc_from_sqlite(s, rc, "usage");
    sqlite3_reset(st);
    if (result != STORE_OK)
        return result;
    for (size_t i = 0; i < nr; i++) {
        if (!by_type) {
            if (*n < max)
                out[(*n)++] = rows[i];
            continue;
        }
        size_t k = 0;
        while (k < *n && strcmp(out[k].key, rows[i].gpu_model) != 0)
            k++;
        if (k == *n) {
            if (*n == max)
                continue;
            memset(&out[k], 0, sizeof out[k]);
            snprintf(out[k].key, sizeof out[k].key, "%s", rows[i].gpu_model);
            snprintf(out[k].gpu_model, sizeof out[k].gpu_model, "%s", rows[i].gpu_model);
            (*n)++;
        }
        if (money_add(out[k].card_seconds, rows[i].card_seconds, &out[k].card_seconds) != MONEY_OK ||
            money_add(out[k].cost, rows[i].cost, &out[k].cost) != MONEY_OK ||
            money_add(out[k].from_credit, rows[i].from_credit, &out[k].from_credit) != MONEY_OK ||
            money_add(out[k].from_cash, rows[i].from_cash, &out[k].from_cash) != MONEY_OK) {
            log_error("store: usage of %s by GPU type: a sum overflows 64-bit integers", user_id);
            *n = 0;
            return STORE_ERROR;
        }
    }
    return STORE_OK;
}

static int64_t one_int(struct store *s, const char *sql, const char *user_id, int64_t at, const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, at);
    int rc = sqlite3_step(st);
    int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : store_rc_from_sqlite(s, rc, what);
    /* A product that overflowed (a price times cards) became a REAL, which
     * would read back as a wrong number. */
    if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_INTEGER) {
        log_error("store: %s of %s: a sum overflows 64-bit integers", what, user_id);
        v = STORE_ERROR;
    }
    sqlite3_reset(st);
    return v;
}

int64_t store_user_funds_before(struct store *s, const char *user_id, int64_t at)
{
    return one_int(s, SQL_FUNDS_BEFORE, user_id, at, "funds before");
}

int64_t store_user_burn_rate(struct store *s, const char *user_id, int64_t at)
{
    return one_int(s, SQL_BURN, user_id, at, "burn rate");
}
