/* test_sign.c: unit tests for request signing and the replay cache: known
 * answers, tampering, clock skew, replays, strict header parsing, a full cache
 * and concurrent verification of one request. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "gpurent/sign.h"

#define SECRET "5f1c0a9e7b3d4c2a8e6f0d1b9a7c5e3f2d4b6a8c0e1f3a5b7d9c2e4f6a8b0c1d"
#define BODY   "{\"image\":\"rocm/pytorch:2.3-rocm6.2\",\"gpus\":[0,1]}"
#define PATH   "/v1/workloads/wl_7Qx?force=1&a=%2F"
#define T0     INT64_C(1700000000)

/* Expected values computed outside this program with the openssl CLI:
 *   printf '%s' "$BODY" | openssl dgst -sha256
 *   printf 'PUT\n%s\n1700000000\n0011…eeff\n%s' "$PATH" "$BODYHASH" \
 *     | openssl dgst -sha256 -hmac "$SECRET" */
#define KAT_NONCE "00112233445566778899aabbccddeeff"
#define KAT_SIG   "b7a5730eca5920a62666815a7ef10371424ad8cfe8cd88091b0125306200cc42"
/* GET /v1/workloads, timestamp "1", nonce of all f, empty body. */
#define KAT_GET_NONCE "ffffffffffffffffffffffffffffffff"
#define KAT_GET_SIG   "06a6db79da1b5312091b6403c713048b179d172365ff311f3d128b9dea454db7"

/* An independent signer, written from the protocol description rather than
 * from sign.c, that lets tests choose the nonce. */
static void sign_with(const char *secret, const char *method, const char *path,
                      const char *ts, const char *nonce, const char *body, char out[65])
{
    unsigned char md[32], mac[32];
    unsigned int md_len = 0, mac_len = 0;
    char body_hex[65], canon[1024];
    size_t body_len = body ? strlen(body) : 0;

    assert_int_equal(EVP_Digest(body ? body : "", body_len, md, &md_len, EVP_sha256(), NULL), 1);
    for (int i = 0; i < 32; i++)
        snprintf(body_hex + 2 * i, 3, "%02x", md[i]);
    int n = snprintf(canon, sizeof canon, "%s\n%s\n%s\n%s\n%s", method, path, ts, nonce, body_hex);
    assert_true(n > 0 && (size_t)n < sizeof canon);
    assert_non_null(HMAC(EVP_sha256(), secret, (int)strlen(secret), (unsigned char *)canon,
                         (size_t)n, mac, &mac_len));
    assert_int_equal(mac_len, 32);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* Verifies the PUT request used throughout with a fresh cache. */
static enum sign_result verify_put(const struct sign_headers *h, int64_t now, struct replay_cache *rc)
{
    return sign_verify(SECRET, "PUT", PATH, h->timestamp, h->nonce, h->signature, BODY,
                       strlen(BODY), now, SIGN_DEFAULT_SKEW_S, rc);
}

static void test_known_answer(void **state)
{
    (void)state;
    char sig[65];
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 16);

    assert_non_null(rc);
    sign_with(SECRET, "PUT", PATH, "1700000000", KAT_NONCE, BODY, sig);
    assert_string_equal(sig, KAT_SIG);
    sign_with(SECRET, "GET", "/v1/workloads", "1", KAT_GET_NONCE, NULL, sig);
    assert_string_equal(sig, KAT_GET_SIG);

    assert_int_equal(sign_verify(SECRET, "PUT", PATH, "1700000000", KAT_NONCE, KAT_SIG, BODY,
                                 strlen(BODY), T0, SIGN_DEFAULT_SKEW_S, rc), SIGN_OK);
    assert_int_equal(sign_verify(SECRET, "GET", "/v1/workloads", "1", KAT_GET_NONCE, KAT_GET_SIG,
                                 NULL, 0, 1, SIGN_DEFAULT_SKEW_S, rc), SIGN_OK);
    replay_cache_free(rc);
}

