/* logs_proxy.c: reads workload logs from agents for GET
 * /v1/instances/{id}/logs on a thread of its own, so that no HTTP pool
 * thread ever waits on an agent: the handler defers its request
 * (http_defer), this thread runs the agent calls on one curl multi handle
 * (at most LOGS_MAX_ACTIVE at once, each bounded by agent_timeout_ms) and
 * resumes each request with what came back (http_resume). */
#include "gpurent/clock.h"
#include "gpurent/log.h"
#include "loops/agent_client.h"
#include "loops/loops.h"
#include "store/store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Agent calls in flight at once; more wait in the queue. */
#define LOGS_MAX_ACTIVE 32
/* Followed logs at once; more get their stream ended at once. One user
 * may hold LOGS_MAX_FOLLOWS_PER_USER of them (loops.h): without that, one
 * account's streams took every one (there were 64) and nobody else could
 * follow a log. Each keeps at most LOGS_FOLLOW_BUFFER: 64 MiB in all. */
#define LOGS_MAX_FOLLOWS 256
/* How often a followed log asks its agent for new lines. */
#define LOGS_FOLLOW_POLL_MS 500
/* Text a follow keeps for a slow client; past it polling pauses. */
#define LOGS_FOLLOW_BUFFER (256 * 1024)

/* One followed log, shared by the proxy thread and the stream's pull. */
struct logs_follow {
    struct logs_job target;     /* node, secret, first path */
    char workload_id[ID_MAX];   /* at the agent */
    char cursor[64];            /* the agent's cursor, "" before the first reply */
    pthread_mutex_t lock;       /* guards what follows */
    int refs;                   /* the stream's and the proxy's */
    int closed;                 /* the stream is gone: no more wakes */
    int ended;                  /* nothing more will be added */
    char *buf;                  /* text not yet pulled */
    size_t len, off;            /* its bytes and how many were pulled */
    struct http_stream *stream; /* to wake */
    struct agent_call *call;    /* the poll in flight (proxy thread only) */
    int64_t next_at;            /* monotonic ms of the next poll (proxy thread only) */
    struct logs_follow *next;   /* start queue link */
    char user_id[ID_MAX];       /* whose follow */
    char key_id[ID_MAX];        /* the API key it was opened with */
    struct logs_follow *live_prev, *live_next; /* live_follows, under live_lock */
};

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER; /* guards live_follows */
static struct logs_follow *live_follows;                       /* every follow made and not yet freed */

/* Reads waiting for a slot; past it a request gets 503 at once rather than
 * piling up suspended connections. */
#define LOGS_MAX_QUEUED 256

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards the fields below */
static struct logs_job *queue_head, *queue_tail;         /* submitted, not started */
static size_t n_queued;                                  /* entries in the queue */
static int64_t n_pending;                                /* submitted and not yet handed back */
static int running;                                      /* the thread is started and not stopping */
static int stop_requested;                               /* logs_proxy_stop was called */
static struct agent_multi *multi;                        /* the thread's calls; its wakeup is thread-safe */
static struct logs_follow *follow_start_queue;           /* handed over, not yet taken by the thread */
static pthread_t thread;                                 /* the proxy thread */

/* Hands the job back to a pool thread, which replies and frees it. */
static void finish(struct logs_job *job)
{
    agent_call_free(job->call);
    job->call = NULL;
    pthread_mutex_lock(&lock);
    n_pending--;
    pthread_mutex_unlock(&lock);
    http_resume(job->req, job->reply, job);
}

/* Answers the job with no agent reply; why is for the user (no secrets). */
static void fail(struct logs_job *job, const char *why, const char *detail)
{
    job->status = 0;
    snprintf(job->error, sizeof job->error, "%s node %s%s%.200s", why, job->node_name, detail[0] ? ": " : "", detail);
    finish(job);
}

struct logs_follow *logs_follow_new(const struct logs_job *target, const char *workload_id, const char *user_id,
                                    const char *key_id, int *busy)
{
    *busy = 0;
    pthread_mutex_lock(&live_lock);
    int64_t held = 0;
    for (const struct logs_follow *o = live_follows; o; o = o->live_next)
        held += strcmp(o->user_id, user_id) == 0;
    struct logs_follow *f = NULL;
    if (held >= LOGS_MAX_FOLLOWS_PER_USER)
        *busy = 1;
    else if ((f = calloc(1, sizeof *f))) {
        snprintf(f->user_id, sizeof f->user_id, "%s", user_id);
        snprintf(f->key_id, sizeof f->key_id, "%s", key_id);
        f->live_next = live_follows;
        if (live_follows)
            live_follows->live_prev = f;
        live_follows = f;
    }
    pthread_mutex_unlock(&live_lock);
    if (!f)
        return NULL;
    f->target = *target;
    f->target.req = NULL;
    snprintf(f->workload_id, sizeof f->workload_id, "%s", workload_id);
    pthread_mutex_init(&f->lock, NULL);
    f->refs = 1;
    return f;
}

