/* store_instances.c: SQL for instances, their placement on node cards,
 * their events and running intervals, and per-user card quotas. */
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INSTANCE_COLUMNS                                                                               \
    "id, user_id, name, gpu_model, card_count, image, volume_id, desired, state, phase, state_reason," \
    " attempts, next_attempt_at, state_since, created_at, updated_at"
/* The job columns (0018, store_jobs.c) come last, so they are found from
 * the end however many columns INSTANCE_COLUMNS gains. */
#define INSTANCE_READ INSTANCE_COLUMNS ", " STORE_JOB_COLUMNS

/* States in which an instance holds cards. An unreachable one keeps them
 * while it waits for its node; a lost instance has released them: its node
 * is gone. */
#define HOLDING "('pending', 'provisioning', 'running', 'stopping', 'unreachable')"

static const char SQL_INS_INSERT[] =
    "INSERT INTO instances (" INSTANCE_COLUMNS ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
static const char SQL_INS_GET[] =
    "SELECT " INSTANCE_READ " FROM instances WHERE id = ?2 AND (?1 IS NULL OR user_id = ?1)";
static const char SQL_INS_LIST[] =
    "SELECT " INSTANCE_READ " FROM instances WHERE (?1 IS NULL OR user_id = ?1) AND (?2 IS NULL OR state = ?2)"
    " AND (created_at, id) > (?3, ?4) ORDER BY created_at, id LIMIT ?5";
static const char SQL_INS_UNSETTLED[] =
    "SELECT " INSTANCE_READ " FROM instances"
    " WHERE state IN " HOLDING " OR (state = 'stopped' AND desired = 'terminated') ORDER BY created_at, id";
/* Between sweeps (0032): the instances a pass must look at whatever the
 * agents say, and the live ones on nodes not answering or whose workloads
 * a heartbeat saw end (?1, a JSON array of node ids). The first WHERE is
 * the partial index instances_attention's, word for word. */
static const char SQL_INS_ATTENTION[] =
    "SELECT " INSTANCE_READ " FROM instances"
    " WHERE state IN ('pending', 'provisioning', 'stopping', 'unreachable')"
    "    OR (state = 'stopped' AND desired = 'terminated')"
    "    OR (state = 'running' AND (desired <> 'running' OR app_id IS NOT NULL OR max_runtime_minutes IS NOT NULL))"
    " UNION SELECT " INSTANCE_READ " FROM instances WHERE state IN " HOLDING " AND id IN"
    " (SELECT p.instance_id FROM instance_nodes p WHERE p.node_id IN"
    "  (SELECT id FROM nodes WHERE health <> 'up' OR unreachable_since IS NOT NULL"
    "   UNION SELECT value FROM json_each(?1)))"
    " ORDER BY created_at, id";
static const char SQL_INS_CURRENT[] = "SELECT state, phase, state_reason FROM instances WHERE id = ?";
static const char SQL_INS_SET_STATE[] =
    "UPDATE instances SET state = ?2, phase = ?3, state_reason = ?4, updated_at = ?5, state_since = ?5 WHERE id = ?1";
/* Without assigning state: SQLite rewrites the entries of every index whose
 * key or WHERE names a column the UPDATE assigns, changed or not, and four
 * of the instance's indexes name its state. */
static const char SQL_INS_SET_PHASE[] = "UPDATE instances SET phase = ?3, state_reason = ?4, updated_at = ?5 WHERE id = ?1";
static const char SQL_INS_SET_DESIRED[] = "UPDATE instances SET desired = ?2, updated_at = ?3 WHERE id = ?1";
static const char SQL_INS_SET_ATTEMPTS[] = "UPDATE instances SET attempts = ?2, next_attempt_at = ?3 WHERE id = ?1";
static const char SQL_EVENT_INSERT[] =
    "INSERT INTO instance_events (instance_id, at, state, reason) VALUES (?, ?, ?, ?)";
static const char SQL_EVENT_LIST[] =
    "SELECT seq, at, state, reason FROM instance_events WHERE instance_id = ? AND seq > ? ORDER BY seq LIMIT ?";
