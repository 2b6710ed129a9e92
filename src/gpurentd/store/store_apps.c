/* store_apps.c: SQL of the app marketplace (migration 0025): apps and who
 * may call a private one, replicas (instances with app_id), the calls the
 * gateways report, their demand, the apps' events, and the documents the
 * gateways and the stats routes read, built as JSON text by SQLite. */
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define APP_COLUMNS                                                                                               \
    "id, slug, name, description, publisher_id, image, command, env, port, gpu_type, cards_per_replica,"         \
    " min_replicas, max_replicas, concurrency_target, idle_seconds, visibility, price_request, price_input_1k," \
    " price_output_1k, price_second, rate_per_key, rate_per_app, desired_replicas, last_call_at, below_since,"   \
    " created_at, updated_at, coalesce(deleted_at, 0), health_path"

static const char SQL_APP_INSERT[] =
    "INSERT INTO apps (id, slug, name, description, publisher_id, image, command, env, port, gpu_type,"
    " cards_per_replica, min_replicas, max_replicas, concurrency_target, idle_seconds, visibility, price_request,"
    " price_input_1k, price_output_1k, price_second, rate_per_key, rate_per_app, desired_replicas, last_call_at,"
    " below_since, created_at, updated_at, health_path) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12,"
    " ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28)";
static const char SQL_APP_UPDATE[] =
    "UPDATE apps SET slug = ?2, name = ?3, description = ?4, publisher_id = ?5, image = ?6, command = ?7, env = ?8,"
    " port = ?9, gpu_type = ?10, cards_per_replica = ?11, min_replicas = ?12, max_replicas = ?13,"
    " concurrency_target = ?14, idle_seconds = ?15, visibility = ?16, price_request = ?17, price_input_1k = ?18,"
    " price_output_1k = ?19, price_second = ?20, rate_per_key = ?21, rate_per_app = ?22, desired_replicas = ?23,"
    " last_call_at = ?24, below_since = ?25, created_at = ?26, updated_at = ?27, health_path = ?28 WHERE id = ?1";
static const char SQL_APP_GET[] = "SELECT " APP_COLUMNS " FROM apps WHERE slug = ? AND deleted_at IS NULL";
static const char SQL_APP_BY_ID[] = "SELECT " APP_COLUMNS " FROM apps WHERE id = ?";
static const char SQL_APP_LIST[] =
    "SELECT " APP_COLUMNS " FROM apps WHERE deleted_at IS NULL"
    " AND ((?1 IS NULL AND visibility = 'public'"
    "   AND (SELECT status FROM users u WHERE u.id = apps.publisher_id) = 'active') OR publisher_id = ?1)"
    " AND (created_at > ?2 OR (created_at = ?2 AND id > ?3)) ORDER BY created_at, id LIMIT ?4";
static const char SQL_APP_ALL[] = "SELECT " APP_COLUMNS " FROM apps WHERE deleted_at IS NULL ORDER BY id";
static const char SQL_APP_DELETE[] = "UPDATE apps SET deleted_at = ?2, updated_at = ?2 WHERE id = ?1"
                                     " AND deleted_at IS NULL";
static const char SQL_ACCESS_CLEAR[] = "DELETE FROM app_access WHERE app_id = ?";
static const char SQL_ACCESS_ADD[] = "INSERT OR IGNORE INTO app_access (app_id, user_id) VALUES (?, ?)";
static const char SQL_ACCESS_JSON[] =
    "SELECT coalesce(json_group_array(user_id), '[]') FROM (SELECT user_id FROM app_access WHERE app_id = ?"
    " ORDER BY user_id)";
static const char SQL_EVENT_INSERT[] = "INSERT INTO app_events (app_id, at, kind, detail) VALUES (?, ?, ?, ?)";
static const char SQL_LAST_EVENT[] =
    "SELECT kind = ?2 AND at >= ?3 FROM app_events WHERE app_id = ?1 ORDER BY seq DESC LIMIT 1";
static const char SQL_EVENTS_JSON[] =
    "SELECT coalesce(json_group_array(json_object('seq', seq, 'at', at, 'kind', kind, 'detail', detail)), '[]')"
    " FROM (SELECT * FROM (SELECT seq, at, kind, detail FROM app_events WHERE app_id = ?1 ORDER BY seq DESC"
    " LIMIT ?2) ORDER BY seq)";
