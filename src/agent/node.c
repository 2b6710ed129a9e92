/* node.c: the nodes one agent process serves (one real node, or many
 * simulated ones under /nodes/{name}), their secrets, and the facts they
 * report: GPU inventory from the discovery tool or from configuration.
 * Per node a name, a secret, a mutex, a workload list and its last facts
 * reply (1.3 KB for 8 cards, so that a poll that finds nothing new renders
 * nothing) are kept; the inventory is shared. */
#include "agent.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpurent/clock.h"
#include "gpurent/secrets.h"

static int model_code_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= 'A' && s[n] <= 'Z') || (s[n] >= 'a' && s[n] <= 'z') || (s[n] >= '0' && s[n] <= '9') ||
              s[n] == '-' || s[n] == '_'))
            return 0;
    return n > 0 && n < 32;
}

int agent_inventory_from_config(const struct agent_conf *c, struct gpu_facts *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    int mem = 0;
    const char *vendor, *stack, *name;
    char generic[96];
    if (!model_code_valid(c->inventory_model)) {
        snprintf(err, errlen, "inventory_model: '%s' is not a model code like MI450", c->inventory_model);
        return -1;
    }
    if (discovery_model_defaults(c->inventory_model, &mem, &vendor, &stack, &name) < 0) {
        /* A model the catalog gained later: AMD Instinct parts are MI-something. */
        int amd = strncmp(c->inventory_model, "MI", 2) == 0;
        vendor = amd ? "AMD" : "NVIDIA";
        stack = amd ? "ROCm" : "CUDA";
        snprintf(generic, sizeof generic, "%s %s", amd ? "AMD Instinct" : "NVIDIA", c->inventory_model);
        name = generic;
        if (c->inventory_memory_gb <= 0) {
            snprintf(err, errlen, "inventory_model %s is not one the agent knows; set inventory_memory_gb too",
                     c->inventory_model);
            return -1;
        }
    }
    if (c->inventory_memory_gb > 0)
        mem = (int)c->inventory_memory_gb;
    snprintf(f->vendor, sizeof f->vendor, "%s", vendor);
    snprintf(f->stack, sizeof f->stack, "%s", stack);
    /* Without a configured version, a current release of the vendor's. */
    int amd = strcmp(vendor, "AMD") == 0;
    snprintf(f->driver_version, sizeof f->driver_version, "%s",
             c->inventory_driver_version[0] ? c->inventory_driver_version : amd ? "6.8.5" : "550.54.15");
    snprintf(f->stack_version, sizeof f->stack_version, "%s",
             c->inventory_stack_version[0] ? c->inventory_stack_version : amd ? "6.2.0" : "12.4");
    f->n_cards = (size_t)c->inventory_cards;
    for (size_t i = 0; i < f->n_cards; i++) {
        struct gpu_card *card = &f->cards[i];
        card->index = (int)i;
        snprintf(card->model, sizeof card->model, "%s", c->inventory_model);
        snprintf(card->name, sizeof card->name, "%s", name);
        card->memory_gb = mem;
        card->healthy = 1;
    }
    for (const char *p = c->inventory_failed_cards; *p;) {
        char *end;
        long idx = strtol(p, &end, 10);
        if (end == p)
            break;
        if (idx >= 0 && (size_t)idx < f->n_cards) {
            f->cards[idx].healthy = 0;
            snprintf(f->cards[idx].health_reason, sizeof f->cards[idx].health_reason,
                     "uncorrectable ECC errors (configured failure)");
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

int agent_inventory_refresh(struct agent *a)
{
    struct gpu_facts *f = malloc(sizeof *f);
    char err[256] = "";
    if (!f)
        return -1;
    int rc;
    if (strcmp(a->conf->discovery, "config") == 0)
        rc = agent_inventory_from_config(a->conf, f, err, sizeof err);
    else
        rc = discovery_run(a->conf->discovery, NULL, (int)a->conf->discovery_timeout_s, f, err, sizeof err);
    pthread_mutex_lock(&a->inv.lock);
    if (rc == 0) {
        if (a->inv.error[0] || !a->inv.ok)
            log_info("discovery (%s): %zu cards, %s %s", a->conf->discovery, f->n_cards, f->vendor, f->stack);
        a->inv.facts = *f;
        a->inv.ok = 1;
        a->inv.error[0] = '\0';
    } else {
        if (strcmp(a->inv.error, err) != 0)
            log_error("discovery (%s) failed: %s%s", a->conf->discovery, err,
                      a->inv.ok ? "; reporting the last known cards as unhealthy" : "");
        snprintf(a->inv.error, sizeof a->inv.error, "%s", err[0] ? err : "unknown error");
    }
    a->inv.generation++;
    pthread_mutex_unlock(&a->inv.lock);
    free(f);
    return rc;
}

int agent_inventory_card(struct agent *a, int index, char stack[8], char *why, size_t whylen)
{
    int found = 0;
    pthread_mutex_lock(&a->inv.lock);
    if (a->inv.ok) {
        for (size_t i = 0; i < a->inv.facts.n_cards && !found; i++) {
            const struct gpu_card *c = &a->inv.facts.cards[i];
            if (c->index != index)
                continue;
            found = c->healthy ? 1 : -1;
            if (!c->healthy && why)
                snprintf(why, whylen, "%s", c->health_reason[0] ? c->health_reason : "reported failed");
        }
    }
    snprintf(stack, 8, "%s", a->inv.ok ? a->inv.facts.stack : "");
    pthread_mutex_unlock(&a->inv.lock);
    return found;
}

/* The facts document of node n showing exits and address (NULL: none
 * found), and in *generation the inventory's generation it shows. */
static json_t *facts_json(struct agent *a, struct agent_node *n, int64_t exits, const char *address,
                          uint64_t *generation, char *err, size_t errlen)
{
    json_t *cards = json_array();
    pthread_mutex_lock(&a->inv.lock);
    *generation = a->inv.generation;
    if (!a->inv.ok) {
        snprintf(err, errlen, "GPU discovery has not succeeded yet: %s", a->inv.error[0] ? a->inv.error : "starting");
        pthread_mutex_unlock(&a->inv.lock);
        json_decref(cards);
        return NULL;
    }
    const struct gpu_facts *f = &a->inv.facts;
    for (size_t i = 0; i < f->n_cards; i++) {
        const struct gpu_card *c = &f->cards[i];
        char reason[sizeof a->inv.error + 32];
        int healthy = c->healthy;
        snprintf(reason, sizeof reason, "%s", c->health_reason);
        /* A tool that stopped answering says nothing good about the cards. */
        if (a->inv.error[0]) {
            healthy = 0;
            snprintf(reason, sizeof reason, "discovery failed: %s", a->inv.error);
        }
        json_array_append_new(cards, json_pack("{s:i, s:s, s:s, s:i, s:b, s:s}", "index", c->index, "model", c->model,
                                               "name", c->name, "memory_gb", c->memory_gb, "healthy", healthy,
                                               "health_reason", reason));
    }
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:o}", "node", n->name, "agent_version", AGENT_VERSION,
                          "runtime", a->conf->runtime, "vendor", f->vendor, "stack", f->stack, "driver_version",
                          f->driver_version, "stack_version", f->stack_version, "cards", cards);
    pthread_mutex_unlock(&a->inv.lock);
    /* The heartbeat carries it so that the control plane lists this node's
     * workloads as soon as one ends, rather than at its next sweep. The
     * workloads themselves are not counted here: a count would move with
     * every placement and removal, and the control plane reads a reply
     * that repeats the last one byte for byte without parsing it. */
    json_object_set_new(o, "workload_exits", json_integer((json_int_t)exits));
    /* Set before the API served and never changed after: no lock. */
    json_object_set_new(o, "ssh",
                        n->ssh_port > 0 ? json_pack("{s:i, s:s, s:s}", "port", n->ssh_port, "host_key",
                                                    n->ssh_host_key, "fingerprint", n->ssh_fingerprint)
                                        : json_null());
    json_object_set_new(o, "publish_ports",
                        n->publish_first > 0
                            ? json_pack("{s:i, s:i}", "first", n->publish_first, "last", n->publish_last)
                            : json_null());
    /* Where the other ranks of a multi-node instance reach this node;
     * null when no address could be found (the admin's data_host then). */
    json_object_set_new(o, "data_address", address ? json_string(address) : json_null());
    return o;
}

/* A copy of the cached reply into *text, when it shows what is asked. Call
 * under the node lock. */
static int facts_cached(const struct facts_cache *c, uint64_t generation, int64_t exits, const char *address,
                        char **text, size_t *len, char etag[AGENT_ETAG_MAX])
{
    if (!c->text || c->inv_generation != generation || c->workload_exits != exits ||
        strcmp(c->data_address, address) != 0)
        return 0;
    *text = malloc(c->len + 1);
    if (*text) {
        memcpy(*text, c->text, c->len + 1);
        *len = c->len;
        memcpy(etag, c->etag, AGENT_ETAG_MAX);
    }
    return 1;
}

char *agent_facts_reply(struct agent *a, struct agent_node *n, size_t *len, char etag[AGENT_ETAG_MAX], char *err,
                        size_t errlen)
{
    char addr[SPEC_CLUSTER_ADDRESS_MAX];
    if (fabric_data_address(a, addr, sizeof addr) != 0)
        addr[0] = '\0';
    pthread_mutex_lock(&a->inv.lock);
    uint64_t generation = a->inv.generation;
    pthread_mutex_unlock(&a->inv.lock);
    pthread_mutex_lock(&n->lock);
    int64_t exits = n->workload_exits;
    char *text = NULL;
    int hit = facts_cached(&n->facts, generation, exits, addr, &text, len, etag);
    pthread_mutex_unlock(&n->lock);
    if (hit) {
        if (!text)
            snprintf(err, errlen, "out of memory");
        return text;
    }
    json_t *facts = facts_json(a, n, exits, addr[0] ? addr : NULL, &generation, err, errlen);
    text = facts ? json_dumps(facts, JSON_COMPACT) : NULL;
    json_decref(facts);
    if (!text) {
        if (facts)
            snprintf(err, errlen, "out of memory");
        return NULL;
    }
    *len = strlen(text);
    char digest[65];
    sha256_hex(text, *len, digest);
    snprintf(etag, AGENT_ETAG_MAX, "\"%.32s\"", digest);
    /* Kept for the polls to come; a render racing this one stores the same
     * or a newer view, either of them right for its keys. */
    char *kept = malloc(*len + 1);
    if (kept) {
        memcpy(kept, text, *len + 1);
        pthread_mutex_lock(&n->lock);
        free(n->facts.text);
        n->facts.text = kept;
        n->facts.len = *len;
        memcpy(n->facts.etag, etag, AGENT_ETAG_MAX);
        n->facts.inv_generation = generation;
        n->facts.workload_exits = exits;
        snprintf(n->facts.data_address, sizeof n->facts.data_address, "%s", addr);
        pthread_mutex_unlock(&n->lock);
    }
    return text;
}

json_t *workload_json(const struct workload *w)
{
    json_t *gpus = json_array();
    for (int i = 0; i < w->spec.n_gpus; i++)
        json_array_append_new(gpus, json_integer(w->spec.gpus[i]));
    json_t *exited_at = w->exited_at > 0 ? json_integer((json_int_t)w->exited_at) : json_null();
    json_t *exit_code = w->exit_known ? json_integer(w->exit_code) : json_null();
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:o, s:I, s:I, s:o, s:o}", "id", w->id, "phase",
                          wl_phase_name(w->phase), "message", w->message, "image", w->spec.image, "gpus", gpus,
                          "created_at", (json_int_t)w->created_at, "updated_at", (json_int_t)w->updated_at,
                          "exited_at", exited_at, "exit_code", exit_code);
    if (j)
        spec_public_json(&w->spec, j); /* secret values as "***" */
    /* Which keys it holds, for the control plane to find one that missed a
     * change of the account's keys; only for a spec with ssh. */
    if (j && w->spec.ssh.present) {
        char digest[65];
        spec_ssh_keys_digest(&w->spec.ssh, digest);
        json_object_set_new(j, "ssh_keys_digest", json_string(digest));
    }
    /* The health check's verdict, only for a spec that has one. */
    if (j && w->spec.health.present) {
        json_object_set_new(j, "health", json_string(wl_health_name(w->health)));
        json_object_set_new(j, "health_checked_at_ms", w->health_checked_at_ms > 0
                                                            ? json_integer((json_int_t)w->health_checked_at_ms)
                                                            : json_null());
        json_object_set_new(j, "health_message", json_string(w->health_message));
    }
    return j;
}