static const char SQL_INS_NODES[] =
    "SELECT p.rank, p.node_id, n.name, n.agent_url, n.secret,"
    " CASE WHEN n.health = 'up' AND n.unreachable_since IS NOT NULL THEN 'unreachable' ELSE n.health END,"
    " CASE WHEN n.health = 'rejected' THEN coalesce(n.unreachable_since, l.last_seen_at, 0)"
    " ELSE coalesce(l.last_seen_at, 0) END, p.workload_id,"
    " p.cards, p.phase, p.message, p.put_done, n.public_host, coalesce(n.ssh_port, 0),"
    " coalesce(n.ssh_host_key, ''), coalesce(n.ssh_host_fingerprint, ''), p.ports,"
    " n.data_host, coalesce(n.data_address, ''), coalesce(p.health, ''),"
    " (SELECT i.app_id IS NOT NULL FROM instances i WHERE i.id = p.instance_id)"
    " FROM instance_nodes p JOIN nodes n ON n.id = p.node_id JOIN node_liveness l ON l.node_id = p.node_id"
    " WHERE p.instance_id = ? ORDER BY p.rank LIMIT ?";
/* Placement candidates come through the nodes_placement index (0006): for
 * one node's worth of cards only the best fit (fewest free cards that are
 * enough), for more only whole free nodes, by fabric and name. */
#define CANDIDATE_COLUMNS                                                                                            \
    "SELECT n.id, n.fabric, n.card_count, coalesce((SELECT group_concat(c.idx) FROM node_cards c"                    \
    "   WHERE c.node_id = n.id AND c.healthy = 1 AND c.instance_id IS NULL), '')"                                    \
    " FROM nodes n WHERE n.gpu_model = ?1 AND n.removed_at IS NULL AND n.health = 'up' AND n.admin_state = 'active'" \
    " AND n.unreachable_since IS NULL"                                                                               \
    " AND (?3 = 0 OR (n.publish_first IS NOT NULL AND n.publish_last - n.publish_first + 1 -"                        \
    "  (SELECT count(*) FROM node_ports q WHERE q.node_id = n.id) >= ?3))"                        \
    " AND " STORE_POOL_IS("n", "?4")
static const char SQL_CANDIDATE_BEST_FIT[] =
    CANDIDATE_COLUMNS " AND n.free_cards >= ?2 ORDER BY n.free_cards, n.fabric, n.name LIMIT 1";
static const char SQL_CANDIDATES_WHOLE[] =
    CANDIDATE_COLUMNS " AND n.free_cards = ?2 AND n.card_count = ?2 ORDER BY n.fabric, n.name";
static const char SQL_FREE_CARDS[] =
    "SELECT coalesce(sum(n.free_cards), 0) FROM nodes n WHERE " STORE_NODE_TAKES_ON_DEMAND("?1");
static const char SQL_CARD_CLAIM[] =
    "UPDATE node_cards SET instance_id = ?1 WHERE node_id = ?2 AND idx = ?3 AND instance_id IS NULL AND healthy = 1";
static const char SQL_PLACEMENT_INSERT[] =
    "INSERT INTO instance_nodes (instance_id, rank, node_id, workload_id, cards) VALUES (?, ?, ?, ?, ?)";
/* What a placement must not be used for new workloads on (0002, 0012):
 * the first card it holds that its agent reports failed, in rank order, and
 * the first of its nodes that takes no new work, named as GET
 * /v1/admin/nodes names its state. */
static const char SQL_PLACED_FAILED_CARD[] =
    "SELECT n.name, c.idx FROM instance_nodes p JOIN node_cards c ON c.node_id = p.node_id"
    " AND c.instance_id = p.instance_id JOIN nodes n ON n.id = p.node_id"
    " WHERE p.instance_id = ?1 AND c.healthy = 0 ORDER BY p.rank, c.idx LIMIT 1";
static const char SQL_PLACED_NODE_ASIDE[] =
    "SELECT n.name, CASE WHEN n.removed_at IS NOT NULL THEN 'removed' WHEN n.health = 'unknown' THEN 'pending'"
    " WHEN n.health <> 'up' THEN n.health WHEN n.unreachable_since IS NOT NULL THEN 'unreachable'"
    " ELSE n.admin_state END"
    " FROM instance_nodes p JOIN nodes n ON n.id = p.node_id WHERE p.instance_id = ?1"
    " AND NOT (n.removed_at IS NULL AND n.health = 'up' AND n.unreachable_since IS NULL AND n.admin_state = 'active')"
    " ORDER BY p.rank LIMIT 1";
static const char SQL_CARD_RELEASE[] = "UPDATE node_cards SET instance_id = NULL WHERE instance_id = ?";
/* Host ports go with the cards (0016). */
static const char SQL_PORTS_RELEASE[] = "DELETE FROM node_ports WHERE instance_id = ?";
static const char SQL_PLACEMENT_DELETE[] = "DELETE FROM instance_nodes WHERE instance_id = ?";
/* Where each rank ran, kept as its placement goes (0045): only ranks an
 * agent accepted, whose output it may keep; a release with no placement
 * left (a second one) keeps the last run's. */
