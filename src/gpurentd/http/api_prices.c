/* api_prices.c: GET /v1/prices (price history, public), GET /v1/estimate
 * (what a rental would cost, public) and the admin's
 * PUT /v1/admin/prices/{gpu_type} (at most max_price_per_card_hour,
 * recorded in admin_actions). A price applies from its effective time on,
 * never backwards. */
#include "domain/domain.h"
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "gpurent/tariff.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRICES_MAX 1000

void api_prices_list(struct http_request *req)
{
    static const char *const allowed[] = {"gpu_type", NULL};
    if (http_query_allow(req, allowed) < 0)
        return;
    struct price_row *rows = malloc(sizeof *rows * PRICES_MAX);
    size_t n = 0;
    struct store *s = store_thread();
    if (!rows || !s || store_price_history(s, http_query(req, "gpu_type"), rows, PRICES_MAX, &n) != STORE_OK) {
        free(rows);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(data, json_pack("{s:s, s:o, s:o, s:s, s:o}", "gpu_type", rows[i].gpu_model,
                                              "price_per_card_hour", json_money(rows[i].card_hour), "effective_at",
                                              json_time(rows[i].effective_at, 0), "currency", daemon_config->currency,
                                              "set_at", json_time(rows[i].created_at, 0)));
    free(rows);
    http_reply_json(req, 200, json_pack("{s:o}", "data", data));
}

/* Reads an hours query argument ("3", "1.5"): -1 after replying if bad. */
static int query_hours(struct http_request *req, const char *name, int required, int64_t max_hours, int64_t *seconds)
{
    const char *v = http_query(req, name);
    int64_t micro;
    if (!v) {
        if (required) {
            http_error(req, ERR_INVALID_QUERY, name, "%s is required", name);
            return -1;
        }
        *seconds = -1;
        return 0;
    }
    if (money_parse(v, &micro) != MONEY_OK || micro <= 0 || micro > max_hours * MONEY_UNIT) {
        http_error(req, ERR_INVALID_QUERY, name, "%s must be a positive number of hours up to %lld, like 3 or 1.5",
                   name, (long long)max_hours);
        return -1;
    }
    *seconds = (int64_t)((__int128)micro * 3600 / MONEY_UNIT);
    return 0;
}

/* Adds the storage of a volume of volume_gb in region to an estimate: it
 * is billed for all `seconds` the volume exists, running or stopped, at
 * the price in force now; total becomes cards and storage. -1 after
 * replying if it cannot be computed. */
static int estimate_storage(struct http_request *req, struct store *s, json_t *reply, int64_t volume_gb,
                            const char *region, int64_t now, int64_t seconds, int64_t cards_total)
{
    struct storage_book book = {0};
    int64_t price = storage_book_price_at(s, &book, region, now);
    storage_book_free(&book);
    if (price < 0) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return -1;
    }
    const struct price_point pp[] = {{0, price}};
    int64_t hour, storage, total;
    if (tariff_storage_due(pp, 1, volume_gb, 0, 3600, &hour) != MONEY_OK ||
        tariff_storage_due(pp, 1, volume_gb, 0, seconds, &storage) != MONEY_OK ||
        money_add(cards_total, storage, &total) != MONEY_OK) {
        http_error(req, ERR_INVALID_QUERY, "volume_gb", "that estimate is too large");
        return -1;
    }
    json_object_set_new(reply, "volume_gb", json_integer(volume_gb));
    json_object_set_new(reply, "region", json_string(region[0] ? region : "global"));
    json_object_set_new(reply, "price_per_gb_month", json_money(price));
    json_object_set_new(reply, "storage_hours", json_money((int64_t)((__int128)seconds * MONEY_UNIT / 3600)));
    json_object_set_new(reply, "storage_per_hour", json_money(hour));
    json_object_set_new(reply, "storage_total", json_money(storage));
    json_object_set_new(reply, "cards_total", json_money(cards_total));
    json_object_set_new(reply, "total", json_money(total));
    return 0;
}

