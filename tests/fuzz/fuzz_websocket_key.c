/* fuzz_websocket_key.c: fuzz target for the Sec-WebSocket-Key a browser
 * sends when it opens the web terminal (websocket_accept): a key is taken
 * exactly when it is the padded base64 of 16 bytes (22 characters of the
 * alphabet, then "=="; RFC 6455 4.2.1), and the answer is the base64 of
 * the SHA-1 of the key and the protocol's GUID (4.2.2). */
#include "gpurent/secrets.h"

#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char key[64];
    if (size >= sizeof key)
        return 0;
    memcpy(key, data, size);
    key[size] = '\0';
    int shape = strlen(key) == 24 && strspn(key, alphabet) == 22 && strcmp(key + 22, "==") == 0;
    char accept[64];
    memset(accept, 'Z', sizeof accept);
    int taken = websocket_accept(key, accept) == 0;
    if (taken != shape)
        abort();
    if (!taken)
        return 0;
    char joined[128];
    size_t n = (size_t)snprintf(joined, sizeof joined, "%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11", key);
    unsigned char sha[SHA_DIGEST_LENGTH];
    SHA1((const unsigned char *)joined, n, sha);
    char want[64];
    EVP_EncodeBlock((unsigned char *)want, sha, SHA_DIGEST_LENGTH);
    if (strcmp(accept, want) != 0 || strlen(accept) != 28)
        abort();
    return 0;
}
