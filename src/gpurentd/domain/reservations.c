/* reservations.c: capacity blocks (issue 16). A reservation books cards of a
 * GPU type in the reserved pool for whole hours; the calendar check runs in
 * the booking's write transaction, so two bookings can never both take the
 * last cards of an hour. A block is paid when booked and refunded by the
 * cancellation rule; instances inside it are placed on the reserved pool
 * within its cards and never billed per second. The pass warns before the
 * end, stops its instances at the end, and credits hours that failed
 * reserved hardware could not give. */
#include "domain/domain.h"
#include "domain/ledger.h"
#include "domain/placement.h"
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HOUR 3600

int reservation_window_check(int64_t cards, int64_t starts_at, int64_t ends_at, int64_t now, struct op_outcome *o)
{
    if (!placement_count_valid((int)(cards > 0 && cards <= 256 ? cards : 0)))
        return op_refuse(o, ERR_INVALID_FIELD, "cards", NULL,
                         "cards must be 1 to 8, or a multiple of 8 up to 256 (more than 8 cards are whole nodes)");
    if (starts_at % HOUR != 0)
        return op_refuse(o, ERR_INVALID_FIELD, "starts_at", NULL,
                         "starts_at must be a whole hour (minutes and seconds 0)");
    if (ends_at % HOUR != 0)
        return op_refuse(o, ERR_INVALID_FIELD, "ends_at", NULL, "ends_at must be a whole hour (minutes and seconds 0)");
    if (starts_at < now)
        return op_refuse(o, ERR_INVALID_FIELD, "starts_at", NULL,
                         "starts_at is in the past; a reservation starts at a "
                         "coming whole hour");
    if (ends_at <= starts_at)
        return op_refuse(o, ERR_INVALID_FIELD, "ends_at", NULL, "ends_at must be after starts_at");
    if (ends_at - now > daemon_config->reservation_horizon_hours * HOUR)
        return op_refuse(o, ERR_INVALID_FIELD, "ends_at", NULL, "ends_at is beyond the booking horizon of %lld hours",
                         (long long)daemon_config->reservation_horizon_hours);
    if ((ends_at - starts_at) / HOUR > daemon_config->reservation_max_hours)
        return op_refuse(o, ERR_INVALID_FIELD, "ends_at", NULL, "a reservation lasts at most %lld hours",
                         (long long)daemon_config->reservation_max_hours);
    return STORE_OK;
}

/* Cards booked in each hour of [from, to): booked[], (to - from) / 3600
 * entries, zeroed here; of one type on all nodes together (model), or of
 * one user's blocks of any type (user_id, model NULL). */
static int calendar(struct store *s, const char *model, const char *user_id, int64_t from, int64_t to, int64_t *booked)
{
    size_t hours = (size_t)((to - from) / HOUR);
    memset(booked, 0, hours * sizeof *booked);
    struct reservation *r;
    size_t n;
    int rc = model ? store_reservations_overlapping(s, model, from, to, &r, &n)
                   : store_user_reservations_overlapping(s, user_id, from, to, &r, &n);
    if (rc != STORE_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        int64_t a = r[i].starts_at > from ? r[i].starts_at : from, b = r[i].ends_at < to ? r[i].ends_at : to;
        for (int64_t h = a; h < b; h += HOUR)
            booked[(h - from) / HOUR] += r[i].card_count;
    }
    free(r);
    return STORE_OK;
}

/* The reserved nodes of a type and what is booked on each in every hour
 * of [from, to) (0028): booked[node * hours + hour]. Every block is bound
 * to its nodes, so this per node per hour calendar is what booking,
 * re-homing and availability check. */
struct node_calendar {
    struct reserved_node *nodes;
    size_t n_nodes;
    struct reservation_binding *b;
    size_t n_b;
    int64_t from, to;
    size_t hours;
    int64_t *booked;
};

static void node_calendar_free(struct node_calendar *c)
{
    free(c->nodes);
    free(c->b);
    free(c->booked);
    memset(c, 0, sizeof *c);
}

static int node_calendar_load(struct store *s, const char *model, int64_t from, int64_t to, struct node_calendar *c)
{
    memset(c, 0, sizeof *c);
    c->from = from;
    c->to = to;
    c->hours = (size_t)((to - from) / HOUR);
    int rc = store_reserved_nodes(s, model, &c->nodes, &c->n_nodes);
    if (rc == STORE_OK)
        rc = store_reservation_bindings_overlapping(s, model, from, to, &c->b, &c->n_b);
    if (rc == STORE_OK && !(c->booked = calloc(c->n_nodes * c->hours + 1, sizeof *c->booked)))
        rc = STORE_ERROR;
    if (rc != STORE_OK) {
        node_calendar_free(c);
        return rc;
    }
    for (size_t i = 0; i < c->n_nodes; i++)
        for (size_t k = 0; k < c->n_b; k++) {
            const struct reservation_binding *b = &c->b[k];
            if (strcmp(b->node_id, c->nodes[i].id) != 0)
                continue;
            int64_t a = b->starts_at > from ? b->starts_at : from, e = b->ends_at < to ? b->ends_at : to;
            for (int64_t h = a; h < e; h += HOUR)
                c->booked[i * c->hours + (size_t)((h - from) / HOUR)] += b->cards;
        }
    return STORE_OK;
}

/* Cards of node i left free in hour index h (never negative: a node with
 * failed cards may hold more bookings than healthy cards). */
static int64_t node_free(const struct node_calendar *c, size_t i, size_t h)
{
    int64_t left = c->nodes[i].healthy - c->booked[i * c->hours + h];
    return left > 0 ? left : 0;
}

/* Whether node i is already bound to block rid (re-homing never picks one
 * of the block's own nodes). */
static int bound_to(const struct node_calendar *c, size_t i, const char *rid)
{
    for (size_t k = 0; rid && k < c->n_b; k++)
        if (strcmp(c->b[k].reservation_id, rid) == 0 && strcmp(c->b[k].node_id, c->nodes[i].id) == 0)
            return 1;
    return 0;
}

/* The fewest free cards node i has in any hour of the whole calendar. */
static int64_t node_room(const struct node_calendar *c, size_t i)
{
    int64_t room = c->nodes[i].healthy;
    for (size_t h = 0; h < c->hours; h++)
        if (node_free(c, i, h) < room)
            room = node_free(c, i, h);
    return room;
}

