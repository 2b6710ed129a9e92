/* sign.c: HMAC-SHA256 request signing between gpurentd and its node agents,
 * and the agent's replay cache of recently seen nonces (see sign.h). */
#include "gpurent/sign.h"
#include "gpurent/secrets.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#define METHOD_MAX     16
#define TARGET_MAX     8192 /* longer than any URL the agent API has */
#define SECRET_MAX     1024 /* only bounds the work; real secrets are 64 bytes */
#define TIMESTAMP_MAX  19   /* digits in INT64_MAX */
#define NONCE_BYTES    16
#define MAC_BYTES      32
#define SECRET_BYTES   32

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Decodes exactly 2 * n lowercase hex digits. Uppercase is refused so that a
 * value has one spelling only, like everything else that gets signed. */
static int hex_decode_exact(const char *s, unsigned char *out, size_t n)
{
    if (strnlen(s, 2 * n + 1) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

/* Digits only, no sign, no leading zero, no overflow: one string per value,
 * and nothing strtoll would quietly accept (spaces, '+', "0x"). */
static int parse_timestamp(const char *s, int64_t *out)
{
    size_t len = strnlen(s, TIMESTAMP_MAX + 1);
    int64_t v = 0;

    if (len == 0 || len > TIMESTAMP_MAX || (s[0] == '0' && len > 1))
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        int d = s[i] - '0';
        if (v > (INT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* Method and path may hold no newline, or a request could be re-read with
 * its canonical lines shifted; the stricter rules below also imply that. */
static bool valid_method(const char *m)
{
    size_t len;

    if (!m)
        return false;
    len = strnlen(m, METHOD_MAX + 1);
    if (len == 0 || len > METHOD_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (m[i] < 'A' || m[i] > 'Z')
            return false;
    return true;
}

static bool valid_path(const char *p)
{
    size_t len;

    if (!p || p[0] != '/')
        return false;
    len = strnlen(p, TARGET_MAX + 1);
    if (len > TARGET_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (p[i] <= ' ' || p[i] > '~') /* on the wire a target is printable ASCII */
            return false;
    return true;
}

static bool valid_secret(const char *secret)
{
    size_t len;

    if (!secret)
        return false;
    len = strnlen(secret, SECRET_MAX + 1);
    return len > 0 && len <= SECRET_MAX;
}

/* Computes the MAC of the canonical string; arguments are already validated. */
static int compute_mac(const char *secret, const char *method, const char *path,
                       const char *timestamp, const char *nonce,
                       const void *body, size_t body_len, unsigned char mac[MAC_BYTES])
{
    char body_hex[2 * MAC_BYTES + 1];
    unsigned int mac_len = 0;
    char *canon = NULL;
    size_t cap;
    int n, rv = -1;

    sha256_hex(body, body_len, body_hex);

    cap = strlen(method) + strlen(path) + strlen(timestamp) + strlen(nonce) + sizeof body_hex + 4;
    canon = malloc(cap);
    if (!canon)
        return -1;
    n = snprintf(canon, cap, "%s\n%s\n%s\n%s\n%s", method, path, timestamp, nonce, body_hex);
    if (n < 0 || (size_t)n >= cap)
        goto out;
    if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), (const unsigned char *)canon,
              (size_t)n, mac, &mac_len) || mac_len != MAC_BYTES)
        goto out;
    rv = 0;
out:
    free(canon);
    return rv;
}

int sign_request(const char *secret, const char *method, const char *path, int64_t now,
                 const void *body, size_t body_len, struct sign_headers *h)
{
    unsigned char nonce[NONCE_BYTES], mac[MAC_BYTES];

    if (!h)
        return -1;
    memset(h, 0, sizeof *h);
    if (!valid_secret(secret) || !valid_method(method) || !valid_path(path) || now < 0
        || (!body && body_len > 0))
        return -1;
    snprintf(h->timestamp, sizeof h->timestamp, "%" PRId64, now);
    if (RAND_bytes(nonce, sizeof nonce) != 1)
        goto fail;
    hex_encode(nonce, sizeof nonce, h->nonce);
    if (compute_mac(secret, method, path, h->timestamp, h->nonce, body, body_len, mac) < 0)
        goto fail;
    hex_encode(mac, sizeof mac, h->signature);
    return 0;
fail:
    memset(h, 0, sizeof *h);
    return -1;
}

/* Replay cache: an open-addressing hash set with linear probing and
 * backward-shift deletion, so there are no tombstones and probe chains stay
 * short however long the process runs. The table has at least twice as many
 * slots as max_entries, so the load factor never passes one half.
 *
 * Locking: every field is guarded by lock, except window_s, mask, max_entries
 * and seed, which never change after replay_cache_new. */
struct replay_slot {
    unsigned char nonce[NONCE_BYTES]; /* the nonce, decoded from hex */
    int64_t expires;                  /* last second it is remembered; 0 marks an empty slot */
};

struct replay_cache {
    pthread_mutex_t lock;      /* guards slots, count and swept_at */
    struct replay_slot *slots; /* mask + 1 slots */
    size_t mask;               /* slot count - 1; the count is a power of two */
    size_t count;              /* occupied slots, expired or not */
    size_t max_entries;        /* count never exceeds this */
    int window_s;              /* minimum time a nonce is remembered */
    int64_t swept_at;          /* now of the last sweep; sweeping again in the same second frees nothing */
    uint64_t seed[2];          /* random, so a signer cannot choose nonces that collide */
};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return x;
}

static size_t slot_home(const struct replay_cache *rc, const unsigned char nonce[NONCE_BYTES])
{
    uint64_t a, b;

    memcpy(&a, nonce, sizeof a);
    memcpy(&b, nonce + sizeof a, sizeof b);
    return (size_t)mix64(mix64(a ^ rc->seed[0]) ^ b ^ rc->seed[1]) & rc->mask;
}

/* Returns the slot holding nonce, or the empty slot where it would go. */
static size_t slot_find(const struct replay_cache *rc, const unsigned char nonce[NONCE_BYTES])
{
    size_t i = slot_home(rc, nonce);

    while (rc->slots[i].expires != 0 && memcmp(rc->slots[i].nonce, nonce, NONCE_BYTES) != 0)
        i = (i + 1) & rc->mask;
    return i;
}

/* Empties slot hole, pulling later members of its probe chain back so that
 * every entry stays reachable from its home slot. */
static void slot_delete(struct replay_cache *rc, size_t hole)
{
    size_t j = hole;

    for (;;) {
        j = (j + 1) & rc->mask;
        if (rc->slots[j].expires == 0)
            break;
        size_t home = slot_home(rc, rc->slots[j].nonce);
        /* The entry may move into the hole only if the hole is not before
         * its home, i.e. lies on the way from home to j. */
        if (((j - home) & rc->mask) >= ((j - hole) & rc->mask)) {
            rc->slots[hole] = rc->slots[j];
            hole = j;
        }
    }
    rc->slots[hole].expires = 0;
    rc->count--;
}

/* Drops every entry that expired before now; returns how many. A deletion
 * may pull a not yet visited entry into slot i, so i is looked at again. */
static size_t cache_sweep(struct replay_cache *rc, int64_t now)
{
    size_t freed = 0;

    for (size_t i = 0; i <= rc->mask;) {
        if (rc->slots[i].expires != 0 && rc->slots[i].expires < now) {
            slot_delete(rc, i);
            freed++;
        } else {
            i++;
        }
    }
    rc->swept_at = now;
    return freed;
}

/* Records nonce unless it is already live; the check and the insert happen
 * under one lock, so concurrent copies of a request cannot both pass. */
static enum sign_result cache_record(struct replay_cache *rc, const unsigned char nonce[NONCE_BYTES],
                                     int64_t expires, int64_t now)
{
    enum sign_result r = SIGN_OK;
    size_t i;

    pthread_mutex_lock(&rc->lock);
    i = slot_find(rc, nonce);
    if (rc->slots[i].expires != 0) {
        /* Same nonce: a replay while remembered, else an expired entry that
         * the new request may take over in place. */
        if (rc->slots[i].expires >= now)
            r = SIGN_REPLAYED;
        else
            rc->slots[i].expires = expires;
        goto out;
    }
    if (rc->count >= rc->max_entries) {
        if (now <= rc->swept_at || cache_sweep(rc, now) == 0) {
            r = SIGN_UNAVAILABLE; /* fail closed: forgetting a live nonce would allow a replay */
            goto out;
        }
        i = slot_find(rc, nonce); /* the sweep moved entries */
    }
    memcpy(rc->slots[i].nonce, nonce, NONCE_BYTES);
    rc->slots[i].expires = expires;
    rc->count++;
out:
    pthread_mutex_unlock(&rc->lock);
    return r;
}

struct replay_cache *replay_cache_new(int window_s, size_t max_entries)
{
    struct replay_cache *rc;
    size_t slots = 1;

    if (window_s <= 0 || max_entries == 0
        || max_entries > SIZE_MAX / 4 / sizeof(struct replay_slot))
        return NULL;
    while (slots < 2 * max_entries)
        slots <<= 1;
    rc = calloc(1, sizeof *rc);
    if (!rc)
        return NULL;
    rc->slots = calloc(slots, sizeof *rc->slots);
    if (!rc->slots || RAND_bytes((unsigned char *)rc->seed, sizeof rc->seed) != 1
        || pthread_mutex_init(&rc->lock, NULL) != 0) {
        free(rc->slots);
        free(rc);
        return NULL;
    }
    rc->mask = slots - 1;
    rc->max_entries = max_entries;
    rc->window_s = window_s;
    rc->swept_at = INT64_MIN;
    return rc;
}

void replay_cache_free(struct replay_cache *rc)
{
    if (!rc)
        return;
    pthread_mutex_destroy(&rc->lock);
    free(rc->slots);
    free(rc);
}

enum sign_result sign_verify(const char *secret, const char *method, const char *path,
                             const char *timestamp, const char *nonce, const char *signature,
                             const void *body, size_t body_len, int64_t now, int max_skew_s,
                             struct replay_cache *rc)
{
    unsigned char nonce_raw[NONCE_BYTES], given[MAC_BYTES], expected[MAC_BYTES];
    int64_t ts, keep, expires;
    uint64_t skew = max_skew_s > 0 ? (uint64_t)max_skew_s : 0, diff;

    if (!timestamp || !nonce || !signature)
        return SIGN_MISSING;
    if (parse_timestamp(timestamp, &ts) < 0 || hex_decode_exact(nonce, nonce_raw, NONCE_BYTES) < 0
        || hex_decode_exact(signature, given, MAC_BYTES) < 0 || !valid_method(method)
        || !valid_path(path) || (!body && body_len > 0))
        return SIGN_MALFORMED;
    if (!valid_secret(secret))
        return SIGN_BAD_SIGNATURE;
    if (compute_mac(secret, method, path, timestamp, nonce, body, body_len, expected) < 0)
        return SIGN_UNAVAILABLE;
    if (CRYPTO_memcmp(expected, given, MAC_BYTES) != 0)
        return SIGN_BAD_SIGNATURE;

    /* Checked only after the signature, so SIGN_STALE always means a genuine
     * request from a control plane whose clock disagrees with ours. Both are
     * converted first: ts - now in int64_t could overflow. */
    diff = ts >= now ? (uint64_t)ts - (uint64_t)now : (uint64_t)now - (uint64_t)ts;
    if (diff > skew)
        return SIGN_STALE;

    if (!rc)
        return SIGN_UNAVAILABLE;
    /* The request stays acceptable until ts + skew, so its nonce must be
     * remembered at least that long, whatever window the cache was given. */
    keep = rc->window_s > max_skew_s ? rc->window_s : (int64_t)skew;
    expires = ts > INT64_MAX - keep ? INT64_MAX : ts + keep;
    return cache_record(rc, nonce_raw, expires, now);
}

const char *sign_result_message(enum sign_result r)
{
    switch (r) {
    case SIGN_OK:            return "request signature is valid";
    case SIGN_MISSING:       return "missing " SIGN_HDR_TIMESTAMP ", " SIGN_HDR_NONCE
                                    " or " SIGN_HDR_SIGNATURE " header";
    case SIGN_MALFORMED:     return "malformed signing header, method or path";
    case SIGN_BAD_SIGNATURE: return "request signature does not match";
    case SIGN_STALE:         return "request timestamp is too far from the agent's clock";
    case SIGN_REPLAYED:      return "request nonce was already used";
    case SIGN_UNAVAILABLE:   return "agent cannot record the request nonce now; retry later";
    }
    return "unknown signature result";
}

int sign_secret_new(char out[65])
{
    unsigned char raw[SECRET_BYTES];

    if (RAND_bytes(raw, sizeof raw) != 1) {
        memset(out, 0, 2 * SECRET_BYTES + 1);
        return -1;
    }
    hex_encode(raw, sizeof raw, out);
    OPENSSL_cleanse(raw, sizeof raw);
    return 0;
}