static const char SQL_REPLICAS[] =
    "SELECT id, state, desired, created_at, coalesce((SELECT r.health FROM instance_nodes r WHERE r.instance_id = i.id"
    " AND r.rank = 0), '') FROM instances i WHERE app_id = ? AND state NOT IN ('terminated', 'failed')"
    " ORDER BY created_at, id";
static const char SQL_SET_APP[] = "UPDATE instances SET app_id = ?2 WHERE id = ?1";
/* A replica takes traffic once its instance runs, rank 0 publishes the
 * app's port and its agent reported the app's health check passing (0027).
 * Replicas are listed by instance id: gateways break ties between equally
 * busy replicas by the order, which is then the same on each. A suspended
 * publisher's apps are not served (nor listed in the market). */
static const char SQL_GATEWAY_APPS[] =
    "SELECT coalesce(json_group_array(json(doc)), '[]') FROM (SELECT json_object('id', a.id, 'slug', a.slug,"
    " 'publisher_id', a.publisher_id, 'visibility', a.visibility, 'price_request', a.price_request,"
    " 'price_input_1k', a.price_input_1k, 'price_output_1k', a.price_output_1k, 'price_second', a.price_second,"
    " 'rate_per_key', a.rate_per_key, 'rate_per_app', a.rate_per_app, 'min_replicas', a.min_replicas,"
    " 'allowed', (SELECT json_group_array(x.user_id) FROM app_access x WHERE x.app_id = a.id),"
    " 'replicas', (SELECT json_group_array(json_object('instance_id', id, 'public_host', public_host,"
    "   'agent_url', agent_url, 'host_port', host_port)) FROM (SELECT i.id, n.public_host, n.agent_url,"
    "   (SELECT json_extract(p.value, '$.host') FROM json_each(r.ports) p"
    "   WHERE json_extract(p.value, '$.container') = a.port) AS host_port"
    "   FROM instances i JOIN instance_nodes r ON r.instance_id = i.id AND r.rank = 0"
    "   JOIN nodes n ON n.id = r.node_id WHERE i.app_id = a.id AND i.state = 'running' AND i.desired = 'running'"
    "   AND r.health = 'healthy' ORDER BY i.id)))"
    " AS doc FROM apps a WHERE a.deleted_at IS NULL"
    " AND (SELECT status FROM users u WHERE u.id = a.publisher_id) = 'active' ORDER BY a.id)";
/* Keys by id with the secret's hash in hex: the gateway compares hashes
 * and never sees a secret. */
static const char SQL_GATEWAY_KEYS[] =
    "SELECT coalesce(json_group_array(json_object('id', k.id, 'user_id', k.user_id, 'hash', lower(hex(k.secret_hash)),"
    " 'expires_at', coalesce(k.expires_at, 0))), '[]') FROM api_keys k JOIN users u ON u.id = k.user_id"
    " WHERE k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at = 0 OR k.expires_at > ?1)"
    " AND u.status = 'active'";
/* Calls of rate-limited apps reported since ?1, per minute, key and the
 * gateway that served them (app_calls_by_app takes each app's range). */
static const char SQL_GATEWAY_RECENT_CALLS[] =
    "SELECT coalesce(json_group_array(json_object('app_id', app_id, 'key_id', key_id, 'gateway_id', gateway_id,"
    " 'minute', minute, 'calls', calls)), '[]') FROM (SELECT app_id, key_id, gateway_id, at / 60 AS minute,"
    " count(*) AS calls FROM app_calls WHERE app_id IN (SELECT id FROM apps WHERE rate_per_key > 0 OR"
    " rate_per_app > 0) AND at >= ?1 GROUP BY app_id, key_id, gateway_id, minute)";
static const char SQL_GATEWAY_KEY_USERS[] =
    "SELECT DISTINCT k.user_id FROM api_keys k JOIN users u ON u.id = k.user_id WHERE k.revoked_at IS NULL"
    " AND u.status = 'active' ORDER BY k.user_id";
static const char SQL_GATEWAY_REPORT_PUT[] =
    "INSERT INTO gateway_reports (gateway_id, run, seq, at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (gateway_id) DO UPDATE"
    " SET seq = CASE WHEN run = excluded.run THEN max(seq, excluded.seq) ELSE excluded.seq END, run = excluded.run,"
    " at = excluded.at";