static void test_sign_request_format(void **state)
{
    (void)state;
    struct sign_headers h;
    char sig[65];

    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, BODY, strlen(BODY), &h), 0);
    assert_string_equal(h.timestamp, "1700000000");
    assert_int_equal(strlen(h.nonce), 32);
    assert_int_equal(strspn(h.nonce, "0123456789abcdef"), 32);
    assert_int_equal(strlen(h.signature), 64);
    assert_int_equal(strspn(h.signature, "0123456789abcdef"), 64);
    /* sign.c's canonical string must agree with the independent one. */
    sign_with(SECRET, "PUT", PATH, h.timestamp, h.nonce, BODY, sig);
    assert_string_equal(h.signature, sig);

    assert_int_equal(sign_request(SECRET, "GET", "/", 0, NULL, 0, &h), 0);
    assert_string_equal(h.timestamp, "0");
    sign_with(SECRET, "GET", "/", "0", h.nonce, NULL, sig);
    assert_string_equal(h.signature, sig);

    /* Two requests never share a nonce. */
    struct sign_headers h2;
    assert_int_equal(sign_request(SECRET, "GET", "/", 0, NULL, 0, &h2), 0);
    assert_string_not_equal(h.nonce, h2.nonce);
}

static void test_sign_request_rejects(void **state)
{
    (void)state;
    struct sign_headers h;
    static const struct sign_headers zero;

    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, NULL, 0, NULL), -1);
    assert_int_equal(sign_request(NULL, "PUT", PATH, T0, NULL, 0, &h), -1);
    assert_int_equal(sign_request("", "PUT", PATH, T0, NULL, 0, &h), -1);
    assert_int_equal(sign_request(SECRET, "put", PATH, T0, NULL, 0, &h), -1);
    assert_int_equal(sign_request(SECRET, "", PATH, T0, NULL, 0, &h), -1);
    assert_int_equal(sign_request(SECRET, "PUT\nX", PATH, T0, NULL, 0, &h), -1);
    assert_int_equal(sign_request(SECRET, "PUT", "v1/x", T0, NULL, 0, &h), -1);
    assert_int_equal(sign_request(SECRET, "PUT", "/v1/x\n", T0, NULL, 0, &h), -1);
    assert_int_equal(sign_request(SECRET, "PUT", "/v1/a b", T0, NULL, 0, &h), -1);
    assert_int_equal(sign_request(SECRET, "PUT", PATH, -1, NULL, 0, &h), -1);
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, NULL, 5, &h), -1);
    /* A refused request leaves nothing that could be sent. */
    assert_memory_equal(&h, &zero, sizeof h);
}

static void test_round_trip(void **state)
{
    (void)state;
    struct sign_headers h;
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 16);

    assert_non_null(rc);
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, BODY, strlen(BODY), &h), 0);
    assert_int_equal(verify_put(&h, T0, rc), SIGN_OK);

    assert_int_equal(sign_request(SECRET, "DELETE", "/v1/workloads/wl_1", T0, NULL, 0, &h), 0);
    assert_int_equal(sign_verify(SECRET, "DELETE", "/v1/workloads/wl_1", h.timestamp, h.nonce,
                                 h.signature, NULL, 0, T0 + 5, SIGN_DEFAULT_SKEW_S, rc), SIGN_OK);

    /* An empty body may be given as a non-NULL pointer too. */
    assert_int_equal(sign_request(SECRET, "POST", "/v1/x", T0, "", 0, &h), 0);
    assert_int_equal(sign_verify(SECRET, "POST", "/v1/x", h.timestamp, h.nonce, h.signature,
                                 NULL, 0, T0, SIGN_DEFAULT_SKEW_S, rc), SIGN_OK);
    replay_cache_free(rc);
}

