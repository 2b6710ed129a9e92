/* instances.c: what creating, starting, stopping and terminating an
 * instance does to the database, each as one transaction callback, and the
 * JSON shape of an instance. Agents are never called here: the reconciler
 * sees the change and drives them. */
#include "domain/domain.h"
#include "domain/ledger.h"
#include "domain/placement.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/url.h"
#include "store/store.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int op_refuse(struct op_outcome *o, enum api_error e, const char *field, json_t *extra, const char *fmt, ...)
{
    o->failed = 1;
    o->error = e;
    snprintf(o->field, sizeof o->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->message, sizeof o->message, fmt, ap);
    va_end(ap);
    json_decref(o->extra);
    o->extra = extra;
    return REFUSED;
}

/* Claims cards for the instance: the quota, then best-fit placement, all in
 * the caller's transaction, so no card is ever given twice. */
int instance_place(struct store *s, const struct instance *in, struct op_outcome *o)
{
    return instance_place_near(s, in, NULL, o);
}

/* Keeps only the candidate named node_id of nodes[0..*n), if there. */
static void keep_node(struct placement_node *nodes, size_t *n, const char *node_id)
{
    size_t kept = 0;
    for (size_t i = 0; i < *n; i++)
        if (strcmp(nodes[i].id, node_id) == 0)
            nodes[kept++] = nodes[i];
    *n = kept;
}

