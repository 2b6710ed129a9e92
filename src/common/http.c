/* http.c: the HTTP layer behind http.h: libmicrohttpd set-up, routing,
 * authentication hook, body reading, reply helpers, CORS and the access log. */
#include "gpurent/http.h"
#include "gpurent/assert.h"
#include "gpurent/json_body.h"
#include "gpurent/clock.h"
#include "gpurent/log.h"
#include "gpurent/http_conns.h"
#include "gpurent/http_guard.h"
#include "gpurent/utf8.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

struct http_server {
    struct MHD_Daemon *mhd;             /* the libmicrohttpd daemon */
    const struct http_route *routes;    /* route table, ends with method NULL */
    http_authenticate_fn authenticate;  /* auth hook */
    void (*on_done)(const struct http_request *, int64_t); /* metrics hook, or NULL */
    int (*unavailable_cause)(char *, size_t);              /* see http_config, or NULL */
    void *app;                          /* program context */
    int port;                           /* bound port */
    atomic_int in_flight;               /* requests between first call and completion */
    atomic_int closing;                 /* http_server_stop has begun: no new connection is taken */
    pthread_rwlock_t reload_lock;       /* guards the reloadable fields below */
    char cors_origins[1024];            /* space-separated, reloadable */
    int refuse_cross_site_writes;       /* see http_config */
    char trusted_proxies[512];          /* proxies whose X-Forwarded-For names the client */
    size_t max_body_bytes;              /* reloadable */
    int max_json_depth;                 /* reloadable */
    size_t max_path_bytes;              /* fixed at start */
    char *cert_pem, *key_pem;           /* TLS material kept alive for MHD */
    struct http_conns *conns;           /* open connections and their deadlines */
};

/* ---------------------------------------------------------------- replies */

/* Whether a list of words separated by spaces or commas holds word. */
static int list_contains(const char *list, const char *word, size_t len)
{
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t n = strcspn(p, " ,");
        if (n == len && n > 0 && strncmp(p, word, n) == 0)
            return 1;
        p += n;
    }
    return 0;
}

/* The request's Origin if it is one of the configured console origins, else
 * NULL: only such a request gets Access-Control-* headers. */
static const char *cors_allowed_origin(struct http_request *req)
{
    const char *origin = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Origin");
    if (!origin)
        return NULL;
    struct http_server *srv = req->server;
    pthread_rwlock_rdlock(&srv->reload_lock);
    int allowed = list_contains(srv->cors_origins, "*", 1) || list_contains(srv->cors_origins, origin, strlen(origin));
    pthread_rwlock_unlock(&srv->reload_lock);
    return allowed ? origin : NULL;
}

/* The length of an authority's host, without its port ("[::1]:80" is
 * "[::1]"). */
static size_t host_len(const char *authority)
{
    if (authority[0] == '[') {
        const char *close = strchr(authority, ']');
        return close ? (size_t)(close - authority) + 1 : strlen(authority);
    }
    return strcspn(authority, ":");
}

/* Whether a request that may change something comes from a page of
 * another site: an Origin whose host is neither the Host asked (the
 * console this server serves, whatever scheme and port a proxy in front
 * shows; nginx's $host carries no port) nor an allowed origin. Scripts
 * and CLIs send no Origin. */
static int cross_site_write(struct http_request *req)
{
    if (strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0 || strcmp(req->method, "OPTIONS") == 0)
        return 0;
    const char *origin = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Origin");
    if (!origin)
        return 0;
    const char *host = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Host");
    const char *authority = strstr(origin, "://");
    if (authority && host) {
        authority += 3;
        size_t n = host_len(authority);
        if (n > 0 && n == host_len(host) && strncasecmp(authority, host, n) == 0)
            return 0;
    }
    return !cors_allowed_origin(req);
}

int http_origin_listed(struct http_request *req, const char *origin)
{
    struct http_server *srv = req->server;
    pthread_rwlock_rdlock(&srv->reload_lock);
    int listed = list_contains(srv->cors_origins, origin, strlen(origin));
    pthread_rwlock_unlock(&srv->reload_lock);
    return listed;
}

/* Behind a trusted reverse proxy the client is the rightmost address in
 * X-Forwarded-For that is not itself a trusted proxy (entries to its left
 * are whatever the client chose to send). */
static void forwarded_client(struct http_request *req)
{
    struct http_server *srv = req->server;
    if (!srv->trusted_proxies[0] || !list_contains(srv->trusted_proxies, req->client_ip, strlen(req->client_ip)))
        return;
    const char *xff = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "X-Forwarded-For");
    if (!xff)
        return;
    size_t end = strlen(xff);
    while (end > 0) {
        size_t start = end;
        while (start > 0 && xff[start - 1] != ',')
            start--;
        size_t a = start, b = end;
        while (a < b && xff[a] == ' ')
            a++;
        while (b > a && xff[b - 1] == ' ')
            b--;
        char ip[sizeof req->client_ip];
        unsigned char buf[sizeof(struct in6_addr)];
        if (b - a == 0 || b - a >= sizeof ip)
            return;
        memcpy(ip, xff + a, b - a);
        ip[b - a] = '\0';
        if (inet_pton(AF_INET, ip, buf) != 1 && inet_pton(AF_INET6, ip, buf) != 1)
            return; /* not an address: keep the proxy's */
        if (!list_contains(srv->trusted_proxies, ip, strlen(ip))) {
            memcpy(req->client_ip, ip, b - a + 1);
            return;
        }
        end = start > 0 ? start - 1 : 0;
    }
}

static void add_common_headers(struct http_request *req, struct MHD_Response *resp)
{
    MHD_add_response_header(resp, "X-Request-Id", req->request_id);
    /* API answers are never stored; a handler that sets its own policy
     * (the console's revalidated files, a reply with an ETag) keeps it. */
    if (!http_has_header(req, "Cache-Control"))
        MHD_add_response_header(resp, "Cache-Control", "no-store");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    /* Served over TLS: a browser that came once keeps to HTTPS for a year
     * (RFC 6797), so a later http:// link cannot be taken over on the way.
     * Not over plain HTTP, where the header means nothing. */
    if (req->server->cert_pem)
        MHD_add_response_header(resp, "Strict-Transport-Security", "max-age=31536000");
    for (int i = 0; i < req->n_extra; i++)
        MHD_add_response_header(resp, req->extra[i].name, req->extra[i].value);

    const char *origin = cors_allowed_origin(req);
    if (origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(resp, "Vary", "Origin");
        MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After, Location, Idempotent-Replayed, Content-Disposition");
    }
}

