/* store_ports.c: SQL for published ports (0016): the container ports an
 * instance asks for, the host port range each node publishes on, and the
 * host ports given to an instance's nodes, held in node_ports until the
 * placement is released with the cards (store_instance_release). */
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_INS_SET_PORTS[] = "UPDATE instances SET ports = ?2 WHERE id = ?1";
static const char SQL_INS_PORTS[] =
    "SELECT j.value FROM instances i, json_each(i.ports) j WHERE i.id = ? ORDER BY j.key";
static const char SQL_NODE_PUBLISH[] =
    "UPDATE nodes SET publish_first = ?2, publish_last = ?3 WHERE id = ?1 AND removed_at IS NULL"
    " AND (publish_first IS NOT ?2 OR publish_last IS NOT ?3)";
static const char SQL_NODE_RANGE[] =
    "SELECT publish_first, publish_last FROM nodes WHERE id = ? AND publish_first IS NOT NULL";
/* Only the range's ports: a range that shrank leaves older rows outside it,
 * which are released with their instances and not counted here. */
static const char SQL_NODE_USED[] =
    "SELECT host_port FROM node_ports WHERE node_id = ?1 AND host_port BETWEEN ?2 AND ?3 ORDER BY host_port";
static const char SQL_PORT_INSERT[] =
    "INSERT INTO node_ports (node_id, host_port, instance_id, container_port) VALUES (?, ?, ?, ?)";
static const char SQL_PLACEMENT_PORTS[] = "UPDATE instance_nodes SET ports = ?3 WHERE instance_id = ?1 AND rank = ?2";

int store_instance_set_ports(struct store *s, const char *instance_id, const char *ports_json)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_SET_PORTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, ports_json, -1, SQLITE_STATIC);
    return store_step_change(s, st, "instance ports");
}

int store_instance_ports(struct store *s, const char *instance_id, int64_t ports[STORE_MAX_PORTS], size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_INS_PORTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (*n < STORE_MAX_PORTS)
            ports[(*n)++] = sqlite3_column_int64(st, 0);
    rc = rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, "instance ports");
    sqlite3_reset(st);
    return rc;
}

int store_node_set_publish(struct store *s, const char *id, int64_t first, int64_t last)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_PUBLISH);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (first > 0) {
        sqlite3_bind_int64(st, 2, first);
        sqlite3_bind_int64(st, 3, last);
    }
    return store_node_update_if_changed(s, st, id, "node publish range");
}

/* The node's range into *first..*last; STORE_CONFLICT when it has none. */
static int node_range(struct store *s, const char *node_id, int64_t *first, int64_t *last)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_RANGE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *first = sqlite3_column_int64(st, 0);
        *last = sqlite3_column_int64(st, 1);
        rc = STORE_OK;
    } else {
        rc = rc == SQLITE_DONE ? STORE_CONFLICT : store_rc_from_sqlite(s, rc, "node publish range");
    }
    sqlite3_reset(st);
    return rc;
}

int store_instance_claim_ports(struct store *s, const char *instance_id, int64_t rank, const char *node_id,
                               const int64_t *container, size_t n)
{
    if (n == 0)
        return STORE_OK;
    if (n > STORE_MAX_PORTS)
        return STORE_ERROR;
    int64_t first = 0, last = -1;
    int rc = node_range(s, node_id, &first, &last);
    if (rc != STORE_OK)
        return rc;
    /* Walk the used ports in order beside the range: the first gaps are the
     * lowest free ports, without reading more than the used rows. */
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_USED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, first);
    sqlite3_bind_int64(st, 3, last);
    int64_t host[STORE_MAX_PORTS];
    size_t got = 0;
    int64_t next = first;
    while (got < n && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t used = sqlite3_column_int64(st, 0);
        while (got < n && next < used)
            host[got++] = next++;
        next = used + 1;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        rc = store_rc_from_sqlite(s, rc, "node ports");
        sqlite3_reset(st);
        return rc;
    }
    sqlite3_reset(st);
    while (got < n && next <= last)
        host[got++] = next++;
    if (got < n)
        return STORE_CONFLICT;
    char list[STORE_MAX_PORTS * 40 + 4] = "[";
    size_t len = 1;
    for (size_t i = 0; i < n; i++) {
        st = store_stmt(s, SQL_PORT_INSERT);
        if (!st)
            return STORE_ERROR;
        sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, host[i]);
        sqlite3_bind_text(st, 3, instance_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, container[i]);
        /* A port taken meanwhile breaks the primary key: the caller's
         * transaction rolls back, like a card claimed twice. */
        if ((rc = store_step_write(s, st, "claim host port")) != STORE_OK)
            return rc;
        len += (size_t)snprintf(list + len, sizeof list - len, "%s{\"container\":%lld,\"host\":%lld}", i ? "," : "",
                                (long long)container[i], (long long)host[i]);
    }
    snprintf(list + len, sizeof list - len, "]");
    st = store_stmt(s, SQL_PLACEMENT_PORTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, rank);
    sqlite3_bind_text(st, 3, list, -1, SQLITE_STATIC);
    return store_step_change(s, st, "instance node ports");
}
