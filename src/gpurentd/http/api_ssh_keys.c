/* api_ssh_keys.c: /v1/ssh-keys — the caller's OpenSSH public keys: add
 * (parsed and fingerprinted, never pattern-matched), list, show, delete.
 * A change reaches the caller's live instances at once: the same
 * transaction gives each of them its keys again, and the reconciler sends
 * them to their agents (a key deleted stops logging in, and its open
 * sessions end; a key added logs in, without a restart). */
#include "domain/ssh_keys.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "loops/loops.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SSH_KEYS_PAGE_MAX 100
#define SSH_KEY_NAME_MAX 64

static json_t *ssh_key_json(const struct ssh_key *k)
{
    char line[sizeof k->type + sizeof k->blob + sizeof k->comment + 2];
    snprintf(line, sizeof line, "%s %s%s%s", k->type, k->blob, k->comment[0] ? " " : "", k->comment);
    return json_pack("{s:s, s:s, s:s, s:I, s:s, s:s, s:o}", "id", k->id, "name", k->name, "type", k->type, "bits",
                     (json_int_t)k->bits, "fingerprint", k->fingerprint, "public_key", line, "created_at",
                     json_time(k->created_at, 0));
}

/* Names are labels: 1..64 bytes, no control characters. */
static int name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > SSH_KEY_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return 0;
    return 1;
}

struct create_ctx {
    struct ssh_key k;        /* the key to add */
    int64_t limit;           /* max_ssh_keys_per_user */
    struct ssh_key existing; /* out: the twin, on STORE_CONFLICT */
    int over_limit;          /* out: refused for the count */
};

static int create_txn(struct store *s, void *vctx)
{
    struct create_ctx *ctx = vctx;
    ctx->over_limit = 0;
    int rc = store_ssh_key_by_fingerprint(s, ctx->k.user_id, ctx->k.fingerprint, &ctx->existing);
    if (rc == STORE_OK)
        return STORE_CONFLICT;
    if (rc != STORE_NOT_FOUND)
        return rc;
    int64_t count = store_ssh_key_count(s, ctx->k.user_id);
    if (count < 0)
        return (int)count;
    if (count >= ctx->limit) {
        ctx->over_limit = 1;
        return STORE_CONFLICT;
    }
    if ((rc = store_ssh_key_insert(s, &ctx->k)) != STORE_OK)
        return rc;
    return store_user_ssh_resnapshot(s, ctx->k.user_id);
}

void api_ssh_keys_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"name",       JSON_KIND_STRING, 1, SSH_KEY_NAME_MAX},
        {"public_key", JSON_KIND_STRING, 1, SSH_KEY_LINE_MAX},
        {NULL,         0,                0, 0               },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    const char *name = json_string_value(json_object_get(body, "name"));
    const char *line = json_string_value(json_object_get(body, "public_key"));
    static _Thread_local struct create_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    struct ssh_pubkey pk;
    char why[256];
    if (!name_valid(name)) {
        http_error(req, ERR_INVALID_FIELD, "name", "name must be 1 to %d bytes without control characters",
                   SSH_KEY_NAME_MAX);
    } else if (ssh_key_parse(line, &pk, why, sizeof why) < 0) {
        http_error(req, ERR_INVALID_FIELD, "public_key", "%s", why);
    } else if (pk.base64_len >= sizeof ctx.k.blob || id_new("sshk", ctx.k.id) < 0) {
        /* The parser caps RSA at 16384 bits, whose blob fits. */
        http_error(req, ERR_INTERNAL, NULL, NULL);
    } else {
        snprintf(ctx.k.user_id, sizeof ctx.k.user_id, "%s", req->user_id);
        snprintf(ctx.k.name, sizeof ctx.k.name, "%s", name);
        snprintf(ctx.k.type, sizeof ctx.k.type, "%s", pk.type);
        ctx.k.bits = pk.bits;
        snprintf(ctx.k.blob, sizeof ctx.k.blob, "%.*s", (int)pk.base64_len, pk.base64);
        snprintf(ctx.k.comment, sizeof ctx.k.comment, "%.*s", (int)pk.comment_len, pk.comment);
        snprintf(ctx.k.fingerprint, sizeof ctx.k.fingerprint, "%s", pk.fingerprint);
        ctx.k.created_at = clock_now();
        ctx.limit = daemon_config->max_ssh_keys_per_user;
        struct store *s = store_thread();
        int rc = s ? store_txn(s, create_txn, &ctx) : STORE_ERROR;
        if (rc == STORE_OK) {
            log_info("ssh-keys: %s added %s (%s %s)", req->user_id, ctx.k.id, ctx.k.type, ctx.k.fingerprint);
            reconciler_push_ssh_keys(req->user_id);
            char location[64];
            snprintf(location, sizeof location, "/v1/ssh-keys/%s", ctx.k.id);
            http_add_header(req, "Location", location);
            http_reply_json(req, 201, ssh_key_json(&ctx.k));
        } else if (rc == STORE_CONFLICT && ctx.over_limit) {
            http_error_ext(req, ERR_SSH_KEY_LIMIT, NULL, json_pack("{s:I}", "limit", (json_int_t)ctx.limit),
                           "an account may hold at most %lld SSH keys (max_ssh_keys_per_user); delete one first",
                           (long long)ctx.limit);
        } else if (rc == STORE_CONFLICT) {
            http_error_ext(req, ERR_SSH_KEY_EXISTS, "public_key", json_pack("{s:s}", "id", ctx.existing.id),
                           "this key (%s) is already on your account as %s (\"%s\")", ctx.k.fingerprint,
                           ctx.existing.id, ctx.existing.name);
        } else {
            http_error(req, ERR_INTERNAL, NULL, NULL);
        }
    }
    json_decref(body);
}

