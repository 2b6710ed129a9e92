/* store_resets.c: SQL for password reset codes and the account's own
 * security record (migration 0050): one live code per account, replaced
 * by a new request, counted on every wrong try and deleted when used or
 * worn out; account_events rows only ever added. */
#include "store/store_sql.h"

#include <string.h>

static const char SQL_RESET_PUT[] =
    "INSERT INTO password_resets (user_id, code_hash, created_at, expires_at, failures, requested_from)"
    " VALUES (?1, ?2, ?3, ?4, 0, ?5) ON CONFLICT (user_id) DO UPDATE SET code_hash = ?2, created_at = ?3,"
    " expires_at = ?4, failures = 0, requested_from = ?5";
static const char SQL_RESET_GET[] =
    "SELECT code_hash, created_at, expires_at, failures FROM password_resets WHERE user_id = ?";
static const char SQL_RESET_FAIL[] = "UPDATE password_resets SET failures = failures + 1 WHERE user_id = ?";
static const char SQL_RESET_DELETE[] = "DELETE FROM password_resets WHERE user_id = ?";
static const char SQL_EVENT_INSERT[] =
    "INSERT INTO account_events (at, user_id, event, client_address, detail) VALUES (?, ?, ?, ?, ?)";

int store_reset_put(struct store *s, const char *user_id, const char *code_hash, int64_t at, int64_t expires_at,
                    const char *from)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESET_PUT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, code_hash, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, at);
    sqlite3_bind_int64(st, 4, expires_at);
    sqlite3_bind_text(st, 5, from, -1, SQLITE_STATIC);
    return store_step_write(s, st, "put password reset");
}

static void read_reset(sqlite3_stmt *st, void *row)
{
    struct password_reset *r = row;
    store_column_text(r->code_hash, sizeof r->code_hash, st, 0);
    r->created_at = sqlite3_column_int64(st, 1);
    r->expires_at = sqlite3_column_int64(st, 2);
    r->failures = sqlite3_column_int64(st, 3);
}

int store_reset_get(struct store *s, const char *user_id, struct password_reset *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = store_stmt(s, SQL_RESET_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_reset, "get password reset");
}

static int by_user(struct store *s, const char *sql, const char *user_id, const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    return store_step_change(s, st, what);
}

int store_reset_fail(struct store *s, const char *user_id)
{
    return by_user(s, SQL_RESET_FAIL, user_id, "count a wrong reset code");
}

int store_reset_delete(struct store *s, const char *user_id)
{
    return by_user(s, SQL_RESET_DELETE, user_id, "delete password reset");
}

int store_account_event_insert(struct store *s, int64_t at, const char *user_id, const char *event, const char *from,
                               const char *detail)
{
    sqlite3_stmt *st = store_stmt(s, SQL_EVENT_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, at);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, event, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, from, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, detail, -1, SQLITE_STATIC);
    return store_step_write(s, st, "insert account event");
}
