/* http_guard.c: the check of what clients send, in front of libmicrohttpd
 * (see http_guard.h): a small parser that follows each guarded
 * connection's requests (head, then body by Content-Length or chunks), and
 * the recv() and gnutls_record_recv() through which the library reads them. */
#include "gpurent/http_guard.h"
#include "gpurent/api_error.h"
#include "gpurent/ids.h"
#include "gpurent/log.h"

#include <ctype.h>
#include <dlfcn.h>
#include <gnutls/gnutls.h>
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum {
    G_HEAD,       /* a request line and headers arriving */
    G_BODY,       /* a body of known length: remaining bytes */
    G_CHUNK_SIZE, /* a chunk-size line */
    G_CHUNK_DATA, /* a chunk's data: remaining bytes */
    G_CHUNK_END,  /* the CRLF after a chunk's data (line_len: 1 once CR came) */
    G_TRAILER,    /* trailer lines after the last chunk, to an empty one */
    G_PASS,       /* checked no further: the connection was upgraded (a
                     WebSocket), or its framing is one the HTTP layer
                     refuses and closes on itself */
    G_REFUSED,    /* a request was refused; nothing more is read */
};

static void refuse(struct http_guard *g, enum api_error e, const char *message)
{
    const struct api_error_info *info = api_error_info(e);
    g->refused = 1;
    g->status = info->status;
    g->code = info->code;
    snprintf(g->message, sizeof g->message, "%s", message);
    g->state = G_REFUSED;
}

static int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* Whether the header line [p, e) is name: (case-insensitive); then *value
 * and *value_end bound its value without surrounding whitespace or CRLF. */
static int header_is(const char *p, const char *e, const char *name, const char **value, const char **value_end)
{
    size_t n = strlen(name);
    if ((size_t)(e - p) <= n || strncasecmp(p, name, n) != 0 || p[n] != ':')
        return 0;
    const char *v = p + n + 1;
    while (v < e && is_ows(*v))
        v++;
    while (e > v && (is_ows(e[-1]) || e[-1] == '\r' || e[-1] == '\n'))
        e--;
    *value = v;
    *value_end = e;
    return 1;
}

/* RFC 9110 5.6.2: the characters of a token (a method, a header name). */
static int is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The request line [p, e), its line ending cut (RFC 9112 3): a method
 * token, one space, a target without spaces or controls, one space,
 * HTTP/1.0 or HTTP/1.1 (another version is 505). 0, or refused. */
static int request_line_ok(struct http_guard *g, const char *p, const char *e)
{
    const char *m = p;
    while (p < e && is_tchar((unsigned char)*p))
        p++;
    int bad = p == m || p == e || *p++ != ' ';
    const char *t = p;
    while (!bad && p < e && (unsigned char)*p > ' ' && *p != 0x7f)
        p++;
    bad = bad || p == t || p == e || *p++ != ' ';
    if (!bad && (e - p != 8 || strncmp(p, "HTTP/", 5) != 0 || p[5] < '0' || p[5] > '9' || p[6] != '.' ||
                 p[7] < '0' || p[7] > '9'))
        bad = 1;
    if (bad) {
        refuse(g, ERR_BAD_REQUEST, "the request line is malformed (METHOD target HTTP/1.1)");
        return -1;
    }
    if (strncmp(p, "HTTP/1.0", 8) != 0 && strncmp(p, "HTTP/1.1", 8) != 0) {
        refuse(g, ERR_HTTP_VERSION, "only HTTP/1.0 and HTTP/1.1 are served");
        return -1;
    }
    /* The library keeps a record of each query parameter in the
     * connection's memory, as of each header field. */
    const char *q = memchr(t, '?', (size_t)(p - 1 - t));
    size_t params = q ? 1 : 0;
    for (; q && q < p - 1; q++)
        params += *q == '&';
    if (params > HTTP_GUARD_PARAMS_MAX) {
        char message[80];
        snprintf(message, sizeof message, "the query has more than %d parameters", HTTP_GUARD_PARAMS_MAX);
        refuse(g, ERR_URI_TOO_LONG, message);
        return -1;
    }
    return 0;
}