static void test_tampered(void **state)
{
    (void)state;
    struct sign_headers h;
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 16);
    const size_t n = strlen(BODY);
    char buf[128];

    assert_non_null(rc);
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, BODY, n, &h), 0);
#define V(secret, method, path, ts, nonce, sig, body, len) \
    sign_verify(secret, method, path, ts, nonce, sig, body, len, T0, SIGN_DEFAULT_SKEW_S, rc)
    assert_int_equal(V(SECRET, "POST", PATH, h.timestamp, h.nonce, h.signature, BODY, n), SIGN_BAD_SIGNATURE);
    assert_int_equal(V(SECRET, "PUT", "/v1/workloads/wl_7Qy?force=1&a=%2F", h.timestamp, h.nonce,
                       h.signature, BODY, n), SIGN_BAD_SIGNATURE);
    assert_int_equal(V(SECRET, "PUT", "/v1/workloads/wl_7Qx?force=0&a=%2F", h.timestamp, h.nonce,
                       h.signature, BODY, n), SIGN_BAD_SIGNATURE);
    assert_int_equal(V(SECRET, "PUT", "/v1/workloads/wl_7Qx?force=1&a=/", h.timestamp, h.nonce,
                       h.signature, BODY, n), SIGN_BAD_SIGNATURE);
    assert_int_equal(V(SECRET, "PUT", "/v1/workloads/wl_7Qx", h.timestamp, h.nonce, h.signature,
                       BODY, n), SIGN_BAD_SIGNATURE);

    memcpy(buf, BODY, n + 1);
    buf[n - 3] = '2';
    assert_int_equal(V(SECRET, "PUT", PATH, h.timestamp, h.nonce, h.signature, buf, n), SIGN_BAD_SIGNATURE);
    assert_int_equal(V(SECRET, "PUT", PATH, h.timestamp, h.nonce, h.signature, BODY, n - 1), SIGN_BAD_SIGNATURE);
    assert_int_equal(V(SECRET, "PUT", PATH, h.timestamp, h.nonce, h.signature, NULL, 0), SIGN_BAD_SIGNATURE);

    /* A timestamp moved within the skew is still caught by the MAC. */
    assert_int_equal(V(SECRET, "PUT", PATH, "1700000001", h.nonce, h.signature, BODY, n), SIGN_BAD_SIGNATURE);

    memcpy(buf, h.nonce, sizeof h.nonce);
    buf[0] = buf[0] == 'a' ? 'b' : 'a';
    assert_int_equal(V(SECRET, "PUT", PATH, h.timestamp, buf, h.signature, BODY, n), SIGN_BAD_SIGNATURE);

    memcpy(buf, h.signature, sizeof h.signature);
    buf[63] = buf[63] == '0' ? '1' : '0';
    assert_int_equal(V(SECRET, "PUT", PATH, h.timestamp, h.nonce, buf, BODY, n), SIGN_BAD_SIGNATURE);

    char other[65];
    assert_int_equal(sign_secret_new(other), 0);
    assert_int_equal(V(other, "PUT", PATH, h.timestamp, h.nonce, h.signature, BODY, n), SIGN_BAD_SIGNATURE);
    assert_int_equal(V(NULL, "PUT", PATH, h.timestamp, h.nonce, h.signature, BODY, n), SIGN_BAD_SIGNATURE);
    assert_int_equal(V("", "PUT", PATH, h.timestamp, h.nonce, h.signature, BODY, n), SIGN_BAD_SIGNATURE);
#undef V

    /* None of the forgeries used up the nonce. */
    assert_int_equal(verify_put(&h, T0, rc), SIGN_OK);
    replay_cache_free(rc);
}