/* Whether node i is a whole 8-card node with nothing booked on it. */
static int node_whole_free(const struct node_calendar *c, size_t i)
{
    return c->nodes[i].card_count == PLACEMENT_NODE_CARDS && c->nodes[i].healthy == PLACEMENT_NODE_CARDS &&
           node_room(c, i) == PLACEMENT_NODE_CARDS;
}

/* Nodes for a block of `cards` over the calendar's window, not already
 * bound to block rid (NULL: a new block): up to 8 cards, the one node with
 * the least room that still has them every hour (best fit, ties by fabric
 * and name); more, cards / 8 whole nodes free every hour in one fabric
 * (only `fabric` when it is not NULL), the fabric with the fewest such
 * nodes that is enough. pick[] gets node indexes; *n_pick 0 when none fits. */
static void choose_nodes(const struct node_calendar *c, int64_t cards, const char *fabric, const char *rid,
                         size_t *pick, size_t *n_pick)
{
    *n_pick = 0;
    if (cards <= PLACEMENT_NODE_CARDS) {
        int64_t best = PLACEMENT_NODE_CARDS + 1;
        for (size_t i = 0; i < c->n_nodes; i++) {
            int64_t room = node_room(c, i);
            if (room >= cards && room < best && !bound_to(c, i, rid)) {
                best = room;
                pick[0] = i;
                *n_pick = 1;
            }
        }
        return;
    }
    size_t need = (size_t)(cards / PLACEMENT_NODE_CARDS), best_start = 0, best_count = (size_t)-1;
    /* Nodes come by fabric: each fabric is one run. */
    for (size_t start = 0; start < c->n_nodes;) {
        size_t end = start, count = 0;
        while (end < c->n_nodes && strcmp(c->nodes[end].fabric, c->nodes[start].fabric) == 0) {
            count += node_whole_free(c, end) && !bound_to(c, end, rid);
            end++;
        }
        if (count >= need && count < best_count && (!fabric || strcmp(fabric, c->nodes[start].fabric) == 0)) {
            best_count = count;
            best_start = start;
        }
        start = end;
    }
    if (best_count == (size_t)-1)
        return;
    for (size_t i = best_start; i < c->n_nodes && *n_pick < need; i++)
        if (node_whole_free(c, i) && !bound_to(c, i, rid))
            pick[(*n_pick)++] = i;
}

int reservation_free_hours(struct store *s, const char *gpu_model, int64_t from, int64_t to, int64_t *free_cards,
                           int64_t *largest)
{
    /* Booking checks the pool as a whole too (what is booked against the
     * healthy cards of ready nodes: a block bound to a node lost since
     * still needs a spare at its start), so free cards are never more than
     * that leaves: what is shown free can be booked. */
    int64_t cap;
    struct reserved_fabric fabrics[RESERVED_FABRICS_MAX];
    size_t nf;
    int rc = store_reserved_capacity(s, gpu_model, &cap, fabrics, &nf);
    if (rc != STORE_OK || (rc = calendar(s, gpu_model, NULL, from, to, free_cards)) != STORE_OK)
        return rc;
    struct node_calendar c;
    if ((rc = node_calendar_load(s, gpu_model, from, to, &c)) != STORE_OK)
        return rc;
    for (size_t h = 0; h < c.hours; h++) {
        int64_t pool = cap > free_cards[h] ? cap - free_cards[h] : 0;
        int64_t sum = 0, most = 0, whole = 0;
        for (size_t i = 0; i < c.n_nodes; i++) {
            int64_t f = node_free(&c, i, h);
            sum += f;
            most = f > most ? f : most;
            /* Whole free nodes, counted per fabric run. */
            int first = i == 0 || strcmp(c.nodes[i].fabric, c.nodes[i - 1].fabric) != 0;
            whole = first ? 0 : whole;
            whole += c.nodes[i].card_count == PLACEMENT_NODE_CARDS && f == PLACEMENT_NODE_CARDS;
            if (whole > 1 && whole * PLACEMENT_NODE_CARDS > most)
                most = whole * PLACEMENT_NODE_CARDS;
        }
        free_cards[h] = sum < pool ? sum : pool;
        if (largest)
            largest[h] = most < free_cards[h] ? most : free_cards[h];
    }
    node_calendar_free(&c);
    return STORE_OK;
}

int reservation_bound(struct store *s, const char *reservation_id, int *bound)
{
    struct reservation_binding *b;
    size_t n;
    int rc = store_reservation_bindings(s, reservation_id, &b, &n);
    free(b);
    *bound = rc == STORE_OK && n > 0;
    return rc;
}

/* Binds block r to nodes for [from, r->ends_at) in the caller's
 * transaction; STORE_NOT_FOUND (nothing written) when no node has room. */
static int bind_block(struct store *s, const struct reservation *r, int64_t from, int64_t now)
{
    struct node_calendar c;
    int rc = node_calendar_load(s, r->gpu_model, from, r->ends_at, &c);
    if (rc != STORE_OK)
        return rc;
    size_t pick[256 / PLACEMENT_NODE_CARDS], n = 0;
    choose_nodes(&c, r->card_count, r->fabric[0] ? r->fabric : NULL, NULL, pick, &n);
    rc = n == 0 ? STORE_NOT_FOUND : STORE_OK;
    int64_t per_node = r->card_count < PLACEMENT_NODE_CARDS ? r->card_count : PLACEMENT_NODE_CARDS;
    for (size_t k = 0; k < n && rc == STORE_OK; k++)
        rc = store_reservation_bind(s, r->id, c.nodes[pick[k]].id, per_node, now);
    node_calendar_free(&c);
    return rc;
}

/* A spare for block r's cards on one of its nodes over [from, r->ends_at):
 * the reserved node that best fits its cards there, or for a multi-node
 * block a whole free node of its fabric, never one it is bound to already.
 * STORE_NOT_FOUND when there is none; spare gets the node. Writes nothing. */
static int spare_for(struct store *s, const struct reservation *r, int64_t from, char spare[ID_MAX])
{
    spare[0] = 0;
    if (from >= r->ends_at)
        return STORE_NOT_FOUND;
    struct node_calendar c;
    int rc = node_calendar_load(s, r->gpu_model, from, r->ends_at, &c);
    if (rc != STORE_OK)
        return rc;
    size_t pick[1], n = 0;
    if (r->card_count <= PLACEMENT_NODE_CARDS) {
        choose_nodes(&c, r->card_count, NULL, r->id, pick, &n);
    } else {
        for (size_t i = 0; i < c.n_nodes && !n; i++)
            if (strcmp(c.nodes[i].fabric, r->fabric) == 0 && node_whole_free(&c, i) && !bound_to(&c, i, r->id)) {
                pick[0] = i;
                n = 1;
            }
    }
    if (n)
        snprintf(spare, ID_MAX, "%s", c.nodes[pick[0]].id);
    node_calendar_free(&c);
    return n ? STORE_OK : STORE_NOT_FOUND;
}

