/* store_money.c: SQL for prices, the ledger, credit grants, invite codes,
 * top-ups and the billing state of running intervals. */
#include "gpurent/assert.h"
#include "gpurent/log.h"
#include "gpurent/tariff.h"
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_PRICES[] = "SELECT effective_at, card_hour FROM prices WHERE gpu_model = ? ORDER BY effective_at";
static const char SQL_PRICE_INSERT[] =
    "INSERT INTO prices (gpu_model, effective_at, card_hour, created_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (gpu_model, effective_at) DO UPDATE SET card_hour = excluded.card_hour, created_at = "
    "excluded.created_at";
static const char SQL_PRICE_HISTORY[] =
    "SELECT gpu_model, effective_at, card_hour, created_at FROM prices WHERE (?1 IS NULL OR gpu_model = ?1)"
    " ORDER BY gpu_model, effective_at LIMIT ?2";
static const char SQL_ACCOUNT_ENSURE[] =
    "INSERT INTO ledger_accounts (id, kind, user_id) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING";
/* Moves a cached balance only when the sum fits in 64 bits (?3 and ?4 are
 * INT64_MAX and INT64_MIN, so neither bound overflows): SQLite would turn
 * an overflowing sum into a REAL, which the STRICT column refuses with a
 * constraint error that looks like any other. No row changed means no such
 * account, or an overflow. */
static const char SQL_ACCOUNT_MOVE[] = "UPDATE ledger_accounts SET balance = balance + ?2 WHERE id = ?1"
                                       " AND CASE WHEN ?2 >= 0 THEN balance <= ?3 - ?2 ELSE balance >= ?4 - ?2 END";
static const char SQL_ACCOUNT_BALANCE[] = "SELECT balance FROM ledger_accounts WHERE id = ?";
static const char SQL_TXN_INSERT[] =
    "INSERT INTO ledger_transactions (at, kind, user_id, reason, instance_id, interval_id, grant_id, topup_id,"
    " created_at, volume_id, reservation_id, app_call_id, payee_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
static const char SQL_POSTING_INSERT[] =
    "INSERT INTO ledger_postings (transaction_id, account_id, amount, grant_id) VALUES (?, ?, ?, ?)";
static const char SQL_GRANT_INSERT[] =
    "INSERT INTO credit_grants (id, user_id, source, amount, remaining, expires_at, created_at)"
    " VALUES (?, ?, ?, ?, ?, nullif(?, 0), ?)";
static const char SQL_GRANTS_SPENDABLE[] =
    "SELECT " GRANT_COLUMNS " FROM credit_grants WHERE user_id = ?1 AND remaining > 0 AND voided_at IS NULL"
    " AND (expires_at IS NULL OR expires_at > ?2) ORDER BY expires_at IS NULL, expires_at, created_at, id LIMIT ?3";
static const char SQL_GRANT_GET[] = "SELECT " GRANT_COLUMNS " FROM credit_grants WHERE id = ? AND user_id = ?";
static const char SQL_GRANTS_OF[] =
    "SELECT " GRANT_COLUMNS " FROM credit_grants WHERE user_id = ? ORDER BY created_at DESC, id LIMIT ?";
/* One user's expired grants, or (?2 NULL) those of users with nothing left
 * to bill: a user with unsettled running time spends each grant up to its
 * expiry first, so only their own billing may void it. */
static const char SQL_GRANTS_EXPIRED[] =
    "SELECT " GRANT_COLUMNS " FROM credit_grants g WHERE remaining > 0 AND voided_at IS NULL AND expires_at <= ?1"
    " AND (g.user_id = ?2 OR (?2 IS NULL AND NOT EXISTS (SELECT 1 FROM running_intervals r"
    " WHERE r.user_id = g.user_id AND r.settled = 0) AND NOT (" STORE_STORAGE_PRICED " AND EXISTS (SELECT 1"
    " FROM volumes v WHERE v.user_id = g.user_id AND v.storage_settled = 0))))"
    " ORDER BY expires_at, id LIMIT ?3";
