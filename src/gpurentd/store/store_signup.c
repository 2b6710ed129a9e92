/* store_signup.c: SQL for what stands between a sign-up and its trial
 * credit (migration 0021): verification codes, the mail outbox, recent
 * sign-ups by address, suspension, and invite codes' per-day caps. */
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_VERIFY_INSERT[] =
    "INSERT INTO email_verifications (token_hash, user_id, created_at, expires_at) VALUES (?, ?, ?, ?)";
static const char SQL_VERIFY_GET[] =
    "SELECT user_id, expires_at, coalesce(used_at, 0) FROM email_verifications WHERE token_hash = ?";
static const char SQL_VERIFY_USE[] =
    "UPDATE email_verifications SET used_at = ? WHERE token_hash = ? AND used_at IS NULL";
static const char SQL_USER_VERIFIED[] =
    "UPDATE users SET email_verified_at = ? WHERE id = ? AND email_verified_at IS NULL";
static const char SQL_USER_TRIAL[] = "UPDATE users SET trial_at = ? WHERE id = ? AND trial_at IS NULL";
static const char SQL_USER_ACTIVE[] = "UPDATE users SET status = ? WHERE id = ?";
static const char SQL_USER_RUNNING[] =
    "SELECT id FROM instances WHERE user_id = ? AND desired = 'running' ORDER BY id";
static const char SQL_SIGNUPS_ALL[] =
    "SELECT " USER_COLUMNS " FROM users WHERE signup_address != '' ORDER BY created_at DESC, rowid DESC LIMIT ?";
static const char SQL_SIGNUPS_BY_ADDRESS[] =
    "SELECT " USER_COLUMNS " FROM users WHERE signup_address = ? ORDER BY created_at DESC, rowid DESC LIMIT ?";
static const char SQL_OUTBOX_INSERT[] =
    "INSERT INTO outbox (user_id, to_addr, subject, body, created_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?)";
static const char SQL_OUTBOX_NEXT[] =
    "SELECT id, to_addr, subject, body, attempts FROM outbox"
    " WHERE sent_at IS NULL AND failed_at IS NULL AND next_attempt_at <= ? ORDER BY next_attempt_at, id LIMIT 1";
static const char SQL_OUTBOX_SENT[] =
    "UPDATE outbox SET sent_at = ?, attempts = attempts + 1, body = '', last_error = '' WHERE id = ?";
static const char SQL_OUTBOX_RETRY[] =
    "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = ?, failed_at = ?, last_error = ? WHERE id = ?";
static const char SQL_OUTBOX_PENDING[] = "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL";
static const char SQL_INVITE_DAY_CAP[] = "SELECT coalesce(max_uses_per_day, 0) FROM invite_codes WHERE code = ?";
static const char SQL_INVITE_SET_DAY_CAP[] = "UPDATE invite_codes SET max_uses_per_day = ? WHERE code = ?";
static const char SQL_INVITE_REDEEMED[] = "SELECT count(*) FROM invite_redemptions WHERE code = ? AND user_id = ?";
static const char SQL_INVITE_USES_SINCE[] = "SELECT count(*) FROM invite_redemptions WHERE code = ? AND at >= ?";

int store_verification_insert(struct store *s, const char *token_hash, const char *user_id, int64_t at,
                              int64_t expires_at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_VERIFY_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, token_hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, at);
    sqlite3_bind_int64(st, 4, expires_at);
    return store_step_write(s, st, "insert email verification");
}

static void read_verification(sqlite3_stmt *st, void *row)
{
    struct email_verification *v = row;
    store_column_text(v->user_id, sizeof v->user_id, st, 0);
    v->expires_at = sqlite3_column_int64(st, 1);
    v->used_at = sqlite3_column_int64(st, 2);
}

int store_verification_get(struct store *s, const char *token_hash, struct email_verification *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_VERIFY_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, token_hash, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_verification, "get email verification");
}

int store_verification_use(struct store *s, const char *token_hash, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_VERIFY_USE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, at);
    sqlite3_bind_text(st, 2, token_hash, -1, SQLITE_STATIC);
    return store_step_change(s, st, "use email verification");
}

static int set_at(struct store *s, const char *sql, const char *user_id, int64_t at, const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, at);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    int rc = store_step_change(s, st, what);
    return rc == STORE_NOT_FOUND ? STORE_CONFLICT : rc;
}

int store_user_set_verified(struct store *s, const char *user_id, int64_t at)
{
    return set_at(s, SQL_USER_VERIFIED, user_id, at, "verify user");
}

int store_user_set_trial(struct store *s, const char *user_id, int64_t at)
{
    return set_at(s, SQL_USER_TRIAL, user_id, at, "mark trial");
}