static void queue(struct http_request *req, unsigned status, struct MHD_Response *resp)
{
    /* Exactly one reply per request: a second one is a handler's bug. */
    ASSERT(!req->replied);
    add_common_headers(req, resp);
    req->replied = 1;
    req->status = status;
    if (MHD_queue_response(req->conn, status, resp) != MHD_YES)
        log_error("http: cannot queue response for request %s", req->request_id);
    MHD_destroy_response(resp);
}

void http_add_header(struct http_request *req, const char *name, const char *value)
{
    if (req->n_extra >= (int)(sizeof req->extra / sizeof req->extra[0]))
        return;
    snprintf(req->extra[req->n_extra].name, sizeof req->extra[0].name, "%s", name);
    snprintf(req->extra[req->n_extra].value, sizeof req->extra[0].value, "%s", value);
    req->n_extra++;
}

int http_has_header(const struct http_request *req, const char *name)
{
    for (int i = 0; i < req->n_extra; i++)
        if (strcasecmp(req->extra[i].name, name) == 0)
            return 1;
    return 0;
}

void http_reply_raw(struct http_request *req, unsigned status, const char *content_type, const char *body,
                    size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)(uintptr_t)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return;
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    queue(req, status, resp);
}

/* The body of a reply libmicrohttpd sends without one (a 304, or the
 * headers of a stream to a HEAD): never read. */
static ssize_t no_body_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)cls, (void)pos, (void)buf, (void)max;
    return MHD_CONTENT_READER_END_OF_STREAM;
}

void http_reply_not_modified(struct http_request *req, size_t full_len)
{
    /* libmicrohttpd writes a Content-Length from the reply's size even on a
     * 304, and RFC 9110 8.6 allows one there only if it is the length of the
     * 200: so the reply has that size and a body it never reads. */
    struct MHD_Response *resp = MHD_create_response_from_callback(full_len, 1024, no_body_read, NULL, NULL);
    if (!resp)
        return;
    queue(req, 304, resp);
}

int http_etag_matches(const char *if_none_match, const char *etag)
{
    size_t elen = strlen(etag);
    const char *p = if_none_match ? if_none_match : "";
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (*p == '*')
            return 1;
        if (strncmp(p, "W/", 2) == 0)
            p += 2;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        size_t len = (size_t)(end - p);
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (len == elen && memcmp(p, etag, elen) == 0)
            return 1;
        p = end;
    }
    return 0;
}

void http_reply_json(struct http_request *req, unsigned status, json_t *body)
{
    char *text = NULL;
    size_t len = 0;
    if (body) {
        text = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        if (!text) {
            log_error("http: cannot serialise reply for request %s", req->request_id);
            status = 500;
            text = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"cannot serialise reply\",\"field\":null}}");
            if (!text)
                return;
        }
        len = strlen(text);
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text ? text : (void *)(uintptr_t)"",
                                                                text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(text);
        return;
    }
    if (text)
        MHD_add_response_header(resp, "Content-Type", "application/json");
    queue(req, status, resp);
}

static void error_v(struct http_request *req, enum api_error e, const char *field, json_t *extra, const char *fmt,
                    va_list ap)
{
    char message[512] = "";
    int cause = e == ERR_INTERNAL && req->server && req->server->unavailable_cause &&
                req->server->unavailable_cause(message, sizeof message);
    if (cause) {
        /* Not a bug to report: say what is wrong and when to retry. */
        e = ERR_UNAVAILABLE;
        field = NULL;
        json_decref(extra);
        extra = NULL;
        http_add_header(req, "Retry-After", "30");
    } else if (fmt) {
        vsnprintf(message, sizeof message, fmt, ap);
    }
    const struct api_error_info *info = api_error_info(e);
    if (!message[0])
        snprintf(message, sizeof message, "%s", info->message);
    /* Messages and fields may quote the client's bytes, cut short: made
     * valid UTF-8, or jansson would leave the reply without a body. */
    char field_text[256];
    if (field) {
        snprintf(field_text, sizeof field_text, "%s", field);
        utf8_scrub(field_text);
    }
    utf8_scrub(message);
    json_t *err = json_pack("{s:s, s:s, s:o}", "code", info->code, "message", message, "field",
                            field ? json_string(field_text) : json_null());
    if (extra) {
        json_object_update(err, extra);
        json_decref(extra);
    }
    /* RFC 9110: a 401 names its challenge; a 503 or 429 says when to come
     * back (handlers that know better have added their own). */
    if (info->status == 401 && !http_has_header(req, "WWW-Authenticate"))
        http_add_header(req, "WWW-Authenticate", e == ERR_BAD_SIGNATURE ? "Gpurent-HMAC-SHA256" : "Bearer");
    if ((info->status == 503 || info->status == 429) && !http_has_header(req, "Retry-After"))
        http_add_header(req, "Retry-After", info->status == 503 ? "5" : "1");
    http_reply_json(req, info->status, json_pack("{s:o}", "error", err));
}

void http_error(struct http_request *req, enum api_error e, const char *field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_v(req, e, field, NULL, fmt, ap);
    va_end(ap);
}

