/* store_nodes.c: SQL for nodes and their cards: registration, admin state,
 * listing with derived state and card counts, and heartbeat results. Every
 * change of whether a node is accepted or how many cards it has also brings
 * its capacity history up to date (store_capacity_sync), in the same
 * transaction. */
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODE_COLUMNS                                                                                  \
    "n.id, n.name, n.agent_url, n.secret, n.gpu_model, n.card_count, n.fabric, n.region, n.labels,"   \
    " n.admin_state, n.health, s.state, CASE WHEN s.state IN ('cordoned', 'draining', 'maintenance')" \
    "   THEN n.admin_reason ELSE n.state_reason END, l.missed_beats, coalesce(l.last_seen_at, 0),"    \
    " n.driver_version, n.stack_version, n.created_at, n.updated_at,"                                 \
    " (SELECT count(*) FROM node_cards c WHERE c.node_id = n.id),"                                    \
    " CASE WHEN s.state = 'ready' THEN (SELECT count(*) FROM node_cards c WHERE c.node_id = n.id"     \
    "   AND c.healthy = 1 AND c.instance_id IS NULL) ELSE 0 END,"                                     \
    " (SELECT count(*) FROM node_cards c WHERE c.node_id = n.id AND c.instance_id IS NOT NULL),"      \
    " n.admin_reason, n.public_host, coalesce(n.ssh_port, 0), coalesce(n.ssh_host_key, ''),"          \
    " coalesce(n.ssh_host_fingerprint, ''), n.data_host, coalesce(n.data_address, ''),"              \
    " coalesce(n.publish_first, 0), coalesce(n.publish_last, 0)"

/* Inserts nothing when the model is not in the catalog (a plain existence
 * check: the catalog's card counts cost a scan of every card). */
static const char SQL_NODE_INSERT[] =
    "INSERT INTO nodes (id, name, agent_url, secret, gpu_model, card_count, fabric, region, labels, created_at,"
    " updated_at, public_host, data_host) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13"
    " WHERE EXISTS (SELECT 1 FROM gpu_types WHERE code = ?5)";
static const char SQL_LIVENESS_INSERT[] = "INSERT INTO node_liveness (node_id) VALUES (?)";
#define NODE_TABLES                                                                \
    " FROM nodes n JOIN node_states s ON s.node_id = n.id JOIN node_liveness l" \
    " ON l.node_id = n.id"

static const char SQL_NODE_GET[] = "SELECT " NODE_COLUMNS NODE_TABLES " WHERE n.id = ?";
static const char SQL_NODE_LIST[] =
    "SELECT " NODE_COLUMNS NODE_TABLES
    " WHERE (?1 IS NULL OR s.state = ?1) AND (?2 IS NULL OR n.gpu_model = ?2) AND (?3 IS NULL OR n.fabric = ?3)"
    " AND (n.created_at, n.id) > (?4, ?5) ORDER BY n.created_at, n.id LIMIT ?6";
static const char SQL_NODE_CARDS[] =
    "SELECT idx, model, memory_gb, healthy, health_reason, coalesce(instance_id, ''), coalesce(failed_at, 0)"
    " FROM node_cards"
    " WHERE node_id = ? ORDER BY idx LIMIT ?";
static const char SQL_NODE_SET_ADMIN[] =
    "UPDATE nodes SET admin_state = ?2, admin_reason = ?3, updated_at = ?4 WHERE id = ?1 AND removed_at IS NULL";
static const char SQL_NODE_BUSY[] = "SELECT count(*) FROM node_cards WHERE node_id = ? AND instance_id IS NOT NULL";
static const char SQL_NODE_REMOVE[] =
    "UPDATE nodes SET removed_at = ?2, updated_at = ?2 WHERE id = ?1 AND removed_at IS NULL";
/* In the order of node_liveness's key: a pass's results, written in batches
 * as they come back, then each dirty a few neighbouring pages of it rather
 * than most of them again every batch. */
#define NODE_TARGET_COLUMNS                                                                                \
    "SELECT n.id, n.agent_url, n.secret, n.gpu_model, n.card_count,"                                       \
    " CASE WHEN n.health = 'up' AND n.unreachable_since IS NOT NULL THEN 'unreachable' ELSE n.health END," \
    " l.missed_beats, coalesce(l.last_seen_at, 0), l.workload_exits, coalesce(l.facts_digest, ''),"        \
    " coalesce(l.facts_etag, '')"