static const char SQL_GATEWAY_REPORTS_FORGET[] = "DELETE FROM gateway_reports WHERE at < ?1";
static const char SQL_GATEWAY_REPORTED[] =
    "SELECT coalesce(json_group_array(json_object('gateway_id', gateway_id, 'run', run, 'seq', seq)), '[]')"
    " FROM gateway_reports WHERE at >= ?1";
static const char SQL_CALL_INSERT[] =
    "INSERT INTO app_calls (id, app_id, consumer_id, key_id, gateway_id, at, status, input_tokens, output_tokens,"
    " duration_ms, cold_start, completed, charge, earning, fee, unpaid, transaction_id, created_at) VALUES (?1, ?2,"
    " ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,"
    " (SELECT max(id) FROM ledger_transactions WHERE app_call_id = ?1), ?17)";
static const char SQL_CALL_EXISTS[] = "SELECT 1 FROM app_calls WHERE id = ?";
static const char SQL_DEMAND_PUT[] =
    "INSERT INTO app_demand (app_id, gateway_id, in_flight, queued, at, busy) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
    " ON CONFLICT (app_id, gateway_id) DO UPDATE SET in_flight = ?3, queued = ?4, at = ?5, busy = ?6";
static const char SQL_REPLICA_BUSY[] =
    "SELECT EXISTS (SELECT 1 FROM app_demand d, json_each(d.busy) j WHERE d.app_id = ?1 AND d.at >= ?2"
    " AND j.value = ?3)";
static const char SQL_APP_CHECK[] =
    "SELECT a.id, a.port, a.health_path FROM instances i JOIN apps a ON a.id = i.app_id WHERE i.id = ?";
static const char SQL_DEMAND[] =
    "SELECT coalesce(sum(in_flight + queued), 0) FROM app_demand WHERE app_id = ?1 AND at >= ?2";
/* Latency percentiles by rank within the day (nearest rank). */
static const char SQL_STATS[] =
    "WITH c AS (SELECT date(at, 'unixepoch') AS day, * FROM app_calls WHERE app_id = ?1 AND at >= ?2 AND at < ?3),"
    " r AS (SELECT day, duration_ms, row_number() OVER (PARTITION BY day ORDER BY duration_ms) AS k,"
    " count(*) OVER (PARTITION BY day) AS n FROM c)"
    " SELECT coalesce(json_group_array(json_object('day', day, 'calls', calls, 'errors', errors, 'error_rate',"
    " round(1.0 * errors / calls, 6), 'input_tokens', tin, 'output_tokens', tout, 'earnings_micro', earn,"
    " 'fees_micro', fees, 'charged_micro', charged, 'cold_starts', cold, 'latency_p50_ms', (SELECT min(duration_ms)"
    " FROM r WHERE r.day = g.day AND r.k >= 0.50 * r.n), 'latency_p99_ms', (SELECT min(duration_ms) FROM r WHERE"
    " r.day = g.day AND r.k >= 0.99 * r.n))), '[]') FROM (SELECT day, count(*) AS calls, sum(status >= 400 OR"
    " completed = 0) AS errors, sum(input_tokens) AS tin, sum(output_tokens) AS tout, sum(earning) AS earn,"
    " sum(fee) AS fees, sum(charge) AS charged, sum(cold_start) AS cold FROM c GROUP BY day ORDER BY day) g";
static const char SQL_USAGE[] =
    "SELECT coalesce(json_group_array(json_object('app_id', app_id, 'slug', slug, 'calls', calls, 'input_tokens',"
    " tin, 'output_tokens', tout, 'charged_micro', charged)), '[]') FROM (SELECT c.app_id, a.slug, count(*) AS calls,"
    " sum(c.input_tokens) AS tin, sum(c.output_tokens) AS tout, sum(c.charge) AS charged FROM app_calls c JOIN apps a"
    " ON a.id = c.app_id WHERE c.consumer_id = ?1 AND c.at >= ?2 AND c.at < ?3 GROUP BY c.app_id ORDER BY a.slug)";

static char *column_dup(sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    return strdup(t ? (const char *)t : "");
}