void api_ssh_keys_list(struct http_request *req)
{
    static const char *const allowed[] = {"limit", "cursor", NULL};
    struct page pg;
    if (http_query_allow(req, allowed) < 0 || page_begin(req, SSH_KEYS_PAGE_MAX, 50, &pg) < 0)
        return;
    struct ssh_key *keys;
    size_t n;
    struct store *s = store_thread();
    /* One extra row tells whether another page follows. */
    if (!s ||
        store_ssh_key_list(s, req->user_id, pg.after_t, pg.after_id, (size_t)pg.limit + 1, &keys, &n) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *data = json_array();
    size_t shown = page_shown(&pg, n);
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(data, ssh_key_json(&keys[i]));
    json_t *next = n > shown ? page_cursor(keys[shown - 1].created_at, keys[shown - 1].id) : json_null();
    free(keys);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

/* Loads the caller's key named by the path; replies 404 for a missing key
 * and for anyone else's, so ids cannot be probed. */
static int load_own_key(struct http_request *req, struct store *s, struct ssh_key *k)
{
    int rc = id_valid("sshk", req->params[0]) ? store_ssh_key_get(s, req->user_id, req->params[0], k) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no SSH key %.64s", req->params[0]);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    return rc;
}

void api_ssh_keys_get(struct http_request *req)
{
    struct store *s = store_thread();
    static _Thread_local struct ssh_key k;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (load_own_key(req, s, &k) == STORE_OK)
        http_reply_json(req, 200, ssh_key_json(&k));
}

struct delete_ctx {
    const char *user_id, *key_id; /* whose and which */
};

static int delete_txn(struct store *s, void *vctx)
{
    struct delete_ctx *ctx = vctx;
    int rc = store_ssh_key_delete(s, ctx->user_id, ctx->key_id);
    return rc != STORE_OK ? rc : store_user_ssh_resnapshot(s, ctx->user_id);
}

void api_ssh_keys_delete(struct http_request *req)
{
    struct store *s = store_thread();
    static _Thread_local struct ssh_key k;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (load_own_key(req, s, &k) != STORE_OK)
        return;
    struct delete_ctx ctx = {req->user_id, k.id};
    int rc = store_txn(s, delete_txn, &ctx);
    if (rc == STORE_NOT_FOUND) {
        http_error(req, ERR_NOT_FOUND, NULL, "no SSH key %.64s", k.id);
    } else if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
    } else {
        log_info("ssh-keys: %s deleted %s (%s)", req->user_id, k.id, k.fingerprint);
        reconciler_push_ssh_keys(req->user_id);
        http_reply_json(req, 204, NULL);
    }
}