void api_estimate_get(struct http_request *req)
{
    static const char *const allowed[] = {"gpu_type", "card_count", "hours", "hours_per_day", "days", "volume_gb",
                                          "region", NULL};
    int64_t cards, seconds, per_day, days, volume_gb;
    if (http_query_allow(req, allowed) < 0 || http_query_int(req, "card_count", 1, 256, 1, &cards) < 0 ||
        query_hours(req, "hours", 0, 100000, &seconds) < 0 || query_hours(req, "hours_per_day", 0, 24, &per_day) < 0 ||
        http_query_int(req, "days", 1, 3660, 1, &days) < 0 ||
        http_query_int(req, "volume_gb", 1, daemon_config->max_volume_size_gb, 0, &volume_gb) < 0)
        return;
    const char *region = http_query(req, "region");
    if (region && strcmp(region, "global") != 0 && !storage_region_valid(region)) {
        http_error(req, ERR_INVALID_QUERY, "region", "region must be global or letters, digits, '.', '_' or '-'");
        return;
    }
    if (region && !http_query(req, "volume_gb")) {
        http_error(req, ERR_INVALID_QUERY, "region", "region goes with volume_gb");
        return;
    }
    if (!region || strcmp(region, "global") == 0)
        region = "";
    const char *type = http_query(req, "gpu_type");
    if (!type) {
        http_error(req, ERR_INVALID_QUERY, "gpu_type", "gpu_type is required");
        return;
    }
    if ((seconds < 0) == (per_day < 0)) {
        http_error(req, ERR_INVALID_QUERY, "hours", "give either hours, or hours_per_day (with days)");
        return;
    }
    if (http_query(req, "days") && per_day < 0) {
        http_error(req, ERR_INVALID_QUERY, "days", "days goes with hours_per_day");
        return;
    }
    struct store *s = store_thread();
    int64_t now = clock_now();
    int64_t price = s ? ledger_price_at(s, type, now) : -1;
    if (price < 0) {
        http_error(req, ERR_INVALID_QUERY, "gpu_type", "no price for GPU type %.32s", type);
        return;
    }
    /* A schedule of days at hours_per_day is charged day by day: each day's
     * run is its own interval. */
    int64_t one, total;
    int64_t run = per_day >= 0 ? per_day : seconds, times = per_day >= 0 ? days : 1;
    if (money_accrue(price, cards, run, &one) != MONEY_OK || one > INT64_MAX / times) {
        http_error(req, ERR_INVALID_QUERY, "hours", "that estimate is too large");
        return;
    }
    total = one * times;
    json_t *reply = json_pack("{s:s, s:I, s:o, s:o, s:I, s:o, s:o, s:s}", "gpu_type", type, "card_count",
                              (json_int_t)cards, "price_per_card_hour", json_money(price), "run_hours",
                              json_money((int64_t)((__int128)run * MONEY_UNIT / 3600)), "runs", (json_int_t)times,
                              "cost_per_run", json_money(one), "total", json_money(total), "currency",
                              daemon_config->currency);
    if (volume_gb > 0 && estimate_storage(req, s, reply, volume_gb, region, now, per_day >= 0 ? days * 86400 : seconds,
                                          total) < 0) {
        json_decref(reply);
        return;
    }
    http_reply_json(req, 200, reply);
}

struct price_ctx {
    const char *gpu_model;          /* type */
    int64_t effective_at;           /* from */
    int64_t card_hour;              /* price */
    const struct http_request *req; /* the admin's, for admin_actions */
    const char *reason;             /* the admin's reason, "" for none */
    int missing;                    /* out: no such type */
    int64_t billed_until;           /* out: when effective_at was refused, usage is billed up to here */
    int64_t reservation_card_hour;  /* reservation price to set now (0024), or -1 to leave it */
};

/* The price as the API shows it, and as its admin_actions detail. */
static json_t *price_json(const struct price_ctx *ctx)
{
    json_t *j = json_pack("{s:s, s:o, s:o, s:s}", "gpu_type", ctx->gpu_model, "price_per_card_hour",
                          json_money(ctx->card_hour), "effective_at", json_time(ctx->effective_at, 0), "currency",
                          daemon_config->currency);
    if (j && ctx->reservation_card_hour >= 0)
        json_object_set_new(j, "reservation_price_per_card_hour", json_money(ctx->reservation_card_hour));
    return j;
}