static const char SQL_GRANT_EXPIRIES[] =
    "SELECT DISTINCT expires_at FROM credit_grants WHERE user_id = ?1 AND remaining > 0 AND voided_at IS NULL"
    " AND expires_at > ?2 AND expires_at <= ?3 ORDER BY expires_at LIMIT ?4";
static const char SQL_GRANT_SPEND[] =
    "UPDATE credit_grants SET remaining = remaining - ?2 WHERE id = ?1 AND remaining >= ?2";
/* How far usage of a type has been billed: the latest second a charge was
 * made to, or a settled interval ended at. */
static const char SQL_PRICE_BILLED_UNTIL[] =
    "SELECT coalesce(max(x), 0) FROM (SELECT max(t.at) AS x FROM ledger_transactions t"
    " JOIN running_intervals r ON r.id = t.interval_id WHERE r.gpu_model = ?1 AND t.kind = 'usage'"
    " UNION ALL SELECT max(ended_at) FROM running_intervals WHERE gpu_model = ?1 AND settled = 1)";
static const char SQL_GRANT_RESTORE[] =
    "UPDATE credit_grants SET remaining = remaining + ?2 WHERE id = ?1 AND voided_at IS NULL"
    " AND remaining + ?2 <= amount";
static const char SQL_GRANT_VOID[] =
    "UPDATE credit_grants SET remaining = 0, voided_at = ?2 WHERE id = ?1 AND voided_at IS NULL";
/* Grants voided at an expiry still ahead of ?1: the clock ran ahead when
 * they were voided. remaining is what the voids took from each, net (the
 * expiry's void and those of refunds paid back to it since). */
static const char SQL_GRANTS_VOIDED_EARLY[] =
    "SELECT g.id, g.user_id, g.source, g.amount, -coalesce((SELECT sum(p.amount) FROM ledger_postings p"
    " JOIN ledger_transactions t ON t.id = p.transaction_id WHERE p.account_id = 'grant:' || g.id"
    " AND t.kind = 'expiry'), 0), g.expires_at, g.voided_at, g.created_at FROM credit_grants g"
    " WHERE g.voided_at IS NOT NULL AND g.expires_at > ?1 ORDER BY g.expires_at, g.id LIMIT ?2";
static const char SQL_GRANT_UNVOID[] =
    "UPDATE credit_grants SET remaining = ?2, voided_at = NULL WHERE id = ?1 AND voided_at IS NOT NULL";
#define INVITE_COLUMNS                                                                                     \
    "code, amount, coalesce(credit_days, 0), coalesce(expires_at, 0), coalesce(max_uses, 0), uses, created_at," \
    " coalesce(max_uses_per_day, 0)"
static const char SQL_INVITE_GET[] = "SELECT " INVITE_COLUMNS " FROM invite_codes WHERE code = ?";
static const char SQL_INVITE_LIST[] = "SELECT " INVITE_COLUMNS " FROM invite_codes"
                                      " WHERE (created_at, code) > (?, ?) ORDER BY created_at, code LIMIT ?";
static const char SQL_INVITE_INSERT[] =
    "INSERT INTO invite_codes (code, amount, credit_days, expires_at, max_uses, created_at)"
    " VALUES (?, ?, nullif(?, 0), nullif(?, 0), nullif(?, 0), ?)";
static const char SQL_INVITE_USE[] =
    "UPDATE invite_codes SET uses = uses + 1 WHERE code = ? AND (max_uses IS NULL OR uses < max_uses)";
static const char SQL_REDEMPTION_INSERT[] =
    "INSERT INTO invite_redemptions (code, user_id, grant_id, at) VALUES (?, ?, ?, ?)";
static const char SQL_TOPUP_INSERT[] =
    "INSERT INTO topups (id, user_id, payment_id, amount, source, created_at) VALUES (?, ?, ?, ?, ?, ?)";