static int catch_up(struct store *s, const struct reservation *r, int64_t until, int64_t now);

/* Moves block r off node_id onto its spare for [from, r->ends_at)
 * (spare_for). STORE_NOT_FOUND when there is none (nothing written);
 * new_node gets the node. The hours before this one that no pass saw are
 * credited first (catch_up), from the node it leaves: once moved, its
 * binding names the spare, and they would go uncredited. */
static int rehome(struct store *s, const struct reservation *r, const char *node_id, int64_t from, int64_t now,
                  char new_node[ID_MAX])
{
    int rc = spare_for(s, r, from, new_node);
    if (rc == STORE_OK)
        rc = catch_up(s, r, now - now % HOUR, now);
    if (rc == STORE_OK && (rc = store_reservation_rebind(s, r->id, node_id, new_node, now)) == STORE_OK)
        log_info("reservations: %s re-homed from node %s to node %s for the rest of its window", r->id, node_id,
                 new_node);
    return rc;
}

/* The first hour of [from, to) where cards more do not fit under limit,
 * or -1 when they fit in all. */
static int64_t first_full_hour(const int64_t *booked, int64_t from, int64_t to, int64_t cards, int64_t limit)
{
    for (int64_t i = 0; i < (to - from) / HOUR; i++)
        if (booked[i] + cards > limit)
            return from + i * HOUR;
    return -1;
}

static void time_text(int64_t t, char *out, size_t n)
{
    json_t *j = json_time(t, 0);
    snprintf(out, n, "%s", json_string_value(j) ? json_string_value(j) : "");
    json_decref(j);
}

/* The price per card-hour a block of model sells at now: the reservation
 * price, else the card-hour price (*price -1 when neither is set). */
static int block_price(struct store *s, const char *model, int64_t now, int64_t *price)
{
    int rc = store_reservation_price(s, model, price);
    if (rc == STORE_NOT_FOUND) {
        *price = ledger_price_at(s, model, now);
        return STORE_OK;
    }
    return rc;
}

int reservation_book(struct store *s, const char *user_id, const char *gpu_type, int64_t cards, int64_t starts_at,
                     int64_t ends_at, int64_t now, struct reservation *out, struct op_outcome *o)
{
    int rc = reservation_window_check(cards, starts_at, ends_at, now, o);
    if (rc != STORE_OK)
        return rc;
    struct gpu_type t;
    if ((rc = store_gpu_type_row(s, gpu_type, &t)) == STORE_NOT_FOUND)
        return op_refuse(o, ERR_INVALID_FIELD, "gpu_type", NULL, "no GPU type %.32s; see GET /v1/gpu-types", gpu_type);
    if (rc != STORE_OK)
        return rc;
    int64_t price;
    if ((rc = block_price(s, t.code, now, &price)) != STORE_OK)
        return rc;
    if (price < 0)
        return op_refuse(o, ERR_CONFLICT, "gpu_type", NULL, "%s has no price yet and cannot be booked", t.code);
    int64_t cap;
    struct reserved_fabric fabrics[RESERVED_FABRICS_MAX];
    size_t nf;
    if ((rc = store_reserved_capacity(s, t.code, &cap, fabrics, &nf)) != STORE_OK)
        return rc;
    size_t hours = (size_t)((ends_at - starts_at) / HOUR);
    int64_t *booked = calloc(hours, sizeof *booked);
    struct node_calendar nc = {0};
    size_t pick[256 / PLACEMENT_NODE_CARDS], n_pick = 0;
    char fabric[64] = "";
    if (!booked) {
        rc = STORE_ERROR;
        goto done;
    }
    /* Every hour of the window: what is booked plus this never exceeds the
     * reserved pool's healthy capacity. Writers take turns (BEGIN
     * IMMEDIATE), so nothing books between this read and the insert. */
    if ((rc = calendar(s, t.code, NULL, starts_at, ends_at, booked)) != STORE_OK)
        goto done;
    int64_t full = first_full_hour(booked, starts_at, ends_at, cards, cap);
    if (full >= 0) {
        char at[32];
        time_text(full, at, sizeof at);
        int64_t left = cap > booked[(full - starts_at) / HOUR] ? cap - booked[(full - starts_at) / HOUR] : 0;
        rc = op_refuse(o, ERR_INSUFFICIENT_CAPACITY, "cards",
                       json_pack("{s:s, s:I}", "hour", at, "cards_free", (json_int_t)left),
                       "only %lld %s cards are free to book in the hour from %s; see GET "
                       "/v1/reservations/availability",
                       (long long)left, t.code, at);
        goto done;
    }
    /* The totals fit; the block must also fit on its own nodes every hour
     * (0028), or its instances could find the hour fragmented. */
    if ((rc = node_calendar_load(s, t.code, starts_at, ends_at, &nc)) != STORE_OK)
        goto done;
    choose_nodes(&nc, cards, NULL, NULL, pick, &n_pick);
    if (n_pick == 0 && cards <= PLACEMENT_NODE_CARDS) {
        rc = op_refuse(o, ERR_INSUFFICIENT_CAPACITY, "cards", json_pack("{s:b}", "single_node", 1),
                       "no single %s node has %lld cards free for every hour of the window, though the pool has "
                       "that many in total (a block of up to 8 cards is held on one node); see GET "
                       "/v1/reservations/availability for the largest block per hour",
                       t.code, (long long)cards);
        goto done;
    }
    if (n_pick == 0) {
        rc = op_refuse(o, ERR_INSUFFICIENT_CAPACITY, "cards", NULL,
                       "no fabric has %lld whole %s nodes free for every hour of the window (more than 8 cards "
                       "are whole nodes in one fabric)",
                       (long long)(cards / PLACEMENT_NODE_CARDS), t.code);
        goto done;
    }
    /* The holder's card quota is the most cards they may hold at once, and
     * a block's instances hold its cards: a block that with the holder's
     * other blocks passes it in some hour could never run in full, so it
     * is not sold (and one account cannot book past its quota). Checked
     * after capacity: a block the fleet cannot hold is told so first. */
    int64_t limit = store_user_max_cards(s, user_id, daemon_config->default_max_cards);
    if (limit < 0 || (rc = calendar(s, NULL, user_id, starts_at, ends_at, booked)) != STORE_OK) {
        rc = limit < 0 ? (int)limit : rc;
        goto done;
    }
    int64_t over = first_full_hour(booked, starts_at, ends_at, cards, limit);
    if (over >= 0) {
        char at[32];
        int64_t mine = booked[(over - starts_at) / HOUR];
        time_text(over, at, sizeof at);
        rc = op_refuse(o, ERR_QUOTA_EXCEEDED, "cards",
                       json_pack("{s:I, s:I, s:s}", "limit", (json_int_t)limit, "in_use", (json_int_t)mine, "hour", at),
                       "your card quota is %lld cards and your reservations hold %lld in the hour from %s; %lld "
                       "more could never run at once",
                       (long long)limit, (long long)mine, at, (long long)cards);
        goto done;
    }
    if (cards > PLACEMENT_NODE_CARDS)
        snprintf(fabric, sizeof fabric, "%s", nc.nodes[pick[0]].fabric);
    __int128 amount = (__int128)price * cards * (int64_t)hours;
    if (amount > daemon_config->max_balance_micro) {
        rc = op_refuse(o, ERR_INSUFFICIENT_FUNDS, "cards", NULL, "the block would cost more than anyone may hold");
        goto done;
    }
    struct funds f;
    if ((rc = ledger_funds_now(s, user_id, now, &f)) != STORE_OK)
        goto done;
    if (f.available < (int64_t)amount) {
        rc = op_refuse(
            o, ERR_INSUFFICIENT_FUNDS, NULL,
            json_pack("{s:o, s:o}", "price", json_money((int64_t)amount), "available", json_money(f.available)),
            "the block costs %lld card-hours at the booking price and your funds do not cover it",
            (long long)(cards * (int64_t)hours));
        goto done;
    }
    struct reservation r = {.card_count = cards,
                            .starts_at = starts_at,
                            .ends_at = ends_at,
                            .card_hour = price,
                            .amount = (int64_t)amount,
                            .created_at = now};
    if (id_new("rsv", r.id) < 0) {
        rc = STORE_ERROR;
        goto done;
    }
    snprintf(r.user_id, sizeof r.user_id, "%s", user_id);
    snprintf(r.gpu_model, sizeof r.gpu_model, "%s", t.code);
    snprintf(r.fabric, sizeof r.fabric, "%s", fabric);
    snprintf(r.state, sizeof r.state, "booked");
    char reason[200], from[32], to[32];
    time_text(starts_at, from, sizeof from);
    time_text(ends_at, to, sizeof to);
    snprintf(reason, sizeof reason, "reservation %s: %lld x %s, %s to %s", r.id, (long long)cards, t.code, from, to);
    if ((rc = store_reservation_insert(s, &r)) != STORE_OK ||
        (rc = ledger_charge_reservation(s, user_id, r.amount, now, r.id, reason)) != STORE_OK)
        goto done;
    int64_t per_node = cards < PLACEMENT_NODE_CARDS ? cards : PLACEMENT_NODE_CARDS;
    for (size_t k = 0; k < n_pick && rc == STORE_OK; k++)
        rc = store_reservation_bind(s, r.id, nc.nodes[pick[k]].id, per_node, now);
    if (rc != STORE_OK)
        goto done;
    *out = r;
done:
    free(booked);
    node_calendar_free(&nc);
    return rc;
}

