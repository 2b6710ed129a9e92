/* driver.c: the worker threads that move workloads through pulling,
 * mounting, starting and running, and remove them after a DELETE. HTTP
 * handlers only record what is wanted and schedule; every slow command runs
 * here. One timer heap serves every node, so a sim fleet of 10 000 nodes
 * needs no thread per node, and sim delays are timers, never sleeps.
 *
 * The phases a restart must not redo or lose are written to the workload's
 * record under its node lock: running (with its instant), exited and failed
 * (with the second the workload ended and its status); reaching them also
 * counts an exit on its node for facts (set_phase). Mounting and starting
 * are not written: a restart resumes a provisioning workload from the phase
 * on disk (see driver_adopt), pulling, and pull, mount and start are each
 * safe to run again (an image pulled, a source mounted, a container that
 * runs are kept), as they must be anyway for a restart inside a step.
 * Mounting and unmounting are serialised by mount_lock, so one workload
 * cannot unmount a source that another is about to use. Each worker
 * publishes when it last went round its loop and, while stepping, by when
 * the step must be over, for the watchdog. */
#include "agent.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpurent/clock.h"

#define STEP_FREED INT64_MIN /* the step removed and freed the workload */
/* An idle worker wakes at least this often, so the watchdog sees it alive. */
#define IDLE_TICK_MS 10000
/* A worker not seen for this long while idle is stuck (on a lock). */
#define IDLE_ALLOWED_MS 120000

struct driver;
/* One worker thread and the progress the watchdog reads. */
struct worker {
    struct driver *d;               /* owner */
    pthread_t thread;               /* the thread */
    _Atomic int64_t beat_ms;        /* monotonic ms it last went round its loop */
    _Atomic int64_t busy_until_ms;  /* while stepping: when the step is overdue; 0 when idle */
};

struct driver {
    struct agent *agent;        /* owner */
    pthread_mutex_t lock;       /* guards the heap, stopping and the workloads' driver-lock fields */
    pthread_cond_t cond;        /* signalled when the heap's head changes or on stop */
    pthread_mutex_t mount_lock; /* serialises mount and unmount steps */
    struct workload **heap;     /* min-heap on due_ms */
    size_t n, cap;              /* used and allocated heap slots */
    struct worker *workers;     /* the threads */
    int n_threads;              /* started workers */
    int stopping;               /* workers exit */
    int64_t step_bound_ms;      /* the longest one step may take: its commands' timeouts, doubled */
};

/* ---------------------------------------------------------------- heap */

static void heap_set(struct driver *d, size_t i, struct workload *w)
{
    d->heap[i] = w;
    w->heap_idx = i;
}

static void sift_up(struct driver *d, size_t i)
{
    struct workload *w = d->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (d->heap[p]->due_ms <= w->due_ms)
            break;
        heap_set(d, i, d->heap[p]);
        i = p;
    }
    heap_set(d, i, w);
}

static void sift_down(struct driver *d, size_t i)
{
    struct workload *w = d->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        int64_t best = w->due_ms;
        if (l < d->n && d->heap[l]->due_ms < best)
            m = l, best = d->heap[l]->due_ms;
        if (r < d->n && d->heap[r]->due_ms < best)
            m = r;
        if (m == i)
            break;
        heap_set(d, i, d->heap[m]);
        i = m;
    }
    heap_set(d, i, w);
}

static int heap_push(struct driver *d, struct workload *w)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        struct workload **g = realloc(d->heap, cap * sizeof *g);
        if (!g)
            return -1;
        d->heap = g;
        d->cap = cap;
    }
    w->in_heap = 1;
    heap_set(d, d->n++, w);
    sift_up(d, d->n - 1);
    return 0;
}

static void heap_remove(struct driver *d, size_t i)
{
    struct workload *w = d->heap[i];
    w->in_heap = 0;
    d->n--;
    if (i == d->n)
        return;
    struct workload *moved = d->heap[d->n];
    heap_set(d, i, moved);
    sift_down(d, i);
    if (moved->heap_idx == i)
        sift_up(d, i);
}

/* Inserts w at due, or moves it earlier if it is already waiting. Call
 * with d->lock held. */
