/* reconciler.c: the reconciler loop. On its own thread, woken whenever an
 * instance changes (and every reconcile_interval_ms anyway), it compares what
 * each unsettled instance wants with what its nodes' agents report, and
 * acts: puts workloads, watches them provision, opens the running interval
 * when every node runs, retries failed attempts on fresh cards with backoff,
 * removes workloads of stopped instances and releases their cards.
 *
 * A running instance whose node stops answering (unreachable, see
 * heartbeat.c) becomes unreachable: its interval ends at the node's last
 * good heartbeat, but it keeps its cards and its workloads. If every node
 * answers again and every workload still runs, it is running again, billed
 * from that moment; if a workload ended meanwhile it ends unbilled; if a
 * node stays silent past node_lost_after_s (offline) it is lost, its cards
 * released and its workloads deleted when the node returns.
 *
 * Every reconcile_sweep_ms it lists every agent's workloads, and a node the
 * heartbeat saw a workload end on is listed in the next pass: workloads no
 * instance owns are deleted, and running instances whose workload exited or
 * failed are ended at the second the agent says it ended. Only a sweep
 * reads every instance holding cards; the passes between read only those
 * needing attention (store_instance_attention), so their cost follows what
 * changes, not how many instances are live. Level-triggered: after any
 * crash or restart the next pass (always a sweep) converges from the
 * database and the agents alone.
 *
 * A change of an account's SSH keys reaches its instances' agents at once:
 * the API queues the user (reconciler_push_ssh_keys) and the next pass
 * sends every rank its keys (PUT .../ssh-keys), trying a failed send again
 * for a few passes; every sweep compares each listed workload's
 * ssh_keys_digest with the keys it should hold and sends them to one that
 * missed a change (its node was down, the daemon stopped before sending).
 *
 * A PUT asks its agent to hold the answer until the workload runs, for at
 * most agent_put_wait_ms, so a start that quick is seen running in the pass
 * that put it. While instances provision, passes come quickly (QUICK_MS
 * after progress, doubling while nothing moves, up to
 * reconcile_interval_ms), so an agent that finishes in milliseconds is seen
 * in milliseconds and one that pulls for minutes is not polled in a busy
 * loop. A pass writes every change it decided in one transaction (one
 * commit, one fsync), and running instances with nothing to do cost no
 * transaction at all. */
#include "domain/apps.h"
#include "domain/domain.h"
#include "domain/ledger.h"
#include "domain/placement.h"
#include "gpurent/clock.h"
#include "gpurent/secrets.h"
#include "loops/agent_client.h"
#include "loops/loops.h"
#include "store/store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PENDING_DELETES 100000
/* A delete that failed this often is left to the sweep: its node is
 * probably down, and retrying every pass would slow every pass. */
#define MAX_DELETE_TRIES 5
/* The first quick re-poll after progress, in milliseconds; it doubles while
 * nothing moves. */
#define QUICK_MS 5

enum call_kind { CALL_PUT, CALL_GET, CALL_DELETE, CALL_LIST, CALL_ORPHAN };

/* A workload to delete whatever becomes of its instance. */
struct pending_delete {
    char agent_url[513];      /* node's agent */
    char secret[65];          /* its key */
    char workload_id[ID_MAX]; /* what */
    int tries;                /* failed attempts so far */
};

/* One unsettled instance in a pass. */
struct work {
    struct instance in;                              /* as read at the start of the pass */
    struct instance_node *nodes;                     /* its placement, sized to it (a sweep holds every live one) */
    size_t n_nodes;                                  /* entries in nodes */
    struct agent_call *call[PLACEMENT_MAX_NODES];    /* this pass's call per node, or NULL */
    enum call_kind kind[PLACEMENT_MAX_NODES];        /* what each call is */
    int unfit;                                       /* pending, a held card failed: placed again, nothing put */
};

/* A workload seen in an agent's list during a sweep. */
struct seen {
    char workload_id[ID_MAX]; /* id */
    char phase[16];           /* reported phase */
    char message[256];        /* with it */
    int64_t ended_ago;        /* exited or failed: seconds before the list was made, by the agent's clock; -1 unknown */
    int exit_known;           /* exited: exit_code holds its status */
    int exit_code;            /* that status */
    char *last;               /* exited or failed: its last log lines, joined for a reason (malloc'd), or NULL */
    char health[16];          /* its health check's verdict; "" when it has none */
    char ssh_keys_digest[65]; /* the keys it holds (AGENT_PROTOCOL.md); "" when it has no ssh or the agent is older */
};

static struct bg_loop loop = BG_LOOP_INIT("reconciler");

/* Deletes to send in the next pass; touched only by the reconciler thread. */
static struct pending_delete *pending;
static size_t n_pending;

/* Connections to agents kept from pass to pass (agent_client.h's pool); touched
 * only by the reconciler thread. NULL: each call connects anew. */
static struct agent_multi *pool;

/* Nodes to list in the next pass, asked for by the heartbeat when an agent
 * reports an ended workload; guarded by loop.lock. Capped: past it the next
 * pass lists every node, which is what the cap would have asked for anyway. */
#define MAX_LIST_NODES 1024
static char (*list_nodes)[ID_MAX];
static size_t n_list_nodes;
static int list_all;

static int should_stop(void)
{
    return loop_stopping(&loop);
}

/* Queues a delete of workload_id at agent_url for the next pass, tries
 * being how often it failed so far. */
static void queue_delete_try(const char *agent_url, const char *secret, const char *workload_id, int tries)
{
    if (tries >= MAX_DELETE_TRIES) {
        log_warn("reconciler: giving up deleting workload %s at %s for now; the sweep will retry", workload_id,
                 agent_url);
        return;
    }
    if (n_pending >= MAX_PENDING_DELETES)
        return; /* the sweep finds it later */
    struct pending_delete *grown = realloc(pending, (n_pending + 1) * sizeof *pending);
    if (!grown)
        return;
    pending = grown;
    struct pending_delete *d = &pending[n_pending++];
    snprintf(d->agent_url, sizeof d->agent_url, "%s", agent_url);
    snprintf(d->secret, sizeof d->secret, "%s", secret);
    snprintf(d->workload_id, sizeof d->workload_id, "%s", workload_id);
    d->tries = tries;
}

/* Whether a delete of workload_id at agent_url is queued already (a scan:
 * for the rare callers that may ask twice). */
static int delete_queued(const char *agent_url, const char *workload_id)
{
    for (size_t i = 0; i < n_pending; i++)
        if (strcmp(pending[i].workload_id, workload_id) == 0 && strcmp(pending[i].agent_url, agent_url) == 0)
            return 1;
    return 0;
}

static void queue_delete(const struct instance_node *p)
{
    queue_delete_try(p->agent_url, p->secret, p->workload_id, 0);
}

/* What the specs of one instance share, looked up once per instance and
 * pass rather than once per node. */
struct spec_inputs {
    char stack[8];    /* the software stack the cards run */
    char source[513]; /* what the agents mount at /shared */
    int64_t size_gb;  /* the volume's quota, for the agents' mount_command */
    json_t *ssh_keys; /* the snapshot of its SSH keys, "type base64" (owned) */
    struct instance_run run; /* what it runs: command, the user's env, working_dir (owned) */
    struct instance_key key; /* its internal key pair (multi-node), "" when none */
    int64_t health_port;     /* an app replica: the app's port, checked by the agent; 0 none */
    char health_path[256];   /* and the path it GETs */
};
static int gang_inputs_get(struct store *s, const struct instance *in, struct spec_inputs *out);

static int spec_inputs_get(struct store *s, const struct instance *in, struct spec_inputs *out)
{
    store_instance_run_free(&out->run); /* a retry after a failed read */
    if (store_instance_run(s, in->id, &out->run) != STORE_OK)
        return -1;
    /* The image's stack is the GPU type's (instance_create checked that),
     * and the image is one indexed row, where reading the type also counts
     * every card of the model. The type answers for an image since removed
     * from the catalog. */
    struct image img;
    int rc = store_image_find(s, in->image, &img);
    if (rc == STORE_OK) {
        snprintf(out->stack, sizeof out->stack, "%s", img.stack);
    } else if (rc == STORE_NOT_FOUND) {
        struct gpu_type t;
        if (store_gpu_type_row(s, in->gpu_model, &t) != STORE_OK)
            return -1;
        snprintf(out->stack, sizeof out->stack, "%s", t.stack);
    } else {
        return -1;
    }
    struct volume v;
    if (store_volume_mount(s, in->volume_id, &v) != STORE_OK)
        return -1;
    snprintf(out->source, sizeof out->source, "%s", v.source);
    out->size_gb = v.size_gb;
    /* An app replica is health-checked by its agent before it gets traffic
     * (0027): the app's port and health path. */
    char app_id[ID_MAX];
    out->health_port = 0;
    rc = store_instance_app_check(s, in->id, app_id, sizeof app_id, &out->health_port, out->health_path,
                                  sizeof out->health_path);
    if (rc != STORE_OK && rc != STORE_NOT_FOUND)
        return -1;
    /* The keys as the account has them now: the snapshot is taken at
     * create, at start and at every change of the account's keys
     * (store_user_ssh_resnapshot), which is also sent to the ranks already
     * put (push_plan). */
    char *keys;
    if (store_instance_ssh(s, in->id, &keys, NULL) != STORE_OK)
        return -1;
    out->ssh_keys = json_loads(keys, 0, NULL);
    free(keys);
    if (!json_is_array(out->ssh_keys)) {
        json_decref(out->ssh_keys);
        out->ssh_keys = NULL;
        return -1;
    }
    return gang_inputs_get(s, in, out);
}

/* The internal key pair of a multi-node instance (made at create or start,
 * instance_gang_prepare); single-node ones have none. */
static int gang_inputs_get(struct store *s, const struct instance *in, struct spec_inputs *out)
{
    memset(&out->key, 0, sizeof out->key);
    if (!instance_multi_node(in->card_count))
        return 0;
    return store_instance_internal_key(s, in->id, &out->key) == STORE_OK ? 0 : -1;
}

static void spec_inputs_free(struct spec_inputs *si)
{
    json_decref(si->ssh_keys);
    si->ssh_keys = NULL;
    store_instance_run_free(&si->run);
    secret_wipe(&si->key, sizeof si->key);
}

static void rank_data_address(const struct instance_node *p, char *out, size_t n)
{
    node_data_address(p->data_host, p->data_address, p->public_host, p->agent_url, out, n);
}

static void env_int(json_t *env, const char *name, long long v)
{
    char num[32];
    snprintf(num, sizeof num, "%lld", v);
    json_object_set_new(env, name, json_string(num));
}


/* Whether the ranks of w get "cluster" (gang_spec): more than one node, an
 * instance key pair, and every node reporting an SSH server (the agent
 * needs each host's port and key; without them there is no ssh launcher
 * to set up) and a data_address in its facts: agents from before issue 12
 * report none, and refuse a spec member they do not know. */
static int gang_ready(const struct work *w, const struct instance_key *key)
{
    if (w->n_nodes < 2 || !key->pub[0])
        return 0;
    for (size_t k = 0; k < w->n_nodes; k++) {
        const struct instance_node *p = &w->nodes[k];
        if (p->ssh_port <= 0 || !p->ssh_host_key[0] || !p->data_address[0])
            return 0;
    }
    return 1;
}

/* The environment every rank's job gets for rendezvous (ARCHITECTURE.md):
 * MASTER_ADDR is rank 0's data-plane address, WORLD_SIZE every card of the
 * instance (as torchrun means it), LOCAL_WORLD_SIZE and
 * GPURENT_GPUS_PER_NODE this node's cards. GPURENT_HOSTFILE only where the
 * agent writes the file (a "cluster" goes with the spec): a launcher given
 * a path with nothing there fails, where without one it runs locally. */
static void gang_env(json_t *env, const struct work *w, const struct instance_key *key, size_t local_cards)
{
    char master[254];
    rank_data_address(&w->nodes[0], master, sizeof master);
    json_object_set_new(env, "MASTER_ADDR", json_string(master));
    env_int(env, "WORLD_SIZE", (long long)w->in.card_count);
    env_int(env, "LOCAL_WORLD_SIZE", (long long)local_cards);
    env_int(env, "GPURENT_GPUS_PER_NODE", (long long)local_cards);
    if (gang_ready(w, key))
        json_object_set_new(env, "GPURENT_HOSTFILE", json_string("/etc/gpurent/hostfile"));
}

/* The instance key's public line without its comment, as authorized_keys
 * entries are sent. */
static void internal_key_line(const struct instance_key *key, char *line, size_t n)
{
    snprintf(line, n, "%s", key->pub);
    char *sp = strchr(line, ' ');
    if (sp && (sp = strchr(sp + 1, ' ')))
        *sp = '\0';
}