static const char SQL_NODE_TARGETS[] = NODE_TARGET_COLUMNS
    " FROM node_liveness l JOIN nodes n ON n.id = l.node_id WHERE n.removed_at IS NULL ORDER BY l.node_id";
/* Some nodes by id (a JSON array): what the reconciler lists between sweeps. */
static const char SQL_NODE_TARGETS_OF[] = NODE_TARGET_COLUMNS
    " FROM node_liveness l JOIN nodes n ON n.id = l.node_id"
    " WHERE l.node_id IN (SELECT value FROM json_each(?1)) AND n.removed_at IS NULL ORDER BY l.node_id";
/* The nodes never reached, through the nodes_never_reached index (0035):
 * what a registration wakes the heartbeat for. */
static const char SQL_NODE_TARGETS_NEW[] =
    NODE_TARGET_COLUMNS " FROM nodes n JOIN node_liveness l ON l.node_id = n.id"
                        " WHERE n.health = 'unknown' AND n.removed_at IS NULL ORDER BY n.id";
static const char SQL_NODE_FACTS[] = "SELECT facts, health FROM nodes WHERE id = ? AND removed_at IS NULL";
/* A good beat: the node's narrow row only (migration 0034). */
static const char SQL_NODE_SEEN[] =
    "UPDATE node_liveness SET last_seen_at = ?2, missed_beats = 0, workload_exits = ?3"
    " WHERE node_id = ?1 AND EXISTS (SELECT 1 FROM nodes WHERE id = ?1 AND removed_at IS NULL)";
/* An unreachable node that answers again is reachable from this beat on;
 * the nodes row of one that was not is left as it is. */
static const char SQL_NODE_BACK[] = "UPDATE nodes SET state_reason = '', updated_at = ?2, unreachable_since = NULL"
                                    " WHERE id = ?1 AND removed_at IS NULL AND health = 'up'"
                                    " AND unreachable_since IS NOT NULL";
static const char SQL_NODE_FACTS_DIGEST[] =
    "UPDATE node_liveness SET facts_digest = ?2, facts_etag = nullif(?3, '') WHERE node_id = ?1";
/* A rejected node keeps in unreachable_since since when nothing it said was
 * accepted (the start of a silence before, or its first refused beat): its
 * instances' grace runs from there (reconciler.c, silent_node). */
static const char SQL_NODE_BEAT[] =
    "UPDATE nodes SET facts = ?3, health = ?4, state_reason = ?5, driver_version = ?6, stack_version = ?7,"
    " updated_at = ?2, unreachable_since = CASE WHEN ?4 = 'rejected' THEN coalesce(unreachable_since, ?2) END"
    " WHERE id = ?1";
static const char SQL_NODE_SSH[] =
    "UPDATE nodes SET ssh_port = ?2, ssh_host_key = ?3, ssh_host_fingerprint = ?4 WHERE id = ?1 AND removed_at IS NULL"
    " AND (ssh_port IS NOT ?2 OR ssh_host_key IS NOT ?3 OR ssh_host_fingerprint IS NOT ?4)";
static const char SQL_NODE_EXISTS[] = "SELECT 1 FROM nodes WHERE id = ? AND removed_at IS NULL";
static const char SQL_CARD_UPSERT[] =
    "INSERT INTO node_cards (node_id, idx, model, memory_gb, healthy, health_reason, failed_at)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?5 = 0 THEN ?7 END)"
    " ON CONFLICT (node_id, idx) DO UPDATE SET model = excluded.model, memory_gb = excluded.memory_gb,"
    " healthy = excluded.healthy, health_reason = excluded.health_reason,"
    " failed_at = CASE WHEN excluded.healthy = 1 THEN NULL WHEN node_cards.healthy = 0 THEN node_cards.failed_at"
    " ELSE ?7 END";
static const char SQL_CARD_TRIM[] = "DELETE FROM node_cards WHERE node_id = ? AND idx >= ? AND instance_id IS NULL";
/* A failed beat is counted in the narrow row (SQL_NODE_MISSED); then, once
 * the count reaches ?3, an up node becomes unreachable (UNREACHABLE) and,
 * once its last good beat is ?5 seconds old, offline (OFFLINE); a node never
 * reached goes offline at once (SQL_NODE_QUIET, which writes the nodes row
 * only then). Offline and rejected nodes stay as they are: a rejected node
 * keeps its reason, because offline counts its cards as capacity the
 * platform has (migration 0011). */
