/* store_reservations.c: SQL for capacity blocks (migration 0024): the
 * reservations themselves, the reserved pool's capacity, the instances that
 * run inside a block, its payers for refunds and its credits for lost hours. */
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RESERVATION_COLUMNS                                                                                   \
    "id, user_id, gpu_model, coalesce(fabric, ''), card_count, starts_at, ends_at, state, card_hour, amount," \
    " refunded, credited, coalesce(cancelled_at, 0), coalesce(warned_at, 0), coalesce(closed_at, 0), created_at"

/* States in which an instance holds cards or is about to (as HOLDING in
 * store_instances.c). */
#define RESV_HOLDING "('pending', 'provisioning', 'running', 'stopping', 'unreachable')"

static const char SQL_RESV_INSERT[] =
    "INSERT INTO reservations (id, user_id, gpu_model, fabric, card_count, starts_at, ends_at, state, card_hour,"
    " amount, created_at) VALUES (?1, ?2, ?3, nullif(?4, ''), ?5, ?6, ?7, 'booked', ?8, ?9, ?10)";
static const char SQL_RESV_GET[] =
    "SELECT " RESERVATION_COLUMNS " FROM reservations WHERE id = ?2 AND (?1 IS NULL OR user_id = ?1)";
/* The state a reservation shows at ?7 (reservation_json's rule). */
#define RESV_STATE_AT                                                                                           \
    "CASE WHEN state = 'cancelled' THEN 'cancelled' WHEN ?7 < starts_at THEN 'upcoming' WHEN ?7 < ends_at THEN" \
    " 'active' ELSE 'ended' END"
static const char SQL_RESV_LIST[] = "SELECT " RESERVATION_COLUMNS " FROM reservations WHERE user_id = ?1"
                                    " AND (?2 < 0 OR (created_at, id) < (?2, ?3))"
                                    " AND (?5 IS NULL OR gpu_model = ?5) AND (?6 IS NULL OR " RESV_STATE_AT " = ?6)"
                                    " ORDER BY created_at DESC, id DESC LIMIT ?4";
static const char SQL_RESV_OVERLAP[] =
    "SELECT " RESERVATION_COLUMNS " FROM reservations WHERE gpu_model = ?1 AND state = 'booked'"
    " AND starts_at < ?3 AND ends_at > ?2 ORDER BY starts_at, id";
static const char SQL_RESV_USER_OVERLAP[] =
    "SELECT " RESERVATION_COLUMNS " FROM reservations WHERE user_id = ?1 AND state = 'booked'"
    " AND starts_at < ?3 AND ends_at > ?2 ORDER BY starts_at, id";
static const char SQL_RESV_DUE[] =
    "SELECT " RESERVATION_COLUMNS " FROM reservations WHERE state = 'booked' AND closed_at IS NULL"
    " AND (ends_at <= ?1 OR (warned_at IS NULL AND starts_at <= ?1 AND ends_at - ?2 <= ?1)) ORDER BY ends_at, id";
static const char SQL_RESV_ACTIVE[] =
    "SELECT " RESERVATION_COLUMNS " FROM reservations WHERE state = 'booked' AND starts_at <= ?1 AND ends_at > ?1"
    " ORDER BY gpu_model, created_at, id";
static const char SQL_RESV_CANCEL[] =
    "UPDATE reservations SET state = 'cancelled', refunded = ?2, cancelled_at = ?3 WHERE id = ?1 AND state = 'booked'";
static const char SQL_RESV_WARNED[] = "UPDATE reservations SET warned_at = ?2 WHERE id = ?1";
static const char SQL_RESV_CLOSED[] = "UPDATE reservations SET closed_at = ?2 WHERE id = ?1";
static const char SQL_RESV_CREDITED[] = "UPDATE reservations SET credited = credited + ?2 WHERE id = ?1";
/* What can be sold: healthy cards of reserved nodes that are up and
 * active (an unreachable node still counts: it is not yet lost). */