/* For more than one node (gang_ready): every rank's hosts (rankN at its
 * data-plane address, its SSH server's port and host key, the login of
 * that rank, its cards as slots) and the identity they log in to each
 * other with, whose public key joins this rank's authorized_keys. */
static void gang_spec(json_t *spec, const struct spec_inputs *si, const struct work *w, size_t r)
{
    if (!gang_ready(w, &si->key))
        return;
    json_t *hosts = json_array();
    for (size_t k = 0; k < w->n_nodes; k++) {
        const struct instance_node *p = &w->nodes[k];
        char name[32], address[254], user[ID_MAX + 24];
        snprintf(name, sizeof name, "rank%lld", (long long)p->rank);
        rank_data_address(p, address, sizeof address);
        snprintf(user, sizeof user, "%s-%lld", w->in.id, (long long)p->rank);
        json_t *cards = json_loads(p->cards, 0, NULL);
        json_array_append_new(hosts, json_pack("{s:s, s:s, s:I, s:s, s:I, s:s}", "name", name, "address", address,
                                               "ssh_port", (json_int_t)p->ssh_port, "user", user, "slots",
                                               (json_int_t)json_array_size(cards), "host_key", p->ssh_host_key));
        json_decref(cards);
    }
    json_object_set_new(spec, "cluster",
                        json_pack("{s:I, s:o, s:s}", "rank", (json_int_t)w->nodes[r].rank, "hosts", hosts, "identity",
                                  si->key.priv));
    /* A copy, since every rank's spec shares the users' snapshot. */
    json_t *ssh = json_object_get(spec, "ssh");
    if (ssh) {
        char line[SSH_PUBKEY_MAX];
        internal_key_line(&si->key, line, sizeof line);
        json_t *keys = json_copy(json_object_get(ssh, "authorized_keys"));
        json_array_append_new(keys, json_string(line));
        json_object_set_new(ssh, "authorized_keys", keys);
    }
}

/* What the user asked to run, into spec: "command" and "working_dir" when
 * set, the user's env beside the platform's (whose names the API reserves),
 * and "secret_env", the names the agent must never echo. Only members that
 * are set go in: an agent from before them refuses one it does not know. */
static void spec_add_run(json_t *spec, const struct instance_run *run)
{
    json_t *command = run->command ? json_loads(run->command, 0, NULL) : NULL;
    if (json_array_size(command) > 0)
        json_object_set(spec, "command", command);
    json_decref(command);
    if (run->working_dir[0])
        json_object_set_new(spec, "working_dir", json_string(run->working_dir));
    json_t *env = json_object_get(spec, "env"), *user = json_loads(run->env ? run->env : "[]", 0, NULL);
    json_t *secret = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(user, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *value = json_string_value(json_object_get(e, "value"));
        if (!name || !value || json_object_get(env, name))
            continue;
        json_object_set_new(env, name, json_string(value));
        if (json_is_true(json_object_get(e, "secret")))
            json_array_append_new(secret, json_string(name));
    }
    if (json_array_size(secret) > 0)
        json_object_set(spec, "secret_env", secret);
    json_decref(secret);
    json_decref(user);
}

/* The spec put to node rank r: image, cards, volume and the environment a
 * distributed job needs. */
static char *workload_spec(const struct spec_inputs *si, const struct work *w, size_t r)
{
    char num[32], port[16];
    json_t *cards = json_loads(w->nodes[r].cards, 0, NULL);
    json_t *env = json_object();
    snprintf(num, sizeof num, "%lld", (long long)w->nodes[r].rank);
    json_object_set_new(env, "NODE_RANK", json_string(num));
    json_object_set_new(env, "GPURENT_NODE_RANK", json_string(num));
    snprintf(num, sizeof num, "%zu", w->n_nodes);
    json_object_set_new(env, "NNODES", json_string(num));
    json_object_set_new(env, "GPURENT_NODE_COUNT", json_string(num));
    snprintf(num, sizeof num, "%zu", cards ? json_array_size(cards) : 0);
    json_object_set_new(env, "GPURENT_CARDS_PER_NODE", json_string(num));
    snprintf(port, sizeof port, "%lld", (long long)daemon_config->master_port);
    json_object_set_new(env, "MASTER_PORT", json_string(port));
    json_object_set_new(env, "GPURENT_INSTANCE_ID", json_string(w->in.id));
    gang_env(env, w, &si->key, cards ? json_array_size(cards) : 0);
    /* size_gb travels with the volume so a node's mount can enforce the
     * quota (AGENT_PROTOCOL.md); the volumes API and volume_default_size_gb
     * keep it within 1..1048576, the range agents accept. */
    json_t *spec = json_pack("{s:s, s:o, s:s, s:[{s:s, s:s, s:I}], s:o}", "image", w->in.image, "gpus",
                             cards ? cards : json_array(), "stack", si->stack, "volumes", "source", si->source,
                             "target", "/shared", "size_gb", (json_int_t)si->size_gb, "env", env);
    /* The login of rank r is "<instance id>-<rank>" (AGENT_PROTOCOL.md):
     * unique on a node, and what the connect details show. Only a node
     * whose facts report an SSH server gets it: an agent from before SSH
     * refuses a spec member it does not know. */
    char user[ID_MAX + 24];
    snprintf(user, sizeof user, "%s-%lld", w->in.id, (long long)w->nodes[r].rank);
    if (spec && w->nodes[r].ssh_port > 0)
        json_object_set_new(spec, "ssh", json_pack("{s:s, s:O}", "user", user, "authorized_keys", si->ssh_keys));
    /* Published ports only when placement gave some: an agent from before
     * them refuses a spec member it does not know. */
    json_t *ports = json_loads(w->nodes[r].ports, 0, NULL);
    if (spec && json_array_size(ports) > 0)
        json_object_set_new(spec, "ports", json_incref(ports));
    json_decref(ports);
    if (spec) {
        spec_add_run(spec, &si->run);
        gang_spec(spec, si, w, r);
    }
    /* Rank 0 serves an app replica's port (store_app_gateway_json). */
    if (spec && si->health_port > 0 && w->nodes[r].rank == 0)
        json_object_set_new(spec, "health", json_pack("{s:I, s:s, s:i}", "port", (json_int_t)si->health_port, "path",
                                                      si->health_path, "interval_s", APP_HEALTH_INTERVAL_S));
    char *text = spec ? json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(spec);
    return text;
}

#define RANK_RUNNING 3 /* phase_rank("running"), past every provisioning phase */

static int phase_rank(const char *phase)
{
    static const char *const order[] = {"pulling", "mounting", "starting", "running"};
    for (int i = 0; i < 4; i++)
        if (strcmp(phase, order[i]) == 0)
            return i;
    return -1;
}

/* The length of s cut to at most max bytes on a character boundary. An
 * agent's text is cut with it wherever it does not fit (the copies here,
 * the "%.*s" of every reason that quotes it): a reason cut inside a
 * character is not UTF-8, and jansson refuses to put it in a reply. */
static size_t utf8_cut(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n <= max)
        return n;
    while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80)
        max--;
    return max;
}

/* Reads phase and message from a workload document (NULL: neither). */
static void read_phase(json_t *j, char *phase, size_t pn, char *message, size_t mn)
{
    const char *p = json_string_value(json_object_get(j, "phase"));
    const char *m = json_string_value(json_object_get(j, "message"));
    p = p ? p : "", m = m ? m : "";
    snprintf(phase, pn, "%.*s", (int)utf8_cut(p, pn - 1), p);
    snprintf(message, mn, "%.*s", (int)utf8_cut(m, mn - 1), m);
}

/* The most bytes of last lines a reason carries: the newest that fit. */
#define LAST_LINES_BYTES 640

/* The agent's "last_lines" of an ended workload (AGENT_PROTOCOL.md) joined
 * as "a | b | c", the newest lines that fit in LAST_LINES_BYTES, each cut
 * to 200 bytes; NULL when there are none. */
static char *join_last_lines(json_t *lines)
{
    size_t n = json_array_size(lines), first = n, total = 0;
    while (first > 0) {
        const char *t = json_string_value(json_array_get(lines, first - 1));
        size_t len = t ? utf8_cut(t, 200) + 3 : 0;
        if (total + len > LAST_LINES_BYTES)
            break;
        total += len;
        first--;
    }
    if (first == n)
        return NULL;
    char *out = malloc(total + 1);
    size_t o = 0;
    for (size_t i = first; out && i < n; i++) {
        const char *t = json_string_value(json_array_get(lines, i));
        if (!t)
            continue;
        if (o)
            memcpy(out + o, " | ", 3), o += 3;
        size_t len = utf8_cut(t, 200);
        memcpy(out + o, t, len);
        o += len;
    }
    if (out)
        out[o] = 0;
    return out;
}

/* An ended workload's status and last lines, from its JSON object. */
static void read_end(json_t *wl, int *known, int *code, char **last)
{
    json_t *c = json_object_get(wl, "exit_code");
    *known = json_is_integer(c);
    *code = *known ? (int)json_integer_value(c) : 0;
    *last = join_last_lines(json_object_get(wl, "last_lines"));
}

/* ------------------------------------------------------------ deciding calls */

static int holding(const struct instance *in)
{
    static const char *const states[] = {"pending", "provisioning", "running", "stopping"};
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        if (strcmp(in->state, states[i]) == 0)
            return 1;
    return 0;
}

/* Whether every node of the instance answers its heartbeats. */
static int all_nodes_up(const struct work *w)
{
    for (size_t r = 0; r < w->n_nodes; r++)
        if (strcmp(w->nodes[r].node_health, "up") != 0)
            return 0;
    return 1;
}

static void plan_calls(struct store *s, struct work *w, int64_t now, const struct agent_client_opts *opts)
{
    struct spec_inputs si = {.ssh_keys = NULL};
    int have_si = 0;
    const struct instance *in = &w->in;
    int winding_down = strcmp(in->desired, "running") != 0 && holding(in);
    int provisioning = !winding_down && (strcmp(in->state, "pending") == 0 || strcmp(in->state, "provisioning") == 0);
    /* An unreachable instance whose nodes all answer again: is its work
     * still running? */
    int recovering = !winding_down && strcmp(in->state, "unreachable") == 0 && all_nodes_up(w);
    /* A running app replica's health is read every pass, not only at the
     * sweep, so one that fails its check loses its traffic within a
     * pass or two of its agent noticing (0027). */
    int running = !winding_down && strcmp(in->state, "running") == 0;
    if (provisioning && now < in->next_attempt_at)
        return;
    /* About to put the workloads of a pending instance (a create's, a
     * retry's or a restart's once its backoff is over): none goes on a card
     * that failed since it was placed. The pass's transaction places it
     * again (apply_unfit). */
    if (provisioning && strcmp(in->state, "pending") == 0) {
        struct placement_unfit u;
        if (store_instance_failed_card(s, in->id, &u) != STORE_OK)
            return; /* the next pass tries again */
        if (u.failed_card >= 0) {
            w->unfit = 1;
            return;
        }
    }
    for (size_t r = 0; r < w->n_nodes; r++) {
        struct instance_node *p = &w->nodes[r];
        if (strcmp(p->node_health, "up") != 0)
            continue; /* decided in apply: lost, failed attempt, or nothing to delete */
        char path[96];
        snprintf(path, sizeof path, "/v1/workloads/%s", p->workload_id);
        if (winding_down) {
            w->call[r] = agent_call_new(p->agent_url, p->secret, "DELETE", path, NULL, opts);
            w->kind[r] = CALL_DELETE;
        } else if (provisioning && !p->put_done) {
            if (!have_si && spec_inputs_get(s, in, &si) == 0)
                have_si = 1;
            char *spec = have_si ? workload_spec(&si, w, r) : NULL;
            if (spec)
                w->call[r] = agent_call_new(p->agent_url, p->secret, "PUT", path, spec, opts);
            if (spec && si.key.priv[0]) /* it carries the instance's private key */
                secret_wipe(spec, strlen(spec));
            free(spec);
            w->kind[r] = CALL_PUT;
        } else if (provisioning || recovering || (running && p->health_check)) {
            w->call[r] = agent_call_new(p->agent_url, p->secret, "GET", path, NULL, opts);
            w->kind[r] = CALL_GET;
        }
        /* How many round trips an instance costs (issue 15), by method. */
        if (w->call[r])
            metrics_reconcile_call(w->kind[r] == CALL_PUT ? 0 : w->kind[r] == CALL_GET ? 1 : 2);
    }
    spec_inputs_free(&si);
}

/* ------------------------------------------------------------ applying results */