#define TOPUP_COLUMNS "id, user_id, payment_id, amount, source, created_at"
static const char SQL_TOPUP_BY_PAYMENT[] = "SELECT " TOPUP_COLUMNS " FROM topups WHERE payment_id = ?";
static const char SQL_TOPUP_GET[] = "SELECT " TOPUP_COLUMNS " FROM topups WHERE id = ? AND user_id = ?";
/* Users with running time or storage to bill (the union sorts and
 * removes duplicates). */
#define USERS_TO_BILL                                                                    \
    "SELECT user_id FROM running_intervals WHERE settled = 0 UNION SELECT user_id FROM" \
    " volumes WHERE storage_settled = 0 AND " STORE_STORAGE_PRICED
static const char SQL_USERS_TO_BILL[] = "SELECT user_id FROM (" USERS_TO_BILL ") ORDER BY user_id";
static const char SQL_BILLABLES[] =
    "SELECT " BILLABLE_COLUMNS " FROM running_intervals r WHERE r.user_id = ? AND r.settled = 0 ORDER BY r.id";
static const char SQL_INTERVAL_GET_OPEN[] =
    "SELECT " BILLABLE_COLUMNS " FROM running_intervals r WHERE r.instance_id = ? AND r.ended_at IS NULL";
/* The instance's last interval only: an older one cut by funds was
 * followed by a start, so the stop being seen now is not the one the cut
 * asked for, and that interval's time ran. */
static const char SQL_INTERVAL_GET_CUT_AFTER[] =
    "SELECT " BILLABLE_COLUMNS " FROM running_intervals r"
    " WHERE r.id = (SELECT max(id) FROM running_intervals WHERE instance_id = ?1) AND r.ended_at > ?2"
    " AND r.end_reason = 'funds exhausted'";
/* Net payment per user account for an interval's usage and refunds, the
 * account drawn last first, so a refund gives back in the reverse order of
 * the charges. */
static const char SQL_INTERVAL_PAYERS[] =
    "SELECT p.account_id, coalesce(max(p.grant_id), ''), -sum(p.amount), coalesce(max(g.voided_at), 0)"
    " FROM ledger_transactions t JOIN ledger_postings p ON p.transaction_id = t.id"
    " JOIN ledger_accounts a ON a.id = p.account_id LEFT JOIN credit_grants g ON g.id = p.grant_id"
    " WHERE t.interval_id = ?1 AND t.kind IN ('usage', 'refund') AND a.kind IN ('cash', 'grant')"
    " GROUP BY p.account_id HAVING -sum(p.amount) > 0 ORDER BY max(p.id) DESC";
/* ?4, when set, is where billing ended because funds ran out: an interval
 * still open or ended later is cut there. */
/* The periodic check reads every unsettled interval and the funds of every
 * user who has one in two statements, rather than a few per user. */
static const char SQL_BILLABLES_ALL[] =
    "SELECT " BILLABLE_COLUMNS " FROM running_intervals r WHERE r.settled = 0 ORDER BY r.user_id, r.id";
static const char SQL_FUNDS_TO_BILL[] =
    "SELECT u.user_id, coalesce((SELECT balance FROM ledger_accounts WHERE id = 'cash:' || u.user_id), 0),"
    " coalesce((SELECT sum(g.remaining) FROM credit_grants g WHERE g.user_id = u.user_id AND g.remaining > 0"
    "   AND g.voided_at IS NULL AND (g.expires_at IS NULL OR g.expires_at > ?1)), 0),"
    " EXISTS (SELECT 1 FROM credit_grants g WHERE g.user_id = u.user_id AND g.remaining > 0"
    "   AND g.voided_at IS NULL AND g.expires_at <= ?2)"
    " FROM (" USERS_TO_BILL ") u ORDER BY u.user_id";
/* What max_balance bounds: the cash and what is left of every grant not yet
 * voided, expired or not (billing may still spend it on usage up to its
 * expiry). Two columns, added in C where the sum is checked. */