static void schedule_locked(struct driver *d, struct workload *w, int64_t due)
{
    if (w->busy) {
        w->wake = 1; /* the worker steps it again as soon as it is done */
        return;
    }
    if (w->in_heap) {
        if (due < w->due_ms) {
            w->due_ms = due;
            sift_up(d, w->heap_idx);
        }
    } else {
        w->due_ms = due;
        if (heap_push(d, w) < 0)
            log_error("driver: out of memory scheduling workload %s", w->id);
    }
    if (w->in_heap && w->heap_idx == 0)
        pthread_cond_signal(&d->cond);
}

void driver_schedule(struct driver *d, struct workload *w, int64_t delay_ms)
{
    if (delay_ms < 0)
        return;
    pthread_mutex_lock(&d->lock);
    schedule_locked(d, w, clock_mono_ms() + delay_ms);
    pthread_mutex_unlock(&d->lock);
}

/* ---------------------------------------------------------------- steps */

static int phase_final(enum wl_phase p)
{
    return p == WL_EXITED || p == WL_FAILED;
}

/* The second w ended, from what its runtime said (at, 0 when it cannot
 * tell) and when the driver noticed (now). Without a time from the runtime
 * the noticing is all there is: later than the real end by up to one
 * check, never earlier. A time after now, or before the workload was
 * accepted, cannot be its end (a stepped clock, a confused runtime); it is
 * replaced by now too, so billing never runs past the notice. */
static int64_t exit_second(const struct workload *w, int64_t at, int64_t now)
{
    if (at <= 0 || at > now || at < w->created_at)
        return now;
    return at;
}

/* Records a phase change and, for running, exited and failed, writes the
 * record (under the node lock, so a DELETE's tombstone is never overwritten
 * by an older view): two fsyncs fewer for each workload started. Entering
 * running notes its wall-clock instant; reaching exited or failed notes
 * when and how it ended (ex: what the runtime told, or NULL for a failure
 * before any container ran) and counts the exit for facts. Returns whether
 * a DELETE arrived meanwhile. */
static int set_phase(struct agent *a, struct workload *w, enum wl_phase p, const char *msg, const struct rt_exit *ex)
{
    struct agent_node *n = w->node;
    char dir[PATH_MAX];
    agent_node_dir(a, n, dir, sizeof dir);
    pthread_mutex_lock(&n->lock);
    if (w->phase != p)
        log_info("workload %s on %s: %s -> %s%s%s", w->id, n->name, wl_phase_name(w->phase), wl_phase_name(p),
                 msg[0] ? ": " : "", msg);
    if (p == WL_RUNNING)
        w->running_at_ms = clock_wall_ms();
    if (phase_final(p) && !phase_final(w->phase)) {
        w->exited_at = exit_second(w, ex ? ex->at : 0, clock_wall());
        w->exit_known = ex && ex->has_code;
        w->exit_code = w->exit_known ? ex->code : 0;
        n->workload_exits++;
    }
    w->phase = p;
    workload_message_set(w, msg);
    w->updated_at = clock_now();
    if (p == WL_RUNNING || phase_final(p))
        record_save(dir, w);
    int removing = w->removing;
    pthread_cond_broadcast(&n->phase_moved);
    pthread_mutex_unlock(&n->lock);
    return removing;
}

/* Whether another workload of w's node uses volume source src. */
static int source_in_use(struct workload *w, const char *src)
{
    struct agent_node *n = w->node;
    int used = 0;
    pthread_mutex_lock(&n->lock);
    for (size_t i = 0; i < n->n_wl && !used; i++) {
        const struct workload *o = n->wl[i];
        if (o == w)
            continue;
        for (int k = 0; k < o->spec.n_volumes; k++)
            if (strcmp(o->spec.volumes[k].source, src) == 0)
                used = 1;
    }
    pthread_mutex_unlock(&n->lock);
    return used;
}