#define RESERVED_NODES                                                                  \
    " FROM nodes n WHERE n.gpu_model = ?1 AND n.removed_at IS NULL AND n.health = 'up'" \
    " AND n.admin_state = 'active' AND " STORE_POOL_IS("n", "'reserved'")
static const char SQL_RESERVED_CARDS[] = "SELECT coalesce(sum((SELECT count(*) FROM node_cards c WHERE c.node_id = "
                                         "n.id AND c.healthy = 1)), 0)" RESERVED_NODES;
static const char SQL_RESERVED_FABRICS[] =
    "SELECT n.fabric, count(*)" RESERVED_NODES " AND n.card_count = 8"
    " AND (SELECT count(*) FROM node_cards c WHERE c.node_id = n.id AND c.healthy = 1) = 8"
    " GROUP BY n.fabric ORDER BY n.fabric";
/* Usable now: healthy cards of reserved nodes that are up, whatever the
 * admin state; a node offline (past node_lost_after_s) or with a failed
 * card is what takes cards away. */
static const char SQL_RESERVED_USABLE[] =
    "SELECT coalesce(sum((SELECT count(*) FROM node_cards c WHERE c.node_id = n.id AND c.healthy = 1)), 0)"
    " FROM nodes n WHERE n.gpu_model = ?1 AND n.removed_at IS NULL AND n.health = 'up'"
    " AND " STORE_POOL_IS("n", "'reserved'");
static const char SQL_RESERVED_FAILED[] =
    "SELECT n.id FROM nodes n WHERE n.gpu_model = ?1 AND n.removed_at IS NULL AND " STORE_POOL_IS(
        "n", "'reserved'") " AND (n.health = 'offline' OR EXISTS (SELECT 1 FROM node_cards c WHERE c.node_id = n.id "
                           "AND c.healthy = 0))"
                           " ORDER BY n.updated_at DESC, n.id LIMIT 1";
static const char SQL_RESV_PRICE[] = "SELECT card_hour FROM reservation_prices WHERE gpu_model = ?";
static const char SQL_RESV_PRICE_SET[] =
    "INSERT INTO reservation_prices (gpu_model, card_hour, updated_at) VALUES (?1, ?2, ?3)"
    " ON CONFLICT (gpu_model) DO UPDATE SET card_hour = excluded.card_hour, updated_at = excluded.updated_at";
static const char SQL_RESV_HELD[] = "SELECT coalesce(sum(card_count), 0) FROM instances WHERE reservation_id = ?1"
                                    " AND id <> ?2 AND state IN " RESV_HOLDING;
static const char SQL_RESV_ON_NODE[] =
    "SELECT count(*), coalesce(sum(c.healthy = 1), 0) FROM node_cards c JOIN instances i ON i.id = c.instance_id"
    " WHERE c.node_id = ?2 AND i.reservation_id = ?1";
static const char SQL_RESV_INSTANCES[] =
    "SELECT id FROM instances WHERE reservation_id = ?1 AND state IN " RESV_HOLDING " ORDER BY created_at, id";
static const char SQL_INS_RESV[] = "SELECT coalesce(reservation_id, '') FROM instances WHERE id = ?";
static const char SQL_INS_SET_RESV[] = "UPDATE instances SET reservation_id = nullif(?2, '') WHERE id = ?1";
/* Each account's net payment for the block: what its 'reservation' legs
 * drew less what 'reservation_refund' legs gave back, the last drawn first. */
static const char SQL_RESV_PAYERS[] =
    "SELECT p.account_id, coalesce(p.grant_id, ''), -sum(p.amount), coalesce(g.voided_at, 0), max(p.id) AS last"
    " FROM ledger_postings p JOIN ledger_transactions t ON t.id = p.transaction_id"
    " JOIN ledger_accounts a ON a.id = p.account_id LEFT JOIN credit_grants g ON g.id = p.grant_id"
    " WHERE t.reservation_id = ?1 AND t.kind IN ('reservation', 'reservation_refund') AND a.kind IN ('cash', 'grant')"
    " GROUP BY p.account_id HAVING -sum(p.amount) > 0 ORDER BY last DESC";