static const char SQL_PAST_RANKS_CLEAR[] =
    "DELETE FROM instance_past_ranks WHERE instance_id = ?1"
    " AND EXISTS (SELECT 1 FROM instance_nodes WHERE instance_id = ?1 AND put_done = 1)";
static const char SQL_PAST_RANKS_KEEP[] =
    "INSERT INTO instance_past_ranks (instance_id, rank, node_id, workload_id)"
    " SELECT instance_id, rank, node_id, workload_id FROM instance_nodes WHERE instance_id = ?1 AND put_done = 1";
static const char SQL_PAST_RANK[] =
    "SELECT p.rank, p.node_id, n.name, n.agent_url, n.secret, p.workload_id"
    " FROM instance_past_ranks p JOIN nodes n ON n.id = p.node_id"
    " WHERE p.instance_id = ?1 AND p.rank = ?2 AND n.removed_at IS NULL";
static const char SQL_PLACEMENT_UPDATE[] =
    "UPDATE instance_nodes SET phase = ?3, message = ?4, put_done = ?5 WHERE instance_id = ?1 AND rank = ?2"
    " AND (phase <> ?3 OR message <> ?4 OR put_done <> ?5)"; /* a row that would not change is not written */
static const char SQL_PLACEMENT_HEALTH[] =
    "UPDATE instance_nodes SET health = ?3, health_at = ?4 WHERE instance_id = ?1 AND rank = ?2";
static const char SQL_INTERVAL_OPEN[] =
    "INSERT INTO running_intervals (instance_id, user_id, gpu_model, card_count, started_at)"
    " SELECT ?1, ?2, ?3, ?4, ?5 WHERE NOT EXISTS"
    " (SELECT 1 FROM running_intervals WHERE instance_id = ?1 AND ended_at IS NULL)"
    /* An instance inside a reservation ran on hours paid for at booking
     * (0024): it is never billed per second, so it has no interval. */
    " AND NOT EXISTS (SELECT 1 FROM instances WHERE id = ?1 AND reservation_id IS NOT NULL)";
static const char SQL_INTERVAL_CLOSE[] = "UPDATE running_intervals SET ended_at = max(started_at, ?2), end_reason = ?3"
                                         " WHERE instance_id = ?1 AND ended_at IS NULL";
static const char SQL_PLACED_WORKLOADS[] = "SELECT workload_id FROM instance_nodes ORDER BY workload_id";
static const char SQL_PLACED_WORKLOADS_ON[] = "SELECT workload_id FROM instance_nodes"
                                              " WHERE node_id IN (SELECT value FROM json_each(?1)) ORDER BY workload_id";
static const char SQL_WORKLOAD_PLACED[] = "SELECT EXISTS (SELECT 1 FROM instance_nodes WHERE workload_id = ?)";
static const char SQL_USER_CARDS[] =
    "SELECT coalesce(sum(card_count), 0) FROM instances WHERE user_id = ?1 AND id <> ?2 AND state IN " HOLDING;
/* Cards inside a reservation are paid already (0024): they need no
 * minimum run funded. */
static const char SQL_USER_CARDS_BY_MODEL[] =
    "SELECT gpu_model, sum(card_count) FROM instances WHERE user_id = ? AND state IN " HOLDING
    " AND reservation_id IS NULL GROUP BY gpu_model ORDER BY gpu_model";
static const char SQL_USER_MAX_CARDS[] = "SELECT max_cards FROM user_limits WHERE user_id = ?";
static const char SQL_USER_SET_MAX_CARDS[] = "INSERT INTO user_limits (user_id, max_cards) VALUES (?1, ?2)"
                                             " ON CONFLICT (user_id) DO UPDATE SET max_cards = excluded.max_cards";