static void read_app(sqlite3_stmt *st, void *row)
{
    struct app *a = row;
    memset(a, 0, sizeof *a);
    store_column_text(a->id, sizeof a->id, st, 0);
    store_column_text(a->slug, sizeof a->slug, st, 1);
    store_column_text(a->name, sizeof a->name, st, 2);
    store_column_text(a->description, sizeof a->description, st, 3);
    store_column_text(a->publisher_id, sizeof a->publisher_id, st, 4);
    store_column_text(a->image, sizeof a->image, st, 5);
    a->command = column_dup(st, 6);
    a->env = column_dup(st, 7);
    a->port = sqlite3_column_int64(st, 8);
    store_column_text(a->gpu_type, sizeof a->gpu_type, st, 9);
    int64_t *ints[] = {&a->cards_per_replica, &a->min_replicas,  &a->max_replicas,     &a->concurrency_target,
                       &a->idle_seconds};
    for (int i = 0; i < 5; i++)
        *ints[i] = sqlite3_column_int64(st, 10 + i);
    store_column_text(a->visibility, sizeof a->visibility, st, 15);
    int64_t *rest[] = {&a->price_request, &a->price_input_1k, &a->price_output_1k, &a->price_second,
                       &a->rate_per_key,  &a->rate_per_app,   &a->desired_replicas, &a->last_call_at,
                       &a->below_since,   &a->created_at,     &a->updated_at,       &a->deleted_at};
    for (int i = 0; i < 12; i++)
        *rest[i] = sqlite3_column_int64(st, 16 + i);
    store_column_text(a->health_path, sizeof a->health_path, st, 28);
}

void store_app_free(struct app *a)
{
    if (!a)
        return;
    free(a->command);
    free(a->env);
    a->command = a->env = NULL;
}

/* The insert and the update bind the same 28 values. */
static void bind_app(sqlite3_stmt *st, const struct app *a)
{
    const char *texts[] = {a->id, a->slug, a->name, a->description, a->publisher_id, a->image,
                           a->command ? a->command : "[]", a->env ? a->env : "[]"};
    for (int i = 0; i < 8; i++)
        sqlite3_bind_text(st, 1 + i, texts[i], -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 9, a->port);
    sqlite3_bind_text(st, 10, a->gpu_type, -1, SQLITE_STATIC);
    const int64_t ints[] = {a->cards_per_replica, a->min_replicas, a->max_replicas, a->concurrency_target,
                            a->idle_seconds};
    for (int i = 0; i < 5; i++)
        sqlite3_bind_int64(st, 11 + i, ints[i]);
    sqlite3_bind_text(st, 16, a->visibility, -1, SQLITE_STATIC);
    const int64_t rest[] = {a->price_request, a->price_input_1k, a->price_output_1k, a->price_second,
                            a->rate_per_key,  a->rate_per_app,   a->desired_replicas, a->last_call_at,
                            a->below_since,   a->created_at,     a->updated_at};
    for (int i = 0; i < 11; i++)
        sqlite3_bind_int64(st, 17 + i, rest[i]);
    sqlite3_bind_text(st, 28, a->health_path[0] ? a->health_path : "/health", -1, SQLITE_STATIC);
}

static const char SQL_APP_COUNT_BY_PUBLISHER[] =
    "SELECT count(*) FROM apps WHERE publisher_id = ? AND deleted_at IS NULL";

int64_t store_app_count_by_publisher(struct store *s, const char *user_id)
{
    return store_int64_by_text(s, SQL_APP_COUNT_BY_PUBLISHER, user_id, "count apps");
}

int store_app_insert(struct store *s, const struct app *a)
{
    sqlite3_stmt *st = store_stmt(s, SQL_APP_INSERT);
    if (!st)
        return STORE_ERROR;
    bind_app(st, a);
    return store_step_write(s, st, "insert app");
}

int store_app_update(struct store *s, const struct app *a)
{
    sqlite3_stmt *st = store_stmt(s, SQL_APP_UPDATE);
    if (!st)
        return STORE_ERROR;
    bind_app(st, a);
    return store_step_change(s, st, "update app");
}

int store_app_get(struct store *s, const char *slug, struct app *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = store_stmt(s, SQL_APP_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, slug, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_app, "get app");
}

int store_app_get_by_id(struct store *s, const char *id, struct app *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = store_stmt(s, SQL_APP_BY_ID);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_app, "get app by id");
}

int store_app_list(struct store *s, const char *publisher_id, int64_t after_t, const char *after_id, size_t max,
                   struct app **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_APP_LIST);
    if (!st)
        return STORE_ERROR;
    if (publisher_id)
        sqlite3_bind_text(st, 1, publisher_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after_t);
    sqlite3_bind_text(st, 3, after_id ? after_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)max);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_app, "list apps");
    *out = rows;
    return rc;
}