static const char SQL_CREDIT_GET[] =
    "SELECT cards, amount FROM reservation_credits WHERE reservation_id = ?1 AND hour = ?2";
static const char SQL_CREDIT_PUT[] =
    "INSERT INTO reservation_credits (reservation_id, hour, cards, node_id, amount, grant_id, created_at)"
    " VALUES (?1, ?2, ?3, ?4, ?5, nullif(?6, ''), ?7) ON CONFLICT (reservation_id, hour) DO UPDATE SET"
    " cards = excluded.cards, node_id = excluded.node_id, amount = amount + excluded.amount,"
    " grant_id = coalesce(excluded.grant_id, grant_id)";
static const char SQL_NODE_CARDS_IN_USE[] =
    "SELECT count(*) FROM node_cards WHERE node_id = ? AND instance_id IS NOT NULL";
static const char SQL_NODE_SET_POOL[] =
    "UPDATE nodes SET pool = ?2, updated_at = ?3 WHERE id = ?1 AND removed_at IS NULL";
static const char SQL_NODE_HEALTHY[] = "SELECT count(*) FROM node_cards WHERE node_id = ? AND healthy = 1";
static const char SQL_NODE_POOL[] = "SELECT pool FROM nodes WHERE id = ? AND removed_at IS NULL";

static void read_reservation(sqlite3_stmt *st, void *row)
{
    struct reservation *r = row;
    store_column_text(r->id, sizeof r->id, st, 0);
    store_column_text(r->user_id, sizeof r->user_id, st, 1);
    store_column_text(r->gpu_model, sizeof r->gpu_model, st, 2);
    store_column_text(r->fabric, sizeof r->fabric, st, 3);
    r->card_count = sqlite3_column_int64(st, 4);
    r->starts_at = sqlite3_column_int64(st, 5);
    r->ends_at = sqlite3_column_int64(st, 6);
    store_column_text(r->state, sizeof r->state, st, 7);
    r->card_hour = sqlite3_column_int64(st, 8);
    r->amount = sqlite3_column_int64(st, 9);
    r->refunded = sqlite3_column_int64(st, 10);
    r->credited = sqlite3_column_int64(st, 11);
    r->cancelled_at = sqlite3_column_int64(st, 12);
    r->warned_at = sqlite3_column_int64(st, 13);
    r->closed_at = sqlite3_column_int64(st, 14);
    r->created_at = sqlite3_column_int64(st, 15);
}

int store_reservation_insert(struct store *s, const struct reservation *r)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, r->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, r->gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, r->fabric, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, r->card_count);
    sqlite3_bind_int64(st, 6, r->starts_at);
    sqlite3_bind_int64(st, 7, r->ends_at);
    sqlite3_bind_int64(st, 8, r->card_hour);
    sqlite3_bind_int64(st, 9, r->amount);
    sqlite3_bind_int64(st, 10, r->created_at);
    return store_step_write(s, st, "insert reservation");
}

int store_reservation_get(struct store *s, const char *user_id, const char *id, struct reservation *out)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_GET);
    if (!st)
        return STORE_ERROR;
    if (user_id)
        sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
    return store_read_one(s, st, out, read_reservation, "get reservation");
}

int store_reservation_list(struct store *s, const struct reservation_filter *f, struct reservation *out, size_t max,
                           size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_LIST);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, f->user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, f->after_created);
    sqlite3_bind_text(st, 3, f->after_id ? f->after_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)max);
    if (f->gpu_model)
        sqlite3_bind_text(st, 5, f->gpu_model, -1, SQLITE_STATIC);
    if (f->state)
        sqlite3_bind_text(st, 6, f->state, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, f->now);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_reservation, "list reservations");
}

