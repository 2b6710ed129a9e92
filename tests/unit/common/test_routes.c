/* test_routes.c: the route matcher of src/common/http.c. The matcher
 * (route_match and dispatch) is static: the smallest public way to reach it
 * is http_server_start with a route table, so these tests start a real
 * server on 127.0.0.1 with a port of its choosing and speak HTTP/1.1 to it
 * over a socket. Every route's handler is an echo that answers with the
 * route it was given and the {name} segments captured, so the tests see
 * exactly what the matcher chose. Two tables: a small one of our own for the
 * edges (exact paths, parameters, trailing slashes, 404, 405 and its Allow
 * list, long and odd segments, percent-encoding, which libmicrohttpd decodes
 * before the matcher sees the path), and the daemon's daemon_routes with
 * their handlers swapped for the echo (every route reachable under its own
 * pattern, and the Allow list of each). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <jansson.h>

#include "gpurent/http.h"
#include "gpurent/log.h"
#include "http/api.h"
#include "agent.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

/* ---------------------------------------------------------------- the echo */

/* Answers 200 with {"method", "pattern", "auth", "params": [...]}. */
static void echo(struct http_request *req)
{
    json_t *params = json_array();
    for (int i = 0; i < HTTP_MAX_PARAMS && req->params[i]; i++)
        json_array_append_new(params, json_string(req->params[i]));
    http_reply_json(req, 200,
                    json_pack("{s:s, s:s, s:i, s:o}", "method", req->route->method, "pattern", req->route->pattern,
                              "auth", (int)req->route->auth, "params", params));
}

/* Every level is let through: the tests are about matching. */
static int allow_all(struct http_request *req, enum http_auth level)
{
    (void)req;
    (void)level;
    return 0;
}

static const struct http_route own_routes[] = {
    {"GET", "/a", echo, AUTH_NONE, NULL},
    {"POST", "/a", echo, AUTH_USER, NULL},
    {"GET", "/a/b", echo, AUTH_NONE, NULL},
    {"PUT", "/items/special", echo, AUTH_NONE, NULL}, /* more literal: before /items/{id} (http.h) */
    {"GET", "/items/special", echo, AUTH_NONE, NULL},
    {"GET", "/items/{id}", echo, AUTH_NONE, NULL},
    {"DELETE", "/items/{id}", echo, AUTH_ADMIN, NULL},
    {"GET", "/items/{id}/parts/{part}", echo, AUTH_NONE, NULL},
    {"GET", "/plain", echo, AUTH_NONE, http_no_query},
    {NULL, NULL, NULL, AUTH_NONE, NULL},
};

static struct http_server *start(const struct http_route *routes)
{
    struct http_config cfg = {.host = "127.0.0.1",
                              .port = 0,
                              .threads = 2,
                              .max_connections = 32,
                              .max_connections_per_ip = 32,
                              .connection_timeout_s = 30,
                              .max_body_bytes = 4096,
                              .max_json_depth = 8,
                              .cors_origins = ""};
    return http_server_start(&cfg, routes, allow_all, NULL);
}

/* ---------------------------------------------------------------- a client */

struct reply {
    int status;          /* from the status line, -1 if none came */
    char allow[128];     /* the Allow header, "" if none */
    json_t *body;        /* parsed body, or NULL */
    char raw[16384];     /* everything received */
};

static void reply_free(struct reply *r)
{
    json_decref(r->body);
    r->body = NULL;
}

/* Sends one request (no body, Connection: close) and reads the whole reply.
 * The receive timeout only keeps a broken server from hanging the suite. */
static void request(const struct http_server *srv, const char *method, const char *path, struct reply *r)
{
    memset(r, 0, sizeof *r);
    r->status = -1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)http_server_port(srv))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    size_t cap = strlen(path) + 256;
    char *req = malloc(cap);
    assert_non_null(req);
    int len = snprintf(req, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                       method, path);
    for (int off = 0; off < len;) {
        ssize_t w = write(fd, req + off, (size_t)(len - off));
        assert_true(w > 0);
        off += (int)w;
    }
    free(req);
    size_t got = 0;
    ssize_t n;
    while (got < sizeof r->raw - 1 && (n = read(fd, r->raw + got, sizeof r->raw - 1 - got)) > 0)
        got += (size_t)n;
    close(fd);
    r->raw[got] = '\0';
    sscanf(r->raw, "HTTP/1.%*d %d", &r->status);
    const char *allow = strcasestr(r->raw, "\r\nAllow: ");
    if (allow) {
        allow += 9;
        size_t k = strcspn(allow, "\r\n");
        snprintf(r->allow, sizeof r->allow, "%.*s", (int)k, allow);
    }
    const char *body = strstr(r->raw, "\r\n\r\n");
    if (body && body[4])
        r->body = json_loads(body + 4, 0, NULL);
}