static void read_instance(sqlite3_stmt *st, void *row)
{
    struct instance *in = row;
    store_column_text(in->id, sizeof in->id, st, 0);
    store_column_text(in->user_id, sizeof in->user_id, st, 1);
    store_column_text(in->name, sizeof in->name, st, 2);
    store_column_text(in->gpu_model, sizeof in->gpu_model, st, 3);
    in->card_count = sqlite3_column_int64(st, 4);
    store_column_text(in->image, sizeof in->image, st, 5);
    store_column_text(in->volume_id, sizeof in->volume_id, st, 6);
    store_column_text(in->desired, sizeof in->desired, st, 7);
    store_column_text(in->state, sizeof in->state, st, 8);
    store_column_text(in->phase, sizeof in->phase, st, 9);
    store_column_text(in->state_reason, sizeof in->state_reason, st, 10);
    in->attempts = sqlite3_column_int64(st, 11);
    in->next_attempt_at = sqlite3_column_int64(st, 12);
    in->state_since = sqlite3_column_int64(st, 13);
    in->created_at = sqlite3_column_int64(st, 14);
    in->updated_at = sqlite3_column_int64(st, 15);
    store_read_job_columns(st, sqlite3_column_count(st) - STORE_JOB_NCOLS, in);
}

int store_instance_insert(struct store *s, const struct instance *in)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, in->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, in->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, in->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, in->gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, in->card_count);
    sqlite3_bind_text(st, 6, in->image, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, in->volume_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, in->desired, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, in->state, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 10, in->phase, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 11, in->state_reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 12, in->attempts);
    sqlite3_bind_int64(st, 13, in->next_attempt_at);
    sqlite3_bind_int64(st, 14, in->state_since);
    sqlite3_bind_int64(st, 15, in->created_at);
    sqlite3_bind_int64(st, 16, in->updated_at);
    return store_step_write(s, st, "insert instance");
}

int store_instance_get(struct store *s, const char *user_id, const char *id, struct instance *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_GET);
    if (!st)
        return STORE_ERROR;
    if (user_id)
        sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_instance, "get instance");
}

int store_instance_list(struct store *s, const struct instance_filter *f, struct instance *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_INS_LIST);
    if (!st)
        return STORE_ERROR;
    if (f->user_id)
        sqlite3_bind_text(st, 1, f->user_id, -1, SQLITE_STATIC);
    if (f->state)
        sqlite3_bind_text(st, 2, f->state, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, f->after_created);
    sqlite3_bind_text(st, 4, f->after_id ? f->after_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_instance, "list instances");
}

int store_instance_unsettled(struct store *s, struct instance **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_UNSETTLED);
    if (!st)
        return STORE_ERROR;
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_instance, "unsettled instances");
    *out = rows;
    return rc;
}

int store_instance_attention(struct store *s, const char (*nodes)[ID_MAX], size_t n_nodes, struct instance **out,
                             size_t *n)
{
    char *list = store_ids_json(nodes, n_nodes);
    if (!list)
        return STORE_ERROR;
    int rc = STORE_ERROR;
    sqlite3_stmt *st = store_stmt(s, SQL_INS_ATTENTION);
    if (st) {
        sqlite3_bind_text(st, 1, list, -1, SQLITE_STATIC);
        void *rows;
        rc = store_collect(s, st, sizeof **out, &rows, n, read_instance, "instances needing attention");
        *out = rows;
        sqlite3_clear_bindings(st);
    }
    free(list);
    return rc;
}

int store_instance_event(struct store *s, const char *id, int64_t at, const char *state, const char *reason)
{
    sqlite3_stmt *st = store_stmt(s, SQL_EVENT_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, at);
    sqlite3_bind_text(st, 3, state, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, reason ? reason : "", -1, SQLITE_STATIC);
    return store_step_write(s, st, "insert instance event");
}

int store_instance_set_state(struct store *s, const char *id, const char *state, const char *phase, const char *reason,
                             int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_CURRENT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_reset(st);
        return rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "instance state");
    }
    if (!reason)
        reason = "";
    int state_changed = strcmp((const char *)sqlite3_column_text(st, 0), state) != 0;
    int phase_changed = strcmp((const char *)sqlite3_column_text(st, 1), phase) != 0;
    int reason_changed = strcmp((const char *)sqlite3_column_text(st, 2), reason) != 0;
    sqlite3_reset(st);
    if (!state_changed && !phase_changed && !reason_changed)
        return STORE_OK; /* a pass that saw nothing new writes nothing */
    st = store_stmt(s, state_changed ? SQL_INS_SET_STATE : SQL_INS_SET_PHASE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, phase, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, now);
    if ((rc = store_step_change(s, st, "set instance state")) != STORE_OK)
        return rc;
    if (state_changed)
        return store_instance_event(s, id, now, state, reason);
    if (phase_changed && phase[0])
        return store_instance_event(s, id, now, phase, "the slowest node reached this phase");
    return STORE_OK;
}

int store_instance_set_desired(struct store *s, const char *id, const char *desired, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_SET_DESIRED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, desired, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now);
    return store_step_change(s, st, "set instance desired");
}

