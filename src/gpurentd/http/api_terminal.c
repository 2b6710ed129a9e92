/* api_terminal.c: the web terminal's two routes.
 *
 *   POST /v1/instances/{id}/terminal-tokens  {"rank": N} -> a single-use
 *        token (domain/terminal_tokens.c) for that user, instance and rank
 *   GET  /v1/instances/{id}/terminal?token=  the WebSocket (RFC 6455):
 *        authorised by the token alone, as a browser cannot send an API key
 *        with one; refused from other sites' pages (and from DNS names
 *        that could be rebound to this server); then handed to the relay
 *        (loops/terminal_relay.c), which holds no pool thread
 *
 * Neither waits on an agent: the relay connects to it after the switch. */
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/log.h"
#include "gpurent/secrets.h"
#include "http/api.h"
#include "store/store.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The rank's node and workload of a running instance of user_id. Replies
 * 404 / 409 / 500 and returns -1 when there is none. */
static int running_rank(struct http_request *req, const char *user_id, const char *id, int64_t rank, int rank_in_body,
                        struct instance_node *out)
{
    struct store *s = store_thread();
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return -1;
    }
    struct instance in;
    int rc = id_valid("ins", id) ? store_instance_get(s, user_id, id, &in) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        http_error(req, ERR_NOT_FOUND, NULL, "no instance %.32s", id);
        return -1;
    }
    if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return -1;
    }
    int64_t ranks = (in.card_count + PLACEMENT_NODE_CARDS - 1) / PLACEMENT_NODE_CARDS;
    if (ranks < 1)
        ranks = 1;
    if (rank >= ranks) {
        http_error(req, rank_in_body ? ERR_INVALID_FIELD : ERR_INVALID_QUERY, "rank",
                   "rank must be from 0 to %lld for this instance", (long long)(ranks - 1));
        return -1;
    }
    if (strcmp(in.state, "running") != 0) {
        http_error_ext(req, ERR_INVALID_STATE, NULL, json_pack("{s:s}", "state", in.state),
                       "instance %s is %s; a terminal opens on a running instance", in.id, in.state);
        return -1;
    }
    struct instance_node nodes[PLACEMENT_MAX_NODES];
    size_t n = 0;
    if (store_instance_nodes(s, in.id, nodes, PLACEMENT_MAX_NODES, &n) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (nodes[i].rank == rank && nodes[i].workload_id[0]) {
            *out = nodes[i];
            return 0;
        }
    http_error_ext(req, ERR_INVALID_STATE, "rank", json_pack("{s:s}", "state", in.state),
                   "rank %lld of instance %s has no workload on a node", (long long)rank, in.id);
    return -1;
}

void api_terminal_tokens_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"rank", JSON_KIND_INTEGER, 1, 0},
        {NULL,   0,                 0, 0},
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    json_int_t rank = json_integer_value(json_object_get(body, "rank"));
    json_decref(body);
    if (rank < 0 || rank >= PLACEMENT_MAX_NODES) {
        http_error(req, ERR_INVALID_FIELD, "rank", "rank must be from 0 to %d", PLACEMENT_MAX_NODES - 1);
        return;
    }
    struct instance_node node;
    if (running_rank(req, req->user_id, req->params[0], rank, 1, &node) < 0)
        return;
    char token[TERMINAL_TOKEN_MAX];
    int64_t expires_at;
    int rc = terminal_token_issue(req->user_id, req->key_id, req->params[0], rank, daemon_config->terminal_token_ttl_s,
                                  token, &expires_at);
    if (rc == -1) {
        http_error(req, ERR_TOO_MANY_REQUESTS, NULL, "too many terminal tokens are waiting to be used; use or let "
                                                     "them expire first");
        return;
    }
    if (rc < 0) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    char url[256];
    snprintf(url, sizeof url, "/v1/instances/%s/terminal?token=%s", req->params[0], token);
    /* A token is no resource one could GET: no Location. */
    http_reply_json(req, 201,
                    json_pack("{s:s, s:s, s:I, s:o}", "token", token, "url", url, "rank", (json_int_t)rank,
                              "expires_at", json_time(expires_at, 0)));
    secret_wipe(token, sizeof token);
}