json_t *workload_json_ended(const struct agent *a, const struct agent_node *n, const struct workload *w)
{
    json_t *j = workload_json(w);
    char dir[PATH_MAX];
    if (j && (w->phase == WL_EXITED || w->phase == WL_FAILED) && agent_node_dir(a, n, dir, sizeof dir) == 0)
        json_object_set_new(j, "last_lines", wl_log_last_lines(dir, w->id, WL_LAST_LINES_MAX));
    return j;
}

/* ---------------------------------------------------------------- nodes */

static int node_cmp(const void *a, const void *b)
{
    return strcmp(((const struct agent_node *)a)->name, ((const struct agent_node *)b)->name);
}

int agent_nodes_init(struct agent *a, char **names, size_t n)
{
    a->nodes = calloc(n ? n : 1, sizeof *a->nodes);
    if (!a->nodes)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!agent_name_valid(names[i])) {
            log_error("node name '%s' must be 1 to 63 of a-z, 0-9, '_' and '-'", names[i]);
            goto fail;
        }
        snprintf(a->nodes[i].name, sizeof a->nodes[i].name, "%s", names[i]);
    }
    qsort(a->nodes, n, sizeof *a->nodes, node_cmp);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(a->nodes[i - 1].name, a->nodes[i].name) == 0) {
            log_error("node name '%s' appears twice", a->nodes[i].name);
            goto fail;
        }
    }
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_init(&a->nodes[i].lock, NULL);
        pthread_cond_init(&a->nodes[i].phase_moved, &monotonic);
    }
    pthread_condattr_destroy(&monotonic);
    a->n_nodes = n;
    return 0;
