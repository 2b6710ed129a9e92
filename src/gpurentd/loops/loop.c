/* loop.c: what every background loop (heartbeat, reconciler, billing,
 * watchdog) shares: its thread, the lock and condition it sleeps on, and
 * the wake and stop requests that cut a sleep short. Each loop keeps its
 * own pacing; this file only spares them from writing the same thread
 * plumbing four times. Also the one rule for when a loop holding streams
 * opened with API keys reads those keys again (key_watch_due). */
#include "gpurent/assert.h"
#include "gpurent/clock.h"
#include "loops/loops.h"
#include "store/store.h"

#include <errno.h>
#include <time.h>

void loop_deadline_us(int64_t us, struct timespec *ts)
{
    clock_gettime(CLOCK_REALTIME, ts);
    if (us <= 0)
        return;
    ts->tv_sec += (time_t)(us / 1000000);
    ts->tv_nsec += (long)(us % 1000000) * 1000;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000;
    }
}

void loop_lock(struct bg_loop *l)
{
    pthread_mutex_lock(&l->lock);
    lock_note_acquired();
}

void loop_unlock(struct bg_loop *l)
{
    lock_note_released();
    pthread_mutex_unlock(&l->lock);
}

int loop_start(struct bg_loop *l, void *(*main_fn)(void *))
{
    l->stop_requested = 0;
    if (pthread_create(&l->thread, NULL, main_fn, l) != 0) {
        log_error("%s: cannot start thread", l->name);
        return -1;
    }
    /* So that top -H, perf and /proc/PID/task name what costs what. */
    pthread_setname_np(l->thread, l->name);
    l->running = 1;
    return 0;
}

void loop_wake(struct bg_loop *l)
{
    loop_lock(l);
    l->wake_requested = 1;
    pthread_cond_signal(&l->cond);
    loop_unlock(l);
}

void loop_stop(struct bg_loop *l)
{
    if (!l->running)
        return;
    loop_lock(l);
    l->stop_requested = 1;
    pthread_cond_signal(&l->cond);
    loop_unlock(l);
    pthread_join(l->thread, NULL);
    l->running = 0;
}

int loop_sleep_locked(struct bg_loop *l, int64_t ms)
{
    struct timespec deadline;
    loop_deadline_us(ms * 1000, &deadline);
    while (!l->stop_requested && !l->wake_requested)
        if (pthread_cond_timedwait(&l->cond, &l->lock, &deadline) == ETIMEDOUT)
            break;
    l->wake_requested = 0;
    return l->stop_requested;
}

int loop_sleep(struct bg_loop *l, int64_t ms)
{
    loop_lock(l);
    int stop = loop_sleep_locked(l, ms);
    loop_unlock(l);
    return stop;
}

int loop_stopping(struct bg_loop *l)
{
    loop_lock(l);
    int stop = l->stop_requested;
    loop_unlock(l);
    return stop;
}

int key_watch_due(struct key_watch *w)
{
    uint64_t gen = store_auth_generation();
    int64_t mono = clock_mono_ms();
    if (gen == w->gen_seen && mono - w->checked_ms < 1000)
        return 0;
    w->gen_seen = gen;
    w->checked_ms = mono;
    return 1;
}