void http_error_ext(struct http_request *req, enum api_error e, const char *field, json_t *extra, const char *fmt,
                    ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_v(req, e, field, extra, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- answering later */

void http_defer(struct http_request *req)
{
    ASSERT(!req->replied && !req->deferred);
    req->deferred = 1;
    MHD_suspend_connection(req->conn);
}

void http_resume(struct http_request *req, http_resume_fn fn, void *ctx)
{
    ASSERT(req->deferred && !req->resume_fn);
    req->resume_ctx = ctx;
    req->resume_fn = fn;
    /* libmicrohttpd's lock in MHD_resume_connection orders the two stores
     * above before the pool thread's next call reads them. */
    MHD_resume_connection(req->conn);
}

/* A streamed reply: the reader suspends the connection when its source has
 * nothing (returning 0 alone would make libmicrohttpd call it again at
 * once, a busy loop in this threading mode) and a wake resumes it. */
struct http_stream {
    long (*pull)(void *ctx, char *buf, size_t max); /* the source */
    void (*done)(void *ctx);                        /* run once at the end */
    void *ctx;                                      /* their argument */
    struct MHD_Connection *conn;                    /* to suspend and resume */
    pthread_mutex_t lock;                           /* guards the two flags */
    int suspended;                                  /* the reader suspended the connection */
    int woken;                                      /* a wake came while it was not suspended */
};

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct http_stream *st = cls;
    pthread_mutex_lock(&st->lock);
    st->woken = 0;
    pthread_mutex_unlock(&st->lock);
    long n = st->pull(st->ctx, buf, max);
    if (n < 0)
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (n > 0)
        return (ssize_t)n;
    pthread_mutex_lock(&st->lock);
    if (!st->woken) { /* a wake between pull and here: call pull again instead */
        st->suspended = 1;
        MHD_suspend_connection(st->conn);
    }
    pthread_mutex_unlock(&st->lock);
    return 0;
}

static void stream_no_done(void *ctx)
{
    (void)ctx;
}

static void stream_free(void *cls)
{
    struct http_stream *st = cls;
    st->done(st->ctx);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

struct http_stream *http_reply_stream(struct http_request *req, const char *content_type,
                                      long (*pull)(void *ctx, char *buf, size_t max), void (*done)(void *ctx),
                                      void *ctx)
{
    if (strcmp(req->method, "HEAD") == 0) {
        /* The headers alone, and the connection closed after them: as a
         * stream has no length, libmicrohttpd would send it chunked, and
         * its last chunk too even to a HEAD, bytes the client would read
         * as the start of the next reply. */
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, no_body_read, NULL, NULL);
        if (!resp)
            return NULL;
        MHD_set_response_options(resp, MHD_RF_HTTP_1_0_COMPATIBLE_STRICT, MHD_RO_END);
        if (content_type)
            MHD_add_response_header(resp, "Content-Type", content_type);
        queue(req, 200, resp);
        return NULL;
    }
    struct http_stream *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->pull = pull;
    st->done = done;
    st->ctx = ctx;
    st->conn = req->conn;
    pthread_mutex_init(&st->lock, NULL);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
    if (!resp) {
        pthread_mutex_destroy(&st->lock);
        free(st);
        return NULL;
    }
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    /* queue() inlined: on failure done must not run, the caller keeps ctx. */
    ASSERT(!req->replied);
    add_common_headers(req, resp);
    req->replied = 1;
    req->status = 200;
    int queued = MHD_queue_response(req->conn, 200, resp) == MHD_YES;
    if (!queued) {
        log_error("http: cannot queue response for request %s", req->request_id);
        st->done = stream_no_done;
    }
    MHD_destroy_response(resp); /* the connection holds it (and st) while it streams */
    return queued ? st : NULL;
}

void http_stream_wake(struct http_stream *st)
{
    pthread_mutex_lock(&st->lock);
    if (st->suspended) {
        st->suspended = 0;
        MHD_resume_connection(st->conn);
    } else {
        st->woken = 1;
    }
    pthread_mutex_unlock(&st->lock);
}

/* ---------------------------------------------------------------- protocol switch */

struct upgrade_call {
    http_upgraded_fn fn; /* the caller's */
    void *ctx;           /* its argument */
};

static void on_mhd_upgrade(void *cls, struct MHD_Connection *conn, void *req_cls, const char *extra,
                           size_t extra_len, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
    struct upgrade_call *u = cls;
    struct http_request *req = req_cls;
    if (req)
        req->upgrade = NULL; /* switched: the completion has nothing to release */
    /* The client's socket (for TLS, sock is the library's socketpair). */
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (fd)
        http_guard_upgraded(fd->connect_fd);
    http_upgraded_fn fn = u->fn;
    void *ctx = u->ctx;
    free(u);
    fn(ctx, sock, extra, extra_len, (struct http_upgraded *)urh);
}

int http_reply_upgrade(struct http_request *req, const char *protocol, http_upgraded_fn on_upgraded, void *ctx)
{
    struct upgrade_call *u = calloc(1, sizeof *u);
    if (!u)
        return -1;
    u->fn = on_upgraded;
    u->ctx = ctx;
    /* One response per connection, so its closure is this call alone. */
    struct MHD_Response *resp = MHD_create_response_for_upgrade(on_mhd_upgrade, u);
    if (!resp) {
        free(u);
        return -1;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_UPGRADE, protocol);
    ASSERT(!req->replied);
    add_common_headers(req, resp);
    req->replied = 1;
    req->status = MHD_HTTP_SWITCHING_PROTOCOLS;
    req->upgrade = u;
    int queued = MHD_queue_response(req->conn, MHD_HTTP_SWITCHING_PROTOCOLS, resp) == MHD_YES;
    MHD_destroy_response(resp);
    if (!queued) {
        req->upgrade = NULL;
        log_error("http: cannot queue the protocol switch for request %s", req->request_id);
        free(u);
        req->replied = 0;
        return -1;
    }
    return 0;
}

void http_upgraded_close(struct http_upgraded *up)
{
    MHD_upgrade_action((struct MHD_UpgradeResponseHandle *)up, MHD_UPGRADE_ACTION_CLOSE);
}

/* ---------------------------------------------------------------- reading */

const char *http_header(struct http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

int http_header_has_token(struct http_request *req, const char *name, const char *token)
{
    const char *v = http_header(req, name);
    size_t tl = strlen(token);
    while (v && *v) {
        while (*v == ' ' || *v == '\t' || *v == ',')
            v++;
        size_t n = strcspn(v, ",");
        size_t m = n;
        while (m > 0 && (v[m - 1] == ' ' || v[m - 1] == '\t'))
            m--;
        if (m == tl && strncasecmp(v, token, tl) == 0)
            return 1;
        v += n;
    }
    return 0;
}

const char *http_query(struct http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

struct query_check {
    const char *const *allowed; /* the names the endpoint takes */
    uint32_t seen;              /* bit i: allowed[i] was given */
    const char *bad;            /* first argument refused, or NULL */
    const char *why;            /* the sentence for it */
};

/* Refuses names not allowed, and allowed ones given twice or without a
 * value: "?limit=1&limit=500" or "?limit" must not quietly mean something. */
static enum MHD_Result query_check_one(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct query_check *qc = cls;
    for (size_t i = 0; qc->allowed[i]; i++) {
        if (strcmp(qc->allowed[i], key) != 0)
            continue;
        uint32_t bit = i < 32 ? 1u << i : 0;
        if (!value)
            qc->why = "needs a value";
        else if (qc->seen & bit)
            qc->why = "is given more than once";
        else {
            qc->seen |= bit;
            return MHD_YES;
        }
        qc->bad = key;
        return MHD_NO;
    }
    qc->bad = key;
    qc->why = "is not one this endpoint takes";
    return MHD_NO;
}

const char *const http_no_query[] = {NULL};

int http_query_allow(struct http_request *req, const char *const allowed[])
{
    struct query_check qc = {.allowed = allowed};
    MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, query_check_one, &qc);
    if (qc.bad) {
        http_error(req, ERR_INVALID_QUERY, qc.bad, "query parameter '%.64s' %s", qc.bad, qc.why);
        return -1;
    }
    return 0;
}

int http_query_int(struct http_request *req, const char *name, int64_t min, int64_t max, int64_t def, int64_t *out)
{
    const char *v = http_query(req, name);
    if (!v) {
        *out = def;
        return 0;
    }
    /* An optional minus, then 1 to 18 digits and nothing else (so that
     * strtoll cannot overflow), however long the value: counting a bad
     * character as -1000 digits once let one followed by a thousand
     * digits through, read by strtoll as what came before it. */
    const char *p = v + (*v == '-');
    size_t digits = strspn(p, "0123456789");
    int plain = digits > 0 && digits <= 18 && p[digits] == '\0';
    long long n = plain ? strtoll(v, NULL, 10) : 0;
    if (!plain || n < min || n > max) {
        http_error(req, ERR_INVALID_QUERY, name, "%s must be an integer from %lld to %lld", name, (long long)min,
                   (long long)max);
        return -1;
    }
    *out = n;
    return 0;
}

/* A body is read as JSON only when its headers say it is JSON, unencoded:
 * a form or text (what an HTML form, curl -d or a script's default sends)
 * gets 415 naming what to send, not a parse error that hides the cause.
 * An empty body holds nothing to misread and needs no type. Replies and
 * returns -1 when the body is refused. */
static int body_is_json(struct http_request *req)
{
    if (req->body_len == 0)
        return 0;
    const char *coding = http_header(req, "Content-Encoding");
    if (coding && strcasecmp(coding, "identity") != 0) {
        http_add_header(req, "Accept-Encoding", "identity"); /* RFC 9110 15.5.16 */
        http_error(req, ERR_UNSUPPORTED_MEDIA_TYPE, "Content-Encoding",
                   "Content-Encoding %.60s is not accepted: send the body unencoded", coding);
        return -1;
    }
    const char *type = http_header(req, "Content-Type");
    if (json_body_media_type_ok(type))
        return 0;
    /* Accept-Post and Accept-Patch (RFC 5789) name what the method takes. */
    if (strcmp(req->method, "POST") == 0 || strcmp(req->method, "PATCH") == 0)
        http_add_header(req, req->method[1] == 'O' ? "Accept-Post" : "Accept-Patch", "application/json");
    if (type)
        http_error(req, ERR_UNSUPPORTED_MEDIA_TYPE, "Content-Type",
                   "the request body is sent as %.80s; send JSON with Content-Type: application/json", type);
    else
        http_error(req, ERR_UNSUPPORTED_MEDIA_TYPE, "Content-Type",
                   "the request body has no Content-Type; send JSON with Content-Type: application/json");
    return -1;
}

json_t *http_json_body(struct http_request *req, const struct json_field *fields)
{
    if (body_is_json(req) < 0)
        return NULL;
    struct http_server *srv = req->server;
    pthread_rwlock_rdlock(&srv->reload_lock);
    int max_depth = srv->max_json_depth;
    pthread_rwlock_unlock(&srv->reload_lock);
    struct json_body_error e;
    json_t *root = json_body_parse(req->body, req->body_len, fields, max_depth, &e);
    if (!root)
        http_error(req, e.code, e.field[0] ? e.field : NULL, "%s", e.message);
    return root;
}

/* ---------------------------------------------------------------- routing */

/* Matches path against pattern; fills params (strdup'd) on success. */
static int route_match(const char *pattern, const char *path, char *params[HTTP_MAX_PARAMS])
{
    int np = 0;
    const char *p = pattern, *u = path;
    while (*p && *u) {
        if (*p != '/' || *u != '/')
            goto no_match;
        p++, u++;
        if (*p == '{') {
            size_t ulen = strcspn(u, "/");
            if (ulen == 0 || ulen > 128 || np >= HTTP_MAX_PARAMS)
                goto no_match;
            params[np++] = strndup(u, ulen);
            p += strcspn(p, "/"), u += ulen;
            continue;
        }
        /* A literal segment, a character at a time: most routes of the
         * table part from the path at their first differing character. */
        while (*p && *p != '/' && *p == *u)
            p++, u++;
        if ((*p && *p != '/') || (*u && *u != '/'))
            goto no_match;
    }
    if (!*p && !*u)
        return 1;
no_match: /* what was captured before the mismatch is freed, whichever segment failed */
    for (int i = 0; i < np; i++)
        free(params[i]), params[i] = NULL;
    return 0;
}

static void free_params(struct http_request *req)
{
    for (int i = 0; i < HTTP_MAX_PARAMS; i++) {
        free(req->params[i]);
        req->params[i] = NULL;
    }
}

/* Adds method to a ", "-separated Allow list once. */
static void allow_add(char *allow, size_t cap, const char *method)
{
    size_t n = strlen(method);
    for (const char *p = allow; *p; p += strcspn(p, ","), p += *p == ',' ? 2 : 0)
        if (strncmp(p, method, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return;
    if (strlen(allow) + n + 3 < cap) {
        if (allow[0])
            strcat(allow, ", ");
        strcat(allow, method);
    }
}

/* Segments of a pattern that are not parameters. */
static int literal_segments(const char *pattern)
{
    int n = 0;
    for (const char *p = pattern; *p; p++)
        n += *p == '/' && p[1] != '{';
    return n;
}

/* "OPTIONS *" asks what the server as a whole does (RFC 9110 9.3.7): every
 * method some route takes, as the Allow of a path lists its own. "*" is no
 * other method's target (RFC 9112 3.2.4). */
static void server_wide(struct http_request *req)
{
    if (strcmp(req->method, "OPTIONS") != 0) {
        http_error(req, ERR_BAD_REQUEST, NULL, "the request target * is for OPTIONS only");
        return;
    }
    char allow[128] = "";
    for (const struct http_route *r = req->server->routes; r->method; r++) {
        allow_add(allow, sizeof allow, r->method);
        if (strcmp(r->method, "GET") == 0)
            allow_add(allow, sizeof allow, "HEAD");
    }
    http_add_header(req, "Allow", allow);
    http_reply_json(req, 204, NULL);
}

/* A browser's GET or HEAD of a path with a trailing slash that a GET
 * route serves without it ("/console/" typed for "/console"): 308 to that
 * path, as a person expects, rather than a JSON 404 for one character. No
 * route is ever written with a trailing slash (the API description's
 * linters refuse them), so an API client keeps its strict 404: the
 * redirect is only for a request that accepts HTML, as a browser's
 * navigation does. Not with a query, which the redirect would have to carry
 * over byte for byte. Returns 1 when it replied. */
static int redirect_trailing_slash(struct http_request *req)
{
    size_t len = strlen(req->path);
    const char *accept = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
    if (len < 2 || req->path[len - 1] != '/' || req->path[len - 2] == '/' ||
        (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0) || !accept ||
        !strcasestr(accept, "text/html") ||
        MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, NULL, NULL) > 0)
        return 0;
    /* The path is decoded: only a path of URL characters that need no
     * encoding goes back out in Location, so no byte of it (a CR or LF
     * decoded from %0D%0A, a space) can change the reply's header. */
    char bare[200];
    if (len - 1 >= sizeof bare)
        return 0;
    for (size_t i = 0; i + 1 < len; i++) {
        unsigned char c = (unsigned char)req->path[i];
        int alnum = ((c | 32) >= 'a' && (c | 32) <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && !strchr("/-._~", c))
            return 0;
        bare[i] = (char)c;
    }
    bare[len - 1] = '\0';
    for (const struct http_route *r = req->server->routes; r->method; r++) {
        char *params[HTTP_MAX_PARAMS] = {0};
        int match = strcmp(r->method, "GET") == 0 && route_match(r->pattern, bare, params);
        for (int i = 0; i < HTTP_MAX_PARAMS; i++)
            free(params[i]);
        if (match) {
            char body[sizeof bare + 8];
            int n = snprintf(body, sizeof body, "see %s\n", bare);
            http_add_header(req, "Location", bare);
            http_reply_raw(req, 308, "text/plain; charset=utf-8", body, (size_t)n);
            return 1;
        }
    }
    return 0;
}

static void dispatch(struct http_request *req)
{
    struct http_server *srv = req->server;
    char allow[128] = "";
    if (strcmp(req->path, "*") == 0) {
        server_wide(req);
        return;
    }
    const struct http_route *found = NULL;
    int literals = -1; /* of the first route that matched: the most (http.h) */
    for (const struct http_route *r = srv->routes; r->method; r++) {
        char *params[HTTP_MAX_PARAMS] = {0};
        if (!route_match(r->pattern, req->path, params))
            continue;
        if (literals < 0) {
            literals = literal_segments(r->pattern);
        } else if (literal_segments(r->pattern) < literals) { /* the path is a more literal route's */
            for (int i = 0; i < HTTP_MAX_PARAMS; i++)
                free(params[i]);
            continue;
        }
        /* HEAD is GET without the body (RFC 9110 9.3.2); libmicrohttpd
         * sends the headers of the GET reply and leaves the body out. */
        int same = strcmp(r->method, req->method) == 0 ||
                   (strcmp(req->method, "HEAD") == 0 && strcmp(r->method, "GET") == 0);
        if (same) { /* the first route of this method wins; the Allow list is only for when none does */
            found = r;
            memcpy(req->params, params, sizeof params);
            break;
        }
        for (int i = 0; i < HTTP_MAX_PARAMS; i++)
            free(params[i]);
        allow_add(allow, sizeof allow, r->method);
        if (strcmp(r->method, "GET") == 0)
            allow_add(allow, sizeof allow, "HEAD");
    }
    if (found) {
        req->route = found;
        if (srv->refuse_cross_site_writes && cross_site_write(req)) {
            http_error(req, ERR_FORBIDDEN, NULL, "a request from a page of another site is refused: its Origin is not"
                       " this server's, nor one of cors_origins");
            return;
        }
        if (found->auth != AUTH_NONE && srv->authenticate(req, found->auth) < 0)
            return;
        if (found->query && http_query_allow(req, found->query) < 0)
            return;
        found->handler(req);
        if (!req->replied && !req->deferred) {
            log_error("http: handler for %s %s did not reply", found->method, found->pattern);
            http_error(req, ERR_INTERNAL, NULL, NULL);
        }
        return;
    }
    if (!allow[0]) {
        if (redirect_trailing_slash(req))
            return;
        http_error(req, ERR_NOT_FOUND, NULL, "no route for %.200s", req->path);
        return;
    }
    if (strcmp(req->method, "OPTIONS") == 0) {
        /* CORS preflight: the Access-Control-* headers go only to an
         * allowed origin (add_common_headers adds Allow-Origin for it). */
        http_add_header(req, "Allow", allow);
        if (cors_allowed_origin(req)) {
            http_add_header(req, "Access-Control-Allow-Methods", allow);
            http_add_header(req, "Access-Control-Allow-Headers", "Authorization, Content-Type, Idempotency-Key");
            http_add_header(req, "Access-Control-Max-Age", "600");
        }
        http_reply_json(req, 204, NULL);
        return;
    }
    http_add_header(req, "Allow", allow);
    http_error(req, ERR_METHOD_NOT_ALLOWED, NULL, "%s is not allowed here; allowed: %s", req->method, allow);
}

/* ---------------------------------------------------------------- libmicrohttpd callbacks */

/* What the raw request target showed before libmicrohttpd decoded it: the
 * decoded path is a C string, so "%00" would cut it short ("/v1/me%00x"
 * served as /v1/me) and "%2F" would become a route separator. The URI log
 * callback sees the target as sent and returns one of these addresses as
 * the request's first context, so nothing is allocated before
 * libmicrohttpd promises a completion callback. */
enum { URI_PLAIN, URI_NUL, URI_ENCODED_SLASH, URI_KINDS };
static const char uri_kind[URI_KINDS];

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    int kind = URI_PLAIN;
    size_t path_len = strcspn(uri, "?");
    for (const char *p = uri; (p = strchr(p, '%')) != NULL; p++) {
        if (p[1] == '0' && p[2] == '0')
            return (void *)(uintptr_t)&uri_kind[URI_NUL];
        if ((size_t)(p - uri) < path_len && p[1] == '2' && (p[2] == 'F' || p[2] == 'f'))
            kind = URI_ENCODED_SLASH;
    }
    return (void *)(uintptr_t)&uri_kind[kind];
}

/* Headers and query arguments holding a NUL byte (raw, or %00 decoded),
 * and the headers' total size. */
struct header_scan {
    int nul;
    size_t bytes;
};

static enum MHD_Result scan_value(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                  const char *value, size_t value_size)
{
    struct header_scan *hs = cls;
    if ((key && strlen(key) != key_size) || (value && strlen(value) != value_size))
        hs->nul = 1;
    hs->bytes += key_size + value_size + 4;
    return MHD_YES;
}

/* Bound on all request headers together: past it, 431 with the API's
 * error body. libmicrohttpd's own limit, its connection memory, is above
 * what the guard lets through (CONNECTION_MEMORY). */
#define HEADERS_MAX_BYTES 16384

/* libmicrohttpd's memory per connection (http_guard.h). Not more: the
 * library clears it after every request, which at 96 KiB was a fifth of a
 * cached read's CPU. */
#define CONNECTION_MEMORY HTTP_GUARD_CONNECTION_MEMORY

/* The framing rules a request must pass before anything reads it (RFC
 * 9112): 1 when it was answered. */
static int refuse_bad_framing(struct http_request *req, int uri)
{
    struct MHD_Connection *conn = req->conn;
    if (uri == URI_NUL) {
        http_error(req, ERR_BAD_REQUEST, NULL, "the request target holds a NUL byte (%%00)");
        return 1;
    }
    struct header_scan hs = {0};
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, scan_value, &hs);
    size_t header_bytes = hs.bytes;
    MHD_get_connection_values_n(conn, MHD_GET_ARGUMENT_KIND, scan_value, &hs);
    if (hs.nul) {
        http_error(req, ERR_BAD_REQUEST, NULL, "a header or query parameter holds a NUL byte");
        return 1;
    }
    if (header_bytes > HEADERS_MAX_BYTES) {
        http_add_header(req, "Connection", "close");
        http_error(req, ERR_HEADERS_TOO_LARGE, NULL, "the request headers are larger than %d bytes",
                   HEADERS_MAX_BYTES);
        return 1;
    }
    const char *te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (te && !req->http11) {
        /* HTTP/1.0 has no transfer codings (RFC 9112 6.1): faulty framing,
         * as in the guard (which refuses it first, over TLS too, where the
         * libraries read through it: http_guard_tls_interposed). */
        http_add_header(req, "Connection", "close");
        http_error(req, ERR_BAD_REQUEST, NULL, "an HTTP/1.0 request has no Transfer-Encoding: send Content-Length");
        return 1;
    }
    if (te && cl) {
        /* Two framings: a proxy in front may have read the other one, so
         * whatever follows on this connection cannot be trusted. */
        http_add_header(req, "Connection", "close");
        http_error(req, ERR_BAD_REQUEST, NULL, "the request has both Content-Length and Transfer-Encoding");
        return 1;
    }
    if (te && strcasecmp(te, "chunked") != 0) {
        http_add_header(req, "Connection", "close");
        http_error(req, ERR_NOT_IMPLEMENTED, NULL, "Transfer-Encoding %.60s is not implemented; use chunked", te);
        return 1;
    }
    if (req->http11 && !MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST)) {
        http_error(req, ERR_BAD_REQUEST, NULL, "an HTTP/1.1 request must have a Host header");
        return 1;
    }
    if (uri == URI_ENCODED_SLASH) {
        /* An encoded slash is data inside one segment, and no id holds one. */
        http_error(req, ERR_NOT_FOUND, NULL, "no route for %.200s (an encoded slash is not a separator)", req->path);
        return 1;
    }
    return 0;
}

