/* store_batch.c: billing for a batch of users at once. The reads take the
 * batch's user ids as one JSON array (json_each) and read each table once
 * for all of them; the writes insert the batch's transactions and postings
 * and then move every balance and spend every grant in one statement each,
 * summed from the postings just made, rather than a read and a write per leg
 * (issue 15). Rows are inserted with bound statements, not from JSON: taking
 * eight fields out of a JSON row costs more than binding them. */
#include "gpurent/assert.h"
#include "gpurent/log.h"
#include "store/store_sql.h"

#include <stdlib.h>
#include <string.h>

#define IN_BATCH "IN (SELECT value FROM json_each(?1))"

static const char SQL_BATCH_INTERVALS[] = "SELECT " BILLABLE_COLUMNS " FROM running_intervals r"
                                          " WHERE r.settled = 0 AND r.user_id " IN_BATCH " ORDER BY r.user_id, r.id";
static const char SQL_BATCH_VOLUMES[] = "SELECT " STORAGE_COLUMNS " FROM volumes WHERE storage_settled = 0"
                                        " AND user_id " IN_BATCH " AND " STORE_STORAGE_PRICED
                                        " ORDER BY user_id, created_at, id";
/* As SQL_FUNDS_TO_BILL, for the batch's users, without the credit: the
 * grants' own read has it, grant by grant. */
static const char SQL_BATCH_FUNDS[] =
    "SELECT u.value, coalesce((SELECT balance FROM ledger_accounts WHERE id = 'cash:' || u.value), 0), 0,"
    " EXISTS (SELECT 1 FROM credit_grants g WHERE g.user_id = u.value AND g.remaining > 0"
    "   AND g.voided_at IS NULL AND g.expires_at <= ?3)"
    " FROM json_each(?1) u ORDER BY u.value";
/* As SQL_GRANTS_SPENDABLE, for the batch's users. */
static const char SQL_BATCH_GRANTS[] =
    "SELECT " GRANT_COLUMNS " FROM credit_grants WHERE user_id " IN_BATCH " AND remaining > 0"
    " AND voided_at IS NULL AND (expires_at IS NULL OR expires_at > ?2)"
    " ORDER BY user_id, expires_at IS NULL, expires_at, created_at, id";

/* Each account moves by the sum of its postings in the batch (found by
 * transaction: grouping through the index by account would read every
 * posting ever made), only where the sum fits in 64 bits (as SQL_ACCOUNT_MOVE; sum() itself fails on an
 * overflow); a user account below zero breaks its CHECK. */
static const char SQL_BATCH_MOVE[] =
    "UPDATE ledger_accounts SET balance = balance + m.delta FROM (SELECT account_id, sum(amount) AS delta"
    " FROM ledger_postings INDEXED BY ledger_postings_by_transaction WHERE transaction_id > ?1 GROUP BY account_id) m"
    " WHERE ledger_accounts.id = m.account_id"
    " AND CASE WHEN m.delta >= 0 THEN balance <= ?2 - m.delta ELSE balance >= ?3 - m.delta END";
static const char SQL_BATCH_SPEND[] =
    "UPDATE credit_grants SET remaining = remaining + m.delta FROM (SELECT grant_id, sum(amount) AS delta"
    " FROM ledger_postings WHERE transaction_id > ?1 AND grant_id IS NOT NULL GROUP BY grant_id) m"
    " WHERE credit_grants.id = m.grant_id AND m.delta < 0 AND remaining + m.delta >= 0 AND voided_at IS NULL";
/* ------------------------------------------------------------ reads */

static int read_for_batch(struct store *s, const char *sql, const char *users, int64_t at, size_t size, void **out,
                          size_t *n, void (*read)(sqlite3_stmt *st, void *row), const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, users, -1, SQLITE_STATIC);
    /* Funds and grants: valid in the second before `at`, expired by `at`. */
    if (sqlite3_bind_parameter_count(st) >= 2)
        sqlite3_bind_int64(st, 2, at - 1);
    if (sqlite3_bind_parameter_count(st) >= 3)
        sqlite3_bind_int64(st, 3, at);
    return store_collect(s, st, size, out, n, read, what);
}

int store_billing_batch_read(struct store *s, char (*users)[ID_MAX], size_t n, int64_t at, struct billing_batch *out)
{
    memset(out, 0, sizeof *out);
    char *ids = store_ids_json(users, n);
    if (!ids)
        return STORE_ERROR;
    int rc = read_for_batch(s, SQL_BATCH_INTERVALS, ids, at, sizeof *out->intervals, (void **)&out->intervals,
                            &out->n_intervals, store_read_billable, "batch intervals");
    if (rc == STORE_OK)
        rc = read_for_batch(s, SQL_BATCH_VOLUMES, ids, at, sizeof *out->volumes, (void **)&out->volumes,
                            &out->n_volumes, store_read_storage_billable, "batch volumes");
    if (rc == STORE_OK)
        rc = read_for_batch(s, SQL_BATCH_FUNDS, ids, at, sizeof *out->funds, (void **)&out->funds, &out->n_funds,
                            store_read_user_funds, "batch funds");
    if (rc == STORE_OK)
        rc = read_for_batch(s, SQL_BATCH_GRANTS, ids, at, sizeof *out->grants, (void **)&out->grants,
                            &out->n_grants, store_read_grant, "batch grants");
    free(ids);
    if (rc != STORE_OK)
        store_billing_batch_free(out);
    return rc;
}