static const char SQL_USER_HOLDINGS[] =
    "SELECT coalesce((SELECT balance FROM ledger_accounts WHERE id = 'cash:' || ?1), 0),"
    " coalesce((SELECT sum(remaining) FROM credit_grants WHERE user_id = ?1 AND remaining > 0"
    " AND voided_at IS NULL), 0)";
static const char SQL_USER_FUNDS[] =
    "SELECT coalesce((SELECT balance FROM ledger_accounts WHERE id = 'cash:' || ?1), 0),"
    " coalesce((SELECT sum(remaining) FROM credit_grants WHERE user_id = ?1 AND remaining > 0"
    " AND voided_at IS NULL AND (expires_at IS NULL OR expires_at > ?2)), 0)";
static const char SQL_INTERVAL_BILLED[] =
    "UPDATE running_intervals SET billed = ?2, settled = ?3,"
    " end_reason = CASE WHEN ?4 IS NOT NULL AND (ended_at IS NULL OR ended_at > ?4) THEN 'funds exhausted'"
    " ELSE end_reason END,"
    " ended_at = CASE WHEN ?4 IS NOT NULL AND (ended_at IS NULL OR ended_at > ?4) THEN max(started_at, ?4)"
    " ELSE ended_at END WHERE id = ?1";

static void read_price_point(sqlite3_stmt *st, void *row)
{
    struct price_point *p = row;
    p->effective_at = sqlite3_column_int64(st, 0);
    p->card_hour = sqlite3_column_int64(st, 1);
}

int store_prices(struct store *s, const char *gpu_model, struct price_point **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_PRICES);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_price_point, "prices");
    *out = rows;
    return rc;
}

int64_t store_price_billed_until(struct store *s, const char *gpu_model)
{
    return store_int64_by_text(s, SQL_PRICE_BILLED_UNTIL, gpu_model, "price billed until");
}

int store_price_insert(struct store *s, const char *gpu_model, int64_t effective_at, int64_t card_hour, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_PRICE_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, effective_at);
    sqlite3_bind_int64(st, 3, card_hour);
    sqlite3_bind_int64(st, 4, now);
    return store_step_write(s, st, "insert price");
}

static void read_price_row(sqlite3_stmt *st, void *row)
{
    struct price_row *p = row;
    store_column_text(p->gpu_model, sizeof p->gpu_model, st, 0);
    p->effective_at = sqlite3_column_int64(st, 1);
    p->card_hour = sqlite3_column_int64(st, 2);
    p->created_at = sqlite3_column_int64(st, 3);
}

int store_price_history(struct store *s, const char *gpu_model, struct price_row *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_PRICE_HISTORY);
    if (!st)
        return STORE_ERROR;
    if (gpu_model)
        sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_price_row, "price history");
}

/* Creates a user's cash or grant account on first use. */
static int account_ensure(struct store *s, const char *account_id, const char *user_id)
{
    const char *kind = strncmp(account_id, "cash:", 5) == 0    ? "cash"
                       : strncmp(account_id, "grant:", 6) == 0 ? "grant"
                                                               : NULL;
    if (!kind)
        return STORE_OK; /* platform accounts exist from the migration */
    sqlite3_stmt *st = store_stmt(s, SQL_ACCOUNT_ENSURE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, account_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, user_id, -1, SQLITE_STATIC);
    return store_step_write(s, st, "ensure account");
}

/* Why a balance did not move although its account was ensured: the sum
 * would overflow 64 bits, or (a platform account the migration should have
 * made) it does not exist. Either way the whole transaction fails, logged
 * with the account, and is never taken for a conflict. */
