/* fuzz_api_key.c: fuzz target for API key tokens as every request's
 * Authorization header presents them (api_key_parse): a token taken is
 * exactly "gpk_", 20 characters of the ids' base32, "_" and 64 lowercase
 * hex digits; it names the key "key_" + those 20, and its hash is the
 * SHA-256 of the hex. Every token api_key_new makes is taken, with the id
 * and hash it made, and no token that differs from it in one byte matches
 * both. Ids are checked the same way (id_valid). */
#include "gpurent/ids.h"
#include "gpurent/secrets.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char base32[] = "0123456789abcdefghjkmnpqrstvwxyz";

static int token_shape(const char *t)
{
    if (strlen(t) != API_TOKEN_LEN || strncmp(t, "gpk_", 4) != 0 || t[4 + ID_RANDOM_CHARS] != '_')
        return 0;
    for (size_t i = 4; i < 4 + ID_RANDOM_CHARS; i++)
        if (!strchr(base32, t[i]))
            return 0;
    return strspn(t + 5 + ID_RANDOM_CHARS, "0123456789abcdef") == 64;
}

static void check_token(const char *t)
{
    char id[ID_MAX];
    unsigned char hash[API_SECRET_HASH_LEN], want[32];
    int taken = api_key_parse(t, id, hash) == 0;
    if (taken != token_shape(t))
        abort();
    if (!taken)
        return;
    if (strncmp(id, "key_", 4) != 0 || strncmp(id + 4, t + 4, ID_RANDOM_CHARS) != 0 ||
        strlen(id) != 4 + ID_RANDOM_CHARS || !id_valid("key", id))
        abort();
    sha256(t + 5 + ID_RANDOM_CHARS, 64, want);
    if (!api_key_hash_equal(hash, want))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *t = malloc(size + 1);
    if (!t)
        return 0;
    memcpy(t, data, size);
    t[size] = '\0';
    check_token(t);
    /* The same bytes as an id of any kind: the prefix, '_', 20 base32. */
    const char *us = strchr(t, '_');
    if (us && us > t && us - t < 8) {
        char prefix[8];
        memcpy(prefix, t, (size_t)(us - t));
        prefix[us - t] = '\0';
        int valid = strlen(us + 1) == ID_RANDOM_CHARS && strspn(us + 1, base32) == ID_RANDOM_CHARS;
        if (id_valid(prefix, t) != valid)
            abort();
    }
    free(t);

    char id[ID_MAX], token[API_TOKEN_LEN + 1], parsed_id[ID_MAX];
    unsigned char hash[API_SECRET_HASH_LEN], parsed[API_SECRET_HASH_LEN];
    if (api_key_new(id, token, hash) < 0)
        abort();
    if (api_key_parse(token, parsed_id, parsed) < 0 || strcmp(id, parsed_id) != 0 || !api_key_hash_equal(hash, parsed))
        abort();
    if (size > 0) {
        /* One byte of the made token changed as the input says. */
        size_t at = data[0] % API_TOKEN_LEN;
        char changed = size > 1 ? (char)data[1] : 'x';
        if (changed != token[at] && changed != '\0') {
            token[at] = changed;
            if (api_key_parse(token, parsed_id, parsed) == 0 && strcmp(id, parsed_id) == 0 &&
                api_key_hash_equal(hash, parsed))
                abort();
        }
    }
    return 0;
}