int store_app_all(struct store *s, struct app **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_APP_ALL);
    if (!st)
        return STORE_ERROR;
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_app, "all apps");
    *out = rows;
    return rc;
}

int store_app_delete(struct store *s, const char *id, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_APP_DELETE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, at);
    return store_step_change(s, st, "delete app");
}

int store_app_access_clear(struct store *s, const char *app_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_ACCESS_CLEAR);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    return store_step_write(s, st, "clear app access");
}

int store_app_access_add(struct store *s, const char *app_id, const char *user_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_ACCESS_ADD);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, user_id, -1, SQLITE_STATIC);
    return store_step_write(s, st, "add app access");
}

/* Steps a statement whose one row is one text (a JSON document). */
static int json_text(struct store *s, sqlite3_stmt *st, char **json, const char *what)
{
    *json = NULL;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *json = column_dup(st, 0);
    int result = rc == SQLITE_ROW ? (*json ? STORE_OK : STORE_ERROR) : store_rc_from_sqlite(s, rc, what);
    sqlite3_reset(st);
    return result;
}

int store_app_access_json(struct store *s, const char *app_id, char **json)
{
    sqlite3_stmt *st = store_stmt(s, SQL_ACCESS_JSON);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    return json_text(s, st, json, "app access");
}

int store_app_event(struct store *s, const char *app_id, int64_t at, const char *kind, const char *detail)
{
    sqlite3_stmt *st = store_stmt(s, SQL_EVENT_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, at);
    sqlite3_bind_text(st, 3, kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, detail ? detail : "", -1, SQLITE_STATIC);
    return store_step_write(s, st, "insert app event");
}

int store_app_last_event_is(struct store *s, const char *app_id, const char *kind, int64_t since)
{
    sqlite3_stmt *st = store_stmt(s, SQL_LAST_EVENT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, kind, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, since);
    int rc = sqlite3_step(st);
    int v = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : rc == SQLITE_DONE ? 0 : store_rc_from_sqlite(s, rc, "event");
    sqlite3_reset(st);
    return v;
}

int store_app_events_json(struct store *s, const char *app_id, size_t max, char **json)
{
    sqlite3_stmt *st = store_stmt(s, SQL_EVENTS_JSON);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)max);
    return json_text(s, st, json, "app events");
}

static void read_replica(sqlite3_stmt *st, void *row)
{
    struct app_replica *r = row;
    store_column_text(r->instance_id, sizeof r->instance_id, st, 0);
    store_column_text(r->state, sizeof r->state, st, 1);
    store_column_text(r->desired, sizeof r->desired, st, 2);
    r->created_at = sqlite3_column_int64(st, 3);
    store_column_text(r->health, sizeof r->health, st, 4);
}

int store_app_replicas(struct store *s, const char *app_id, struct app_replica **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_REPLICAS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    void *rows;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_replica, "app replicas");
    *out = rows;
    return rc;
}

int store_instance_set_app(struct store *s, const char *instance_id, const char *app_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SET_APP);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, app_id, -1, SQLITE_STATIC);
    return store_step_change(s, st, "set instance app");
}

int store_gateway_apps_json(struct store *s, char **json)
{
    sqlite3_stmt *st = store_stmt(s, SQL_GATEWAY_APPS);
    return st ? json_text(s, st, json, "gateway apps") : STORE_ERROR;
}

/* json_text of sql with ?1 bound to t. */
static int json_text_at(struct store *s, const char *sql, int64_t t, char **json, const char *what)
{
    *json = NULL;
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, t);
    return json_text(s, st, json, what);
}

int store_gateway_keys_json(struct store *s, int64_t now, char **json)
{
    return json_text_at(s, SQL_GATEWAY_KEYS, now, json, "gateway keys");
}

int store_gateway_recent_calls_json(struct store *s, int64_t since, char **json)
{
    return json_text_at(s, SQL_GATEWAY_RECENT_CALLS, since, json, "gateway recent calls");
}

int store_gateway_key_users(struct store *s, char (**ids)[ID_MAX], size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_GATEWAY_KEY_USERS);
    if (!st)
        return STORE_ERROR;
    void *rows;
    int rc = store_collect(s, st, ID_MAX, &rows, n, store_read_id, "gateway key users");
    *ids = rows;
    return rc;
}