static const char *body_str(const struct reply *r, const char *key)
{
    const char *v = json_string_value(json_object_get(r->body, key));
    return v ? v : "";
}

static const char *param(const struct reply *r, size_t i)
{
    const char *v = json_string_value(json_array_get(json_object_get(r->body, "params"), i));
    return v ? v : "(none)";
}

static size_t n_params(const struct reply *r) { return json_array_size(json_object_get(r->body, "params")); }

static const char *error_code(const struct reply *r)
{
    const char *v = json_string_value(json_object_get(json_object_get(r->body, "error"), "code"));
    return v ? v : "";
}

/* Asserts that method path reached pattern, with params p0, p1 (NULL: none). */
static void expect_route(const struct http_server *srv, const char *method, const char *path, const char *pattern,
                         const char *p0, const char *p1)
{
    struct reply r;
    request(srv, method, path, &r);
    if (r.status != 200 || strcmp(body_str(&r, "pattern"), pattern) != 0 || strcmp(body_str(&r, "method"), method))
        fail_msg("%s %s: status %d, reached %s %s, want %s", method, path, r.status, body_str(&r, "method"),
                 body_str(&r, "pattern"), pattern);
    size_t want = p1 ? 2 : p0 ? 1 : 0;
    assert_int_equal(n_params(&r), want);
    if (p0)
        assert_string_equal(param(&r, 0), p0);
    if (p1)
        assert_string_equal(param(&r, 1), p1);
    reply_free(&r);
}

static void expect_status(const struct http_server *srv, const char *method, const char *path, int status,
                          const char *allow)
{
    struct reply r;
    request(srv, method, path, &r);
    if (r.status != status)
        fail_msg("%s %.80s: status %d, want %d", method, path, r.status, status);
    if (allow)
        assert_string_equal(r.allow, allow);
    else
        assert_string_equal(r.allow, "");
    reply_free(&r);
}

/* ---------------------------------------------------------------- our own table */

static struct http_server *own;

static int own_setup(void **state)
{
    (void)state;
    log_set_level(LOG_LVL_WARN); /* no access log lines */
    own = start(own_routes);
    return own ? 0 : -1;
}

static int own_teardown(void **state)
{
    (void)state;
    http_server_stop(own, 1000);
    own = NULL;
    return 0;
}

static void test_exact_paths_reach_their_route(void **state)
{
    expect_route(own, "GET", "/a", "/a", NULL, NULL);
    expect_route(own, "POST", "/a", "/a", NULL, NULL);
    expect_route(own, "GET", "/a/b", "/a/b", NULL, NULL);
}

static void test_a_query_string_is_not_part_of_the_path(void **state)
{
    expect_route(own, "GET", "/a?x=1&y=2", "/a", NULL, NULL);
    expect_route(own, "GET", "/items/42?expand=parts", "/items/{id}", "42", NULL);
}

/* A route that declares it takes no query refuses one before its handler
 * runs; a route that leaves the query to its handler gets it untouched. */
static void test_a_route_that_takes_no_query_refuses_one(void **state)
{
    expect_status(own, "GET", "/plain", 200, NULL);
    expect_status(own, "GET", "/plain?x=1", 400, NULL);
    expect_status(own, "GET", "/plain?", 200, NULL);
    expect_status(own, "GET", "/a?x=1", 200, NULL);
}

/* "OPTIONS *" is about the server: every method of the table in Allow;
 * "*" for another method is a malformed request, not a missing route. */
static void test_options_star_lists_every_method_of_the_server(void **state)
{
    expect_status(own, "OPTIONS", "*", 204, "GET, HEAD, POST, PUT, DELETE");
    expect_status(own, "GET", "*", 400, NULL);
}

static void test_name_segments_are_captured_in_pattern_order(void **state)
{
    expect_route(own, "GET", "/items/42", "/items/{id}", "42", NULL);
    expect_route(own, "DELETE", "/items/ins_abc", "/items/{id}", "ins_abc", NULL);
    expect_route(own, "GET", "/items/42/parts/wheel", "/items/{id}/parts/{part}", "42", "wheel");
    /* A segment is anything between slashes. */
    expect_route(own, "GET", "/items/a.b-c_d~e:f@g", "/items/{id}", "a.b-c_d~e:f@g", NULL);
}

