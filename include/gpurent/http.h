/* http.h: the HTTP layer shared by gpurentd and gpurent-agent, on
 * libmicrohttpd's internal thread pool (epoll). One route table of method,
 * path pattern, handler and auth level; one place that reads bodies, caps
 * their size, parses JSON by a declared field list, and writes every reply
 * with the same headers and error shape.
 *
 * Threading: handlers run on the pool's threads, many at once; a request is
 * only ever touched by one thread. A handler calls exactly one http_reply_*
 * (or http_error*) before it returns, or http_defer to answer later from
 * another thread (http_resume) without holding a pool thread meanwhile. */
#ifndef GPURENT_HTTP_H
#define GPURENT_HTTP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gpurent/api_error.h"
#include "gpurent/ids.h"
#include "gpurent/json_body.h"

struct http_request;
struct http_server;

typedef void (*http_handler)(struct http_request *req);
/* Runs on a pool thread after http_resume: replies as a handler would
 * (connected 1), or only frees ctx when the client is gone (connected 0). */
typedef void (*http_resume_fn)(struct http_request *req, void *ctx, int connected);

/* Who may call a route; the program's authenticate callback decides what
 * each level means (bearer keys in gpurentd, signatures in the agent). */
enum http_auth { AUTH_NONE, AUTH_USER, AUTH_ADMIN, AUTH_SIGNED };

/* A path belongs to the routes that match it with the most literal
 * segments: /v1/reservations/availability is not a reservation's id. The
 * first of those with the request's method serves it; the others' methods
 * make the Allow list. A table lists a more literal pattern before any it
 * shares paths with (the router relies on it; the unit tests check it). */
struct http_route {
    const char *method;   /* "GET", "POST", "PUT", "DELETE" */
    const char *pattern;  /* "/v1/api-keys/{id}": {name} matches one segment */
    http_handler handler; /* replies exactly once */
    enum http_auth auth;  /* checked before the handler runs */
    /* The query parameters the route takes, checked after auth and before
     * the handler (400 invalid_query naming one it does not take); NULL
     * leaves the query to the handler. */
    const char *const *query;
};

/* The query list of a route that takes no query parameters. */
extern const char *const http_no_query[];

#define HTTP_MAX_PARAMS 4

/* One request, from its first callback to its completion callback. */
struct http_request {
    const char *method;      /* borrowed from libmicrohttpd */
    const char *path;        /* borrowed: the URL without query */
    char request_id[ID_MAX]; /* "req_…", also in X-Request-Id */
    char client_ip[64];      /* client address, for limits and logs (from X-Forwarded-For behind a trusted proxy) */
    const struct http_route *route; /* matched route */
    char *params[HTTP_MAX_PARAMS];  /* {name} segments in pattern order */
    char *body;                     /* NUL-terminated copy of the body */
    size_t body_len;                /* bytes in body */
    int body_too_large;             /* more arrived than max_body_bytes */
    unsigned status;                /* status replied, for the log */
    int replied;                    /* a reply has been queued */
    int64_t start_ms;               /* monotonic start, for the log */
    int64_t start_us;               /* the same in microseconds, for metrics */
    /* Set by the program's authenticate callback. */
    char user_id[ID_MAX]; /* the caller, or "" */
    char key_id[ID_MAX];  /* the API key used, or "" */
    int is_admin;         /* caller has the admin role */
    int key_use_due;      /* the key's last use should be noted once this request succeeds */
    int routine;          /* set by a handler of machines' scheduled polls: a success is logged at debug */
    struct {
        char name[48];
        char value[256];
    } extra[8];                 /* http_add_header */
    int n_extra;                /* used entries of extra */
    struct http_server *server; /* owning server */
    void *conn;                 /* struct MHD_Connection * */
    int deferred;               /* http_defer was called and the reply is not made yet */
    int http11;                 /* the request line said HTTP/1.1 */
    http_resume_fn resume_fn;   /* set by http_resume, run on the next pool call */
    void *resume_ctx;           /* its argument */
    void *upgrade;              /* http_reply_upgrade's call until the switch happens */
};