int instance_place_near(struct store *s, const struct instance *in, const char *prefer_node, struct op_outcome *o)
{
    int64_t used = store_user_cards_in_use(s, in->user_id, in->id);
    int64_t limit = store_user_max_cards(s, in->user_id, daemon_config->default_max_cards);
    if (used < 0 || limit < 0)
        return used < 0 ? (int)used : (int)limit;
    if (used + in->card_count > limit)
        return op_refuse(o, ERR_QUOTA_EXCEEDED, "card_count",
                      json_pack("{s:I, s:I}", "limit", (json_int_t)limit, "in_use", (json_int_t)used),
                      "your card quota is %lld cards and %lld are in use; %lld more do not fit", (long long)limit,
                      (long long)used, (long long)in->card_count);
    /* Published ports are a per-node resource like cards: only nodes with
     * that many free host ports are candidates, and each rank claims its
     * own in the same transaction. */
    int64_t ports[STORE_MAX_PORTS];
    size_t n_ports;
    int rc = store_instance_ports(s, in->id, ports, &n_ports);
    if (rc != STORE_OK)
        return rc;
    /* An instance inside a reservation is placed on the reserved pool only
     * (within its block's cards, checked by reservation_admit), any other
     * on the on-demand pool only (0024). */
    char reservation[ID_MAX];
    if ((rc = store_instance_reservation(s, in->id, reservation)) != STORE_OK)
        return rc;
    struct placement_node *nodes;
    size_t n;
    /* A block bound to nodes (0028) is placed on its own nodes only, never
     * beyond its cards on each, so other blocks' cards stay theirs; one
     * booked before 0028 and not bound yet takes the pool's best fit. */
    int bound = 0;
    if (reservation[0] && (rc = reservation_bound(s, reservation, &bound)) != STORE_OK)
        return rc;
    /* The holder paid for the block's cards: one bound to a node lost, set
     * aside or short of healthy cards moves onto a spare now, as the next
     * pass would move it, rather than leave a start refused or a job's
     * restart lost till then. */
    if (bound && (rc = reservation_rehome_now(s, reservation, clock_now())) != STORE_OK)
        return rc;
    const char *pool = reservation[0] ? "reserved" : "on_demand";
    struct placement p;
    int placed = 0;
    /* The node it is asked to stay on, first, when it still takes new work
     * and has room there: an instance placed again keeps its image pulled,
     * and a /shared that is a directory of the node (a gang is placed as a
     * whole, anywhere). */
    if (prefer_node && in->card_count <= PLACEMENT_NODE_CARDS) {
        if (bound)
            rc = store_placement_candidates_bound(s, in->gpu_model, (int64_t)n_ports, reservation, in->id, &nodes, &n);
        else
            rc = store_placement_candidate_node(s, in->gpu_model, in->card_count, (int64_t)n_ports, pool, prefer_node,
                                                &nodes, &n);
        if (rc != STORE_OK)
            return rc;
        keep_node(nodes, &n, prefer_node);
        if (!(placed = placement_choose(nodes, n, (int)in->card_count, &p) == 0))
            free(nodes);
    }
    if (!placed) {
        if (bound)
            rc = store_placement_candidates_bound(s, in->gpu_model, (int64_t)n_ports, reservation, in->id, &nodes, &n);
        else
            rc = store_placement_candidates_pool(s, in->gpu_model, in->card_count, (int64_t)n_ports, pool, &nodes, &n);
        if (rc != STORE_OK)
            return rc;
        placed = placement_choose(nodes, n, (int)in->card_count, &p) == 0;
    }
    if (!placed && reservation[0]) {
        free(nodes);
        char why[400] = "";
        if (bound && (rc = reservation_stuck_why(s, reservation, why, sizeof why)) != STORE_OK)
            return rc;
        if (why[0])
            return op_refuse(o, ERR_INSUFFICIENT_CAPACITY, "card_count", NULL,
                             "the nodes of reservation %s have no room for %lld %s cards now: %s (lost hours are "
                             "credited)",
                             reservation, (long long)in->card_count, in->gpu_model, why);
        return op_refuse(o, ERR_INSUFFICIENT_CAPACITY, "card_count", NULL,
                         "the nodes of reservation %s have no room for %lld %s cards now (its instances hold "
                         "its cards there, or a node of it is down; lost hours are credited)",
                         reservation, (long long)in->card_count, in->gpu_model);
    } else if (!placed) {
        free(nodes);
        int64_t free_cards = store_free_cards(s, in->gpu_model);
        if (free_cards < 0)
            return (int)free_cards;
        /* Was it the cards, or the host ports? Without the port filter the
         * cards alone would fit. */
        struct placement_node *any;
        size_t n_any;
        struct placement q;
        if (n_ports > 0 &&
            (rc = store_placement_candidates(s, in->gpu_model, in->card_count, &any, &n_any)) == STORE_OK) {
            int cards_fit = placement_choose(any, n_any, (int)in->card_count, &q) == 0;
            free(any);
            if (cards_fit)
                return op_refuse(o, ERR_INSUFFICIENT_CAPACITY, "ports",
                              json_pack("{s:I}", "cards_free", (json_int_t)free_cards),
                              "%lld %s cards are free but no node that has them can publish %zu more ports now"
                              " (its host port range is full or it publishes none)",
                              (long long)in->card_count, in->gpu_model, n_ports);
        } else if (n_ports > 0) {
            return rc;
        }
        return op_refuse(o, ERR_INSUFFICIENT_CAPACITY, "card_count",
                      json_pack("{s:I}", "cards_free", (json_int_t)free_cards),
                      "%lld %s cards requested but only %lld are free now%s", (long long)in->card_count, in->gpu_model,
                      (long long)free_cards,
                      in->card_count > PLACEMENT_NODE_CARDS ? " (more than 8 cards need whole free nodes in one fabric)"
                                                            : " on any one node");
    }
    for (size_t r = 0; r < p.n_nodes && rc == STORE_OK; r++) {
        char wl[ID_MAX];
        if (id_new_ordered("wl", wl) < 0) {
            rc = STORE_ERROR;
            break;
        }
        rc = store_instance_claim(s, in->id, (int64_t)r, nodes[p.node[r]].id, wl, p.cards[r]);
        if (rc == STORE_OK)
            rc = store_instance_claim_ports(s, in->id, (int64_t)r, nodes[p.node[r]].id, ports, n_ports);
    }
    free(nodes);
    return rc;
}

/* Checks that every id names one of user_id's SSH keys, once; *ids_json
 * gets the array as stored (malloc'd). */
static int ssh_key_ids_check(struct store *s, const char *user_id, json_t *ids, char **ids_json, struct op_outcome *o)
{
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v)
    {
        const char *id = json_string_value(v);
        for (size_t j = 0; j < i; j++)
            if (strcmp(id, json_string_value(json_array_get(ids, j))) == 0)
                return op_refuse(o, ERR_INVALID_FIELD, "ssh_key_ids", NULL, "ssh_key_ids names %.32s twice", id);
        struct ssh_key k;
        int rc = id_valid("sshk", id) ? store_ssh_key_get(s, user_id, id, &k) : STORE_NOT_FOUND;
        if (rc == STORE_NOT_FOUND)
            return op_refuse(o, ERR_INVALID_FIELD, "ssh_key_ids", NULL, "no SSH key %.32s; see GET /v1/ssh-keys", id);
        if (rc != STORE_OK)
            return rc;
    }
    *ids_json = json_dumps(ids, JSON_COMPACT);
    return *ids_json ? STORE_OK : STORE_ERROR;
}

