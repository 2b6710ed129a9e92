/* ids.c: random ids and bytes from OpenSSL's CSPRNG (see ids.h). */
#include "gpurent/ids.h"

#include <openssl/rand.h>
#include <string.h>

/* Crockford's base32 alphabet in lowercase: no i, l, o, u to misread. */
static const char id_alphabet[] = "0123456789abcdefghjkmnpqrstvwxyz";

int random_bytes(void *buf, size_t n)
{
    return RAND_bytes(buf, (int)n) == 1 ? 0 : -1;
}

int id_new(const char *prefix, char out[ID_MAX])
{
    size_t plen = strlen(prefix);
    if (plen + 1 + ID_RANDOM_CHARS + 1 > ID_MAX)
        return -1;
    unsigned char rnd[ID_RANDOM_CHARS];
    if (random_bytes(rnd, sizeof rnd) < 0)
        return -1;
    memcpy(out, prefix, plen);
    out[plen] = '_';
    /* 256 is a multiple of 32, so taking the low five bits keeps it uniform. */
    for (size_t i = 0; i < ID_RANDOM_CHARS; i++)
        out[plen + 1 + i] = id_alphabet[rnd[i] & 31];
    out[plen + 1 + ID_RANDOM_CHARS] = '\0';
    return 0;
}

int id_valid(const char *prefix, const char *s)
{
    size_t plen = strlen(prefix);
    if (strncmp(s, prefix, plen) != 0 || s[plen] != '_')
        return 0;
    const char *r = s + plen + 1;
    size_t n = 0;
    for (; r[n]; n++)
        if (!strchr(id_alphabet, r[n]) || r[n] == '\0')
            return 0;
    return n == ID_RANDOM_CHARS;
}

void hex_encode(const void *bytes, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = bytes;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}
