/* watchdog.c: systemd's watchdog for the agent, fed only while the agent
 * really works. When the unit sets WatchdogSec, a thread checks at half that
 * period that the API answers GET /healthz on the agent's own port, that
 * every driver worker has made progress recently (driver_check) and that the
 * discovery refresher still wakes up; only then does it send WATCHDOG=1, so
 * a wedged agent is restarted by systemd (its containers keep running)
 * rather than left half alive. The signal loop never pings: a main thread
 * that still takes signals says nothing about the threads doing the work. */
#include "agent.h"
#include "gpurent/clock.h"
#include "gpurent/selfcheck.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

/* Whatever the periods, a thread is given this long before it counts as stuck. */
#define MIN_ALLOWED_MS 120000

struct agent_watchdog {
    struct agent *agent;   /* what is checked */
    uint64_t period_us;    /* systemd's WATCHDOG_USEC */
    char health_url[256];  /* the API's own /healthz */
    pthread_mutex_t lock;  /* guards stop */
    pthread_cond_t cond;   /* signalled on stop */
    int stop;              /* the thread exits */
    pthread_t thread;      /* the checking thread */
};

/* NULL when healthy, else what is wrong (in why). */
static const char *check(struct agent_watchdog *w, char *why, size_t whylen)
{
    struct agent *a = w->agent;
    if (selfcheck_get(w->health_url, why, whylen) < 0)
        return why;
    int64_t now = clock_mono_ms();
    if (driver_check(a->driver, now, why, whylen) < 0)
        return why;
    int64_t alive = atomic_load(&a->refresher_alive_ms);
    if (alive) {
        /* It wakes every discovery_interval_s and may then spend up to
         * discovery_timeout_s in the tool. */
        int64_t allowed = 3 * 1000 * (a->conf->discovery_interval_s + a->conf->discovery_timeout_s);
        if (allowed < MIN_ALLOWED_MS)
            allowed = MIN_ALLOWED_MS;
        if (now - alive > allowed) {
            snprintf(why, whylen, "the discovery refresher has not run for %llds", (long long)((now - alive) / 1000));
            return why;
        }
    }
    return NULL;
}

static void *watchdog_main(void *arg)
{
    struct agent_watchdog *w = arg;
    int64_t half_ms = (int64_t)(w->period_us / 2000);
    if (half_ms < 1)
        half_ms = 1;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        pthread_mutex_unlock(&w->lock);
        char why[512];
        const char *problem = check(w, why, sizeof why);
        if (!problem)
            sd_notify(0, "WATCHDOG=1");
        else
            log_error("watchdog: not feeding systemd's watchdog: %s", problem);
        struct timespec ts;
        clock_mono_deadline(half_ms, &ts);
        pthread_mutex_lock(&w->lock);
        while (!w->stop && pthread_cond_timedwait(&w->cond, &w->lock, &ts) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

struct agent_watchdog *agent_watchdog_start(struct agent *a, const char *host, int port, int tls)
{
    uint64_t period_us = 0;
    if (sd_watchdog_enabled(0, &period_us) <= 0 || period_us == 0)
        return NULL; /* not under a systemd watchdog */
    struct agent_watchdog *w = calloc(1, sizeof *w);
    if (!w) {
        log_error("watchdog: out of memory; systemd's watchdog will not be fed");
        return NULL;
    }
    w->agent = a;
    w->period_us = period_us;
    selfcheck_url(host, port, tls, w->health_url, sizeof w->health_url);
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    int err = pthread_create(&w->thread, NULL, watchdog_main, w);
    if (err) {
        log_error("watchdog: cannot start its thread: %s; systemd's watchdog will not be fed", strerror(err));
        pthread_cond_destroy(&w->cond);
        pthread_mutex_destroy(&w->lock);
        free(w);
        return NULL;
    }
    log_info("watchdog: feeding systemd every %llums after checking the API, the driver workers and discovery",
             (unsigned long long)(period_us / 2000));
    return w;
}

void agent_watchdog_stop(struct agent_watchdog *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    free(w);
}