static int price_txn(struct store *s, void *vctx)
{
    struct price_ctx *ctx = vctx;
    struct gpu_type t;
    int rc = store_gpu_type_row(s, ctx->gpu_model, &t);
    ctx->missing = rc == STORE_NOT_FOUND;
    if (rc != STORE_OK)
        return rc;
    /* After a clock stepped back, "now" can lie before usage already billed
     * at the old price: a price from then would reprice it. */
    int64_t billed = store_price_billed_until(s, ctx->gpu_model);
    if (billed < 0)
        return (int)billed;
    if (ctx->effective_at < billed) {
        ctx->billed_until = billed;
        return STORE_CONFLICT;
    }
    if ((rc = store_price_insert(s, ctx->gpu_model, ctx->effective_at, ctx->card_hour, clock_now())) != STORE_OK)
        return rc;
    /* The reservation price applies to blocks booked from now on: a block
     * keeps the price it was sold at. */
    if (ctx->reservation_card_hour >= 0 &&
        (rc = store_reservation_price_set(s, ctx->gpu_model, ctx->reservation_card_hour, clock_now())) != STORE_OK)
        return rc;
    json_t *detail = price_json(ctx);
    rc = audit_record(s, ctx->req, "price", ctx->gpu_model, ctx->card_hour, detail, ctx->reason);
    json_decref(detail);
    return rc;
}

void api_prices_put(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"price_per_card_hour", JSON_KIND_STRING, 1, 32                  },
        {"effective_at",        JSON_KIND_STRING, 0, 32                  },
        {"reservation_price_per_card_hour", JSON_KIND_STRING, 0, 32      },
        {"reason",              JSON_KIND_STRING, 0, 4 * AUDIT_REASON_MAX},
        {NULL,                  0,                0, 0                   },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    int64_t now = clock_now();
    struct price_ctx ctx = {.gpu_model = req->params[0], .effective_at = now, .req = req, .reservation_card_hour = -1};
    if (audit_reason(req, body, AUDIT_REASON_MAX, &ctx.reason) < 0) {
        json_decref(body);
        return;
    }
    json_t *rprice = json_object_get(body, "reservation_price_per_card_hour");
    if (rprice && json_money_value(rprice, &ctx.reservation_card_hour) < 0) {
        http_error(req, ERR_INVALID_FIELD, "reservation_price_per_card_hour",
                   "reservation_price_per_card_hour must be an amount like \"2.40\" (up to 6 decimals, no sign)");
        json_decref(body);
        return;
    }
    if (rprice && ctx.reservation_card_hour > daemon_config->max_price_micro) {
        limit_refuse(req, "reservation_price_per_card_hour", ctx.reservation_card_hour, "max_price_per_card_hour",
                     daemon_config->max_price_micro);
        json_decref(body);
        return;
    }
    if (limit_price_body(req, body, "price_per_card_hour", "1.20", "max_price_per_card_hour",
                         daemon_config->max_price_micro, now, &ctx.card_hour, &ctx.effective_at) == 0) {
        struct store *s = store_thread();
        int rc = s ? store_txn(s, price_txn, &ctx) : STORE_ERROR;
        if (ctx.missing)
            http_error(req, ERR_NOT_FOUND, NULL, "no GPU type %.32s", req->params[0]);
        else if (rc == STORE_CONFLICT && ctx.billed_until) {
            json_t *t = json_time(ctx.billed_until, 0);
            http_error(req, ERR_INVALID_FIELD, "effective_at",
                       "prices never change backwards: usage of %.32s is billed up to %s", ctx.gpu_model,
                       json_string_value(t));
            json_decref(t);
        } else if (rc == STORE_BUSY)
            http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        else if (rc != STORE_OK)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        else {
            log_info("prices: %s set %s to %lld micro per card-hour from %lld", req->user_id, ctx.gpu_model,
                     (long long)ctx.card_hour, (long long)ctx.effective_at);
            http_reply_json(req, 200, price_json(&ctx));
        }
    }
    json_decref(body);
}