/* The request line [p, e), checked as soon as it is whole: the library
 * parses it then, and would answer a malformed one with its own page. */
static int first_line_ok(struct http_guard *g, const char *p, const char *e)
{
    if (e > p && e[-1] == '\n')
        e--;
    if (e > p && e[-1] == '\r')
        e--;
    if (memchr(p, '\0', (size_t)(e - p)) || memchr(p, '\r', (size_t)(e - p))) {
        refuse(g, ERR_BAD_REQUEST, "the request line holds a NUL byte or a bare CR");
        return -1;
    }
    return request_line_ok(g, p, e);
}

/* A header line [p, e), its line ending cut (RFC 9112 5): a name token
 * right before the colon, then a value without control characters but
 * tabs; no obsolete folding. 0, or refused. */
static int header_line_ok(struct http_guard *g, const char *p, const char *e)
{
    if (*p == ' ' || *p == '\t') {
        refuse(g, ERR_BAD_REQUEST, "a header is folded onto a second line (obsolete, RFC 9112 5.2)");
        return -1;
    }
    const char *n = p;
    while (p < e && is_tchar((unsigned char)*p))
        p++;
    if (p == n || p == e || *p != ':') {
        refuse(g, ERR_BAD_REQUEST, "a header line is malformed (a name, then a colon, then the value)");
        return -1;
    }
    for (p++; p < e; p++)
        if (((unsigned char)*p < ' ' && *p != '\t') || *p == 0x7f) {
            refuse(g, ERR_BAD_REQUEST, "a header value holds a control character");
            return -1;
        }
    return 0;
}

/* Whether [v, ve) is a Host value: uri-host [ ":" port ] (RFC 9112 3.2,
 * RFC 3986 3.2.2), a name or address of unreserved, percent-encoded and
 * sub-delimiter characters, or an IP literal in brackets; never user
 * information ('@') or a path. */
static int host_ok(const char *v, const char *ve)
{
    const char *p = v;
    if (p < ve && *p == '[') {
        for (p++; p < ve && *p != ']'; p++)
            if (!isxdigit((unsigned char)*p) && *p != ':' && *p != '.' && *p != 'v' && *p != 'V')
                return 0;
        if (p == ve || p[-1] == '[')
            return 0; /* no closing bracket, or nothing inside */
        p++;
    } else {
        for (; p < ve && *p != ':'; p++)
            if (!isalnum((unsigned char)*p) && !strchr("-._~%!$&'()*+,;=", *p))
                return 0;
    }
    if (p < ve && *p == ':')
        for (p++; p < ve && isdigit((unsigned char)*p);)
            p++;
    return p == ve;
}

/* Fields that carry one value (RFC 9110 5.3), which the servers read to
 * decide who is asking and what a request means: a second one, which the
 * library would ignore and a proxy in front might have read instead, is
 * refused (for Host, RFC 9112 3.2 says so). */
static const char *const single_fields[] = {
    "host", "authorization", "content-type", "idempotency-key", "origin", "sec-websocket-key",
    "sec-websocket-version", "x-gpurent-timestamp", "x-gpurent-nonce", "x-gpurent-signature",
};
#define N_SINGLE_FIELDS (sizeof single_fields / sizeof single_fields[0])

/* The head is whole: its request line and header lines checked (a NUL, a
 * bare CR, a malformed line, a repeated single field or a Content-Length
 * that is not one number refuse it); then the framing of what follows it. */