struct apply_ctx {
    struct work *w;          /* the instance and its call results */
    int64_t now;             /* pass time */
    const struct seen *seen; /* workloads of the nodes listed this pass, sorted by id */
    size_t n_seen;           /* entries in seen */
    char (*listed)[ID_MAX];  /* the nodes whose lists came back, sorted */
    size_t n_listed;         /* entries in listed */
    int queued_deletes;      /* out: workloads to delete next pass */
    int progress;            /* out: an agent reported something new */
};

static const struct seen *find_seen(const struct apply_ctx *ctx, const char *id)
{
    size_t lo = 0, hi = ctx->n_seen;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(ctx->seen[mid].workload_id, id);
        if (c == 0)
            return &ctx->seen[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int id_cmp(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* Whether this pass has node_id's list of workloads. */
static int was_listed(const struct apply_ctx *ctx, const char *node_id)
{
    return ctx->n_listed && bsearch(node_id, ctx->listed, ctx->n_listed, ID_MAX, id_cmp);
}

static void queue_all_deletes(struct apply_ctx *ctx)
{
    for (size_t r = 0; r < ctx->w->n_nodes; r++)
        queue_delete(&ctx->w->nodes[r]);
    ctx->queued_deletes = 1;
}

/* Ends the instance's run: billing stops at `at` (what was charged past it
 * is refunded), cards are released, its workloads are deleted, and it
 * enters state. */
static int end_run(struct store *s, struct apply_ctx *ctx, const char *state, int64_t at, const char *reason)
{
    int rc;
    if ((rc = ledger_close_interval(s, ctx->w->in.id, at, reason, ctx->now)) != STORE_OK ||
        (rc = store_instance_release(s, ctx->w->in.id)) != STORE_OK)
        return rc;
    queue_all_deletes(ctx);
    return store_instance_set_state(s, ctx->w->in.id, state, "", reason, ctx->now);
}

/* A provisioning attempt failed: retry on fresh cards after a backoff, or
 * give up after provision_max_attempts. */
static int attempt_failed(struct store *s, struct apply_ctx *ctx, const char *reason)
{
    struct instance *in = &ctx->w->in;
    int64_t attempts = in->attempts + 1;
    char why[512];
    int rc;
    if (attempts >= daemon_config->provision_max_attempts) {
        snprintf(why, sizeof why, "gave up after %lld attempts: %.*s", (long long)attempts, (int)utf8_cut(reason, 200),
                 reason);
        if ((rc = store_instance_set_attempts(s, in->id, attempts, 0)) != STORE_OK)
            return rc;
        return end_run(s, ctx, "failed", ctx->now, why);
    }
    if ((rc = store_instance_release(s, in->id)) != STORE_OK ||
        (rc = store_instance_set_rendezvous(s, in->id, 0)) != STORE_OK)
        return rc;
    queue_all_deletes(ctx);
    struct op_outcome o = {0};
    rc = instance_place(s, in, &o);
    json_decref(o.extra);
    if (rc == REFUSED) {
        snprintf(why, sizeof why, "%.*s; no cards to retry on: %.*s", (int)utf8_cut(reason, 120), reason,
                 (int)utf8_cut(o.message, 120), o.message);
        if ((rc = store_instance_set_attempts(s, in->id, attempts, 0)) != STORE_OK)
            return rc;
        return store_instance_set_state(s, in->id, "failed", "", why, ctx->now);
    }
    if (rc != STORE_OK)
        return rc;
    int64_t backoff = 10;
    for (int64_t i = 1; i < attempts && backoff < 300; i++)
        backoff *= 2;
    if ((rc = store_instance_set_attempts(s, in->id, attempts, ctx->now + (backoff > 300 ? 300 : backoff))) != STORE_OK)
        return rc;
    snprintf(why, sizeof why, "attempt %lld failed, retrying on other cards: %.*s", (long long)attempts,
             (int)utf8_cut(reason, 200), reason);
    return store_instance_set_state(s, in->id, "pending", "", why, ctx->now);
}

/* ------------------------------------------------------------ placing again */

/* What keeps u's placement from new workloads, into why; *must when a card
 * it holds failed (a node set aside or silent is only better left).
 * Returns whether anything does. */
static int unfit_why(const struct placement_unfit *u, char *why, size_t n, int *must)
{
    *must = u->failed_card >= 0;
    if (*must)
        snprintf(why, n, "card %lld of node %s failed", (long long)u->failed_card, u->failed_node);
    else if (u->aside_node[0])
        snprintf(why, n, "node %s is %s", u->aside_node, u->aside_state);
    else
        return 0;
    return 1;
}

/* Where the instance is placed now, for an event: "node a-01 cards [0,2]",
 * or "nodes b-01, b-02" for a gang. */
static int placed_on(struct store *s, const char *id, char *out, size_t n)
{
    struct instance_node *nodes = calloc(PLACEMENT_MAX_NODES, sizeof *nodes);
    size_t k = 0;
    if (!nodes)
        return STORE_ERROR;
    int rc = store_instance_nodes(s, id, nodes, PLACEMENT_MAX_NODES, &k);
    if (rc == STORE_OK && k == 1) {
        snprintf(out, n, "node %s cards %s", nodes[0].node_name, nodes[0].cards);
    } else if (rc == STORE_OK) {
        size_t len = (size_t)snprintf(out, n, "nodes");
        for (size_t i = 0; i < k && len < n; i++)
            len += (size_t)snprintf(out + len, n - len, "%s %s", i ? "," : "", nodes[i].node_name);
    }
    free(nodes);
    return rc;
}

struct place_again {
    const struct instance *in; /* the instance */
    const char *prefer;        /* the node it was on, tried first; NULL for a gang */
    struct op_outcome o;       /* out: why it was refused */
};

static int place_again_part(struct store *s, void *vctx)
{
    struct place_again *pa = vctx;
    int rc;
    if ((rc = store_instance_release(s, pa->in->id)) != STORE_OK ||
        (rc = store_instance_set_rendezvous(s, pa->in->id, 0)) != STORE_OK)
        return rc;
    return instance_place_near(s, pa->in, pa->prefer, &pa->o);
}

/* Places the instance afresh, none of its new workloads put yet: on the
 * node it was on while that takes new work and has room there, else
 * wherever placement finds room (a gang as a whole), as a create would.
 * In a savepoint of its own: refused (REFUSED, o->message says why, and
 * o->extra is the caller's), its placement stays as it was. */
static int place_again(struct store *s, const struct work *w, struct op_outcome *o)
{
    struct place_again pa = {&w->in, w->n_nodes == 1 ? w->nodes[0].node_id : NULL, {0}};
    int rc;
    if (store_part(s, place_again_part, &pa, &rc) < 0)
        rc = STORE_ERROR; /* the savepoint failed: the whole transaction gives up */
    *o = pa.o;
    return rc;
}

/* Nothing can run the instance now (no card left for it): it ends failed
 * and settled (desired stopped), as a job that ended is, its cards freed and
 * its workloads' deletes queued already, so nothing tries to run it until
 * its owner starts it again; that start is refused, as a create is, while
 * there is still no room. Billing ended with its last run. */
static int end_unplaced(struct store *s, struct apply_ctx *ctx, const char *reason)
{
    const char *id = ctx->w->in.id;
    int rc;
    log_info("reconciler: instance %s: %s", id, reason);
    ctx->progress = 1;
    if ((rc = store_instance_set_desired(s, id, "stopped", ctx->now)) != STORE_OK ||
        (rc = store_instance_release(s, id)) != STORE_OK || (rc = store_instance_set_attempts(s, id, 0, 0)) != STORE_OK)
        return rc;
    return store_instance_set_state(s, id, "failed", "", reason, ctx->now);
}

/* plan_calls put nothing: a card the pending instance holds failed since
 * it was placed (during a restart's or a retry's backoff, or right after
 * its create or start). It is placed again before anything is put, not a
 * failed attempt since nothing ran; with no room anywhere it ends
 * (end_unplaced). */
static int apply_unfit(struct store *s, struct apply_ctx *ctx)
{
    struct work *w = ctx->w;
    struct placement_unfit u;
    char unfit[160], where[400], reason[1024];
    int must, rc;
    ctx->progress = 1;
    if ((rc = store_instance_unfit(s, w->in.id, &u)) != STORE_OK)
        return rc;
    if (!unfit_why(&u, unfit, sizeof unfit, &must) || !must)
        return STORE_OK; /* repaired since the pass read it: put next pass */
    /* A put of an earlier pass whose answer was lost may have reached its agent. */
    queue_all_deletes(ctx);
    struct op_outcome o = {0};
    rc = place_again(s, w, &o);
    json_decref(o.extra);
    if (rc == REFUSED) {
        snprintf(reason, sizeof reason, "no cards to run on: %s before its workloads were put, and %.*s", unfit,
                 (int)utf8_cut(o.message, 600), o.message);
        return end_unplaced(s, ctx, reason);
    }
    if (rc != STORE_OK || (rc = placed_on(s, w->in.id, where, sizeof where)) != STORE_OK)
        return rc;
    snprintf(reason, sizeof reason, "%s before its workloads were put: placed again on %s", unfit, where);
    log_info("reconciler: instance %s: %s", w->in.id, reason);
    /* An event even though the state stays pending (set_state writes none). */
    if ((rc = store_instance_event(s, w->in.id, ctx->now, "pending", reason)) != STORE_OK)
        return rc;
    return store_instance_set_state(s, w->in.id, "pending", "", reason, ctx->now);
}

/* ------------------------------------------------------------ jobs */

/* Appends "; last lines: ..." to why (cap bytes) when there are some. */
static void add_last_lines(char *why, size_t cap, const char *last)
{
    size_t len = strlen(why);
    if (last && len + 20 < cap)
        snprintf(why + len, cap - len, "; last lines: %.*s", (int)utf8_cut(last, cap - len - 16), last);
}

static int restart_after_backoff(struct store *s, struct apply_ctx *ctx, int64_t at, const char *why,
                                 const char *moved);

/* The restart policy brings the run back after its exit at `at`: billing
 * stops there, the workloads are deleted, and after a backoff
 * (restart_after_backoff) every rank is put again under a fresh workload
 * id; unbilled until every node runs again. A restart is new work, so it
 * goes where new work may: on the same cards while they can take it;
 * placed again (place_again) when a card of them failed or a node of them
 * was set aside or went silent; and when a card failed and nothing else
 * has room, not at all (the job ends failed, end_unplaced). A node set
 * aside or silent with no room elsewhere keeps it, as it keeps a running
 * instance. A user's stop meanwhile wins: the instance is pending, so it
 * winds down and never restarts. */
static int restart_run(struct store *s, struct apply_ctx *ctx, int64_t at, const char *why)
{
    struct work *w = ctx->w;
    const struct instance *in = &w->in;
    int rc;
    if ((rc = ledger_close_interval(s, in->id, at, why, ctx->now)) != STORE_OK)
        return rc;
    queue_all_deletes(ctx);
    struct placement_unfit u;
    char unfit[160];
    int must;
    if ((rc = store_instance_unfit(s, in->id, &u)) != STORE_OK)
        return rc;
    if (unfit_why(&u, unfit, sizeof unfit, &must)) {
        struct op_outcome o = {0};
        rc = place_again(s, w, &o);
        json_decref(o.extra);
        if (rc == STORE_OK) {
            char where[400], moved[600];
            if ((rc = placed_on(s, in->id, where, sizeof where)) != STORE_OK)
                return rc;
            snprintf(moved, sizeof moved, " on %s, as %s", where, unfit);
            return restart_after_backoff(s, ctx, at, why, moved);
        }
        if (rc != REFUSED)
            return rc;
        if (must) {
            char reason[1024];
            snprintf(reason, sizeof reason,
                     "no cards to restart on (restart_policy %s): %s, and %.*s; the run ended: %.*s",
                     in->restart_policy, unfit, (int)utf8_cut(o.message, 300), o.message, (int)utf8_cut(why, 500), why);
            return end_unplaced(s, ctx, reason);
        }
    }
    for (size_t r = 0; r < w->n_nodes; r++) {
        char wl[ID_MAX];
        if (id_new_ordered("wl", wl) < 0)
            return STORE_ERROR;
        if ((rc = store_instance_node_renew(s, in->id, w->nodes[r].rank, wl)) != STORE_OK)
            return rc;
    }
    return restart_after_backoff(s, ctx, at, why, "");
}

/* The restart's count, backoff and event, once the run that ended at `at`
 * is billed and its next placement made (moved: where to, when it moved,
 * else ""): the instance is pending until the backoff (10 s, doubling per
 * restart up to 300 s, back to 10 s after a run of ten minutes or more) is
 * over. */
static int restart_after_backoff(struct store *s, struct apply_ctx *ctx, int64_t at, const char *why, const char *moved)
{
    const struct instance *in = &ctx->w->in;
    int rc;
    int long_run = strcmp(in->state, "running") == 0 && at - in->state_since >= 600;
    int64_t backoff = in->restart_backoff_s <= 0 || long_run ? 10
                      : in->restart_backoff_s >= 150         ? 300
                                                             : in->restart_backoff_s * 2;
    int64_t count = in->restart_count + 1;
    char reason[1024];
    snprintf(reason, sizeof reason, "restart %lld in %llds (restart_policy %s)%.*s: %.*s", (long long)count,
             (long long)backoff, in->restart_policy, (int)utf8_cut(moved, 300), moved, (int)utf8_cut(why, 600), why);
    if ((rc = store_instance_set_restarts(s, in->id, count, backoff)) != STORE_OK ||
        (rc = store_instance_set_ranks_exited(s, in->id, 0)) != STORE_OK ||
        (rc = store_instance_set_attempts(s, in->id, 0, ctx->now + backoff)) != STORE_OK)
        return rc;
    ctx->progress = 1;
    log_info("reconciler: instance %s: %s", in->id, reason);
    /* Every restart is an event, even from pending (where the state does
     * not change and set_state writes none). */
    if (strcmp(in->state, "pending") == 0 &&
        (rc = store_instance_event(s, in->id, ctx->now, "pending", reason)) != STORE_OK)
        return rc;
    return store_instance_set_state(s, in->id, "pending", "", reason, ctx->now);
}

/* The job's main process ended (ok: with status 0 on every rank), billed to
 * `at`: restarted if its policy says so; else the instance ends succeeded
 * or failed, its cards freed, its volume kept, and settled (desired
 * stopped) so nothing tries to run it again until its owner starts it. */
static int job_over(struct store *s, struct apply_ctx *ctx, int ok, int64_t at, int known, int64_t code,
                    const char *why)
{
    const struct instance *in = &ctx->w->in;
    int rc;
    if ((rc = store_instance_set_exit(s, in->id, known, code)) != STORE_OK)
        return rc;
    if (strcmp(in->restart_policy, "always") == 0 || (strcmp(in->restart_policy, "on_failure") == 0 && !ok))
        return restart_run(s, ctx, at, why);
    if ((rc = store_instance_set_desired(s, in->id, "stopped", ctx->now)) != STORE_OK)
        return rc;
    return end_run(s, ctx, ok ? "succeeded" : "failed", at, why);
}

/* A node of the instance was lost (silent or refused for node_lost_after_s):
 * the run ends at its last good beat. A job whose restart_policy brings it
 * back after a failure is placed again on fresh cards, as a failed exit
 * would be restarted (a training job resumes from its checkpoint on
 * /shared); anything else, or a job with no cards left to run on, ends lost. */
static int lost_run(struct store *s, struct apply_ctx *ctx, int64_t at, const char *why)
{
    const struct instance *in = &ctx->w->in;
    if (strcmp(in->desired, "running") != 0 ||
        (strcmp(in->restart_policy, "always") != 0 && strcmp(in->restart_policy, "on_failure") != 0))
        return end_run(s, ctx, "lost", at, why);
    int rc;
    if ((rc = ledger_close_interval(s, in->id, at, why, ctx->now)) != STORE_OK ||
        (rc = store_instance_release(s, in->id)) != STORE_OK ||
        (rc = store_instance_set_rendezvous(s, in->id, 0)) != STORE_OK)
        return rc;
    queue_all_deletes(ctx);
    struct op_outcome o = {0};
    rc = instance_place(s, in, &o);
    if (rc == REFUSED) {
        char reason[1024];
        snprintf(reason, sizeof reason, "%.*s; no cards to restart it on: %.*s", (int)utf8_cut(why, 600), why,
                 (int)utf8_cut(o.message, 300), o.message);
        json_decref(o.extra);
        return store_instance_set_state(s, in->id, "lost", "", reason, ctx->now);
    }
    json_decref(o.extra);
    return rc != STORE_OK ? rc : restart_after_backoff(s, ctx, at, why, "");
}

/* The end of the current run under max_runtime_minutes, or 0 when
 * unbounded or not yet running; *warn_at gets when max_runtime_warning is due. */
static int64_t runtime_end(const struct instance *in, int64_t *warn_at)
{
    if (in->max_runtime_minutes <= 0 || in->run_started_at <= 0)
        return 0;
    int64_t total = in->max_runtime_minutes * 60, warn = daemon_config->max_runtime_warning_minutes * 60;
    if (warn > total / 2)
        warn = total / 2;
    *warn_at = in->run_started_at + total - warn;
    return in->run_started_at + total;
}

/* Whether max_runtime_minutes has something to do this pass. */
static int runtime_due(const struct instance *in, int64_t now)
{
    int64_t warn_at, end = runtime_end(in, &warn_at);
    return end && (now >= end || (!in->runtime_warned_at && now >= warn_at));
}

/* max_runtime_minutes: the warning event once, then the stop at the end
 * (billed to that second, the volume kept); *stopped says it stopped. */
static int apply_runtime(struct store *s, struct apply_ctx *ctx, int *stopped)
{
    const struct instance *in = &ctx->w->in;
    int64_t warn_at, end = runtime_end(in, &warn_at);
    char why[256];
    int rc;
    *stopped = 0;
    if (!end)
        return STORE_OK;
    if (ctx->now >= end) {
        *stopped = 1;
        snprintf(why, sizeof why, "max_runtime_minutes reached: stopped after %lld minutes (the run began at %lld)",
                 (long long)in->max_runtime_minutes, (long long)in->run_started_at);
        log_info("reconciler: instance %s: %s", in->id, why);
        if ((rc = store_instance_set_desired(s, in->id, "stopped", ctx->now)) != STORE_OK ||
            (rc = ledger_close_interval(s, in->id, end, why, ctx->now)) != STORE_OK)
            return rc;
        ctx->progress = 1;
        return store_instance_set_state(s, in->id, "stopping", "", why, ctx->now);
    }
    if (!in->runtime_warned_at && ctx->now >= warn_at) {
        snprintf(why, sizeof why, "max_runtime_minutes is %lld: the instance will be stopped in %lld seconds",
                 (long long)in->max_runtime_minutes, (long long)(end - ctx->now));
        if ((rc = store_instance_set_run_clock(s, in->id, in->run_started_at, ctx->now)) != STORE_OK)
            return rc;
        return store_instance_event(s, in->id, ctx->now, "max_runtime_warning", why);
    }
    return STORE_OK;
}

/* Gang start: once one rank of a multi-node instance runs, the others have
 * rendezvous_timeout_s to follow, or the attempt fails (every rank is then
 * deleted and the instance placed afresh): a job waiting at its barrier for
 * a rank stuck pulling would otherwise hold every card for
 * provision_timeout_s. The first running rank's second is kept in the
 * instance (rendezvous_since), so a restart of the daemon keeps counting. */
static int rendezvous_check(struct store *s, struct apply_ctx *ctx, char *failure, size_t n)
{
    struct work *w = ctx->w;
    size_t running = 0;
    for (size_t r = 0; r < w->n_nodes; r++)
        running += phase_rank(w->nodes[r].phase) == RANK_RUNNING;
    if (w->n_nodes < 2 || running == 0)
        return STORE_OK;
    struct instance_gang g;
    int rc = store_instance_gang(s, w->in.id, &g);
    if (rc != STORE_OK)
        return rc;
    if (g.rendezvous_since <= 0)
        return store_instance_set_rendezvous(s, w->in.id, ctx->now);
    if (ctx->now - g.rendezvous_since > g.rendezvous_timeout_s)
        snprintf(failure, n, "only %zu of %zu nodes were running %llds after the first (rendezvous_timeout_s)",
                 running, w->n_nodes, (long long)g.rendezvous_timeout_s);
    return STORE_OK;
}

/* A PUT refused because a card is held: whether the holder the agent names
 * is a workload no instance owns (left on a node that was lost and came
 * back before the sweep deleted it). Then its delete is queued, and the
 * cards free up as it goes. */
static int forgotten_holder(struct store *s, const struct instance_node *p, struct agent_call *c)
{
    json_t *doc = agent_call_json(c);
    const char *holder = json_string_value(json_object_get(json_object_get(doc, "error"), "holder"));
    if (!holder || !holder[0] || strlen(holder) >= sizeof p->workload_id || store_workload_placed(s, holder) != 0)
        return 0;
    /* Each pass that meets it again (its PUT may reach the agent before
     * the DELETE does) asks for the delete once. */
    if (!delete_queued(p->agent_url, holder)) {
        log_info("reconciler: node %s: card held by workload %s, which no instance owns: deleting it", p->node_name,
                 holder);
        queue_delete_try(p->agent_url, p->secret, holder, 0);
    }
    return 1;
}

static int apply_provisioning(struct store *s, struct apply_ctx *ctx)
{
    struct work *w = ctx->w;
    char failure[256] = "", exited[320] = "";
    /* Of the ranks that exited: the one to report (the first with a bad
     * status, else the first), its status and last lines. */
    int exit_bad = 0, exit_known = 0, exit_code = 0;
    char *exit_last = NULL;
    int all_running = w->n_nodes > 0, any_put = 0, slowest = RANK_RUNNING + 1;
    char slowest_phase[16] = "";
    for (size_t r = 0; r < w->n_nodes; r++) {
        struct instance_node *p = &w->nodes[r];
        struct agent_call *c = w->call[r];
        if (strcmp(p->node_health, "up") != 0) {
            snprintf(failure, sizeof failure, "node %s is %s", p->node_name, p->node_health);
            break;
        }
        if (c && !c->error[0]) {
            if (c->status == 200 || c->status == 201) {
                char was[sizeof p->phase];
                snprintf(was, sizeof was, "%s", p->phase);
                read_phase(agent_call_json(c), p->phase, sizeof p->phase, p->message, sizeof p->message);
                ctx->progress |= !p->put_done || strcmp(was, p->phase) != 0;
                p->put_done = 1;
            } else if (w->kind[r] == CALL_GET && c->status == 404) {
                p->put_done = 0; /* the agent forgot it: put it again */
                snprintf(p->phase, sizeof p->phase, "%s", "");
            } else if (c->status == 409 && (c->retry_after || forgotten_holder(s, p, c)) &&
                       ctx->now - w->in.state_since <= daemon_config->provision_timeout_s) {
                /* Its cards are still held by a workload the agent is
                 * removing (one that ended here before its removal did), or
                 * by one no instance owns any more (its node was lost and
                 * came back), now being deleted: put it again next pass,
                 * which is no failed attempt. */
            } else {
                snprintf(failure, sizeof failure, "node %s refused the workload (HTTP %ld)", p->node_name, c->status);
            }
        }
        if (strcmp(p->phase, "failed") == 0)
            snprintf(failure, sizeof failure, "node %s: workload failed: %.*s", p->node_name,
                     (int)utf8_cut(p->message, 160), p->message);
        else if (strcmp(p->phase, "exited") == 0 && !exit_bad) {
            int known = 0, code = 0;
            char *last = NULL;
            read_end(c && !c->error[0] ? agent_call_json(c) : NULL, &known, &code, &last);
            if (!exited[0] || !known || code != 0) {
                exit_bad = !known || code != 0;
                exit_known = known;
                exit_code = code;
                free(exit_last);
                exit_last = last;
                last = NULL;
                snprintf(exited, sizeof exited, "node %s: workload exited before every node was seen running: %.*s",
                         p->node_name, (int)utf8_cut(p->message, 160), p->message);
            }
            free(last);
        }
        any_put |= p->put_done;
        int pr = phase_rank(p->phase);
        all_running &= pr == RANK_RUNNING;
        if (pr >= 0 && pr < slowest) {
            slowest = pr;
            snprintf(slowest_phase, sizeof slowest_phase, "%s", p->phase);
        }
        int rc = store_instance_node_update(s, w->in.id, p->rank, p->phase, p->message, p->put_done);
        if (rc != STORE_OK && rc != STORE_NOT_FOUND) {
            free(exit_last);
            return rc;
        }
    }
    /* Accepted: provisioning, even when the same answers already say the
     * workloads run or failed (a PUT that waited for its workload,
     * agent_put_wait_ms), so that every attempt shows in the events as one
     * seen over two passes does. */
    if (any_put && strcmp(w->in.state, "pending") == 0) {
        const char *why = "the agents accepted the workload";
        /* Already running everywhere: the row goes from pending to running
         * in the one write below (each write of it rewrites the indexes that
         * name its state), and only the provisioning event is recorded.
         * Otherwise the row takes the slowest node's phase while it
         * provisions, so that the write below has nothing left to change. */
        int straight_to_running = all_running && !failure[0] && !exited[0];
        int rc = straight_to_running
                     ? store_instance_event(s, w->in.id, ctx->now, "provisioning", why)
                     : store_instance_set_state(s, w->in.id, "provisioning",
                                                slowest < RANK_RUNNING ? slowest_phase : "pulling", why, ctx->now);
        if (rc != STORE_OK) {
            free(exit_last);
            return rc;
        }
        snprintf(w->in.state, sizeof w->in.state, "provisioning");
        snprintf(w->in.state_reason, sizeof w->in.state_reason, "%s", why);
        w->in.state_since = ctx->now;
    }
    if (!failure[0] && ctx->now - w->in.state_since > daemon_config->provision_timeout_s &&
        strcmp(w->in.state, "provisioning") == 0)
        snprintf(failure, sizeof failure, "provisioning took longer than %llds",
                 (long long)daemon_config->provision_timeout_s);
    if (!failure[0] && !all_running) {
        int rc = rendezvous_check(s, ctx, failure, sizeof failure);
        if (rc != STORE_OK) {
            free(exit_last);
            return rc;
        }
    }
    if (failure[0]) {
        free(exit_last);
        return attempt_failed(s, ctx, failure);
    }
    /* A job that ran and ended before the pass saw every node running is
     * over, not a failed attempt: trying it again would run it twice (its
     * restart policy may run it again). It is billed as every run is, from
     * when the control plane saw all its nodes running, which here it
     * never did. */
    if (exited[0]) {
        char why[1024];
        snprintf(why, sizeof why, "%s", exited);
        add_last_lines(why, sizeof why, exit_last);
        free(exit_last);
        return job_over(s, ctx, !exit_bad, ctx->now, exit_known, exit_code, why);
    }
    free(exit_last);
    if (all_running) {
        int rc = store_interval_open(s, &w->in, ctx->now);
        if (rc != STORE_OK)
            return rc;
        /* max_runtime_minutes counts from the first time this run is seen
         * running; restarts by the policy keep counting. */
        if (!w->in.run_started_at && (rc = store_instance_set_run_clock(s, w->in.id, ctx->now, 0)) != STORE_OK)
            return rc;
        /* Each write of the row touches its indexes: none that changes nothing. */
        if (((w->in.attempts || w->in.next_attempt_at) &&
             (rc = store_instance_set_attempts(s, w->in.id, 0, 0)) != STORE_OK) ||
            (w->n_nodes > 1 && (rc = store_instance_set_rendezvous(s, w->in.id, 0)) != STORE_OK))
            return rc;
        return store_instance_set_state(s, w->in.id, "running", "", "every node is running", ctx->now);
    }
    if (any_put)
        return store_instance_set_state(s, w->in.id, "provisioning", slowest_phase[0] ? slowest_phase : "pulling",
                                        w->in.state_reason, ctx->now);
    return STORE_OK;
}

/* The node of the instance that stopped answering first: the one with the
 * oldest last good heartbeat among those not up, or NULL if all are up.
 * *offline says whether any node is offline (gone past node_lost_after_s,
 * or never reached). A node whose reports are refused (rejected: its
 * hardware no longer matches its registration, say a card missing after a
 * driver reload) answers, and its workloads may still run: it gets the
 * grace of an unreachable one, node_lost_after_s from its last accepted
 * report. */
static const struct instance_node *silent_node(const struct work *w, int64_t now, int *offline)
{
    const struct instance_node *first = NULL;
    *offline = 0;
    for (size_t r = 0; r < w->n_nodes; r++) {
        const struct instance_node *p = &w->nodes[r];
        if (strcmp(p->node_health, "up") == 0)
            continue;
        if (strcmp(p->node_health, "rejected") == 0)
            *offline |= p->node_last_seen <= now - daemon_config->node_lost_after_s;
        else
            *offline |= strcmp(p->node_health, "unreachable") != 0;
        if (!first || p->node_last_seen < first->node_last_seen)
            first = p;
    }
    return first;
}

/* Why node p is silent, for an instance's state_reason: "node X stopped
 * answering" or what a refused node is. */
static void silence_why(const struct instance_node *p, char *out, size_t n)
{
    if (strcmp(p->node_health, "rejected") == 0)
        snprintf(out, n, "node %s reports hardware that no longer matches its registration", p->node_name);
    else
        snprintf(out, n, "node %s stopped answering", p->node_name);
}

/* The health verdict in rank r's GET answer of this pass (a running app
 * replica's, plan_calls) into out; "" when there is none. */
static void call_health(const struct work *w, size_t r, char *out, size_t n)
{
    struct agent_call *c = w->call[r];
    out[0] = '\0';
    if (!c || w->kind[r] != CALL_GET || c->error[0] || c->status != 200)
        return;
    json_t *j = agent_call_json(c);
    const char *phase = json_string_value(json_object_get(j, "phase"));
    const char *health = json_string_value(json_object_get(j, "health"));
    /* Only a running workload's verdict means anything; an ended one is the
     * sweep's and check_workloads' to handle. */
    if (phase && strcmp(phase, "running") == 0 && health)
        snprintf(out, n, "%.*s", (int)utf8_cut(health, n - 1), health);
}

/* Stores a running rank's new health verdict (0027). For an app replica
 * the gateways' copy lists it only while healthy, and a change to or from
 * healthy is an event on the app, so its publisher sees why a replica
 * stopped (or started) getting traffic. */
static int rank_health(struct store *s, struct apply_ctx *ctx, struct instance_node *p, const char *health)
{
    if (!health[0] || strcmp(health, p->health) == 0)
        return STORE_OK;
    const char *id = ctx->w->in.id;
    int rc = store_instance_node_health(s, id, p->rank, health, ctx->now);
    if (rc != STORE_OK)
        return rc;
    int was_healthy = strcmp(p->health, "healthy") == 0, healthy = strcmp(health, "healthy") == 0;
    log_info("reconciler: instance %s rank %lld on node %s: health %s -> %s", id, (long long)p->rank, p->node_name,
             p->health[0] ? p->health : "none", health);
    snprintf(p->health, sizeof p->health, "%s", health);
    ctx->progress = 1;
    char app_id[ID_MAX], path[256], detail[512];
    int64_t port;
    rc = store_instance_app_check(s, id, app_id, sizeof app_id, &port, path, sizeof path);
    if (rc == STORE_NOT_FOUND || was_healthy == healthy)
        return rc == STORE_NOT_FOUND ? STORE_OK : rc;
    if (healthy)
        snprintf(detail, sizeof detail, "replica %s on node %s passes its health check (GET %s on port %lld)", id,
                 p->node_name, path, (long long)port);
    else
        snprintf(detail, sizeof detail, "replica %s on node %s fails its health check (GET %s on port %lld); it gets no"
                 " calls until it passes", id, p->node_name, path, (long long)port);
    return store_app_event(s, app_id, ctx->now, healthy ? "replica_healthy" : "replica_unhealthy", detail);
}

/* Whether a listed rank's workload (seen, NULL when its node's list lacks
 * it) ends the gang: it failed, vanished or exited with a status other
 * than 0. If so, why, the second it ended by its agent (*at) and its
 * status (*known, *code). */
static int rank_broke(const struct apply_ctx *ctx, const struct instance_node *p, const struct seen *seen, char *why,
                      size_t n, int64_t *at, int *known, int *code)
{
    *at = ctx->now;
    *known = *code = 0;
    if (!seen) {
        snprintf(why, n, "workload vanished from node %s", p->node_name);
        return 1;
    }
    int failed = strcmp(seen->phase, "failed") == 0;
    if (!failed && (strcmp(seen->phase, "exited") != 0 || (seen->exit_known && seen->exit_code == 0)))
        return 0;
    *at = seen->ended_ago >= 0 ? ctx->now - seen->ended_ago : ctx->now;
    *known = seen->exit_known;
    *code = seen->exit_code;
    if (failed)
        snprintf(why, n, "workload failed on node %s: %.*s", p->node_name, (int)utf8_cut(seen->message, 200),
                 seen->message);
    else if (!seen->exit_known)
        snprintf(why, n, "workload exited with an unknown status on node %s", p->node_name);
    else
        snprintf(why, n, "workload exited with status %d on node %s", seen->exit_code, p->node_name);
    add_last_lines(why, n, seen->last);
    return 1;
}

/* An unreachable instance's rank on a node that answers whose workload has
 * broken the gang (rank_broke, its outputs), or -1: the job is then over
 * whatever the silent node comes back with. */
static int broken_answering_rank(const struct apply_ctx *ctx, char *why, size_t n, int64_t *at, int *known, int *code)
{
    for (size_t r = 0; r < ctx->w->n_nodes; r++) {
        const struct instance_node *p = &ctx->w->nodes[r];
        if (strcmp(p->node_health, "up") == 0 && was_listed(ctx, p->node_id) &&
            rank_broke(ctx, p, find_seen(ctx, p->workload_id), why, n, at, known, code))
            return (int)r;
    }
    return -1;
}

/* Checks the listed workloads of a running instance. A rank that failed,
 * vanished or exited with a status other than 0 ends the whole run at
 * once, at the second its agent says it ended (a gang: every rank's
 * workload is deleted). A rank that exited with 0 is marked; when every
 * rank has, the job is over, billed to the last exit. */
static int check_workloads(struct store *s, struct apply_ctx *ctx)
{
    struct work *w = ctx->w;
    size_t done = 0;
    int64_t last_at = w->in.ranks_exited_at;
    const struct seen *last_seen = NULL;
    const char *last_node = "";
    char why[1024];
    for (size_t r = 0; r < w->n_nodes; r++) {
        struct instance_node *p = &w->nodes[r];
        if (!was_listed(ctx, p->node_id)) {
            done += strcmp(p->phase, "exited") == 0; /* seen ending with 0 by an earlier pass */
            continue;
        }
        const struct seen *seen = find_seen(ctx, p->workload_id);
        int64_t at;
        int known, code;
        if (rank_broke(ctx, p, seen, why, sizeof why, &at, &known, &code))
            return job_over(s, ctx, 0, at, known, code, why);
        if (strcmp(seen->phase, "exited") != 0) {
            int rc = rank_health(s, ctx, p, seen->health);
            if (rc != STORE_OK)
                return rc;
            continue;
        }
        done++;
        if (at >= last_at || !last_seen) {
            last_at = at > last_at ? at : last_at;
            last_seen = seen;
            last_node = p->node_name;
        }
        if (strcmp(p->phase, "exited") != 0) {
            int rc = store_instance_node_update(s, w->in.id, p->rank, "exited", seen->message, 1);
            if (rc != STORE_OK)
                return rc;
        }
    }
    if (w->n_nodes == 0 || !last_seen)
        return STORE_OK;
    if (done < w->n_nodes) /* the others still run: remember the latest exit for the bill */
        return last_at > w->in.ranks_exited_at ? store_instance_set_ranks_exited(s, w->in.id, last_at) : STORE_OK;
    if (w->n_nodes == 1)
        snprintf(why, sizeof why, "workload exited with status 0 on node %s", last_node);
    else
        snprintf(why, sizeof why, "workload exited with status 0 on every node, last on %s", last_node);
    add_last_lines(why, sizeof why, last_seen->last);
    return job_over(s, ctx, 1, last_at, 1, 0, why);
}

static int apply_running(struct store *s, struct apply_ctx *ctx)
{
    struct work *w = ctx->w;
    int offline;
    const struct instance_node *silent = silent_node(w, ctx->now, &offline);
    if (silent) {
        /* Billing ends at the silent node's last good heartbeat either way:
         * what ran after it is not known to have run. */
        char why[200], what[160];
        silence_why(silent, what, sizeof what);
        if (offline) {
            snprintf(why, sizeof why, "%s", what);
            return lost_run(s, ctx, silent->node_last_seen, why);
        }
        snprintf(why, sizeof why, "%s; not billed until it answers again", what);
        int rc = ledger_close_interval(s, w->in.id, silent->node_last_seen, "node unreachable", ctx->now);
        return rc != STORE_OK ? rc : store_instance_set_state(s, w->in.id, "unreachable", "", why, ctx->now);
    }
    for (size_t r = 0; r < w->n_nodes; r++) {
        char health[16];
        call_health(w, r, health, sizeof health);
        int rc = rank_health(s, ctx, &w->nodes[r], health);
        if (rc != STORE_OK)
            return rc;
    }
    return check_workloads(s, ctx);
}

/* An unreachable instance: lost once a node is offline, running again once
 * every node answers and every workload was seen running, ended (unbilled)
 * if a workload did not survive. */
static int apply_unreachable(struct store *s, struct apply_ctx *ctx)
{
    struct work *w = ctx->w;
    int offline;
    const struct instance_node *silent = silent_node(w, ctx->now, &offline);
    char why[1024];
    if (offline && strcmp(silent->node_health, "rejected") == 0) {
        snprintf(why, sizeof why, "node %s reported hardware that no longer matches its registration for %llds",
                 silent->node_name, (long long)daemon_config->node_lost_after_s);
        return lost_run(s, ctx, silent->node_last_seen, why);
    }
    if (offline) {
        snprintf(why, sizeof why, "node %s did not answer for %llds", silent->node_name,
                 (long long)daemon_config->node_lost_after_s);
        return lost_run(s, ctx, silent->node_last_seen, why);
    }
    if (silent) {
        /* Still waiting for it, unless a rank on a node that answers has
         * already broken the gang: the job is over whatever the silent node
         * comes back with (its rank is deleted once it answers, as a lost
         * node's is), rather than holding every card till then. */
        int64_t at;
        int known, code;
        char broke[900];
        if (broken_answering_rank(ctx, broke, sizeof broke, &at, &known, &code) < 0)
            return STORE_OK;
        snprintf(why, sizeof why, "%s, while node %s was not answering", broke, silent->node_name);
        return job_over(s, ctx, 0, at, known, code, why);
    }
    for (size_t r = 0; r < w->n_nodes; r++) {
        struct agent_call *c = w->call[r];
        struct instance_node *p = &w->nodes[r];
        if (!c || c->error[0] || (c->status != 200 && c->status != 404))
            return STORE_OK; /* ask again next pass */
        if (c->status == 404) {
            snprintf(why, sizeof why, "workload vanished from node %s while it was unreachable", p->node_name);
            return end_run(s, ctx, "failed", ctx->now, why);
        }
        read_phase(agent_call_json(c), p->phase, sizeof p->phase, p->message, sizeof p->message);
        if (strcmp(p->phase, "running") != 0) {
            /* Ended unbilled: billing stopped at the silence. */
            int known = 0, code = 0;
            char *last = NULL;
            if (strcmp(p->phase, "exited") == 0)
                read_end(agent_call_json(c), &known, &code, &last);
            snprintf(why, sizeof why, "workload %s on node %s while it was unreachable: %.*s", p->phase, p->node_name,
                     (int)utf8_cut(p->message, 160), p->message);
            add_last_lines(why, sizeof why, last);
            free(last);
            return job_over(s, ctx, strcmp(p->phase, "exited") == 0 && known && code == 0, ctx->now, known, code, why);
        }
    }
    ctx->progress = 1;
    int rc = store_interval_open(s, &w->in, ctx->now);
    return rc != STORE_OK
               ? rc
               : store_instance_set_state(s, w->in.id, "running", "",
                                          "every node answers again and the workload kept running", ctx->now);
}

static int apply_wind_down(struct store *s, struct apply_ctx *ctx)
{
    struct work *w = ctx->w;
    for (size_t r = 0; r < w->n_nodes; r++) {
        struct agent_call *c = w->call[r];
        /* An unreachable node may still run the workload: its cards stay
         * held until it answers (and the delete goes through) or is
         * offline, so they are never given to anyone else meanwhile. */
        if (strcmp(w->nodes[r].node_health, "unreachable") == 0)
            return STORE_OK;
        if (strcmp(w->nodes[r].node_health, "up") != 0)
            continue; /* offline: the sweep deletes it when the node returns */
        /* 202: the agent is still stopping it (a container may take its
         * stop_timeout_s): its cards are not free yet. A removal the agent
         * keeps retrying (a runtime that fails it) does not keep the
         * instance stopping for ever: past provision_timeout_s it ends,
         * and the agent still refuses those cards until it is done. */
        if (c && !c->error[0] && c->status == 202 &&
            ctx->now - w->in.state_since > daemon_config->provision_timeout_s) {
            log_warn("reconciler: instance %s: node %s still removing workload %s after %llds; the instance ends,"
                     " its cards stay refused by the agent until the removal is done",
                     w->in.id, w->nodes[r].node_name, w->nodes[r].workload_id,
                     (long long)(ctx->now - w->in.state_since));
            continue;
        }
        if (!c || c->error[0] || (c->status != 200 && c->status != 204 && c->status != 404))
            return STORE_OK; /* try again next pass */
    }
    int rc;
    const char *final = strcmp(w->in.desired, "terminated") == 0 ? "terminated" : "stopped";
    if ((rc = ledger_close_interval(s, w->in.id, ctx->now, final, ctx->now)) != STORE_OK ||
        (rc = store_instance_release(s, w->in.id)) != STORE_OK)
        return rc;
    /* Keep saying why it stopped (the user, or funds running out). */
    return store_instance_set_state(s, w->in.id, final, "", w->in.state_reason[0] ? w->in.state_reason : final,
                                    ctx->now);
}

static int apply_txn(struct store *s, void *vctx)
{
    struct apply_ctx *ctx = vctx;
    struct instance now_in;
    int rc = store_instance_get(s, NULL, ctx->w->in.id, &now_in);
    if (rc != STORE_OK)
        return rc;
    /* The user changed it while we talked to agents: the next pass decides. */
    if (strcmp(now_in.state, ctx->w->in.state) != 0 || strcmp(now_in.desired, ctx->w->in.desired) != 0 ||
        now_in.attempts != ctx->w->in.attempts)
        return STORE_OK;
    ctx->queued_deletes = 0;
    ctx->progress = 0;
    const struct instance *in = &ctx->w->in;
    if (strcmp(in->state, "stopped") == 0 && strcmp(in->desired, "terminated") == 0)
        return store_instance_set_state(s, in->id, "terminated", "", "terminated", ctx->now);
    if (strcmp(in->desired, "running") != 0)
        return apply_wind_down(s, ctx);
    if (runtime_due(in, ctx->now)) {
        int stopped;
        if ((rc = apply_runtime(s, ctx, &stopped)) != STORE_OK || stopped)
            return rc;
    }
    if (strcmp(in->state, "running") == 0)
        return apply_running(s, ctx);
    if (strcmp(in->state, "unreachable") == 0)
        return apply_unreachable(s, ctx);
    if (strcmp(in->state, "pending") == 0 || strcmp(in->state, "provisioning") == 0) {
        if (ctx->now < in->next_attempt_at)
            return STORE_OK;
        return ctx->w->unfit ? apply_unfit(s, ctx) : apply_provisioning(s, ctx);
    }
    return STORE_OK;
}

/* Whether applying could change anything. A running instance whose nodes
 * are all up, and whose workloads the sweep (if any) saw running, has nothing
 * to write; neither has one waiting out a retry backoff. Skipping them keeps
 * a pass's transaction as small as the work there is. */
static int apply_needed(const struct apply_ctx *ctx)
{
    const struct work *w = ctx->w;
    const struct instance *in = &w->in;
    if (strcmp(in->desired, "running") != 0 || runtime_due(in, ctx->now))
        return 1;
    if (strcmp(in->state, "pending") == 0 || strcmp(in->state, "provisioning") == 0)
        return ctx->now >= in->next_attempt_at;
    if (strcmp(in->state, "unreachable") == 0) {
        /* Something to decide once a node is offline or all answer, or a
         * rank that answers has broken the gang. */
        int offline, known, code;
        int64_t at;
        char why[900];
        return !silent_node(w, ctx->now, &offline) || offline ||
               broken_answering_rank(ctx, why, sizeof why, &at, &known, &code) >= 0;
    }
    if (strcmp(in->state, "running") != 0)
        return 1;
    for (size_t r = 0; r < w->n_nodes; r++) {
        if (strcmp(w->nodes[r].node_health, "up") != 0)
            return 1;
        char health[16];
        call_health(w, r, health, sizeof health);
        if (health[0] && strcmp(health, w->nodes[r].health) != 0)
            return 1; /* a new health verdict to store */
        if (was_listed(ctx, w->nodes[r].node_id)) {
            const struct seen *sn = find_seen(ctx, w->nodes[r].workload_id);
            if (!sn || strcmp(sn->phase, "failed") == 0 || strcmp(sn->phase, "exited") == 0)
                return 1;
            if (sn->health[0] && strcmp(sn->health, w->nodes[r].health) != 0)
                return 1; /* a new health verdict to store */
        }
    }
    return 0;
}

/* Every instance of a pass that has something to write, applied in one
 * transaction. */
struct batch {
    struct apply_ctx *ctx; /* the instances */
    size_t n;              /* entries in ctx */
    size_t pending_before; /* deletes queued before the batch */
};

static int apply_batch_txn(struct store *s, void *vctx)
{
    struct batch *b = vctx;
    /* A retried transaction queues its deletes again: forget the first try's. */
    n_pending = b->pending_before;
    for (size_t i = 0; i < b->n; i++) {
        int rc = apply_txn(s, &b->ctx[i]);
        if (rc != STORE_OK)
            return rc;
    }
    return STORE_OK;
}

/* ------------------------------------------------------------ the sweep */

static int seen_cmp(const void *a, const void *b)
{
    return strcmp(((const struct seen *)a)->workload_id, ((const struct seen *)b)->workload_id);
}

/* Reads one agent's workload list into seen; queues deletes of orphans. */
static void take_list(struct agent_call *c, const struct node_target *t, char (*placed)[ID_MAX], size_t n_placed,
                      struct seen **seen, size_t *n_seen, size_t *cap)
{
    json_t *doc = json_loadb(c->response ? c->response : "", c->response_len, 0, NULL);
    json_t *list = json_object_get(doc, "workloads"), *wl;
    /* The agent's clock when it made the list: an end is placed on ours as
     * "so long before the list", whatever the skew between the machines. */
    json_t *agent_now = json_object_get(doc, "now");
    size_t i;
    json_array_foreach(list, i, wl)
    {
        const char *id = json_string_value(json_object_get(wl, "id"));
        if (!id || strlen(id) >= ID_MAX)
            continue;
        /* bsearch's array must not be NULL, even for zero entries. */
        if (n_placed == 0 || !bsearch(id, placed, n_placed, ID_MAX, id_cmp)) {
            log_info("reconciler: deleting orphaned workload %s on node %s", id, t->id);
            queue_delete_try(t->agent_url, t->secret, id, 0);
            continue;
        }
        if (*n_seen == *cap) {
            *cap = *cap ? *cap * 2 : 256;
            struct seen *grown = realloc(*seen, *cap * sizeof **seen);
            if (!grown)
                break;
            *seen = grown;
        }
        struct seen *sn = &(*seen)[(*n_seen)++];
        snprintf(sn->workload_id, sizeof sn->workload_id, "%s", id);
        const char *phase = json_string_value(json_object_get(wl, "phase"));
        const char *message = json_string_value(json_object_get(wl, "message"));
        phase = phase ? phase : "", message = message ? message : "";
        snprintf(sn->phase, sizeof sn->phase, "%.*s", (int)utf8_cut(phase, sizeof sn->phase - 1), phase);
        snprintf(sn->message, sizeof sn->message, "%.*s", (int)utf8_cut(message, sizeof sn->message - 1), message);
        const char *health = json_string_value(json_object_get(wl, "health"));
        health = health ? health : "";
        snprintf(sn->health, sizeof sn->health, "%.*s", (int)utf8_cut(health, sizeof sn->health - 1), health);
        const char *digest = json_string_value(json_object_get(wl, "ssh_keys_digest"));
        snprintf(sn->ssh_keys_digest, sizeof sn->ssh_keys_digest, "%s",
                 digest && strlen(digest) == 64 ? digest : "");
        json_t *ended = json_object_get(wl, "exited_at");
        sn->exit_known = 0;
        sn->exit_code = 0;
        sn->last = NULL;
        if (strcmp(sn->phase, "exited") == 0 || strcmp(sn->phase, "failed") == 0)
            read_end(wl, &sn->exit_known, &sn->exit_code, &sn->last);
        /* Both are the agent's numbers, and it is not trusted: an end
         * before 1970 or a clock before it is no time at all (the end is
         * then this pass), and the difference is taken only between two
         * times that cannot overflow it (-1 - INT64_MIN could). */
        sn->ended_ago = -1;
        if (json_is_integer(agent_now) && json_is_integer(ended) && json_integer_value(agent_now) >= 0 &&
            json_integer_value(ended) >= 0)
            sn->ended_ago = json_integer_value(agent_now) > json_integer_value(ended)
                                ? json_integer_value(agent_now) - json_integer_value(ended)
                                : 0;
    }
    json_decref(doc);
}

/* ------------------------------------------------------------ SSH keys */

/* Users whose keys changed, for the next pass to send to their instances;
 * guarded by loop.lock. Capped: past it the next pass is a sweep, whose
 * digest check finds every workload holding other keys. */
#define MAX_PUSH_USERS 1024
static char (*push_users)[ID_MAX];
static size_t n_push_users;

/* An instance whose ranks are to be sent their keys in the next pass;
 * touched only by the reconciler thread. */
struct pending_push {
    char instance_id[ID_MAX]; /* which */
    int tries;                /* passes whose send failed so far */
};
static struct pending_push *pushes;
static size_t n_pushes;

/* One send of this pass: a rank's keys to its agent. */
struct key_push {
    char instance_id[ID_MAX]; /* whose */
    char node_name[64];       /* where, for the log */
    int tries;                /* the instance's failed passes before this one */
    struct agent_call *call;  /* the PUT .../ssh-keys */
};

void reconciler_push_ssh_keys(const char *user_id)
{
    loop_lock(&loop);
    int known = 0;
    for (size_t i = 0; i < n_push_users && !known; i++)
        known = strcmp(push_users[i], user_id) == 0;
    if (!known && !list_all) {
        char(*grown)[ID_MAX] =
            n_push_users < MAX_PUSH_USERS ? realloc(push_users, (n_push_users + 1) * sizeof *push_users) : NULL;
        if (grown) {
            push_users = grown;
            snprintf(push_users[n_push_users++], ID_MAX, "%s", user_id);
        } else {
            list_all = 1; /* the next pass sweeps */
        }
    }
    loop_unlock(&loop);
    loop_wake(&loop);
}

/* Queues instance_id's keys for the next pass, unless queued already; tries
 * counts the passes that failed to send them. Past MAX_DELETE_TRIES the
 * sweep's digest check takes over. */
static void queue_push(const char *instance_id, int tries)
{
    if (tries >= MAX_DELETE_TRIES) {
        log_warn("reconciler: instance %s: giving up sending its SSH keys for now; the sweep will retry",
                 instance_id);
        return;
    }
    for (size_t i = 0; i < n_pushes; i++)
        if (strcmp(pushes[i].instance_id, instance_id) == 0)
            return;
    if (n_pushes >= MAX_PENDING_DELETES)
        return; /* the sweep finds it later */
    struct pending_push *grown = realloc(pushes, (n_pushes + 1) * sizeof *pushes);
    if (!grown)
        return;
    pushes = grown;
    snprintf(pushes[n_pushes].instance_id, ID_MAX, "%s", instance_id);
    pushes[n_pushes++].tries = tries;
}

/* The authorized_keys every rank of w holds: the account's keys as the
 * instance has them (store_instance_ssh) and, for a gang, the instance's
 * own key, as workload_spec and gang_spec send them. New reference, or
 * NULL when they cannot be read. */
static json_t *rank_keys(struct store *s, const struct work *w)
{
    char *text;
    if (store_instance_ssh(s, w->in.id, &text, NULL) != STORE_OK)
        return NULL;
    json_t *keys = json_loads(text, 0, NULL);
    free(text);
    if (!json_is_array(keys)) {
        json_decref(keys);
        return NULL;
    }
    if (!instance_multi_node(w->in.card_count))
        return keys;
    struct instance_key key;
    if (store_instance_internal_key(s, w->in.id, &key) != STORE_OK) {
        secret_wipe(&key, sizeof key);
        json_decref(keys);
        return NULL;
    }
    if (gang_ready(w, &key)) {
        char line[SSH_PUBKEY_MAX];
        internal_key_line(&key, line, sizeof line);
        json_array_append_new(keys, json_string(line));
    }
    secret_wipe(&key, sizeof key);
    return keys;
}

/* The agent's ssh_keys_digest of keys: SHA-256 of each line and a newline. */
static int keys_digest(const json_t *keys, char out[65])
{
    size_t n = json_array_size(keys);
    const void **parts = calloc(2 * n + 1, sizeof *parts);
    size_t *lens = calloc(2 * n + 1, sizeof *lens);
    if (!parts || !lens) {
        free(parts);
        free(lens);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *line = json_array_get(keys, i);
        parts[2 * i] = json_string_value(line) ? json_string_value(line) : "";
        lens[2 * i] = strlen(parts[2 * i]);
        parts[2 * i + 1] = "\n";
        lens[2 * i + 1] = 1;
    }
    sha256_hex_parts(parts, lens, 2 * n, out);
    free(parts);
    free(lens);
    return 0;
}

static int read_nodes(struct store *s, struct work *w);

/* The sends of this pass: every instance of the users whose keys changed
 * and those a failed send left queued, one PUT .../ssh-keys per rank on a
 * node that answers and has an SSH server. An instance no longer live is
 * dropped; one whose node does not answer gets its keys from the sweep
 * after the node is back. *out malloc'd, the calls owned by it. */
static void push_plan(struct store *s, const struct agent_client_opts *opts, struct key_push **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    loop_lock(&loop);
    char(*users)[ID_MAX] = push_users;
    size_t n_users = n_push_users;
    push_users = NULL;
    n_push_users = 0;
    loop_unlock(&loop);
    for (size_t u = 0; u < n_users; u++) {
        char(*ids)[ID_MAX] = NULL;
        size_t n_ids = 0;
        if (store_user_ssh_push_instances(s, users[u], &ids, &n_ids) != STORE_OK) {
            /* Read again by the sweep's digest check. */
            log_error("reconciler: cannot read user %s's instances to send their SSH keys", users[u]);
        }
        for (size_t i = 0; i < n_ids; i++)
            queue_push(ids[i], 0);
        free(ids);
    }
    free(users);
    struct pending_push *todo = pushes;
    size_t n_todo = n_pushes;
    pushes = NULL;
    n_pushes = 0;
    struct key_push *calls = NULL;
    size_t n_calls = 0, cap = 0;
    for (size_t i = 0; i < n_todo; i++) {
        struct work *w = calloc(1, sizeof *w);
        if (!w || store_instance_get(s, NULL, todo[i].instance_id, &w->in) != STORE_OK ||
            strcmp(w->in.desired, "running") != 0 ||
            (strcmp(w->in.state, "provisioning") && strcmp(w->in.state, "running") &&
             strcmp(w->in.state, "unreachable"))) {
            free(w);
            continue;
        }
        json_t *keys = read_nodes(s, w) == 0 ? rank_keys(s, w) : NULL;
        json_t *doc = keys ? json_pack("{s:O}", "authorized_keys", keys) : NULL;
        char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
        json_decref(doc);
        if (!body) /* a read failed: the next pass tries again */
            queue_push(todo[i].instance_id, todo[i].tries + 1);
        for (size_t r = 0; body && r < w->n_nodes; r++) {
            const struct instance_node *p = &w->nodes[r];
            if (strcmp(p->node_health, "up") != 0 || p->ssh_port <= 0)
                continue;
            if (n_calls == cap) {
                cap = cap ? cap * 2 : 16;
                struct key_push *grown = realloc(calls, cap * sizeof *calls);
                if (!grown) {
                    queue_push(todo[i].instance_id, todo[i].tries);
                    break;
                }
                calls = grown;
            }
            char path[128];
            snprintf(path, sizeof path, "/v1/workloads/%s/ssh-keys", p->workload_id);
            struct key_push *kp = &calls[n_calls];
            snprintf(kp->instance_id, sizeof kp->instance_id, "%s", w->in.id);
            snprintf(kp->node_name, sizeof kp->node_name, "%s", p->node_name);
            kp->tries = todo[i].tries;
            if ((kp->call = agent_call_new(p->agent_url, p->secret, "PUT", path, body, opts)))
                n_calls++;
            else
                queue_push(todo[i].instance_id, todo[i].tries + 1);
        }
        if (body)
            log_info("reconciler: instance %s: sending its %zu SSH keys to its nodes", w->in.id,
                     json_array_size(keys));
        free(body);
        json_decref(keys);
        free(w->nodes);
        free(w);
    }
    free(todo);
    *out = calls;
    *n_out = n_calls;
}

/* A send's answer: 200 took the keys; 404 (no such workload there: the PUT
 * that makes it carries them, or it is gone) and 409 (put without ssh)
 * leave nothing to send. Anything else is tried again next pass. */
static void push_done(const struct key_push *kp, struct agent_call *c, int finished)
{
    if (c && finished && !c->error[0] && (c->status == 200 || c->status == 404 || c->status == 409))
        return;
    log_warn("reconciler: instance %s: node %s did not take its SSH keys (%s); trying again", kp->instance_id,
             kp->node_name, !c || !finished ? "not sent" : c->error[0] ? c->error : "refused");
    queue_push(kp->instance_id, kp->tries + 1);
}

/* The sweep's check: a live instance whose listed rank holds other keys
 * than it should (a send it missed) is queued to get them. One read of the
 * instance's keys per instance with a listed rank that reports a digest. */
static void keys_check(struct store *s, struct work *works, size_t n_works, const struct apply_ctx *ctx)
{
    for (size_t i = 0; i < n_works; i++) {
        struct work *w = &works[i];
        if (strcmp(w->in.desired, "running") != 0 ||
            (strcmp(w->in.state, "running") != 0 && strcmp(w->in.state, "provisioning") != 0))
            continue;
        char want[65] = "";
        for (size_t r = 0; r < w->n_nodes; r++) {
            const struct instance_node *p = &w->nodes[r];
            if (p->ssh_port <= 0 || !was_listed(ctx, p->node_id))
                continue;
            const struct seen *sn = find_seen(ctx, p->workload_id);
            if (!sn || !sn->ssh_keys_digest[0])
                continue;
            if (!want[0]) {
                json_t *keys = rank_keys(s, w);
                int ok = keys && keys_digest(keys, want) == 0;
                json_decref(keys);
                if (!ok)
                    break;
            }
            if (strcmp(want, sn->ssh_keys_digest) != 0) {
                log_info("reconciler: instance %s: workload %s on node %s holds other SSH keys than the account's;"
                         " sending them",
                         w->in.id, p->workload_id, p->node_name);
                queue_push(w->in.id, 0);
                break;
            }
        }
    }
}

/* ------------------------------------------------------------ one pass */

/* The calls of one pass as one stream (agent_calls_stream): first the
 * deletes left from the last pass, then one list per node the pass lists,
 * then the per-instance calls plan_calls made. Deletes and lists are made
 * when a slot frees and dropped the moment they end, so a sweep of 10 000
 * nodes holds at most agent_max_parallel of them (a libcurl handle and a
 * reply each), not one per node. */
struct pass_calls {
    struct pending_delete *deletes; /* sent this pass; those that fail are queued again */
    size_t n_deletes;
    size_t deletes_made; /* the stream makes calls in order: those past it never started */
    const struct node_target *targets; /* the nodes to list: every node at a sweep, else those asked */
    size_t n_lists;                    /* n_targets when listing, else 0 */
    char (*placed)[ID_MAX]; /* workload ids instances own (sorted): the rest are orphans */
    size_t n_placed;
    struct agent_call **works_calls; /* plan_calls' calls, NULL where a node has none; the works own them */
    size_t n_works_calls;
    struct key_push *pushes; /* push_plan's sends, made last; they own their calls */
    size_t n_pushes;
    const struct agent_client_opts *opts;
    struct seen *seen; /* out: workloads of the nodes listed */
    size_t n_seen, cap_seen;
    char (*listed)[ID_MAX]; /* out: the nodes whose lists came back */
    size_t n_listed;
};

static struct agent_call *make_pass_call(void *ctx, size_t i)
{
    struct pass_calls *pc = ctx;
    if (i < pc->n_deletes) {
        pc->deletes_made = i + 1;
        char path[96];
        snprintf(path, sizeof path, "/v1/workloads/%s", pc->deletes[i].workload_id);
        return agent_call_new(pc->deletes[i].agent_url, pc->deletes[i].secret, "DELETE", path, NULL, pc->opts);
    }
    if ((i -= pc->n_deletes) < pc->n_lists) {
        const struct node_target *t = &pc->targets[i];
        if (strcmp(t->health, "up") != 0)
            return NULL;
        return agent_call_new(t->agent_url, t->secret, "GET", "/v1/workloads", NULL, pc->opts);
    }
    if ((i -= pc->n_lists) < pc->n_works_calls)
        return pc->works_calls[i];
    return pc->pushes[i - pc->n_works_calls].call;
}

/* Queues a delete of this pass again for the next, counting a try when it
 * was made. */
static void delete_again(const struct pending_delete *d, int tried)
{
    queue_delete_try(d->agent_url, d->secret, d->workload_id, d->tries + tried);
}

static void pass_call_done(void *ctx, size_t i, struct agent_call *c, int finished)
{
    struct pass_calls *pc = ctx;
    if (i < pc->n_deletes) {
        /* Deletes that did not get through are tried again next pass; one
         * the agent took (202: still removing) it finishes on its own. */
        if (!c || !finished || c->error[0] ||
            (c->status != 200 && c->status != 202 && c->status != 204 && c->status != 404))
            delete_again(&pc->deletes[i], 1);
        agent_call_free(c);
    } else if ((i -= pc->n_deletes) < pc->n_lists) {
        /* A node whose list did not come back is not listed: its workloads
         * are unknown, not gone. */
        if (c && finished && !c->error[0] && c->status == 200) {
            take_list(c, &pc->targets[i], pc->placed, pc->n_placed, &pc->seen, &pc->n_seen, &pc->cap_seen);
            memcpy(pc->listed[pc->n_listed++], pc->targets[i].id, ID_MAX);
        }
        agent_call_free(c);
    } else if ((i -= pc->n_lists) >= pc->n_works_calls) {
        struct key_push *kp = &pc->pushes[i - pc->n_works_calls];
        push_done(kp, c, finished);
        agent_call_free(c);
        kp->call = NULL;
    }
    /* A per-instance call stays with its work, read when the pass applies. */
}

/* What a pass saw, for choosing when the next one runs. */
struct pass_result {
    int busy;     /* some instance is provisioning or winding down */
    int progress; /* something moved: a workload put, a phase or state changed */
};

/* Takes the nodes asked to be listed (sorted); *all when every node is. */
static char (*take_list_nodes(size_t *n, int *all))[ID_MAX]
{
    loop_lock(&loop);
    char(*nodes)[ID_MAX] = list_nodes;
    *n = n_list_nodes;
    *all = list_all;
    list_nodes = NULL;
    n_list_nodes = 0;
    list_all = 0;
    loop_unlock(&loop);
    if (*n)
        qsort(nodes, *n, ID_MAX, id_cmp);
    return nodes;
}

void reconciler_list_node(const char *node_id)
{
    loop_lock(&loop);
    int known = 0;
    for (size_t i = 0; i < n_list_nodes && !known; i++)
        known = strcmp(list_nodes[i], node_id) == 0;
    if (!known && !list_all) {
        char(*grown)[ID_MAX] =
            n_list_nodes < MAX_LIST_NODES ? realloc(list_nodes, (n_list_nodes + 1) * sizeof *list_nodes) : NULL;
        if (grown) {
            list_nodes = grown;
            snprintf(list_nodes[n_list_nodes++], ID_MAX, "%s", node_id);
        } else {
            list_all = 1;
        }
    }
    loop_unlock(&loop);
    loop_wake(&loop);
}

/* Reads w's placement into w->nodes, sized to it: 0, or -1 with no nodes
 * (the pass decides on what it read: a placement it could not read is not
 * acted on). */
static int read_nodes(struct store *s, struct work *w)
{
    static _Thread_local struct instance_node all[PLACEMENT_MAX_NODES];
    size_t n = 0;
    w->n_nodes = 0;
    if (store_instance_nodes(s, w->in.id, all, PLACEMENT_MAX_NODES, &n) != STORE_OK)
        return -1;
    if (n && !(w->nodes = malloc(n * sizeof *w->nodes)))
        return -1;
    if (n)
        memcpy(w->nodes, all, n * sizeof *w->nodes);
    w->n_nodes = n;
    return 0;
}

static struct pass_result run_pass(struct store *s, int sweep)
{
    struct pass_result res = {0, 0};
    size_t n_asked = 0;
    int asked_all = 0;
    char(*asked)[ID_MAX] = take_list_nodes(&n_asked, &asked_all);
    sweep |= asked_all;
    char(*listed)[ID_MAX] = NULL;
    struct agent_client_opts opts = agent_client_opts_from_config();
    int64_t now = clock_now();
    struct instance *ins = NULL;
    size_t n_ins = 0;
    /* A sweep looks at every instance holding cards; the passes between
     * look only at those with something to decide, so their cost follows
     * what changes rather than how many instances are live. */
    if ((sweep ? store_instance_unsettled(s, &ins, &n_ins) : store_instance_attention(s, asked, n_asked, &ins, &n_ins)) !=
        STORE_OK) {
        free(asked);
        return res;
    }
    metrics_reconcile_pass(sweep, (int64_t)n_ins);
    struct key_push *key_pushes = NULL;
    size_t n_key_pushes = 0;
    push_plan(s, &opts, &key_pushes, &n_key_pushes);
    struct work *works = calloc(n_ins ? n_ins : 1, sizeof *works);
    struct node_target *targets = NULL;
    size_t n_targets = 0;
    char(*placed)[ID_MAX] = NULL;
    size_t n_placed = 0;
    if (!works)
        goto out;
    for (size_t i = 0; i < n_ins; i++) {
        works[i].in = ins[i];
        if (read_nodes(s, &works[i]) == 0)
            plan_calls(s, &works[i], now, &opts);
    }
    free(ins); /* a sweep's copy of every live instance: the works hold them now */
    ins = NULL;
    /* Between sweeps only the nodes asked for are read, with the workloads
     * placed on them: a node's first beat or a workload's exit costs a
     * look at that node, not at the fleet. */
    int listing = sweep || n_asked;
    if (listing && ((sweep ? store_node_targets(s, &targets, &n_targets)
                           : store_node_targets_of(s, asked, n_asked, &targets, &n_targets)) != STORE_OK ||
                    store_placed_workloads(s, sweep ? NULL : asked, n_asked, &placed, &n_placed) != STORE_OK))
        listing = 0;

    /* Every call of the pass goes out in one stream: deletes left from the
     * last pass, the sweep's lists, and the per-instance calls. */
    struct pass_calls pc = {.deletes = pending,
                            .n_deletes = n_pending,
                            .targets = targets,
                            .n_lists = listing ? n_targets : 0,
                            .placed = placed,
                            .n_placed = n_placed,
                            .pushes = key_pushes,
                            .n_pushes = n_key_pushes,
                            .opts = &opts};
    pending = NULL;
    n_pending = 0;
    size_t n_calls = 0;
    for (size_t i = 0; i < n_ins; i++)
        n_calls += works[i].n_nodes;
    if (!(pc.works_calls = calloc(n_calls ? n_calls : 1, sizeof *pc.works_calls)) ||
        (pc.n_lists && !(pc.listed = calloc(pc.n_lists, sizeof *pc.listed)))) {
        pending = pc.deletes; /* out of memory: the next pass sends them */
        n_pending = pc.n_deletes;
        free(pc.works_calls);
        goto out;
    }
    for (size_t i = 0; i < n_ins; i++)
        for (size_t r = 0; r < works[i].n_nodes; r++)
            if ((pc.works_calls[pc.n_works_calls++] = works[i].call[r])) /* what one a stop leaves unstarted says */
                snprintf(works[i].call[r]->error, sizeof works[i].call[r]->error, "not run");
    const struct agent_call_stream stream = {make_pass_call, pass_call_done, &pc};
    size_t total = pc.n_deletes + pc.n_lists + pc.n_works_calls + pc.n_pushes;
    int64_t connects = agent_multi_connects(pool);
    agent_calls_stream(pool, total, (long)daemon_config->agent_max_parallel, should_stop, &stream);
    metrics_reconcile_connections(pool ? agent_multi_connects(pool) - connects : (int64_t)total); /* no pool: one each */
    for (size_t i = pc.deletes_made; i < pc.n_deletes; i++) /* a stop came first */
        delete_again(&pc.deletes[i], 0);
    free(pc.deletes);
    free(pc.works_calls);
    struct seen *seen = pc.seen;
    size_t n_seen = pc.n_seen;
    listed = pc.listed;
    size_t n_listed = pc.n_listed;
    if (n_seen)
        qsort(seen, n_seen, sizeof *seen, seen_cmp);
    if (n_listed)
        qsort(listed, n_listed, ID_MAX, id_cmp);
    if (n_listed) {
        struct apply_ctx lists = {.seen = seen, .n_seen = n_seen, .listed = listed, .n_listed = n_listed};
        keys_check(s, works, n_ins, &lists);
    }

    /* The agents' replies are parsed here rather than in the batch's
     * transaction, where every other writer of the process waits for it. */
    for (size_t i = 0; i < n_ins; i++)
        for (size_t r = 0; r < works[i].n_nodes; r++) {
            struct agent_call *c = works[i].call[r];
            if (c && !c->error[0] && (c->status == 200 || c->status == 201))
                agent_call_json(c);
        }
    int64_t applied_at = clock_now();
    struct batch b = {calloc(n_ins ? n_ins : 1, sizeof *b.ctx), 0, n_pending};
    for (size_t i = 0; b.ctx && i < n_ins; i++) {
        struct apply_ctx ctx = {&works[i], applied_at, seen, n_seen, listed, n_listed, 0, 0};
        const char *st = works[i].in.state;
        res.busy |= strcmp(st, "pending") == 0 || strcmp(st, "provisioning") == 0 || strcmp(st, "stopping") == 0;
        for (size_t r = 0; r < works[i].n_nodes; r++)
            res.progress |= works[i].kind[r] == CALL_PUT && works[i].call[r] && !works[i].call[r]->error[0];
        if (apply_needed(&ctx))
            b.ctx[b.n++] = ctx;
    }
    if (b.n && store_txn(s, apply_batch_txn, &b) != STORE_OK) {
        /* One instance's failure must not hold the others back: apply them
         * one by one, each in its own transaction. */
        n_pending = b.pending_before;
        for (size_t i = 0; i < b.n; i++)
            if (store_txn(s, apply_txn, &b.ctx[i]) != STORE_OK)
                log_error("reconciler: cannot update instance %s", b.ctx[i].w->in.id);
    }
    for (size_t i = 0; i < b.n; i++)
        res.progress |= b.ctx[i].progress;
    if (!b.ctx) /* out of memory: the next pass tries again */
        res.busy = 1;
    free(b.ctx);
    for (size_t i = 0; i < n_seen; i++)
        free(seen[i].last);
    free(seen);
out:
    /* Sends a stop (or a lack of memory) left unmade go next pass. */
    for (size_t i = 0; i < n_key_pushes; i++)
        if (key_pushes[i].call) {
            queue_push(key_pushes[i].instance_id, key_pushes[i].tries);
            agent_call_free(key_pushes[i].call);
        }
    free(key_pushes);
    for (size_t i = 0; works && i < n_ins; i++) {
        for (size_t r = 0; r < works[i].n_nodes; r++)
            agent_call_free(works[i].call[r]);
        free(works[i].nodes);
    }
    free(listed);
    free(asked);
    free(placed);
    free(targets);
    free(works);
    free(ins);
    return res;
}

static void *reconciler_main(void *arg)
{
    (void)arg;
    struct store *s = store_thread();
    if (!s) {
        log_error("reconciler: no database connection; reconciler stopped");
        return NULL;
    }
    /* Without a pool every call connects anew: slower, still correct. */
    if (!(pool = agent_multi_new()))
        log_warn("reconciler: no connection pool; each agent call connects anew");
    int64_t last_sweep = 0, quick = 0;
    for (;;) {
        int64_t mono = clock_mono_ms();
        /* The first pass is a sweep, however recently the machine booted. */
        int sweep = !last_sweep || mono - last_sweep >= daemon_config->reconcile_sweep_ms;
        if (sweep)
            last_sweep = mono;
        struct pass_result r = run_pass(s, sweep);
        watchdog_loop_alive(LOOP_RECONCILER);
        int64_t ms = daemon_config->reconcile_interval_ms;
        /* Provisioning is watched closely while it moves, then less and
         * less often while nothing does (an image pull can take minutes). */
        if (r.busy) {
            /* Capped at the period: an instance waiting on an unreachable
             * node keeps a pass busy without progress for minutes, and an
             * uncapped doubling overflows. */
            quick = r.progress || !quick ? QUICK_MS : quick < ms ? quick * 2 : ms;
            if (quick < ms)
                ms = quick;
        } else {
            quick = 0;
        }
        if ((n_pending || n_pushes) && ms > 200)
            ms = 200;
        if (loop_sleep(&loop, ms))
            break;
    }
    agent_multi_free(pool);
    pool = NULL;
    free(pending);
    pending = NULL;
    n_pending = 0;
    free(pushes);
    pushes = NULL;
    n_pushes = 0;
    loop_lock(&loop);
    free(list_nodes);
    list_nodes = NULL;
    n_list_nodes = 0;
    free(push_users);
    push_users = NULL;
    n_push_users = 0;
    loop_unlock(&loop);
    return NULL;
}

int reconciler_start(void)
{
    return loop_start(&loop, reconciler_main);
}
void reconciler_wake(void)
{
    loop_wake(&loop);
}
void reconciler_stop(void)
{
    loop_stop(&loop);
}
