/* store_gpu_types.c: SQL for the GPU catalog and its live card counts. */
#include "store/store_sql.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Counts come from the card rows: the catalog never caches them, so they
 * cannot drift from the cards themselves. All three are summed in one scan
 * of the type's cards (three subqueries cost three scans, which shows at
 * tens of thousands of cards: instance placement reads a type too). */
#define GPU_TYPE_COLUMNS                                                                                        \
    "t.code, t.vendor, t.memory_gb, t.memory_type, t.stack, t.reservation_required, t.features, t.description," \
    " t.created_at, t.updated_at, coalesce(k.total, 0), coalesce(k.free, 0), coalesce(k.in_use, 0),"   \
    " coalesce(k.reservable, 0), coalesce(k.reserved_idle, 0)"
#define CARD_COUNTS                                                                                       \
    "SELECT n.gpu_model AS code, sum(n.health IN ('up', 'offline')) AS total,"                            \
    " sum(n.health = 'up' AND n.unreachable_since IS NULL AND n.admin_state = 'active' AND c.healthy = 1" \
    "     AND c.instance_id IS NULL AND " STORE_POOL_IS("n", "'on_demand'") ") AS free,"                   \
    " sum(n.health = 'up' AND n.admin_state = 'active' AND c.healthy = 1"                                 \
    "     AND " STORE_POOL_IS("n", "'reserved'") ") AS reservable,"                                        \
    " sum(n.health = 'up' AND n.unreachable_since IS NULL AND n.admin_state = 'active' AND c.healthy = 1" \
    "     AND c.instance_id IS NULL AND " STORE_POOL_IS("n", "'reserved'") ") AS reserved_idle,"           \
    " sum(c.instance_id IS NOT NULL) AS in_use"                                                           \
    " FROM node_cards c JOIN nodes n ON n.id = c.node_id WHERE n.removed_at IS NULL"

static const char SQL_TYPE_LIST[] = "SELECT " GPU_TYPE_COLUMNS " FROM gpu_types t LEFT JOIN (" CARD_COUNTS
                                    " GROUP BY n.gpu_model) k ON k.code = t.code ORDER BY t.code";
static const char SQL_TYPE_GET[] = "SELECT " GPU_TYPE_COLUMNS " FROM gpu_types t LEFT JOIN (" CARD_COUNTS
                                   " AND n.gpu_model = ?1) k ON 1 WHERE t.code = ?1";
/* What the largest on-demand create can be placed on now (placement.h's
 * rules): the most free cards of one node, and the most whole free nodes
 * of one fabric. Both read the nodes_placement index (0006). */
static const char SQL_TYPE_LAUNCHABLE[] =
    "SELECT coalesce((SELECT n.free_cards FROM nodes n WHERE " STORE_NODE_TAKES_ON_DEMAND("?1")
    " ORDER BY n.free_cards DESC LIMIT 1), 0),"
    " (SELECT coalesce(max(w), 0) FROM (SELECT count(*) AS w FROM nodes n WHERE " STORE_NODE_TAKES_ON_DEMAND("?1")
    " AND n.free_cards = ?2 AND n.card_count = ?2 GROUP BY n.fabric))";
/* The catalog row alone, for callers that need no counts (instance
 * creation runs it inside its write transaction). */
static const char SQL_TYPE_ROW[] =
    "SELECT t.code, t.vendor, t.memory_gb, t.memory_type, t.stack, t.reservation_required, t.features,"
    " t.description, t.created_at, t.updated_at, 0, 0, 0, 0, 0 FROM gpu_types t WHERE t.code = ?1";
static const char SQL_TYPE_EXISTS[] = "SELECT 1 FROM gpu_types WHERE code = ?";
static const char SQL_TYPE_INSERT[] =
    "INSERT INTO gpu_types (code, vendor, memory_gb, memory_type, stack, reservation_required, features,"
    " description, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
static const char SQL_TYPE_UPDATE[] =
    "UPDATE gpu_types SET vendor = ?2, memory_gb = ?3, memory_type = ?4, stack = ?5, reservation_required = ?6,"
    " features = ?7, description = ?8, updated_at = ?10 WHERE code = ?1";
/* Removed nodes count too: their history still names the type. */
/* Nodes, prices and instances name a type: prices are history that billed
 * usage was priced by, so a type once priced stays. */
static const char SQL_TYPE_IN_USE[] =
    "SELECT (SELECT count(*) FROM nodes WHERE gpu_model = ?1), (SELECT count(*) FROM prices WHERE gpu_model = ?1),"
    " (SELECT count(*) FROM instances WHERE gpu_model = ?1)";
static const char SQL_TYPE_DELETE[] = "DELETE FROM gpu_types WHERE code = ?";

