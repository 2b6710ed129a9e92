/* thread_slots.c: the per-thread caches of the HTTP threads, direct-mapped
 * (instance replies in api_instances.c) or in sets of a few slots (API keys
 * in auth.c). Each thread has its own array, so serving from one takes no
 * lock. */
#include "http/api.h"

#include <stdlib.h>

void *thread_slot(pthread_key_t key, size_t n, size_t ways, size_t size, const char *id)
{
    unsigned char *slots = pthread_getspecific(key);
    if (!slots) {
        if (!(slots = calloc(n, size)) || pthread_setspecific(key, slots) != 0) {
            free(slots);
            return NULL;
        }
    }
    return slots + (size_t)(id_hash(id) % (n / ways)) * ways * size;
}

uint32_t id_hash(const char *id)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = id; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return h;
}
