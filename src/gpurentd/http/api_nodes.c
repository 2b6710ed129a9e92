/* api_nodes.c: the admin's view of the fleet: register a node (its secret
 * is shown once), list and show nodes with their cards, change where users
 * and other ranks reach it (PATCH), set aside (cordon, drain, maintenance)
 * or return to service, and remove an idle node.
 * Handlers only change the database; the heartbeat loop talks to agents. */
#include "domain/facts.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/sign.h"
#include "gpurent/url.h"
#include "http/api.h"
#include "store/store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODES_PAGE_MAX 200

/* The node's pool (0024): which placement may use it. */
static void node_pool_json(struct store *s, const char *id, json_t *j)
{
    char pool[16];
    if (store_node_pool(s, id, pool) == STORE_OK)
        json_object_set_new(j, "pool", json_string(pool));
}

/* The node as the API shows it; NULL (logged) if a stored text is not valid
 * UTF-8, which jansson refuses to carry. */
static json_t *node_json(const struct node *n)
{
    json_t *labels = json_loads(n->labels, 0, NULL);
    json_t *j =
        json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:o, s:s, s:s, s:s, s:s, s:I, s:o, s:s, s:s,"
                  " s:I, s:I, s:I, s:o, s:o}",
                  "id", n->id, "name", n->name, "agent_url", n->agent_url, "gpu_model", n->gpu_model, "card_count",
                  (json_int_t)n->card_count, "fabric", n->fabric, "region", n->region, "labels",
                  labels ? labels : json_object(), "state", n->state, "state_reason", n->state_reason, "admin_state",
                  n->admin_state, "health", n->health, "missed_heartbeats", (json_int_t)n->missed_beats, "last_seen_at",
                  json_time(n->last_seen_at, 1), "driver_version", n->driver_version, "stack_version", n->stack_version,
                  "cards_total", (json_int_t)n->cards_total, "cards_free", (json_int_t)n->cards_free, "cards_in_use",
                  (json_int_t)n->cards_in_use, "created_at", json_time(n->created_at, 0), "updated_at",
                  json_time(n->updated_at, 0));
    if (!j) {
        log_error("nodes: cannot show %s: a stored text is not valid UTF-8", n->id);
        return NULL;
    }
    json_object_set_new(j, "admin_reason", json_string(n->admin_reason));
    char host[254];
    node_connect_host(n->public_host, n->agent_url, host, sizeof host);
    json_object_set_new(j, "public_host", json_string(host));
    /* What other ranks of a multi-node instance reach it at, and why. */
    char data[254];
    node_data_address(n->data_host, n->data_address, n->public_host, n->agent_url, data, sizeof data);
    json_object_set_new(j, "data_address", json_string(data));
    json_object_set_new(j, "data_host", n->data_host[0] ? json_string(n->data_host) : json_null());
    json_object_set_new(j, "reported_data_address", n->data_address[0] ? json_string(n->data_address) : json_null());
    json_object_set_new(j, "ssh",
                        n->ssh_port > 0 ? json_pack("{s:I, s:s, s:s}", "port", (json_int_t)n->ssh_port, "host_key",
                                                    n->ssh_host_key, "fingerprint", n->ssh_host_fp)
                                        : json_null());
    /* The host ports its agent publishes instances' ports on: what an
     * operator opens in the firewall. */
    json_object_set_new(j, "publish_range",
                        n->publish_first > 0 ? json_pack("{s:I, s:I}", "first", (json_int_t)n->publish_first, "last",
                                                         (json_int_t)n->publish_last)
                                             : json_null());
    return j;
}

/* A host users can put after ssh's '@': a DNS name or an IPv4 or IPv6
 * address, 1..253 bytes, no brackets, user info or port. */
static int host_name_valid(const char *h)
{
    size_t n = strlen(h);
    if (n == 0 || n > 253 || h[0] == '-' || h[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)h[i]) && h[i] != '.' && h[i] != '-' && h[i] != ':')
            return 0;
    return 1;
}

#define DATA_HOST_RULE                                                                                    \
    "data_host must be an IPv4 or IPv6 address or a host name (labels of letters, digits and '-', up to 253 " \
    "bytes), or \"\" to use what the agent reports"

/* Names and fabric/region words: letters, digits, '.', '_' and '-',
 * starting with a letter or digit (names are lower case: they appear in
 * agent URLs). */