/* "scheme://host[:port]" of an http(s) URL as a browser writes an Origin:
 * lower case, no default port, no path. "" when url is no such URL. */
static void origin_of(const char *url, char *out, size_t outlen)
{
    out[0] = '\0';
    const char *sep = strstr(url, "://");
    if (!sep)
        return;
    size_t scheme_len = (size_t)(sep - url);
    int https = scheme_len == 5 && strncasecmp(url, "https", 5) == 0;
    if (!https && !(scheme_len == 4 && strncasecmp(url, "http", 4) == 0))
        return;
    const char *authority = sep + 3;
    size_t len = strcspn(authority, "/?#");
    char host[256];
    if (len == 0 || len >= sizeof host)
        return;
    for (size_t i = 0; i < len; i++)
        host[i] = (char)tolower((unsigned char)authority[i]);
    host[len] = '\0';
    const char *default_port = https ? ":443" : ":80";
    size_t dl = strlen(default_port);
    if (len > dl && strcmp(host + len - dl, default_port) == 0)
        host[len - dl] = '\0';
    snprintf(out, outlen, "%s://%s", https ? "https" : "http", host);
}

/* Whether an origin's host is an address or localhost: names no one else
 * can point at this server (DNS rebinding needs a name the attacker's
 * resolver answers for). */
static int host_is_address(const char *origin)
{
    const char *host = strstr(origin, "://") + 3;
    if (host[0] == '[')
        return 1; /* an IPv6 literal */
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(host, ":"), host);
    struct in_addr a;
    return inet_pton(AF_INET, name, &a) == 1 || strcmp(name, "localhost") == 0;
}

/* A browser names the page's origin, and a WebSocket has no CORS of its
 * own: without this any site could use a token it got hold of from the
 * victim's browser. The console's origin is public_url's, one listed in
 * cors_origins, or this server's own page reached by address (its origin
 * the request's own Host). A page on a name matching Host is not enough: a
 * name the attacker controls can be rebound to this server's address. No
 * Origin: not a browser, the token alone decides. */
static int origin_allowed(struct http_request *req)
{
    const char *origin = http_header(req, "Origin"), *host = http_header(req, "Host");
    if (!origin)
        return 1;
    if (http_origin_listed(req, origin))
        return 1;
    char page[300], own[300];
    origin_of(origin, page, sizeof page);
    if (!page[0])
        return 0;
    origin_of(daemon_config ? daemon_config->public_url : "", own, sizeof own);
    if (own[0] && strcmp(page, own) == 0)
        return 1;
    if (!host || host[strcspn(host, "/?#")])
        return 0;
    char requested[300];
    snprintf(requested, sizeof requested, "%.*s%s", (int)(strstr(page, "://") + 3 - page), page, host);
    origin_of(requested, own, sizeof own);
    return strcmp(page, own) == 0 && host_is_address(page);
}

/* Whether the API key that asked for a token still authenticates: a token
 * is a minute of that key's authority, so one revoked since (logged out, a
 * leaked key revoked, its password changed, its account suspended) or
 * expired opens no terminal. Replies 401 (403 suspended) when not. */
static int key_still_good(struct http_request *req, const char *key_id)
{
    struct store *s = store_thread();
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return 0;
    }
    switch (account_key_standing(s, key_id, clock_now())) {
    case KEY_IN_FORCE: return 1;
    case KEY_GONE:
        http_error(req, ERR_UNAUTHORIZED, "token",
                   "the API key that asked for this terminal token is revoked or expired");
        return 0;
    case KEY_OWNER_DISABLED: http_error(req, ERR_ACCOUNT_DISABLED, NULL, NULL); return 0;
    default: http_error(req, ERR_INTERNAL, NULL, NULL); return 0;
    }
}

