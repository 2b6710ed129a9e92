/* store_idempotency.c: SQL for Idempotency-Key replay records. */
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_IDEM_GET[] =
    "SELECT request_hash, status, response, location FROM idempotency_keys WHERE user_id = ? AND key = ?";
static const char SQL_IDEM_PUT[] =
    "INSERT INTO idempotency_keys (user_id, key, request_hash, status, response, created_at, location)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)";

int store_idempotency_get(struct store *s, const char *user_id, const char *key, char hash[65], int *status,
                          char location[IDEM_LOCATION_MAX], char **response)
{
    *response = NULL;
    sqlite3_stmt *st = store_stmt(s, SQL_IDEM_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st), result = STORE_OK;
    if (rc == SQLITE_ROW) {
        snprintf(hash, 65, "%s", (const char *)sqlite3_column_text(st, 0));
        *status = sqlite3_column_int(st, 1);
        snprintf(location, IDEM_LOCATION_MAX, "%s", (const char *)sqlite3_column_text(st, 3));
        *response = strdup((const char *)sqlite3_column_text(st, 2));
        if (!*response)
            result = STORE_ERROR;
    } else {
        result = rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "get idempotency key");
    }
    sqlite3_reset(st);
    return result;
}

int store_idempotency_put(struct store *s, const char *user_id, const char *key, const char *hash, int status,
                          const char *location, const char *response, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_IDEM_PUT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, hash, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, status);
    sqlite3_bind_text(st, 5, response, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, now);
    sqlite3_bind_text(st, 7, location, -1, SQLITE_STATIC);
    return store_step_write(s, st, "put idempotency key");
}
