/* api_billing.c: POST /v1/admin/billing/run: runs a full billing pass now
 * (every user's usage posted up to now) and waits for it, for operators (and
 * tests on the testing clock) who must not wait for the next period. */
#include "daemon.h"
#include "jsonx.h"

void api_billing_run(struct http_request *req)
{
    static const struct json_field none[] = {{NULL, 0, 0, 0}};
    json_t *body = http_json_body(req, none);
    if (!body)
        return;
    json_decref(body);
    struct billing_summary sum;
    if (billing_run_now(&sum, 30000) < 0) {
        http_error(req, ERR_UNAVAILABLE, NULL, "the billing pass failed or did not finish in time; it will be retried");
        return;
    }
    /* A user whose billing failed was skipped (logged, counted in /metrics):
     * the pass itself served everyone else. */
    http_reply_json(req, 200, json_pack("{s:I, s:I, s:o, s:I}", "users_billed", (json_int_t)sum.users,
                                        "users_failed", (json_int_t)sum.failed, "billed_until", json_time(sum.at, 0),
                                        "duration_ms", (json_int_t)sum.duration_ms));
}
