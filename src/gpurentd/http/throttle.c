/* throttle.c: counts failed logins (and wrong current passwords) per key
 * ("email:…", "password:…" or "ip:…") in memory
 * and locks a key out for a while after too many. A fixed-size table with
 * the oldest entry evicted keeps memory bounded whatever attackers send. */
#include "http/api.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define THROTTLE_SLOTS 4096

struct throttle_entry {
    char key[280];         /* "email:x@y" or "ip:1.2.3.4"; "" when free */
    int64_t first_failure; /* start of the current counting window */
    int64_t failures;      /* failures in the window */
    int64_t locked_until;  /* epoch seconds; 0 when not locked */
};

static struct throttle_entry table[THROTTLE_SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Ranks a slot for reuse: free slots first, then unlocked ones, then the
 * oldest; a lower rank is a better victim. */
static int64_t victim_rank(const struct throttle_entry *e, int64_t now)
{
    if (!e->key[0])
        return INT64_MIN;
    return (e->locked_until > now ? INT64_MAX / 2 : 0) + e->first_failure;
}

static struct throttle_entry *find(const char *key, int create, int64_t now)
{
    struct throttle_entry *victim = &table[0];
    for (size_t i = 0; i < THROTTLE_SLOTS; i++) {
        if (table[i].key[0] && strcmp(table[i].key, key) == 0)
            return &table[i];
        if (victim_rank(&table[i], now) < victim_rank(victim, now))
            victim = &table[i];
    }
    if (!create)
        return NULL;
    memset(victim, 0, sizeof *victim);
    snprintf(victim->key, sizeof victim->key, "%s", key);
    victim->first_failure = now;
    return victim;
}

int64_t throttle_wait(const char *key, int64_t now)
{
    pthread_mutex_lock(&lock);
    struct throttle_entry *e = find(key, 0, now);
    int64_t wait = e && e->locked_until > now ? e->locked_until - now : 0;
    pthread_mutex_unlock(&lock);
    return wait;
}

void throttle_fail(const char *key, int64_t now, int64_t max, int64_t lockout_s)
{
    pthread_mutex_lock(&lock);
    struct throttle_entry *e = find(key, 1, now);
    if (now - e->first_failure > lockout_s) {
        e->first_failure = now;
        e->failures = 0;
    }
    if (++e->failures >= max) {
        e->locked_until = now + lockout_s;
        e->failures = 0;
        e->first_failure = now;
    }
    pthread_mutex_unlock(&lock);
}

void throttle_clear(const char *key)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < THROTTLE_SLOTS; i++)
        if (table[i].key[0] && strcmp(table[i].key, key) == 0)
            memset(&table[i], 0, sizeof table[i]);
    pthread_mutex_unlock(&lock);
}

int throttle_refused(struct http_request *req, const char *key, const char *ip_key, int64_t now, const char *what)
{
    int64_t wait = throttle_wait(key, now), wait_ip = throttle_wait(ip_key, now);
    if (wait_ip > wait)
        wait = wait_ip;
    if (wait <= 0)
        return 0;
    char retry[24];
    snprintf(retry, sizeof retry, "%lld", (long long)wait);
    http_add_header(req, "Retry-After", retry);
    http_error(req, ERR_TOO_MANY_REQUESTS, NULL, "too many %s; retry in %lld seconds", what, (long long)wait);
    return 1;
}

void throttle_fail_both(const char *key, const char *ip_key, int64_t now)
{
    throttle_fail(key, now, daemon_config->login_max_failures, daemon_config->login_lockout_s);
    throttle_fail(ip_key, now, daemon_config->login_max_failures * 4, daemon_config->login_lockout_s);
}

void throttle_network(const char *ip, int v4_bits, char *out, size_t outlen)
{
    struct in_addr a4;
    struct in6_addr a6;
    const unsigned char *b = NULL;
    if (inet_pton(AF_INET, ip, &a4) == 1)
        b = (const unsigned char *)&a4;
    else if (inet_pton(AF_INET6, ip, &a6) == 1 && IN6_IS_ADDR_V4MAPPED(&a6))
        b = a6.s6_addr + 12;
    if (b && v4_bits == 24) {
        snprintf(out, outlen, "%u.%u.%u.0/24", b[0], b[1], b[2]);
    } else if (b) {
        snprintf(out, outlen, "%u.%u.%u.%u", b[0], b[1], b[2], b[3]);
    } else if (inet_pton(AF_INET6, ip, &a6) == 1) {
        memset(a6.s6_addr + 8, 0, 8);
        char t[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, &a6, t, sizeof t);
        snprintf(out, outlen, "%s/64", t);
    } else {
        snprintf(out, outlen, "%s", ip);
    }
}