static int word_valid(const char *s, size_t max, int lower_only)
{
    size_t n = strlen(s);
    if (n == 0 || n > max || !isalnum((unsigned char)s[0]))
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(isdigit(c) || (islower(c)) || (!lower_only && isupper(c)) || c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

static int url_valid(const char *u)
{
    if (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)
        return 0;
    const char *host = strstr(u, "://") + 3;
    if (!*host || *host == '/')
        return 0;
    for (const char *p = u; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == '?' || *p == '#' || (unsigned char)*p >= 0x7f)
            return 0;
    return 1;
}

/* Warns when an agent URL is plain http:// to a host other than this
 * machine: the workload specs the control plane sends there (environments
 * that may hold users' secrets) and the facts it reads back would cross the
 * network in clear text. Signatures keep them from being forged, not from
 * being read. The registration still succeeds: a test bed may want it. */
static void warn_if_clear_text(const struct node *n)
{
    if (strncmp(n->agent_url, "http://", 7) != 0)
        return;
    char host[256];
    if (url_host(n->agent_url, host, sizeof host) == 0 && host_is_loopback(host))
        return;
    log_warn("nodes: %s (%s) registered at plain %s, not on loopback: workload specs and their environments "
             "would cross the network in clear text; serve the agent over TLS (its tls_cert and tls_key) and "
             "register an https:// URL",
             n->id, n->name, n->agent_url);
}

/* Checks labels: at most 32 string values, keys as word_valid. Returns the
 * offending key or "" for a bad shape, NULL when fine. */
static const char *labels_problem(json_t *labels)
{
    if (json_object_size(labels) > 32)
        return "";
    const char *k;
    json_t *v;
    json_object_foreach(labels, k, v)
    {
        if (!word_valid(k, 63, 0) || !json_is_string(v) || json_string_length(v) > 255)
            return k;
    }
    return NULL;
}

static int create_txn(struct store *s, void *node)
{
    return store_node_insert(s, node);
}

void api_nodes_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"name",        JSON_KIND_STRING,  1, 63 },
        {"agent_url",   JSON_KIND_STRING,  1, 512},
        {"gpu_model",   JSON_KIND_STRING,  1, 32 },
        {"card_count",  JSON_KIND_INTEGER, 1, 0  },
        {"fabric",      JSON_KIND_STRING,  0, 63 },
        {"region",      JSON_KIND_STRING,  0, 63 },
        {"labels",      JSON_KIND_OBJECT,  0, 0  },
        {"public_host", JSON_KIND_STRING,  0, 253},
        {"data_host",   JSON_KIND_STRING,  0, 253},
        {NULL,          0,                 0, 0  },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    static _Thread_local struct node n;
    memset(&n, 0, sizeof n);
    const char *name = json_string_value(json_object_get(body, "name"));
    const char *url = json_string_value(json_object_get(body, "agent_url"));
    const char *fabric = json_string_value(json_object_get(body, "fabric"));
    const char *region = json_string_value(json_object_get(body, "region"));
    const char *public_host = json_string_value(json_object_get(body, "public_host"));
    const char *data_host = json_string_value(json_object_get(body, "data_host"));
    json_t *labels = json_object_get(body, "labels");
    json_int_t cards = json_integer_value(json_object_get(body, "card_count"));
    const char *bad_label = labels ? labels_problem(labels) : NULL;
    char *labels_text = NULL;
    if (!word_valid(name, 63, 1))
        http_error(req, ERR_INVALID_FIELD, "name", "name must be lower-case letters, digits, '.', '_' or '-'");
    else if (!url_valid(url))
        http_error(req, ERR_INVALID_FIELD, "agent_url", "agent_url must be an http:// or https:// URL");
    else if (cards < 1 || cards > 64)
        http_error(req, ERR_INVALID_FIELD, "card_count", "card_count must be from 1 to 64");
    else if (fabric && !word_valid(fabric, 63, 0))
        http_error(req, ERR_INVALID_FIELD, "fabric", "fabric must be letters, digits, '.', '_' or '-'");
    else if (region && !word_valid(region, 63, 0))
        http_error(req, ERR_INVALID_FIELD, "region", "region must be letters, digits, '.', '_' or '-'");
    else if (public_host && !host_name_valid(public_host))
        http_error(req, ERR_INVALID_FIELD, "public_host",
                   "public_host must be a host name or an IP address (letters, digits, '.', '-' and ':')");
    else if (data_host && !data_host_valid(data_host))
        http_error(req, ERR_INVALID_FIELD, "data_host", "%s", DATA_HOST_RULE);
    else if (bad_label)
        http_error(req, ERR_INVALID_FIELD, "labels",
                   "labels must be at most 32 string values of up to 255 bytes with word keys (bad key '%.63s')",
                   bad_label);
    else if (id_new("node", n.id) < 0 || sign_secret_new(n.secret) < 0 ||
             !(labels_text = labels ? json_dumps(labels, JSON_COMPACT | JSON_SORT_KEYS) : strdup("{}")))
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else if (strlen(labels_text) >= sizeof n.labels)
        /* Cut short, the text would no longer be JSON. */
        http_error(req, ERR_INVALID_FIELD, "labels", "labels take at most %zu bytes written as compact JSON",
                   sizeof n.labels - 1);
    else {
        snprintf(n.name, sizeof n.name, "%s", name);
        snprintf(n.agent_url, sizeof n.agent_url, "%s", url);
        snprintf(n.gpu_model, sizeof n.gpu_model, "%s", json_string_value(json_object_get(body, "gpu_model")));
        snprintf(n.fabric, sizeof n.fabric, "%s", fabric ? fabric : "default");
        snprintf(n.region, sizeof n.region, "%s", region ? region : "default");
        snprintf(n.labels, sizeof n.labels, "%s", labels_text);
        /* Users connect here; by default the host the daemon reaches the agent at. */
        if (public_host)
            snprintf(n.public_host, sizeof n.public_host, "%s", public_host);
        else if (url_host(url, n.public_host, sizeof n.public_host) < 0)
            n.public_host[0] = '\0';
        snprintf(n.data_host, sizeof n.data_host, "%s", data_host ? data_host : "");
        n.card_count = cards;
        n.created_at = clock_now();
        struct store *s = store_thread();
        int rc = s ? store_txn(s, create_txn, &n) : STORE_ERROR;
        if (rc == STORE_NOT_FOUND)
            http_error(req, ERR_INVALID_FIELD, "gpu_model", "no GPU type %.32s in the catalog", n.gpu_model);
        else if (rc == STORE_CONFLICT)
            http_error(req, ERR_CONFLICT, "name", "a node named %s is already registered", n.name);
        else if (rc != STORE_OK || store_node_get(s, n.id, &n) != STORE_OK)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        else {
            log_info("nodes: registered %s (%s) at %s", n.id, n.name, n.agent_url);
            warn_if_clear_text(&n);
            heartbeat_wake();
            json_t *shown = node_json(&n);
            char location[64];
            snprintf(location, sizeof location, "/v1/admin/nodes/%s", n.id);
            http_add_header(req, "Location", location);
            if (shown)
                http_reply_json(req, 201, json_pack("{s:o, s:s}", "node", shown, "secret", n.secret));
            else
                http_error(req, ERR_INTERNAL, NULL, NULL);
        }
    }
    free(labels_text);
    json_decref(body);
}