int64_t reservation_refund_due(const struct reservation *r, int64_t now)
{
    if (now >= r->starts_at)
        return 0;
    if (now <= r->starts_at - daemon_config->reservation_cancel_notice_hours * HOUR)
        return r->amount;
    return (int64_t)((__int128)r->amount * daemon_config->reservation_late_refund_percent / 100);
}

static int load(struct store *s, const char *user_id, const char *id, struct reservation *r, struct op_outcome *o)
{
    int rc = id_valid("rsv", id) ? store_reservation_get(s, user_id, id, r) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        return op_refuse(o, ERR_NOT_FOUND, NULL, NULL, "no reservation %.32s", id);
    return rc;
}

int reservation_cancel(struct store *s, const char *user_id, const char *id, int64_t now, struct reservation *out,
                       struct op_outcome *o)
{
    struct reservation r;
    int rc = load(s, user_id, id, &r, o);
    if (rc != STORE_OK)
        return rc;
    if (strcmp(r.state, "cancelled") == 0)
        return op_refuse(o, ERR_INVALID_STATE, NULL, json_pack("{s:s}", "state", "cancelled"),
                         "reservation %s is already cancelled", r.id);
    if (now >= r.starts_at)
        return op_refuse(o, ERR_INVALID_STATE, NULL, json_pack("{s:s}", "state", now >= r.ends_at ? "ended" : "active"),
                         "reservation %s has started; a started reservation is neither cancelled nor refunded", r.id);
    int64_t refund = reservation_refund_due(&r, now);
    char reason[200];
    /* The rule's percentage, not refund / amount: that is rounded down
     * with the refund (50 % of 1.333333 is 0.666666, "49 %"). */
    snprintf(reason, sizeof reason, "reservation %s cancelled: %lld%% refunded", r.id,
             (long long)(refund == r.amount ? 100 : daemon_config->reservation_late_refund_percent));
    if ((rc = ledger_refund_reservation(s, r.user_id, r.id, refund, now, reason)) != STORE_OK ||
        (rc = store_reservation_cancel(s, r.id, refund, now)) != STORE_OK)
        return rc;
    return store_reservation_get(s, user_id, r.id, out);
}

json_t *reservation_json(const struct reservation *r, int64_t now)
{
    const char *state = strcmp(r->state, "cancelled") == 0 ? "cancelled"
                        : now < r->starts_at               ? "upcoming"
                        : now < r->ends_at                 ? "active"
                                                           : "ended";
    json_t *j =
        json_pack("{s:s, s:s, s:I, s:o, s:o, s:I, s:s, s:o, s:o, s:o, s:o, s:s, s:o, s:o}", "id", r->id, "gpu_type",
                  r->gpu_model, "cards", (json_int_t)r->card_count, "starts_at", json_time(r->starts_at, 0), "ends_at",
                  json_time(r->ends_at, 0), "hours", (json_int_t)((r->ends_at - r->starts_at) / HOUR), "state", state,
                  "price_per_card_hour", json_money(r->card_hour), "amount", json_money(r->amount), "refunded",
                  json_money(r->refunded), "credited", json_money(r->credited), "currency", daemon_config->currency,
                  "cancelled_at", json_time(r->cancelled_at, 1), "created_at", json_time(r->created_at, 0));
    json_object_set_new(j, "fabric", r->fabric[0] ? json_string(r->fabric) : json_null());
    return j;
}