int store_gateway_report_put(struct store *s, const char *gateway_id, const char *run, int64_t seq, int64_t at,
                             int64_t forget_before)
{
    sqlite3_stmt *st = store_stmt(s, SQL_GATEWAY_REPORTS_FORGET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, forget_before);
    int rc = store_step_write(s, st, "forget gateway reports");
    if (rc != STORE_OK || !(st = store_stmt(s, SQL_GATEWAY_REPORT_PUT)))
        return rc != STORE_OK ? rc : STORE_ERROR;
    sqlite3_bind_text(st, 1, gateway_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, run, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, seq);
    sqlite3_bind_int64(st, 4, at);
    return store_step_write(s, st, "gateway report");
}

int store_gateway_reported_json(struct store *s, int64_t since, char **json)
{
    return json_text_at(s, SQL_GATEWAY_REPORTED, since, json, "gateway reports");
}

int store_app_call_exists(struct store *s, const char *id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_CALL_EXISTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int result = rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "call");
    sqlite3_reset(st);
    return result;
}

int store_app_call_insert(struct store *s, const struct app_call *c, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_CALL_INSERT);
    if (!st)
        return STORE_ERROR;
    const char *texts[] = {c->id, c->app_id, c->consumer_id, c->key_id, c->gateway_id};
    for (int i = 0; i < 5; i++)
        sqlite3_bind_text(st, 1 + i, texts[i], -1, SQLITE_STATIC);
    const int64_t ints[] = {c->at,       c->status, c->input_tokens, c->output_tokens, c->duration_ms, c->cold_start,
                            c->completed, c->charge, c->earning,      c->fee,           c->unpaid};
    for (int i = 0; i < 11; i++)
        sqlite3_bind_int64(st, 6 + i, ints[i]);
    sqlite3_bind_int64(st, 17, now);
    return store_step_write(s, st, "insert app call");
}

int store_app_demand_put(struct store *s, const char *app_id, const char *gateway_id, int64_t in_flight,
                         int64_t queued, const char *busy, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_DEMAND_PUT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, gateway_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, in_flight);
    sqlite3_bind_int64(st, 4, queued);
    sqlite3_bind_int64(st, 5, at);
    sqlite3_bind_text(st, 6, busy ? busy : "[]", -1, SQLITE_STATIC);
    return store_step_write(s, st, "app demand");
}

int store_app_replica_busy(struct store *s, const char *app_id, const char *instance_id, int64_t since)
{
    sqlite3_stmt *st = store_stmt(s, SQL_REPLICA_BUSY);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, since);
    sqlite3_bind_text(st, 3, instance_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int v = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : store_rc_from_sqlite(s, rc, "replica busy");
    sqlite3_reset(st);
    return v;
}

int store_instance_app_check(struct store *s, const char *instance_id, char *app_id, size_t app_id_len,
                             int64_t *port, char *path, size_t path_len)
{
    sqlite3_stmt *st = store_stmt(s, SQL_APP_CHECK);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        store_column_text(app_id, app_id_len, st, 0);
        *port = sqlite3_column_int64(st, 1);
        store_column_text(path, path_len, st, 2);
    }
    int out = rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "app check");
    sqlite3_reset(st);
    return out;
}

int64_t store_app_demand(struct store *s, const char *app_id, int64_t since)
{
    sqlite3_stmt *st = store_stmt(s, SQL_DEMAND);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, app_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, since);
    int rc = sqlite3_step(st);
    int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : store_rc_from_sqlite(s, rc, "app demand");
    sqlite3_reset(st);
    return v;
}

/* The two range documents bind (id, from, to) alike. */
static int range_json(struct store *s, const char *sql, const char *id, int64_t from, int64_t to, char **json,
                      const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, from);
    sqlite3_bind_int64(st, 3, to);
    return json_text(s, st, json, what);
}

int store_app_stats_json(struct store *s, const char *app_id, int64_t from, int64_t to, char **json)
{
    return range_json(s, SQL_STATS, app_id, from, to, json, "app stats");
}

int store_app_usage_json(struct store *s, const char *consumer_id, int64_t from, int64_t to, char **json)
{
    return range_json(s, SQL_USAGE, consumer_id, from, to, json, "app usage");
}