static const char SQL_NODE_MISSED[] =
    "UPDATE node_liveness SET missed_beats = missed_beats + 1"
    " WHERE node_id = ?1 AND EXISTS (SELECT 1 FROM nodes WHERE id = ?1 AND removed_at IS NULL)";
#define MISS_REACHED "(SELECT missed_beats FROM node_liveness WHERE node_id = ?1) >= ?3"
#define UNREACHABLE "(health = 'up' AND unreachable_since IS NULL AND " MISS_REACHED ")"
#define OFFLINE                                                                      \
    "((health = 'unknown' AND " MISS_REACHED ") OR (health = 'up' AND " MISS_REACHED \
    " AND (SELECT coalesce(last_seen_at, 0) FROM node_liveness WHERE node_id = ?1) <= ?2 - ?5))"
static const char SQL_NODE_QUIET[] =
    "UPDATE nodes SET unreachable_since = CASE WHEN " UNREACHABLE " THEN ?2 ELSE unreachable_since END,"
    " health = CASE WHEN " OFFLINE " THEN 'offline' ELSE health END, state_reason = ?4, updated_at = ?2"
    " WHERE id = ?1 AND removed_at IS NULL AND (" UNREACHABLE " OR " OFFLINE ")";

static void read_node(sqlite3_stmt *st, void *row)
{
    struct node *n = row;
    store_column_text(n->id, sizeof n->id, st, 0);
    store_column_text(n->name, sizeof n->name, st, 1);
    store_column_text(n->agent_url, sizeof n->agent_url, st, 2);
    store_column_text(n->secret, sizeof n->secret, st, 3);
    store_column_text(n->gpu_model, sizeof n->gpu_model, st, 4);
    n->card_count = sqlite3_column_int64(st, 5);
    store_column_text(n->fabric, sizeof n->fabric, st, 6);
    store_column_text(n->region, sizeof n->region, st, 7);
    store_column_text(n->labels, sizeof n->labels, st, 8);
    store_column_text(n->admin_state, sizeof n->admin_state, st, 9);
    store_column_text(n->health, sizeof n->health, st, 10);
    store_column_text(n->state, sizeof n->state, st, 11);
    store_column_text(n->state_reason, sizeof n->state_reason, st, 12);
    n->missed_beats = sqlite3_column_int64(st, 13);
    n->last_seen_at = sqlite3_column_int64(st, 14);
    store_column_text(n->driver_version, sizeof n->driver_version, st, 15);
    store_column_text(n->stack_version, sizeof n->stack_version, st, 16);
    n->created_at = sqlite3_column_int64(st, 17);
    n->updated_at = sqlite3_column_int64(st, 18);
    n->cards_total = sqlite3_column_int64(st, 19);
    n->cards_free = sqlite3_column_int64(st, 20);
    n->cards_in_use = sqlite3_column_int64(st, 21);
    store_column_text(n->admin_reason, sizeof n->admin_reason, st, 22);
    store_column_text(n->public_host, sizeof n->public_host, st, 23);
    n->ssh_port = sqlite3_column_int64(st, 24);
    store_column_text(n->ssh_host_key, sizeof n->ssh_host_key, st, 25);
    store_column_text(n->ssh_host_fp, sizeof n->ssh_host_fp, st, 26);
    store_column_text(n->data_host, sizeof n->data_host, st, 27);
    store_column_text(n->data_address, sizeof n->data_address, st, 28);
    n->publish_first = sqlite3_column_int64(st, 29);
    n->publish_last = sqlite3_column_int64(st, 30);
}

int store_node_insert(struct store *s, const struct node *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, n->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, n->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, n->agent_url, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, n->secret, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, n->gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, n->card_count);
    sqlite3_bind_text(st, 7, n->fabric, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, n->region, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, n->labels, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 10, n->created_at);
    sqlite3_bind_int64(st, 11, n->created_at);
    sqlite3_bind_text(st, 12, n->public_host, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 13, n->data_host, -1, SQLITE_STATIC);
    int rc = store_step_change(s, st, "insert node");
    if (rc != STORE_OK)
        return rc;
    if (!(st = store_stmt(s, SQL_LIVENESS_INSERT)))
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, n->id, -1, SQLITE_STATIC);
    return store_step_change(s, st, "insert node liveness");
}

int store_node_get(struct store *s, const char *id, struct node *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_node, "get node");
}

