/* heartbeat.c: the heartbeat loop. On its own thread, every
 * heartbeat_interval_ms, it asks every registered node's agent for its facts
 * over one libcurl multi handle kept from pass to pass (so a fleet of up to
 * agent_max_parallel nodes is polled over kept-alive connections, not a new
 * TCP and TLS handshake per node per pass), judges them (facts.c), and
 * records the results in batched transactions as they arrive. A call sends
 * back the ETag of the reply last recorded for the node, and the agent
 * answers 304 while its facts are those. A node that
 * misses heartbeat_miss_limit polls in a row is unreachable, and offline
 * once it has been silent for node_lost_after_s; a good reply brings it
 * back. When a node's count of ended workloads changes, the reconciler is
 * asked to list that node's workloads now, so an exit is billed to its
 * second. A registration wakes the loop to poll just the new node.
 *
 * A good reply is recorded as seen when its call was made, not when the
 * batch holding it is written: a batch waits for the pass's slowest node (up
 * to agent_timeout_ms), and the node may have stopped answering, and the
 * clock moved on, in the meantime. Billing charges a quiet node's instances
 * up to that time and no further (ledger_billable_end). */
#include "domain/facts.h"
#include "gpurent/clock.h"
#include "gpurent/secrets.h"
#include "loops/agent_client.h"
#include "loops/loops.h"
#include "store/store.h"

#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH 500             /* results per write transaction: short locks, few commits */
#define NEW_PASS_GAP_US 50000 /* least time between two passes over new nodes */

static struct bg_loop loop = BG_LOOP_INIT("heartbeat");

/* One node's outcome of a pass. */
struct beat {
    struct node_target *target;     /* the node polled */
    int ok;                         /* the agent answered 200 with valid facts, or 304 for those recorded */
    int same;                       /* ok, with the very reply last recorded: only the time is written */
    int not_modified;               /* same, answered 304 */
    char digest[65];                /* of the reply and what it was judged against (facts_digest) */
    char etag[AGENT_CALL_ETAG_MAX]; /* the reply's ETag, "" for none */
    struct facts_verdict verdict;   /* when ok and not same (same: accepted and workload_exits only) */
    char reason[256];               /* why not ok */
    int64_t asked_at;               /* clock when the call was made: the reply came after it */
};

/* Cuts s at its first byte that does not begin a complete, valid UTF-8
 * sequence. Reasons quote libcurl and jansson, whose fixed-size messages
 * can end inside a character; the API must be able to show them. */
static void utf8_clip(char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (p[i]) {
        size_t len = p[i] < 0x80             ? 1
                     : (p[i] & 0xE0) == 0xC0 ? 2
                     : (p[i] & 0xF0) == 0xE0 ? 3
                     : (p[i] & 0xF8) == 0xF0 ? 4
                                             : 0;
        size_t k = 1;
        while (k < len && (p[i + k] & 0xC0) == 0x80)
            k++;
        if (len == 0 || k < len || (len == 2 && p[i] < 0xC2))
            break;
        i += len;
    }
    s[i] = '\0';
}

static int should_stop(void)
{
    return loop_stopping(&loop);
}

/* The digest of a facts reply with the model and card count it is judged
 * against: judging the same three again gives the same verdict. A reply
 * with an ETag is named by it (the agent's own digest of its bytes), so
 * that a 304 for that ETag has the same digest; one without by its bytes. */
static void facts_digest(const struct node_target *t, const char *etag, const struct agent_call *c, char out[65])
{
    char cards[24];
    snprintf(cards, sizeof cards, "\n%lld\n", (long long)t->card_count);
    static const char tagged[] = "ETag ";
    const void *parts[] = {t->gpu_model, cards, etag[0] ? tagged : "", etag[0] ? etag : c->response ? c->response : ""};
    const size_t lens[] = {strlen(t->gpu_model), strlen(cards), etag[0] ? sizeof tagged - 1 : 0,
                           etag[0] ? strlen(etag) : c->response_len};
    sha256_hex_parts(parts, lens, 4, out);
}

/* Whether the node's health is still what the verdict on its recorded
 * facts made it (a node gone offline meanwhile is brought back by the whole
 * path, which needs the reply's bytes). */
static int health_of_recorded(const struct node_target *t)
{
    return strcmp(t->health, "up") == 0 || strcmp(t->health, "unreachable") == 0 || strcmp(t->health, "rejected") == 0;
}

/* Whether the node's row already holds what recording this reply would
 * write: the reply recorded last was the same (its digest is written in
 * the transaction that records it), and its health is still that one. */
static int same_as_recorded(const struct beat *b)
{
    const struct node_target *t = b->target;
    return t->facts_digest[0] && strcmp(t->facts_digest, b->digest) == 0 && health_of_recorded(t);
}

