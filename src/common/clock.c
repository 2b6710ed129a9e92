/* clock.c: system time, or the testing clock read from a file (see clock.h). */
#include "gpurent/clock.h"
#include "gpurent/log.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char clock_path[4096];       /* testing clock file, "" when off */
static pthread_mutex_t clock_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t clock_last_good;     /* last value read from the file */
static int clock_warned;            /* a bad read was already logged */

/* Reads the file; returns 0 and sets *out, or -1. Accepts optional spaces and
 * one trailing newline around a non-negative integer. */
static int clock_read_file(int64_t *out)
{
    FILE *f = fopen(clock_path, "r");
    if (!f)
        return -1;
    char buf[64];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = buf;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p < '0' || *p > '9')
        return -1;
    errno = 0;
    char *end;
    long long v = strtoll(p, &end, 10);
    if (errno)
        return -1;
    while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')
        end++;
    if (*end)
        return -1;
    *out = v;
    return 0;
}

int clock_use_file(const char *path)
{
    if (!path || !*path) {
        clock_path[0] = '\0';
        return 0;
    }
    if (strlen(path) >= sizeof clock_path)
        return -1;
    strcpy(clock_path, path);
    int64_t v;
    if (clock_read_file(&v) < 0) {
        clock_path[0] = '\0';
        return -1;
    }
    clock_last_good = v;
    return 0;
}

int clock_is_testing(void) { return clock_path[0] != '\0'; }

int64_t clock_now(void)
{
    if (!clock_path[0])
        return (int64_t)time(NULL);
    pthread_mutex_lock(&clock_lock);
    int64_t v;
    if (clock_read_file(&v) == 0) {
        clock_last_good = v;
        clock_warned = 0;
    } else if (!clock_warned) {
        clock_warned = 1;
        log_warn("clock: cannot read testing clock file %s; keeping %" PRId64, clock_path, clock_last_good);
    }
    v = clock_last_good;
    pthread_mutex_unlock(&clock_lock);
    return v;
}

/* Both read CLOCK_REALTIME itself: time() may answer from the last timer
 * tick, a second behind clock_wall_ms() just after a second begins, and an
 * instant taken with one must never be later than "now" taken with the
 * other (the agent's exited_at and its list's now). */
int64_t clock_wall(void) { return clock_wall_ms() / 1000; }

int64_t clock_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t clock_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void clock_mono_deadline(int64_t ms, struct timespec *out)
{
    clock_gettime(CLOCK_MONOTONIC, out);
    out->tv_sec += (time_t)(ms / 1000);
    out->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
}

int64_t clock_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