int store_node_list(struct store *s, const struct node_filter *f, struct node *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_LIST);
    if (!st)
        return STORE_ERROR;
    if (f->state)
        sqlite3_bind_text(st, 1, f->state, -1, SQLITE_STATIC);
    if (f->gpu_model)
        sqlite3_bind_text(st, 2, f->gpu_model, -1, SQLITE_STATIC);
    if (f->fabric)
        sqlite3_bind_text(st, 3, f->fabric, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, f->after_created);
    sqlite3_bind_text(st, 5, f->after_id ? f->after_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_node, "list nodes");
}

static void read_card(sqlite3_stmt *st, void *row)
{
    struct node_card *c = row;
    c->idx = sqlite3_column_int64(st, 0);
    store_column_text(c->model, sizeof c->model, st, 1);
    c->memory_gb = sqlite3_column_int64(st, 2);
    c->healthy = sqlite3_column_int(st, 3);
    store_column_text(c->health_reason, sizeof c->health_reason, st, 4);
    store_column_text(c->instance_id, sizeof c->instance_id, st, 5);
    c->failed_at = sqlite3_column_int64(st, 6);
}

int store_node_cards(struct store *s, const char *node_id, struct node_card *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_CARDS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_card, "node cards");
}

int store_node_set_admin_state(struct store *s, const char *id, const char *admin_state, const char *reason,
                               int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_SET_ADMIN);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, admin_state, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, now);
    return store_step_change(s, st, "set node admin state");
}

int store_node_remove(struct store *s, const char *id, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_BUSY);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int64_t busy = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_reset(st);
    if (busy < 0)
        return store_rc_from_sqlite(s, rc, "count busy cards");
    if (busy > 0)
        return STORE_CONFLICT;
    st = store_stmt(s, SQL_NODE_REMOVE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    rc = store_step_change(s, st, "remove node");
    return rc == STORE_OK ? store_capacity_sync(s, id, now) : rc;
}

static void read_target(sqlite3_stmt *st, void *row)
{
    struct node_target *t = row;
    store_column_text(t->id, sizeof t->id, st, 0);
    store_column_text(t->agent_url, sizeof t->agent_url, st, 1);
    store_column_text(t->secret, sizeof t->secret, st, 2);
    store_column_text(t->gpu_model, sizeof t->gpu_model, st, 3);
    t->card_count = sqlite3_column_int64(st, 4);
    store_column_text(t->health, sizeof t->health, st, 5);
    t->missed_beats = sqlite3_column_int64(st, 6);
    t->last_seen_at = sqlite3_column_int64(st, 7);
    t->workload_exits = sqlite3_column_int64(st, 8);
    store_column_text(t->facts_digest, sizeof t->facts_digest, st, 9);
    store_column_text(t->facts_etag, sizeof t->facts_etag, st, 10);
}

static int collect_targets(struct store *s, const char *sql, const char *ids, struct node_target **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    if (ids)
        sqlite3_bind_text(st, 1, ids, -1, SQLITE_STATIC);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_target, "node targets");
    *out = rows;
    if (ids)
        sqlite3_clear_bindings(st);
    return rc;
}

int store_node_targets(struct store *s, struct node_target **out, size_t *n)
{
    return collect_targets(s, SQL_NODE_TARGETS, NULL, out, n);
}

int store_node_targets_of(struct store *s, const char (*ids)[ID_MAX], size_t n_ids, struct node_target **out,
                          size_t *n)
{
    char *list = store_ids_json(ids, n_ids);
    if (!list) {
        *out = NULL;
        *n = 0;
        return STORE_ERROR;
    }
    int rc = collect_targets(s, SQL_NODE_TARGETS_OF, list, out, n);
    free(list);
    return rc;
}

int store_node_targets_new(struct store *s, struct node_target **out, size_t *n)
{
    return collect_targets(s, SQL_NODE_TARGETS_NEW, NULL, out, n);
}

/* A good beat's time and workload exit count in the node's narrow row. */
static int liveness_seen(struct store *s, const char *id, int64_t now, int64_t workload_exits)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_SEEN);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_int64(st, 3, workload_exits);
    return store_step_change(s, st, "node seen");
}

int store_node_seen(struct store *s, const char *id, int64_t now, int64_t workload_exits, int unreachable)
{
    if (unreachable) {
        sqlite3_stmt *st = store_stmt(s, SQL_NODE_BACK);
        if (!st)
            return STORE_ERROR;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, now);
        int rc = store_step_write(s, st, "node back");
        if (rc != STORE_OK)
            return rc;
    }
    return liveness_seen(s, id, now, workload_exits);
}