static void head_done(struct http_guard *g)
{
    const char *h = g->head, *end = g->head + g->head_len;
    unsigned char seen[N_SINGLE_FIELDS] = {0};
    g->head_len = g->line_start = g->head_lines = 0;
    if (memchr(h, '\0', (size_t)(end - h))) {
        refuse(g, ERR_BAD_REQUEST, "the request line or a header holds a NUL byte");
        return;
    }
    int te = 0, te_chunked = 0, cl = 0, host = 0;
    uint64_t length = 0;
    for (const char *line = h; line < end;) {
        const char *next = memchr(line, '\n', (size_t)(end - line));
        const char *e = next ? next : end, *v, *ve;
        if (e > line && e[-1] == '\r')
            e--;
        if (memchr(line, '\r', (size_t)(e - line))) {
            refuse(g, ERR_BAD_REQUEST, "a line of the request holds a bare CR");
            return;
        }
        if (e == line) /* the empty line that ends the head */
            break;
        if (line == h ? request_line_ok(g, line, e) < 0 : header_line_ok(g, line, e) < 0)
            return;
        for (size_t f = 0; line != h && f < N_SINGLE_FIELDS; f++)
            if (header_is(line, e, single_fields[f], &v, &ve) && seen[f]++) {
                char message[80];
                snprintf(message, sizeof message, "the request repeats its %s header", single_fields[f]);
                refuse(g, ERR_BAD_REQUEST, message);
                return;
            }
        if (header_is(line, e, "transfer-encoding", &v, &ve)) {
            te++;
            te_chunked = ve - v == 7 && strncasecmp(v, "chunked", 7) == 0;
        } else if (header_is(line, e, "content-length", &v, &ve)) {
            uint64_t value = 0;
            const char *d = v;
            for (; d < ve && *d >= '0' && *d <= '9' && d - v < 19; d++)
                value = value * 10 + (uint64_t)(*d - '0');
            if (d < ve && d - v == 19 && *d >= '0' && *d <= '9') {
                refuse(g, ERR_BODY_TOO_LARGE, "the declared Content-Length is far too large");
                return;
            }
            /* One number; the same one again is allowed (RFC 9112 6.3),
             * two different ones (a request smuggled past a proxy) not. */
            if (d == v || d < ve || (cl && value != length)) {
                refuse(g, ERR_BAD_REQUEST, "Content-Length must be one decimal number");
                return;
            }
            cl++;
            length = value;
        } else if (header_is(line, e, "host", &v, &ve)) {
            host = 1;
            if (!host_ok(v, ve)) {
                refuse(g, ERR_BAD_REQUEST, "the Host header is not a host name or address with an optional port");
                return;
            }
        }
        line = next ? next + 1 : end;
    }
    const char *line_end = memchr(h, '\n', (size_t)(end - h));
    line_end = line_end && line_end > h && line_end[-1] == '\r' ? line_end - 1 : line_end ? line_end : end;
    int http11 = line_end - h >= 8 && memcmp(line_end - 8, "HTTP/1.1", 8) == 0;
    /* A proxy in front may have framed such a request otherwise (RFC 9112
     * 6.1): refused here, before libmicrohttpd, on every server. HTTP/1.0
     * has no transfer codings, so one there is faulty framing too, whatever
     * else the head says. An HTTP/1.1 request without Host is refused too
     * (RFC 9112 3.2). */
    if (te && !http11) {
        refuse(g, ERR_BAD_REQUEST, "an HTTP/1.0 request has no Transfer-Encoding: send Content-Length");
    } else if (te && cl) {
        refuse(g, ERR_BAD_REQUEST, "the request has both Content-Length and Transfer-Encoding");
    } else if (te && (te > 1 || !te_chunked)) {
        refuse(g, ERR_NOT_IMPLEMENTED, "only the chunked transfer coding is implemented; use chunked");
    } else if (te) {
        g->state = G_CHUNK_SIZE;
        g->line_len = 0;
    } else if (length > 0) {
        g->state = G_BODY;
        g->remaining = length;
    } else {
        g->state = G_HEAD;
    }
    /* Last, so that the framing's own refusals (a 501) come first. */
    if (!host && !g->refused && http11)
        refuse(g, ERR_BAD_REQUEST, "an HTTP/1.1 request needs a Host header");
}

