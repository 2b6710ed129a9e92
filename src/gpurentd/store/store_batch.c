/* store_batch.c: billing for a batch of users at once, in a statement a
 * table over arrays held in C (store_rows.c) rather than a statement a row
 * (issue 15). The reads take the batch's user ids and read each table once
 * for all of them; the writes insert the batch's transactions and their
 * postings, move every balance and spend every grant by its sum over the
 * batch, and mark every interval billed. */
#include "gpurent/assert.h"
#include "gpurent/log.h"
#include "store/store_sql.h"

#include <stdlib.h>
#include <string.h>

#define IN_BATCH "IN (SELECT c0 FROM store_rows(?1))"

static const char SQL_BATCH_INTERVALS[] = "SELECT " BILLABLE_COLUMNS " FROM running_intervals r"
                                          " WHERE r.settled = 0 AND r.user_id " IN_BATCH " ORDER BY r.user_id, r.id";
static const char SQL_BATCH_VOLUMES[] =
    "SELECT " STORAGE_COLUMNS " FROM volumes WHERE storage_settled = 0"
    " AND user_id " IN_BATCH " AND " STORE_STORAGE_PRICED " ORDER BY user_id, created_at, id";
/* As SQL_FUNDS_TO_BILL, for the batch's users, without the credit: the
 * grants' own read has it, grant by grant. */
static const char SQL_BATCH_FUNDS[] =
    "SELECT u.c0, coalesce((SELECT balance FROM ledger_accounts WHERE id = 'cash:' || u.c0), 0), 0,"
    " EXISTS (SELECT 1 FROM credit_grants g WHERE g.user_id = u.c0 AND g.remaining > 0"
    "   AND g.voided_at IS NULL AND g.expires_at <= ?3)"
    " FROM store_rows(?1) u ORDER BY u.c0";
/* As SQL_GRANTS_SPENDABLE, for the batch's users. */
static const char SQL_BATCH_GRANTS[] =
    "SELECT " GRANT_COLUMNS " FROM credit_grants WHERE user_id " IN_BATCH " AND remaining > 0"
    " AND voided_at IS NULL AND (expires_at IS NULL OR expires_at > ?2)"
    " ORDER BY user_id, expires_at IS NULL, expires_at, created_at, id";

/* ------------------------------------------------------------ reads */

