/* store_ssh_keys.c: SQL for the ssh_keys table (users' OpenSSH public keys)
 * and for the snapshot of them an instance takes at create and at start. */
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SSH_KEY_COLUMNS "id, user_id, name, type, bits, blob, comment, fingerprint, created_at"

static const char SQL_SSH_KEY_INSERT[] =
    "INSERT INTO ssh_keys (" SSH_KEY_COLUMNS ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
static const char SQL_SSH_KEY_GET[] = "SELECT " SSH_KEY_COLUMNS " FROM ssh_keys WHERE id = ? AND user_id = ?";
static const char SQL_SSH_KEY_BY_FP[] =
    "SELECT " SSH_KEY_COLUMNS " FROM ssh_keys WHERE user_id = ? AND fingerprint = ?";
static const char SQL_SSH_KEY_LIST[] =
    "SELECT " SSH_KEY_COLUMNS " FROM ssh_keys"
    " WHERE user_id = ? AND (created_at, id) > (?, ?) ORDER BY created_at, id LIMIT ?";
static const char SQL_SSH_KEY_COUNT[] = "SELECT count(*) FROM ssh_keys WHERE user_id = ?";
static const char SQL_SSH_KEY_DELETE[] = "DELETE FROM ssh_keys WHERE id = ? AND user_id = ?";
/* The snapshot: the keys named (ssh_key_ids), or every key of the owner
 * when it names none, oldest first, as "type base64". A named key since
 * deleted is simply not there any more. */
#define SSH_SNAPSHOT_SET                                                                                       \
    "UPDATE instances SET ssh_keys = (SELECT json_group_array(line) FROM (SELECT k.type || ' ' || k.blob AS line" \
    "   FROM ssh_keys k WHERE k.user_id = instances.user_id AND (instances.ssh_key_ids IS NULL"                  \
    "   OR k.id IN (SELECT value FROM json_each(instances.ssh_key_ids))) ORDER BY k.created_at, k.id))"
static const char SQL_SSH_SNAPSHOT[] = SSH_SNAPSHOT_SET " WHERE id = ?";
/* Every instance of the user that holds cards (or is about to) takes its
 * keys again when they change; the WHERE is instances_holding_by_user's,
 * so only the user's live instances are read. A stopped one takes them at
 * its next start. */
#define KEYED_STATES "('pending', 'provisioning', 'running', 'stopping', 'unreachable')"
static const char SQL_SSH_RESNAPSHOT_USER[] =
    SSH_SNAPSHOT_SET " WHERE user_id = ? AND state IN " KEYED_STATES;
/* Those whose workloads may run now, for the keys to be sent to. */
static const char SQL_SSH_PUSH_INSTANCES[] =
    "SELECT id FROM instances WHERE user_id = ? AND state IN " KEYED_STATES
    " AND state IN ('provisioning', 'running', 'unreachable') AND desired = 'running' ORDER BY id";
#undef KEYED_STATES
static const char SQL_SSH_SET_IDS[] = "UPDATE instances SET ssh_key_ids = ? WHERE id = ?";
static const char SQL_SSH_GET_INSTANCE[] = "SELECT ssh_keys, ssh_key_ids FROM instances WHERE id = ?";

static void read_key(sqlite3_stmt *st, void *row)
{
    struct ssh_key *k = row;
    store_column_text(k->id, sizeof k->id, st, 0);
    store_column_text(k->user_id, sizeof k->user_id, st, 1);
    store_column_text(k->name, sizeof k->name, st, 2);
    store_column_text(k->type, sizeof k->type, st, 3);
    k->bits = sqlite3_column_int64(st, 4);
    store_column_text(k->blob, sizeof k->blob, st, 5);
    store_column_text(k->comment, sizeof k->comment, st, 6);
    store_column_text(k->fingerprint, sizeof k->fingerprint, st, 7);
    k->created_at = sqlite3_column_int64(st, 8);
}

int store_ssh_key_insert(struct store *s, const struct ssh_key *k)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_KEY_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, k->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, k->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, k->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, k->type, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, k->bits);
    sqlite3_bind_text(st, 6, k->blob, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, k->comment, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, k->fingerprint, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 9, k->created_at);
    return store_step_write(s, st, "insert ssh key");
}

int store_ssh_key_get(struct store *s, const char *user_id, const char *id, struct ssh_key *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_KEY_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_key, "get ssh key");
}

int store_ssh_key_by_fingerprint(struct store *s, const char *user_id, const char *fingerprint, struct ssh_key *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_KEY_BY_FP);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, fingerprint, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_key, "find ssh key");
}

int store_ssh_key_list(struct store *s, const char *user_id, int64_t after_created, const char *after_id, size_t max,
                       struct ssh_key **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_KEY_LIST);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after_created);
    sqlite3_bind_text(st, 3, after_id ? after_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)max);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_key, "list ssh keys");
    *out = rows;
    return rc;
}

int64_t store_ssh_key_count(struct store *s, const char *user_id)
{
    return store_int64_by_text(s, SQL_SSH_KEY_COUNT, user_id, "count ssh keys");
}

int store_ssh_key_delete(struct store *s, const char *user_id, const char *id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_KEY_DELETE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    return store_step_change(s, st, "delete ssh key");
}

int store_instance_set_ssh_key_ids(struct store *s, const char *instance_id, const char *ids_json)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_SET_IDS);
    if (!st)
        return STORE_ERROR;
    if (ids_json)
        sqlite3_bind_text(st, 1, ids_json, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 1);
    sqlite3_bind_text(st, 2, instance_id, -1, SQLITE_STATIC);
    return store_step_change(s, st, "set instance ssh key ids");
}

int store_instance_ssh_snapshot(struct store *s, const char *instance_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_SNAPSHOT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    return store_step_change(s, st, "snapshot instance ssh keys");
}

int store_instance_ssh(struct store *s, const char *instance_id, char **keys_json, char **ids_json)
{
    *keys_json = NULL;
    if (ids_json)
        *ids_json = NULL;
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_GET_INSTANCE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(st, 0);
        const char *i = (const char *)sqlite3_column_text(st, 1);
        *keys_json = strdup(k ? k : "[]");
        if (ids_json && i)
            *ids_json = strdup(i);
        rc = *keys_json && (!ids_json || !i || *ids_json) ? STORE_OK : STORE_ERROR;
    } else {
        rc = rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "instance ssh keys");
    }
    sqlite3_reset(st);
    if (rc != STORE_OK) {
        free(*keys_json);
        *keys_json = NULL;
        if (ids_json) {
            free(*ids_json);
            *ids_json = NULL;
        }
    }
    return rc;
}

int store_user_ssh_resnapshot(struct store *s, const char *user_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_RESNAPSHOT_USER);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    return store_step_write(s, st, "snapshot the user's instances' ssh keys");
}

int store_user_ssh_push_instances(struct store *s, const char *user_id, char (**ids)[ID_MAX], size_t *n)
{
    *ids = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_SSH_PUSH_INSTANCES);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    void *rows = NULL;
    int rc = store_collect(s, st, ID_MAX, &rows, n, store_read_id, "instances to send ssh keys to");
    *ids = rows;
    return rc;
}