/* Whether the reply last recorded for t can be confirmed with a 304: it had
 * an ETag, its digest with t's model and cards as they are now is the one
 * recorded (an admin who changed either has the facts judged again), and a
 * same reply would only move the time (same_as_recorded). */
static int confirmable(const struct node_target *t)
{
    if (!t->facts_etag[0] || !t->facts_digest[0] || !health_of_recorded(t))
        return 0;
    char digest[65];
    facts_digest(t, t->facts_etag, NULL, digest);
    return strcmp(digest, t->facts_digest) == 0;
}

static void judge(struct beat *b, struct agent_call *c)
{
    /* 304: the facts are still those of the ETag sent, which only a
     * confirmable node is sent. */
    int not_modified = c->status == 304 && confirmable(b->target);
    if (c->status != 200 && !not_modified) {
        snprintf(b->reason, sizeof b->reason, "agent answered HTTP %ld", c->status);
        return;
    }
    snprintf(b->etag, sizeof b->etag, "%s", not_modified ? b->target->facts_etag : c->etag);
    /* Most beats repeat the last reply: parsing and judging it again (most
     * of a beat's cost) would change nothing. */
    facts_digest(b->target, b->etag, c, b->digest);
    if (same_as_recorded(b)) {
        b->ok = b->same = 1;
        b->not_modified = not_modified;
        b->verdict.accepted = strcmp(b->target->health, "rejected") != 0;
        b->verdict.workload_exits = b->target->workload_exits;
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

/* A pass in progress: the batch of judged beats waiting to be written. */
struct pass {
    struct store *s;          /* the loop's connection */
    struct agent_multi *pool; /* the loop's multi handle, its connections kept between passes */
    struct beat *batch;       /* BATCH slots */
    size_t n_batch;           /* slots filled */
    int only_new;             /* a pass for new nodes: failures are not recorded */
    size_t answered;          /* good replies, for the log line */
    int64_t record_us;        /* time spent writing */
};

struct record_ctx {
    struct beat *beats; /* the batch */
    size_t n;           /* its length */
    int64_t now;        /* when the batch is written: what a missed beat is judged at */
};

static int record_txn(struct store *s, void *vctx)
{
    struct record_ctx *ctx = vctx;
    for (size_t i = 0; i < ctx->n; i++) {
        struct beat *b = &ctx->beats[i];
        int rc;
        if (b->same) {
            rc = store_node_seen(s, b->target->id, b->asked_at, b->target->workload_exits,
                                 strcmp(b->target->health, "unreachable") == 0);
        } else if (b->ok) {
            rc = store_node_beat_ok(s, b->target->id, b->asked_at, b->verdict.canonical, b->verdict.accepted,
                                    b->verdict.reason, b->verdict.driver_version, b->verdict.stack_version,
                                    b->verdict.cards, b->verdict.n_cards, b->verdict.workload_exits);
            if (rc == STORE_OK)
                rc = store_node_set_ssh(s, b->target->id, b->verdict.ssh_port, b->verdict.ssh_host_key,
                                        b->verdict.ssh_fingerprint);
            if (rc == STORE_OK)
                rc = store_node_set_publish(s, b->target->id, b->verdict.publish_first, b->verdict.publish_last);
            if (rc == STORE_OK)
                rc = store_node_set_data_address(s, b->target->id, b->verdict.data_address);
            if (rc == STORE_OK)
                rc = store_node_set_facts_digest(s, b->target->id, b->digest, b->etag);
        } else {
            rc = store_node_beat_missed(s, b->target->id, ctx->now, daemon_config->heartbeat_miss_limit,
                                        daemon_config->node_lost_after_s, b->reason);
        }
        if (rc != STORE_OK && rc != STORE_NOT_FOUND) /* not found: removed during the pass */
            return rc;
    }
    return STORE_OK;
}

/* Logs a change of the node's health (the same rules as SQL_NODE_QUIET in
 * store_nodes.c); returns 1 if it changed. A first missed beat changes
 * nothing that needs the reconciler: billing already stops at the node's
 * last good beat. */
static int log_changes(struct beat *b, int64_t now)
{
    struct node_target *t = b->target;
    int up = strcmp(t->health, "up") == 0, unreachable = strcmp(t->health, "unreachable") == 0;
    int missing = !b->ok && t->missed_beats + 1 >= daemon_config->heartbeat_miss_limit;
    if (b->ok && b->verdict.accepted && !up)
        log_info("heartbeat: node %s is up", t->id);
    else if (b->ok && !b->verdict.accepted && strcmp(t->health, "rejected") != 0)
        log_warn("heartbeat: node %s not put in service: %s", t->id, b->verdict.reason);
    else if (missing && (strcmp(t->health, "unknown") == 0 ||
                         ((up || unreachable) && t->last_seen_at <= now - daemon_config->node_lost_after_s)))
        log_warn("heartbeat: node %s offline: %s", t->id, b->reason);
    else if (missing && up)
        log_warn("heartbeat: node %s unreachable: %s", t->id, b->reason);
    else
        return 0;
    return 1;
}

/* Whether the node's workloads ended since the last beat said. */
static int exits_changed(const struct beat *b)
{
    return b->ok && b->verdict.workload_exits >= 0 && b->verdict.workload_exits != b->target->workload_exits;
}

/* Writes the batch in one transaction and empties it. */
static void flush(struct pass *p)
{
    if (p->n_batch == 0)
        return;
    int64_t t0 = clock_mono_us();
    int changed = 0;
    struct record_ctx ctx = {p->batch, p->n_batch, clock_now()};
    for (size_t i = 0; i < p->n_batch; i++)
        changed |= log_changes(&p->batch[i], ctx.now);
    if (store_txn(p->s, record_txn, &ctx) != STORE_OK)
        log_error("heartbeat: cannot record results");
    for (size_t i = 0; i < p->n_batch; i++)
        if (exits_changed(&p->batch[i])) {
            reconciler_list_node(p->batch[i].target->id);
            changed = 1;
        }
    for (size_t i = 0; i < p->n_batch; i++) {
        free(p->batch[i].verdict.canonical);
        p->batch[i].verdict.canonical = NULL;
    }
    p->n_batch = 0;
    /* Instances on a node that went away are lost now, not at the
     * reconciler's next period. */
    if (changed)
        reconciler_wake();
    p->record_us += clock_mono_us() - t0;
}

/* Judges one finished call (NULL: it could not be built), made at asked_at,
 * into the batch, writing the batch when it is full. */
static void add_result(struct pass *p, struct node_target *t, struct agent_call *c, int64_t asked_at)
{
    struct beat *b = &p->batch[p->n_batch++];
    b->target = t;
    b->asked_at = asked_at;
    b->ok = b->same = b->not_modified = 0;
    b->digest[0] = '\0';
    b->etag[0] = '\0';
    b->reason[0] = '\0';
    b->verdict.reason[0] = '\0';
    b->verdict.canonical = NULL;
    b->verdict.workload_exits = -1;
    if (!c)
        snprintf(b->reason, sizeof b->reason, "cannot build the call (bad agent URL?)");
    else if (c->error[0])
        snprintf(b->reason, sizeof b->reason, "agent unreachable: %.200s", c->error);
    else
        judge(b, c);
    utf8_clip(b->reason);
    utf8_clip(b->verdict.reason);
    p->answered += b->ok;
    if (b->ok)
        metrics_heartbeat_reply(b->not_modified ? HEARTBEAT_NOT_MODIFIED
                                : b->same       ? HEARTBEAT_REPEATED
                                                : HEARTBEAT_JUDGED);
    /* A node polled the moment it was registered may not have its secret
     * yet: only a success counts then, misses are left to the full passes. */
    if (p->only_new && !b->ok) {
        free(b->verdict.canonical);
        b->verdict.canonical = NULL;
        p->n_batch--;
    }
    if (p->n_batch == BATCH)
        flush(p);
}

/* agent_calls_stream's callbacks for a pass: a facts call per target, each
 * judged, freed and queued for writing as soon as it ends. */
struct facts_stream {
    struct pass *p;
    struct node_target *targets;
    int64_t *asked_at; /* per target: clock when its call was made */
    struct agent_client_opts opts;
};

static struct agent_call *make_facts_call(void *vctx, size_t i)
{
    struct facts_stream *fs = vctx;
    const struct node_target *t = &fs->targets[i];
    fs->asked_at[i] = clock_now();
    struct agent_call *c = agent_call_new(t->agent_url, t->secret, "GET", "/v1/facts", NULL, &fs->opts);
    /* Without the header (no memory) the agent sends the whole reply. */
    if (c && confirmable(t))
        (void)agent_call_if_none_match(c, t->facts_etag);
    return c;
}

static void take_facts(void *vctx, size_t i, struct agent_call *c, int finished)
{
    struct facts_stream *fs = vctx;
    if (finished)
        add_result(fs->p, &fs->targets[i], c, fs->asked_at[i]);
    agent_call_free(c);
}

/* Asks every target for its facts, at most agent_max_parallel calls at once,
 * so results are written while slower agents are still being waited for.
 * Returns 0, or -1 if stopped midway. */
static int poll_targets(struct pass *p, struct node_target *targets, size_t n)
{
    const struct daemon_conf *cf = daemon_config;
    struct facts_stream fs = {p, targets, calloc(n, sizeof *fs.asked_at), agent_client_opts_from_config()};
    if (!fs.asked_at)
        return -1;
    const struct agent_call_stream st = {make_facts_call, take_facts, &fs};
    int64_t connects = agent_multi_connects(p->pool);
    int rc = agent_calls_stream(p->pool, n, (long)cf->agent_max_parallel, should_stop, &st);
    metrics_heartbeat_connections(agent_multi_connects(p->pool) - connects);
    free(fs.asked_at);
    return rc;
}

/* One pass over every registered node, or (only_new) over those never
 * reached yet, which is what a registration wakes the loop for: a fleet
 * registering thousands of nodes must not poll the whole fleet each time. */
static void run_pass(struct store *s, struct agent_multi *pool, struct beat *batch, int only_new)
{
    struct node_target *targets;
    size_t n;
    if ((only_new ? store_node_targets_new(s, &targets, &n) : store_node_targets(s, &targets, &n)) != STORE_OK) {
        free(targets);
        return;
    }
    if (n == 0) {
        free(targets);
        log_debug("heartbeat: pass over 0 nodes%s: 0 answered", only_new ? " (new)" : "");
        return;
    }
    struct pass p = {.s = s, .pool = pool, .batch = batch, .only_new = only_new};
    int64_t t0 = clock_mono_us();
    if (poll_targets(&p, targets, n) == 0)
        flush(&p);
    /* bench/heartbeat.py counts beats from this line. */
    log_debug("heartbeat: pass over %zu nodes%s: %zu answered, polling %lld ms, recording %lld ms", n,
              only_new ? " (new)" : "", p.answered, (long long)(clock_mono_us() - t0 - p.record_us) / 1000,
              (long long)p.record_us / 1000);
    for (size_t i = 0; i < p.n_batch; i++)
        free(batch[i].verdict.canonical);
    free(targets);
}

static void *heartbeat_main(void *arg)
{
    (void)arg;
    struct store *s = store_thread();
    struct beat *batch = calloc(BATCH, sizeof *batch);
    struct agent_multi *pool = agent_multi_new();
    if (!s || !batch || !pool) {
        log_error("heartbeat: no database connection or memory; heartbeats stopped");
        free(batch);
        agent_multi_free(pool);
        return NULL;
    }
    /* Full passes start every heartbeat_interval_ms, measured from the
     * start of the last one, so the period holds however long a pass over a
     * large fleet takes (a pass longer than the period starts the next at
     * once). A wake in between polls only new nodes, at most every
     * NEW_PASS_GAP_US, so registering a fleet node by node costs a few passes
     * a second, not one per node. */
    int64_t next_full = clock_mono_us(), last_new = 0, last_trim = 0;
    for (;;) {
        int64_t start = clock_mono_us();
        int full = start >= next_full;
        if (full)
            next_full = start + daemon_config->heartbeat_interval_ms * 1000;
        else
            last_new = start;
        run_pass(s, pool, batch, !full);
        /* A full pass made and freed a call and some 14 KiB of facts per
         * node; glibc keeps freed pages inside its arenas (one per thread
         * that allocates, up to 8 per core) for reuse, and over the passes
         * and the other threads' work they added some 50 MiB at 10 000
         * nodes. A trim gives back every whole free page: after each full
         * pass, and at most once a second while new nodes register. */
        if (full || clock_mono_us() - last_trim >= 1000000) {
            malloc_trim(0);
            last_trim = clock_mono_us();
        }
        watchdog_loop_alive(LOOP_HEARTBEAT);
        loop_lock(&loop);
        for (;;) {
            int64_t now = clock_mono_us();
            if (loop.stop_requested || now >= next_full || (loop.wake_requested && now >= last_new + NEW_PASS_GAP_US))
                break;
            int64_t until =
                loop.wake_requested && last_new + NEW_PASS_GAP_US < next_full ? last_new + NEW_PASS_GAP_US : next_full;
            struct timespec deadline;
            loop_deadline_us(until - now, &deadline);
            pthread_cond_timedwait(&loop.cond, &loop.lock, &deadline);
        }
        int stop = loop.stop_requested;
        loop.wake_requested = 0; /* the coming pass, full or new, serves it */
        loop_unlock(&loop);
        if (stop)
            break;
    }
    free(batch);
    agent_multi_free(pool);
    return NULL;
}

int heartbeat_start(void)
{
    return loop_start(&loop, heartbeat_main);
}
void heartbeat_wake(void)
{
    loop_wake(&loop);
}
void heartbeat_stop(void)
{
    loop_stop(&loop);
}
