/* auth.c: bearer API keys. Finds the key by the id inside the token, then
 * compares the secret's hash in constant time, so neither a wrong secret nor
 * an unknown key tells an attacker anything by timing the database.
 *
 * Keys and their owners are cached per HTTP thread (no lock shared between
 * threads): an entry serves only while store_auth_generation() has not moved
 * since it was read, and that number moves after every committed change of
 * this process to whether a key authenticates (revocation, revoke-all,
 * password change, suspension, role; migration 0042), so a revoked key
 * stops working with the next request. Expiry is compared with the clock on
 * every request. A change made by another process (the sqlite3 shell)
 * shows in the database's auth_generation row, which one thread reads at
 * least once a second (outside_generation). A key's use is noted (at most
 * once a minute, touched_recently) without dropping any entry. */
#include "gpurent/clock.h"
#include "gpurent/sign.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* When each key's use was last noted by this process, shared by the
 * threads without a lock: a cached row keeps the last_used_at it was read
 * with, so without this every request a minute after that would note the
 * use again. A slot holds 24 bits of the id's hash and 40 of the time; a
 * collision only notes a use once more. */
#define TOUCH_SLOTS 4096
static _Atomic uint64_t touched[TOUCH_SLOTS];

static int touched_recently(const char *key_id, int64_t now)
{
    uint32_t h = id_hash(key_id);
    uint64_t v = atomic_load_explicit(&touched[h % TOUCH_SLOTS], memory_order_relaxed);
    int64_t at = (int64_t)(v & ((UINT64_C(1) << 40) - 1));
    return (v >> 40) == (h & 0xffffff) && now >= at && now - at < 60;
}

static void note_touched(const char *key_id, int64_t now)
{
    uint32_t h = id_hash(key_id);
    uint64_t v = (uint64_t)(h & 0xffffff) << 40 | ((uint64_t)now & ((UINT64_C(1) << 40) - 1));
    atomic_store_explicit(&touched[h % TOUCH_SLOTS], v, memory_order_relaxed);
}

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
    int64_t now = clock_now();
    if (s && !touched_recently(req->key_id, now) &&
        store_txn(s, touch_txn, &(struct touch){req->key_id, now}) == STORE_OK)
        note_touched(req->key_id, now);
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

/* Per thread, allocated on a thread's first look-up, since every thread
 * sees every client: sets of two slots, so that two busy keys whose ids
 * hash alike do not evict each other on every request (direct-mapped, a
 * few hundred keys in use already missed a third of the time), the one
 * less recently used making room. A miss costs one read of the key with its
 * owner. About 300 KiB a thread. */
#define KEY_CACHE_SLOTS 2048
#define KEY_CACHE_WAYS 2

/* What authenticating a request needs of a key and its owner. */
struct cached_key {
    uint64_t gen;     /* store_auth_generation() before the read */
    uint64_t outside; /* outside_generation() before the read */
    uint64_t used;    /* this thread's look-ups when it last served one */
    char id[ID_MAX];  /* "": an empty slot */
    char user_id[ID_MAX];
    unsigned char secret_hash[API_SECRET_HASH_LEN];
    int64_t revoked_at, expires_at, last_used_at; /* as in struct api_key */
    enum user_role role;
    int active; /* the owner is not suspended */
};

/* Other processes' changes move the database's auth_generation row but not
 * store_auth_generation(): the first thread to look once a second has
 * passed reads the row, and a new number drops every thread's entries
 * (this process's own changes, seen there too, drop them once more). */
static _Atomic int64_t outside_checked_ms, outside_row = -1;
static _Atomic uint64_t outside_moves;

static uint64_t outside_generation(struct store *s, int64_t mono)
{
    int64_t last = atomic_load(&outside_checked_ms);
    if (mono - last >= 1000 && atomic_compare_exchange_strong(&outside_checked_ms, &last, mono)) {
        int64_t row;
        if (store_auth_generation_db(s, &row) == STORE_OK && atomic_exchange(&outside_row, row) != row)
            atomic_fetch_add(&outside_moves, 1);
    }
    return atomic_load(&outside_moves);
}

static pthread_key_t key_cache_key;
static pthread_once_t key_cache_once = PTHREAD_ONCE_INIT;

static void key_cache_init(void)
{
    pthread_key_create(&key_cache_key, free);
}

/* The key and its owner into *out, from this thread's cache when still
 * current. */
static int key_lookup(struct store *s, const char *key_id, struct cached_key *out)
{
    static _Thread_local uint64_t lookups;
    pthread_once(&key_cache_once, key_cache_init);
    struct cached_key *set = thread_slot(key_cache_key, KEY_CACHE_SLOTS, KEY_CACHE_WAYS, sizeof *set, key_id);
    if (!set)
        return STORE_ERROR;
    struct cached_key *c = &set[0];
    for (int i = 0; i < KEY_CACHE_WAYS; i++) {
        if (strcmp(set[i].id, key_id) == 0) {
            c = &set[i];
            break;
        }
        if (set[i].used < c->used)
            c = &set[i];
    }
    uint64_t gen = store_auth_generation(), outside = outside_generation(s, clock_mono_ms());
    if (c->gen != gen || c->outside != outside || strcmp(c->id, key_id) != 0) {
        struct key_auth row;
        int rc = store_api_key_auth(s, key_id, &row);
        if (rc != STORE_OK) {
            /* The slot held this key: nothing valid in it now. Another
             * key's stays, so unknown ids sprayed at the API evict none. */
            if (strcmp(c->id, key_id) == 0) {
                c->id[0] = '\0';
                c->used = 0;
            }
            return rc;
        }
        *c = (struct cached_key){.gen = gen,
                                 .outside = outside,
                                 .revoked_at = row.key.revoked_at,
                                 .expires_at = row.key.expires_at,
                                 .last_used_at = row.key.last_used_at,
                                 .role = row.role,
                                 .active = row.active};
        memcpy(c->id, row.key.id, sizeof c->id);
        memcpy(c->user_id, row.key.user_id, sizeof c->user_id);
        memcpy(c->secret_hash, row.key.secret_hash, sizeof c->secret_hash);
    }
    c->used = ++lookups;
    *out = *c;
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
    struct cached_key key;
    int rc = key_lookup(s, key_id, &key);
    if (rc == STORE_NOT_FOUND ||
        (rc == STORE_OK && (!api_key_hash_equal(presented, key.secret_hash) || key.revoked_at))) {
        http_error(req, ERR_UNAUTHORIZED, NULL, "the API key is unknown or revoked");
        return -1;
    }
    if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return -1;
    }
    if (!key.active) {
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
    memcpy(req->user_id, key.user_id, sizeof req->user_id);
    memcpy(req->key_id, key.id, sizeof req->key_id);
    req->is_admin = key.role == ROLE_ADMIN;
    if (level == AUTH_ADMIN && !req->is_admin) {
        http_error(req, ERR_FORBIDDEN, NULL, "this route needs an admin API key");
        return -1;
    }
    return 0;
}