static int collect(struct store *s, sqlite3_stmt *st, struct reservation **out, size_t *n, const char *what)
{
    void *rows = NULL;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_reservation, what);
    *out = rows;
    return rc;
}

int store_reservations_overlapping(struct store *s, const char *gpu_model, int64_t from, int64_t to,
                                   struct reservation **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_OVERLAP);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, from);
    sqlite3_bind_int64(st, 3, to);
    return collect(s, st, out, n, "overlapping reservations");
}

int store_user_reservations_overlapping(struct store *s, const char *user_id, int64_t from, int64_t to,
                                        struct reservation **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_USER_OVERLAP);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, from);
    sqlite3_bind_int64(st, 3, to);
    return collect(s, st, out, n, "the user's overlapping reservations");
}

int store_reservations_due(struct store *s, int64_t now, int64_t warn_s, struct reservation **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_DUE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int64(st, 2, warn_s);
    return collect(s, st, out, n, "reservations due");
}

int store_reservations_active(struct store *s, int64_t now, struct reservation **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_ACTIVE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, now);
    return collect(s, st, out, n, "active reservations");
}

static int update_id_int(struct store *s, const char *sql, const char *id, int64_t v, const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, v);
    return store_step_change(s, st, what);
}

int store_reservation_cancel(struct store *s, const char *id, int64_t refunded, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_CANCEL);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, refunded);
    sqlite3_bind_int64(st, 3, at);
    return store_step_change(s, st, "cancel reservation");
}

int store_reservation_set_warned(struct store *s, const char *id, int64_t at)
{
    return update_id_int(s, SQL_RESV_WARNED, id, at, "reservation warned");
}

int store_reservation_set_closed(struct store *s, const char *id, int64_t at)
{
    return update_id_int(s, SQL_RESV_CLOSED, id, at, "reservation closed");
}

int store_reservation_add_credited(struct store *s, const char *id, int64_t amount)
{
    return update_id_int(s, SQL_RESV_CREDITED, id, amount, "reservation credited");
}

/* One integer from st, bound to a model as ?1. */
static int model_int(struct store *s, const char *sql, const char *model, int64_t *out, const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_int64(st, 0);
        sqlite3_reset(st);
        return STORE_OK;
    }
    rc = rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, what);
    sqlite3_reset(st);
    return rc;
}

int store_reserved_capacity(struct store *s, const char *gpu_model, int64_t *cards, struct reserved_fabric *fabrics,
                            size_t *n_fabrics)
{
    *n_fabrics = 0;
    int rc = model_int(s, SQL_RESERVED_CARDS, gpu_model, cards, "reserved cards");
    if (rc != STORE_OK)
        return rc;
    sqlite3_stmt *st = store_stmt(s, SQL_RESERVED_FABRICS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && *n_fabrics < RESERVED_FABRICS_MAX) {
        struct reserved_fabric *f = &fabrics[(*n_fabrics)++];
        store_column_text(f->fabric, sizeof f->fabric, st, 0);
        f->whole_nodes = sqlite3_column_int64(st, 1);
    }
    rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, "reserved fabrics");
    sqlite3_reset(st);
    return rc;
}

int store_reserved_usable(struct store *s, const char *gpu_model, int64_t *cards, char failed_node[ID_MAX])
{
    failed_node[0] = 0;
    int rc = model_int(s, SQL_RESERVED_USABLE, gpu_model, cards, "usable reserved cards");
    if (rc != STORE_OK)
        return rc;
    sqlite3_stmt *st = store_stmt(s, SQL_RESERVED_FAILED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        store_column_text(failed_node, ID_MAX, st, 0);
    rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, "failed reserved node");
    sqlite3_reset(st);
    return rc;
}

int store_reservation_price(struct store *s, const char *gpu_model, int64_t *card_hour)
{
    return model_int(s, SQL_RESV_PRICE, gpu_model, card_hour, "reservation price");
}