void logs_follow_free(struct logs_follow *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&live_lock);
    if (f->live_prev)
        f->live_prev->live_next = f->live_next;
    else
        live_follows = f->live_next;
    if (f->live_next)
        f->live_next->live_prev = f->live_prev;
    pthread_mutex_unlock(&live_lock);
    pthread_mutex_destroy(&f->lock);
    free(f->buf);
    free(f);
}

static void follow_unref(struct logs_follow *f)
{
    pthread_mutex_lock(&f->lock);
    int left = --f->refs;
    pthread_mutex_unlock(&f->lock);
    if (left == 0)
        logs_follow_free(f);
}

long logs_follow_pull(void *vf, char *buf, size_t max)
{
    struct logs_follow *f = vf;
    pthread_mutex_lock(&f->lock);
    long n = 0;
    if (f->off < f->len) {
        size_t k = f->len - f->off < max ? f->len - f->off : max;
        memcpy(buf, f->buf + f->off, k);
        f->off += k;
        n = (long)k;
    } else if (f->ended) {
        n = -1;
    }
    pthread_mutex_unlock(&f->lock);
    return n;
}

void logs_follow_done(void *vf)
{
    struct logs_follow *f = vf;
    pthread_mutex_lock(&f->lock);
    f->closed = 1;
    pthread_mutex_unlock(&f->lock);
    follow_unref(f);
}

/* Appends text (with f->lock held); drops what was pulled first. */
static void follow_append(struct logs_follow *f, const char *text, size_t n)
{
    if (f->off > 0) {
        memmove(f->buf, f->buf + f->off, f->len - f->off);
        f->len -= f->off;
        f->off = 0;
    }
    char *grown = realloc(f->buf, f->len + n + 1);
    if (!grown) {
        f->ended = 1;
        return;
    }
    f->buf = grown;
    memcpy(f->buf + f->len, text, n);
    f->len += n;
}

/* Wakes the stream (f->lock held) unless it is gone. */
static void follow_wake(struct logs_follow *f)
{
    if (!f->closed && f->stream)
        http_stream_wake(f->stream);
}

/* Ends the follow with a last line saying why (none if why is NULL);
 * f->lock held. */
static void follow_end_locked(struct logs_follow *f, const char *why)
{
    if (why && !f->ended) {
        char line[640];
        int n = snprintf(line, sizeof line, "gpurent: %s\n", why);
        follow_append(f, line, n > 0 && (size_t)n < sizeof line ? (size_t)n : strlen(line));
    }
    f->ended = 1;
    follow_wake(f);
}

/* Ends the follow with a last line saying why (none if why is NULL). */
static void follow_end(struct logs_follow *f, const char *why)
{
    pthread_mutex_lock(&f->lock);
    follow_end_locked(f, why);
    pthread_mutex_unlock(&f->lock);
}

/* The agent's reply as text lines appended to f; 1 if the workload ended. */
static int follow_take(struct logs_follow *f, const char *body)
{
    json_t *in = body ? json_loads(body, JSON_ALLOW_NUL, NULL) : NULL;
    json_t *lines = json_object_get(in, "lines");
    const char *cursor = json_string_value(json_object_get(in, "cursor"));
    if (!json_is_array(lines) || !cursor || strlen(cursor) >= sizeof f->cursor ||
        strspn(cursor, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_.") != strlen(cursor)) {
        json_decref(in);
        return -1;
    }
    snprintf(f->cursor, sizeof f->cursor, "%s", cursor);
    int done = json_is_true(json_object_get(in, "done"));
    pthread_mutex_lock(&f->lock);
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l)
    {
        json_t *t = json_object_get(l, "t");
        const char *stream = json_string_value(json_object_get(l, "stream"));
        const char *text = json_string_value(json_object_get(l, "text"));
        if (!json_is_integer(t) || !stream || !text)
            continue;
        int64_t ms = json_integer_value(t);
        time_t sec = (time_t)(ms / 1000);
        struct tm tm;
        char when[40] = "";
        if (ms >= 0 && gmtime_r(&sec, &tm))
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
        char head[96];
        int n = snprintf(head, sizeof head, "%s.%03dZ %s ", when, (int)(ms >= 0 ? ms % 1000 : 0), stream);
        follow_append(f, head, n > 0 && (size_t)n < sizeof head ? (size_t)n : strlen(head));
        follow_append(f, text, strlen(text));
        follow_append(f, "\n", 1);
    }
    if (done)
        f->ended = 1;
    follow_wake(f);
    pthread_mutex_unlock(&f->lock);
    json_decref(in);
    return done;
}

