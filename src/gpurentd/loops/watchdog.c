/* watchdog.c: systemd's watchdog, fed only while the daemon really works.
 * When the unit sets WatchdogSec, a thread checks, at half that period, that
 * the database answers and is migrated, that the API answers /healthz on its
 * own port, and that the heartbeat, reconciler and billing loops have
 * finished a pass recently; only then does it send WATCHDOG=1. A stuck
 * daemon is therefore restarted by systemd rather than left half alive. */
#include "gpurent/clock.h"
#include "gpurent/selfcheck.h"
#include "loops/loops.h"
#include "store/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

static struct bg_loop loop = BG_LOOP_INIT("watchdog");
static uint64_t period_us;   /* systemd's WATCHDOG_USEC */
static char health_url[256]; /* the API's own /healthz */
static _Atomic int64_t last_pass_ms[LOOP_COUNT];

void watchdog_loop_alive(enum loop_kind which)
{
    atomic_store(&last_pass_ms[which], clock_mono_ms());
}

/* Returns NULL when healthy, else what is wrong. */
static const char *check(struct store *s)
{
    if (store_schema_version(s) != store_latest_version())
        return "the database does not answer or is not migrated";
    char why[512];
    if (selfcheck_get(health_url, why, sizeof why) < 0) {
        log_error("watchdog: %s", why);
        return "the API does not answer /healthz";
    }
    /* Loops may take a while on a big fleet, but not minutes. */
    static const char *const names[LOOP_COUNT] = {"heartbeat", "reconciler", "billing"};
    int64_t periods[LOOP_COUNT] = {daemon_config->heartbeat_interval_ms, daemon_config->reconcile_interval_ms,
                                   daemon_config->billing_interval_ms};
    int64_t now = clock_mono_ms();
    for (int i = 0; i < LOOP_COUNT; i++) {
        int64_t allowed = periods[i] * 3 > 120000 ? periods[i] * 3 : 120000;
        if (now - atomic_load(&last_pass_ms[i]) > allowed) {
            log_error("watchdog: the %s loop has not finished a pass for %llds", names[i],
                      (long long)((now - atomic_load(&last_pass_ms[i])) / 1000));
            return "a background loop is stuck";
        }
    }
    return NULL;
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    struct store *s = store_thread();
    for (;;) {
        const char *problem = s ? check(s) : "no database connection";
        if (!problem)
            sd_notify(0, "WATCHDOG=1");
        else
            log_error("watchdog: not feeding systemd's watchdog: %s", problem);
        if (loop_sleep(&loop, (int64_t)(period_us / 2000)))
            return NULL;
    }
}

int watchdog_start(const char *host, int port, int tls)
{
    int64_t now = clock_mono_ms();
    for (int i = 0; i < LOOP_COUNT; i++)
        atomic_store(&last_pass_ms[i], now);
    if (sd_watchdog_enabled(0, &period_us) <= 0)
        return 0; /* not under a systemd watchdog */
    selfcheck_url(host, port, tls, health_url, sizeof health_url);
    if (loop_start(&loop, watchdog_main) < 0)
        return -1;
    log_info("watchdog: feeding systemd every %llums after checking the database, the API and the loops",
             (unsigned long long)(period_us / 2000));
    return 0;
}

void watchdog_stop(void)
{
    loop_stop(&loop);
}