static void test_a_literal_segment_wins_over_a_parameter(void **state)
{
    /* /items/special is a resource of its own, not an item called
     * "special": its methods alone serve it and make its Allow list. */
    expect_route(own, "GET", "/items/special", "/items/special", NULL, NULL);
    expect_route(own, "PUT", "/items/special", "/items/special", NULL, NULL);
    expect_status(own, "DELETE", "/items/special", 405, "PUT, GET, HEAD");
    expect_route(own, "DELETE", "/items/specials", "/items/{id}", "specials", NULL);
}

static void test_trailing_slashes_do_not_match(void **state)
{
    expect_status(own, "GET", "/a/", 404, NULL);
    expect_status(own, "GET", "/items/", 404, NULL);
    expect_status(own, "GET", "/items/42/", 404, NULL);
    expect_status(own, "GET", "/items/42/parts", 404, NULL);
}

static void test_an_unknown_path_is_404_not_found(void **state)
{
    struct reply r;
    request(own, "GET", "/nowhere", &r);
    assert_int_equal(r.status, 404);
    assert_string_equal(error_code(&r), "not_found");
    assert_string_equal(r.allow, "");
    reply_free(&r);
    expect_status(own, "GET", "/", 404, NULL);
    expect_status(own, "GET", "/a/b/c", 404, NULL);
    expect_status(own, "GET", "/A", 404, NULL); /* case matters */
    expect_status(own, "DELETE", "/nowhere", 404, NULL);
}

static void test_a_known_path_with_another_method_is_405_with_allow(void **state)
{
    struct reply r;
    request(own, "DELETE", "/a", &r);
    assert_int_equal(r.status, 405);
    assert_string_equal(error_code(&r), "method_not_allowed");
    assert_string_equal(r.allow, "GET, HEAD, POST");
    reply_free(&r);
    expect_status(own, "PUT", "/items/42", 405, "GET, HEAD, DELETE");
    /* Only the routes that match with the most literal segments count. */
    expect_status(own, "POST", "/items/special", 405, "PUT, GET, HEAD");
    expect_status(own, "POST", "/items/1/parts/2", 405, "GET, HEAD");
}

static void test_methods_are_case_sensitive(void **state)
{
    expect_status(own, "get", "/a", 405, "GET, HEAD, POST");
}

static void test_options_answers_204_with_the_allow_list(void **state)
{
    expect_status(own, "OPTIONS", "/items/42", 204, "GET, HEAD, DELETE");
    expect_status(own, "OPTIONS", "/nowhere", 404, NULL);
}

static void test_empty_segments_do_not_match(void **state)
{
    expect_status(own, "GET", "//a", 404, NULL);
    expect_status(own, "GET", "/a//b", 404, NULL);
    expect_status(own, "GET", "/items//parts/x", 404, NULL);
}

