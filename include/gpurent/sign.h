/* sign.h: the signed protocol between gpurentd and its node agents. gpurentd
 * signs every request it sends with the node's secret; the agent refuses any
 * request whose signature, timestamp or nonce does not check out.
 *
 * The signature is lowercase hex of HMAC-SHA256(secret, canonical), where the
 * secret string's bytes are the key and canonical is five lines joined by "\n"
 * with no trailing newline:
 *
 *     METHOD            e.g. PUT (1 to 16 letters A-Z)
 *     PATH              the request target exactly as sent: path and query
 *                       string, percent-encoding untouched (printable ASCII,
 *                       starts with '/', at most 8192 bytes)
 *     TIMESTAMP         the X-Gpurent-Timestamp header
 *     NONCE             the X-Gpurent-Nonce header
 *     lowercase hex SHA-256 of the body (of zero bytes when there is none)
 *
 * The agent must verify the raw target it received, not a decoded one:
 * libmicrohttpd hands handlers an unescaped URL without the query string, so
 * capture the raw URI (MHD_OPTION_URI_LOG_CALLBACK) into the request state.
 * The body is hashed whole, so verify after the upload is complete.
 *
 * Threads: sign_request and sign_verify keep no state of their own; a
 * replay_cache has its own mutex and may be shared by any number of threads. */
#ifndef GPURENT_SIGN_H
#define GPURENT_SIGN_H

#include <stddef.h>
#include <stdint.h>

#define SIGN_HDR_TIMESTAMP "X-Gpurent-Timestamp"
#define SIGN_HDR_NONCE "X-Gpurent-Nonce"
#define SIGN_HDR_SIGNATURE "X-Gpurent-Signature"

/* How far, in seconds, a request's timestamp may be from the agent's clock. */
#define SIGN_DEFAULT_SKEW_S 300

/* The three header values of one signed request, each NUL-terminated. */
struct sign_headers {
    char timestamp[24]; /* decimal epoch seconds: digits only, no leading zero */
    char nonce[33];     /* 32 lowercase hex digits: 128 random bits */
    char signature[65]; /* 64 lowercase hex digits: the HMAC-SHA256 */
};

/* Fills h for a request sent at now (epoch seconds, >= 0) with a fresh random
 * nonce. body may be NULL only when body_len is 0. Returns 0, or -1 on bad
 * arguments or a failure of the random generator, with h zeroed so a half
 * signed request cannot be sent by accident. */
int sign_request(const char *secret, const char *method, const char *path, int64_t now, const void *body,
                 size_t body_len, struct sign_headers *h);

/* Outcomes of sign_verify, in the order they are checked. Suggested HTTP
 * status: 503 for SIGN_UNAVAILABLE (gpurentd should retry later), 401 for
 * the rest. */
enum sign_result {
    SIGN_OK = 0,
    SIGN_MISSING,       /* a signing header is absent */
    SIGN_MALFORMED,     /* a header, the method or the path breaks the syntax above */
    SIGN_BAD_SIGNATURE, /* the HMAC does not match, or the node has no secret */
    SIGN_STALE,         /* authentic, but the timestamp is outside the skew */
    SIGN_REPLAYED,      /* authentic and fresh, but the nonce was already used */
    SIGN_UNAVAILABLE,   /* authentic and fresh, but the replay cache is full
                           (or out of memory): refused rather than risk a replay */
};

/* Nonces seen recently, so each signed request is accepted at most once.
 *
 * One cache per agent process, shared by every node it serves, is the
 * intended use: entries are keyed by the nonce alone, nonces are 128 random
 * bits so nodes never collide by chance, and a request signed for one node
 * cannot then be replayed to another node of the same process either.
 *
 * A nonce is remembered until its request's timestamp is more than
 * max(window_s, max_skew_s) seconds in the past, which is as long as
 * sign_verify could otherwise accept that request again. Memory is fixed at
 * creation (48 to 96 bytes per entry). Expired entries are evicted when the
 * cache fills up; if all max_entries are still live, new requests are refused
 * (SIGN_UNAVAILABLE) rather than old nonces forgotten. Size it for the peak
 * request rate of the whole process times 2 * window_s. */
struct replay_cache;

/* window_s is normally the max_skew_s given to sign_verify. Returns NULL when
 * window_s <= 0, max_entries is 0 or absurdly large, or memory runs out. */
struct replay_cache *replay_cache_new(int window_s, size_t max_entries);
/* NULL is a no-op. */
void replay_cache_free(struct replay_cache *rc);

/* Verifies one request as received at now. timestamp, nonce and signature are
 * the header values (NULL when absent); method and path are as described
 * above; body may be NULL only when body_len is 0. A negative max_skew_s counts
 * as 0. The nonce is recorded in rc only once the signature and the timestamp
 * are good, so unauthenticated traffic cannot fill the cache; rc must not be
 * NULL (a NULL rc gives SIGN_UNAVAILABLE, failing closed). */
enum sign_result sign_verify(const char *secret, const char *method, const char *path, const char *timestamp,
                             const char *nonce, const char *signature, const void *body, size_t body_len, int64_t now,
                             int max_skew_s, struct replay_cache *rc);

/* A short human sentence for error bodies and logs; never NULL. */
const char *sign_result_message(enum sign_result r);

/* Writes a new node secret: 32 random bytes as 64 lowercase hex digits and a
 * NUL. Returns 0, or -1 (out zeroed) if the random generator fails. */
int sign_secret_new(char out[65]);

#endif
