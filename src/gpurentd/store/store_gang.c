/* store_gang.c: SQL for multi-node jobs (0019): each node's data-plane
 * address (the admin's data_host, the facts' data_address), an instance's
 * rendezvous bound and when its ranks began coming up, and its internal SSH
 * key pair, which no reader of the API ever gets. */
#include "store/store_sql.h"

#include <stdio.h>
#include <string.h>

static const char SQL_NODE_DATA_ADDRESS[] =
    "UPDATE nodes SET data_address = ?2 WHERE id = ?1 AND removed_at IS NULL AND data_address IS NOT ?2";
static const char SQL_NODE_HOSTS[] =
    "UPDATE nodes SET public_host = coalesce(?2, public_host), data_host = coalesce(?3, data_host), updated_at = ?4"
    " WHERE id = ?1 AND removed_at IS NULL";
static const char SQL_INS_GANG[] =
    "SELECT rendezvous_timeout_s, coalesce(rendezvous_since, 0), internal_pubkey IS NOT NULL FROM instances"
    " WHERE id = ?";
static const char SQL_INS_SET_TIMEOUT[] =
    "UPDATE instances SET rendezvous_timeout_s = ?2 WHERE id = ?1 AND rendezvous_timeout_s IS NOT ?2";
static const char SQL_INS_SET_RENDEZVOUS[] =
    "UPDATE instances SET rendezvous_since = ?2 WHERE id = ?1 AND rendezvous_since IS NOT ?2";
static const char SQL_INS_SET_KEY[] = "UPDATE instances SET internal_pubkey = ?2, internal_key = ?3 WHERE id = ?1";
static const char SQL_INS_KEY[] =
    "SELECT coalesce(internal_pubkey, ''), coalesce(internal_key, '') FROM instances WHERE id = ?";

int store_node_set_data_address(struct store *s, const char *id, const char *address)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_DATA_ADDRESS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (address[0])
        sqlite3_bind_text(st, 2, address, -1, SQLITE_STATIC);
    /* Most beats change nothing; a removed node is the caller's not-found
     * from its own beat, so no second look here. */
    return store_step_write(s, st, "node data address");
}

int store_node_set_hosts(struct store *s, const char *id, const char *public_host, const char *data_host, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_HOSTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (public_host)
        sqlite3_bind_text(st, 2, public_host, -1, SQLITE_STATIC);
    if (data_host)
        sqlite3_bind_text(st, 3, data_host, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, now);
    return store_step_change(s, st, "node hosts");
}

static void read_gang(sqlite3_stmt *st, void *row)
{
    struct instance_gang *g = row;
    g->rendezvous_timeout_s = sqlite3_column_int64(st, 0);
    g->rendezvous_since = sqlite3_column_int64(st, 1);
    g->has_key = sqlite3_column_int(st, 2);
}

int store_instance_gang(struct store *s, const char *id, struct instance_gang *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_GANG);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_gang, "instance gang");
}

int store_instance_set_rendezvous_timeout(struct store *s, const char *id, int64_t seconds)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_SET_TIMEOUT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, seconds);
    return store_step_write(s, st, "instance rendezvous timeout");
}

int store_instance_set_rendezvous(struct store *s, const char *id, int64_t since)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_SET_RENDEZVOUS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (since > 0)
        sqlite3_bind_int64(st, 2, since);
    return store_step_write(s, st, "instance rendezvous");
}

int store_instance_set_internal_key(struct store *s, const char *id, const char *pub, const char *priv)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_SET_KEY);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, pub, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, priv, -1, SQLITE_STATIC);
    return store_step_change(s, st, "instance internal key");
}

static void read_key(sqlite3_stmt *st, void *row)
{
    struct instance_key *k = row;
    store_column_text(k->pub, sizeof k->pub, st, 0);
    store_column_text(k->priv, sizeof k->priv, st, 1);
}

int store_instance_internal_key(struct store *s, const char *id, struct instance_key *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_KEY);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_key, "instance internal key");
}