static void test_a_parameter_of_up_to_128_bytes_matches_and_a_longer_one_does_not(void **state)
{
    char path[512], seg[200];
    memset(seg, 'x', sizeof seg);
    seg[128] = '\0';
    snprintf(path, sizeof path, "/items/%s", seg);
    expect_route(own, "GET", path, "/items/{id}", seg, NULL);
    seg[128] = 'x';
    seg[129] = '\0';
    snprintf(path, sizeof path, "/items/%s", seg);
    expect_status(own, "GET", path, 404, NULL);
    /* A literal segment has no such limit: it must simply be equal. */
    expect_status(own, "GET", "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                  404, NULL);
}

static void test_a_path_over_2048_bytes_is_414(void **state)
{
    char *path = malloc(2100);
    assert_non_null(path);
    memcpy(path, "/a", 2);
    memset(path + 2, 'z', 2047);
    path[2049] = '\0'; /* 2049 bytes */
    expect_status(own, "GET", path, 414, NULL);
    path[2048] = '\0'; /* 2048 bytes: within the cap, no such route */
    expect_status(own, "GET", path, 404, NULL);
    free(path);
}

/* libmicrohttpd decodes %XX in the path before the matcher sees it: a
 * parameter arrives decoded, and an encoded slash is a slash. */
static void test_percent_encoding_is_decoded_before_matching_but_not_into_a_separator(void **state)
{
    expect_route(own, "GET", "/items/a%20b", "/items/{id}", "a b", NULL);
    expect_route(own, "GET", "/items/%7Bid%7D", "/items/{id}", "{id}", NULL);
    expect_route(own, "GET", "/%61", "/a", NULL, NULL);
    /* An encoded slash is data, never a separator (and no id holds one). */
    expect_status(own, "GET", "/items/1%2Fparts%2F2", 404, NULL);
    expect_route(own, "GET", "/items/caf%C3%A9", "/items/{id}", "caf\xc3\xa9", NULL);
}

/* ---------------------------------------------------------------- the daemon's table */

static struct http_server *daemon_srv;
static struct http_route *daemon_echo; /* daemon_routes with echo handlers */

static int daemon_setup(void **state)
{
    (void)state;
    log_set_level(LOG_LVL_WARN);
    size_t n = 0;
    while (daemon_routes[n].method)
        n++;
    daemon_echo = calloc(n + 1, sizeof *daemon_echo);
    if (!daemon_echo)
        return -1;
    for (size_t i = 0; i < n; i++) {
        daemon_echo[i] = daemon_routes[i];
        daemon_echo[i].handler = echo;
    }
    daemon_srv = start(daemon_echo);
    return daemon_srv ? 0 : -1;
}

static int daemon_teardown(void **state)
{
    (void)state;
    http_server_stop(daemon_srv, 1000);
    daemon_srv = NULL;
    free(daemon_echo);
    daemon_echo = NULL;
    return 0;
}

/* The pattern with its i-th {name} replaced by "v<i>". */
static void concrete(const char *pattern, char *out, size_t n)
{
    size_t o = 0;
    int k = 0;
    for (const char *p = pattern; *p && o + 8 < n;) {
        if (*p == '{') {
            o += (size_t)snprintf(out + o, n - o, "v%d", k++);
            const char *close = strchr(p, '}');
            p = close ? close + 1 : p + strlen(p);
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
}

/* Every route is reached under its own pattern and method, none shadowed
 * by an earlier one, with its auth level and its parameters. */
static void test_every_daemon_route_is_reached_by_its_own_pattern(void **state)
{
    for (const struct http_route *r = daemon_routes; r->method; r++) {
        char path[512];
        concrete(r->pattern, path, sizeof path);
        struct reply rep;
        request(daemon_srv, r->method, path, &rep);
        if (rep.status != 200 || strcmp(body_str(&rep, "pattern"), r->pattern) != 0 ||
            strcmp(body_str(&rep, "method"), r->method) != 0)
            fail_msg("%s %s: status %d, reached %s %s", r->method, path, rep.status, body_str(&rep, "method"),
                     body_str(&rep, "pattern"));
        assert_int_equal(json_integer_value(json_object_get(rep.body, "auth")), r->auth);
        size_t want = 0;
        for (const char *p = r->pattern; (p = strchr(p, '{')); p++)
            want++;
        assert_int_equal(n_params(&rep), want);
        for (size_t i = 0; i < want; i++) {
            char v[32];
            snprintf(v, sizeof v, "v%zu", i);
            assert_string_equal(param(&rep, i), v);
        }
        reply_free(&rep);
    }
}

/* Whether a route pattern matches a concrete path, segment by segment
 * ("{…}" matches any one segment), as the router matches. */
static int pattern_matches(const char *pattern, const char *path)
{
    while (*pattern && *path) {
        size_t pl = strcspn(pattern + 1, "/") + 1, ul = strcspn(path + 1, "/") + 1;
        if (!(pattern[1] == '{' && ul > 1) && (pl != ul || strncmp(pattern, path, pl) != 0))
            return 0;
        pattern += pl, path += ul;
    }
    return !*pattern && !*path;
}

/* Segments of a pattern that are not {parameters}. */
static int literals(const char *pattern)
{
    int n = 0;
    for (const char *p = pattern; *p; p++)
        n += *p == '/' && p[1] != '{';
    return n;
}

/* Whether some path matches both patterns: as many segments, and each
 * pair equal or one of them a parameter. */
static int patterns_overlap(const char *a, const char *b)
{
    while (*a && *b) {
        size_t al = strcspn(a + 1, "/") + 1, bl = strcspn(b + 1, "/") + 1;
        if (a[1] != '{' && b[1] != '{' && (al != bl || strncmp(a, b, al) != 0))
            return 0;
        a += al, b += bl;
    }
    return !*a && !*b;
}

/* The router takes the first matching route's literal segments as the
 * most any matching route has (http.h): so in every table a pattern is
 * listed before any less literal one it shares paths with. */
static void test_every_table_lists_a_more_literal_pattern_first(void **state)
{
    const struct http_route *tables[] = {daemon_routes, metrics_routes, agent_routes_single, agent_routes_fleet,
                                         own_routes};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (const struct http_route *a = tables[t]; a->method; a++)
            for (const struct http_route *b = a + 1; b->method; b++)
                if (patterns_overlap(a->pattern, b->pattern) && literals(b->pattern) > literals(a->pattern))
                    fail_msg("table %zu: %s %s is listed after %s %s, which it would lose its paths to", t,
                             b->method, b->pattern, a->method, a->pattern);
}

/* A method no route has (TRACE; PATCH has one since issue 12) gets 405
 * naming exactly the methods of the routes that match the path with the
 * most literal segments, in table order, HEAD after every GET: a literal
 * path such as /v1/reservations/availability is not matched by
 * /v1/reservations/{id}. */
static void test_every_daemon_path_lists_its_methods_in_allow(void **state)
{
    for (const struct http_route *r = daemon_routes; r->method; r++) {
        char want[128] = "", concrete_path[512];
        concrete(r->pattern, concrete_path, sizeof concrete_path);
        int most = 0;
        for (const struct http_route *q = daemon_routes; q->method; q++)
            if (pattern_matches(q->pattern, concrete_path) && literals(q->pattern) > most)
                most = literals(q->pattern);
        for (const struct http_route *q = daemon_routes; q->method; q++)
            if (pattern_matches(q->pattern, concrete_path) && literals(q->pattern) == most && !strstr(want, q->method))
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s%s", want[0] ? ", " : "", q->method,
                         strcmp(q->method, "GET") == 0 ? ", HEAD" : "");
        char path[512];
        concrete(r->pattern, path, sizeof path);
        struct reply rep;
        request(daemon_srv, "TRACE", path, &rep);
        if (rep.status != 405 || strcmp(rep.allow, want) != 0)
            fail_msg("TRACE %s: status %d, Allow '%s', want 405 '%s'", path, rep.status, rep.allow, want);
        reply_free(&rep);
    }
}

static void test_daemon_paths_a_client_might_get_wrong(void **state)
{
    expect_route(daemon_srv, "GET", "/v1/instances/ins_1/events", "/v1/instances/{id}/events", "ins_1", NULL);
    expect_route(daemon_srv, "POST", "/v1/admin/nodes/node_1/state", "/v1/admin/nodes/{id}/state", "node_1", NULL);
    expect_route(daemon_srv, "GET", "/v1/statements/2026-01", "/v1/statements/{month}", "2026-01", NULL);
    expect_status(daemon_srv, "GET", "/v1/instances/ins_1/", 404, NULL);
    expect_status(daemon_srv, "GET", "/v1/instances/", 404, NULL);
    expect_status(daemon_srv, "GET", "/v1/me/", 404, NULL);
    expect_status(daemon_srv, "GET", "/v2/me", 404, NULL);
    expect_status(daemon_srv, "GET", "/v1/instances/ins_1/start", 405, "POST");
    expect_status(daemon_srv, "DELETE", "/v1/me", 405, "GET, HEAD");
    expect_status(daemon_srv, "PUT", "/v1/instances", 405, "POST, GET, HEAD");
    expect_status(daemon_srv, "GET", "/v1/admin/nodes/node_1/state", 405, "POST");
}

/* The metrics listener's table serves /metrics alone and without a key;
 * on the API the same path needs an admin. */
static void test_metrics_listener_serves_metrics_alone_without_a_key(void **state)
{
    size_t n = 0;
    for (const struct http_route *r = metrics_routes; r->method; r++, n++) {
        assert_string_equal(r->method, "GET");
        assert_string_equal(r->pattern, "/metrics");
        assert_int_equal(r->auth, AUTH_NONE);
    }
    assert_int_equal(n, 1);
    expect_route(daemon_srv, "GET", "/metrics", "/metrics", NULL, NULL);
    struct reply r;
    request(daemon_srv, "GET", "/metrics", &r);
    assert_int_equal(json_integer_value(json_object_get(r.body, "auth")), AUTH_ADMIN);
    reply_free(&r);
}

/* ---------------------------------------------------------------- bugs */

/* Under LeakSanitizer: fails if anything allocated so far is unreachable.
 * In a build without it the leak cannot be seen: the test is skipped after
 * its functional checks. */
static void assert_no_leak_so_far(void)
{
#if defined(__SANITIZE_ADDRESS__)
    assert_int_equal(__lsan_do_recoverable_leak_check(), 0);
#else
    skip();
#endif
}

/* A pattern with two {name} segments that matches the first and fails on
 * the second (empty, or over 128 bytes) frees the first parameter: dispatch
 * tries every route, so the agent's sim-fleet routes
 * "/nodes/{node}/v1/workloads/{id}" leaked on GET /nodes/n1/v1/workloads/
 * before any signature was checked. The reply is 404; LeakSanitizer (make
 * SAN=1) sees any leak. */
static void test_a_second_parameter_that_fails_frees_the_first(void **state)
{
    struct http_server *fleet = start(agent_routes_fleet);
    assert_non_null(fleet);
    char path[400];
    expect_status(fleet, "GET", "/nodes/n1/v1/workloads/", 404, NULL);
    snprintf(path, sizeof path, "/nodes/n1/v1/workloads/%0200d", 0);
    expect_status(fleet, "GET", path, 404, NULL);
    http_server_stop(fleet, 1000);
    expect_status(own, "GET", "/items/1/parts/", 404, NULL);
    assert_no_leak_so_far();
}

/* A pattern with more {name} segments than HTTP_MAX_PARAMS (4) never
 * matches, and the four parameters captured before the fifth is refused
 * are freed (LeakSanitizer, make SAN=1). */
static void test_a_fifth_parameter_never_matches_and_frees_the_four(void **state)
{
    static const struct http_route five[] = {
        {"GET", "/{a}/{b}/{c}/{d}/{e}", echo, AUTH_NONE, NULL},
        {NULL, NULL, NULL, AUTH_NONE, NULL},
    };
    struct http_server *srv = start(five);
    assert_non_null(srv);
    expect_status(srv, "GET", "/1/2/3/4/5", 404, NULL);
    http_server_stop(srv, 1000);
    assert_no_leak_so_far();
}

int main(void)
{
    const struct CMUnitTest own_tests[] = {
        cmocka_unit_test(test_exact_paths_reach_their_route),
        cmocka_unit_test(test_a_query_string_is_not_part_of_the_path),
        cmocka_unit_test(test_a_route_that_takes_no_query_refuses_one),
        cmocka_unit_test(test_options_star_lists_every_method_of_the_server),
        cmocka_unit_test(test_name_segments_are_captured_in_pattern_order),
        cmocka_unit_test(test_a_literal_segment_wins_over_a_parameter),
        cmocka_unit_test(test_every_table_lists_a_more_literal_pattern_first),
        cmocka_unit_test(test_trailing_slashes_do_not_match),
        cmocka_unit_test(test_an_unknown_path_is_404_not_found),
        cmocka_unit_test(test_a_known_path_with_another_method_is_405_with_allow),
        cmocka_unit_test(test_methods_are_case_sensitive),
        cmocka_unit_test(test_options_answers_204_with_the_allow_list),
        cmocka_unit_test(test_empty_segments_do_not_match),
        cmocka_unit_test(test_a_parameter_of_up_to_128_bytes_matches_and_a_longer_one_does_not),
        cmocka_unit_test(test_a_path_over_2048_bytes_is_414),
        cmocka_unit_test(test_percent_encoding_is_decoded_before_matching_but_not_into_a_separator),
    };
    const struct CMUnitTest daemon_tests[] = {
        cmocka_unit_test(test_every_daemon_route_is_reached_by_its_own_pattern),
        cmocka_unit_test(test_every_daemon_path_lists_its_methods_in_allow),
        cmocka_unit_test(test_daemon_paths_a_client_might_get_wrong),
        cmocka_unit_test(test_metrics_listener_serves_metrics_alone_without_a_key),
    };
    const struct CMUnitTest bug_tests[] = {
        cmocka_unit_test(test_a_second_parameter_that_fails_frees_the_first),
        cmocka_unit_test(test_a_fifth_parameter_never_matches_and_frees_the_four),
    };
    int failed = cmocka_run_group_tests_name("own routes", own_tests, own_setup, own_teardown);
    failed += cmocka_run_group_tests_name("daemon_routes", daemon_tests, daemon_setup, daemon_teardown);
    failed += cmocka_run_group_tests_name("bugs", bug_tests, own_setup, own_teardown);
    return failed;
}