int instance_create(struct store *s, const struct instance_create *req, char id_out[ID_MAX], struct funds_seen *seen,
                    struct op_outcome *o)
{
    struct funds_seen unused;
    if (!seen)
        seen = &unused;
    seen->known = 0;
    struct gpu_type t;
    struct volume v;
    int rc = store_gpu_type_row(s, req->gpu_type, &t);
    if (rc == STORE_NOT_FOUND)
        return op_refuse(o, ERR_INVALID_FIELD, "gpu_type", NULL, "no GPU type %s; see GET /v1/gpu-types", req->gpu_type);
    if (rc != STORE_OK)
        return rc;
    int64_t now = clock_now();
    if (req->reservation_id) {
        if ((rc = reservation_admit(s, req->user_id, req->reservation_id, t.code, req->card_count, "", now, o)) !=
            STORE_OK)
            return rc;
    } else if (t.reservation_required) {
        return op_refuse(o, ERR_RESERVATION_REQUIRED, "gpu_type", NULL,
                         "%s has no on-demand capacity: book cards with POST /v1/reservations and launch with its "
                         "reservation_id",
                         t.code);
    }
    char image_ref[256];
    if ((rc = instance_image_resolve(s, req->image, &t, image_ref, o)) != STORE_OK)
        return rc;
    char volume_id[ID_MAX];
    if (req->volume_id) {
        rc = store_volume_get(s, req->user_id, req->volume_id, &v);
        if (rc == STORE_NOT_FOUND)
            return op_refuse(o, ERR_INVALID_FIELD, "volume_id", NULL, "no volume %.32s", req->volume_id);
        if (rc != STORE_OK)
            return rc;
        snprintf(volume_id, sizeof volume_id, "%s", v.id);
    } else if ((rc = volume_default(s, req->user_id, volume_id)) != STORE_OK) {
        if (rc != VOLUME_OVER_LIMIT)
            return rc;
        char why[256];
        volume_limit_check(s, req->user_id, daemon_config->volume_default_size_gb, why, sizeof why);
        return op_refuse(o, ERR_QUOTA_EXCEEDED, "volume_id", NULL,
                      "the default volume (shared, %lld GB) cannot be made: %s; name a volume_id",
                      (long long)daemon_config->volume_default_size_gb, why);
    }
    struct instance in = {.card_count = req->card_count, .created_at = now, .updated_at = now, .state_since = now};
    if (id_new_ordered("ins", in.id) < 0)
        return STORE_ERROR;
    snprintf(in.user_id, sizeof in.user_id, "%s", req->user_id);
    snprintf(in.name, sizeof in.name, "%s", req->name ? req->name : "");
    snprintf(in.gpu_model, sizeof in.gpu_model, "%s", t.code);
    snprintf(in.image, sizeof in.image, "%s", image_ref);
    snprintf(in.volume_id, sizeof in.volume_id, "%s", volume_id);
    snprintf(in.desired, sizeof in.desired, "running");
    snprintf(in.state, sizeof in.state, "pending");
    char *ids = NULL;
    if (req->ssh_key_ids && (rc = ssh_key_ids_check(s, req->user_id, req->ssh_key_ids, &ids, o)) != STORE_OK)
        return rc;
    char *ports = req->ports && json_array_size(req->ports) ? json_dumps(req->ports, JSON_COMPACT) : NULL;
    if (req->ports && json_array_size(req->ports) && !ports) {
        free(ids);
        return STORE_ERROR;
    }
    /* A reservation's hours are paid: no minimum run to fund. */
    if ((!req->reservation_id &&
         (rc = funds_check_minimum_run(s, in.user_id, in.gpu_model, in.card_count, now, &seen->f, o)) != STORE_OK) ||
        (rc = store_instance_insert(s, &in)) != STORE_OK ||
        (req->reservation_id && (rc = store_instance_set_reservation(s, in.id, req->reservation_id)) != STORE_OK) ||
        (ids && (rc = store_instance_set_ssh_key_ids(s, in.id, ids)) != STORE_OK) ||
        (ports && (rc = store_instance_set_ports(s, in.id, ports)) != STORE_OK) ||
        (rc = instance_run_store(s, in.id, req->command, req->env, req->working_dir)) != STORE_OK ||
        (rc = store_instance_ssh_snapshot(s, in.id)) != STORE_OK ||
        (rc = store_instance_set_job(s, in.id, req->restart_policy ? req->restart_policy : "never",
                                     req->max_runtime_minutes)) != STORE_OK ||
        (rc = instance_place(s, &in, o)) != STORE_OK ||
        (rc = instance_gang_prepare(s, &in,
                                    req->rendezvous_timeout_s > 0 ? req->rendezvous_timeout_s
                                                                  : daemon_config->rendezvous_timeout_s,
                                    o)) != STORE_OK ||
        (rc = store_instance_event(s, in.id, now, "pending", "created")) != STORE_OK) {
        free(ids);
        free(ports);
        return rc;
    }
    free(ids);
    free(ports);
    seen->known = !req->reservation_id;
    memcpy(id_out, in.id, ID_MAX);
    return STORE_OK;
}