static int move_refused(struct store *s, const struct ledger_leg *leg)
{
    sqlite3_stmt *st = store_stmt(s, SQL_ACCOUNT_BALANCE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, leg->account_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        log_error("store: ledger account %s: balance %lld %+lld overflows 64-bit integers; transaction refused",
                  leg->account_id, (long long)sqlite3_column_int64(st, 0), (long long)leg->amount);
    else if (rc == SQLITE_DONE)
        log_error("store: ledger account %s does not exist; transaction refused", leg->account_id);
    else
        store_rc_from_sqlite(s, rc, "balance");
    sqlite3_reset(st);
    return STORE_ERROR;
}

void store_legs_balanced(const struct ledger_leg *legs, size_t n)
{
    __int128 sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += legs[i].amount;
    /* Every caller builds its legs to balance: one that does not is a bug
     * that would create or destroy money. */
    ASSERT(sum == 0 && n >= 2);
}

int store_ledger_insert(struct store *s, const struct ledger_entry *e, int64_t now, int64_t *id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_TXN_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, e->at);
    sqlite3_bind_text(st, 2, e->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, e->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, e->reason, -1, SQLITE_STATIC);
    if (e->instance_id)
        sqlite3_bind_text(st, 5, e->instance_id, -1, SQLITE_STATIC);
    if (e->interval_id)
        sqlite3_bind_int64(st, 6, e->interval_id);
    if (e->grant_id)
        sqlite3_bind_text(st, 7, e->grant_id, -1, SQLITE_STATIC);
    if (e->topup_id)
        sqlite3_bind_text(st, 8, e->topup_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 9, now);
    if (e->volume_id)
        sqlite3_bind_text(st, 10, e->volume_id, -1, SQLITE_STATIC);
    if (e->reservation_id)
        sqlite3_bind_text(st, 11, e->reservation_id, -1, SQLITE_STATIC);
    if (e->app_call_id)
        sqlite3_bind_text(st, 12, e->app_call_id, -1, SQLITE_STATIC);
    if (e->payee_id)
        sqlite3_bind_text(st, 13, e->payee_id, -1, SQLITE_STATIC);
    int rc = store_step_write(s, st, "insert ledger transaction");
    *id = sqlite3_last_insert_rowid(store_db(s));
    return rc;
}

int store_posting_insert(struct store *s, int64_t txn, const struct ledger_leg *leg)
{
    sqlite3_stmt *st = store_stmt(s, SQL_POSTING_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, txn);
    sqlite3_bind_text(st, 2, leg->account_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, leg->amount);
    if (leg->grant_id[0])
        sqlite3_bind_text(st, 4, leg->grant_id, -1, SQLITE_STATIC);
    return store_step_write(s, st, "insert posting");
}

int store_ledger_post(struct store *s, const struct ledger_entry *e, const struct ledger_leg *legs, size_t n,
                      int64_t now)
{
    store_legs_balanced(legs, n); /* before touching anything */
    int64_t txn;
    int rc = store_ledger_insert(s, e, now, &txn);
    if (rc != STORE_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (legs[i].amount == 0)
            continue;
        /* The account is created on its first posting: moved first, and
         * only if that moved nothing, made and moved. */
        for (int attempt = 0;; attempt++) {
            sqlite3_stmt *st = store_stmt(s, SQL_ACCOUNT_MOVE);
            if (!st)
                return STORE_ERROR;
            sqlite3_bind_text(st, 1, legs[i].account_id, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 2, legs[i].amount);
            sqlite3_bind_int64(st, 3, INT64_MAX);
            sqlite3_bind_int64(st, 4, INT64_MIN);
            /* A user account below zero breaks its CHECK: refused, not
             * clamped. Only that CHECK is a conflict; any other constraint
             * failure is an error, logged. */
            rc = sqlite3_step(st);
            sqlite3_reset(st);
            if (rc == SQLITE_CONSTRAINT_CHECK)
                return STORE_CONFLICT;
            if ((rc & 0xff) == SQLITE_CONSTRAINT) {
                log_error("store: ledger account %s: %s", legs[i].account_id, sqlite3_errmsg(store_db(s)));
                return STORE_ERROR;
            }
            if ((rc = store_rc_from_sqlite(s, rc, "move balance")) != STORE_OK)
                return rc;
            if (sqlite3_changes(store_db(s)) == 1)
                break;
            if (attempt > 0)
                return move_refused(s, &legs[i]);
            if ((rc = account_ensure(s, legs[i].account_id, e->user_id)) != STORE_OK)
                return rc;
        }
        if ((rc = store_posting_insert(s, txn, &legs[i])) != STORE_OK)
            return rc;
    }
    return STORE_OK;
}

