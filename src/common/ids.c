/* ids.c: random ids and bytes from OpenSSL's CSPRNG, and ids that sort by
 * when they were made (see ids.h). */
#include "gpurent/ids.h"

#include <openssl/rand.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* Crockford's base32 alphabet in lowercase: no i, l, o, u to misread. */
static const char id_alphabet[] = "0123456789abcdefghjkmnpqrstvwxyz";

int random_bytes(void *buf, size_t n)
{
    return RAND_bytes(buf, (int)n) == 1 ? 0 : -1;
}

/* Ids take their random bytes from the same CSPRNG 32 ids' worth at a time:
 * a RAND_bytes call of its own for each was a twelfth of the daemon's CPU
 * serving a cached read, every request having an id (BENCHMARKS.md). Ids
 * are names, not secrets, which random_bytes still draws a call each. A
 * fork empties every thread's pool (fork_generation), so that a child
 * never hands out the ids its parent will. */
#define ID_POOL_BYTES (32 * ID_RANDOM_CHARS)
static atomic_uint fork_generation;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static _Thread_local struct {
    unsigned char bytes[ID_POOL_BYTES];
    size_t left;         /* not yet handed out, at the end of bytes */
    unsigned generation; /* fork_generation when filled */
} id_pool;

static void forked_child(void)
{
    atomic_fetch_add(&fork_generation, 1);
}

static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, forked_child);
}

static int id_random(unsigned char out[ID_RANDOM_CHARS])
{
    pthread_once(&atfork_once, watch_forks);
    unsigned generation = atomic_load(&fork_generation);
    if (id_pool.left < ID_RANDOM_CHARS || id_pool.generation != generation) {
        if (random_bytes(id_pool.bytes, sizeof id_pool.bytes) < 0)
            return -1;
        id_pool.left = sizeof id_pool.bytes;
        id_pool.generation = generation;
    }
    memcpy(out, id_pool.bytes + sizeof id_pool.bytes - id_pool.left, ID_RANDOM_CHARS);
    id_pool.left -= ID_RANDOM_CHARS;
    return 0;
}

int id_new(const char *prefix, char out[ID_MAX])
{
    size_t plen = strlen(prefix);
    if (plen + 1 + ID_RANDOM_CHARS + 1 > ID_MAX)
        return -1;
    unsigned char rnd[ID_RANDOM_CHARS];
    if (id_random(rnd) < 0)
        return -1;
    memcpy(out, prefix, plen);
    out[plen] = '_';
    /* 256 is a multiple of 32, so taking the low five bits keeps it uniform. */
    for (size_t i = 0; i < ID_RANDOM_CHARS; i++)
        out[plen + 1 + i] = id_alphabet[rnd[i] & 31];
    out[plen + 1 + ID_RANDOM_CHARS] = '\0';
    return 0;
}

int id_new_ordered(const char *prefix, char out[ID_MAX])
{
    if (id_new(prefix, out) < 0)
        return -1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t ms = (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
    /* Most significant first, so that the text sorts as the time does: the
     * alphabet is in ASCII order. */
    char *t = out + strlen(prefix) + 1;
    for (int i = ID_TIME_CHARS - 1; i >= 0; i--, ms >>= 5)
        t[i] = id_alphabet[ms & 31];
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
