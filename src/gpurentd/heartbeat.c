/* heartbeat.c: the heartbeat loop. On its own thread, every
 * heartbeat_interval_ms (or at once when woken), it asks every registered
 * node's agent for its facts over one libcurl multi handle, judges them
 * (facts.c), and records the results in batched transactions. A node that
 * misses heartbeat_miss_limit polls in a row goes offline; a good reply
 * brings it back. */
#include "agent_client.h"
#include "clock.h"
#include "daemon.h"
#include "facts.h"
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH 500 /* results per write transaction: short locks, few commits */

static pthread_t thread;
static int running;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int stop_requested, wake_requested; /* guarded by lock */

/* One node's outcome of a pass. */
struct beat {
    struct node_target *target;   /* the node polled */
    int ok;                       /* the agent answered 200 with valid facts */
    struct facts_verdict verdict; /* when ok */
    char reason[256];             /* why not ok */
};

static int should_stop(void)
{
    pthread_mutex_lock(&lock);
    int s = stop_requested;
    pthread_mutex_unlock(&lock);
    return s;
}

static void judge(struct beat *b, struct agent_call *c)
{
    if (c->status != 200) {
        snprintf(b->reason, sizeof b->reason, "agent answered HTTP %ld", c->status);
        return;
    }
    json_error_t jerr;
    json_t *facts = json_loadb(c->response ? c->response : "", c->response_len, 0, &jerr);
    if (!facts) {
        snprintf(b->reason, sizeof b->reason, "agent sent invalid JSON: %s", jerr.text);
        return;
    }
    if (facts_check(b->target->gpu_model, b->target->card_count, facts, &b->verdict) == 0)
        b->ok = 1;
    else
        snprintf(b->reason, sizeof b->reason, "%s", b->verdict.reason);
    json_decref(facts);
}

/* Calls every agent; fills beats. Returns 0, or -1 if stopped midway. */
static int poll_agents(struct beat *beats, size_t n)
{
    const struct daemon_conf *cf = daemon_config;
    struct agent_client_opts opts = {
        .connect_timeout_ms = cf->agent_connect_timeout_ms,
        .total_timeout_ms = cf->agent_timeout_ms,
        .max_response_bytes = (size_t)cf->agent_max_response_bytes,
        .ca_file = cf->agent_ca_file,
    };
    struct agent_call **calls = calloc(n, sizeof *calls);
    if (!calls)
        return -1;
    for (size_t i = 0; i < n; i++) {
        calls[i] = agent_call_new(beats[i].target->agent_url, beats[i].target->secret, "GET", "/v1/facts", NULL, &opts);
        if (!calls[i])
            snprintf(beats[i].reason, sizeof beats[i].reason, "cannot build the call (bad agent URL?)");
    }
    int rc = agent_calls_run(calls, n, (long)cf->agent_max_parallel, should_stop);
    for (size_t i = 0; i < n; i++) {
        struct agent_call *c = calls[i];
        if (!c)
            continue;
        if (rc == 0 && !c->error[0])
            judge(&beats[i], c);
        else
            snprintf(beats[i].reason, sizeof beats[i].reason, "agent unreachable: %.200s", c->error);
        agent_call_free(c);
    }
    free(calls);
    return rc;
}

struct record_ctx {
    struct beat *beats; /* the batch */
    size_t n;           /* its length */
    int64_t now;        /* when the pass ran */
};

static int record_txn(struct store *s, void *vctx)
{
    struct record_ctx *ctx = vctx;
    for (size_t i = 0; i < ctx->n; i++) {
        struct beat *b = &ctx->beats[i];
        int rc;
        if (b->ok)
            rc = store_node_beat_ok(s, b->target->id, ctx->now, b->verdict.canonical, b->verdict.accepted,
                                    b->verdict.reason, b->verdict.driver_version, b->verdict.stack_version,
                                    b->verdict.cards, b->verdict.n_cards);
        else
            rc = store_node_beat_missed(s, b->target->id, ctx->now, daemon_config->heartbeat_miss_limit, b->reason);
        if (rc != STORE_OK && rc != STORE_NOT_FOUND) /* not found: removed during the pass */
            return rc;
    }
    return STORE_OK;
}

