/* fuzz_ssh_keys.c: fuzz target for SSH public key lines (ssh_key_parse), as
 * users upload them and agents report their host keys. The input is either
 * a line as typed or, so that the fuzzer reaches the SSH wire format inside,
 * a blob that the target writes as a line itself (its own type first, then
 * its base64). A refusal always says why; a key taken is one of the sizes
 * its type allows, and its normalised line parses back to the same key and
 * the same line. */
#include "domain/ssh_keys.h"

#include <openssl/evp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_line(const char *line)
{
    struct ssh_pubkey k;
    char why[256] = "";
    if (ssh_key_parse(line, &k, why, sizeof why) < 0) {
        if (!why[0])
            abort();
        return;
    }
    int bits_ok = strcmp(k.type, "ssh-ed25519") == 0           ? k.bits == 256
                  : strcmp(k.type, "ecdsa-sha2-nistp256") == 0 ? k.bits == 256
                  : strcmp(k.type, "ecdsa-sha2-nistp384") == 0 ? k.bits == 384
                  : strcmp(k.type, "ecdsa-sha2-nistp521") == 0 ? k.bits == 521
                  : strcmp(k.type, "ssh-rsa") == 0             ? k.bits >= 2048 && k.bits <= 16384
                                                               : 0;
    if (!bits_ok || strncmp(k.fingerprint, "SHA256:", 7) != 0 || strlen(k.fingerprint) != 7 + 43 ||
        k.comment_len > SSH_KEY_COMMENT_MAX)
        abort();

    static char normal[SSH_KEY_LINE_MAX + 64], again[SSH_KEY_LINE_MAX + 64];
    if (ssh_key_format(&k, 1, normal, sizeof normal) < 0)
        abort(); /* a line that parsed fits its own normal form */
    struct ssh_pubkey k2;
    if (ssh_key_parse(normal, &k2, why, sizeof why) < 0)
        abort();
    if (strcmp(k.type, k2.type) != 0 || k.bits != k2.bits || strcmp(k.fingerprint, k2.fingerprint) != 0 ||
        k.comment_len != k2.comment_len || memcmp(k.comment, k2.comment, k.comment_len) != 0)
        abort();
    if (ssh_key_format(&k2, 1, again, sizeof again) < 0 || strcmp(normal, again) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0 || size > SSH_KEY_LINE_MAX)
        return 0;
    static char line[SSH_KEY_LINE_MAX * 2 + 64];
    if (data[0] & 1) {
        memcpy(line, data + 1, size - 1);
        line[size - 1] = '\0';
        check_line(line);
        return 0;
    }
    /* A blob: the line's type is the blob's first string when it is a short
     * printable one (as in every real key), else ssh-ed25519. */
    const uint8_t *blob = data + 1;
    size_t blob_len = size - 1;
    char type[24] = "ssh-ed25519";
    if (blob_len >= 4) {
        uint32_t n = (uint32_t)blob[0] << 24 | (uint32_t)blob[1] << 16 | (uint32_t)blob[2] << 8 | blob[3];
        if (n > 0 && n < sizeof type && n <= blob_len - 4) {
            memcpy(type, blob + 4, n);
            type[n] = '\0';
        }
    }
    size_t at = strlen(type);
    memcpy(line, type, at);
    line[at++] = ' ';
    at += (size_t)EVP_EncodeBlock((unsigned char *)line + at, blob, (int)blob_len);
    memcpy(line + at, " fuzz@test\n", sizeof " fuzz@test\n");
    check_line(line);
    return 0;
}