static int load(struct store *s, const char *user_id, const char *id, struct instance *in, struct op_outcome *o)
{
    int rc = id_valid("ins", id) ? store_instance_get(s, user_id, id, in) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        return op_refuse(o, ERR_NOT_FOUND, NULL, NULL, "no instance %.32s", id);
    return rc;
}

int instance_start(struct store *s, const char *user_id, const char *id, struct op_outcome *o)
{
    struct instance in;
    int rc = load(s, user_id, id, &in, o);
    if (rc != STORE_OK)
        return rc;
    if (strcmp(in.state, "stopped") != 0 && strcmp(in.state, "lost") != 0 && strcmp(in.state, "failed") != 0 &&
        strcmp(in.state, "succeeded") != 0)
        return op_refuse(o, ERR_INVALID_STATE, NULL, json_pack("{s:s}", "state", in.state),
                      "instance %s is %s; only a stopped, succeeded, lost or failed instance can be started", in.id,
                      in.state);
    if (strcmp(in.desired, "terminated") == 0)
        return op_refuse(o, ERR_INVALID_STATE, NULL, json_pack("{s:s}", "state", in.state),
                      "instance %s is being terminated", in.id);
    int64_t now = clock_now();
    /* The volume may have been deleted while the instance was stopped. */
    struct volume v;
    if ((rc = store_volume_get(s, user_id, in.volume_id, &v)) == STORE_NOT_FOUND)
        return op_refuse(o, ERR_CONFLICT, NULL, NULL, "the instance's volume %s no longer exists", in.volume_id);
    if (rc != STORE_OK)
        return rc;
    /* Inside a reservation, only within its window and cards; otherwise a
     * minimum run must be funded. */
    char reservation[ID_MAX];
    if ((rc = store_instance_reservation(s, in.id, reservation)) != STORE_OK)
        return rc;
    if (reservation[0])
        rc = reservation_admit(s, user_id, reservation, in.gpu_model, in.card_count, in.id, now, o);
    else
        rc = funds_check_minimum_run(s, in.user_id, in.gpu_model, in.card_count, now, NULL, o);
    if (rc != STORE_OK || (rc = store_instance_release(s, in.id)) != STORE_OK ||
        (rc = instance_place(s, &in, o)) != STORE_OK ||
        (rc = store_instance_ssh_snapshot(s, in.id)) != STORE_OK || (rc = instance_gang_prepare(s, &in, 0, o)) != STORE_OK ||
        (rc = store_instance_set_desired(s, in.id, "running", now)) != STORE_OK ||
        (rc = store_instance_set_attempts(s, in.id, 0, 0)) != STORE_OK ||
        (rc = instance_job_reset(s, in.id)) != STORE_OK)
        return rc;
    return store_instance_set_state(s, in.id, "pending", "", "started by the user", now);
}

int instance_restart_policy_valid(const char *p)
{
    return strcmp(p, "never") == 0 || strcmp(p, "on_failure") == 0 || strcmp(p, "always") == 0;
}

/* A start begins a new run: no restarts yet, no exit status, and
 * max_runtime_minutes counts from when it next runs. */