void api_instances_terminal(struct http_request *req)
{
    static const char *const allowed[] = {"token", "rank", "cols", "rows", NULL};
    if (http_query_allow(req, allowed) < 0)
        return;
    int64_t want_rank, cols, rows;
    if (http_query_int(req, "rank", 0, PLACEMENT_MAX_NODES - 1, -1, &want_rank) < 0 ||
        http_query_int(req, "cols", 1, 1000, 80, &cols) < 0 || http_query_int(req, "rows", 1, 1000, 24, &rows) < 0)
        return;
    if (!origin_allowed(req)) {
        http_error(req, ERR_FORBIDDEN, NULL,
                   "a terminal opens from the console's own pages only: its origin is public_url's, one listed "
                   "in cors_origins, or this server reached by address (Origin %.100s)",
                   http_header(req, "Origin"));
        return;
    }
    /* The handshake before the token, so a request that could never
     * switch does not spend it. */
    const char *upgrade = http_header(req, "Upgrade");
    const char *version = http_header(req, "Sec-WebSocket-Version"), *key = http_header(req, "Sec-WebSocket-Key");
    char accept[64];
    if (strcmp(req->method, "GET") != 0 || !upgrade || strcasecmp(upgrade, "websocket") != 0 ||
        !http_header_has_token(req, "Connection", "upgrade") || !key || websocket_accept(key, accept) < 0 /* not the base64 of 16 bytes */) {
        http_error(req, ERR_BAD_REQUEST, NULL,
                   "this is a WebSocket endpoint: GET with Upgrade: websocket, Connection: Upgrade and a "
                   "Sec-WebSocket-Key");
        return;
    }
    if (!version || strcmp(version, "13") != 0) {
        http_add_header(req, "Sec-WebSocket-Version", "13");
        http_error(req, ERR_BAD_REQUEST, NULL, "Sec-WebSocket-Version must be 13");
        return;
    }
    const char *token = http_query(req, "token");
    if (!token) {
        http_error(req, ERR_UNAUTHORIZED, "token", "a terminal token is required (POST .../terminal-tokens)");
        return;
    }
    char user_id[ID_MAX], key_id[ID_MAX];
    int64_t rank;
    switch (terminal_token_take(token, req->params[0], user_id, key_id, &rank)) {
    case TOKEN_OK: break;
    case TOKEN_EXPIRED:
        http_error(req, ERR_UNAUTHORIZED, "token", "the terminal token has expired; ask for a new one");
        return;
    case TOKEN_OTHER_INSTANCE:
        http_error(req, ERR_FORBIDDEN, "token", "the terminal token is for another instance");
        return;
    default:
        http_error(req, ERR_UNAUTHORIZED, "token", "the terminal token is unknown or was used already");
        return;
    }
    if (!key_still_good(req, key_id))
        return;
    if (want_rank >= 0 && want_rank != rank) {
        http_error(req, ERR_FORBIDDEN, "rank", "the terminal token is for rank %lld", (long long)rank);
        return;
    }
    struct instance_node node;
    if (running_rank(req, user_id, req->params[0], rank, 0, &node) < 0)
        return;
    int reserved = terminal_relay_reserve(user_id);
    if (reserved == -2) {
        http_error(req, ERR_TOO_MANY_REQUESTS, NULL, "you have %lld terminals open, the most one user may",
                   (long long)daemon_config->max_terminals_per_user);
        return;
    }
    if (reserved < 0) {
        http_error(req, ERR_UNAVAILABLE, NULL, "the server has as many terminals open as it takes; try again later");
        return;
    }
    struct terminal_target *g = calloc(1, sizeof *g);
    if (!g) {
        terminal_relay_release(user_id);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    snprintf(g->user_id, sizeof g->user_id, "%s", user_id);
    snprintf(g->key_id, sizeof g->key_id, "%s", key_id);
    snprintf(g->instance_id, sizeof g->instance_id, "%s", req->params[0]);
    g->rank = rank;
    snprintf(g->agent_url, sizeof g->agent_url, "%s", node.agent_url);
    snprintf(g->secret, sizeof g->secret, "%s", node.secret);
    snprintf(g->node_name, sizeof g->node_name, "%s", node.node_name);
    snprintf(g->workload_id, sizeof g->workload_id, "%s", node.workload_id);
    g->cols = (unsigned)cols;
    g->rows = (unsigned)rows;
    secret_wipe(node.secret, sizeof node.secret);
    http_add_header(req, "Connection", "Upgrade");
    http_add_header(req, "Sec-WebSocket-Accept", accept);
    if (http_reply_upgrade(req, "websocket", terminal_relay_upgraded, g) < 0) {
        terminal_relay_release(user_id);
        secret_wipe(g->secret, sizeof g->secret);
        free(g);
        http_error(req, ERR_INTERNAL, NULL, NULL);
    }
}