static void test_stale(void **state)
{
    (void)state;
    struct sign_headers h;
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 16);

    assert_non_null(rc);
    /* Too old and too new, one second past the default skew. */
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0 - 301, BODY, strlen(BODY), &h), 0);
    assert_int_equal(verify_put(&h, T0, rc), SIGN_STALE);
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0 + 301, BODY, strlen(BODY), &h), 0);
    assert_int_equal(verify_put(&h, T0, rc), SIGN_STALE);
    /* Exactly at the skew is still accepted, both ways. */
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0 - 300, BODY, strlen(BODY), &h), 0);
    assert_int_equal(verify_put(&h, T0, rc), SIGN_OK);
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0 + 300, BODY, strlen(BODY), &h), 0);
    assert_int_equal(verify_put(&h, T0, rc), SIGN_OK);

    /* A configured skew; a negative one counts as zero. */
    assert_int_equal(sign_request(SECRET, "GET", "/", T0 - 11, NULL, 0, &h), 0);
    assert_int_equal(sign_verify(SECRET, "GET", "/", h.timestamp, h.nonce, h.signature, NULL, 0,
                                 T0, 10, rc), SIGN_STALE);
    assert_int_equal(sign_request(SECRET, "GET", "/", T0 - 1, NULL, 0, &h), 0);
    assert_int_equal(sign_verify(SECRET, "GET", "/", h.timestamp, h.nonce, h.signature, NULL, 0,
                                 T0, -5, rc), SIGN_STALE);
    assert_int_equal(sign_verify(SECRET, "GET", "/", h.timestamp, h.nonce, h.signature, NULL, 0,
                                 T0 - 1, -5, rc), SIGN_OK);

    /* Extreme clocks must not overflow the difference. */
    assert_int_equal(sign_request(SECRET, "GET", "/", INT64_MAX, NULL, 0, &h), 0);
    assert_string_equal(h.timestamp, "9223372036854775807");
    assert_int_equal(sign_verify(SECRET, "GET", "/", h.timestamp, h.nonce, h.signature, NULL, 0,
                                 INT64_MIN, SIGN_DEFAULT_SKEW_S, rc), SIGN_STALE);
    assert_int_equal(sign_verify(SECRET, "GET", "/", h.timestamp, h.nonce, h.signature, NULL, 0,
                                 INT64_MAX, SIGN_DEFAULT_SKEW_S, rc), SIGN_OK);
    assert_int_equal(sign_verify(SECRET, "GET", "/", h.timestamp, h.nonce, h.signature, NULL, 0,
                                 INT64_MAX, SIGN_DEFAULT_SKEW_S, rc), SIGN_REPLAYED);
    replay_cache_free(rc);
}

static void test_replay(void **state)
{
    (void)state;
    struct sign_headers h;
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 16);

    assert_non_null(rc);
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, BODY, strlen(BODY), &h), 0);
    assert_int_equal(verify_put(&h, T0, rc), SIGN_OK);
    assert_int_equal(verify_put(&h, T0, rc), SIGN_REPLAYED);
    assert_int_equal(verify_put(&h, T0 + 300, rc), SIGN_REPLAYED);
    assert_int_equal(verify_put(&h, T0 - 300, rc), SIGN_REPLAYED);
    /* Once out of the skew the request is stale rather than replayed. */
    assert_int_equal(verify_put(&h, T0 + 301, rc), SIGN_STALE);
    replay_cache_free(rc);
}

static void test_nonce_reusable_after_window(void **state)
{
    (void)state;
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 16);
    char ts[24], sig[65];

    assert_non_null(rc);
    assert_int_equal(sign_verify(SECRET, "PUT", PATH, "1700000000", KAT_NONCE, KAT_SIG, BODY,
                                 strlen(BODY), T0, SIGN_DEFAULT_SKEW_S, rc), SIGN_OK);

    /* The same nonce, re-signed with a later timestamp: refused while the
     * first request could still be accepted, accepted once it could not. */
    snprintf(ts, sizeof ts, "%" PRId64, T0 + 300);
    sign_with(SECRET, "PUT", PATH, ts, KAT_NONCE, BODY, sig);
    assert_int_equal(sign_verify(SECRET, "PUT", PATH, ts, KAT_NONCE, sig, BODY, strlen(BODY),
                                 T0 + 300, SIGN_DEFAULT_SKEW_S, rc), SIGN_REPLAYED);
    snprintf(ts, sizeof ts, "%" PRId64, T0 + 301);
    sign_with(SECRET, "PUT", PATH, ts, KAT_NONCE, BODY, sig);
    assert_int_equal(sign_verify(SECRET, "PUT", PATH, ts, KAT_NONCE, sig, BODY, strlen(BODY),
                                 T0 + 301, SIGN_DEFAULT_SKEW_S, rc), SIGN_OK);
    assert_int_equal(sign_verify(SECRET, "PUT", PATH, ts, KAT_NONCE, sig, BODY, strlen(BODY),
                                 T0 + 301, SIGN_DEFAULT_SKEW_S, rc), SIGN_REPLAYED);
    replay_cache_free(rc);
}

static void test_window_shorter_than_skew(void **state)
{
    (void)state;
    /* A cache given a 10-second window still keeps nonces for the whole
     * skew, so a misconfigured agent cannot be replayed to. */
    struct replay_cache *rc = replay_cache_new(10, 16);
    struct sign_headers h;

    assert_non_null(rc);
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, BODY, strlen(BODY), &h), 0);
    assert_int_equal(verify_put(&h, T0, rc), SIGN_OK);
    assert_int_equal(verify_put(&h, T0 + 200, rc), SIGN_REPLAYED);
    replay_cache_free(rc);
}