int reservation_admit(struct store *s, const char *user_id, const char *reservation_id, const char *gpu_model,
                      int64_t cards, const char *instance_id, int64_t now, struct op_outcome *o)
{
    struct reservation r;
    int rc = id_valid("rsv", reservation_id) ? store_reservation_get(s, user_id, reservation_id, &r) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        return op_refuse(o, ERR_INVALID_FIELD, "reservation_id", NULL, "no reservation %.32s; see GET /v1/reservations",
                         reservation_id);
    if (rc != STORE_OK)
        return rc;
    if (strcmp(r.gpu_model, gpu_model) != 0)
        return op_refuse(o, ERR_INVALID_FIELD, "gpu_type", NULL, "reservation %s holds %s cards, not %s", r.id,
                         r.gpu_model, gpu_model);
    char when[32];
    if (strcmp(r.state, "booked") != 0)
        return op_refuse(o, ERR_INVALID_STATE, "reservation_id", json_pack("{s:s}", "state", "cancelled"),
                         "reservation %s was cancelled", r.id);
    if (now < r.starts_at) {
        time_text(r.starts_at, when, sizeof when);
        return op_refuse(o, ERR_INVALID_STATE, "reservation_id", json_pack("{s:s}", "state", "upcoming"),
                         "reservation %s starts at %s; launch from then on", r.id, when);
    }
    if (now >= r.ends_at) {
        time_text(r.ends_at, when, sizeof when);
        return op_refuse(o, ERR_INVALID_STATE, "reservation_id", json_pack("{s:s}", "state", "ended"),
                         "reservation %s ended at %s", r.id, when);
    }
    int64_t held = store_reservation_cards_held(s, r.id, instance_id);
    if (held < 0)
        return (int)held;
    if (held + cards > r.card_count)
        return op_refuse(o, ERR_INSUFFICIENT_CAPACITY, "card_count",
                         json_pack("{s:I, s:I}", "reserved", (json_int_t)r.card_count, "in_use", (json_int_t)held),
                         "reservation %s holds %lld cards and its instances use %lld; %lld more do not fit", r.id,
                         (long long)r.card_count, (long long)held, (long long)cards);
    return STORE_OK;
}

int reservation_pool_shrink_check(struct store *s, const char *node_id, int64_t now, int removing, int64_t *hour)
{
    *hour = 0;
    struct node n;
    int rc = store_node_get(s, node_id, &n);
    if (rc != STORE_OK)
        return rc;
    struct gpu_type t;
    if ((rc = store_gpu_type_row(s, n.gpu_model, &t)) != STORE_OK)
        return rc;
    /* A reservation-required type's node stays reserved whatever its
     * column says: only removing it takes it out of the pool. */
    if (t.reservation_required && !removing)
        return STORE_OK;
    int64_t this_hour = now - now % HOUR;
    struct reservation *r;
    size_t nr;
    if ((rc = store_node_reservations(s, node_id, this_hour, &r, &nr)) != STORE_OK)
        return rc;
    /* Each block bound to it for this or a later hour moves to another
     * node with room for the rest of its window, or the node stays. A
     * node already lost (down, or not active) is not refused: its blocks
     * that find no spare are credited by the pass as before. */
    int lost = strcmp(n.health, "up") != 0 || strcmp(n.admin_state, "active") != 0;
    for (size_t i = 0; i < nr && rc == STORE_OK; i++) {
        int64_t from = r[i].starts_at > this_hour ? r[i].starts_at : this_hour;
        char to_node[ID_MAX];
        rc = rehome(s, &r[i], node_id, from, now, to_node);
        if (rc == STORE_NOT_FOUND && lost) {
            rc = STORE_OK;
        } else if (rc == STORE_NOT_FOUND) {
            *hour = from;
            rc = STORE_CONFLICT;
        }
    }
    free(r);
    return rc;
}

/* Stops an instance of a reservation that ended (the volume kept). One
 * already winding down keeps its course: its user's terminate, still
 * waiting on its node, is not turned into a stop. */
static int stop_at_end(struct store *s, const struct reservation *r, const char *instance_id, int64_t now)
{
    struct instance in;
    int rc = store_instance_get(s, NULL, instance_id, &in);
    if (rc != STORE_OK || strcmp(in.desired, "running") != 0)
        return rc;
    char why[256], at[32];
    time_text(r->ends_at, at, sizeof at);
    snprintf(why, sizeof why, "reservation %s ended at %s: stopped, the volume is kept", r->id, at);
    if ((rc = store_instance_set_desired(s, instance_id, "stopped", now)) != STORE_OK ||
        (rc = ledger_close_interval(s, instance_id, r->ends_at, why, now)) != STORE_OK)
        return rc;
    log_info("reservations: stopping %s: %s", instance_id, why);
    return store_instance_set_state(s, instance_id, "stopping", "", why, now);
}

/* The warning before the end, or the stop at the end, for r. */
static int end_due(struct store *s, const struct reservation *r, int64_t now, int *stopped)
{
    char(*ids)[ID_MAX];
    size_t n;
    int rc = store_reservation_instances(s, r->id, &ids, &n);
    if (rc != STORE_OK)
        return rc;
    int ended = now >= r->ends_at;
    if (ended && (rc = catch_up(s, r, r->ends_at, now)) != STORE_OK) {
        free(ids);
        return rc;
    }
    char why[256], at[32];
    time_text(r->ends_at, at, sizeof at);
    snprintf(why, sizeof why, "reservation %s ends at %s: its instances will be stopped in %lld minutes", r->id, at,
             (long long)((r->ends_at - now + 59) / 60));
    for (size_t i = 0; i < n && rc == STORE_OK; i++) {
        if (ended) {
            rc = stop_at_end(s, r, ids[i], now);
            *stopped = 1;
        } else {
            rc = store_instance_event(s, ids[i], now, "reservation_warning", why);
        }
    }
    free(ids);
    if (rc != STORE_OK)
        return rc;
    return ended ? store_reservation_set_closed(s, r->id, now) : store_reservation_set_warned(s, r->id, now);
}

/* Credits block r for `lost` cards of the hour from `hour` (named after
 * node): an hour's credit only grows to the most cards found missing in it. */