int64_t store_account_balance(struct store *s, const char *account_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_ACCOUNT_BALANCE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, account_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int64_t v = rc == SQLITE_ROW    ? sqlite3_column_int64(st, 0)
                : rc == SQLITE_DONE ? 0
                                    : store_rc_from_sqlite(s, rc, "balance");
    sqlite3_reset(st);
    return v;
}

int store_grant_insert(struct store *s, const struct grant *g)
{
    sqlite3_stmt *st = store_stmt(s, SQL_GRANT_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, g->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, g->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, g->source, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, g->amount);
    sqlite3_bind_int64(st, 5, g->remaining);
    sqlite3_bind_int64(st, 6, g->expires_at);
    sqlite3_bind_int64(st, 7, g->created_at);
    return store_step_write(s, st, "insert grant");
}

void store_read_grant(sqlite3_stmt *st, void *row)
{
    struct grant *g = row;
    store_column_text(g->id, sizeof g->id, st, 0);
    store_column_text(g->user_id, sizeof g->user_id, st, 1);
    store_column_text(g->source, sizeof g->source, st, 2);
    g->amount = sqlite3_column_int64(st, 3);
    g->remaining = sqlite3_column_int64(st, 4);
    g->expires_at = sqlite3_column_int64(st, 5);
    g->voided_at = sqlite3_column_int64(st, 6);
    g->created_at = sqlite3_column_int64(st, 7);
}

int store_grants_spendable(struct store *s, const char *user_id, int64_t at, struct grant *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_GRANTS_SPENDABLE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, at);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, store_read_grant, "spendable grants");
}

int store_grant_get(struct store *s, const char *user_id, const char *id, struct grant *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_GRANT_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, store_read_grant, "grant");
}

int store_grants_of(struct store *s, const char *user_id, struct grant *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_GRANTS_OF);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, store_read_grant, "grants of user");
}

int store_grants_expired(struct store *s, const char *user_id, int64_t at, struct grant *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_GRANTS_EXPIRED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, at);
    if (user_id)
        sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, store_read_grant, "expired grants");
}

static void read_int(sqlite3_stmt *st, void *row)
{
    *(int64_t *)row = sqlite3_column_int64(st, 0);
}

int store_grant_expiries(struct store *s, const char *user_id, int64_t after, int64_t until, int64_t *out, size_t max,
                         size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_GRANT_EXPIRIES);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after);
    sqlite3_bind_int64(st, 3, until);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_int, "grant expiries");
}

int store_grant_spend(struct store *s, const char *id, int64_t amount)
{
    sqlite3_stmt *st = store_stmt(s, SQL_GRANT_SPEND);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, amount);
    int rc = store_step_change(s, st, "spend grant");
    return rc == STORE_NOT_FOUND ? STORE_CONFLICT : rc;
}

int store_grant_restore(struct store *s, const char *id, int64_t amount)
{
    sqlite3_stmt *st = store_stmt(s, SQL_GRANT_RESTORE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, amount);
    int rc = store_step_change(s, st, "restore grant");
    return rc == STORE_NOT_FOUND ? STORE_CONFLICT : rc;
}

int store_grant_void(struct store *s, const char *id, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_GRANT_VOID);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, at);
    return store_step_change(s, st, "void grant");
}

int store_grants_voided_early(struct store *s, int64_t at, struct grant *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_GRANTS_VOIDED_EARLY);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, at);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, store_read_grant, "grants voided early");
}