static int read_for_batch(struct store *s, const char *sql, const struct store_rows *users, int64_t at, size_t size,
                          void **out, size_t *n, void (*read)(sqlite3_stmt *st, void *row), const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    store_bind_rows(st, 1, users);
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
    struct store_rows ids = store_rows_of_ids((const char(*)[ID_MAX])users, n);
    int rc = read_for_batch(s, SQL_BATCH_INTERVALS, &ids, at, sizeof *out->intervals, (void **)&out->intervals,
                            &out->n_intervals, store_read_billable, "batch intervals");
    if (rc == STORE_OK)
        rc = read_for_batch(s, SQL_BATCH_VOLUMES, &ids, at, sizeof *out->volumes, (void **)&out->volumes,
                            &out->n_volumes, store_read_storage_billable, "batch volumes");
    if (rc == STORE_OK)
        rc = read_for_batch(s, SQL_BATCH_FUNDS, &ids, at, sizeof *out->funds, (void **)&out->funds, &out->n_funds,
                            store_read_user_funds, "batch funds");
    if (rc == STORE_OK)
        rc = read_for_batch(s, SQL_BATCH_GRANTS, &ids, at, sizeof *out->grants, (void **)&out->grants, &out->n_grants,
                            store_read_grant, "batch grants");
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

/* The batch's writes, each one statement over an array (store_rows.c). A
 * transaction's id is given rather than taken from AUTOINCREMENT, so that
 * its postings can name it; the first is after every id ever used. */
static const char SQL_LAST_TXN_ID[] =
    "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'ledger_transactions'), 0),"
    " coalesce((SELECT max(id) FROM ledger_transactions), 0))";
static const char SQL_BATCH_TXNS[] =
    "INSERT INTO ledger_transactions (id, at, kind, user_id, reason, instance_id, interval_id, volume_id, created_at)"
    " SELECT c0, c1, c2, c3, c4, c5, c6, c7, c8 FROM store_rows(?1)";
static const char SQL_BATCH_POSTINGS[] = "INSERT INTO ledger_postings (transaction_id, account_id, amount, grant_id)"
                                         " SELECT c0, c1, c2, c3 FROM store_rows(?1)";
static const char SQL_BATCH_INTERVALS_BILLED[] = "UPDATE running_intervals SET billed = r.c1, settled = r.c2"
                                                 " FROM store_rows(?1) r WHERE running_intervals.id = r.c0";
/* Each account moves by the sum of its legs in the batch, only where the
 * balance stays within 64 bits (as SQL_ACCOUNT_MOVE); a user account below
 * zero breaks its CHECK. */
static const char SQL_BATCH_MOVE[] =
    "UPDATE ledger_accounts SET balance = balance + r.c1 FROM store_rows(?1) r WHERE ledger_accounts.id = r.c0"
    " AND CASE WHEN r.c1 >= 0 THEN balance <= 9223372036854775807 - r.c1"
    " ELSE balance >= -9223372036854775808 - r.c1 END";
static const char SQL_BATCH_SPEND[] = "UPDATE credit_grants SET remaining = remaining + r.c1 FROM store_rows(?1) r"
                                      " WHERE credit_grants.id = r.c0 AND r.c1 < 0 AND remaining + r.c1 >= 0"
                                      " AND voided_at IS NULL";

static void result_text_or_null(sqlite3_context *ctx, const char *text)
{
    if (text)
        sqlite3_result_text(ctx, text, -1, SQLITE_STATIC);
    else
        sqlite3_result_null(ctx);
}

/* The batch's transactions: c0 id, c1 at, c2 kind, c3 user, c4 reason,
 * c5 instance, c6 interval, c7 volume, c8 when posted. */
struct txn_rows {
    const struct ledger_entry *entries;
    int64_t first_id, now;
};

static void txn_column(const void *array, size_t i, int col, sqlite3_context *ctx)
{
    const struct txn_rows *t = array;
    const struct ledger_entry *e = &t->entries[i];
    switch (col) {
    case 0:
        sqlite3_result_int64(ctx, t->first_id + (int64_t)i);
        break;
    case 1:
        sqlite3_result_int64(ctx, e->at);
        break;
    case 2:
        result_text_or_null(ctx, e->kind);
        break;
    case 3:
        result_text_or_null(ctx, e->user_id);
        break;
    case 4:
        result_text_or_null(ctx, e->reason);
        break;
    case 5:
        result_text_or_null(ctx, e->instance_id);
        break;
    case 6:
        if (e->interval_id)
            sqlite3_result_int64(ctx, e->interval_id);
        else
            sqlite3_result_null(ctx);
        break;
    case 7:
        result_text_or_null(ctx, e->volume_id);
        break;
    case 8:
        sqlite3_result_int64(ctx, t->now);
        break;
    default:
        sqlite3_result_null(ctx);
    }
}

/* A posting of the batch: c0 transaction, c1 account, c2 amount, c3 grant. */
struct posting_row {
    int64_t txn;
    const struct ledger_leg *leg;
};

static void posting_column(const void *array, size_t i, int col, sqlite3_context *ctx)
{
    const struct posting_row *p = (const struct posting_row *)array + i;
    switch (col) {
    case 0:
        sqlite3_result_int64(ctx, p->txn);
        break;
    case 1:
        sqlite3_result_text(ctx, p->leg->account_id, -1, SQLITE_STATIC);
        break;
    case 2:
        sqlite3_result_int64(ctx, p->leg->amount);
        break;
    case 3:
        result_text_or_null(ctx, p->leg->grant_id[0] ? p->leg->grant_id : NULL);
        break;
    default:
        sqlite3_result_null(ctx);
    }
}

/* An interval the batch marks: c0 id, c1 billed, c2 settled. */
static void interval_column(const void *array, size_t i, int col, sqlite3_context *ctx)
{
    const struct billed_interval *b = (const struct billed_interval *)array + i;
    switch (col) {
    case 0:
        sqlite3_result_int64(ctx, b->id);
        break;
    case 1:
        sqlite3_result_int64(ctx, b->billed);
        break;
    case 2:
        sqlite3_result_int(ctx, b->settled);
        break;
    default:
        sqlite3_result_null(ctx);
    }
}

/* An account (or grant) the batch moves: c0 its id, c1 by how much. */
struct account_move {
    const char *id;
    int64_t delta;
};

static void move_column(const void *array, size_t i, int col, sqlite3_context *ctx)
{
    const struct account_move *m = (const struct account_move *)array + i;
    if (col == 0)
        sqlite3_result_text(ctx, m->id, -1, SQLITE_STATIC);
    else if (col == 1)
        sqlite3_result_int64(ctx, m->delta);
    else
        sqlite3_result_null(ctx);
}

/* Runs a batch statement over rows (?1), which must change exactly rows->n
 * rows. A CHECK it breaks is a conflict: a user's funds would go below
 * zero. */
static int write_rows(struct store *s, const char *sql, const struct store_rows *rows, const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    store_bind_rows(st, 1, rows);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_CONSTRAINT_CHECK)
        return STORE_CONFLICT;
    if ((rc = store_rc_from_sqlite(s, rc, what)) != STORE_OK)
        return rc;
    if (sqlite3_changes64(store_db(s)) != (int64_t)rows->n) {
        log_error("store: %s changed %lld rows, not %zu", what, (long long)sqlite3_changes64(store_db(s)), rows->n);
        return STORE_ERROR;
    }
    return STORE_OK;
}