static int credit_hour_at(struct store *s, const struct reservation *r, int64_t lost, const char *node, int64_t hour,
                          int64_t now)
{
    int64_t prev_cards, prev_amount;
    int rc = store_reservation_credit_get(s, r->id, hour, &prev_cards, &prev_amount);
    if (rc != STORE_OK || lost <= prev_cards)
        return rc;
    int64_t amount = (lost - prev_cards) * r->card_hour;
    char grant[ID_MAX] = "", reason[256], at[32];
    time_text(hour, at, sizeof at);
    snprintf(reason, sizeof reason,
             "SLA credit: reservation %s lost %lld card-hours in the hour from %s (node %s offline, out of service "
             "or its cards failed)",
             r->id, (long long)(lost - prev_cards), at, node);
    if (amount > 0) {
        rc = ledger_grant(s, r->user_id, "reservation", amount, 0, now, reason, grant);
        if (rc == LEDGER_OVER_BALANCE) {
            log_error("reservations: %s: credit of %lld refused: the holder is at max_balance", r->id,
                      (long long)amount);
            return STORE_OK;
        }
        if (rc != STORE_OK || (rc = store_reservation_add_credited(s, r->id, amount)) != STORE_OK)
            return rc;
    }
    if ((rc = store_reservation_credit_put(s, r->id, hour, lost, node, amount, grant, now)) != STORE_OK)
        return rc;
    log_info("reservations: %s", reason);
    return STORE_OK;
}

/* This hour's credit. */
static int credit_hour(struct store *s, const struct reservation *r, int64_t lost, const char *node, int64_t now)
{
    return credit_hour_at(s, r, lost, node, now - now % HOUR, now);
}

/* What history says of a node that answered with failed cards: the hour
 * each of its failed cards failed in (cards failed before migration 0044
 * have no known start and are left out), its card count, and the blocks
 * bound to it, newest booking first. */
struct node_failures {
    int64_t cards;
    int64_t failed_hour[64];
    size_t n_failed;
    struct reservation_binding *blocks;
    size_t n_blocks;
};

/* Reads f for node_id; f->n_failed is 0 when it has no failed card with a
 * known start (then nothing else is read). */
static int node_failures_read(struct store *s, const char *node_id, int64_t after, struct node_failures *f)
{
    struct node_card cards[64];
    size_t n;
    int rc = store_node_cards(s, node_id, cards, 64, &n);
    f->cards = (int64_t)n;
    for (size_t i = 0; i < n && rc == STORE_OK; i++)
        if (!cards[i].healthy && cards[i].failed_at > 0)
            f->failed_hour[f->n_failed++] = cards[i].failed_at - cards[i].failed_at % HOUR;
    if (rc == STORE_OK && f->n_failed)
        rc = store_node_bindings(s, node_id, after, &f->blocks, &f->n_blocks);
    return rc;
}

/* Whether binding b held its cards on its node in the hour from `hour`. */
static int bound_in(const struct reservation_binding *b, int64_t hour)
{
    return b->starts_at <= hour && hour < b->ends_at && b->bound_at - b->bound_at % HOUR <= hour;
}

/* The cards of block `id` that the node of f could not give in the hour
 * from `hour`, as the pass in that hour would have found them: the blocks
 * held there beyond its cards not yet failed fall on the newest bookings
 * first (node_shortfall; no spare was looked for, as no pass ran). */
static int64_t failed_share(const struct node_failures *f, const char *id, int64_t hour)
{
    int64_t failed = 0, held = 0;
    for (size_t i = 0; i < f->n_failed; i++)
        failed += f->failed_hour[i] <= hour;
    for (size_t i = 0; i < f->n_blocks; i++)
        held += bound_in(&f->blocks[i], hour) ? f->blocks[i].cards : 0;
    int64_t short_by = held - (f->cards - failed);
    for (size_t i = 0; i < f->n_blocks && short_by > 0; i++) {
        if (!bound_in(&f->blocks[i], hour))
            continue;
        int64_t take = short_by < f->blocks[i].cards ? short_by : f->blocks[i].cards;
        if (strcmp(f->blocks[i].reservation_id, id) == 0)
            return take;
        short_by -= take;
    }
    return 0;
}

/* The hours of block r before `until` that no pass saw (gpurentd was down,
 * or its clock moved on by hours): each pass credits the hour it runs in,
 * so such hours would go uncredited. Each is credited as a pass in it would
 * have been, from what history keeps (an hour credited already is not
 * credited twice):
 * - a node offline since its last good beat gave none of its cards from
 *   the hour of that beat;
 * - a node that answered with failed cards gave none of them from the hour
 *   each was first reported failed (node_cards.failed_at), beyond the spare
 *   cards it had. What the cards did while nothing watched is not known:
 *   a card still failed is taken to have stayed failed. */
static int catch_up_bound(struct store *s, const struct reservation *r, const struct reservation_binding *rows,
                          size_t n, int64_t until, int64_t now)
{
    int rc = STORE_OK;
    /* Per binding, the hour from which its node gave nothing (INT64_MAX
     * while it answers), and what its failed cards say. Nearly always every
     * node answers with every card: no hour is read. */
    int64_t *silent = calloc(n ? n : 1, sizeof *silent), first = INT64_MAX;
    struct node_failures *failures = calloc(n ? n : 1, sizeof *failures);
    if (!silent || !failures)
        rc = STORE_ERROR;
    for (size_t k = 0; k < n && rc == STORE_OK; k++) {
        struct node node;
        silent[k] = INT64_MAX;
        int got = store_node_get(s, rows[k].node_id, &node); /* a node removed since gave what it gave */
        if (got == STORE_OK && strcmp(node.health, "offline") == 0)
            silent[k] = node.last_seen_at ? node.last_seen_at - node.last_seen_at % HOUR : r->starts_at;
        else if (got == STORE_OK && strcmp(node.health, "up") == 0)
            rc = node_failures_read(s, rows[k].node_id, r->starts_at, &failures[k]);
        else if (got != STORE_OK && got != STORE_NOT_FOUND)
            rc = got;
        if (silent[k] < first)
            first = silent[k];
        for (size_t i = 0; i < failures[k].n_failed; i++) {
            int64_t from = failures[k].failed_hour[i], bound = rows[k].bound_at - rows[k].bound_at % HOUR;
            from = from > bound ? from : bound;
            first = from < first ? from : first;
        }
    }
    int64_t end = until < r->ends_at ? until : r->ends_at;
    for (int64_t hour = first > r->starts_at ? first : r->starts_at; hour < end && rc == STORE_OK; hour += HOUR) {
        int64_t lost = 0;
        const char *named = NULL;
        for (size_t k = 0; k < n; k++) {
            int64_t l = silent[k] <= hour ? rows[k].cards
                        : failures[k].n_failed && bound_in(&rows[k], hour) ? failed_share(&failures[k], r->id, hour)
                                                                            : 0;
            lost += l;
            named = named || !l ? named : rows[k].node_id;
        }
        if (lost)
            rc = credit_hour_at(s, r, lost, named, hour, now);
    }
    for (size_t k = 0; failures && k < n; k++)
        free(failures[k].blocks);
    free(failures);
    free(silent);
    return rc;
}