int store_grant_unvoid(struct store *s, const char *id, int64_t remaining)
{
    sqlite3_stmt *st = store_stmt(s, SQL_GRANT_UNVOID);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, remaining);
    return store_step_change(s, st, "unvoid grant");
}

static void read_invite(sqlite3_stmt *st, void *row)
{
    struct invite_code *c = row;
    store_column_text(c->code, sizeof c->code, st, 0);
    c->amount = sqlite3_column_int64(st, 1);
    c->credit_days = sqlite3_column_int64(st, 2);
    c->expires_at = sqlite3_column_int64(st, 3);
    c->max_uses = sqlite3_column_int64(st, 4);
    c->uses = sqlite3_column_int64(st, 5);
    c->created_at = sqlite3_column_int64(st, 6);
    c->max_uses_per_day = sqlite3_column_int64(st, 7);
}

int store_invite_get(struct store *s, const char *code, struct invite_code *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INVITE_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_invite, "get invite code");
}

int store_invite_list(struct store *s, int64_t after_created, const char *after_code, size_t max,
                      struct invite_code **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_INVITE_LIST);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, after_created);
    sqlite3_bind_text(st, 2, after_code ? after_code : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)max);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_invite, "list invite codes");
    *out = rows;
    return rc;
}

int store_invite_insert(struct store *s, const struct invite_code *c)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INVITE_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, c->code, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, c->amount);
    sqlite3_bind_int64(st, 3, c->credit_days);
    sqlite3_bind_int64(st, 4, c->expires_at);
    sqlite3_bind_int64(st, 5, c->max_uses);
    sqlite3_bind_int64(st, 6, c->created_at);
    return store_step_write(s, st, "insert invite code");
}

int store_invite_redeem(struct store *s, const char *code, const char *user_id, const char *grant_id, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_REDEMPTION_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, grant_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, at);
    int rc = store_step_write(s, st, "insert redemption");
    if (rc != STORE_OK)
        return rc;
    st = store_stmt(s, SQL_INVITE_USE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    rc = store_step_change(s, st, "use invite code");
    return rc == STORE_NOT_FOUND ? STORE_NOT_FOUND : rc; /* used up */
}

int store_topup_insert(struct store *s, const struct topup *t)
{
    sqlite3_stmt *st = store_stmt(s, SQL_TOPUP_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, t->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, t->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, t->payment_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, t->amount);
    sqlite3_bind_text(st, 5, t->source, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, t->created_at);
    return store_step_write(s, st, "insert topup");
}

static void read_topup(sqlite3_stmt *st, void *row)
{
    struct topup *t = row;
    store_column_text(t->id, sizeof t->id, st, 0);
    store_column_text(t->user_id, sizeof t->user_id, st, 1);
    store_column_text(t->payment_id, sizeof t->payment_id, st, 2);
    t->amount = sqlite3_column_int64(st, 3);
    store_column_text(t->source, sizeof t->source, st, 4);
    t->created_at = sqlite3_column_int64(st, 5);
}

int store_topup_by_payment(struct store *s, const char *payment_id, struct topup *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_TOPUP_BY_PAYMENT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, payment_id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_topup, "topup by payment");
}

int store_topup_get(struct store *s, const char *user_id, const char *id, struct topup *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_TOPUP_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_topup, "topup");
}

int store_users_to_bill(struct store *s, char (**out)[ID_MAX], size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USERS_TO_BILL);
    if (!st)
        return STORE_ERROR;
    void *rows;
    int rc = store_collect(s, st, ID_MAX, &rows, n, store_read_id, "users to bill");
    *out = rows;
    return rc;
}

