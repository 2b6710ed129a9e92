/* api_reservations.c: /v1/reservations — book cards of a GPU type for whole
 * hours (paid at once), list and show them, cancel one (refunded by the
 * notice rule), and the calendar of free cards per hour. Each change is one
 * transaction in domain/reservations.c. */
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RESERVATIONS_PAGE_MAX 100

static void reply_outcome(struct http_request *req, struct op_outcome *o)
{
    json_t *extra = o->extra;
    o->extra = NULL;
    http_error_ext(req, o->error, o->field[0] ? o->field : NULL, extra, "%s", o->message);
}

static void reply_failure(struct http_request *req, int rc, struct op_outcome *o)
{
    if (o->failed)
        reply_outcome(req, o);
    else if (rc == STORE_CONFLICT)
        http_error(req, ERR_CONFLICT, NULL, "a concurrent request changed this; retry");
    else
        http_error(req, ERR_INTERNAL, NULL, NULL);
}

/* Reads a time field: any RFC 3339 date-time, so a team in Beijing may
 * send "2026-12-03T18:00:00+08:00" for 10:00 UTC (answers are in UTC).
 * Replies 400 and returns -1 when it is not a time, or has a fraction of a
 * second (never a whole hour; the window's rules check the rest). */
static int time_field(struct http_request *req, json_t *body, const char *name, int64_t *out)
{
    const char *text = json_string_value(json_object_get(body, name));
    int fraction;
    if (!text || json_time_parse_rfc3339(text, out, &fraction) < 0) {
        http_error(req, ERR_INVALID_FIELD, name,
                   "%s must be an RFC 3339 time like 2026-12-03T10:00:00Z or 2026-12-03T18:00:00+08:00", name);
        return -1;
    }
    if (fraction) {
        http_error(req, ERR_INVALID_FIELD, name, "%s must be a whole hour (minutes and seconds 0)", name);
        return -1;
    }
    return 0;
}

struct create_ctx {
    const char *user_id, *gpu_type; /* who, what */
    int64_t cards, starts_at, ends_at, now;
    const struct http_request *req; /* for idempotency records */
    struct idempotency *idem;       /* the key */
    struct op_outcome o;            /* refusal, if any */
    struct reservation r;           /* the booking */
    char *body;                     /* the answer (malloc'd) */
    int replayed;                   /* 0, or the status of a twin's stored answer in body */
};

static int create_txn(struct store *s, void *vctx)
{
    struct create_ctx *ctx = vctx;
    free(ctx->body);
    ctx->body = NULL;
    ctx->replayed = 0;
    json_decref(ctx->o.extra);
    memset(&ctx->o, 0, sizeof ctx->o);
    /* A twin with the same key may have committed since idempotency_begin
     * (writers are serialised): replay it rather than book twice. */
    int status = 0;
    int twin = idempotency_twin(s, ctx->req, ctx->idem, &status, &ctx->body);
    if (twin < 0)
        return twin;
    if (twin == IDEM_REUSED)
        return op_refuse(&ctx->o, ERR_IDEMPOTENCY_KEY_REUSED, "Idempotency-Key", NULL,
                         "this Idempotency-Key was used for another request");
    if (twin == IDEM_REPLAY) {
        ctx->replayed = status;
        return STORE_OK;
    }
    int rc = reservation_book(s, ctx->user_id, ctx->gpu_type, ctx->cards, ctx->starts_at, ctx->ends_at, ctx->now,
                              &ctx->r, &ctx->o);
    if (rc != STORE_OK)
        return rc;
    json_t *j = reservation_json(&ctx->r, ctx->now);
    ctx->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!ctx->body)
        return STORE_ERROR;
    snprintf(ctx->idem->location, sizeof ctx->idem->location, "/v1/reservations/%s", ctx->r.id);
    return idempotency_record(s, ctx->req, ctx->idem, 201, ctx->body);
}