int store_user_set_active(struct store *s, const char *user_id, int active)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USER_ACTIVE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, active ? "active" : "disabled", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    return store_step_change(s, st, "set user status");
}

int store_user_running_instances(struct store *s, const char *user_id, char (**ids)[ID_MAX], size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USER_RUNNING);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    void *out = NULL;
    int rc = store_collect(s, st, ID_MAX, &out, n, store_read_id, "list running instances of a user");
    *ids = out;
    return rc;
}

int store_signups_list(struct store *s, const char *address, size_t limit, struct user **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, address ? SQL_SIGNUPS_BY_ADDRESS : SQL_SIGNUPS_ALL);
    if (!st)
        return STORE_ERROR;
    int i = 1;
    if (address)
        sqlite3_bind_text(st, i++, address, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, i, (int64_t)limit);
    void *rows = NULL;
    int rc = store_collect(s, st, sizeof(struct user), &rows, n, store_read_user, "list sign-ups");
    *out = rows;
    return rc;
}

int store_outbox_insert(struct store *s, const char *user_id, const char *to, const char *subject, const char *body,
                        int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_OUTBOX_INSERT);
    if (!st)
        return STORE_ERROR;
    if (user_id)
        sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 1);
    sqlite3_bind_text(st, 2, to, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, subject, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, body, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, at);
    sqlite3_bind_int64(st, 6, at);
    return store_step_write(s, st, "queue mail");
}

int store_outbox_next(struct store *s, int64_t now, struct outbox_mail *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_OUTBOX_NEXT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, now);
    int rc = sqlite3_step(st), result = STORE_OK;
    memset(out, 0, sizeof *out);
    if (rc == SQLITE_ROW) {
        out->id = sqlite3_column_int64(st, 0);
        store_column_text(out->to, sizeof out->to, st, 1);
        store_column_text(out->subject, sizeof out->subject, st, 2);
        const char *b = (const char *)sqlite3_column_text(st, 3);
        out->body = strdup(b ? b : "");
        out->attempts = sqlite3_column_int64(st, 4);
        if (!out->body)
            result = STORE_ERROR;
    } else if (rc == SQLITE_DONE) {
        result = STORE_NOT_FOUND;
    } else {
        result = store_rc_from_sqlite(s, rc, "next mail");
    }
    sqlite3_reset(st);
    return result;
}

int store_outbox_sent(struct store *s, int64_t id, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_OUTBOX_SENT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, at);
    sqlite3_bind_int64(st, 2, id);
    return store_step_write(s, st, "mark mail sent");
}

int store_outbox_retry(struct store *s, int64_t id, int64_t next_at, int failed, int64_t at, const char *error)
{
    sqlite3_stmt *st = store_stmt(s, SQL_OUTBOX_RETRY);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, next_at);
    if (failed)
        sqlite3_bind_int64(st, 2, at);
    else
        sqlite3_bind_null(st, 2);
    sqlite3_bind_text(st, 3, error, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, id);
    return store_step_write(s, st, "mark mail failed");
}

static int count(struct store *s, sqlite3_stmt *st, int64_t *n, const char *what)
{
    int rc = sqlite3_step(st), result = STORE_OK;
    if (rc == SQLITE_ROW)
        *n = sqlite3_column_int64(st, 0);
    else if (rc == SQLITE_DONE)
        result = STORE_NOT_FOUND;
    else
        result = store_rc_from_sqlite(s, rc, what);
    sqlite3_reset(st);
    return result;
}

int64_t store_outbox_pending(struct store *s)
{
    sqlite3_stmt *st = store_stmt(s, SQL_OUTBOX_PENDING);
    int64_t n = 0;
    if (!st)
        return STORE_ERROR;
    int rc = count(s, st, &n, "count pending mail");
    return rc == STORE_OK ? n : rc;
}

int store_invite_day_cap(struct store *s, const char *code, int64_t *cap)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INVITE_DAY_CAP);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    return count(s, st, cap, "get invite day cap");
}

int store_invite_set_day_cap(struct store *s, const char *code, int64_t cap)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INVITE_SET_DAY_CAP);
    if (!st)
        return STORE_ERROR;
    if (cap > 0)
        sqlite3_bind_int64(st, 1, cap);
    else
        sqlite3_bind_null(st, 1);
    sqlite3_bind_text(st, 2, code, -1, SQLITE_STATIC);
    return store_step_change(s, st, "set invite day cap");
}

int store_invite_uses_since(struct store *s, const char *code, int64_t since, int64_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INVITE_USES_SINCE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, since);
    return count(s, st, n, "count invite uses");
}

int store_invite_redeemed(struct store *s, const char *code, const char *user_id, int64_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INVITE_REDEEMED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    return count(s, st, n, "count own redemptions");
}
