/* api_storage_prices.c: storage prices per GB-month (a month is 30 days,
 * 2 592 000 s): GET /v1/storage-prices (history, public) and the admin's
 * PUT /v1/admin/storage-prices/{region} ("global" for the price of every
 * region without its own; at most max_price_per_gb_month; recorded in
 * admin_actions). A price applies from its effective time on, never
 * backwards, as card prices do. */
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "http/api.h"
#include "store/store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STORAGE_PRICES_MAX 1000
#define GLOBAL_REGION "global"

int storage_region_valid(const char *region)
{
    size_t n = strlen(region);
    if (n == 0 || n > 63 || !isalnum((unsigned char)region[0]) || strcmp(region, GLOBAL_REGION) == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)region[i];
        if (!(isalnum(c) || c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

/* The API's name of a stored region: "" is "global". */
static const char *region_name(const char *stored)
{
    return stored[0] ? stored : GLOBAL_REGION;
}

void api_storage_prices_list(struct http_request *req)
{
    static const char *const allowed[] = {"region", NULL};
    if (http_query_allow(req, allowed) < 0)
        return;
    const char *q = http_query(req, "region");
    if (q && strcmp(q, GLOBAL_REGION) != 0 && !storage_region_valid(q)) {
        http_error(req, ERR_INVALID_QUERY, "region", "region must be global or letters, digits, '.', '_' or '-'");
        return;
    }
    const char *region = q && strcmp(q, GLOBAL_REGION) == 0 ? "" : q;
    struct storage_price_row *rows = malloc(sizeof *rows * STORAGE_PRICES_MAX);
    size_t n = 0;
    struct store *s = store_thread();
    if (!rows || !s || store_storage_price_history(s, region, rows, STORAGE_PRICES_MAX, &n) != STORE_OK) {
        free(rows);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(data, json_pack("{s:s, s:o, s:o, s:s, s:o}", "region", region_name(rows[i].region),
                                              "price_per_gb_month", json_money(rows[i].gb_month), "effective_at",
                                              json_time(rows[i].effective_at, 0), "currency", daemon_config->currency,
                                              "set_at", json_time(rows[i].created_at, 0)));
    free(rows);
    http_reply_json(req, 200, json_pack("{s:o}", "data", data));
}

struct storage_price_ctx {
    const char *region;             /* stored name: "" global */
    int64_t effective_at;           /* from */
    int64_t gb_month;               /* price */
    const struct http_request *req; /* the admin's, for admin_actions */
    const char *reason;             /* the admin's reason, "" for none */
    int64_t billed_until;           /* out: when effective_at was refused, storage is billed up to here */
};

static json_t *storage_price_json(const struct storage_price_ctx *ctx)
{
    return json_pack("{s:s, s:o, s:o, s:s}", "region", region_name(ctx->region), "price_per_gb_month",
                     json_money(ctx->gb_month), "effective_at", json_time(ctx->effective_at, 0), "currency",
                     daemon_config->currency);
}

static int storage_price_txn(struct store *s, void *vctx)
{
    struct storage_price_ctx *ctx = vctx;
    /* After a clock stepped back, "now" can lie before storage already
     * charged at the old price: a price from then would reprice it. */
    int64_t billed = store_storage_billed_until(s, ctx->region);
    if (billed < 0)
        return (int)billed;
    if (ctx->effective_at < billed) {
        ctx->billed_until = billed;
        return STORE_CONFLICT;
    }
    int rc = store_storage_price_insert(s, ctx->region, ctx->effective_at, ctx->gb_month, clock_now());
    if (rc != STORE_OK)
        return rc;
    json_t *detail = storage_price_json(ctx);
    rc = audit_record(s, ctx->req, "storage_price", region_name(ctx->region), ctx->gb_month, detail, ctx->reason);
    json_decref(detail);
    return rc;
}

void api_storage_prices_put(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"price_per_gb_month", JSON_KIND_STRING, 1, 32                  },
        {"effective_at",       JSON_KIND_STRING, 0, 32                  },
        {"reason",             JSON_KIND_STRING, 0, 4 * AUDIT_REASON_MAX},
        {NULL,                 0,                0, 0                   },
    };
    const char *path = req->params[0];
    int global = strcmp(path, GLOBAL_REGION) == 0;
    if (!global && !storage_region_valid(path)) {
        http_error(req, ERR_NOT_FOUND, NULL,
                   "storage prices are per region (letters, digits, '.', '_' or '-', up to 63) or global");
        return;
    }
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    int64_t now = clock_now();
    struct storage_price_ctx ctx = {.region = global ? "" : path, .effective_at = now, .req = req};
    if (audit_reason(req, body, AUDIT_REASON_MAX, &ctx.reason) < 0) {
        json_decref(body);
        return;
    }
    if (limit_price_body(req, body, "price_per_gb_month", "0.30", "max_price_per_gb_month",
                         daemon_config->max_storage_price_micro, now, &ctx.gb_month, &ctx.effective_at) == 0) {
        struct store *s = store_thread();
        int rc = s ? store_txn(s, storage_price_txn, &ctx) : STORE_ERROR;
        if (rc == STORE_CONFLICT && ctx.billed_until) {
            json_t *t = json_time(ctx.billed_until, 0);
            http_error(req, ERR_INVALID_FIELD, "effective_at",
                       "prices never change backwards: storage in %s is billed up to %s", region_name(ctx.region),
                       json_string_value(t));
            json_decref(t);
        } else if (rc == STORE_BUSY)
            http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        else if (rc != STORE_OK)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        else {
            log_info("storage prices: %s set %s to %lld micro per GB-month from %lld", req->user_id,
                     region_name(ctx.region), (long long)ctx.gb_month, (long long)ctx.effective_at);
            http_reply_json(req, 200, storage_price_json(&ctx));
        }
    }
    json_decref(body);
}