int store_instance_set_attempts(struct store *s, const char *id, int64_t attempts, int64_t next_attempt_at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_SET_ATTEMPTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, attempts);
    sqlite3_bind_int64(st, 3, next_attempt_at);
    return store_step_change(s, st, "set instance attempts");
}

static void read_event(sqlite3_stmt *st, void *row)
{
    struct instance_event *e = row;
    e->seq = sqlite3_column_int64(st, 0);
    e->at = sqlite3_column_int64(st, 1);
    store_column_text(e->state, sizeof e->state, st, 2);
    store_column_text(e->reason, sizeof e->reason, st, 3);
}

int store_instance_events(struct store *s, const char *id, int64_t after_seq, struct instance_event *out, size_t max,
                          size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_EVENT_LIST);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_event, "instance events");
}

static void read_instance_node(sqlite3_stmt *st, void *row)
{
    struct instance_node *p = row;
    p->rank = sqlite3_column_int64(st, 0);
    store_column_text(p->node_id, sizeof p->node_id, st, 1);
    store_column_text(p->node_name, sizeof p->node_name, st, 2);
    store_column_text(p->agent_url, sizeof p->agent_url, st, 3);
    store_column_text(p->secret, sizeof p->secret, st, 4);
    store_column_text(p->node_health, sizeof p->node_health, st, 5);
    p->node_last_seen = sqlite3_column_int64(st, 6);
    store_column_text(p->workload_id, sizeof p->workload_id, st, 7);
    store_column_text(p->cards, sizeof p->cards, st, 8);
    store_column_text(p->phase, sizeof p->phase, st, 9);
    store_column_text(p->message, sizeof p->message, st, 10);
    p->put_done = sqlite3_column_int(st, 11);
    store_column_text(p->public_host, sizeof p->public_host, st, 12);
    p->ssh_port = sqlite3_column_int64(st, 13);
    store_column_text(p->ssh_host_key, sizeof p->ssh_host_key, st, 14);
    store_column_text(p->ssh_host_fp, sizeof p->ssh_host_fp, st, 15);
    store_column_text(p->ports, sizeof p->ports, st, 16);
    store_column_text(p->data_host, sizeof p->data_host, st, 17);
    store_column_text(p->data_address, sizeof p->data_address, st, 18);
    store_column_text(p->health, sizeof p->health, st, 19);
    p->health_check = sqlite3_column_int(st, 20);
}

int store_instance_nodes(struct store *s, const char *id, struct instance_node *out, size_t max, size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_INS_NODES);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_instance_node, "instance nodes");
}

static void read_candidate(sqlite3_stmt *st, void *row)
{
    struct placement_node *pn = row;
    store_column_text(pn->id, sizeof pn->id, st, 0);
    store_column_text(pn->fabric, sizeof pn->fabric, st, 1);
    pn->card_count = sqlite3_column_int(st, 2);
    pn->free_mask = 0;
    /* "0,1,5": the free card indexes. */
    for (const char *p = (const char *)sqlite3_column_text(st, 3); p && *p;) {
        char *end;
        long idx = strtol(p, &end, 10);
        if (end == p)
            break;
        if (idx >= 0 && idx < 64)
            pn->free_mask |= (uint64_t)1 << idx;
        p = *end == ',' ? end + 1 : end;
    }
}

int store_placement_candidates(struct store *s, const char *gpu_model, int64_t cards, struct placement_node **out,
                               size_t *n)
{
    return store_placement_candidates_ports(s, gpu_model, cards, 0, out, n);
}

int store_placement_candidates_ports(struct store *s, const char *gpu_model, int64_t cards, int64_t ports,
                                     struct placement_node **out, size_t *n)
{
    return store_placement_candidates_pool(s, gpu_model, cards, ports, "on_demand", out, n);
}

int store_placement_candidates_pool(struct store *s, const char *gpu_model, int64_t cards, int64_t ports,
                                    const char *pool, struct placement_node **out, size_t *n)
{
    int whole = cards > PLACEMENT_NODE_CARDS;
    sqlite3_stmt *st = store_stmt(s, whole ? SQL_CANDIDATES_WHOLE : SQL_CANDIDATE_BEST_FIT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, whole ? PLACEMENT_NODE_CARDS : cards);
    sqlite3_bind_int64(st, 3, ports);
    sqlite3_bind_text(st, 4, pool, -1, SQLITE_STATIC);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_candidate, "placement candidates");
    *out = rows;
    return rc;
}

/* One node, if it is a candidate that has `cards` free: as the best fit's
 * query with the node named (?5), for placing an instance again where it
 * ran. */