struct http_config {
    const char *host;            /* address to bind */
    int port;                    /* 0 picks a free port */
    int threads;                 /* size of the thread pool */
    int max_connections;         /* across all clients */
    int max_connections_per_ip;  /* per client address */
    int connection_timeout_s;    /* idle connections are closed after this */
    int header_timeout_s;        /* a request's headers must arrive within this; 0 = no bound */
    int64_t body_min_rate;       /* bytes/s: a body must arrive within header_timeout_s + max_body_bytes / this;
                                    0 = no bound */
    size_t max_body_bytes;       /* larger bodies get 413 */
    int max_json_depth;          /* deeper bodies get 400 too_deep */
    size_t max_path_bytes;       /* longer paths get 414 */
    const char *cors_origins;    /* space-separated origins, "*" for any */
    const char *trusted_proxies; /* reverse proxies (IP addresses) whose X-Forwarded-For names the client, or NULL */
    /* Called once per finished request with its duration (metrics); may
     * be NULL. Runs on the pool's threads. */
    void (*on_done)(const struct http_request *req, int64_t duration_us);
    /* Optional: asked before an internal error (500) is answered; 1 with a
     * reason in why answers 503 unavailable with it instead (the daemon:
     * its database's disk is full, which is not a bug to report). */
    int (*unavailable_cause)(char *why, size_t whylen);
    const char *cert_file; /* PEM certificate for HTTPS, or NULL */
    const char *key_file;  /* PEM key for HTTPS, or NULL */
    /* Refuse (403) a request that may change something (not GET, HEAD or
     * OPTIONS) from a browser page of another site: its Origin is neither
     * this server's (the Host it asked) nor one of cors_origins. A page
     * elsewhere can send a JSON body as text/plain without a preflight. */
    int refuse_cross_site_writes;
};

/* Decides whether req may run a route of this level: returns 0, or replies
 * with an error and returns -1. */
typedef int (*http_authenticate_fn)(struct http_request *req, enum http_auth level);

/* Whether host:port can be bound now (as libmicrohttpd binds it, with
 * SO_REUSEADDR): 0, or -1 with the reason in err. A check before a start
 * does what cannot be undone (a first admin and its key printed). */
int http_address_free(const char *host, int port, char *err, size_t errlen);
/* Starts listening; routes must outlive the server. NULL on failure (logged). */
struct http_server *http_server_start(const struct http_config *cfg, const struct http_route *routes,
                                      http_authenticate_fn authenticate, void *app);
/* The port actually bound (useful with port 0). */
int http_server_port(const struct http_server *srv);
/* The program's context pointer given at start. */
void *http_server_app(const struct http_server *srv);
/* Replaces the CORS origins and body cap (SIGHUP reload); thread-safe. */
void http_server_reload(struct http_server *srv, const char *cors_origins, size_t max_body_bytes, int max_json_depth);
/* Stops accepting, waits up to drain_ms for requests in flight, then stops
 * the threads and frees the server. NULL is a no-op. */
void http_server_stop(struct http_server *srv, int drain_ms);

/* --- reading a request --- */

/* A header value (case-insensitive name) or NULL. Borrowed. */
const char *http_header(struct http_request *req, const char *name);
/* Whether header name lists token (comma-separated, any case), as
 * Connection lists "upgrade". */
int http_header_has_token(struct http_request *req, const char *name, const char *token);
/* Whether origin is one of the console origins named in cors_origins ("*"
 * names none: it lets any site call the API with a key, which is not trust
 * in the site). */
int http_origin_listed(struct http_request *req, const char *origin);
/* A query-string argument or NULL. Borrowed. */
const char *http_query(struct http_request *req, const char *name);
/* Refuses query arguments not in allowed (NULL-terminated): replies 400 and
 * returns -1. */
int http_query_allow(struct http_request *req, const char *const allowed[]);
/* Reads integer query argument name into *out (def if absent); replies 400
 * naming the argument and returns -1 if it is not an integer in [min, max]. */
int http_query_int(struct http_request *req, const char *name, int64_t min, int64_t max, int64_t def, int64_t *out);

/* Parses the request body as one JSON object holding only the listed fields
 * (fields ends with a {NULL} row). An empty body counts as {}. On any
 * problem replies 4xx naming the field and returns NULL; otherwise returns
 * a new reference the caller must json_decref. */