int instance_job_reset(struct store *s, const char *id)
{
    int rc;
    if ((rc = store_instance_set_restarts(s, id, 0, 0)) != STORE_OK ||
        (rc = store_instance_set_exit(s, id, 0, 0)) != STORE_OK ||
        (rc = store_instance_set_ranks_exited(s, id, 0)) != STORE_OK)
        return rc;
    return store_instance_set_run_clock(s, id, 0, 0);
}

/* Ends billing at the request and hands the rest to the reconciler. */
static int wind_down(struct store *s, const struct instance *in, const char *desired, const char *why, int64_t now)
{
    int rc;
    if ((rc = store_instance_set_desired(s, in->id, desired, now)) != STORE_OK ||
        (rc = ledger_close_interval(s, in->id, now, why, now)) != STORE_OK)
        return rc;
    return store_instance_set_state(s, in->id, "stopping", "", why, now);
}

int instance_stop(struct store *s, const char *user_id, const char *id, struct op_outcome *o)
{
    struct instance in;
    int rc = load(s, user_id, id, &in, o);
    if (rc != STORE_OK)
        return rc;
    /* Stopping what is stopping or stopped again is harmless. */
    if (strcmp(in.state, "stopping") == 0 || strcmp(in.state, "stopped") == 0)
        return STORE_OK;
    if (strcmp(in.state, "terminated") == 0 || strcmp(in.state, "failed") == 0 || strcmp(in.state, "lost") == 0 ||
        strcmp(in.state, "succeeded") == 0)
        return op_refuse(o, ERR_INVALID_STATE, NULL, json_pack("{s:s}", "state", in.state),
                      "instance %s is %s and cannot be stopped", in.id, in.state);
    return wind_down(s, &in, "stopped", "stop requested by the user", clock_now());
}

int instance_terminate(struct store *s, const char *user_id, const char *id, struct op_outcome *o)
{
    struct instance in;
    int rc = load(s, user_id, id, &in, o);
    if (rc != STORE_OK)
        return rc;
    if (strcmp(in.state, "terminated") == 0 || strcmp(in.desired, "terminated") == 0)
        return STORE_OK;
    int64_t now = clock_now();
    if (strcmp(in.state, "stopped") == 0 || strcmp(in.state, "failed") == 0 || strcmp(in.state, "lost") == 0 ||
        strcmp(in.state, "succeeded") == 0) {
        /* Holds no cards: nothing for agents to do. */
        if ((rc = store_instance_set_desired(s, in.id, "terminated", now)) != STORE_OK)
            return rc;
        return store_instance_set_state(s, in.id, "terminated", "", "terminated by the user", now);
    }
    return wind_down(s, &in, "terminated", "terminate requested by the user", now);
}

void node_connect_host(const char *public_host, const char *agent_url, char *out, size_t n)
{
    if (public_host[0])
        snprintf(out, n, "%s", public_host);
    else if (url_host(agent_url, out, n) < 0)
        snprintf(out, n, "%s", "");
}

/* What a client needs to reach one rank: host and port, the login
 * "<instance id>-<rank>" the reconciler gives the agent, the host key to
 * pin, a command to paste and its known_hosts line (OpenSSH writes
 * "[host]:port" for any port but 22). null when the node reports no SSH
 * server. */
static json_t *rank_ssh_json(const struct instance *in, const struct instance_node *p)
{
    if (p->ssh_port <= 0)
        return json_null();
    char host[254], user[ID_MAX + 24], command[512], known[1600];
    node_connect_host(p->public_host, p->agent_url, host, sizeof host);
    snprintf(user, sizeof user, "%s-%lld", in->id, (long long)p->rank);
    if (p->ssh_port == 22) {
        snprintf(command, sizeof command, "ssh %s@%s", user, host);
        snprintf(known, sizeof known, "%s %s", host, p->ssh_host_key);
    } else {
        snprintf(command, sizeof command, "ssh -p %lld %s@%s", (long long)p->ssh_port, user, host);
        snprintf(known, sizeof known, "[%s]:%lld %s", host, (long long)p->ssh_port, p->ssh_host_key);
    }
    return json_pack("{s:s, s:I, s:s, s:s, s:s, s:s, s:s}", "host", host, "port", (json_int_t)p->ssh_port, "user", user,
                     "host_key", p->ssh_host_key, "host_key_fingerprint", p->ssh_host_fp, "command", command,
                     "known_hosts", known);
}