/* Logs a change of the node's health; returns 1 if it changed. */
static int log_changes(struct beat *b)
{
    struct node_target *t = b->target;
    if (b->ok && b->verdict.accepted && strcmp(t->health, "up") != 0)
        log_info("heartbeat: node %s is up", t->id);
    else if (b->ok && !b->verdict.accepted && strcmp(t->health, "rejected") != 0)
        log_warn("heartbeat: node %s not put in service: %s", t->id, b->verdict.reason);
    else if (!b->ok && strcmp(t->health, "offline") != 0 && t->missed_beats + 1 >= daemon_config->heartbeat_miss_limit)
        log_warn("heartbeat: node %s offline: %s", t->id, b->reason);
    else
        return 0;
    return 1;
}

static void run_pass(struct store *s)
{
    struct node_target *targets;
    size_t n;
    if (store_node_targets(s, &targets, &n) != STORE_OK || n == 0) {
        free(targets);
        return;
    }
    struct beat *beats = calloc(n, sizeof *beats);
    if (!beats) {
        free(targets);
        return;
    }
    for (size_t i = 0; i < n; i++)
        beats[i].target = &targets[i];
    if (poll_agents(beats, n) == 0) {
        int64_t now = clock_now();
        int changed = 0;
        for (size_t i = 0; i < n; i++)
            changed |= log_changes(&beats[i]);
        for (size_t off = 0; off < n; off += BATCH) {
            struct record_ctx ctx = {beats + off, n - off < BATCH ? n - off : BATCH, now};
            if (store_txn(s, record_txn, &ctx) != STORE_OK)
                log_error("heartbeat: cannot record results");
        }
        /* Instances on a node that went away are lost now, not at the
         * reconciler's next period. */
        if (changed)
            reconciler_wake();
    }
    for (size_t i = 0; i < n; i++)
        free(beats[i].verdict.canonical);
    free(beats);
    free(targets);
}

static void *heartbeat_main(void *arg)
{
    (void)arg;
    struct store *s = store_thread();
    if (!s) {
        log_error("heartbeat: no database connection; heartbeats stopped");
        return NULL;
    }
    for (;;) {
        run_pass(s);
        watchdog_loop_alive(LOOP_HEARTBEAT);
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        int64_t ms = daemon_config->heartbeat_interval_ms;
        deadline.tv_sec += ms / 1000;
        deadline.tv_nsec += (ms % 1000) * 1000000;
        if (deadline.tv_nsec >= 1000000000) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000;
        }
        pthread_mutex_lock(&lock);
        while (!stop_requested && !wake_requested)
            if (pthread_cond_timedwait(&cond, &lock, &deadline) == ETIMEDOUT)
                break;
        int stop = stop_requested;
        wake_requested = 0;
        pthread_mutex_unlock(&lock);
        if (stop)
            break;
    }
    return NULL;
}

int heartbeat_start(void)
{
    stop_requested = 0;
    if (pthread_create(&thread, NULL, heartbeat_main, NULL) != 0) {
        log_error("heartbeat: cannot start thread");
        return -1;
    }
    running = 1;
    return 0;
}

void heartbeat_wake(void)
{
    pthread_mutex_lock(&lock);
    wake_requested = 1;
    pthread_cond_signal(&cond);
    pthread_mutex_unlock(&lock);
}

void heartbeat_stop(void)
{
    if (!running)
        return;
    pthread_mutex_lock(&lock);
    stop_requested = 1;
    pthread_cond_signal(&cond);
    pthread_mutex_unlock(&lock);
    pthread_join(thread, NULL);
    running = 0;
}