void logs_follow_start(struct logs_follow *f, struct http_stream *st)
{
    pthread_mutex_lock(&f->lock);
    f->stream = st;
    f->refs++;
    pthread_mutex_unlock(&f->lock);
    pthread_mutex_lock(&lock);
    if (!running || stop_requested) {
        pthread_mutex_unlock(&lock);
        follow_end(f, "the control plane is shutting down");
        follow_unref(f);
        return;
    }
    f->next = follow_start_queue;
    follow_start_queue = f;
    pthread_mutex_unlock(&lock);
    agent_multi_wakeup(multi);
}

/* Ends each follow whose API key no longer grants its owner's authority, as
 * terminal_relay.c's check_keys does for terminals: at the next tick after
 * a change this process committed, within a second of any other. The text
 * read and not yet pulled is dropped with it. */
static void follows_check_keys(struct logs_follow **follows, size_t n)
{
    static struct key_watch watch;
    struct store *s;
    if (n == 0 || !key_watch_due(&watch) || !(s = store_thread()))
        return;
    int64_t now = clock_now();
    for (size_t i = 0; i < n; i++) {
        struct logs_follow *f = follows[i];
        enum key_standing k = account_key_standing(s, f->key_id, now);
        if (k != KEY_GONE && k != KEY_OWNER_DISABLED)
            continue; /* a store that cannot answer ends nothing */
        pthread_mutex_lock(&f->lock);
        if (!f->ended) {
            f->off = f->len;
            follow_end_locked(f, k == KEY_GONE ? "the API key that opened this follow is revoked or expired"
                                               : "the account is suspended");
        }
        pthread_mutex_unlock(&f->lock);
    }
}

/* The proxy thread's follows: starts due polls, drops finished ones. */
static void follows_tick(struct logs_follow **follows, size_t *n, const struct agent_client_opts *opts)
{
    int64_t now = clock_mono_ms();
    for (size_t i = 0; i < *n;) {
        struct logs_follow *f = follows[i];
        pthread_mutex_lock(&f->lock);
        int gone = f->closed || f->ended;
        int full = f->len - f->off >= LOGS_FOLLOW_BUFFER;
        /* A wake now and then lets libmicrohttpd see a client that left. */
        if (!gone && now >= f->next_at)
            follow_wake(f);
        pthread_mutex_unlock(&f->lock);
        if (gone && !f->call) {
            follows[i] = follows[--*n];
            follow_unref(f);
            continue;
        }
        if (!gone && !full && !f->call && now >= f->next_at) {
            char path[384];
            if (f->cursor[0])
                snprintf(path, sizeof path, "/v1/workloads/%s/logs?after=%s", f->workload_id, f->cursor);
            else
                snprintf(path, sizeof path, "%s", f->target.path);
            f->call = agent_call_new(f->target.agent_url, f->target.secret, "GET", path, NULL, opts);
            if (!f->call || agent_multi_add(multi, f->call) < 0) {
                agent_call_free(f->call);
                f->call = NULL;
                follow_end(f, "cannot call the node");
            }
        }
        i++;
    }
}

/* A follow's poll ended. */
static void follow_finished(struct logs_follow *f, int ok)
{
    struct agent_call *c = f->call;
    f->call = NULL;
    f->next_at = clock_mono_ms() + LOGS_FOLLOW_POLL_MS;
    pthread_mutex_lock(&f->lock);
    int ended = f->ended; /* its key's authority ended while the poll ran */
    pthread_mutex_unlock(&f->lock);
    if (ended) {
        agent_call_free(c);
        return;
    }
    char why[512];
    if (ok != 0) {
        metrics_agent_error();
        snprintf(why, sizeof why, "no answer from node %s: %.200s", f->target.node_name, c->error);
        follow_end(f, why);
    } else if (c->status == 404) {
        follow_end(f, "the workload is gone from its node");
    } else if (c->status != 200 || follow_take(f, c->response) < 0) {
        snprintf(why, sizeof why, "node %s could not read the logs (HTTP %ld)", f->target.node_name, c->status);
        follow_end(f, why);
    }
    agent_call_free(c);
}