void api_reservations_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"gpu_type",  JSON_KIND_STRING,  1, 32},
        {"cards",     JSON_KIND_INTEGER, 1, 0 },
        {"starts_at", JSON_KIND_STRING,  1, 32},
        {"ends_at",   JSON_KIND_STRING,  1, 32},
        {NULL,        0,                 0, 0 },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct idempotency idem;
    if (idempotency_begin(req, &idem)) {
        json_decref(body);
        return;
    }
    struct create_ctx ctx = {.user_id = req->user_id,
                             .gpu_type = json_string_value(json_object_get(body, "gpu_type")),
                             .cards = json_integer_value(json_object_get(body, "cards")),
                             .now = clock_now(),
                             .req = req,
                             .idem = &idem};
    if (time_field(req, body, "starts_at", &ctx.starts_at) < 0 || time_field(req, body, "ends_at", &ctx.ends_at) < 0) {
        json_decref(body);
        return;
    }
    /* The window's rules before any transaction: a bad one changes nothing. */
    if (reservation_window_check(ctx.cards, ctx.starts_at, ctx.ends_at, ctx.now, &ctx.o) != STORE_OK) {
        reply_outcome(req, &ctx.o);
        json_decref(body);
        return;
    }
    struct store *s = store_thread();
    int rc = s ? store_txn(s, create_txn, &ctx) : STORE_ERROR;
    if (rc == STORE_OK && ctx.replayed) {
        idempotency_replay(req, &idem, ctx.replayed, ctx.body);
    } else if (rc == STORE_OK) {
        log_info("reservations: %s booked %s: %lld x %s", req->user_id, ctx.r.id, (long long)ctx.cards,
                 ctx.r.gpu_model);
        char location[64];
        snprintf(location, sizeof location, "/v1/reservations/%s", ctx.r.id);
        http_add_header(req, "Location", location);
        http_reply_raw(req, 201, "application/json", ctx.body, strlen(ctx.body));
    } else {
        reply_failure(req, rc, &ctx.o);
    }
    json_decref(ctx.o.extra);
    free(ctx.body);
    json_decref(body);
}