static int64_t step_remove(struct driver *d, struct workload *w)
{
    struct agent *a = d->agent;
    const struct runtime *rt = a->rt;
    char msg[512] = "";
    atomic_store(&w->cancel, 0); /* it interrupted the previous step; the removal must run */
    int rc = rt->ops->remove(rt, w, msg, sizeof msg);
    if (rc == STEP_INTERRUPTED)
        return atomic_load(&a->stopping) ? -1 : 0;
    if (rc != STEP_OK) {
        log_warn("workload %s: removal failed, retrying in %llds: %s", w->id, (long long)a->conf->retry_interval_s,
                 msg);
        return a->conf->retry_interval_s * 1000;
    }
    pthread_mutex_lock(&d->mount_lock);
    for (int i = 0; i < w->spec.n_volumes && rc == STEP_OK; i++) {
        char host_dir[PATH_MAX];
        const char *src = w->spec.volumes[i].source;
        if (source_in_use(w, src))
            continue;
        if (mount_host_dir(a->conf->mount_root, src, host_dir, sizeof host_dir) < 0)
            continue;
        rc = rt->ops->unmount(rt, w, host_dir, msg, sizeof msg);
    }
    pthread_mutex_unlock(&d->mount_lock);
    if (rc == STEP_INTERRUPTED)
        return atomic_load(&a->stopping) ? -1 : 0;
    if (rc != STEP_OK) {
        log_warn("workload %s: unmount failed, retrying in %llds: %s", w->id, (long long)a->conf->retry_interval_s,
                 msg);
        return a->conf->retry_interval_s * 1000;
    }
    struct agent_node *n = w->node;
    char dir[PATH_MAX];
    agent_node_dir(a, n, dir, sizeof dir);
    pthread_mutex_lock(&n->lock);
    record_delete(dir, w->id);
    wl_log_retire(dir, w->id, a->conf->ended_log_keep_s, a->conf->ended_logs_max);
    agent_node_remove(n, w);
    pthread_cond_broadcast(&n->phase_moved); /* a DELETE waiting for it to be gone answers now */
    pthread_mutex_unlock(&n->lock);
    log_info("workload %s on %s: removed", w->id, n->name);
    workload_free(w);
    return STEP_FREED;
}

/* Host directories backing w's volumes; -1 if a path does not fit. */
static int host_dirs_of(struct agent *a, struct workload *w, char dirs[][PATH_MAX], char *ptrs[])
{
    for (int i = 0; i < w->spec.n_volumes; i++) {
        if (mount_host_dir(a->conf->mount_root, w->spec.volumes[i].source, dirs[i], PATH_MAX) < 0)
            return -1;
        ptrs[i] = dirs[i];
    }
    ptrs[w->spec.n_volumes] = NULL;
    return 0;
}

/* The health check of a running w when it is due (health.c): sim
 * workloads must themselves listen on the port (their 127.0.0.1 is the
 * machine's, shared with other workloads), podman/docker ones are checked
 * in the container's network namespace. The verdict is stored under the
 * node lock for GET /v1/workloads. Returns the delay before w's next step:
 * delay (the runtime's; -1 none) or the next check, whichever is sooner. */
static int64_t health_step(struct agent *a, struct workload *w, int64_t delay)
{
    const struct spec_health *h = &w->spec.health;
    int64_t every = (int64_t)h->interval_s * 1000, now = clock_mono_ms();
    if (now < w->health_due_ms) {
        int64_t left = w->health_due_ms - now;
        return delay >= 0 && delay < left ? delay : left;
    }
    const struct runtime *rt = a->rt;
    char msg[160] = "";
    int status = 0, answered = 0;
    long pid = 0;
    /* A container has its own network: its 127.0.0.1. The sim's share the
     * host's, so the check goes to this workload's own socket. */
    struct listen_addr at;
    listen_addr_loopback(h->port, &at);
    if (rt->ops->main_pid(rt, w->id, &pid, msg, sizeof msg) != STEP_OK)
        ; /* msg says why */
    else if (pid == 0 && !workload_listener(w->id, 0, h->port, &at))
        snprintf(msg, sizeof msg, "nothing of the workload listens on port %d", h->port);
    else if (health_probe(pid, &at, h->path, HEALTH_PROBE_TIMEOUT_MS, &status, msg, sizeof msg) == 0) {
        answered = 1;
        if (status < 200 || status >= 400)
            snprintf(msg, sizeof msg, "GET %.100s answered %d", h->path, status);
    }
    struct agent_node *n = w->node;
    pthread_mutex_lock(&n->lock);
    enum wl_health was = w->health;
    w->health = health_next(was, answered, status);
    w->health_checked_at_ms = clock_wall_ms();
    snprintf(w->health_message, sizeof w->health_message, "%s", w->health == WL_HEALTH_HEALTHY ? "" : msg);
    if (w->health != was)
        log_info("workload %s on %s: health %s -> %s%s%s", w->id, n->name, wl_health_name(was),
                 wl_health_name(w->health), msg[0] ? ": " : "", msg);
    pthread_mutex_unlock(&n->lock);
    w->health_due_ms = clock_mono_ms() + every;
    return delay >= 0 && delay < every ? delay : every;
}

