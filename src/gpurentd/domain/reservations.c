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

/* Cards booked in each hour of [from, to): booked[], and of those, the
 * cards of multi-node blocks in fabric (when fabric is not NULL):
 * in_fabric[]. Both arrays have (to - from) / 3600 entries, zeroed here. */
static int calendar(struct store *s, const char *model, int64_t from, int64_t to, int64_t *booked, const char *fabric,
                    int64_t *in_fabric)
{
    size_t hours = (size_t)((to - from) / HOUR);
    memset(booked, 0, hours * sizeof *booked);
    if (in_fabric)
        memset(in_fabric, 0, hours * sizeof *in_fabric);
    struct reservation *r;
    size_t n;
    int rc = store_reservations_overlapping(s, model, from, to, &r, &n);
    if (rc != STORE_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        int64_t a = r[i].starts_at > from ? r[i].starts_at : from, b = r[i].ends_at < to ? r[i].ends_at : to;
        for (int64_t h = a; h < b; h += HOUR) {
            booked[(h - from) / HOUR] += r[i].card_count;
            if (in_fabric && fabric && r[i].fabric[0] && strcmp(r[i].fabric, fabric) == 0)
                in_fabric[(h - from) / HOUR] += r[i].card_count;
        }
    }
    free(r);
    return STORE_OK;
}