/* Adds [p, p + n) to the head; 0, or -1 (refused) when it would be too long. */
static int head_add(struct http_guard *g, const char *p, size_t n)
{
    if (g->head_len + n > HTTP_GUARD_HEAD_MAX) {
        char message[120];
        int in_request_line = g->head_lines == 0; /* no line ended yet */
        snprintf(message, sizeof message, "the request %s larger than %d bytes",
                 in_request_line ? "line is" : "line and headers are", HTTP_GUARD_HEAD_MAX);
        refuse(g, in_request_line ? ERR_URI_TOO_LONG : ERR_HEADERS_TOO_LARGE, message);
        return -1;
    }
    if (g->head_len + n > g->head_cap) {
        size_t cap = g->head_cap ? g->head_cap : 1024;
        while (cap < g->head_len + n)
            cap *= 2;
        char *grown = realloc(g->head, cap);
        if (!grown) {
            refuse(g, ERR_UNAVAILABLE, "the server is out of memory; retry");
            return -1;
        }
        g->head = grown;
        g->head_cap = cap;
    }
    memcpy(g->head + g->head_len, p, n);
    g->head_len += n;
    return 0;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A whole chunk-size line (RFC 9112 7.1: 1*HEXDIG, then optionally BWS and
 * extensions after ';', then CRLF): the next state, or refused. */
static void chunk_size_done(struct http_guard *g)
{
    size_t len = g->line_len, k = 0;
    const char *l = g->line;
    while (len && (l[len - 1] == '\n' || l[len - 1] == '\r'))
        len--;
    uint64_t size = 0;
    for (; k < len && hex_value(l[k]) >= 0; k++) {
        if (size >> 59) {
            refuse(g, ERR_BAD_REQUEST, "a chunk size is too large");
            return;
        }
        size = size * 16 + (uint64_t)hex_value(l[k]);
    }
    size_t digits = k;
    while (k < len && is_ows(l[k]))
        k++;
    int bad = digits == 0 || (k < len && l[k] != ';');
    for (size_t j = k; j < len && !bad; j++)
        bad = ((unsigned char)l[j] < 0x20 && l[j] != '\t') || l[j] == 0x7f;
    if (bad) {
        refuse(g, ERR_BAD_REQUEST, "a chunk size is malformed (hexadecimal digits, then optional ;extensions)");
        return;
    }
    g->line_len = 0;
    if (size == 0) {
        g->state = G_TRAILER;
        g->trailer_bytes = g->trailer_fields = 0;
    } else {
        g->state = G_CHUNK_DATA;
        g->remaining = size;
    }
}

size_t http_guard_scan(struct http_guard *g, const char *p, size_t n)
{
    size_t i = 0, start = 0; /* where the current request began in p (0: in an earlier read) */
    while (i < n && g->state != G_REFUSED && g->state != G_PASS) {
        const char *nl;
        size_t take;
        switch (g->state) {
        case G_HEAD:
            if (g->head_len == 0) {
                /* Empty lines before a request are ignored (RFC 9112 2.2), a
                 * few of them: libmicrohttpd keeps them all, and a flood
                 * got its HTML 414. */
                while (i < n && (p[i] == '\r' || p[i] == '\n') &&
                       ++g->blank_bytes <= 2 * HTTP_GUARD_BLANK_LINES_MAX)
                    i++;
                if (g->blank_bytes > 2 * HTTP_GUARD_BLANK_LINES_MAX) {
                    refuse(g, ERR_BAD_REQUEST, "too many empty lines before the request line");
                    break;
                }
                start = i;
                if (i == n)
                    break;
                g->blank_bytes = 0;
            }
            nl = memchr(p + i, '\n', n - i);
            take = nl ? (size_t)(nl - (p + i)) + 1 : n - i;
            if (head_add(g, p + i, take) < 0)
                break;
            i += take;
            if (nl) {
                size_t line_at = g->line_start, line = g->head_len - line_at;
                int empty = line == 1 || (line == 2 && g->head[line_at] == '\r');
                g->line_start = g->head_len;
                /* Counted as the lines come: the library has the first
                 * ones before the head ends. */
                if (!empty && ++g->head_lines > HTTP_GUARD_FIELDS_MAX + 1) {
                    char message[80];
                    snprintf(message, sizeof message, "the request has more than %d header fields",
                             HTTP_GUARD_FIELDS_MAX);
                    refuse(g, ERR_HEADERS_TOO_LARGE, message);
                    break;
                }
                if (g->head_lines == 1 && !empty && line_at == 0 &&
                    first_line_ok(g, g->head, g->head + g->head_len) < 0)
                    break;
                if (empty)
                    head_done(g);
            }
            break;
        case G_BODY:
        case G_CHUNK_DATA:
            take = g->remaining < n - i ? (size_t)g->remaining : n - i;
            i += take;
            g->remaining -= take;
            if (g->remaining == 0)
                g->state = g->state == G_BODY ? G_HEAD : G_CHUNK_END;
            g->line_len = 0;
            break;
        case G_CHUNK_END:
            if (p[i] == '\r' && g->line_len == 0) {
                g->line_len = 1;
            } else if (p[i] == '\n') {
                g->state = G_CHUNK_SIZE;
                g->line_len = 0;
            } else {
                refuse(g, ERR_BAD_REQUEST, "a chunk holds more data than its size says");
                break;
            }
            i++;
            break;
        case G_CHUNK_SIZE:
            nl = memchr(p + i, '\n', n - i);
            take = nl ? (size_t)(nl - (p + i)) + 1 : n - i;
            if (g->line_len + take > sizeof g->line) {
                refuse(g, ERR_BAD_REQUEST, "a chunk-size line is too long");
                break;
            }
            memcpy(g->line + g->line_len, p + i, take);
            g->line_len += take;
            i += take;
            if (nl)
                chunk_size_done(g);
            break;
        case G_TRAILER:
            nl = memchr(p + i, '\n', n - i);
            take = nl ? (size_t)(nl - (p + i)) + 1 : n - i;
            if (memchr(p + i, '\0', take)) {
                refuse(g, ERR_BAD_REQUEST, "a trailer field holds a NUL byte");
                break;
            }
            g->trailer_bytes += take;
            if (g->trailer_bytes > HTTP_GUARD_HEAD_MAX) {
                refuse(g, ERR_HEADERS_TOO_LARGE, "the request's trailer fields are too large");
                break;
            }
            /* line_len counts this line's bytes, and line[0] keeps its first */
            if (g->line_len == 0)
                g->line[0] = p[i];
            g->line_len += take;
            i += take;
            if (nl) {
                int empty = g->line_len == 1 || (g->line_len == 2 && g->line[0] == '\r');
                g->line_len = 0;
                if (empty) {
                    g->state = G_HEAD;
                } else if (++g->trailer_fields > HTTP_GUARD_FIELDS_MAX) {
                    refuse(g, ERR_HEADERS_TOO_LARGE, "the request has too many trailer fields");
                    break;
                }
            }
            break;
        }
    }
    return g->refused ? start : n;
}

void http_guard_release(struct http_guard *g)
{
    free(g->head);
    g->head = NULL;
    g->head_len = g->head_cap = 0;
}

/* ---------------------------------------------------------------- the sockets */

/* The guard of each socket by its number (a socket beyond the table, whose
 * size is the process's limit on open files at the first open, is not
 * guarded), and beside it the TLS session of a TLS connection. libmicrohttpd
 * tells a connection closed before it closes the socket, so a number is
 * never reused while its slot is set. Each guard is used by the one thread
 * that serves its connection. */
typedef _Atomic(struct http_guard *) guard_slot;
typedef _Atomic(void *) session_slot;
static guard_slot *_Atomic table;
static session_slot *sessions;
static size_t table_size;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static atomic_llong refusals;

static void table_init(void)
{
    struct rlimit rl;
    size_t size = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (size_t)rl.rlim_cur : 65536;
    if (size > (1u << 20))
        size = 1u << 20;
    guard_slot *t = calloc(size, sizeof *t);
    session_slot *s = calloc(size, sizeof *s);
    if (!t || !s) {
        free(t);
        free(s);
        log_warn("http: no memory for the request guard; requests are not checked before libmicrohttpd");
        return;
    }
    table_size = size;
    sessions = s;
    atomic_store_explicit(&table, t, memory_order_release);
}

/* The guard of socket fd, or NULL. */
static struct http_guard *guard_of(int fd)
{
    guard_slot *t = atomic_load_explicit(&table, memory_order_acquire);
    return t && fd >= 0 && (size_t)fd < table_size ? atomic_load_explicit(&t[fd], memory_order_acquire) : NULL;
}

static void guard_install(int fd, void *tls_session)
{
    pthread_once(&table_once, table_init);
    guard_slot *t = atomic_load_explicit(&table, memory_order_acquire);
    if (!t || fd < 0 || (size_t)fd >= table_size)
        return;
    struct http_guard *g = calloc(1, sizeof *g);
    if (g)
        g->tls_session = tls_session;
    atomic_store_explicit(&sessions[fd], g ? tls_session : NULL, memory_order_release);
    struct http_guard *old = atomic_exchange(&t[fd], g);
    if (old) {
        http_guard_release(old);
        free(old);
    }
}

void http_guard_open(int fd)
{
    guard_install(fd, NULL);
}

void http_guard_open_tls(int fd, void *tls_session)
{
    if (tls_session)
        guard_install(fd, tls_session);
}

void http_guard_upgraded(int fd)
{
    /* A request asking for an upgrade is framed as any other until the
     * server switched: one it refuses leaves the connection speaking
     * HTTP, and the requests after it are checked as ever. */
    struct http_guard *g = guard_of(fd);
    if (g && !g->refused)
        g->state = G_PASS;
}

void http_guard_close(int fd)
{
    guard_slot *t = atomic_load_explicit(&table, memory_order_acquire);
    if (!t || fd < 0 || (size_t)fd >= table_size)
        return;
    struct http_guard *g = atomic_exchange(&t[fd], NULL);
    atomic_store_explicit(&sessions[fd], NULL, memory_order_release);
    if (g) {
        http_guard_release(g);
        free(g);
    }
}

int64_t http_guard_refusals(void)
{
    return (int64_t)atomic_load(&refusals);
}

/* Sends the refusal (the API's JSON error, then the end of the
 * connection: over TLS through its session, with a close_notify) and tells
 * the library the client has ended: 0. */
static ssize_t answer_refusal(struct http_guard *g, int fd)
{
    if (g->refused == 1) {
        g->refused = 2;
        atomic_fetch_add(&refusals, 1);
        json_t *j = json_pack("{s:{s:s, s:s, s:n}}", "error", "code", g->code, "message", g->message, "field");
        char *body = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        /* Its own request id, as every reply has one: the log line says it. */
        char request_id[ID_MAX];
        if (id_new("req", request_id) < 0)
            snprintf(request_id, sizeof request_id, "req_unknown");
        char reply[1024], date[48] = "";
        const char *reason = MHD_get_reason_phrase_for((unsigned)g->status);
        /* Date, as on every reply of an origin server with a clock (RFC
         * 9110 6.6.1), in its fixed form (the programs keep the C locale);
         * the real clock's. */
        time_t now = time(NULL);
        struct tm tm;
        if (gmtime_r(&now, &tm))
            strftime(date, sizeof date, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
        /* The headers every answer of the servers carries (http.c's
         * add_common_headers): an error is never stored by a cache between,
         * nor sniffed by a browser as something other than JSON. */
        int len = snprintf(reply, sizeof reply,
                           "HTTP/1.1 %d %s\r\n%sContent-Type: application/json\r\nContent-Length: %zu\r\n"
                           "X-Request-Id: %s\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                           "Connection: close\r\n\r\n%s",
                           g->status, reason && reason[0] ? reason : "Error", date, body ? strlen(body) : 0, request_id,
                           body ? body : "");
        free(body);
        int fits = len > 0 && (size_t)len < sizeof reply;
        if (g->tls_session) {
            /* The library is between requests and sends nothing now, so the
             * session is free for this record; a reply this small goes in
             * one write to the socket. The close_notify tells the client
             * the reply is whole, not cut. */
            gnutls_session_t session = g->tls_session;
            ssize_t sent;
            do
                sent = fits ? gnutls_record_send(session, reply, (size_t)len) : 0;
            while (sent == GNUTLS_E_INTERRUPTED);
            gnutls_bye(session, GNUTLS_SHUT_WR);
        } else if (fits) {
            syscall(SYS_sendto, fd, reply, (size_t)len, MSG_NOSIGNAL, NULL, 0);
        }
        shutdown(fd, SHUT_WR);
        log_debug("http: refused a request before the library read it: %d %s (%s), request %s", g->status, g->code,
                  g->message, request_id);
    }
    return 0;
}

/* What a read of n bytes (n > 0) of a guarded connection gives the library:
 * n, the bytes before a refused request, or the refusal's 0. */
static ssize_t guard_read(struct http_guard *g, int fd, const void *buf, size_t n)
{
    size_t pass = http_guard_scan(g, buf, n);
    if (!g->refused)
        return (ssize_t)n;
    if (!pass)
        return answer_refusal(g, fd);
    /* Requests before the refused one go on; the library reads again once
     * it has answered them, and then gets the refusal. Nothing of what
     * follows is left in the socket to wake it for that read: the end of
     * the reading side does (and the client sends nothing more it needs). */
    shutdown(fd, SHUT_RD);
    return (ssize_t)pass;
}

/* libmicrohttpd's reads, and every other recv() in the process: the
 * system's, then the guard's check for the plain sockets it guards (a TLS
 * connection's socket carries ciphertext, which GnuTLS reads here: its
 * plaintext is checked in gnutls_record_recv below). */
ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    struct http_guard *g = guard_of(fd);
    if (g && g->tls_session)
        g = NULL;
    if (g && g->refused)
        return answer_refusal(g, fd);
    ssize_t n = syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL);
    if (!g || n <= 0 || (flags & MSG_PEEK))
        return n;
    return guard_read(g, fd, buf, (size_t)n);
}