static const char SQL_CANDIDATE_NODE[] = CANDIDATE_COLUMNS " AND n.free_cards >= ?2 AND n.id = ?5";

int store_placement_candidate_node(struct store *s, const char *gpu_model, int64_t cards, int64_t ports,
                                   const char *pool, const char *node_id, struct placement_node **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_CANDIDATE_NODE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, cards);
    sqlite3_bind_int64(st, 3, ports);
    sqlite3_bind_text(st, 4, pool, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, node_id, -1, SQLITE_STATIC);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_candidate, "placement candidate node");
    *out = rows;
    return rc;
}

/* An instance inside a bound block (0028): its block's nodes only, and on
 * each at most the cards the block holds there less what its other
 * instances hold; ?4 is the pool, ?5 the block, ?6 the instance. */
static const char SQL_CANDIDATES_BOUND[] =
    CANDIDATE_COLUMNS " AND n.id IN (SELECT b.node_id FROM reservation_nodes b WHERE b.reservation_id = ?5)"
    " ORDER BY n.fabric, n.name";
static const char SQL_BOUND_ALLOWANCE[] =
    "SELECT b.cards - (SELECT count(*) FROM node_cards c JOIN instances i ON i.id = c.instance_id"
    "  WHERE c.node_id = b.node_id AND i.reservation_id = ?1 AND i.id <> ?3)"
    " FROM reservation_nodes b WHERE b.reservation_id = ?1 AND b.node_id = ?2";

/* Keeps only the lowest `allowed` bits of a free mask. */
static uint64_t keep_lowest(uint64_t mask, int64_t allowed)
{
    uint64_t out = 0;
    for (int i = 0; i < 64 && allowed > 0; i++)
        if (mask & ((uint64_t)1 << i)) {
            out |= (uint64_t)1 << i;
            allowed--;
        }
    return out;
}

int store_placement_candidates_bound(struct store *s, const char *gpu_model, int64_t ports, const char *reservation_id,
                                     const char *instance_id, struct placement_node **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_CANDIDATES_BOUND);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, ports);
    sqlite3_bind_text(st, 4, "reserved", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, reservation_id, -1, SQLITE_STATIC);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_candidate, "bound placement candidates");
    *out = rows;
    for (size_t i = 0; rc == STORE_OK && i < *n; i++) {
        struct placement_node *pn = &(*out)[i];
        if (!(st = store_stmt(s, SQL_BOUND_ALLOWANCE)))
            return STORE_ERROR;
        sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, pn->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, instance_id, -1, SQLITE_STATIC);
        int step = sqlite3_step(st);
        int64_t allowed = step == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
        rc = step == SQLITE_ROW || step == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, step, "bound cards");
        sqlite3_reset(st);
        pn->free_mask = keep_lowest(pn->free_mask, allowed);
    }
    return rc;
}

int store_instance_claim(struct store *s, const char *instance_id, int64_t rank, const char *node_id,
                         const char *workload_id, uint64_t cards)
{
    char list[256] = "[";
    size_t len = 1;
    for (int idx = 0; idx < 64; idx++) {
        if (!(cards & ((uint64_t)1 << idx)))
            continue;
        sqlite3_stmt *st = store_stmt(s, SQL_CARD_CLAIM);
        if (!st)
            return STORE_ERROR;
        sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, node_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 3, idx);
        int rc = store_step_change(s, st, "claim card");
        /* A card taken meanwhile: the caller's transaction rolls back, so no
         * partial claim survives. */
        if (rc == STORE_NOT_FOUND)
            return STORE_CONFLICT;
        if (rc != STORE_OK)
            return rc;
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len > 1 ? "," : "", idx);
    }
    snprintf(list + len, sizeof list - len, "]");
    sqlite3_stmt *st = store_stmt(s, SQL_PLACEMENT_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, rank);
    sqlite3_bind_text(st, 3, node_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, workload_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, list, -1, SQLITE_STATIC);
    return store_step_write(s, st, "insert placement");
}

int store_instance_release(struct store *s, const char *instance_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_CARD_RELEASE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    int rc = store_step_write(s, st, "release cards");
    if (rc != STORE_OK)
        return rc;
    st = store_stmt(s, SQL_PORTS_RELEASE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    if ((rc = store_step_write(s, st, "release host ports")) != STORE_OK)
        return rc;
    static const char *const steps[][2] = {{SQL_PAST_RANKS_CLEAR, "clear past ranks"},
                                           {SQL_PAST_RANKS_KEEP, "keep past ranks"},
                                           {SQL_PLACEMENT_DELETE, "delete placement"}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0] && rc == STORE_OK; i++) {
        if (!(st = store_stmt(s, steps[i][0])))
            return STORE_ERROR;
        sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
        rc = store_step_write(s, st, steps[i][1]);
    }
    return rc;
}