/* Appends to out (cap bytes, *len used), cutting what does not fit. */
static void appendf(char *out, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void appendf(char *out, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

char *instance_ssh_config(struct store *s, const struct instance *in)
{
    static _Thread_local struct instance_node nodes[PLACEMENT_MAX_NODES];
    size_t n = 0;
    if (store_instance_nodes(s, in->id, nodes, PLACEMENT_MAX_NODES, &n) != STORE_OK)
        return NULL;
    /* A block is under 800 bytes (ids, a host of at most 253, a name of 63). */
    size_t cap = 512 + n * 2048, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    /* Only texts the daemon checked go in (ids, node names, hosts): the
     * instance's name may hold a line break, which would be a directive. */
    appendf(out, cap, &len,
            "# gpurent instance %s: one Host per rank. Pin the host keys with the\n"
            "# known_hosts lines of GET /v1/instances/%s (nodes[].ssh.known_hosts).\n",
            in->id, in->id);
    for (size_t i = 0; i < n; i++) {
        const struct instance_node *p = &nodes[i];
        char host[254];
        node_connect_host(p->public_host, p->agent_url, host, sizeof host);
        if (p->ssh_port <= 0) {
            appendf(out, cap, &len, "\n# rank %lld (%s): the node reports no SSH server\n", (long long)p->rank,
                    p->node_name);
            continue;
        }
        appendf(out, cap, &len,
                "\nHost %s-%lld\n"
                "    # rank %lld on node %s, host key %s\n"
                "    HostName %s\n"
                "    Port %lld\n"
                "    User %s-%lld\n",
                in->id, (long long)p->rank, (long long)p->rank, p->node_name, p->ssh_host_fp, host,
                (long long)p->ssh_port, in->id, (long long)p->rank);
    }
    return out;
}

/* Where each published port of a rank is reached: its node's host and the
 * host port placement gave it. */
static json_t *rank_published_json(const struct instance_node *p)
{
    char host[254], address[272];
    node_connect_host(p->public_host, p->agent_url, host, sizeof host);
    json_t *out = json_array(), *ports = json_loads(p->ports, 0, NULL);
    size_t i;
    json_t *v;
    json_array_foreach(ports, i, v)
    {
        json_int_t container = json_integer_value(json_object_get(v, "container"));
        json_int_t host_port = json_integer_value(json_object_get(v, "host"));
        /* An IPv6 literal needs brackets before ":port". */
        snprintf(address, sizeof address, strchr(host, ':') ? "[%s]:%lld" : "%s:%lld", host, (long long)host_port);
        json_array_append_new(out, json_pack("{s:I, s:s, s:I, s:s}", "container_port", container, "host", host,
                                             "host_port", host_port, "address", address));
    }
    json_decref(ports);
    return out;
}

struct instance_view {
    struct instance in;
    struct instance_node *nodes;    /* n_nodes of them (malloc'd) */
    size_t n_nodes;
    int low_balance;
    char reservation_id[ID_MAX];    /* "" for none */
    char *ssh_key_ids;              /* JSON array text; NULL: all the account's keys (malloc'd) */
    int64_t ports[STORE_MAX_PORTS]; /* asked to be published */
    size_t n_ports;
    struct instance_run run;        /* when has_run */
    int has_run;
    int64_t rendezvous_timeout_s;   /* a gang's, -1 for none */
};

int instance_view_read(struct store *s, const struct instance *in, const struct funds_seen *seen,
                       struct instance_view **out)
{
    /* Each rank carries its node's host key: read off the stack, then
     * copied for as many ranks as there are. */
    static _Thread_local struct instance_node nodes[PLACEMENT_MAX_NODES];
    struct instance_view *v = *out = calloc(1, sizeof *v);
    if (!v)
        return STORE_ERROR;
    v->in = *in;
    v->rendezvous_timeout_s = -1;
    size_t n = 0;
    int rc = store_instance_nodes(s, in->id, nodes, PLACEMENT_MAX_NODES, &n);
    if (rc != STORE_OK)
        return rc;
    if (n > 0 && !(v->nodes = malloc(n * sizeof *v->nodes)))
        return STORE_ERROR;
    if (n > 0)
        memcpy(v->nodes, nodes, n * sizeof *v->nodes);
    v->n_nodes = n;
    /* The owner's low-balance warning shows on each instance it concerns. */
    if (ledger_low_balance(s, in->user_id, clock_now(), seen && seen->known ? &seen->f : NULL, &v->low_balance) !=
        STORE_OK)
        v->low_balance = 0;
    store_instance_reservation(s, in->id, v->reservation_id);
    /* The keys it names (NULL: all the account's), as given at create. */
    char *keys = NULL;
    store_instance_ssh(s, in->id, &keys, &v->ssh_key_ids); /* on failure both stay NULL */
    free(keys);
    if (store_instance_ports(s, in->id, v->ports, &v->n_ports) != STORE_OK)
        v->n_ports = 0;
    v->has_run = store_instance_run(s, in->id, &v->run) == STORE_OK;
    struct instance_gang g;
    if (store_instance_gang(s, in->id, &g) == STORE_OK)
        v->rendezvous_timeout_s = g.rendezvous_timeout_s;
    return STORE_OK;
}

void instance_view_free(struct instance_view *v)
{
    if (!v)
        return;
    free(v->nodes);
    free(v->ssh_key_ids);
    store_instance_run_free(&v->run);
    free(v);
}

json_t *instance_view_json(const struct instance_view *v)
{
    const struct instance *in = &v->in;
    int running = strcmp(in->state, "running") == 0;
    json_t *arr = json_array();
    for (size_t i = 0; i < v->n_nodes; i++) {
        const struct instance_node *p = &v->nodes[i];
        json_t *cards = json_loads(p->cards, 0, NULL);
        json_t *rank = json_pack("{s:I, s:s, s:s, s:o, s:s, s:s}", "rank", (json_int_t)p->rank, "node_id", p->node_id,
                                 "node_name", p->node_name, "cards", cards ? cards : json_array(), "phase", p->phase,
                                 "message", p->message);
        if (!rank)
            continue;
        json_object_set_new(rank, "ssh", running ? rank_ssh_json(in, p) : json_null());
        char data[254];
        node_data_address(p->data_host, p->data_address, p->public_host, p->agent_url, data, sizeof data);
        json_object_set_new(rank, "data_address", json_string(data));
        json_object_set_new(rank, "published", running ? rank_published_json(p) : json_array());
        json_array_append_new(arr, rank);
    }
    json_t *j =
        json_pack("{s:s, s:s, s:s, s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", in->id, "name",
                  in->name, "gpu_type", in->gpu_model, "card_count", (json_int_t)in->card_count, "image", in->image,
                  "volume_id", in->volume_id, "state", in->state, "desired_state", in->desired, "phase", in->phase,
                  "state_reason", in->state_reason, "nodes", arr, "state_since", json_time(in->state_since, 0),
                  "created_at", json_time(in->created_at, 0), "updated_at", json_time(in->updated_at, 0));
    if (!j)
        return NULL;
    json_object_set_new(j, "low_balance", json_boolean(v->low_balance));
    json_object_set_new(j, "reservation_id", v->reservation_id[0] ? json_string(v->reservation_id) : json_null());
    json_t *named = v->ssh_key_ids ? json_loads(v->ssh_key_ids, 0, NULL) : NULL;
    json_object_set_new(j, "ssh_key_ids", named ? named : json_null());
    json_t *asked = json_array();
    for (size_t i = 0; i < v->n_ports; i++)
        json_array_append_new(asked, json_integer(v->ports[i]));
    json_object_set_new(j, "ports", asked);
    instance_run_json(v->has_run ? &v->run : NULL, j);
    json_object_set_new(j, "restart_policy", json_string(in->restart_policy[0] ? in->restart_policy : "never"));
    json_object_set_new(j, "max_runtime_minutes",
                        in->max_runtime_minutes > 0 ? json_integer(in->max_runtime_minutes) : json_null());
    json_object_set_new(j, "restart_count", json_integer(in->restart_count));
    json_object_set_new(j, "exit_code", in->exit_known ? json_integer(in->exit_code) : json_null());
    if (v->rendezvous_timeout_s >= 0)
        json_object_set_new(j, "rendezvous_timeout_s", json_integer(v->rendezvous_timeout_s));
    return j;
}

json_t *instance_json(struct store *s, const struct instance *in, const struct funds_seen *seen)
{
    struct instance_view *v = NULL;
    json_t *j = instance_view_read(s, in, seen, &v) == STORE_OK ? instance_view_json(v) : NULL;
    instance_view_free(v);
    return j;
}