int store_reservation_price_set(struct store *s, const char *gpu_model, int64_t card_hour, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_PRICE_SET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, card_hour);
    sqlite3_bind_int64(st, 3, at);
    return store_step_write(s, st, "set reservation price");
}

int64_t store_reservation_cards_held(struct store *s, const char *reservation_id, const char *except_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_HELD);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, except_id ? except_id : "", -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : store_rc_from_sqlite(s, rc, "reservation cards");
    sqlite3_reset(st);
    return v;
}

int store_reservation_cards_on_node(struct store *s, const char *reservation_id, const char *node_id, int64_t *held,
                                    int64_t *healthy)
{
    *held = *healthy = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_ON_NODE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, node_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *held = sqlite3_column_int64(st, 0);
        *healthy = sqlite3_column_int64(st, 1);
    }
    rc = rc == SQLITE_ROW ? STORE_OK : store_rc_from_sqlite(s, rc, "reservation cards on node");
    sqlite3_reset(st);
    return rc;
}

int store_reservation_instances(struct store *s, const char *reservation_id, char (**ids)[ID_MAX], size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_INSTANCES);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
    void *rows = NULL;
    int rc = store_collect(s, st, ID_MAX, &rows, n, store_read_id, "reservation instances");
    *ids = rows;
    return rc;
}

int store_instance_reservation(struct store *s, const char *instance_id, char out[ID_MAX])
{
    out[0] = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_INS_RESV);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        store_column_text(out, ID_MAX, st, 0);
    rc = rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "reservation");
    sqlite3_reset(st);
    return rc;
}

int store_instance_set_reservation(struct store *s, const char *instance_id, const char *reservation_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_INS_SET_RESV);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, reservation_id ? reservation_id : "", -1, SQLITE_STATIC);
    return store_step_change(s, st, "set instance reservation");
}

static void read_payer(sqlite3_stmt *st, void *row)
{
    struct interval_payer *p = row;
    store_column_text(p->account_id, sizeof p->account_id, st, 0);
    store_column_text(p->grant_id, sizeof p->grant_id, st, 1);
    p->paid = sqlite3_column_int64(st, 2);
    p->grant_voided_at = sqlite3_column_int64(st, 3);
}

int store_reservation_payers(struct store *s, const char *reservation_id, struct interval_payer **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESV_PAYERS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
    void *rows = NULL;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_payer, "reservation payers");
    *out = rows;
    return rc;
}

int store_reservation_credit_get(struct store *s, const char *reservation_id, int64_t hour, int64_t *cards,
                                 int64_t *amount)
{
    *cards = *amount = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_CREDIT_GET);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, hour);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *cards = sqlite3_column_int64(st, 0);
        *amount = sqlite3_column_int64(st, 1);
    }
    rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, "reservation credit");
    sqlite3_reset(st);
    return rc;
}

int store_reservation_credit_put(struct store *s, const char *reservation_id, int64_t hour, int64_t cards,
                                 const char *node_id, int64_t amount, const char *grant_id, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_CREDIT_PUT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, hour);
    sqlite3_bind_int64(st, 3, cards);
    sqlite3_bind_text(st, 4, node_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, amount);
    sqlite3_bind_text(st, 6, grant_id ? grant_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, at);
    return store_step_write(s, st, "put reservation credit");
}

int store_node_set_pool(struct store *s, const char *id, const char *pool, int64_t now)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_CARDS_IN_USE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int64_t in_use = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    rc = rc == SQLITE_ROW ? STORE_OK : store_rc_from_sqlite(s, rc, "node cards in use");
    sqlite3_reset(st);
    if (rc != STORE_OK)
        return rc;
    char current[16];
    if ((rc = store_node_pool(s, id, current)) != STORE_OK)
        return rc;
    if (strcmp(current, pool) == 0)
        return STORE_OK;
    /* A busy node moves only once drained, as a removal does: its
     * instances were placed by the other pool's rules. */
    if (in_use > 0)
        return STORE_CONFLICT;
    st = store_stmt(s, SQL_NODE_SET_POOL);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, pool, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now);
    return store_step_change(s, st, "set node pool");
}