static void read_type(sqlite3_stmt *st, void *row)
{
    struct gpu_type *t = row;
    store_column_text(t->code, sizeof t->code, st, 0);
    store_column_text(t->vendor, sizeof t->vendor, st, 1);
    t->memory_gb = sqlite3_column_int64(st, 2);
    store_column_text(t->memory_type, sizeof t->memory_type, st, 3);
    store_column_text(t->stack, sizeof t->stack, st, 4);
    t->reservation_required = sqlite3_column_int(st, 5);
    store_column_text(t->features, sizeof t->features, st, 6);
    store_column_text(t->description, sizeof t->description, st, 7);
    t->created_at = sqlite3_column_int64(st, 8);
    t->updated_at = sqlite3_column_int64(st, 9);
    t->cards_total = sqlite3_column_int64(st, 10);
    t->cards_free = sqlite3_column_int64(st, 11);
    t->cards_in_use = sqlite3_column_int64(st, 12);
    t->cards_reservable = sqlite3_column_int64(st, 13);
    t->cards_reserved_idle = sqlite3_column_int64(st, 14);
}

int store_gpu_type_list(struct store *s, struct gpu_type **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_TYPE_LIST);
    if (!st)
        return STORE_ERROR;
    return store_collect(s, st, sizeof **out, (void **)out, n, read_type, "list gpu types");
}

static int get_one(struct store *s, const char *sql, const char *code, struct gpu_type *out)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_type, "get gpu type");
}

int store_gpu_type_get(struct store *s, const char *code, struct gpu_type *out)
{
    return get_one(s, SQL_TYPE_GET, code, out);
}

int64_t store_gpu_type_launchable(struct store *s, const char *code)
{
    sqlite3_stmt *st = store_stmt(s, SQL_TYPE_LAUNCHABLE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, PLACEMENT_NODE_CARDS);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_reset(st);
        return store_rc_from_sqlite(s, rc, "launchable cards");
    }
    int64_t one_node = sqlite3_column_int64(st, 0), whole = sqlite3_column_int64(st, 1);
    sqlite3_reset(st);
    if (one_node > PLACEMENT_NODE_CARDS)
        one_node = PLACEMENT_NODE_CARDS;
    if (whole > PLACEMENT_MAX_NODES)
        whole = PLACEMENT_MAX_NODES;
    return whole >= 2 ? whole * PLACEMENT_NODE_CARDS : one_node;
}

int store_gpu_type_row(struct store *s, const char *code, struct gpu_type *out)
{
    return get_one(s, SQL_TYPE_ROW, code, out);
}

int store_gpu_type_put(struct store *s, const struct gpu_type *t, int64_t now, int *created)
{
    sqlite3_stmt *st = store_stmt(s, SQL_TYPE_EXISTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, t->code, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return store_rc_from_sqlite(s, rc, "find gpu type");
    *created = rc == SQLITE_DONE;
    st = store_stmt(s, *created ? SQL_TYPE_INSERT : SQL_TYPE_UPDATE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, t->code, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, t->vendor, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, t->memory_gb);
    sqlite3_bind_text(st, 4, t->memory_type, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, t->stack, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 6, t->reservation_required);
    sqlite3_bind_text(st, 7, t->features, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, t->description, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 9, now);
    sqlite3_bind_int64(st, 10, now);
    rc = store_rc_from_sqlite(s, sqlite3_step(st), "put gpu type");
    sqlite3_reset(st);
    return rc;
}

int store_gpu_type_delete(struct store *s, const char *code, struct gpu_type_users *users)
{
    sqlite3_stmt *st = store_stmt(s, SQL_TYPE_IN_USE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        rc = store_rc_from_sqlite(s, rc, "count what names a gpu type");
        sqlite3_reset(st);
        return rc;
    }
    users->nodes = sqlite3_column_int64(st, 0);
    users->prices = sqlite3_column_int64(st, 1);
    users->instances = sqlite3_column_int64(st, 2);
    sqlite3_reset(st);
    /* Running intervals name the type too, but only through an instance. */
    if (users->nodes + users->prices + users->instances > 0)
        return STORE_CONFLICT;
    st = store_stmt(s, SQL_TYPE_DELETE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, code, -1, SQLITE_STATIC);
    rc = store_rc_from_sqlite(s, sqlite3_step(st), "delete gpu type");
    sqlite3_reset(st);
    if (rc == STORE_OK && sqlite3_changes(store_db(s)) == 0)
        return STORE_NOT_FOUND;
    return rc;
}

/* The next scheduled price start: a cached catalog shows prices as of its
 * rendering and must be rendered again when one takes effect. */
static const char SQL_NEXT_PRICE[] = "SELECT min(effective_at) FROM prices WHERE effective_at > ?";

int store_next_price_change(struct store *s, int64_t now, int64_t *at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NEXT_PRICE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, now);
    int rc = sqlite3_step(st);
    *at = rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL ? sqlite3_column_int64(st, 0) : INT64_MAX;
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : store_rc_from_sqlite(s, rc, "next price change");
}