int store_node_set_facts_digest(struct store *s, const char *id, const char *digest, const char *etag)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_FACTS_DIGEST);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, digest, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, etag, -1, SQLITE_STATIC);
    return store_step_change(s, st, "node facts digest");
}

int store_node_beat_ok(struct store *s, const char *id, int64_t now, const char *facts_json, int accepted,
                       const char *reason, const char *driver_version, const char *stack_version,
                       const struct node_card *cards, size_t n_cards, int64_t workload_exits)
{
    /* Most beats repeat the last facts: then only the time moves. */
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_FACTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        sqlite3_reset(st);
        return STORE_NOT_FOUND; /* removed meanwhile */
    }
    if (rc != SQLITE_ROW) {
        sqlite3_reset(st);
        return store_rc_from_sqlite(s, rc, "node facts");
    }
    const char *old_facts = (const char *)sqlite3_column_text(st, 0);
    const char *old_health = (const char *)sqlite3_column_text(st, 1);
    int unchanged = old_facts && old_health && strcmp(old_facts, facts_json) == 0 &&
                    strcmp(old_health, accepted ? "up" : "rejected") == 0;
    sqlite3_reset(st);
    if (unchanged) /* whether it was unreachable is not known here: the row says */
        return store_node_seen(s, id, now, workload_exits, 1);
    st = store_stmt(s, SQL_NODE_BEAT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_text(st, 3, facts_json, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, accepted ? "up" : "rejected", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, reason, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, driver_version, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, stack_version, -1, SQLITE_STATIC);
    if ((rc = store_step_change(s, st, "node beat")) != STORE_OK ||
        (rc = liveness_seen(s, id, now, workload_exits)) != STORE_OK)
        return rc;
    if (!accepted) /* its card rows stay, but a rejected node offers none */
        return store_capacity_sync(s, id, now);
    for (size_t i = 0; i < n_cards; i++) {
        st = store_stmt(s, SQL_CARD_UPSERT);
        if (!st)
            return STORE_ERROR;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, cards[i].idx);
        sqlite3_bind_text(st, 3, cards[i].model, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, cards[i].memory_gb);
        sqlite3_bind_int(st, 5, cards[i].healthy);
        sqlite3_bind_text(st, 6, cards[i].health_reason, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 7, now);
        rc = store_rc_from_sqlite(s, sqlite3_step(st), "upsert card");
        sqlite3_reset(st);
        if (rc != STORE_OK)
            return rc;
    }
    st = store_stmt(s, SQL_CARD_TRIM);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)n_cards);
    rc = store_rc_from_sqlite(s, sqlite3_step(st), "trim cards");
    sqlite3_reset(st);
    return rc == STORE_OK ? store_capacity_sync(s, id, now) : rc;
}

int store_node_beat_missed(struct store *s, const char *id, int64_t now, int64_t miss_limit, int64_t lost_after_s,
                           const char *reason)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_MISSED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = store_step_change(s, st, "node missed beat");
    if (rc != STORE_OK || !(st = store_stmt(s, SQL_NODE_QUIET)))
        return rc != STORE_OK ? rc : STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_int64(st, 3, miss_limit);
    sqlite3_bind_text(st, 4, reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, lost_after_s);
    /* No capacity change to record: only a node that is up (accepted, and
     * still so when offline) or never reached (no card rows) goes offline. */
    return store_step_write(s, st, "node gone quiet");
}

int store_node_set_ssh(struct store *s, const char *id, int64_t port, const char *host_key, const char *fingerprint)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_SSH);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (port > 0) {
        sqlite3_bind_int64(st, 2, port);
        sqlite3_bind_text(st, 3, host_key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, fingerprint, -1, SQLITE_STATIC);
    }
    return store_node_update_if_changed(s, st, id, "node ssh");
}

int store_node_update_if_changed(struct store *s, sqlite3_stmt *st, const char *id, const char *what)
{
    int rc = store_step_write(s, st, what);
    if (rc != STORE_OK || sqlite3_changes(store_db(s)) > 0)
        return rc;
    /* Nothing changed: the node already had these values, or there is no
     * such node. */
    st = store_stmt(s, SQL_NODE_EXISTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    int out = rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "node");
    sqlite3_reset(st);
    return out;
}
