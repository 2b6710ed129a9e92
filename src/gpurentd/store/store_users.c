/* store_users.c: SQL for the users table. */
#include "store/store_sql.h"

#include <stdio.h>
#include <string.h>

static const char SQL_USER_INSERT[] =
    "INSERT INTO users (id, email, password_hash, role, status, invite_code, created_at, email_key, email_display,"
    " email_verified_at, trial_at, signup_address) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
static const char SQL_USER_BY_ID[] =
    "SELECT " USER_COLUMNS " FROM users WHERE id = ?";
static const char SQL_USER_BY_EMAIL[] =
    "SELECT " USER_COLUMNS " FROM users WHERE email_key = ?";
static const char SQL_USER_BY_LOWER[] = "SELECT " USER_COLUMNS " FROM users WHERE email = ?";
static const char SQL_USER_COUNT_ADMINS[] = "SELECT count(*) FROM users WHERE role = 'admin'";
static const char SQL_USER_LOW_NOTICED[] = "SELECT low_balance_noticed_at IS NOT NULL FROM users WHERE id = ?";
/* Writes the row only when the mark changes: a top-up or grant of a user
 * who was never warned writes nothing here. */
static const char SQL_USER_SET_LOW_NOTICED[] =
    "UPDATE users SET low_balance_noticed_at = ?2 WHERE id = ?1 AND low_balance_noticed_at IS NOT ?2";

int store_user_insert(struct store *s, const struct user *u)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USER_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, u->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, u->email, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, u->password_hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, u->role == ROLE_ADMIN ? "admin" : "user", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, u->active ? "active" : "disabled", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, u->invite_code, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, u->created_at);
    sqlite3_bind_text(st, 8, u->email_key[0] ? u->email_key : u->email, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, u->email_display[0] ? u->email_display : u->email, -1, SQLITE_STATIC);
    if (u->email_verified_at)
        sqlite3_bind_int64(st, 10, u->email_verified_at);
    else
        sqlite3_bind_null(st, 10);
    if (u->trial_at)
        sqlite3_bind_int64(st, 11, u->trial_at);
    else
        sqlite3_bind_null(st, 11);
    sqlite3_bind_text(st, 12, u->signup_address, -1, SQLITE_STATIC);
    return store_step_write(s, st, "insert user");
}

void store_read_user(sqlite3_stmt *st, void *row)
{
    struct user *out = row;
    memset(out, 0, sizeof *out);
    store_column_text(out->id, sizeof out->id, st, 0);
    store_column_text(out->email, sizeof out->email, st, 1);
    store_column_text(out->password_hash, sizeof out->password_hash, st, 2);
    out->role = strcmp((const char *)sqlite3_column_text(st, 3), "admin") == 0 ? ROLE_ADMIN : ROLE_USER;
    out->active = strcmp((const char *)sqlite3_column_text(st, 4), "active") == 0;
    store_column_text(out->invite_code, sizeof out->invite_code, st, 5);
    out->created_at = sqlite3_column_int64(st, 6);
    store_column_text(out->email_key, sizeof out->email_key, st, 7);
    store_column_text(out->email_display, sizeof out->email_display, st, 8);
    out->email_verified_at = sqlite3_column_int64(st, 9);
    out->trial_at = sqlite3_column_int64(st, 10);
    store_column_text(out->signup_address, sizeof out->signup_address, st, 11);
}

static int user_get(struct store *s, const char *sql, const char *key, struct user *out)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int result;
    if (rc == SQLITE_ROW) {
        store_read_user(st, out);
        result = STORE_OK;
    } else if (rc == SQLITE_DONE) {
        result = STORE_NOT_FOUND;
    } else {
        result = store_rc_from_sqlite(s, rc, "get user");
    }
    sqlite3_reset(st);
    return result;
}

int store_user_get(struct store *s, const char *id, struct user *out)
{
    return user_get(s, SQL_USER_BY_ID, id, out);
}

int store_user_get_by_email(struct store *s, const char *email, struct user *out)
{
    return user_get(s, SQL_USER_BY_EMAIL, email, out);
}

int store_user_get_by_login(struct store *s, const char *email_key, const char *lower, struct user *out)
{
    int rc = user_get(s, SQL_USER_BY_EMAIL, email_key, out);
    return rc == STORE_NOT_FOUND ? user_get(s, SQL_USER_BY_LOWER, lower, out) : rc;
}

int64_t store_user_count_admins(struct store *s)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USER_COUNT_ADMINS);
    if (!st)
        return STORE_ERROR;
    int rc = sqlite3_step(st);
    int64_t n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : store_rc_from_sqlite(s, rc, "count admins");
    sqlite3_reset(st);
    return n;
}

int store_user_low_balance_noticed(struct store *s, const char *user_id, int *noticed)
{
    int64_t v = store_int64_by_text(s, SQL_USER_LOW_NOTICED, user_id, "low balance notice");
    if (v < 0)
        return (int)v;
    *noticed = v == 1;
    return STORE_OK;
}

int store_user_set_low_balance_noticed(struct store *s, const char *user_id, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USER_SET_LOW_NOTICED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    if (at)
        sqlite3_bind_int64(st, 2, at);
    else
        sqlite3_bind_null(st, 2);
    int rc = store_rc_from_sqlite(s, sqlite3_step(st), "mark low balance notice");
    sqlite3_reset(st);
    return rc;
}