/* Where the connection carrying req is now, for its deadline. */
static void conn_phase(struct http_request *req, enum http_conn_phase phase)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci)
        http_conns_set_phase(req->server->conns, ci->socket_context, phase);
}

static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    struct http_server *srv = cls;
    if (atomic_load(&srv->closing))
        return MHD_NO;
    return http_conns_accept(srv->conns, addr) ? MHD_YES : MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct http_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *peer = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        *socket_context = fd ? http_conns_opened(srv->conns, fd->connect_fd, peer ? peer->client_addr : NULL) : NULL;
        if (fd && !srv->cert_pem) {
            http_guard_open(fd->connect_fd);
        } else if (fd) {
            /* TLS: the socket carries ciphertext; the guard reads the
             * session's plaintext as the library takes it. */
            const union MHD_ConnectionInfo *tls = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
            http_guard_open_tls(fd->connect_fd, tls ? tls->tls_session : NULL);
        }
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (fd)
            http_guard_close(fd->connect_fd);
        http_conns_closed(srv->conns, *socket_context);
        *socket_context = NULL;
    }
}

/* The path of a request target in absolute form ("http://host/path", RFC
 * 9112 3.2.2), which a server must accept as it does the origin form
 * ("/path"), as proxies send it; other targets unchanged. */