/* catch_up_bound over block r's bindings, read here. */
static int catch_up(struct store *s, const struct reservation *r, int64_t until, int64_t now)
{
    struct reservation_binding *rows = NULL;
    size_t n = 0;
    int rc = store_reservation_bindings(s, r->id, &rows, &n);
    if (rc == STORE_OK)
        rc = catch_up_bound(s, r, rows, n, until, now);
    free(rows);
    return rc == STORE_NOT_FOUND ? STORE_OK : rc;
}

/* What block i of a node's blocks has on it this pass. */
struct on_node {
    int64_t held;    /* cards of the node its instances hold */
    int64_t healthy; /* of those, the ones not reported failed */
    int moved;       /* re-homed by this pass */
};

/* One node's shortfall this hour: the cards its active blocks hold there
 * (a[], oldest booking first) beyond what it can give now. The newest
 * blocks move first, each onto a spare reserved node with room for the
 * rest of its window (then nothing is lost); what is still short falls on
 * the newest blocks left, lost[] per block, node_of[] naming the node. A
 * node an admin took out of service (cordoned, draining, maintenance) has
 * all its blocks moved where a spare has room; one that stays there loses
 * the cards its instances do not already run on, as nothing new is placed
 * on such a node: the holder paid for them, so they are credited as failed
 * hardware is.
 *
 * A block whose instances hold cards on the node is not moved: they run on
 * there (a node set aside, a failed card beside them), or may (a silent or
 * refused node whose instances wait to be judged lost), and the block
 * moved would hold a spare's cards too while theirs stayed held outside
 * any block, free on the calendar to be sold again to a block that then
 * could not launch. It takes its share of what is short and moves on the
 * first pass after its instances let go (stopped, lost). On a node that
 * gives nothing it is not credited meanwhile where a spare has room for
 * it: judged, its instances would be gone and the block moved without
 * credit, as it will be; where none has, it is credited as any block
 * without a spare.
 *
 * lost NULL: the moves alone, this hour's credits left to the pass (a
 * placement that needs a block's cards now, reservation_rehome_now). The
 * pass credits nothing for a block it moved, so moving it sooner changes
 * no credit. */
static int node_shortfall(struct store *s, const char *node_id, const struct reservation *a, size_t n,
                          const struct reservation_binding *const *bind, int64_t *lost, char (*node_of)[ID_MAX],
                          int64_t now)
{
    int active, up;
    int64_t usable = store_node_usable_cards(s, node_id, &active, &up), held = 0;
    if (usable < 0)
        return (int)usable;
    for (size_t i = 0; i < n; i++)
        if (bind[i] && strcmp(bind[i]->node_id, node_id) == 0)
            held += bind[i]->cards;
    int64_t short_by = held - usable, move = active ? short_by : held;
    if (move <= 0)
        return STORE_OK;
    struct on_node *on = calloc(n, sizeof *on);
    if (!on)
        return STORE_ERROR;
    int rc = STORE_OK;
    for (size_t i = 0; i < n && rc == STORE_OK; i++)
        if (bind[i] && strcmp(bind[i]->node_id, node_id) == 0)
            rc = store_reservation_cards_on_node(s, a[i].id, node_id, &on[i].held, &on[i].healthy);
    /* Every move before any credit: a block credited before an older one
     * moved would keep a credit for cards the move gave back. */
    int64_t this_hour = now - now % HOUR;
    for (size_t i = n; i-- > 0 && move > 0 && rc == STORE_OK;) {
        if (!bind[i] || strcmp(bind[i]->node_id, node_id) != 0 || on[i].held > 0)
            continue;
        char to_node[ID_MAX];
        rc = rehome(s, &a[i], node_id, this_hour, now, to_node);
        move -= bind[i]->cards;
        if (rc == STORE_OK) {
            short_by -= bind[i]->cards;
            on[i].moved = 1;
        } else if (rc == STORE_NOT_FOUND) {
            rc = STORE_OK;
        }
    }
    for (size_t i = n; lost && i-- > 0 && rc == STORE_OK;) {
        if (!bind[i] || strcmp(bind[i]->node_id, node_id) != 0 || on[i].moved)
            continue;
        int64_t l = short_by <= 0 ? 0 : short_by < bind[i]->cards ? short_by : bind[i]->cards;
        if (!active && bind[i]->cards - on[i].healthy > l)
            l = bind[i]->cards - on[i].healthy;
        short_by -= l;
        if (l > 0 && on[i].held > 0 && !up) {
            char spare[ID_MAX];
            rc = spare_for(s, &a[i], this_hour, spare);
            l = rc == STORE_OK ? 0 : l;
            rc = rc == STORE_NOT_FOUND ? STORE_OK : rc;
        }
        if (l <= 0 || rc != STORE_OK)
            continue;
        lost[i] += l;
        if (!node_of[i][0])
            snprintf(node_of[i], ID_MAX, "%s", node_id);
    }
    free(on);
    return rc;
}

/* Re-homes or credits the active blocks a[0..n) (by type, oldest booking
 * first) for this hour, node by node of their bindings. */