/* One step of w; returns the delay before its next step, -1 for none, or
 * STEP_FREED. */
static int64_t step(struct driver *d, struct workload *w)
{
    struct agent *a = d->agent;
    const struct runtime *rt = a->rt;
    struct agent_node *n = w->node;
    char msg[512] = "";
    int rc = STEP_OK;
    enum wl_phase next;

    pthread_mutex_lock(&n->lock);
    int removing = w->removing;
    enum wl_phase phase = w->phase;
    pthread_mutex_unlock(&n->lock);
    if (removing)
        return step_remove(d, w);

    char local_dirs[SPEC_MAX_VOLUMES][PATH_MAX];
    char *ptrs[SPEC_MAX_VOLUMES + 1];
    switch (phase) {
    case WL_PULLING:
        rc = rt->ops->pull(rt, w, msg, sizeof msg);
        next = WL_MOUNTING;
        break;
    case WL_MOUNTING:
        if (host_dirs_of(a, w, local_dirs, ptrs) < 0) {
            rc = STEP_FAIL;
            snprintf(msg, sizeof msg, "mount_root is too long for a volume directory");
        }
        pthread_mutex_lock(&d->mount_lock);
        for (int i = 0; i < w->spec.n_volumes && rc == STEP_OK; i++)
            rc = rt->ops->mount(rt, w, &w->spec.volumes[i], local_dirs[i], msg, sizeof msg);
        pthread_mutex_unlock(&d->mount_lock);
        next = WL_STARTING;
        break;
    case WL_STARTING:
        if (host_dirs_of(a, w, local_dirs, ptrs) < 0) {
            rc = STEP_FAIL;
            snprintf(msg, sizeof msg, "mount_root is too long for a volume directory");
        } else {
            rc = rt->ops->start(rt, w, ptrs, msg, sizeof msg);
        }
        next = WL_RUNNING;
        break;
    case WL_RUNNING: {
        struct rt_exit ex = {0};
        enum rt_state st = rt->ops->state(rt, w, &ex, msg, sizeof msg);
        if (st == RT_RUNNING || st == RT_UNKNOWN) {
            if (st == RT_UNKNOWN && !atomic_load(&a->stopping))
                log_warn("workload %s: cannot tell whether it runs: %s", w->id, msg);
            int64_t delay = rt->ops->delay_ms(rt, w, WL_RUNNING);
            return st == RT_RUNNING && w->spec.health.present ? health_step(a, w, delay) : delay;
        }
        if (st == RT_EXITED)
            return set_phase(a, w, WL_EXITED, msg, &ex) ? 0 : -1;
        /* Gone with its status: neither when nor how it ended is known. */
        return set_phase(a, w, WL_FAILED, "the container is gone (removed outside the agent?)", NULL) ? 0 : -1;
    }
    default:
        return -1;
    }
    if (rc == STEP_INTERRUPTED)
        return atomic_load(&a->stopping) ? -1 : 0; /* a DELETE: the next step removes it */
    if (rc != STEP_OK)
        return set_phase(a, w, WL_FAILED, msg, NULL) ? 0 : -1; /* no container ran: no exit status */
    if (set_phase(a, w, next, "", NULL))
        return 0;
    return rt->ops->delay_ms(rt, w, next);
}

/* ---------------------------------------------------------------- threads */