static void *proxy_main(void *arg)
{
    (void)arg;
    struct logs_job *active[LOGS_MAX_ACTIVE] = {0};
    size_t n_active = 0;
    struct logs_follow *follows[LOGS_MAX_FOLLOWS];
    size_t n_follows = 0;
    struct agent_client_opts opts = agent_client_opts_from_config();
    for (;;) {
        pthread_mutex_lock(&lock);
        int stopping = stop_requested;
        struct logs_job *start = NULL;
        /* Takes what fits in the free slots; the calls are built unlocked. */
        while (!stopping && queue_head && n_active < LOGS_MAX_ACTIVE) {
            struct logs_job *job = queue_head;
            queue_head = job->next;
            if (!queue_head)
                queue_tail = NULL;
            n_queued--;
            job->next = start;
            start = job;
            active[n_active++] = job;
        }
        struct logs_follow *new_follows = follow_start_queue;
        follow_start_queue = NULL;
        pthread_mutex_unlock(&lock);
        while (new_follows) {
            struct logs_follow *f = new_follows;
            new_follows = f->next;
            if (stopping || n_follows >= LOGS_MAX_FOLLOWS) {
                follow_end(f,
                           stopping ? "the control plane is shutting down" : "too many logs are followed; try again");
                follow_unref(f);
            } else {
                follows[n_follows++] = f;
            }
        }
        if (stopping)
            break;
        follows_check_keys(follows, n_follows);
        follows_tick(follows, &n_follows, &opts);
        for (struct logs_job *job = start; job; job = job->next) {
            job->call = agent_call_new(job->agent_url, job->secret, "GET", job->path, NULL, &opts);
            if (!job->call || agent_multi_add(multi, job->call) < 0) {
                for (size_t i = 0; i < n_active; i++)
                    if (active[i] == job)
                        active[i] = active[--n_active];
                fail(job, "cannot call", "");
            }
        }
        agent_multi_run(multi, n_follows ? 100 : 1000);
        struct agent_call *c;
        int ok = 0;
        while ((c = agent_multi_next_done(multi, &ok))) {
            agent_multi_remove(multi, c);
            for (size_t i = 0; i < n_follows; i++)
                if (follows[i]->call == c) {
                    follow_finished(follows[i], ok);
                    c = NULL;
                    break;
                }
            for (size_t i = 0; c && i < n_active; i++) {
                struct logs_job *job = active[i];
                if (job->call != c)
                    continue;
                active[i] = active[--n_active];
                if (ok == 0) {
                    job->status = c->status;
                    job->body = c->response;
                    c->response = NULL;
                    finish(job);
                } else {
                    metrics_agent_error();
                    fail(job, "no answer from", c->error);
                }
                break;
            }
        }
    }
    /* Stopping: every read still here is answered 503 and every follow
     * ended, so that the HTTP server can then stop with no connection
     * suspended. */
    for (size_t i = 0; i < n_follows; i++) {
        struct logs_follow *f = follows[i];
        if (f->call) {
            agent_multi_remove(multi, f->call);
            agent_call_free(f->call);
            f->call = NULL;
        }
        follow_end(f, "the control plane is shutting down");
        follow_unref(f);
    }
    for (size_t i = 0; i < n_active; i++) {
        agent_multi_remove(multi, active[i]->call);
        fail(active[i], "the control plane is shutting down; it was reading", "");
    }
    pthread_mutex_lock(&lock);
    struct logs_job *rest = queue_head;
    queue_head = queue_tail = NULL;
    n_queued = 0;
    pthread_mutex_unlock(&lock);
    while (rest) {
        struct logs_job *next = rest->next;
        fail(rest, "the control plane is shutting down; it was to read", "");
        rest = next;
    }
    return NULL;
}

int logs_proxy_start(void)
{
    multi = agent_multi_new();
    if (!multi)
        return -1;
    stop_requested = 0;
    if (pthread_create(&thread, NULL, proxy_main, NULL) != 0) {
        log_error("logs proxy: cannot start its thread");
        agent_multi_free(multi);
        multi = NULL;
        return -1;
    }
    pthread_setname_np(thread, "logs-proxy");
    pthread_mutex_lock(&lock);
    running = 1;
    pthread_mutex_unlock(&lock);
    return 0;
}

int logs_proxy_submit(struct logs_job *job)
{
    pthread_mutex_lock(&lock);
    if (!running || stop_requested || n_queued >= LOGS_MAX_QUEUED) {
        pthread_mutex_unlock(&lock);
        return -1;
    }
    /* Deferred under the lock: the thread cannot resume it before. */
    http_defer(job->req);
    job->next = NULL;
    if (queue_tail)
        queue_tail->next = job;
    else
        queue_head = job;
    queue_tail = job;
    n_queued++;
    n_pending++;
    pthread_mutex_unlock(&lock);
    agent_multi_wakeup(multi);
    return 0;
}

int64_t logs_proxy_pending(void)
{
    pthread_mutex_lock(&lock);
    int64_t n = n_pending;
    pthread_mutex_unlock(&lock);
    return n;
}

void logs_proxy_stop(void)
{
    pthread_mutex_lock(&lock);
    int was_running = running;
    running = 0;
    stop_requested = 1;
    pthread_mutex_unlock(&lock);
    if (!was_running)
        return;
    agent_multi_wakeup(multi);
    pthread_join(thread, NULL);
    agent_multi_free(multi);
    multi = NULL;
}