static const char *origin_form(const char *url)
{
    size_t skip = strncasecmp(url, "http://", 7) == 0 ? 7 : strncasecmp(url, "https://", 8) == 0 ? 8 : 0;
    if (!skip)
        return url;
    const char *path = strchr(url + skip, '/');
    return path ? path : "/";
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    struct http_server *srv = cls;
    int uri = URI_PLAIN;
    const char *first = *req_cls;
    if (first >= uri_kind && first < uri_kind + URI_KINDS) {
        uri = (int)(first - uri_kind);
        *req_cls = NULL;
    }
    struct http_request *req = *req_cls;

    if (!req) {
        /* First call: only headers are known. Set up state and return, so
         * that keep-alive and 100-continue work; the reply comes later. */
        req = calloc(1, sizeof *req);
        if (!req)
            return MHD_NO;
        *req_cls = req;
        atomic_fetch_add(&srv->in_flight, 1);
        req->server = srv;
        req->conn = conn;
        req->method = method;
        req->path = origin_form(url);
        req->start_ms = clock_mono_ms();
        req->start_us = clock_mono_us();
        if (id_new("req", req->request_id) < 0)
            snprintf(req->request_id, sizeof req->request_id, "req_unknown");
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr) {
            const struct sockaddr *sa = ci->client_addr;
            if (sa->sa_family == AF_INET)
                inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, req->client_ip, sizeof req->client_ip);
            else if (sa->sa_family == AF_INET6)
                inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, req->client_ip, sizeof req->client_ip);
        }
        forwarded_client(req);
        conn_phase(req, HTTP_CONN_BODY);
        req->http11 = strcmp(version, MHD_HTTP_VERSION_1_1) == 0;
        if (refuse_bad_framing(req, uri))
            return MHD_YES;
        /* A declared length over the cap is refused before any body is read. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        pthread_rwlock_rdlock(&srv->reload_lock);
        size_t cap = srv->max_body_bytes;
        pthread_rwlock_unlock(&srv->reload_lock);
        if (cl && strtoull(cl, NULL, 10) > cap) {
            http_error(req, ERR_BODY_TOO_LARGE, NULL, "the request body is larger than %zu bytes", cap);
            return MHD_YES;
        }
        if (strlen(url) > srv->max_path_bytes) {
            http_error(req, ERR_URI_TOO_LONG, NULL, NULL);
            return MHD_YES;
        }
        return MHD_YES;
    }
    if (req->deferred) {
        /* Called again while suspended (should not happen) or after
         * http_resume: the resume function replies. */
        http_resume_fn fn = req->resume_fn;
        if (!fn)
            return MHD_YES;
        req->resume_fn = NULL;
        req->deferred = 0;
        fn(req, req->resume_ctx, 1);
        if (!req->replied) {
            log_error("http: deferred %s %s did not reply", req->method, req->path);
            http_error(req, ERR_INTERNAL, NULL, NULL);
        }
        return MHD_YES;
    }
    if (req->replied) {
        *upload_data_size = 0; /* an early reply was queued; drop the rest */
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        pthread_rwlock_rdlock(&srv->reload_lock);
        size_t cap = srv->max_body_bytes;
        pthread_rwlock_unlock(&srv->reload_lock);
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (req->body_too_large || req->body_len + n > cap) {
            req->body_too_large = 1;
            free(req->body);
            req->body = NULL;
            req->body_len = 0;
            return MHD_YES;
        }
        char *grown = realloc(req->body, req->body_len + n + 1);
        if (!grown)
            return MHD_NO;
        req->body = grown;
        memcpy(req->body + req->body_len, upload_data, n);
        req->body_len += n;
        req->body[req->body_len] = '\0';
        return MHD_YES;
    }
    /* The whole request has arrived. */
    if (req->body_too_large) {
        pthread_rwlock_rdlock(&srv->reload_lock);
        size_t cap = srv->max_body_bytes;
        pthread_rwlock_unlock(&srv->reload_lock);
        http_error(req, ERR_BODY_TOO_LARGE, NULL, "the request body is larger than %zu bytes", cap);
        return MHD_YES;
    }
    conn_phase(req, HTTP_CONN_BUSY);
    dispatch(req);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls, enum MHD_RequestTerminationCode toe)
{
    struct http_server *srv = cls;
    struct http_request *req = *req_cls;
    const char *first = *req_cls;
    if (!req || (first >= uri_kind && first < uri_kind + URI_KINDS))
        return; /* libmicrohttpd answered it before on_request ran */
    conn_phase(req, HTTP_CONN_HEADERS); /* the next request on it, if any */
    if (req->resume_fn) /* resumed, but the connection closed before it replied */
        req->resume_fn(req, req->resume_ctx, 0);
    if (req->upgrade) { /* the client left before the protocol switch */
        struct upgrade_call *u = req->upgrade;
        req->upgrade = NULL;
        u->fn(u->ctx, -1, NULL, 0, NULL);
        free(u);
    }
    int64_t ms = clock_mono_ms() - req->start_ms;
    if (srv->on_done)
        srv->on_done(req, clock_mono_us() - req->start_us);
    /* Paths never hold secrets (keys travel in headers); bodies are not logged.
     * A routine poll that succeeded says nothing an operator needs at info:
     * a gateway's two calls a second would be most of the journal. */
    int quiet = req->routine && req->replied && req->status < 400 && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
    log_buffered(quiet ? LOG_LVL_DEBUG : LOG_LVL_INFO, "http: %s %s %u %lldms %s %s%s", req->method, req->path,
                 req->replied ? req->status : 0, (long long)ms, req->request_id, req->client_ip,
                 toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed early)");
    free_params(req);
    free(req->body);
    free(req);
    *req_cls = NULL;
    atomic_fetch_sub(&srv->in_flight, 1);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    log_warn("http: libmicrohttpd: %s", line);
}

