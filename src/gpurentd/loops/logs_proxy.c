/* logs_proxy.c: reads workload logs from agents for GET
 * /v1/instances/{id}/logs on a thread of its own, so that no HTTP pool
 * thread ever waits on an agent: the handler defers its request
 * (http_defer), this thread runs the agent calls on one curl multi handle
 * (at most LOGS_MAX_ACTIVE at once, each bounded by agent_timeout_ms) and
 * resumes each request with what came back (http_resume). */
#include "gpurent/log.h"
#include "loops/agent_client.h"
#include "loops/loops.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Agent calls in flight at once; more wait in the queue. */
#define LOGS_MAX_ACTIVE 32
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

static struct agent_client_opts client_opts(void)
{
    const struct daemon_conf *cf = daemon_config;
    struct agent_client_opts o = {
        .connect_timeout_ms = cf->agent_connect_timeout_ms,
        .total_timeout_ms = cf->agent_timeout_ms,
        .max_response_bytes = (size_t)cf->agent_max_response_bytes,
        .ca_file = cf->agent_ca_file,
    };
    return o;
}

static void *proxy_main(void *arg)
{
    (void)arg;
    struct logs_job *active[LOGS_MAX_ACTIVE] = {0};
    size_t n_active = 0;
    struct agent_client_opts opts = client_opts();
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
        pthread_mutex_unlock(&lock);
        if (stopping)
            break;
        for (struct logs_job *job = start; job; job = job->next) {
            job->call = agent_call_new(job->agent_url, job->secret, "GET", job->path, NULL, &opts);
            if (!job->call || agent_multi_add(multi, job->call) < 0) {
                for (size_t i = 0; i < n_active; i++)
                    if (active[i] == job)
                        active[i] = active[--n_active];
                fail(job, "cannot call", "");
            }
        }
        agent_multi_run(multi, 1000);
        struct agent_call *c;
        int ok = 0;
        while ((c = agent_multi_next_done(multi, &ok))) {
            agent_multi_remove(multi, c);
            for (size_t i = 0; i < n_active; i++) {
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
    /* Stopping: every read still here is answered 503, so that the HTTP
     * server can then stop with no connection suspended. */
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