fail:
    free(a->nodes);
    a->nodes = NULL;
    return -1;
}

void agent_nodes_free(struct agent *a)
{
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct agent_node *n = &a->nodes[i];
        for (size_t k = 0; k < n->n_wl; k++)
            workload_free(n->wl[k]);
        free(n->wl);
        free(n->facts.text);
        memset(n->secret, 0, sizeof n->secret);
        pthread_mutex_destroy(&n->lock);
        pthread_cond_destroy(&n->phase_moved);
    }
    free(a->nodes);
    a->nodes = NULL;
    a->n_nodes = 0;
}

struct agent_node *agent_node_find(struct agent *a, const char *name)
{
    struct agent_node key;
    if (strlen(name) >= sizeof key.name)
        return NULL;
    snprintf(key.name, sizeof key.name, "%s", name);
    return bsearch(&key, a->nodes, a->n_nodes, sizeof *a->nodes, node_cmp);
}

int agent_node_dir(const struct agent *a, const struct agent_node *n, char *out, size_t outlen)
{
    int len = a->fleet ? snprintf(out, outlen, "%s/nodes/%s", a->conf->state_dir, n->name)
                       : snprintf(out, outlen, "%s", a->conf->state_dir);
    return len < 0 || (size_t)len >= outlen ? -1 : 0;
}