json_t *http_json_body(struct http_request *req, const struct json_field *fields);

/* --- replying --- */

/* Replies with status and body (steals the reference to body; NULL for no
 * body). */
void http_reply_json(struct http_request *req, unsigned status, json_t *body);
/* Replies with an error from the table; field may be NULL; fmt NULL uses the
 * table's default message. */
void http_error(struct http_request *req, enum api_error e, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Like http_error, but with an explicit status (e.g. 402) and extra members
 * merged into the error object (steals extra; may be NULL). */
void http_error_ext(struct http_request *req, enum api_error e, const char *field, json_t *extra, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Replies with a body of another type (e.g. text/plain, text/csv). Copies body. */
void http_reply_raw(struct http_request *req, unsigned status, const char *content_type, const char *body, size_t len);
/* Replies 304 Not Modified, with the Content-Length of the 200 it stands
 * for (full_len bytes), as RFC 9110 8.6 requires of one that has it. */
void http_reply_not_modified(struct http_request *req, size_t full_len);
/* Whether an If-None-Match value (NULL: the header was absent) names etag,
 * or is "*": the weak comparison of RFC 9110 13.1.2, so W/"x" matches "x". */
int http_etag_matches(const char *if_none_match, const char *etag);
/* --- answering later --- */

/* Suspends the request's connection: the handler returns without replying
 * and the pool thread serves others. Some other thread must then call
 * http_resume exactly once, before http_server_stop (libmicrohttpd cannot
 * stop with suspended connections). */
void http_defer(struct http_request *req);
/* From any thread: wakes a deferred request; fn(req, ctx, 1) then runs on a
 * pool thread and replies. */
void http_resume(struct http_request *req, http_resume_fn fn, void *ctx);

/* A streamed reply (chunked). pull(ctx, buf, max) runs on a pool thread and
 * returns bytes written (> 0), 0 when nothing is ready (the connection is
 * then suspended, holding no thread, until http_stream_wake) or -1 at the
 * end. done(ctx) runs once when the reply is finished or the client left;
 * after it, nobody may call http_stream_wake. NULL on failure: done will
 * not run, the caller keeps ctx, and replies itself unless req->replied.
 * To a HEAD it replies the headers alone and returns NULL, req->replied
 * set. */
struct http_stream;
struct http_stream *http_reply_stream(struct http_request *req, const char *content_type,
                                      long (*pull)(void *ctx, char *buf, size_t max), void (*done)(void *ctx),
                                      void *ctx);
/* From any thread: pull has something new (or the end); wakes a suspended
 * stream, and also lets libmicrohttpd notice a client that left. */
void http_stream_wake(struct http_stream *st);

/* A protocol switch (RFC 9110 15.2.2): replies 101 Switching Protocols with
 * "Upgrade: protocol" (and the headers added with http_add_header, such as
 * Sec-WebSocket-Accept). Once libmicrohttpd has sent it, on_upgraded(ctx,
 * fd, extra, extra_len, up) runs once on the pool thread and must not
 * block: fd is then the callee's to read and write (extra holds bytes the
 * client sent already), and it hands the connection back with
 * http_upgraded_close(up) from any thread, before http_server_stop (which
 * cannot end an upgraded connection itself). -1 when the reply cannot be
 * queued: on_upgraded never runs and ctx stays the caller's. If the client
 * leaves before the switch, on_upgraded(ctx, -1, NULL, 0, NULL) runs
 * instead (from the request's completion), for ctx to be released. */
struct http_upgraded;
typedef void (*http_upgraded_fn)(void *ctx, int fd, const char *extra, size_t extra_len, struct http_upgraded *up);
int http_reply_upgrade(struct http_request *req, const char *protocol, http_upgraded_fn on_upgraded, void *ctx);
/* Closes an upgraded connection (its fd) and lets libmicrohttpd free it. */
void http_upgraded_close(struct http_upgraded *up);

/* Adds a header to the reply about to be made (Retry-After, Location …). */
void http_add_header(struct http_request *req, const char *name, const char *value);
/* Whether http_add_header already added name (any case). */
int http_has_header(const struct http_request *req, const char *name);

#endif