int store_node_pool(struct store *s, const char *id, char out[16])
{
    out[0] = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_POOL);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        store_column_text(out, 16, st, 0);
    rc = rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "node pool");
    sqlite3_reset(st);
    return rc;
}

int64_t store_node_healthy_cards(struct store *s, const char *id)
{
    return store_int64_by_text(s, SQL_NODE_HEALTHY, id, "healthy cards");
}

static const char SQL_RESV_ALL[] = "SELECT " RESERVATION_COLUMNS " FROM reservations ORDER BY id";

int store_reservation_each(struct store *s, int (*fn)(void *ctx, const struct reservation *r), void *ctx)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(store_db(s), SQL_RESV_ALL, -1, &st, NULL) != SQLITE_OK)
        return STORE_ERROR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct reservation r;
        read_reservation(st, &r);
        if (fn(ctx, &r) != 0) {
            sqlite3_finalize(st);
            return STORE_ERROR;
        }
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, "reservations");
}

/* Binding blocks to nodes (0028): the rows of reservation_nodes, the
 * reserved nodes a block can be bound to, and what a bound node can give. */
static const char SQL_RESERVED_NODE_LIST[] =
    "SELECT n.id, n.fabric, n.card_count,"
    " (SELECT count(*) FROM node_cards c WHERE c.node_id = n.id AND c.healthy = 1)" RESERVED_NODES
    " ORDER BY n.fabric, n.name, n.id";
#define BINDING_COLUMNS "b.reservation_id, b.node_id, b.cards, r.starts_at, r.ends_at, r.created_at, b.bound_at"
static const char SQL_BINDINGS_OVERLAP[] =
    "SELECT " BINDING_COLUMNS " FROM reservation_nodes b JOIN reservations r ON r.id = b.reservation_id"
    " WHERE r.gpu_model = ?1 AND r.state = 'booked' AND r.starts_at < ?3 AND r.ends_at > ?2"
    " ORDER BY b.node_id, r.starts_at";
static const char SQL_BINDINGS_OF[] =
    "SELECT " BINDING_COLUMNS " FROM reservation_nodes b JOIN reservations r ON r.id = b.reservation_id"
    " WHERE b.reservation_id = ?1 ORDER BY b.node_id";
static const char SQL_BINDINGS_ON[] =
    "SELECT " BINDING_COLUMNS " FROM reservation_nodes b JOIN reservations r ON r.id = b.reservation_id"
    " WHERE b.node_id = ?1 AND r.state = 'booked' AND r.ends_at > ?2 ORDER BY r.created_at DESC, r.id DESC";
static const char SQL_BIND[] =
    "INSERT INTO reservation_nodes (reservation_id, node_id, cards, bound_at) VALUES (?1, ?2, ?3, ?4)";
static const char SQL_REBIND[] =
    "UPDATE reservation_nodes SET node_id = ?3, bound_at = ?4 WHERE reservation_id = ?1 AND node_id = ?2";
static const char SQL_NODE_BLOCKS[] =
    "SELECT " RESERVATION_COLUMNS " FROM reservations WHERE state = 'booked' AND ends_at > ?2"
    " AND id IN (SELECT reservation_id FROM reservation_nodes WHERE node_id = ?1) ORDER BY created_at DESC, id DESC";
static const char SQL_UNBOUND[] =
    "SELECT " RESERVATION_COLUMNS " FROM reservations r WHERE state = 'booked' AND ends_at > ?1"
    " AND NOT EXISTS (SELECT 1 FROM reservation_nodes b WHERE b.reservation_id = r.id) ORDER BY created_at, id";
