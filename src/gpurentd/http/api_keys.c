/* api_keys.c: /v1/api-keys — create (token shown once), list (with last use
 * and expiry), show, revoke one, revoke all. */
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <string.h>

#define KEYS_PAGE_MAX 100

static json_t *key_json(const struct api_key *k)
{
    return json_pack("{s:s, s:s, s:o, s:o, s:o, s:o}", "id", k->id, "name", k->name, "created_at",
                     json_time(k->created_at, 0), "revoked_at", json_time(k->revoked_at, 1), "expires_at",
                     json_time(k->expires_at, 1), "last_used_at", json_time(k->last_used_at, 1));
}

void api_keys_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"name", JSON_KIND_STRING, 0, 128},
        {NULL,   0,                0, 0  },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    const char *name = json_string_value(json_object_get(body, "name"));
    if (!name)
        name = "api";
    char key_id[ID_MAX], token[API_TOKEN_LEN + 1];
    int64_t created_at;
    struct store *s = store_thread();
    int rc = s ? account_key_create(s, req->user_id, name, key_id, token, &created_at) : STORE_ERROR;
    if (rc == ACCOUNT_KEY_LIMIT)
        http_error_ext(req, ERR_QUOTA_EXCEEDED, NULL,
                       json_pack("{s:I}", "limit", (json_int_t)daemon_config->max_api_keys_per_user),
                       "an account may hold at most %lld live API keys (max_api_keys_per_user); revoke one first",
                       (long long)daemon_config->max_api_keys_per_user);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else {
        char location[64];
        snprintf(location, sizeof location, "/v1/api-keys/%s", key_id);
        http_add_header(req, "Location", location);
        http_reply_json(req, 201,
                        json_pack("{s:s, s:s, s:s, s:o, s:n}", "id", key_id, "name", name, "token", token, "created_at",
                                  json_time(created_at, 0), "revoked_at"));
    }
    json_decref(body);
}

void api_keys_list(struct http_request *req)
{
    static const char *const allowed[] = {"limit", "cursor", NULL};
    struct page pg;
    if (http_query_allow(req, allowed) < 0 || page_begin(req, KEYS_PAGE_MAX, 50, &pg) < 0)
        return;
    struct api_key keys[KEYS_PAGE_MAX + 1];
    size_t n;
    struct store *s = store_thread();
    /* One extra row tells whether another page follows. */
    if (!s ||
        store_api_key_list(s, req->user_id, pg.after_t, pg.after_id, keys, (size_t)pg.limit + 1, &n) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *data = json_array();
    size_t shown = page_shown(&pg, n);
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(data, key_json(&keys[i]));
    json_t *next = n > shown ? page_cursor(keys[shown - 1].created_at, keys[shown - 1].id) : json_null();
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

/* Loads the caller's key named by the path; replies 404 for a missing key
 * and for anyone else's, so ids cannot be probed. */
static int load_own_key(struct http_request *req, struct store *s, struct api_key *k)
{
    int rc = id_valid("key", req->params[0]) ? store_api_key_get(s, req->params[0], k) : STORE_NOT_FOUND;
    if (rc == STORE_OK && strcmp(k->user_id, req->user_id) != 0)
        rc = STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no API key %.64s", req->params[0]);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    return rc;
}

void api_keys_get(struct http_request *req)
{
    struct store *s = store_thread();
    struct api_key k;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (load_own_key(req, s, &k) == STORE_OK)
        http_reply_json(req, 200, key_json(&k));
}

struct revoke_ctx {
    const char *user_id, *key_id; /* whose and which */
    int64_t now;                  /* revocation time */
};

static int revoke_txn(struct store *s, void *vctx)
{
    struct revoke_ctx *ctx = vctx;
    return store_api_key_revoke(s, ctx->user_id, ctx->key_id, ctx->now);
}

void api_keys_revoke(struct http_request *req)
{
    struct store *s = store_thread();
    struct api_key k;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (load_own_key(req, s, &k) != STORE_OK)
        return;
    struct revoke_ctx ctx = {req->user_id, k.id, clock_now()};
    if (store_txn(s, revoke_txn, &ctx) != STORE_OK || store_api_key_get(s, k.id, &k) != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else
        http_reply_json(req, 200, key_json(&k));
}

struct revoke_all_ctx {
    const char *user_id;
    const char *except_id; /* the calling key, or NULL */
    int64_t now;
    int64_t revoked;
};

static int revoke_all_txn(struct store *s, void *vctx)
{
    struct revoke_all_ctx *ctx = vctx;
    return store_api_keys_revoke_all(s, ctx->user_id, ctx->except_id, 0, ctx->now, &ctx->revoked);
}

/* DELETE /v1/api-keys: every key of the account at once (a leaked laptop,
 * a departed colleague), by default but the one making the call
 * (?keep_current=false: that one too). */
void api_keys_revoke_all(struct http_request *req)
{
    static const char *const allowed[] = {"keep_current", NULL};
    if (http_query_allow(req, allowed) < 0)
        return;
    const char *keep = http_query(req, "keep_current");
    if (keep && strcmp(keep, "true") != 0 && strcmp(keep, "false") != 0) {
        http_error(req, ERR_INVALID_QUERY, "keep_current", "keep_current must be true or false");
        return;
    }
    struct revoke_all_ctx ctx = {.user_id = req->user_id,
                                 .except_id = !keep || strcmp(keep, "true") == 0 ? req->key_id : NULL,
                                 .now = clock_now()};
    struct store *s = store_thread();
    if (!s || store_txn(s, revoke_all_txn, &ctx) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    log_info("api-keys: %s revoked %lld keys%s", req->user_id, (long long)ctx.revoked,
             ctx.except_id ? " (all but the calling one)" : "");
    http_reply_json(req, 200,
                    json_pack("{s:I, s:b}", "revoked", (json_int_t)ctx.revoked, "kept_current", ctx.except_id != NULL));
}
