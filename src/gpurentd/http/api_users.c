/* api_users.c: admin routes about users: PUT /v1/admin/users/{id}/limits
 * sets a user's card quota and volume bounds, recorded in admin_actions. */
#include "http/api.h"
#include "store/store.h"

struct limits_ctx {
    const char *user_id;            /* whose */
    int64_t max_cards;              /* new card quota, -1: unchanged */
    int64_t max_volumes;            /* live volumes at once, -1: unchanged */
    int64_t max_volume_gb;          /* GB of them together, -1: unchanged */
    const struct http_request *req; /* the admin's, for admin_actions */
    const char *reason;             /* the admin's reason, "" for none */
    int64_t shown[3];               /* out: the limits in force afterwards */
};

static int limits_txn(struct store *s, void *vctx)
{
    struct limits_ctx *ctx = vctx;
    struct user u;
    int rc = store_user_get(s, ctx->user_id, &u);
    if (rc != STORE_OK)
        return rc;
    if (ctx->max_cards >= 0 && (rc = store_user_set_max_cards(s, ctx->user_id, ctx->max_cards)) != STORE_OK)
        return rc;
    if ((ctx->max_volumes >= 0 || ctx->max_volume_gb >= 0) &&
        (rc = store_user_set_volume_limits(s, ctx->user_id, ctx->max_volumes, ctx->max_volume_gb)) != STORE_OK)
        return rc;
    ctx->shown[0] = store_user_max_cards(s, ctx->user_id, daemon_config->default_max_cards);
    if ((rc = store_user_volume_limits(s, ctx->user_id, daemon_config->default_max_volumes,
                                       daemon_config->default_max_volume_gb, &ctx->shown[1], &ctx->shown[2])) !=
        STORE_OK)
        return rc;
    /* The audit says what this request set, not what it left alone. */
    json_t *detail = json_object();
    if (ctx->max_cards >= 0)
        json_object_set_new(detail, "max_cards", json_integer(ctx->max_cards));
    if (ctx->max_volumes >= 0)
        json_object_set_new(detail, "max_volumes", json_integer(ctx->max_volumes));
    if (ctx->max_volume_gb >= 0)
        json_object_set_new(detail, "max_volume_gb", json_integer(ctx->max_volume_gb));
    rc = audit_record(s, ctx->req, "limits", ctx->user_id, -1, detail, ctx->reason);
    json_decref(detail);
    return rc;
}

/* One optional integer field within [0, max]: -1 when absent; 0 and a
 * reply when out of range. */
static int limit_field(struct http_request *req, const json_t *body, const char *name, int64_t max, int64_t *out)
{
    json_t *v = json_object_get(body, name);
    *out = v ? json_integer_value(v) : -1;
    if (v && (*out < 0 || *out > max)) {
        http_error(req, ERR_INVALID_FIELD, name, "%s must be from 0 to %lld", name, (long long)max);
        return -1;
    }
    return 0;
}

void api_users_set_limits(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"max_cards",     JSON_KIND_INTEGER, 0, 0                   },
        {"max_volumes",   JSON_KIND_INTEGER, 0, 0                   },
        {"max_volume_gb", JSON_KIND_INTEGER, 0, 0                   },
        {"reason",        JSON_KIND_STRING,  0, 4 * AUDIT_REASON_MAX},
        {NULL,            0,                 0, 0                   },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct limits_ctx ctx = {.user_id = req->params[0], .req = req, .reason = ""};
    /* The reason is read from body, so the body lives until the end. */
    if (audit_reason(req, body, AUDIT_REASON_MAX, &ctx.reason) < 0 ||
        limit_field(req, body, "max_cards", 100000, &ctx.max_cards) < 0 ||
        limit_field(req, body, "max_volumes", 100000, &ctx.max_volumes) < 0 ||
        limit_field(req, body, "max_volume_gb", 1000000000, &ctx.max_volume_gb) < 0) {
        json_decref(body);
        return;
    }
    if (ctx.max_cards < 0 && ctx.max_volumes < 0 && ctx.max_volume_gb < 0) {
        http_error(req, ERR_MISSING_FIELD, "max_cards", "give max_cards, max_volumes or max_volume_gb");
        json_decref(body);
        return;
    }
    struct store *s = store_thread();
    int rc = !s ? STORE_ERROR : id_valid("usr", ctx.user_id) ? store_txn(s, limits_txn, &ctx) : STORE_NOT_FOUND;
    json_decref(body);
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no user %.32s", req->params[0]);
    else if (rc == STORE_BUSY)
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else
        http_reply_json(req, 200,
                        json_pack("{s:s, s:I, s:I, s:I}", "user_id", ctx.user_id, "max_cards", (json_int_t)ctx.shown[0],
                                  "max_volumes", (json_int_t)ctx.shown[1], "max_volume_gb", (json_int_t)ctx.shown[2]));
}