static void test_malformed(void **state)
{
    (void)state;
    static const char *const bad_ts[] = {
        "", "+1700000000", "-1700000000", " 1700000000", "1700000000 ", "17000 00000",
        "1700000000\n", "0x6553f100", "1.7e9", "01700000000", "00", "abc",
        "92233720368547758070", "9223372036854775808", "99999999999999999999999",
    };
    static const char *const bad_hex32[] = {
        "", "00112233445566778899aabbccddeef", "00112233445566778899aabbccddeeff0",
        "00112233445566778899AABBCCDDEEFF", "00112233445566778899aabbccddeefg",
        " 0112233445566778899aabbccddeeff", "00112233445566778899aabbccddeef ",
        "+0112233445566778899aabbccddeeff", "-0112233445566778899aabbccddeeff",
        "0x112233445566778899aabbccddeeff",
    };
    static const char *const bad_hex64[] = {
        "", "b7a5730eca5920a62666815a7ef10371424ad8cfe8cd88091b0125306200cc4",
        "b7a5730eca5920a62666815a7ef10371424ad8cfe8cd88091b0125306200cc420",
        "B7A5730ECA5920A62666815A7EF10371424AD8CFE8CD88091B0125306200CC42",
        "b7a5730eca5920a62666815a7ef10371424ad8cfe8cd88091b0125306200cc4z",
        "b7a5730eca5920a62666815a7ef10371 424ad8cfe8cd88091b0125306200cc4",
        "-7a5730eca5920a62666815a7ef10371424ad8cfe8cd88091b0125306200cc42",
    };
    char long_path[8194], long_method[18];
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 16);
    const size_t n = strlen(BODY);

    assert_non_null(rc);