void store_read_billable(sqlite3_stmt *st, void *row)
{
    struct billable *b = row;
    b->id = sqlite3_column_int64(st, 0);
    store_column_text(b->instance_id, sizeof b->instance_id, st, 1);
    store_column_text(b->user_id, sizeof b->user_id, st, 2);
    store_column_text(b->gpu_model, sizeof b->gpu_model, st, 3);
    b->card_count = sqlite3_column_int64(st, 4);
    b->started_at = sqlite3_column_int64(st, 5);
    b->ended_at = sqlite3_column_int64(st, 6);
    b->billed = sqlite3_column_int64(st, 7);
    b->confirmed_until = sqlite3_column_int64(st, 8);
}

int store_interval_get_open(struct store *s, const char *instance_id, struct billable *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INTERVAL_GET_OPEN);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, store_read_billable, "open interval");
}

int store_interval_get_cut_after(struct store *s, const char *instance_id, int64_t after, struct billable *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INTERVAL_GET_CUT_AFTER);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after);
    return store_read_one(s, st, out, store_read_billable, "interval cut by funds");
}

static void read_payer(sqlite3_stmt *st, void *row)
{
    struct interval_payer *p = row;
    store_column_text(p->account_id, sizeof p->account_id, st, 0);
    store_column_text(p->grant_id, sizeof p->grant_id, st, 1);
    p->paid = sqlite3_column_int64(st, 2);
    p->grant_voided_at = sqlite3_column_int64(st, 3);
}

int store_interval_payers(struct store *s, int64_t interval_id, struct interval_payer **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_INTERVAL_PAYERS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, interval_id);
    return store_collect(s, st, sizeof **out, (void **)out, n, read_payer, "interval payers");
}

int store_billables(struct store *s, const char *user_id, struct billable **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_BILLABLES);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    return store_collect(s, st, sizeof **out, (void **)out, n, store_read_billable, "billables");
}

int store_interval_billed(struct store *s, int64_t id, int64_t billed, int settled, int64_t exhausted_at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INTERVAL_BILLED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, billed);
    sqlite3_bind_int(st, 3, settled);
    if (exhausted_at >= 0)
        sqlite3_bind_int64(st, 4, exhausted_at);
    return store_step_change(s, st, "interval billed");
}

int store_billables_all(struct store *s, struct billable **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_BILLABLES_ALL);
    if (!st)
        return STORE_ERROR;
    return store_collect(s, st, sizeof **out, (void **)out, n, store_read_billable, "all billables");
}

void store_read_user_funds(sqlite3_stmt *st, void *row)
{
    struct user_funds *f = row;
    store_column_text(f->user_id, sizeof f->user_id, st, 0);
    f->cash = sqlite3_column_int64(st, 1);
    f->credit = sqlite3_column_int64(st, 2);
    f->expired_grants = sqlite3_column_int(st, 3);
}

int store_funds_to_bill(struct store *s, int64_t at, struct user_funds **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_FUNDS_TO_BILL);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, at - 1);
    sqlite3_bind_int64(st, 2, at);
    return store_collect(s, st, sizeof **out, (void **)out, n, store_read_user_funds, "funds to bill");
}

int store_user_funds(struct store *s, const char *user_id, int64_t at, int64_t *cash, int64_t *credit)
{
    *cash = *credit = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_USER_FUNDS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, at);
    int rc = sqlite3_step(st), result = STORE_OK;
    if (rc == SQLITE_ROW) {
        *cash = sqlite3_column_int64(st, 0);
        *credit = sqlite3_column_int64(st, 1);
    } else {
        result = store_rc_from_sqlite(s, rc, "user funds");
    }
    sqlite3_reset(st);
    return result;
}

int store_user_holdings(struct store *s, const char *user_id, int64_t *cash, int64_t *credit)
{
    *cash = *credit = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_USER_HOLDINGS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st), result = STORE_OK;
    if (rc == SQLITE_ROW) {
        *cash = sqlite3_column_int64(st, 0);
        *credit = sqlite3_column_int64(st, 1);
    } else {
        result = store_rc_from_sqlite(s, rc, "user holdings");
    }
    sqlite3_reset(st);
    return result;
}