static void *worker_main(void *arg)
{
    struct worker *me = arg;
    struct driver *d = me->d;
    pthread_mutex_lock(&d->lock);
    while (!d->stopping) {
        int64_t now = clock_mono_ms();
        atomic_store(&me->beat_ms, now);
        struct workload *w = d->n ? d->heap[0] : NULL;
        if (!w || w->due_ms > now) {
            /* Bounded even with nothing to do, so that a beat means the
             * worker can still take the driver lock. */
            struct timespec ts;
            int64_t wait_ms = w ? w->due_ms - now : IDLE_TICK_MS;
            if (wait_ms > IDLE_TICK_MS)
                wait_ms = IDLE_TICK_MS;
            clock_mono_deadline(wait_ms, &ts);
            pthread_cond_timedwait(&d->cond, &d->lock, &ts);
            continue;
        }
        heap_remove(d, 0);
        w->busy = 1;
        w->wake = 0;
        /* Another worker may take the next due workload meanwhile. */
        if (d->n > 0)
            pthread_cond_signal(&d->cond);
        pthread_mutex_unlock(&d->lock);

        atomic_store(&me->busy_until_ms, clock_mono_ms() + d->step_bound_ms);
        int64_t next = step(d, w);
        /* Beat first: driver_check reads busy_until_ms, then beat_ms. */
        atomic_store(&me->beat_ms, clock_mono_ms());
        atomic_store(&me->busy_until_ms, 0);

        pthread_mutex_lock(&d->lock);
        if (next == STEP_FREED)
            continue;
        w->busy = 0;
        if (w->wake) {
            w->wake = 0;
            next = 0;
        }
        if (next >= 0 && !d->stopping)
            schedule_locked(d, w, clock_mono_ms() + next);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

struct driver *driver_start(struct agent *a, int threads)
{
    struct driver *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->agent = a;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->mount_lock, NULL);
    /* A step runs at most a pull, or a few commands per volume plus a stop;
     * each is killed at its timeout. Doubled for the wait on mount_lock. */
    const struct agent_conf *c = a->conf;
    int64_t commands_s = (SPEC_MAX_VOLUMES + 3) * (c->command_timeout_s + c->stop_timeout_s);
    d->step_bound_ms = 2 * 1000 * (c->pull_timeout_s > commands_s ? c->pull_timeout_s : commands_s) + IDLE_ALLOWED_MS;
    d->workers = calloc((size_t)threads, sizeof *d->workers);
    if (!d->workers) {
        driver_stop(d);
        return NULL;
    }
    for (int i = 0; i < threads; i++) {
        struct worker *wk = &d->workers[i];
        wk->d = d;
        atomic_store(&wk->beat_ms, clock_mono_ms());
        int err = pthread_create(&wk->thread, NULL, worker_main, wk);
        if (err) {
            log_error("driver: cannot start a worker thread: %s", strerror(err));
            driver_stop(d);
            return NULL;
        }
        d->n_threads++;
    }
    return d;
}

void driver_stop(struct driver *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    d->stopping = 1;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
    for (int i = 0; i < d->n_threads; i++)
        pthread_join(d->workers[i].thread, NULL);
    /* The workloads themselves belong to their nodes. */
    for (size_t i = 0; i < d->n; i++)
        d->heap[i]->in_heap = 0;
    free(d->heap);
    free(d->workers);
    pthread_cond_destroy(&d->cond);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->mount_lock);
    free(d);
}

int driver_check(struct driver *d, int64_t now_ms, char *why, size_t whylen)
{
    for (int i = 0; i < d->n_threads; i++) {
        struct worker *wk = &d->workers[i];
        int64_t busy_until = atomic_load(&wk->busy_until_ms);
        int64_t beat = atomic_load(&wk->beat_ms);
        if (busy_until ? now_ms > busy_until : now_ms - beat > IDLE_ALLOWED_MS) {
            snprintf(why, whylen, "driver worker %d has made no progress for %llds%s", i,
                     (long long)((now_ms - beat) / 1000), busy_until ? " (stuck in a step)" : "");
            return -1;
        }
    }
    return 0;
}

void driver_adopt(struct agent_node *n, struct workload *w, void *agent)
{
    struct agent *a = agent;
    const struct runtime *rt = a->rt;
    pthread_mutex_lock(&n->lock);
    if (agent_node_add(n, w) < 0) {
        pthread_mutex_unlock(&n->lock);
        log_error("workload %s: out of memory loading it; it is left on disk", w->id);
        workload_free(w);
        return;
    }
    int64_t delay;
    if (w->removing)
        delay = 0; /* finish the removal a DELETE asked for */
    else if (w->phase == WL_RUNNING) {
        /* A record from an agent that did not keep the instant: the sim's
         * run starts again from now, as it used to. */
        if (w->running_at_ms <= 0)
            w->running_at_ms = clock_wall_ms();
        delay = 0; /* check at once that it still runs */
    } else if (w->phase == WL_EXITED || w->phase == WL_FAILED)
        delay = -1;
    else
        delay = rt->ops->delay_ms(rt, w, w->phase); /* resume the phase it had reached */
    log_info("workload %s on %s: loaded (%s%s)", w->id, n->name, wl_phase_name(w->phase),
             w->removing ? ", removal pending" : "");
    driver_schedule(a->driver, w, delay);
    pthread_mutex_unlock(&n->lock);
}
