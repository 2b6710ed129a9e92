/* api_users.c: admin routes about users: PUT /v1/admin/users/{id}/limits
 * sets a user's card quota, recorded in admin_actions. */
#include "http/api.h"
#include "store/store.h"

struct limits_ctx {
    const char *user_id;            /* whose */
    int64_t max_cards;              /* new quota */
    const struct http_request *req; /* the admin's, for admin_actions */
    const char *reason;             /* the admin's reason, "" for none */
};

static int limits_txn(struct store *s, void *vctx)
{
    struct limits_ctx *ctx = vctx;
    struct user u;
    int rc = store_user_get(s, ctx->user_id, &u);
    if (rc != STORE_OK || (rc = store_user_set_max_cards(s, ctx->user_id, ctx->max_cards)) != STORE_OK)
        return rc;
    json_t *detail = json_pack("{s:I}", "max_cards", (json_int_t)ctx->max_cards);
    rc = audit_record(s, ctx->req, "limits", ctx->user_id, -1, detail, ctx->reason);
    json_decref(detail);
    return rc;
}

void api_users_set_limits(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"max_cards", JSON_KIND_INTEGER, 1, 0                   },
        {"reason",    JSON_KIND_STRING,  0, 4 * AUDIT_REASON_MAX},
        {NULL,        0,                 0, 0                   },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct limits_ctx ctx = {req->params[0], json_integer_value(json_object_get(body, "max_cards")), req, ""};
    /* The reason is read from body, so the body lives until the end. */
    if (audit_reason(req, body, AUDIT_REASON_MAX, &ctx.reason) < 0) {
        json_decref(body);
        return;
    }
    if (ctx.max_cards < 0 || ctx.max_cards > 100000) {
        http_error(req, ERR_INVALID_FIELD, "max_cards", "max_cards must be from 0 to 100000");
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
                        json_pack("{s:s, s:I}", "user_id", ctx.user_id, "max_cards", (json_int_t)ctx.max_cards));
}
