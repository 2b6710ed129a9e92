/* store_metrics.c: the counts /metrics reports from the database at scrape
 * time, so gauges are always what the store holds, and money counters are
 * sums of postings (they only grow, as Prometheus counters must). */
#include "store/store_sql.h"

#include <stdio.h>

static const char SQL_NODES_BY_STATE[] =
    "SELECT s.state, n.gpu_model, count(*) FROM node_states s JOIN nodes n ON n.id = s.node_id"
    " GROUP BY s.state, n.gpu_model ORDER BY 1, 2";
static const char SQL_INSTANCES_BY_STATE[] =
    "SELECT state, gpu_model, count(*) FROM instances GROUP BY state, gpu_model ORDER BY 1, 2";
static const char SQL_MONEY[] =
    "SELECT"
    " (SELECT coalesce(sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'usage' AND p.account_id = 'revenue'),"
    " (SELECT coalesce(sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'grant' AND p.account_id LIKE 'grant:%'),"
    " (SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'usage' AND p.account_id LIKE 'grant:%'),"
    " (SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'expiry' AND p.account_id LIKE 'grant:%'),"
    " (SELECT coalesce(sum(amount), 0) FROM topups),"
    " (SELECT coalesce(sum(balance), 0) FROM ledger_accounts WHERE kind = 'grant'),"
    " (SELECT coalesce(sum(balance), 0) FROM ledger_accounts WHERE kind = 'cash'),"
    " (SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'refund' AND p.account_id = 'revenue'),"
    " (SELECT coalesce(sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'refund' AND p.account_id LIKE 'grant:%'),"
    " (SELECT coalesce(sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'storage' AND p.account_id = 'revenue'),"
    " (SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'storage' AND p.account_id LIKE 'grant:%'),"
    /* Reservations (0024): paid, refunded, and the credit in each. */
    " (SELECT coalesce(sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'reservation' AND p.account_id = 'revenue'),"
    " (SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'reservation_refund' AND p.account_id = 'revenue'),"
    " (SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'reservation' AND p.account_id LIKE 'grant:%'),"
    " (SELECT coalesce(sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    "   WHERE t.kind = 'reservation_refund' AND p.account_id LIKE 'grant:%')";

static void read_metric_row(sqlite3_stmt *st, void *row)
{
    struct metric_row *r = row;
    snprintf(r->a, sizeof r->a, "%s", (const char *)sqlite3_column_text(st, 0));
    snprintf(r->b, sizeof r->b, "%s", (const char *)sqlite3_column_text(st, 1));
    r->value = sqlite3_column_int64(st, 2);
}

static int labelled(struct store *s, const char *sql, struct metric_row **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    return store_collect(s, st, sizeof **out, (void **)out, n, read_metric_row, "metrics");
}

int store_metrics_nodes(struct store *s, struct metric_row **out, size_t *n)
{
    return labelled(s, SQL_NODES_BY_STATE, out, n);
}

int store_metrics_instances(struct store *s, struct metric_row **out, size_t *n)
{
    return labelled(s, SQL_INSTANCES_BY_STATE, out, n);
}

int store_metrics_money(struct store *s, struct money_totals *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_MONEY);
    if (!st)
        return STORE_ERROR;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        out->revenue = sqlite3_column_int64(st, 0);
        out->credits_granted = sqlite3_column_int64(st, 1);
        out->credits_spent = sqlite3_column_int64(st, 2);
        out->credits_expired = sqlite3_column_int64(st, 3);
        out->topups = sqlite3_column_int64(st, 4);
        out->credit_outstanding = sqlite3_column_int64(st, 5);
        out->cash_held = sqlite3_column_int64(st, 6);
        out->refunds = sqlite3_column_int64(st, 7);
        out->credits_refunded = sqlite3_column_int64(st, 8);
        out->storage_revenue = sqlite3_column_int64(st, 9);
        out->storage_credits_spent = sqlite3_column_int64(st, 10);
        out->reservation_revenue = sqlite3_column_int64(st, 11);
        out->reservation_refunds = sqlite3_column_int64(st, 12);
        out->reservation_credits_spent = sqlite3_column_int64(st, 13);
        out->reservation_credits_refunded = sqlite3_column_int64(st, 14);
    }
    int result = rc == SQLITE_ROW ? STORE_OK : store_rc_from_sqlite(s, rc, "money totals");
    sqlite3_reset(st);
    return result;
}