#define V(method, path, ts, nonce, sig, body, len) \
    sign_verify(SECRET, method, path, ts, nonce, sig, body, len, T0, SIGN_DEFAULT_SKEW_S, rc)
    assert_int_equal(V("PUT", PATH, NULL, KAT_NONCE, KAT_SIG, BODY, n), SIGN_MISSING);
    assert_int_equal(V("PUT", PATH, "1700000000", NULL, KAT_SIG, BODY, n), SIGN_MISSING);
    assert_int_equal(V("PUT", PATH, "1700000000", KAT_NONCE, NULL, BODY, n), SIGN_MISSING);

    for (size_t i = 0; i < sizeof bad_ts / sizeof bad_ts[0]; i++)
        assert_int_equal(V("PUT", PATH, bad_ts[i], KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    for (size_t i = 0; i < sizeof bad_hex32 / sizeof bad_hex32[0]; i++)
        assert_int_equal(V("PUT", PATH, "1700000000", bad_hex32[i], KAT_SIG, BODY, n), SIGN_MALFORMED);
    for (size_t i = 0; i < sizeof bad_hex64 / sizeof bad_hex64[0]; i++)
        assert_int_equal(V("PUT", PATH, "1700000000", KAT_NONCE, bad_hex64[i], BODY, n), SIGN_MALFORMED);

    memset(long_method, 'A', sizeof long_method - 1);
    long_method[sizeof long_method - 1] = '\0';
    long_path[0] = '/';
    memset(long_path + 1, 'a', sizeof long_path - 2);
    long_path[sizeof long_path - 1] = '\0';
    assert_int_equal(V(NULL, PATH, "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    assert_int_equal(V("", PATH, "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    assert_int_equal(V("put", PATH, "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    assert_int_equal(V(long_method, PATH, "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    assert_int_equal(V("PUT", NULL, "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    assert_int_equal(V("PUT", "", "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    assert_int_equal(V("PUT", long_path, "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    assert_int_equal(V("PUT", "/v1/\x7f", "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    assert_int_equal(V("PUT", "/v1/\xc3\xa9", "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_MALFORMED);
    assert_int_equal(V("PUT", PATH, "1700000000", KAT_NONCE, KAT_SIG, NULL, n), SIGN_MALFORMED);
    /* A path at the limit is fine (the MAC then decides). */
    long_path[sizeof long_path - 2] = '\0';
    assert_int_equal(V("PUT", long_path, "1700000000", KAT_NONCE, KAT_SIG, BODY, n), SIGN_BAD_SIGNATURE);
#undef V
    /* Nothing above used up the nonce. */
    assert_int_equal(sign_verify(SECRET, "PUT", PATH, "1700000000", KAT_NONCE, KAT_SIG, BODY, n, T0,
                                 SIGN_DEFAULT_SKEW_S, rc), SIGN_OK);
    replay_cache_free(rc);
}

static void test_cache_full_fails_closed(void **state)
{
    (void)state;
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 3);
    struct sign_headers h[4];

    assert_non_null(rc);
    for (int i = 0; i < 4; i++)
        assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, BODY, strlen(BODY), &h[i]), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(verify_put(&h[i], T0, rc), SIGN_OK);
    assert_int_equal(verify_put(&h[3], T0, rc), SIGN_UNAVAILABLE);
    assert_int_equal(verify_put(&h[3], T0 + 300, rc), SIGN_UNAVAILABLE);
    /* The remembered nonces still count as replays while full. */
    assert_int_equal(verify_put(&h[0], T0 + 300, rc), SIGN_REPLAYED);

    /* Once the first three expire there is room again. */
    struct sign_headers later;
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0 + 301, BODY, strlen(BODY), &later), 0);
    assert_int_equal(verify_put(&later, T0 + 301, rc), SIGN_OK);
    assert_int_equal(verify_put(&later, T0 + 301, rc), SIGN_REPLAYED);
    replay_cache_free(rc);
}

static void test_garbage_does_not_fill_cache(void **state)
{
    (void)state;
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 1);
    struct sign_headers h;

    assert_non_null(rc);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(sign_request("not the secret", "PUT", PATH, T0, BODY, strlen(BODY), &h), 0);
        assert_int_equal(verify_put(&h, T0, rc), SIGN_BAD_SIGNATURE);
        assert_int_equal(sign_request(SECRET, "PUT", PATH, T0 - 1000, BODY, strlen(BODY), &h), 0);
        assert_int_equal(verify_put(&h, T0, rc), SIGN_STALE);
    }
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, BODY, strlen(BODY), &h), 0);
    assert_int_equal(verify_put(&h, T0, rc), SIGN_OK);
    replay_cache_free(rc);
}

/* Fills a cache, lets part of it expire, and checks that the sweep kept
 * every live nonce reachable (backward-shift deletion moves entries). */
static void test_sweep_keeps_live_entries(void **state)
{
    (void)state;
    enum { N = 1000, SKEW = 30 };
    static struct sign_headers h[N];
    struct replay_cache *rc = replay_cache_new(SKEW, N);
    const int64_t fill_at = T0 + 19, sweep_at = T0 + 40;

    assert_non_null(rc);
    for (int i = 0; i < N; i++) {
        assert_int_equal(sign_request(SECRET, "GET", "/v1/workloads", T0 + i % 20, NULL, 0, &h[i]), 0);
        assert_int_equal(sign_verify(SECRET, "GET", "/v1/workloads", h[i].timestamp, h[i].nonce,
                                     h[i].signature, NULL, 0, fill_at, SKEW, rc), SIGN_OK);
    }
    /* Full: this one forces a sweep of everything stamped before T0 + 10. */
    struct sign_headers extra;
    assert_int_equal(sign_request(SECRET, "GET", "/v1/workloads", sweep_at, NULL, 0, &extra), 0);
    assert_int_equal(sign_verify(SECRET, "GET", "/v1/workloads", extra.timestamp, extra.nonce,
                                 extra.signature, NULL, 0, sweep_at, SKEW, rc), SIGN_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(sign_verify(SECRET, "GET", "/v1/workloads", h[i].timestamp, h[i].nonce,
                                     h[i].signature, NULL, 0, sweep_at, SKEW, rc),
                         i % 20 >= 10 ? SIGN_REPLAYED : SIGN_STALE);
    /* The freed room is usable: 499 more fit, the next does not. */
    for (int i = 0; i < N / 2; i++) {
        assert_int_equal(sign_request(SECRET, "GET", "/v1/workloads", sweep_at, NULL, 0, &extra), 0);
        assert_int_equal(sign_verify(SECRET, "GET", "/v1/workloads", extra.timestamp, extra.nonce,
                                     extra.signature, NULL, 0, sweep_at, SKEW, rc),
                         i < N / 2 - 1 ? SIGN_OK : SIGN_UNAVAILABLE);
    }
    replay_cache_free(rc);
}

struct race {
    pthread_barrier_t start;    /* releases all threads at once */
    const struct sign_headers *h;
    struct replay_cache *rc;
    atomic_int ok, replayed;    /* outcomes across threads */
};

static void *race_thread(void *arg)
{
    struct race *r = arg;

    pthread_barrier_wait(&r->start);
    enum sign_result res = verify_put(r->h, T0, r->rc);
    if (res == SIGN_OK)
        atomic_fetch_add(&r->ok, 1);
    else if (res == SIGN_REPLAYED)
        atomic_fetch_add(&r->replayed, 1);
    return NULL;
}

static void test_threads_exactly_one_wins(void **state)
{
    (void)state;
    enum { THREADS = 16, ROUNDS = 50 };
    struct replay_cache *rc = replay_cache_new(SIGN_DEFAULT_SKEW_S, 4 * ROUNDS);
    pthread_t tid[THREADS];
    struct sign_headers h;

    assert_non_null(rc);
    for (int round = 0; round < ROUNDS; round++) {
        struct race r = {.h = &h, .rc = rc};
        assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, BODY, strlen(BODY), &h), 0);
        assert_int_equal(pthread_barrier_init(&r.start, NULL, THREADS), 0);
        for (int i = 0; i < THREADS; i++)
            assert_int_equal(pthread_create(&tid[i], NULL, race_thread, &r), 0);
        for (int i = 0; i < THREADS; i++)
            assert_int_equal(pthread_join(tid[i], NULL), 0);
        pthread_barrier_destroy(&r.start);
        assert_int_equal(atomic_load(&r.ok), 1);
        assert_int_equal(atomic_load(&r.replayed), THREADS - 1);
    }
    replay_cache_free(rc);
}

static void test_cache_args(void **state)
{
    (void)state;
    struct sign_headers h;

    assert_null(replay_cache_new(0, 16));
    assert_null(replay_cache_new(-1, 16));
    assert_null(replay_cache_new(SIGN_DEFAULT_SKEW_S, 0));
    assert_null(replay_cache_new(SIGN_DEFAULT_SKEW_S, SIZE_MAX));
    replay_cache_free(NULL);

    /* Without a cache nothing is accepted. */
    assert_int_equal(sign_request(SECRET, "PUT", PATH, T0, BODY, strlen(BODY), &h), 0);
    assert_int_equal(verify_put(&h, T0, NULL), SIGN_UNAVAILABLE);
}

static void test_secret_new(void **state)
{
    (void)state;
    char a[65], b[65];

    assert_int_equal(sign_secret_new(a), 0);
    assert_int_equal(sign_secret_new(b), 0);
    assert_int_equal(strlen(a), 64);
    assert_int_equal(strspn(a, "0123456789abcdef"), 64);
    assert_string_not_equal(a, b);
}

static void test_messages(void **state)
{
    (void)state;
    for (int i = SIGN_OK; i <= SIGN_UNAVAILABLE; i++) {
        const char *m = sign_result_message((enum sign_result)i);
        assert_non_null(m);
        assert_true(strlen(m) > 0);
        for (int j = SIGN_OK; j < i; j++)
            assert_string_not_equal(m, sign_result_message((enum sign_result)j));
    }
    assert_non_null(sign_result_message((enum sign_result)99));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answer),
        cmocka_unit_test(test_sign_request_format),
        cmocka_unit_test(test_sign_request_rejects),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_tampered),
        cmocka_unit_test(test_stale),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_nonce_reusable_after_window),
        cmocka_unit_test(test_window_shorter_than_skew),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_cache_full_fails_closed),
        cmocka_unit_test(test_garbage_does_not_fill_cache),
        cmocka_unit_test(test_sweep_keeps_live_entries),
        cmocka_unit_test(test_threads_exactly_one_wins),
        cmocka_unit_test(test_cache_args),
        cmocka_unit_test(test_secret_new),
        cmocka_unit_test(test_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
