/* store_capacity.c: SQL for node_capacity (migration 0011), the history of
 * what each node offered: keeps a node's open interval in step with its
 * current facts, so report_utilisation can measure each day against the
 * fleet of that day. */
#include "store/store_sql.h"

#include <string.h>

/* The node's offer now, as report_utilisation has always defined it (not
 * removed, health up or offline, its card rows), next to its open interval
 * and the latest second any of its intervals reaches. One row, or none for
 * an unknown node. */
static const char SQL_CAPACITY_STATE[] =
    "SELECT n.gpu_model,"
    " CASE WHEN n.removed_at IS NULL AND n.health IN ('up', 'offline')"
    "   THEN (SELECT count(*) FROM node_cards c WHERE c.node_id = n.id) ELSE 0 END,"
    " o.gpu_model, coalesce(o.cards, 0), o.from_at,"
    " (SELECT max(coalesce(h.to_at, h.from_at)) FROM node_capacity h WHERE h.node_id = n.id)"
    " FROM nodes n LEFT JOIN node_capacity o ON o.node_id = n.id AND o.to_at IS NULL WHERE n.id = ?";
static const char SQL_CAPACITY_CLOSE[] =
    "UPDATE node_capacity SET to_at = ?3 WHERE node_id = ?1 AND from_at = ?2 AND to_at IS NULL";
static const char SQL_CAPACITY_DROP[] =
    "DELETE FROM node_capacity WHERE node_id = ?1 AND from_at = ?2 AND to_at IS NULL";
static const char SQL_CAPACITY_OPEN[] =
    "INSERT INTO node_capacity (node_id, gpu_model, cards, from_at, to_at) VALUES (?, ?, ?, ?, NULL)";

struct capacity_state {
    char model[33];      /* the node's model */
    int64_t cards;       /* cards it offers now; 0 when it offers none */
    char open_model[33]; /* the open interval's model, "" when none is open */
    int64_t open_cards;  /* its cards, 0 when none is open */
    int64_t open_from;   /* its start */
    int64_t last;        /* the latest second the node's intervals reach; 0 when it has none */
};

static void read_state(sqlite3_stmt *st, void *row)
{
    struct capacity_state *c = row;
    store_column_text(c->model, sizeof c->model, st, 0);
    c->cards = sqlite3_column_int64(st, 1);
    store_column_text(c->open_model, sizeof c->open_model, st, 2);
    c->open_cards = sqlite3_column_int64(st, 3);
    c->open_from = sqlite3_column_int64(st, 4);
    c->last = sqlite3_column_int64(st, 5);
}

int store_capacity_sync(struct store *s, const char *node_id, int64_t now)
{
    struct capacity_state c;
    sqlite3_stmt *st = store_stmt(s, SQL_CAPACITY_STATE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
    int rc = store_read_one(s, st, &c, read_state, "node capacity");
    if (rc != STORE_OK)
        return rc;
    int open = c.open_cards > 0;
    if (open && c.cards == c.open_cards && strcmp(c.model, c.open_model) == 0)
        return STORE_OK; /* the usual case: nothing changed */
    if (!open && c.cards == 0)
        return STORE_OK;
    /* Intervals never run backwards or overlap, even if the clock stepped
     * back: a change is dated no earlier than the node's history reaches. */
    int64_t at = now > c.last ? now : c.last;
    if (open) {
        /* An interval that would last no time at all (two changes in one
         * second) is dropped rather than kept empty. */
        st = store_stmt(s, at > c.open_from ? SQL_CAPACITY_CLOSE : SQL_CAPACITY_DROP);
        if (!st)
            return STORE_ERROR;
        sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, c.open_from);
        if (at > c.open_from)
            sqlite3_bind_int64(st, 3, at);
        if ((rc = store_step_change(s, st, "close node capacity")) != STORE_OK)
            return rc == STORE_NOT_FOUND ? STORE_ERROR : rc;
    }
    if (c.cards == 0)
        return STORE_OK;
    st = store_stmt(s, SQL_CAPACITY_OPEN);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, c.model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, c.cards);
    sqlite3_bind_int64(st, 4, at);
    return store_step_write(s, st, "open node capacity");
}