static int by_account(const void *a, const void *b)
{
    const struct ledger_leg *x = *(const struct ledger_leg *const *)a, *y = *(const struct ledger_leg *const *)b;
    return strcmp(x->account_id, y->account_id);
}

/* Moves every account the batch's legs move by their sum, and spends each
 * grant by its own (a grant's legs are all on its account, grant:<id>):
 * in the order of their ids, the order of both tables' keys. */
static int move_balances(struct store *s, const struct charge_batch *b)
{
    size_t n = b->first_leg[b->n_entries], m = 0, n_moves = 0, n_spends = 0;
    const struct ledger_leg **legs = malloc((n + 1) * sizeof *legs);
    struct account_move *moves = malloc((n + 1) * sizeof *moves), *spends = malloc((n + 1) * sizeof *spends);
    int rc = legs && moves && spends ? STORE_OK : STORE_ERROR;
    for (size_t k = 0; rc == STORE_OK && k < n; k++)
        if (b->legs[k].amount != 0)
            legs[m++] = &b->legs[k];
    if (rc == STORE_OK)
        qsort(legs, m, sizeof *legs, by_account);
    struct account_move *move = NULL, *spend = NULL; /* the account of leg k, and its grant's spend */
    for (size_t k = 0; rc == STORE_OK && k < m; k++) {
        const struct ledger_leg *l = legs[k];
        if (!move || strcmp(move->id, l->account_id) != 0) {
            move = &moves[n_moves++];
            *move = (struct account_move){l->account_id, 0};
            spend = NULL;
            if (l->grant_id[0]) {
                spend = &spends[n_spends++];
                *spend = (struct account_move){l->grant_id, 0};
            }
        }
        ASSERT(l->grant_id[0] ? spend && strcmp(spend->id, l->grant_id) == 0 : !spend);
        if (__builtin_add_overflow(move->delta, l->amount, &move->delta)) {
            log_error("store: the batch moves account %s by more than 64 bits hold", l->account_id);
            rc = STORE_ERROR;
        }
        if (spend)
            spend->delta = move->delta;
    }
    if (rc == STORE_OK)
        rc = write_rows(s, SQL_BATCH_MOVE, &(struct store_rows){moves, n_moves, move_column}, "batch balances");
    if (rc == STORE_OK && n_spends)
        rc = write_rows(s, SQL_BATCH_SPEND, &(struct store_rows){spends, n_spends, move_column}, "batch grant spends");
    free(legs);
    free(moves);
    free(spends);
    return rc;
}

