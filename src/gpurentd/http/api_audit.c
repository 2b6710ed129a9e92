/* api_audit.c: who did what with money. GET /v1/admin/audit lists the
 * admin_actions rows, newest first, filtered by action, target or admin and
 * paged; audit_reason and audit_record are how the admin money routes take
 * their optional reason and write their row, inside the transaction of the
 * change it records, so there is never a change without its row or a row
 * without its change. */
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/log.h"
#include "gpurent/utf8.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AUDIT_PAGE_MAX 200

static const char *const actions[] = {"grant",         "topup",   "invite_code", "price", "limits", "billing_run",
                                     "storage_price", "suspend", "reinstate",   NULL};

int audit_reason(struct http_request *req, json_t *body, size_t max_chars, const char **out)
{
    *out = "";
    json_t *v = json_object_get(body, "reason");
    if (!v)
        return 0;
    /* Any text: a grant's reason is a statement line, which may hold quotes
     * and line breaks. (The body parser refuses a NUL in a string.) */
    const char *r = json_string_value(v);
    size_t len = json_string_length(v);
    if (len == 0 || utf8_chars(r, len) > max_chars) {
        http_error(req, ERR_INVALID_FIELD, "reason", "reason must be 1 to %zu characters", max_chars);
        return -1;
    }
    *out = r;
    return 0;
}

int audit_record(struct store *s, const struct http_request *req, const char *action, const char *target,
                 int64_t amount, json_t *detail, const char *reason)
{
    struct admin_action a;
    memset(&a, 0, sizeof a);
    char *text = detail ? json_dumps(detail, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (!text || strlen(text) >= sizeof a.detail || strlen(reason) >= sizeof a.reason) {
        log_error("audit: cannot record %s by %s: %s", action, req->user_id, text ? "detail too long" : "no detail");
        free(text);
        return STORE_ERROR;
    }
    a.at = clock_now();
    a.amount = amount;
    snprintf(a.admin_user_id, sizeof a.admin_user_id, "%s", req->user_id);
    snprintf(a.api_key_id, sizeof a.api_key_id, "%s", req->key_id);
    snprintf(a.action, sizeof a.action, "%s", action);
    snprintf(a.target, sizeof a.target, "%s", target ? target : "");
    snprintf(a.detail, sizeof a.detail, "%s", text);
    snprintf(a.reason, sizeof a.reason, "%s", reason);
    free(text);
    return store_admin_action_insert(s, &a);
}

static json_t *action_json(const struct admin_action *a)
{
    json_t *detail = json_loads(a->detail, 0, NULL);
    return json_pack("{s:I, s:o, s:s, s:s, s:s, s:o, s:o, s:s, s:s, s:o}", "id", (json_int_t)a->id, "at",
                     json_time(a->at, 0), "admin_user_id", a->admin_user_id, "api_key_id", a->api_key_id, "action",
                     a->action, "target", a->target[0] ? json_string(a->target) : json_null(), "amount",
                     a->amount >= 0 ? json_money(a->amount) : json_null(), "currency", daemon_config->currency,
                     "reason", a->reason, "detail", detail ? detail : json_object());
}

void api_audit_list(struct http_request *req)
{
    static const char *const allowed[] = {"action", "target", "admin", "limit", "cursor", NULL};
    struct page pg;
    if (http_query_allow(req, allowed) < 0 || page_begin(req, AUDIT_PAGE_MAX, 50, &pg) < 0)
        return;
    struct admin_action_filter f = {.action = http_query(req, "action"),
                                    .target = http_query(req, "target"),
                                    .admin_user_id = http_query(req, "admin"),
                                    .before_id = pg.after_t >= 0 ? pg.after_t : INT64_MAX};
    int known = !f.action;
    for (size_t i = 0; f.action && actions[i]; i++)
        known |= strcmp(f.action, actions[i]) == 0;
    if (!known) {
        http_error(req, ERR_INVALID_QUERY, "action",
                   "action must be grant, topup, invite_code, price, limits, billing_run, storage_price, suspend or "
                   "reinstate");
        return;
    }
    if (f.target && (!f.target[0] || strlen(f.target) >= sizeof((struct admin_action *)0)->target)) {
        http_error(req, ERR_INVALID_QUERY, "target",
                   "target must be a user id, GPU type or invite code (1 to 63 bytes)");
        return;
    }
    if (f.admin_user_id && !id_valid("usr", f.admin_user_id)) {
        http_error(req, ERR_INVALID_QUERY, "admin", "admin must be a user id like usr_eyka2rnv89q26swphtdr");
        return;
    }
    struct admin_action *rows = malloc(sizeof *rows * (size_t)(pg.limit + 1));
    size_t n = 0;
    struct store *s = store_thread();
    /* One extra row tells whether another page follows. */
    if (!rows || !s || store_admin_actions(s, &f, rows, (size_t)pg.limit + 1, &n) != STORE_OK) {
        free(rows);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    size_t shown = page_shown(&pg, n);
    json_t *data = json_array();
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(data, action_json(&rows[i]));
    json_t *next = n > shown ? page_cursor(rows[shown - 1].id, "a") : json_null();
    free(rows);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}
