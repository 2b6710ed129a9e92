/* auth.c: bearer API keys. Finds the key by the id inside the token, then
 * compares the secret's hash in constant time, so neither a wrong secret nor
 * an unknown key tells an attacker anything by timing the database. */
#include "gpurent/clock.h"
#include "gpurent/sign.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

struct touch {
    const char *key_id;
    int64_t now;
};

static int touch_txn(struct store *s, void *vctx)
{
    const struct touch *t = vctx;
    return store_api_key_touch(s, t->key_id, t->now);
}

void auth_request_done(const struct http_request *req, int64_t duration_us)
{
    metrics_http_done(req, duration_us);
    if (!req->key_use_due || !req->replied || req->status >= 400)
        return;
    struct store *s = store_thread();
    if (s)
        store_txn(s, touch_txn, &(struct touch){req->key_id, clock_now()});
}

/* The gateways' internal API (issue 17): signed with gateway_secret_file's
 * key as gpurentd signs agent calls (gpurent/sign.h), fresh by the wall
 * clock, each nonce once. */
static struct replay_cache *gateway_replay;
static pthread_once_t gateway_replay_once = PTHREAD_ONCE_INIT;

static void gateway_replay_init(void)
{
    gateway_replay = replay_cache_new(SIGN_DEFAULT_SKEW_S, 200000);
}

static int gateway_authenticate(struct http_request *req)
{
    pthread_once(&gateway_replay_once, gateway_replay_init);
    const char *secret = daemon_config->gateway_secret[0] ? daemon_config->gateway_secret : NULL;
    enum sign_result r = sign_verify(secret, req->method, req->path, http_header(req, SIGN_HDR_TIMESTAMP),
                                     http_header(req, SIGN_HDR_NONCE), http_header(req, SIGN_HDR_SIGNATURE), req->body,
                                     req->body_len, clock_wall(), SIGN_DEFAULT_SKEW_S, gateway_replay);
    if (r == SIGN_OK)
        return 0;
    if (r == SIGN_UNAVAILABLE) {
        http_add_header(req, "Retry-After", "1");
        http_error(req, ERR_UNAVAILABLE, NULL, "%s", sign_result_message(r));
        return -1;
    }
    log_info("gateway: refused %s %s from %s: %s", req->method, req->path, req->client_ip,
             secret ? sign_result_message(r) : "no gateway_secret_file is set");
    http_add_header(req, "WWW-Authenticate", "Gpurent-HMAC-SHA256");
    http_error(req, ERR_BAD_SIGNATURE, NULL, "%s", secret ? sign_result_message(r) : "gateways are not enabled");
    return -1;
}

int auth_authenticate(struct http_request *req, enum http_auth level)
{
    if (level == AUTH_SIGNED)
        return gateway_authenticate(req);
    const char *h = http_header(req, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) {
        http_error(req, ERR_UNAUTHORIZED, NULL, NULL);
        return -1;
    }
    const char *token = h + 7;
    while (*token == ' ')
        token++;
    /* A header value ends without blanks (RFC 9110), but libmicrohttpd
     * leaves trailing ones in place; they are not part of the token. */
    size_t n = strlen(token);
    while (n > 0 && (token[n - 1] == ' ' || token[n - 1] == '\t'))
        n--;
    char trimmed[API_TOKEN_LEN + 2]; /* a spare byte keeps a longer token too long */
    snprintf(trimmed, sizeof trimmed, "%.*s", (int)n, token);
    char key_id[ID_MAX];
    unsigned char presented[API_SECRET_HASH_LEN];
    if (api_key_parse(trimmed, key_id, presented) < 0) {
        http_error(req, ERR_UNAUTHORIZED, NULL, "the API key is malformed");
        return -1;
    }
    struct store *s = store_thread();
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, "the database is not available");
        return -1;
    }
    struct api_key key;
    struct user user;
    int rc = store_api_key_get(s, key_id, &key);
    if (rc == STORE_NOT_FOUND ||
        (rc == STORE_OK && (!api_key_hash_equal(presented, key.secret_hash) || key.revoked_at))) {
        http_error(req, ERR_UNAUTHORIZED, NULL, "the API key is unknown or revoked");
        return -1;
    }
    if (rc != STORE_OK || store_user_get(s, key.user_id, &user) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return -1;
    }
    if (!user.active) {
        http_error(req, ERR_ACCOUNT_DISABLED, NULL, NULL);
        return -1;
    }
    int64_t now = clock_now();
    if (key.expires_at && now >= key.expires_at) {
        json_t *at = json_time(key.expires_at, 0);
        http_error(req, ERR_UNAUTHORIZED, NULL, "the API key expired at %s; log in again (POST /v1/login)",
                   json_string_value(at));
        json_decref(at);
        return -1;
    }
    /* Last use, to the minute: noted once the request succeeded (a refused
     * one changes nothing), at most one small write a minute per key. */
    req->key_use_due = now - key.last_used_at >= 60;
    memcpy(req->user_id, user.id, sizeof req->user_id);
    memcpy(req->key_id, key.id, sizeof req->key_id);
    req->is_admin = user.role == ROLE_ADMIN;
    if (level == AUTH_ADMIN && !req->is_admin) {
        http_error(req, ERR_FORBIDDEN, NULL, "this route needs an admin API key");
        return -1;
    }
    return 0;
}