int reservation_free_hours(struct store *s, const char *gpu_model, int64_t from, int64_t to, int64_t *free_cards)
{
    int64_t cap;
    struct reserved_fabric fabrics[RESERVED_FABRICS_MAX];
    size_t nf;
    int rc = store_reserved_capacity(s, gpu_model, &cap, fabrics, &nf);
    if (rc != STORE_OK)
        return rc;
    if ((rc = calendar(s, gpu_model, from, to, free_cards, NULL, NULL)) != STORE_OK)
        return rc;
    for (int64_t i = 0; i < (to - from) / HOUR; i++)
        free_cards[i] = cap > free_cards[i] ? cap - free_cards[i] : 0;
    return STORE_OK;
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

/* A multi-node block holds whole nodes in one fabric for its window: the
 * fabric with the fewest whole nodes whose multi-node bookings leave room
 * every hour. fabric_out gets it, or "" when none fits. */
static int choose_fabric(struct store *s, const char *model, int64_t cards, int64_t from, int64_t to,
                         const struct reserved_fabric *fabrics, size_t nf, int64_t *booked, int64_t *in_fabric,
                         char fabric_out[64])
{
    fabric_out[0] = 0;
    int64_t best = -1;
    for (size_t f = 0; f < nf; f++) {
        if (fabrics[f].whole_nodes * PLACEMENT_NODE_CARDS < cards || (best >= 0 && fabrics[f].whole_nodes >= best))
            continue;
        int rc = calendar(s, model, from, to, booked, fabrics[f].fabric, in_fabric);
        if (rc != STORE_OK)
            return rc;
        if (first_full_hour(in_fabric, from, to, cards, fabrics[f].whole_nodes * PLACEMENT_NODE_CARDS) < 0) {
            best = fabrics[f].whole_nodes;
            snprintf(fabric_out, 64, "%.63s", fabrics[f].fabric);
        }
    }
    return STORE_OK;
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
    int64_t *booked = calloc(hours, sizeof *booked), *in_fabric = calloc(hours, sizeof *in_fabric);
    char fabric[64] = "";
    if (!booked || !in_fabric) {
        rc = STORE_ERROR;
        goto done;
    }
    /* Every hour of the window: what is booked plus this never exceeds the
     * reserved pool's healthy capacity. Writers take turns (BEGIN
     * IMMEDIATE), so nothing books between this read and the insert. */
    if ((rc = calendar(s, t.code, starts_at, ends_at, booked, NULL, NULL)) != STORE_OK)
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
    if (cards > PLACEMENT_NODE_CARDS) {
        if ((rc = choose_fabric(s, t.code, cards, starts_at, ends_at, fabrics, nf, booked, in_fabric, fabric)) !=
            STORE_OK)
            goto done;
        if (!fabric[0]) {
            rc = op_refuse(o, ERR_INSUFFICIENT_CAPACITY, "cards", NULL,
                           "no fabric has %lld whole %s nodes free for every hour of the window (more than 8 cards "
                           "are whole nodes in one fabric)",
                           (long long)(cards / PLACEMENT_NODE_CARDS), t.code);
            goto done;
        }
    }
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
    *out = r;
done:
    free(booked);
    free(in_fabric);
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
    snprintf(reason, sizeof reason, "reservation %s cancelled: %lld%% refunded", r.id,
             (long long)(r.amount ? (__int128)refund * 100 / r.amount : 100));
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
    int64_t cap_before, cap_after;
    struct reserved_fabric fabrics[RESERVED_FABRICS_MAX];
    size_t nf;
    if ((rc = store_reserved_capacity(s, n.gpu_model, &cap_before, fabrics, &nf)) != STORE_OK)
        return rc;
    char pool[16];
    if ((rc = store_node_pool(s, node_id, pool)) != STORE_OK)
        return rc;
    /* Only a node counted in the sellable reserved pool shrinks it: the
     * capacity without it is what the store counts less its healthy cards. */
    struct gpu_type t;
    if ((rc = store_gpu_type_row(s, n.gpu_model, &t)) != STORE_OK)
        return rc;
    int reserved = strcmp(pool, "reserved") == 0 || t.reservation_required;
    /* A reservation-required type's node stays reserved whatever its
     * column says: only removing it shrinks the pool. */
    if (!reserved || (t.reservation_required && !removing) || strcmp(n.health, "up") != 0 ||
        strcmp(n.admin_state, "active") != 0)
        return STORE_OK;
    int64_t healthy = store_node_healthy_cards(s, node_id);
    if (healthy < 0)
        return (int)healthy;
    cap_after = cap_before - healthy;
    int64_t from = now - now % HOUR, to = from + daemon_config->reservation_horizon_hours * HOUR;
    size_t hours = (size_t)((to - from) / HOUR);
    int64_t *booked = calloc(hours, sizeof *booked);
    if (!booked)
        return STORE_ERROR;
    if ((rc = calendar(s, n.gpu_model, from, to, booked, NULL, NULL)) == STORE_OK) {
        int64_t full = first_full_hour(booked, from, to, 0, cap_after);
        if (full >= 0) {
            *hour = full;
            rc = STORE_CONFLICT;
        }
    }
    free(booked);
    return rc;
}

/* Stops an instance of a reservation that ended (the volume kept). */
static int stop_at_end(struct store *s, const struct reservation *r, const char *instance_id, int64_t now)
{
    char why[256], at[32];
    time_text(r->ends_at, at, sizeof at);
    snprintf(why, sizeof why, "reservation %s ended at %s: stopped, the volume is kept", r->id, at);
    int rc;
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

/* Credits what the reserved pool of the active blocks a[0..n) (one type,
 * oldest booking first) cannot give this hour: the shortfall falls on the
 * newest bookings first, and an hour's credit only grows to the most cards
 * found missing in it. */
static int credit_shortfall(struct store *s, const struct reservation *a, size_t n, int64_t now)
{
    int64_t usable, booked = 0;
    char node[ID_MAX];
    int rc = store_reserved_usable(s, a[0].gpu_model, &usable, node);
    if (rc != STORE_OK)
        return rc;
    for (size_t i = 0; i < n; i++)
        booked += a[i].card_count;
    int64_t short_by = booked - usable, hour = now - now % HOUR;
    if (short_by <= 0 || !node[0])
        return STORE_OK;
    for (size_t i = n; i-- > 0 && short_by > 0;) {
        const struct reservation *r = &a[i];
        int64_t lost = short_by < r->card_count ? short_by : r->card_count, prev_cards, prev_amount;
        short_by -= lost;
        if ((rc = store_reservation_credit_get(s, r->id, hour, &prev_cards, &prev_amount)) != STORE_OK)
            return rc;
        if (lost <= prev_cards)
            continue;
        int64_t amount = (lost - prev_cards) * r->card_hour;
        char grant[ID_MAX] = "", reason[256], at[32];
        time_text(hour, at, sizeof at);
        snprintf(reason, sizeof reason,
                 "SLA credit: reservation %s lost %lld card-hours in the hour from %s (node %s offline or its cards "
                 "failed)",
                 r->id, (long long)(lost - prev_cards), at, node);
        if (amount > 0) {
            rc = ledger_grant(s, r->user_id, "reservation", amount, 0, now, reason, grant);
            if (rc == LEDGER_OVER_BALANCE) {
                log_error("reservations: %s: credit of %lld refused: the holder is at max_balance", r->id,
                          (long long)amount);
                continue;
            }
            if (rc != STORE_OK || (rc = store_reservation_add_credited(s, r->id, amount)) != STORE_OK)
                return rc;
        }
        if ((rc = store_reservation_credit_put(s, r->id, hour, lost, node, amount, grant, now)) != STORE_OK)
            return rc;
        log_info("reservations: %s", reason);
    }
    return STORE_OK;
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
    if (rc != STORE_OK)
        return rc;
    if ((rc = store_reservations_active(s, now, &r, &n)) != STORE_OK)
        return rc;
    for (size_t i = 0; rc == STORE_OK && i < n;) {
        size_t j = i;
        while (j < n && strcmp(r[j].gpu_model, r[i].gpu_model) == 0)
            j++;
        rc = credit_shortfall(s, &r[i], j - i, now);
        i = j;
    }
    free(r);
    return rc;
}
