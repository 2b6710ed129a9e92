/* auth.c: bearer API keys. Finds the key by the id inside the token, then
 * compares the secret's hash in constant time, so neither a wrong secret nor
 * an unknown key tells an attacker anything by timing the database.
 *
 * Keys and their owners are cached per HTTP thread (no lock shared between
 * threads): an entry serves only while store_auth_generation() has not moved
 * since it was read, and that number moves after every committed change to
 * an API key or a user in this process (revocation, revoke-all, password
 * change, suspension), so a revoked key stops working with the next
 * request. Expiry is compared with the clock on every request. An entry is
 * also read again after a second, which bounds how long a change made by
 * another process (the sqlite3 shell) can go unseen. */
#include "gpurent/clock.h"
#include "gpurent/sign.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <pthread.h>
#include <stdint.h>
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

/* Per thread, allocated on a thread's first look-up: enough that the keys
 * of a thousand busy clients rarely evict each other, since every thread
 * sees every client. A miss costs one read of the key with its owner. */
#define KEY_CACHE_SLOTS 1024

struct cached_key {
    uint64_t gen;        /* store_auth_generation() before the read */
    int64_t loaded_ms;   /* monotonic time of the read */
    struct key_auth row; /* the key and its owner's standing */
};

static pthread_key_t key_cache_key;
static pthread_once_t key_cache_once = PTHREAD_ONCE_INIT;

static void key_cache_init(void)
{
    pthread_key_create(&key_cache_key, free);
}

/* The key and its owner, from this thread's cache when still current. */
static int key_lookup(struct store *s, const char *key_id, const struct key_auth **out)
{
    pthread_once(&key_cache_once, key_cache_init);
    struct cached_key *c = thread_slot(key_cache_key, KEY_CACHE_SLOTS, sizeof *c, key_id);
    if (!c)
        return STORE_ERROR;
    int64_t mono = clock_mono_ms();
    uint64_t gen = store_auth_generation();
    *out = &c->row;
    if (c->gen == gen && mono - c->loaded_ms < 1000 && strcmp(c->row.key.id, key_id) == 0)
        return STORE_OK;
    int rc = store_api_key_auth(s, key_id, &c->row);
    if (rc != STORE_OK) {
        c->row.key.id[0] = '\0'; /* nothing valid in the slot */
        return rc;
    }
    c->gen = gen;
    c->loaded_ms = mono;
    return STORE_OK;
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
    const struct key_auth *c;
    int rc = key_lookup(s, key_id, &c);
    if (rc == STORE_NOT_FOUND ||
        (rc == STORE_OK && (!api_key_hash_equal(presented, c->key.secret_hash) || c->key.revoked_at))) {
        http_error(req, ERR_UNAUTHORIZED, NULL, "the API key is unknown or revoked");
        return -1;
    }
    if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return -1;
    }
    if (!c->active) {
        http_error(req, ERR_ACCOUNT_DISABLED, NULL, NULL);
        return -1;
    }
    const struct api_key key = c->key; /* a copy: the slot may be reused by the next look-up on this thread */
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
    memcpy(req->user_id, key.user_id, sizeof req->user_id);
    memcpy(req->key_id, key.id, sizeof req->key_id);
    req->is_admin = c->role == ROLE_ADMIN;
    if (level == AUTH_ADMIN && !req->is_admin) {
        http_error(req, ERR_FORBIDDEN, NULL, "this route needs an admin API key");
        return -1;
    }
    return 0;
}