/* By the account of the first leg of each posting's charge (the user's:
 * revenue comes last), then in the order planned. */
struct batch_charge {
    const struct ledger_leg *legs;
    size_t n_legs;
    int64_t txn;
};

static int by_first_account(const void *a, const void *b)
{
    const struct batch_charge *x = a, *y = b;
    int c = strcmp(x->legs->account_id, y->legs->account_id);
    return c ? c : (x->legs > y->legs) - (x->legs < y->legs);
}

/* The batch's postings, in the order they are inserted: a charge's together
 * and in the order its funds were drawn; the charges by the user's account,
 * so that each page of the index by account is written once rather than
 * once a charge, as the users' order would scatter them. */
static struct posting_row *postings_in_order(const struct charge_batch *b, int64_t first_txn, size_t *n)
{
    size_t n_legs = b->first_leg[b->n_entries];
    struct batch_charge *order = malloc((b->n_entries + 1) * sizeof *order);
    struct posting_row *rows = malloc((n_legs + 1) * sizeof *rows);
    if (!order || !rows) {
        free(order);
        free(rows);
        return NULL;
    }
    for (size_t i = 0; i < b->n_entries; i++)
        order[i] = (struct batch_charge){b->legs + b->first_leg[i], b->first_leg[i + 1] - b->first_leg[i],
                                         first_txn + (int64_t)i};
    qsort(order, b->n_entries, sizeof *order, by_first_account);
    *n = 0;
    for (size_t i = 0; i < b->n_entries; i++)
        for (size_t k = 0; k < order[i].n_legs; k++)
            if (order[i].legs[k].amount != 0)
                rows[(*n)++] = (struct posting_row){order[i].txn, &order[i].legs[k]};
    free(order);
    return rows;
}

int store_charge_batch_post(struct store *s, const struct charge_batch *b, int64_t now)
{
    for (size_t i = 0; i < b->n_entries; i++) {
        store_legs_balanced(b->legs + b->first_leg[i], b->first_leg[i + 1] - b->first_leg[i]);
        /* Only charges for card time and storage come in batches. */
        const struct ledger_entry *e = &b->entries[i];
        ASSERT(!e->grant_id && !e->topup_id && !e->reservation_id && !e->app_call_id && !e->payee_id);
    }
    int rc = STORE_OK;
    if (b->n_entries) {
        sqlite3_stmt *st = store_stmt(s, SQL_LAST_TXN_ID);
        if (!st)
            return STORE_ERROR;
        int64_t last = 0;
        int step = sqlite3_step(st);
        if ((rc = store_rc_from_sqlite(s, step, "last transaction id")) == STORE_OK && step == SQLITE_ROW)
            last = sqlite3_column_int64(st, 0);
        sqlite3_reset(st);
        if (rc != STORE_OK)
            return rc;
        struct txn_rows txns = {b->entries, last + 1, now};
        size_t n_postings = 0;
        struct posting_row *postings = postings_in_order(b, last + 1, &n_postings);
        if (!postings)
            return STORE_ERROR;
        rc = write_rows(s, SQL_BATCH_TXNS, &(struct store_rows){&txns, b->n_entries, txn_column}, "batch transactions");
        if (rc == STORE_OK)
            rc = write_rows(s, SQL_BATCH_POSTINGS, &(struct store_rows){postings, n_postings, posting_column},
                            "batch postings");
        free(postings);
        if (rc == STORE_OK)
            rc = move_balances(s, b);
    }
    if (rc == STORE_OK && b->n_intervals)
        rc = write_rows(s, SQL_BATCH_INTERVALS_BILLED,
                        &(struct store_rows){b->intervals, b->n_intervals, interval_column}, "batch intervals billed");
    for (size_t i = 0; rc == STORE_OK && i < b->n_volumes; i++)
        rc = store_storage_billed(s, b->volumes[i].volume_id, b->volumes[i].billed, b->volumes[i].billed_to,
                                  b->volumes[i].settled);
    return rc;
}