/* ---------------------------------------------------------------- life cycle */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = (cap ? cap * 2 : 8192);
            char *g = realloc(buf, cap);
            if (!g) { free(buf); fclose(f); return NULL; }
            buf = g;
        }
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

int http_address_free(const char *host, int port, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char service[8];
    snprintf(service, sizeof service, "%d", port);
    int gai = getaddrinfo(host, service, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "'%s' is not a numeric IP address: %s", host, gai_strerror(gai));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, rc = -1;
    if (fd < 0)
        snprintf(err, errlen, "socket: %s", strerror(errno));
    else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
             bind(fd, ai->ai_addr, ai->ai_addrlen) != 0)
        snprintf(err, errlen, "cannot bind %s:%d: %s", host, port, strerror(errno));
    else
        rc = 0;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return rc;
}

struct http_server *http_server_start(const struct http_config *cfg, const struct http_route *routes,
                                      http_authenticate_fn authenticate, void *app)
{
    struct http_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return NULL;
    srv->routes = routes;
    srv->authenticate = authenticate;
    srv->on_done = cfg->on_done;
    srv->unavailable_cause = cfg->unavailable_cause;
    srv->refuse_cross_site_writes = cfg->refuse_cross_site_writes;
    snprintf(srv->trusted_proxies, sizeof srv->trusted_proxies, "%s", cfg->trusted_proxies ? cfg->trusted_proxies : "");
    srv->app = app;
    srv->max_path_bytes = cfg->max_path_bytes ? cfg->max_path_bytes : 2048;
    pthread_rwlock_init(&srv->reload_lock, NULL);
    http_server_reload(srv, cfg->cors_origins, cfg->max_body_bytes, cfg->max_json_depth);

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[8];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0) {
        log_error("http: listen address '%s' is not a numeric IP address: %s", cfg->host, gai_strerror(gai));
        goto fail;
    }
    /* epoll: a worker's wait costs what is ready, not every connection it
     * holds (with poll() the kernel looked at each of an agent's hundreds of
     * kept connections on every request). MHD_quiesce_daemon is not used:
     * with a thread pool on epoll it races the workers for removing the
     * listen socket from their epoll sets, and the loser aborts the process
     * ("Failed to remove listen FD from epoll set"); http_server_stop stops
     * taking connections in the accept policy instead. */
    /* MHD_ALLOW_SUSPEND_RESUME: http_defer; a resume from another thread
     * wakes the connection's worker through its ITC. */
    /* MHD_ALLOW_UPGRADE: http_reply_upgrade (the web terminal's WebSocket). */
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_ALLOW_UPGRADE;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    if (cfg->cert_file && cfg->cert_file[0]) {
        srv->cert_pem = read_file(cfg->cert_file);
        srv->key_pem = read_file(cfg->key_file ? cfg->key_file : "");
        if (!srv->cert_pem || !srv->key_pem) {
            log_error("http: cannot read TLS certificate %s or key %s", cfg->cert_file, cfg->key_file ? cfg->key_file : "");
            goto fail;
        }
        flags |= MHD_USE_TLS;
        if (!http_guard_tls_interposed())
            log_warn("http: libmicrohttpd does not read TLS through the request guard (is it built on GnuTLS?); "
                     "over HTTPS only the HTTP layer's own checks of the framing apply");
    }
    /* GnuTLS's NORMAL still offers TLS 1.0 and 1.1 and CBC ciphers with
     * SHA-1 MACs, which TLS scanners rightly fail: TLS 1.2 and 1.3 only,
     * AEAD ciphers only, forward secrecy only, in the server's order of
     * preference, as Mozilla's "intermediate" profile has it (every browser
     * and curl of the last ten years speaks them). */
    static char tls_priorities[] = "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-GCM:"
                                   "+AES-256-GCM:+CHACHA20-POLY1305:-MAC-ALL:+AEAD:-KX-ALL:+ECDHE-ECDSA:"
                                   "+ECDHE-RSA:%SERVER_PRECEDENCE";
    struct MHD_OptionItem tls_opts[] = {
        {srv->cert_pem ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, srv->cert_pem},
        {srv->key_pem ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, srv->key_pem},
        {srv->cert_pem ? MHD_OPTION_HTTPS_PRIORITIES : MHD_OPTION_END, 0, tls_priorities},
        {MHD_OPTION_END, 0, NULL},
    };
    /* The per-address cap counts only connections still sending headers
     * (http_conns.c): clients behind one NAT address that keep requests
     * flowing are not starved by it; libmicrohttpd's own per-address cap,
     * which counts every connection, stays off. */
    struct http_conns_limits limits = {
        .header_timeout_ms = (int64_t)cfg->header_timeout_s * 1000,
        .body_timeout_ms = cfg->body_min_rate > 0 ? ((int64_t)cfg->header_timeout_s * 1000 +
                                                     (int64_t)(cfg->max_body_bytes * 1000 / (uint64_t)cfg->body_min_rate))
                                                  : 0,
        .max_connections = cfg->max_connections,
        .max_headers_per_client = cfg->max_connections_per_ip,
    };
    srv->conns = http_conns_new(&limits);
    if (!srv->conns)
        goto fail;
    srv->mhd = MHD_start_daemon(flags, (uint16_t)cfg->port, on_accept, srv, on_request, srv,
                                MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                                MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->threads,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
                                MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->connection_timeout_s,
                                MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv,
                                MHD_OPTION_CONNECTION_MEMORY_LIMIT, CONNECTION_MEMORY,
                                MHD_OPTION_ARRAY, tls_opts, /* empty (its first item ends it) without a certificate */
                                MHD_OPTION_END);
    freeaddrinfo(ai);
    ai = NULL;
    if (!srv->mhd) {
        log_error("http: cannot listen on %s:%d (address in use, or a bad TLS key?)", cfg->host, cfg->port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : cfg->port;
    return srv;
fail:
    if (ai)
        freeaddrinfo(ai);
    free(srv->cert_pem);
    free(srv->key_pem);
    pthread_rwlock_destroy(&srv->reload_lock);
    http_conns_free(srv->conns);
    free(srv);
    return NULL;
}

int http_server_port(const struct http_server *srv) { return srv->port; }
void *http_server_app(const struct http_server *srv) { return srv->app; }

void http_server_reload(struct http_server *srv, const char *cors_origins, size_t max_body_bytes, int max_json_depth)
{
    pthread_rwlock_wrlock(&srv->reload_lock);
    snprintf(srv->cors_origins, sizeof srv->cors_origins, "%s", cors_origins ? cors_origins : "");
    srv->max_body_bytes = max_body_bytes;
    srv->max_json_depth = max_json_depth;
    pthread_rwlock_unlock(&srv->reload_lock);
}

void http_server_stop(struct http_server *srv, int drain_ms)
{
    if (!srv)
        return;
    /* Take no new connection first, so no new request starts while we
     * drain (one that arrives is accepted and closed at once). */
    atomic_store(&srv->closing, 1);
    if (drain_ms > 0)
        log_info("http: taking no new connections; %d requests in flight", atomic_load(&srv->in_flight));
    int64_t deadline = clock_mono_ms() + drain_ms;
    while (atomic_load(&srv->in_flight) > 0 && clock_mono_ms() < deadline)
        usleep(10 * 1000);
    if (atomic_load(&srv->in_flight) > 0)
        log_warn("http: %d requests still in flight after %d ms; closing them", atomic_load(&srv->in_flight), drain_ms);
    MHD_stop_daemon(srv->mhd);
    free(srv->cert_pem);
    free(srv->key_pem);
    pthread_rwlock_destroy(&srv->reload_lock);
    http_conns_free(srv->conns);
    free(srv);
}