void api_nodes_list(struct http_request *req)
{
    static const char *const allowed[] = {"state", "gpu_model", "fabric", "limit", "cursor", NULL};
    struct page pg;
    if (http_query_allow(req, allowed) < 0 || page_begin(req, NODES_PAGE_MAX, 50, &pg) < 0)
        return;
    struct node_filter f = {
        .state = http_query(req, "state"),
        .gpu_model = http_query(req, "gpu_model"),
        .fabric = http_query(req, "fabric"),
        .after_created = pg.after_t,
        .after_id = pg.after_id,
    };
    static const char *const states[] = {"pending",     "ready",       "cordoned", "draining",
                                         "maintenance", "unreachable", "offline",  "rejected"};
    int state_ok = !f.state;
    for (size_t i = 0; f.state && i < sizeof states / sizeof states[0]; i++)
        state_ok |= strcmp(f.state, states[i]) == 0;
    if (!state_ok) {
        http_error(req, ERR_INVALID_QUERY, "state",
                   "state must be pending, ready, cordoned, draining, maintenance, unreachable, offline or rejected");
        return;
    }
    struct node *nodes = malloc(sizeof *nodes * (size_t)(pg.limit + 1));
    size_t n = 0;
    struct store *s = store_thread();
    if (!nodes || !s || store_node_list(s, &f, nodes, (size_t)pg.limit + 1, &n) != STORE_OK) {
        free(nodes);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    size_t shown = page_shown(&pg, n);
    json_t *data = json_array();
    for (size_t i = 0; i < shown; i++) {
        json_t *j = node_json(&nodes[i]);
        if (j)
            node_pool_json(s, nodes[i].id, j);
        if (!j) {
            free(nodes);
            json_decref(data);
            http_error(req, ERR_INTERNAL, NULL, NULL);
            return;
        }
        json_array_append_new(data, j);
    }
    json_t *next = n > shown ? page_cursor(nodes[shown - 1].created_at, nodes[shown - 1].id) : json_null();
    free(nodes);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

/* Loads the node named by the path, replying 404 if there is none. */
static int load_node(struct http_request *req, struct store *s, struct node *n)
{
    int rc = id_valid("node", req->params[0]) ? store_node_get(s, req->params[0], n) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no node %.64s", req->params[0]);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    return rc;
}

static void reply_node_detail(struct http_request *req, struct store *s, const struct node *n, unsigned status)
{
    struct node_card cards[64];
    size_t nc;
    if (store_node_cards(s, n->id, cards, 64, &nc) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *j = node_json(n), *arr = json_array();
    if (j)
        node_pool_json(s, n->id, j);
    for (size_t i = 0; j && i < nc; i++) {
        json_t *card =
            json_pack("{s:I, s:s, s:I, s:b, s:s, s:b, s:o}", "index", (json_int_t)cards[i].idx, "model", cards[i].model,
                      "memory_gb", (json_int_t)cards[i].memory_gb, "healthy", cards[i].healthy, "health_reason",
                      cards[i].health_reason, "in_use", cards[i].instance_id[0] != 0, "instance_id",
                      cards[i].instance_id[0] ? json_string(cards[i].instance_id) : json_null());
        if (!card) {
            json_decref(j);
            j = NULL;
        }
        json_array_append_new(arr, card);
    }
    if (!j) {
        json_decref(arr);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_object_set_new(j, "cards", arr);
    http_reply_json(req, status, j);
}

void api_nodes_get(struct http_request *req)
{
    struct store *s = store_thread();
    static _Thread_local struct node n;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    /* One snapshot: a heartbeat committing between the node's row and its
     * cards showed a failed card beside the free count from before it. */
    if (store_read_begin(s) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    if (load_node(req, s, &n) == STORE_OK)
        reply_node_detail(req, s, &n, 200);
    store_read_end(s);
}

struct state_ctx {
    const char *id, *admin_state, *reason; /* what to set */
    int64_t now;                           /* when */
};

static int state_txn(struct store *s, void *vctx)
{
    struct state_ctx *ctx = vctx;
    return store_node_set_admin_state(s, ctx->id, ctx->admin_state, ctx->reason, ctx->now);
}

void api_nodes_set_state(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"state",  JSON_KIND_STRING, 1, 16 },
        {"reason", JSON_KIND_STRING, 0, 200},
        {NULL,     0,                0, 0  },
    };
    struct store *s = store_thread();
    static _Thread_local struct node n;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    const char *state = json_string_value(json_object_get(body, "state"));
    const char *reason = json_string_value(json_object_get(body, "reason"));
    const char *admin_state =
        strcmp(state, "ready") == 0 ? "active"
        : strcmp(state, "cordoned") == 0 || strcmp(state, "draining") == 0 || strcmp(state, "maintenance") == 0 ? state
                                                                                                                : NULL;
    if (!admin_state) {
        http_error(req, ERR_INVALID_FIELD, "state", "state must be ready, cordoned, draining or maintenance");
    } else if (load_node(req, s, &n) == STORE_OK) {
        struct state_ctx ctx = {n.id, admin_state, reason ? reason : "", clock_now()};
        if (store_txn(s, state_txn, &ctx) != STORE_OK || store_node_get(s, n.id, &n) != STORE_OK) {
            http_error(req, ERR_INTERNAL, NULL, NULL);
        } else {
            log_info("nodes: %s set to %s by %s%s%s", n.id, state, req->user_id, reason ? ": " : "",
                     reason ? reason : "");
            reply_node_detail(req, s, &n, 200);
        }
    }
    json_decref(body);
}

/* 409: the reserved pool without the node could not hold a booked hour. */
static void reply_pool_short(struct http_request *req, const char *id, int64_t hour)
{
    json_t *t = json_time(hour, 0);
    http_error_ext(req, ERR_CONFLICT, NULL, json_pack("{s:O}", "hour", t),
                   "without node %s the reserved pool cannot hold what is booked for the hour from %s; cancel or "
                   "wait out those reservations first",
                   id, json_string_value(t));
    json_decref(t);
}

struct hosts_ctx {
    const char *id, *public_host, *data_host; /* what to set; NULL: leave */
    const char *pool;                         /* on_demand or reserved; NULL: leave */
    int64_t now;                              /* when */
    int64_t short_hour;                       /* out: leaving the reserved pool would leave this hour short */
};

static int hosts_txn(struct store *s, void *vctx)
{
    struct hosts_ctx *ctx = vctx;
    int rc = STORE_OK;
    if ((ctx->public_host || ctx->data_host) &&
        (rc = store_node_set_hosts(s, ctx->id, ctx->public_host, ctx->data_host, ctx->now)) != STORE_OK)
        return rc;
    /* Booked hours keep their cards: a node leaves the reserved pool only
     * if the rest still holds every booking. */
    if (ctx->pool && strcmp(ctx->pool, "on_demand") == 0 &&
        (rc = reservation_pool_shrink_check(s, ctx->id, ctx->now, 0, &ctx->short_hour)) != STORE_OK)
        return rc;
    /* A busy node changes pools only once drained (STORE_CONFLICT). */
    return ctx->pool ? store_node_set_pool(s, ctx->id, ctx->pool, ctx->now) : STORE_OK;
}

/* PATCH /v1/admin/nodes/{id}: public_host (users' host; "" for the agent
 * URL's) and data_host (other ranks'; "" for what the agent reports). A
 * running instance keeps the addresses its ranks were given; the next
 * start uses the new ones. */
void api_nodes_patch(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"public_host", JSON_KIND_STRING, 0, 253},
        {"data_host",   JSON_KIND_STRING, 0, 253},
        {"pool",        JSON_KIND_STRING, 0, 16 },
        {NULL,          0,                0, 0  },
    };
    struct store *s = store_thread();
    static _Thread_local struct node n;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    const char *public_host = json_string_value(json_object_get(body, "public_host"));
    const char *data_host = json_string_value(json_object_get(body, "data_host"));
    const char *pool = json_string_value(json_object_get(body, "pool"));
    if (!public_host && !data_host && !pool) {
        http_error(req, ERR_MISSING_FIELD, "public_host", "give public_host, data_host, pool or more of them");
    } else if (pool && strcmp(pool, "on_demand") != 0 && strcmp(pool, "reserved") != 0) {
        http_error(req, ERR_INVALID_FIELD, "pool", "pool must be on_demand or reserved");
    } else if (public_host && public_host[0] && !host_name_valid(public_host)) {
        http_error(req, ERR_INVALID_FIELD, "public_host",
                   "public_host must be a host name or an IP address (letters, digits, '.', '-' and ':'), or \"\""
                   " for the host of agent_url");
    } else if (data_host && data_host[0] && !data_host_valid(data_host)) {
        http_error(req, ERR_INVALID_FIELD, "data_host", "%s", DATA_HOST_RULE);
    } else if (load_node(req, s, &n) == STORE_OK) {
        struct hosts_ctx ctx = {n.id, public_host, data_host, pool, clock_now(), 0};
        int rc = store_txn(s, hosts_txn, &ctx);
        if (rc == STORE_NOT_FOUND)
            http_error(req, ERR_NOT_FOUND, NULL, "no node %s", n.id);
        else if (rc == STORE_CONFLICT && ctx.short_hour)
            reply_pool_short(req, n.id, ctx.short_hour);
        else if (rc == STORE_CONFLICT)
            http_error(req, ERR_CONFLICT, "pool",
                       "node %s has %lld cards in use; drain it and move it to the %s pool once it is empty", n.id,
                       (long long)n.cards_in_use, pool);
        else if (rc != STORE_OK || store_node_get(s, n.id, &n) != STORE_OK)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        else {
            log_info("nodes: %s hosts changed by %s: public_host %s, data_host %s", n.id, req->user_id,
                     n.public_host[0] ? n.public_host : "(agent URL's)", n.data_host[0] ? n.data_host : "(reported)");
            reply_node_detail(req, s, &n, 200);
        }
    }
    json_decref(body);
}

struct remove_ctx {
    const char *id;     /* node */
    int64_t now;        /* when */
    int64_t short_hour; /* out: removing it would leave this booked hour short */
};

static int remove_txn(struct store *s, void *vctx)
{
    struct remove_ctx *ctx = vctx;
    int rc = reservation_pool_shrink_check(s, ctx->id, ctx->now, 1, &ctx->short_hour);
    return rc != STORE_OK ? rc : store_node_remove(s, ctx->id, ctx->now);
}

void api_nodes_delete(struct http_request *req)
{
    struct store *s = store_thread();
    static _Thread_local struct node n;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (load_node(req, s, &n) != STORE_OK)
        return;
    struct remove_ctx ctx = {n.id, clock_now(), 0};
    int rc = store_txn(s, remove_txn, &ctx);
    if (rc == STORE_CONFLICT && ctx.short_hour)
        reply_pool_short(req, n.id, ctx.short_hour);
    else if (rc == STORE_CONFLICT)
        http_error(req, ERR_CONFLICT, NULL, "node %s has %lld cards in use; drain it and wait until it is empty", n.id,
                   (long long)n.cards_in_use);
    else if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no node %s", n.id);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else {
        log_info("nodes: removed %s (%s)", n.id, n.name);
        http_reply_json(req, 204, NULL);
    }
}