int agent_node_add(struct agent_node *n, struct workload *w)
{
    if (n->n_wl == n->cap_wl) {
        size_t cap = n->cap_wl ? n->cap_wl * 2 : 4;
        struct workload **g = realloc(n->wl, cap * sizeof *g);
        if (!g)
            return -1;
        n->wl = g;
        n->cap_wl = cap;
    }
    n->wl[n->n_wl++] = w;
    return 0;
}

void agent_node_remove(struct agent_node *n, struct workload *w)
{
    for (size_t i = 0; i < n->n_wl; i++) {
        if (n->wl[i] == w) {
            /* Keep the order: lists show workloads as they were created. */
            memmove(&n->wl[i], &n->wl[i + 1], (n->n_wl - i - 1) * sizeof *n->wl);
            n->n_wl--;
            return;
        }
    }
}

struct workload *agent_node_workload(struct agent_node *n, const char *id)
{
    for (size_t i = 0; i < n->n_wl; i++)
        if (strcmp(n->wl[i]->id, id) == 0)
            return n->wl[i];
    return NULL;
}

void agent_node_set_secret(struct agent_node *n, const char *secret)
{
    pthread_mutex_lock(&n->lock);
    snprintf(n->secret, sizeof n->secret, "%s", secret);
    pthread_mutex_unlock(&n->lock);
}

int agent_node_secret(struct agent *a, struct agent_node *n, char out[65])
{
    pthread_mutex_lock(&n->lock);
    if (!n->secret[0] && !a->fleet) {
        int64_t now = clock_mono_ms();
        if (n->secret_tried_ms == 0 || now - n->secret_tried_ms >= 1000) {
            char err[512];
            n->secret_tried_ms = now;
            if (secret_read(a->conf->secret_file, n->secret, err, sizeof err) == 0)
                log_info("node %s: read its secret from %s", n->name, a->conf->secret_file);
            else
                log_debug("node %s: no secret yet: %s", n->name, err);
        }
    }
    memcpy(out, n->secret, 65);
    pthread_mutex_unlock(&n->lock);
    return out[0] ? 0 : -1;
}
