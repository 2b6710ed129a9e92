/* store_api_keys.c: SQL for the api_keys table, and a user's password hash. */
#include "store/store_sql.h"

#include <stdio.h>
#include <string.h>

static const char SQL_KEY_INSERT[] =
    "INSERT INTO api_keys (id, user_id, name, secret_hash, created_at, expires_at) VALUES (?, ?, ?, ?, ?, nullif(?, 0))";
#define KEY_COLUMNS                                                                                 \
    "k.id, k.user_id, k.name, k.secret_hash, k.created_at, coalesce(k.revoked_at, 0), coalesce(k.expires_at, 0)," \
    " coalesce(k.last_used_at, 0)"
static const char SQL_KEY_GET[] = "SELECT " KEY_COLUMNS " FROM api_keys k WHERE k.id = ?";
/* A request's authentication reads the key and its owner's standing in one
 * statement; NULLs where the key has no owner row. */
static const char SQL_KEY_AUTH[] = "SELECT " KEY_COLUMNS ", u.role = 'admin', u.status = 'active'"
                                   " FROM api_keys k LEFT JOIN users u ON u.id = k.user_id WHERE k.id = ?";
static const char SQL_KEY_LIST[] = "SELECT " KEY_COLUMNS " FROM api_keys k"
                                   " WHERE k.user_id = ? AND (k.created_at, k.id) > (?, ?) ORDER BY k.created_at, k.id LIMIT ?";
static const char SQL_KEY_TOUCH[] =
    "UPDATE api_keys SET last_used_at = ?2 WHERE id = ?1 AND (last_used_at IS NULL OR last_used_at <= ?2 - 60)";
static const char SQL_KEYS_REVOKE_ALL[] =
    "UPDATE api_keys SET revoked_at = ?2 WHERE user_id = ?1 AND revoked_at IS NULL AND id IS NOT ?3"
    " AND (?4 = 0 OR expires_at IS NOT NULL)";
static const char SQL_KEYS_LIVE[] = "SELECT count(*) FROM api_keys WHERE user_id = ?1 AND revoked_at IS NULL"
                                    " AND (expires_at IS NULL OR expires_at > ?2)";
static const char SQL_KEYS_REVOKE_OLDEST_LOGINS[] =
    "UPDATE api_keys SET revoked_at = ?2 WHERE id IN (SELECT id FROM api_keys WHERE user_id = ?1 AND revoked_at IS NULL"
    " AND expires_at > ?2 ORDER BY created_at, id LIMIT ?3)";
static const char SQL_USER_PASSWORD[] = "UPDATE users SET password_hash = ?2 WHERE id = ?1";
static const char SQL_KEY_REVOKE[] =
    "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ? AND user_id = ?";

static void read_row(sqlite3_stmt *st, void *row)
{
    struct api_key *k = row;
    snprintf(k->id, sizeof k->id, "%s", (const char *)sqlite3_column_text(st, 0));
    snprintf(k->user_id, sizeof k->user_id, "%s", (const char *)sqlite3_column_text(st, 1));
    snprintf(k->name, sizeof k->name, "%s", (const char *)sqlite3_column_text(st, 2));
    const void *h = sqlite3_column_blob(st, 3);
    if (h && sqlite3_column_bytes(st, 3) == API_SECRET_HASH_LEN)
        memcpy(k->secret_hash, h, API_SECRET_HASH_LEN);
    else
        memset(k->secret_hash, 0, API_SECRET_HASH_LEN);
    k->created_at = sqlite3_column_int64(st, 4);
    k->revoked_at = sqlite3_column_int64(st, 5);
    k->expires_at = sqlite3_column_int64(st, 6);
    k->last_used_at = sqlite3_column_int64(st, 7);
}

int store_api_key_insert(struct store *s, const struct api_key *k)
{
    sqlite3_stmt *st = store_stmt(s, SQL_KEY_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, k->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, k->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, k->name, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 4, k->secret_hash, API_SECRET_HASH_LEN, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, k->created_at);
    sqlite3_bind_int64(st, 6, k->expires_at);
    return store_step_write(s, st, "insert api key");
}

int store_api_key_get(struct store *s, const char *id, struct api_key *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_KEY_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_row, "get api key");
}

static void read_auth_row(sqlite3_stmt *st, void *row)
{
    struct key_auth *a = row;
    read_row(st, &a->key);
    a->owned = sqlite3_column_type(st, 8) != SQLITE_NULL;
    a->role = sqlite3_column_int(st, 8) ? ROLE_ADMIN : ROLE_USER;
    a->active = sqlite3_column_int(st, 9);
}

int store_api_key_auth(struct store *s, const char *id, struct key_auth *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_KEY_AUTH);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = store_read_one(s, st, out, read_auth_row, "authenticate api key");
    if (rc == STORE_OK && !out->owned)
        rc = STORE_ERROR; /* a key without its owner is the database's fault */
    return rc;
}

int store_api_key_list(struct store *s, const char *user_id, int64_t after_created, const char *after_id,
                       struct api_key *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_KEY_LIST);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after_created);
    sqlite3_bind_text(st, 3, after_id ? after_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_row, "list api keys");
}

int store_api_key_revoke(struct store *s, const char *user_id, const char *id, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_KEY_REVOKE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, user_id, -1, SQLITE_STATIC);
    return store_step_change(s, st, "revoke api key");
}

int store_api_key_touch(struct store *s, const char *id, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_KEY_TOUCH);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    return store_step_write(s, st, "note api key use");
}

int store_api_keys_revoke_all(struct store *s, const char *user_id, const char *except_id, int logins_only,
                              int64_t now, int64_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_KEYS_REVOKE_ALL);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    if (except_id)
        sqlite3_bind_text(st, 3, except_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, logins_only);
    int rc = store_step_write(s, st, "revoke api keys");
    if (rc == STORE_OK)
        *n = sqlite3_changes(store_db(s));
    return rc;
}

int store_user_set_password(struct store *s, const char *user_id, const char *password_hash)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USER_PASSWORD);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, password_hash, -1, SQLITE_STATIC);
    return store_step_change(s, st, "set password");
}

int64_t store_api_key_live_count(struct store *s, const char *user_id, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_KEYS_LIVE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    int rc = sqlite3_step(st);
    int64_t n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : store_rc_from_sqlite(s, rc, "count live api keys");
    sqlite3_reset(st);
    return n;
}

int store_api_keys_revoke_oldest_logins(struct store *s, const char *user_id, int64_t n, int64_t now,
                                        int64_t *revoked)
{
    *revoked = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_KEYS_REVOKE_OLDEST_LOGINS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_int64(st, 3, n);
    int rc = store_step_write(s, st, "revoke the oldest login keys");
    if (rc == STORE_OK)
        *revoked = sqlite3_changes(store_db(s));
    return rc;
}