static int shortfalls(struct store *s, const struct reservation *a, size_t n, int64_t now)
{
    struct reservation_binding **rows = calloc(n + 1, sizeof *rows);
    size_t *counts = calloc(n + 1, sizeof *counts);
    int64_t *lost = calloc(n + 1, sizeof *lost);
    char(*node_of)[ID_MAX] = calloc(n + 1, sizeof *node_of);
    const struct reservation_binding **bind = calloc(n + 1, sizeof *bind);
    int rc = rows && counts && lost && node_of && bind ? STORE_OK : STORE_ERROR;
    /* The hours before this one that no pass saw first (catch_up), then this
     * hour, from the same bindings. */
    for (size_t i = 0; i < n && rc == STORE_OK; i++)
        if ((rc = store_reservation_bindings(s, a[i].id, &rows[i], &counts[i])) == STORE_OK)
            rc = catch_up_bound(s, &a[i], rows[i], counts[i], now - now % HOUR, now);
    /* Node by node: bind[i] is block i's binding on that node, if any.
     * A node's id is kept in a copy, as re-homing rewrites rows. */
    for (size_t i = 0; i < n && rc == STORE_OK; i++)
        for (size_t k = 0; k < counts[i] && rc == STORE_OK; k++) {
            char node[ID_MAX];
            snprintf(node, sizeof node, "%s", rows[i][k].node_id);
            int seen = 0;
            for (size_t j = 0; j < i && !seen; j++)
                for (size_t m = 0; m < counts[j]; m++)
                    seen |= strcmp(rows[j][m].node_id, node) == 0;
            if (seen)
                continue;
            for (size_t j = 0; j < n; j++) {
                bind[j] = NULL;
                for (size_t m = 0; m < counts[j]; m++)
                    if (strcmp(rows[j][m].node_id, node) == 0)
                        bind[j] = &rows[j][m];
            }
            rc = node_shortfall(s, node, a, n, bind, lost, node_of, now);
        }
    for (size_t i = 0; i < n && rc == STORE_OK; i++)
        if (lost[i] > 0)
            rc = credit_hour(s, &a[i], lost[i], node_of[i], now);
    for (size_t i = 0; rows && i < n; i++)
        free(rows[i]);
    free(rows);
    free(counts);
    free(lost);
    free(node_of);
    free(bind);
    return rc;
}

/* node_shortfall's moves on node_id now, over the active blocks bound to
 * it (oldest booking first, as the pass takes them). */
static int node_moves_now(struct store *s, const char *node_id, int64_t now)
{
    struct reservation *newest = NULL, *a = NULL; /* newest booking first, as read; a: oldest first */
    struct reservation_binding *rows = NULL;
    const struct reservation_binding **bind = NULL;
    size_t n = 0, n_rows = 0, k = 0;
    int rc = store_node_reservations(s, node_id, now, &newest, &n);
    if (rc == STORE_OK)
        rc = store_node_bindings(s, node_id, now, &rows, &n_rows);
    if (rc == STORE_OK && (!(a = calloc(n + 1, sizeof *a)) || !(bind = calloc(n + 1, sizeof *bind))))
        rc = STORE_ERROR;
    for (size_t i = n; rc == STORE_OK && i-- > 0;) {
        if (newest[i].starts_at > now)
            continue; /* not begun: the pass leaves it too */
        a[k] = newest[i];
        for (size_t m = 0; m < n_rows; m++)
            if (strcmp(rows[m].reservation_id, a[k].id) == 0)
                bind[k] = &rows[m];
        k++;
    }
    if (rc == STORE_OK)
        rc = node_shortfall(s, node_id, a, k, bind, NULL, NULL, now);
    free(newest);
    free(a);
    free(rows);
    free(bind);
    return rc;
}

int reservation_rehome_now(struct store *s, const char *reservation_id, int64_t now)
{
    struct reservation_binding *mine = NULL;
    size_t n = 0;
    int rc = store_reservation_bindings(s, reservation_id, &mine, &n);
    for (size_t k = 0; k < n && rc == STORE_OK; k++)
        rc = node_moves_now(s, mine[k].node_id, now);
    free(mine);
    return rc;
}

int reservation_stuck_why(struct store *s, const char *reservation_id, char *why, size_t n)
{
    why[0] = 0;
    struct reservation_binding *mine = NULL;
    size_t n_mine = 0;
    int rc = store_reservation_bindings(s, reservation_id, &mine, &n_mine);
    for (size_t k = 0; k < n_mine && rc == STORE_OK && !why[0]; k++) {
        struct node node;
        int64_t held, healthy;
        if ((rc = store_node_get(s, mine[k].node_id, &node)) == STORE_NOT_FOUND) {
            snprintf(node.name, sizeof node.name, "%s", mine[k].node_id);
            snprintf(node.state, sizeof node.state, "removed");
        } else if (rc != STORE_OK || strcmp(node.state, "ready") == 0) {
            continue;
        }
        if ((rc = store_reservation_cards_on_node(s, reservation_id, mine[k].node_id, &held, &healthy)) != STORE_OK)
            break;
        /* Why the pass's rule (node_shortfall) left the block there. */
        const char *stays = held > 0 ? "the block stays with its instances, which hold cards there"
                            : strcmp(node.state, "unreachable") == 0
                                ? "the block waits for it to answer again or be judged lost"
                                : "no other reserved node has room for the block for the rest of its window";
        const char *is = strcmp(node.state, "rejected") == 0 ? "refused (its hardware no longer matches its "
                                                               "registration)"
                                                             : node.state;
        snprintf(why, n, "node %s is %s, and %s", node.name, is, stays);
    }
    free(mine);
    return rc;
}

/* Binds the blocks booked before 0028 for what is left of their windows,
 * oldest first; one that no node can hold stays unbound (its instances
 * take the pool's best fit, as before 0028). */
static int bind_unbound(struct store *s, int64_t now)
{
    struct reservation *r;
    size_t n;
    int64_t this_hour = now - now % HOUR;
    int rc = store_reservations_unbound(s, this_hour, &r, &n);
    for (size_t i = 0; i < n && rc == STORE_OK; i++) {
        rc = bind_block(s, &r[i], r[i].starts_at > this_hour ? r[i].starts_at : this_hour, now);
        if (rc == STORE_NOT_FOUND) {
            log_error("reservations: %s: no reserved node can hold its %lld cards for the rest of its window; it "
                      "stays unbound",
                      r[i].id, (long long)r[i].card_count);
            rc = STORE_OK;
        }
    }
    free(r);
    return rc;
}

int reservation_pass(struct store *s, int64_t now, int *stopped)
{
    *stopped = 0;
    struct reservation *r;
    size_t n;
    int rc = store_reservations_due(s, now, daemon_config->reservation_warning_minutes * 60, &r, &n);
    for (size_t i = 0; rc == STORE_OK && i < n; i++)
        rc = end_due(s, &r[i], now, stopped);
    free(r);
    if (rc != STORE_OK || (rc = bind_unbound(s, now)) != STORE_OK)
        return rc;
    if ((rc = store_reservations_active(s, now, &r, &n)) != STORE_OK)
        return rc;
    rc = shortfalls(s, r, n, now);
    free(r);
    return rc;
}