static void read_failed_card(sqlite3_stmt *st, void *row)
{
    struct placement_unfit *u = row;
    store_column_text(u->failed_node, sizeof u->failed_node, st, 0);
    u->failed_card = sqlite3_column_int64(st, 1);
}

static void read_node_aside(sqlite3_stmt *st, void *row)
{
    struct placement_unfit *u = row;
    store_column_text(u->aside_node, sizeof u->aside_node, st, 0);
    store_column_text(u->aside_state, sizeof u->aside_state, st, 1);
}

int store_instance_failed_card(struct store *s, const char *instance_id, struct placement_unfit *out)
{
    memset(out, 0, sizeof *out);
    out->failed_card = -1;
    sqlite3_stmt *st = store_stmt(s, SQL_PLACED_FAILED_CARD);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    int rc = store_read_one(s, st, out, read_failed_card, "placed failed card");
    return rc == STORE_NOT_FOUND ? STORE_OK : rc;
}

int store_instance_unfit(struct store *s, const char *instance_id, struct placement_unfit *out)
{
    int rc = store_instance_failed_card(s, instance_id, out);
    if (rc != STORE_OK)
        return rc;
    sqlite3_stmt *st = store_stmt(s, SQL_PLACED_NODE_ASIDE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    rc = store_read_one(s, st, out, read_node_aside, "placed node set aside");
    return rc == STORE_NOT_FOUND ? STORE_OK : rc;
}

static void read_past_rank(sqlite3_stmt *st, void *row)
{
    struct instance_node *p = row;
    p->rank = sqlite3_column_int64(st, 0);
    store_column_text(p->node_id, sizeof p->node_id, st, 1);
    store_column_text(p->node_name, sizeof p->node_name, st, 2);
    store_column_text(p->agent_url, sizeof p->agent_url, st, 3);
    store_column_text(p->secret, sizeof p->secret, st, 4);
    store_column_text(p->workload_id, sizeof p->workload_id, st, 5);
}

int store_instance_past_rank(struct store *s, const char *instance_id, int64_t rank, struct instance_node *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = store_stmt(s, SQL_PAST_RANK);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, rank);
    size_t n = 0;
    int rc = store_read_rows(s, st, out, sizeof *out, 1, &n, read_past_rank, "past rank");
    return rc == STORE_OK && n == 0 ? STORE_NOT_FOUND : rc;
}

int store_instance_node_update(struct store *s, const char *instance_id, int64_t rank, const char *phase,
                               const char *message, int put_done)
{
    sqlite3_stmt *st = store_stmt(s, SQL_PLACEMENT_UPDATE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, rank);
    sqlite3_bind_text(st, 3, phase, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, message, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, put_done);
    return store_step_change(s, st, "update placement");
}

int store_instance_node_health(struct store *s, const char *instance_id, int64_t rank, const char *health,
                               int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_PLACEMENT_HEALTH);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, rank);
    sqlite3_bind_text(st, 3, health, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, at);
    return store_step_change(s, st, "update rank health");
}

int store_interval_open(struct store *s, const struct instance *in, int64_t started_at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INTERVAL_OPEN);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, in->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, in->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, in->gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, in->card_count);
    sqlite3_bind_int64(st, 5, started_at);
    return store_step_write(s, st, "open running interval");
}

int store_interval_close(struct store *s, const char *instance_id, int64_t ended_at, const char *reason)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INTERVAL_CLOSE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, ended_at);
    sqlite3_bind_text(st, 3, reason, -1, SQLITE_STATIC);
    return store_step_write(s, st, "close running interval");
}

static int64_t single_int(struct store *s, const char *sql, const char *arg, int64_t if_none, const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int64_t v = rc == SQLITE_ROW    ? sqlite3_column_int64(st, 0)
                : rc == SQLITE_DONE ? if_none
                                    : store_rc_from_sqlite(s, rc, what);
    sqlite3_reset(st);
    return v;
}

int64_t store_free_cards(struct store *s, const char *gpu_model)
{
    return store_int64_by_text(s, SQL_FREE_CARDS, gpu_model, "free cards");
}