void api_reservations_list(struct http_request *req)
{
    static const char *const allowed[] = {"state", "gpu_type", "limit", "cursor", NULL};
    static const char *const states[] = {"upcoming", "active", "ended", "cancelled", NULL};
    struct page pg;
    if (http_query_allow(req, allowed) < 0 || page_begin(req, RESERVATIONS_PAGE_MAX, 50, &pg) < 0)
        return;
    int64_t now = clock_now();
    struct reservation_filter f = {.user_id = req->user_id,
                                   .gpu_model = http_query(req, "gpu_type"),
                                   .state = http_query(req, "state"),
                                   .now = now,
                                   .after_created = pg.after_t,
                                   .after_id = pg.after_id};
    int state_ok = !f.state;
    for (size_t i = 0; f.state && states[i]; i++)
        state_ok |= strcmp(f.state, states[i]) == 0;
    if (!state_ok) {
        http_error(req, ERR_INVALID_QUERY, "state", "state must be upcoming, active, ended or cancelled");
        return;
    }
    if (f.gpu_model && strlen(f.gpu_model) > 32) {
        http_error(req, ERR_INVALID_QUERY, "gpu_type", "gpu_type is a GPU type code of at most 32 characters");
        return;
    }
    struct reservation *list = malloc(sizeof *list * (size_t)(pg.limit + 1));
    size_t n = 0;
    struct store *s = store_thread();
    if (!list || !s || store_reservation_list(s, &f, list, (size_t)pg.limit + 1, &n) != STORE_OK) {
        free(list);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    size_t shown = page_shown(&pg, n);
    json_t *data = json_array();
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(data, reservation_json(&list[i], now));
    json_t *next = n > shown ? page_cursor(list[shown - 1].created_at, list[shown - 1].id) : json_null();
    free(list);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

void api_reservations_get(struct http_request *req)
{
    struct store *s = store_thread();
    struct reservation r;
    int rc = !s                                ? STORE_ERROR
             : id_valid("rsv", req->params[0]) ? store_reservation_get(s, req->user_id, req->params[0], &r)
                                               : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no reservation %.32s", req->params[0]);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else
        http_reply_json(req, 200, reservation_json(&r, clock_now()));
}

struct cancel_ctx {
    const char *user_id, *id; /* whose, which */
    int64_t now;
    struct op_outcome o;
    struct reservation r; /* out: as cancelled */
};

static int cancel_txn(struct store *s, void *vctx)
{
    struct cancel_ctx *ctx = vctx;
    json_decref(ctx->o.extra);
    memset(&ctx->o, 0, sizeof ctx->o);
    return reservation_cancel(s, ctx->user_id, ctx->id, ctx->now, &ctx->r, &ctx->o);
}

void api_reservations_cancel(struct http_request *req)
{
    struct store *s = store_thread();
    struct cancel_ctx ctx = {.user_id = req->user_id, .id = req->params[0], .now = clock_now()};
    int rc = s ? store_txn(s, cancel_txn, &ctx) : STORE_ERROR;
    if (rc == STORE_OK) {
        log_info("reservations: %s cancelled %s, refunded %lld", req->user_id, ctx.r.id, (long long)ctx.r.refunded);
        http_reply_json(req, 200, reservation_json(&ctx.r, ctx.now));
    } else {
        reply_failure(req, rc, &ctx.o);
    }
    json_decref(ctx.o.extra);
}

/* Reads a whole-hour time query parameter, any RFC 3339 date-time as
 * booking takes (an offset's '+' sent as %2B); replies 400 and returns -1
 * when it is missing or not one. */
static int time_query(struct http_request *req, const char *name, int64_t *out)
{
    const char *text = http_query(req, name);
    int fraction;
    if (!text || json_time_parse_rfc3339(text, out, &fraction) < 0 || fraction || *out % 3600 != 0) {
        http_error(req, ERR_INVALID_QUERY, name,
                   "%s must be a whole hour, an RFC 3339 time like 2026-12-03T10:00:00Z or 2026-12-03T18:00:00+08:00",
                   name);
        return -1;
    }
    return 0;
}

void api_reservations_availability(struct http_request *req)
{
    static const char *const allowed[] = {"gpu_type", "from", "to", NULL};
    if (http_query_allow(req, allowed) < 0)
        return;
    const char *model = http_query(req, "gpu_type");
    int64_t from, to;
    if (!model || !model[0]) {
        http_error(req, ERR_INVALID_QUERY, "gpu_type", "gpu_type is required");
        return;
    }
    if (time_query(req, "from", &from) < 0 || time_query(req, "to", &to) < 0)
        return;
    if (to <= from || (to - from) / 3600 > daemon_config->reservation_horizon_hours) {
        http_error(req, ERR_INVALID_QUERY, "to", "to must be after from and at most %lld hours later",
                   (long long)daemon_config->reservation_horizon_hours);
        return;
    }
    struct store *s = store_thread();
    struct gpu_type t;
    int rc = s ? store_gpu_type_row(s, model, &t) : STORE_ERROR;
    if (rc == STORE_NOT_FOUND) {
        http_error(req, ERR_INVALID_QUERY, "gpu_type", "no GPU type %.32s; see GET /v1/gpu-types", model);
        return;
    }
    size_t hours = (size_t)((to - from) / 3600);
    /* Per hour: free cards over all reserved nodes, and the largest block
     * of that one hour still bookable (blocks are held on one node, or on
     * whole nodes of one fabric: free cards spread over nodes are not one
     * block). */
    int64_t *free_cards = calloc(hours, sizeof *free_cards), *largest = calloc(hours, sizeof *largest);
    if (rc != STORE_OK || !free_cards || !largest ||
        reservation_free_hours(s, t.code, from, to, free_cards, largest) != STORE_OK) {
        free(free_cards);
        free(largest);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    int64_t now = clock_now(), horizon = daemon_config->reservation_horizon_hours * 3600;
    json_t *data = json_array();
    for (size_t i = 0; i < hours; i++) {
        /* An hour already begun, or ending past the booking horizon, is
         * not for sale whatever is free in it (the window's rules). */
        int64_t at = from + (int64_t)i * 3600;
        int sold = at >= now && at + 3600 - now <= horizon;
        json_array_append_new(data, json_pack("{s:o, s:I, s:I}", "starts_at", json_time(at, 0), "cards_free",
                                              (json_int_t)(sold ? free_cards[i] : 0), "largest_block",
                                              (json_int_t)(sold ? largest[i] : 0)));
    }
    free(free_cards);
    free(largest);
    http_reply_json(req, 200, json_pack("{s:s, s:o}", "gpu_type", t.code, "hours", data));
}
