/* store_volumes.c: SQL for users' persistent volumes. */
#include "store/store_sql.h"

#include <stdio.h>
#include <string.h>

/* Instances that still need the volume (every one but the terminated: a
 * failed, lost or succeeded one can be started again), and those holding
 * cards. Both counts read the index of live instances by volume (migration
 * 0048), whose WHERE they repeat word for word so that SQLite uses it:
 * every create, start and provisioning reads a volume, and must not read
 * the owner's terminated instances to do it. */
#define VOLUME_COLUMNS                                                                                 \
    "v.id, v.user_id, v.name, v.size_gb, v.source, v.created_at,"                                      \
    " (SELECT count(*) FROM instances i WHERE i.volume_id = v.id AND i.state <> 'terminated'),"        \
    " (SELECT count(*) FROM instances i WHERE i.volume_id = v.id AND i.state <> 'terminated'"          \
    "   AND i.state IN ('pending', 'provisioning', 'running', 'stopping')), v.region"

static const char SQL_VOLUME_INSERT[] =
    "INSERT INTO volumes (id, user_id, name, size_gb, source, created_at, region) VALUES (?, ?, ?, ?, ?, ?, ?)";
static const char SQL_VOLUME_GET[] = "SELECT " VOLUME_COLUMNS " FROM volumes v"
                                     " WHERE v.id = ?2 AND (?1 IS NULL OR v.user_id = ?1) AND v.deleted_at IS NULL";
/* The id alone: every create without a volume_id looks its owner's default
 * volume up on the writer, and needs neither use count. */
static const char SQL_VOLUME_ID_BY_NAME[] =
    "SELECT id FROM volumes WHERE user_id = ? AND name = ? AND deleted_at IS NULL";
/* What agents mount: every workload a provisioning puts reads it, and
 * needs neither use count. */
static const char SQL_VOLUME_MOUNT[] = "SELECT source, size_gb FROM volumes WHERE id = ? AND deleted_at IS NULL";
static const char SQL_VOLUME_LIST[] = "SELECT " VOLUME_COLUMNS " FROM volumes v"
                                      " WHERE v.user_id = ? AND v.deleted_at IS NULL AND (v.created_at, v.id) > (?, ?)"
                                      " ORDER BY v.created_at, v.id LIMIT ?";
/* A deletion is never put before storage already charged (a clock stepped
 * back): what was billed then stays within the volume's tariff, and no
 * storage refund is ever needed. */
static const char SQL_VOLUME_DELETE[] =
    "UPDATE volumes SET deleted_at = max(?3, storage_billed_to) WHERE id = ?2 AND user_id = ?1 AND deleted_at IS NULL";

static void read_volume(sqlite3_stmt *st, void *row)
{
    struct volume *v = row;
    store_column_text(v->id, sizeof v->id, st, 0);
    store_column_text(v->user_id, sizeof v->user_id, st, 1);
    store_column_text(v->name, sizeof v->name, st, 2);
    v->size_gb = sqlite3_column_int64(st, 3);
    store_column_text(v->source, sizeof v->source, st, 4);
    v->created_at = sqlite3_column_int64(st, 5);
    v->instances = sqlite3_column_int64(st, 6);
    v->mounted = sqlite3_column_int64(st, 7);
    store_column_text(v->region, sizeof v->region, st, 8);
}

static int get_one(struct store *s, sqlite3_stmt *st, struct volume *out, const char *what)
{
    return store_read_one(s, st, out, read_volume, what);
}

int store_volume_insert(struct store *s, const struct volume *v)
{
    sqlite3_stmt *st = store_stmt(s, SQL_VOLUME_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, v->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, v->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, v->name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, v->size_gb);
    sqlite3_bind_text(st, 5, v->source, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, v->created_at);
    sqlite3_bind_text(st, 7, v->region, -1, SQLITE_STATIC);
    return store_step_write(s, st, "insert volume");
}

int store_volume_get(struct store *s, const char *user_id, const char *id, struct volume *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_VOLUME_GET);
    if (!st)
        return STORE_ERROR;
    if (user_id)
        sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
    return get_one(s, st, out, "get volume");
}

static void read_mount(sqlite3_stmt *st, void *row)
{
    struct volume *v = row;
    store_column_text(v->source, sizeof v->source, st, 0);
    v->size_gb = sqlite3_column_int64(st, 1);
}

int store_volume_mount(struct store *s, const char *id, struct volume *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = store_stmt(s, SQL_VOLUME_MOUNT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_mount, "get volume mount");
}

int store_volume_id_by_name(struct store *s, const char *user_id, const char *name, char id_out[ID_MAX])
{
    sqlite3_stmt *st = store_stmt(s, SQL_VOLUME_ID_BY_NAME);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    return store_read_one(s, st, id_out, store_read_id, "get volume by name");
}

int store_volume_list(struct store *s, const char *user_id, int64_t after_created, const char *after_id,
                      struct volume *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_VOLUME_LIST);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after_created);
    sqlite3_bind_text(st, 3, after_id ? after_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_volume, "list volumes");
}

int store_volume_delete(struct store *s, const char *user_id, const char *id, int64_t now)
{
    struct volume v;
    int rc = store_volume_get(s, user_id, id, &v);
    if (rc != STORE_OK)
        return rc;
    if (v.instances > 0)
        return STORE_CONFLICT;
    sqlite3_stmt *st = store_stmt(s, SQL_VOLUME_DELETE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now);
    rc = store_rc_from_sqlite(s, sqlite3_step(st), "delete volume");
    sqlite3_reset(st);
    return rc;
}