void store_billing_batch_free(struct billing_batch *b)
{
    free(b->intervals);
    free(b->volumes);
    free(b->funds);
    free(b->grants);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------ the post */

/* Moves the accounts and spends the grants of the postings after base,
 * which move `accounts` accounts and `grants` grants. */
static int move_balances(struct store *s, int64_t base, int64_t accounts, int64_t grants)
{
    sqlite3_stmt *st;
    int rc;
    struct {
        const char *sql, *what;
        int64_t want;
    } moves[] = {{SQL_BATCH_MOVE, "batch balances", accounts}, {SQL_BATCH_SPEND, "batch grant spends", grants}};
    for (size_t i = 0; i < sizeof moves / sizeof moves[0]; i++) {
        if (!(st = store_stmt(s, moves[i].sql)))
            return STORE_ERROR;
        sqlite3_bind_int64(st, 1, base);
        sqlite3_bind_int64(st, 2, INT64_MAX);
        sqlite3_bind_int64(st, 3, INT64_MIN);
        rc = sqlite3_step(st);
        sqlite3_reset(st);
        if (rc == SQLITE_CONSTRAINT_CHECK)
            return STORE_CONFLICT; /* a user's funds would go below zero */
        if ((rc = store_rc_from_sqlite(s, rc, moves[i].what)) != STORE_OK)
            return rc;
        if (sqlite3_changes64(store_db(s)) != moves[i].want) {
            log_error("store: %s moved %lld rows, not %lld", moves[i].what, (long long)sqlite3_changes64(store_db(s)),
                      (long long)moves[i].want);
            return STORE_ERROR;
        }
    }
    return STORE_OK;
}

static int by_text(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The distinct accounts and grants the batch's legs move (a grant's legs
 * are all on its own account), as the UPDATEs must find them. */
static int count_moved(const struct charge_batch *b, int64_t *accounts, int64_t *grants)
{
    size_t n = b->first_leg[b->n_entries], m = 0;
    const char **ids = malloc((n + 1) * sizeof *ids);
    if (!ids)
        return STORE_ERROR;
    for (size_t k = 0; k < n; k++)
        if (b->legs[k].amount != 0)
            ids[m++] = b->legs[k].account_id;
    qsort(ids, m, sizeof *ids, by_text);
    *accounts = *grants = 0;
    for (size_t k = 0; k < m; k++)
        if (k == 0 || strcmp(ids[k], ids[k - 1]) != 0) {
            (*accounts)++;
            *grants += strncmp(ids[k], "grant:", 6) == 0;
        }
    free(ids);
    return STORE_OK;
}

/* A charge of the batch: its legs and its transaction. */
struct batch_charge {
    const struct ledger_leg *legs;
    size_t n_legs;
    int64_t txn;
};

/* By the account of the first leg (the user's: revenue comes last), then in
 * the order planned. */
static int by_first_account(const void *a, const void *b)
{
    const struct batch_charge *x = a, *y = b;
    int c = strcmp(x->legs->account_id, y->legs->account_id);
    return c ? c : (x->legs > y->legs) - (x->legs < y->legs);
}

int store_charge_batch_post(struct store *s, const struct charge_batch *b, int64_t now)
{
    int rc = STORE_OK;
    struct batch_charge *order = malloc((b->n_entries + 1) * sizeof *order);
    if (!order)
        return STORE_ERROR;
    int64_t first = 0;
    for (size_t i = 0; rc == STORE_OK && i < b->n_entries; i++) {
        store_legs_balanced(b->legs + b->first_leg[i], b->first_leg[i + 1] - b->first_leg[i]);
        /* Only charges for card time and storage come in batches. */
        const struct ledger_entry *e = &b->entries[i];
        ASSERT(!e->grant_id && !e->topup_id && !e->reservation_id && !e->app_call_id);
        order[i] = (struct batch_charge){b->legs + b->first_leg[i], b->first_leg[i + 1] - b->first_leg[i], 0};
        rc = store_ledger_insert(s, e, now, &order[i].txn);
        if (!first)
            first = order[i].txn;
    }
    /* A charge's postings go in together and in the order its funds were
     * drawn; the charges' by the user's account, so that each page of the
     * index by account is written once rather than once a charge, as the
     * users' order would scatter them. */
    if (rc == STORE_OK)
        qsort(order, b->n_entries, sizeof *order, by_first_account);
    int64_t accounts = 0, grants = 0;
    for (size_t i = 0; rc == STORE_OK && i < b->n_entries; i++)
        for (size_t k = 0; rc == STORE_OK && k < order[i].n_legs; k++) {
            const struct ledger_leg *l = &order[i].legs[k];
            if (l->amount != 0)
                rc = store_posting_insert(s, order[i].txn, l);
        }
    free(order);
    if (rc == STORE_OK)
        rc = count_moved(b, &accounts, &grants);
    /* Ids only grow (AUTOINCREMENT), and this transaction holds the write
     * lock: the batch's transactions are exactly those from the first. */
    if (rc == STORE_OK && first)
        rc = move_balances(s, first - 1, accounts, grants);
    for (size_t i = 0; rc == STORE_OK && i < b->n_intervals; i++)
        rc = store_interval_billed(s, b->intervals[i].id, b->intervals[i].billed, b->intervals[i].settled, -1);
    for (size_t i = 0; rc == STORE_OK && i < b->n_volumes; i++)
        rc = store_storage_billed(s, b->volumes[i].volume_id, b->volumes[i].billed, b->volumes[i].billed_to,
                                  b->volumes[i].settled);
    return rc;
}
