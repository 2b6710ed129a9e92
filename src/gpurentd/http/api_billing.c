/* api_billing.c: POST /v1/admin/billing/run: runs a full billing pass now
 * (every user's usage posted up to now) and waits for it, for operators (and
 * tests on the testing clock) who must not wait for the next period. The
 * run is recorded in admin_actions, with the optional reason of its body,
 * just before it is asked for. */
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

struct run_ctx {
    const struct http_request *req; /* the admin's */
    const char *reason;             /* the admin's reason, "" for none */
};

/* The pass runs on the billing thread, in transactions of its own, so the
 * record has its own transaction, committed before the pass is asked for:
 * every pass an admin asked for has its row, even one that then fails. */
static int run_txn(struct store *s, void *vctx)
{
    struct run_ctx *ctx = vctx;
    json_t *detail = json_object();
    int rc = audit_record(s, ctx->req, "billing_run", NULL, -1, detail, ctx->reason);
    json_decref(detail);
    return rc;
}

void api_billing_run(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"reason", JSON_KIND_STRING, 0, 4 * AUDIT_REASON_MAX},
        {NULL,     0,                0, 0                   },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct run_ctx ctx = {.req = req};
    if (audit_reason(req, body, AUDIT_REASON_MAX, &ctx.reason) < 0) {
        json_decref(body);
        return;
    }
    struct store *s = store_thread();
    int rc = s ? store_txn(s, run_txn, &ctx) : STORE_ERROR;
    json_decref(body);
    if (rc != STORE_OK) {
        http_error(req, rc == STORE_BUSY ? ERR_UNAVAILABLE : ERR_INTERNAL, NULL, NULL);
        return;
    }
    struct billing_summary sum;
    if (billing_run_now(&sum, 30000) < 0) {
        http_error(req, ERR_UNAVAILABLE, NULL, "the billing pass failed or did not finish in time; it will be retried");
        return;
    }
    /* A user whose billing failed was skipped (logged, counted in /metrics):
     * the pass itself served everyone else. */
    http_reply_json(req, 200,
                    json_pack("{s:I, s:I, s:o, s:I}", "users_billed", (json_int_t)sum.users, "users_failed",
                              (json_int_t)sum.failed, "billed_until", json_time(sum.at, 0), "duration_ms",
                              (json_int_t)sum.duration_ms));
}