static const char SQL_NODE_USABLE[] =
    "SELECT CASE WHEN n.removed_at IS NULL AND n.health = 'up' THEN (SELECT count(*) FROM node_cards c"
    " WHERE c.node_id = n.id AND c.healthy = 1) ELSE 0 END, n.removed_at IS NULL AND n.admin_state = 'active',"
    " n.removed_at IS NULL AND n.health = 'up' FROM nodes n WHERE n.id = ?1";

static void read_reserved_node(sqlite3_stmt *st, void *row)
{
    struct reserved_node *n = row;
    store_column_text(n->id, sizeof n->id, st, 0);
    store_column_text(n->fabric, sizeof n->fabric, st, 1);
    n->card_count = sqlite3_column_int64(st, 2);
    n->healthy = sqlite3_column_int64(st, 3);
}

int store_reserved_nodes(struct store *s, const char *gpu_model, struct reserved_node **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_RESERVED_NODE_LIST);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    void *rows = NULL;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_reserved_node, "reserved nodes");
    *out = rows;
    return rc;
}

static void read_binding(sqlite3_stmt *st, void *row)
{
    struct reservation_binding *b = row;
    store_column_text(b->reservation_id, sizeof b->reservation_id, st, 0);
    store_column_text(b->node_id, sizeof b->node_id, st, 1);
    b->cards = sqlite3_column_int64(st, 2);
    b->starts_at = sqlite3_column_int64(st, 3);
    b->ends_at = sqlite3_column_int64(st, 4);
    b->created_at = sqlite3_column_int64(st, 5);
    b->bound_at = sqlite3_column_int64(st, 6);
}

static int collect_bindings(struct store *s, sqlite3_stmt *st, struct reservation_binding **out, size_t *n,
                            const char *what)
{
    void *rows = NULL;
    int rc = store_collect(s, st, sizeof **out, &rows, n, read_binding, what);
    *out = rows;
    return rc;
}

int store_reservation_bindings_overlapping(struct store *s, const char *gpu_model, int64_t from, int64_t to,
                                           struct reservation_binding **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_BINDINGS_OVERLAP);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, gpu_model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, from);
    sqlite3_bind_int64(st, 3, to);
    return collect_bindings(s, st, out, n, "overlapping bindings");
}

int store_reservation_bindings(struct store *s, const char *reservation_id, struct reservation_binding **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_BINDINGS_OF);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
    return collect_bindings(s, st, out, n, "reservation bindings");
}

int store_node_bindings(struct store *s, const char *node_id, int64_t after, struct reservation_binding **out,
                        size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_BINDINGS_ON);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after);
    return collect_bindings(s, st, out, n, "node bindings");
}

int store_reservation_bind(struct store *s, const char *reservation_id, const char *node_id, int64_t cards, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_BIND);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, node_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, cards);
    sqlite3_bind_int64(st, 4, at);
    return store_step_write(s, st, "bind reservation");
}

int store_reservation_rebind(struct store *s, const char *reservation_id, const char *old_node, const char *new_node,
                             int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_REBIND);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, reservation_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, old_node, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, new_node, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, at);
    return store_step_change(s, st, "rebind reservation");
}

int store_node_reservations(struct store *s, const char *node_id, int64_t after, struct reservation **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_BLOCKS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after);
    return collect(s, st, out, n, "node reservations");
}

int store_reservations_unbound(struct store *s, int64_t after, struct reservation **out, size_t *n)
{
    sqlite3_stmt *st = store_stmt(s, SQL_UNBOUND);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, after);
    return collect(s, st, out, n, "unbound reservations");
}

int64_t store_node_usable_cards(struct store *s, const char *node_id, int *active, int *up)
{
    *active = *up = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_USABLE);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, node_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *active = sqlite3_column_int(st, 1);
        *up = sqlite3_column_int(st, 2);
    }
    int64_t v = rc == SQLITE_ROW    ? sqlite3_column_int64(st, 0)
                : rc == SQLITE_DONE ? 0
                                    : store_rc_from_sqlite(s, rc, "usable cards");
    sqlite3_reset(st);
    return v;
}
