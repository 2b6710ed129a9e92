/* fuzz_sign.c: fuzz target for the signed agent protocol (sign.h), as the
 * agent meets it: header values, method, path and body from the network.
 * Values the fuzzer makes up are never taken as signed (their signature
 * is checked against an HMAC computed here); whatever method and path the
 * signer takes, the verifier takes once, refuses the second time, and
 * refuses with the body changed or the clock moved past the skew. */
#include "gpurent/sign.h"

#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SECRET "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define NOW INT64_C(1764440520)
#define SKEW 300

/* The next '\n'-ended field of the input as a C string (a NUL inside ends
 * it early, as a C caller would see it), or the rest. */
static char *field(const uint8_t **p, const uint8_t *end)
{
    const uint8_t *nl = memchr(*p, '\n', (size_t)(end - *p));
    size_t len = (size_t)((nl ? nl : end) - *p);
    char *s = malloc(len + 1);
    if (!s)
        abort();
    memcpy(s, *p, len);
    s[len] = '\0';
    *p = nl ? nl + 1 : end;
    return s;
}

/* The HMAC of the canonical string, computed here from sign.h's text. */
static void reference_mac(const char *method, const char *path, const char *ts, const char *nonce, const uint8_t *body,
                          size_t body_len, char out[65])
{
    unsigned char digest[32], mac[32];
    char body_hex[65];
    SHA256(body, body_len, digest);
    for (int i = 0; i < 32; i++)
        snprintf(body_hex + 2 * i, 3, "%02x", digest[i]);
    size_t cap = strlen(method) + strlen(path) + strlen(ts) + strlen(nonce) + 70;
    char *canon = malloc(cap);
    if (!canon)
        abort();
    int n = snprintf(canon, cap, "%s\n%s\n%s\n%s\n%s", method, path, ts, nonce, body_hex);
    unsigned mac_len = 0;
    HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), (const unsigned char *)canon, (size_t)n, mac, &mac_len);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
    free(canon);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    char *method = field(&p, end), *path = field(&p, end), *ts = field(&p, end), *nonce = field(&p, end),
         *signature = field(&p, end);
    const uint8_t *body = p;
    size_t body_len = (size_t)(end - p);
    struct replay_cache *rc = replay_cache_new(SKEW, 64);
    if (!rc)
        abort();

    /* As received. Only the true HMAC of what was received passes. */
    enum sign_result r = sign_verify(SECRET, method, path, ts, nonce, signature, body, body_len, NOW, SKEW, rc);
    if (!sign_result_message(r)[0])
        abort();
    if (r == SIGN_OK || r == SIGN_STALE || r == SIGN_REPLAYED) {
        char mac[65];
        reference_mac(method, path, ts, nonce, body, body_len, mac);
        if (strcmp(mac, signature) != 0)
            abort();
    }

    /* Signed here, then verified as received. */
    struct sign_headers h;
    if (sign_request(SECRET, method, path, NOW, body, body_len, &h) == 0) {
        char mac[65];
        reference_mac(method, path, h.timestamp, h.nonce, body, body_len, mac);
        if (strcmp(mac, h.signature) != 0)
            abort();
        if (sign_verify(SECRET, method, path, h.timestamp, h.nonce, h.signature, body, body_len, NOW + SKEW + 1, SKEW,
                        rc) != SIGN_STALE ||
            sign_verify(SECRET, method, path, h.timestamp, h.nonce, h.signature, body, body_len, NOW, SKEW, rc) !=
                SIGN_OK ||
            sign_verify(SECRET, method, path, h.timestamp, h.nonce, h.signature, body, body_len, NOW, SKEW, rc) !=
                SIGN_REPLAYED)
            abort();
        if (body_len > 0) {
            uint8_t *changed = malloc(body_len);
            if (!changed)
                abort();
            memcpy(changed, body, body_len);
            changed[body_len - 1] ^= 1;
            if (sign_verify(SECRET, method, path, h.timestamp, h.nonce, h.signature, changed, body_len, NOW, SKEW,
                            rc) != SIGN_BAD_SIGNATURE)
                abort();
            free(changed);
        }
    } else if (h.timestamp[0] || h.nonce[0] || h.signature[0]) {
        abort(); /* a refused request is left unsigned */
    }

    replay_cache_free(rc);
    free(method);
    free(path);
    free(ts);
    free(nonce);
    free(signature);
    return 0;
}