/* GnuTLS's own gnutls_record_recv, found once past this program's. */
typedef ssize_t (*record_recv_fn)(gnutls_session_t, void *, size_t);
static record_recv_fn gnutls_record_recv_real;
static pthread_once_t gnutls_once = PTHREAD_ONCE_INIT;

static void gnutls_resolve(void)
{
    /* dlsym returns a data pointer; POSIX makes it one to a function. */
    void *sym = dlsym(RTLD_NEXT, "gnutls_record_recv");
    memcpy(&gnutls_record_recv_real, &sym, sizeof gnutls_record_recv_real);
}

int http_guard_tls_interposed(void)
{
    /* The program's definition is the one the libraries bind to when the
     * dynamic linker finds it first, as it does recv(). */
    void *bound = dlsym(RTLD_DEFAULT, "gnutls_record_recv");
    record_recv_fn ours = gnutls_record_recv;
    void *ours_sym;
    memcpy(&ours_sym, &ours, sizeof ours_sym);
    return bound == ours_sym;
}

/* libmicrohttpd's reads on its TLS connections (libmicrohttpd is built on
 * GnuTLS, and reads each record's plaintext with this call), and every
 * other gnutls_record_recv() in the process: GnuTLS's, then the guard's
 * check of the plaintext for the sessions it guards. The session names its
 * socket (libmicrohttpd gives GnuTLS the socket's number); a session of
 * anyone else whose transport happens to have that number is not the one
 * beside it in the table, and passes unread. */
ssize_t gnutls_record_recv(gnutls_session_t session, void *data, size_t data_size)
{
    pthread_once(&gnutls_once, gnutls_resolve);
    if (!gnutls_record_recv_real)
        return GNUTLS_E_INTERNAL_ERROR;
    int fd = gnutls_transport_get_int(session);
    struct http_guard *g = NULL;
    if (guard_of(fd) && atomic_load_explicit(&sessions[fd], memory_order_acquire) == (void *)session)
        g = guard_of(fd);
    if (g && g->refused)
        return answer_refusal(g, fd);
    ssize_t n = gnutls_record_recv_real(session, data, data_size);
    /* A client asking to renegotiate (TLS 1.2) is told no, as RFC 5246 has
     * it, so it fails at once rather than making the server do a handshake
     * per request; libmicrohttpd then closes the connection. */
    if (g && n == GNUTLS_E_REHANDSHAKE)
        (void)gnutls_alert_send(session, GNUTLS_AL_WARNING, GNUTLS_A_NO_RENEGOTIATION);
    if (!g || n <= 0)
        return n;
    return guard_read(g, fd, data, (size_t)n);
}