int64_t store_user_cards_in_use(struct store *s, const char *user_id, const char *except_instance)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USER_CARDS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, except_instance ? except_instance : "", -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : store_rc_from_sqlite(s, rc, "user cards");
    sqlite3_reset(st);
    return v;
}

int64_t store_user_max_cards(struct store *s, const char *user_id, int64_t def)
{
    return single_int(s, SQL_USER_MAX_CARDS, user_id, def, "user max cards");
}

int store_user_set_max_cards(struct store *s, const char *user_id, int64_t max_cards)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USER_SET_MAX_CARDS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, max_cards);
    return store_step_write(s, st, "set user max cards");
}

int store_placed_workloads(struct store *s, const char (*nodes)[ID_MAX], size_t n_nodes, char (**out)[ID_MAX],
                           size_t *n)
{
    *out = NULL;
    *n = 0;
    char *list = NULL;
    if (nodes && !(list = store_ids_json(nodes, n_nodes)))
        return STORE_ERROR;
    sqlite3_stmt *st = store_stmt(s, nodes ? SQL_PLACED_WORKLOADS_ON : SQL_PLACED_WORKLOADS);
    if (!st) {
        free(list);
        return STORE_ERROR;
    }
    if (list)
        sqlite3_bind_text(st, 1, list, -1, SQLITE_STATIC);
    void *rows;
    int rc = store_collect(s, st, ID_MAX, &rows, n, store_read_id, "placed workloads");
    *out = rows;
    sqlite3_clear_bindings(st);
    free(list);
    return rc;
}

int store_workload_placed(struct store *s, const char *workload_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_WORKLOAD_PLACED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, workload_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : STORE_ERROR;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc;
}

static void read_model_cards(sqlite3_stmt *st, void *row)
{
    struct model_cards *m = row;
    store_column_text(m->gpu_model, sizeof m->gpu_model, st, 0);
    m->cards = sqlite3_column_int64(st, 1);
}

int store_user_cards_by_model(struct store *s, const char *user_id, struct model_cards **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_USER_CARDS_BY_MODEL);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    return store_collect(s, st, sizeof **out, (void **)out, n, read_model_cards, "cards by model");
}

static const char SQL_USER_VOLUME_LIMITS[] =
    "SELECT coalesce(max_volumes, -1), coalesce(max_volume_gb, -1) FROM user_volume_limits WHERE user_id = ?";
static const char SQL_USER_SET_VOLUME_LIMITS[] =
    "INSERT INTO user_volume_limits (user_id, max_volumes, max_volume_gb) VALUES (?1, nullif(?2, -1), nullif(?3, -1))"
    " ON CONFLICT (user_id) DO UPDATE SET max_volumes = CASE WHEN ?2 = -1 THEN max_volumes ELSE ?2 END,"
    " max_volume_gb = CASE WHEN ?3 = -1 THEN max_volume_gb ELSE ?3 END";
static const char SQL_USER_VOLUME_USAGE[] =
    "SELECT count(*), coalesce(sum(size_gb), 0) FROM volumes WHERE user_id = ? AND deleted_at IS NULL";

int store_user_volume_limits(struct store *s, const char *user_id, int64_t def_count, int64_t def_gb,
                             int64_t *max_volumes, int64_t *max_gb)
{
    *max_volumes = def_count;
    *max_gb = def_gb;
    sqlite3_stmt *st = store_stmt(s, SQL_USER_VOLUME_LIMITS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        if (sqlite3_column_int64(st, 0) >= 0)
            *max_volumes = sqlite3_column_int64(st, 0);
        if (sqlite3_column_int64(st, 1) >= 0)
            *max_gb = sqlite3_column_int64(st, 1);
    }
    int out = rc == SQLITE_ROW || rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, "user volume limits");
    sqlite3_reset(st);
    return out;
}

int store_user_set_volume_limits(struct store *s, const char *user_id, int64_t max_volumes, int64_t max_gb)
{
    sqlite3_stmt *st = store_stmt(s, SQL_USER_SET_VOLUME_LIMITS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, max_volumes);
    sqlite3_bind_int64(st, 3, max_gb);
    return store_step_write(s, st, "set user volume limits");
}

int store_user_volume_usage(struct store *s, const char *user_id, int64_t *count, int64_t *gb)
{
    *count = *gb = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_USER_VOLUME_USAGE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *count = sqlite3_column_int64(st, 0);
        *gb = sqlite3_column_int64(st, 1);
    }
    int out = rc == SQLITE_ROW ? STORE_OK : store_rc_from_sqlite(s, rc, "user volume usage");
    sqlite3_reset(st);
    return out;
}
