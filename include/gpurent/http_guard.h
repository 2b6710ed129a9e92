/* http_guard.h: a check of the bytes each client sends, in front of
 * libmicrohttpd, used by the HTTP layer (http.c). The library answers a few
 * malformed requests itself, with a bare or HTML page instead of the API's
 * JSON error (a bad chunk size, headers beyond its connection memory), and
 * cuts a header or request line at a raw NUL byte before anyone sees the
 * rest. The guard follows each connection's requests as they arrive (the
 * head, then the body by its Content-Length or its chunks) and refuses such
 * a request with the API's error before the library reads any of it.
 *
 * It sits where the library reads: this module defines recv(), which the
 * library calls for every plain connection, and gnutls_record_recv(), which
 * it calls for every TLS connection (libmicrohttpd is built on GnuTLS) and
 * which hands over the plaintext. For a connection the HTTP server
 * registered (http_guard_open, http_guard_open_tls) the bytes are checked;
 * for any other socket or TLS session both are the libraries' own. */
#ifndef GPURENT_HTTP_GUARD_H
#define GPURENT_HTTP_GUARD_H

#include <stddef.h>
#include <stdint.h>

/* A request head may be this long (request line and headers); the HTTP
 * layer's own cap on headers (16 KiB, answered by its handler) is below it,
 * libmicrohttpd's connection memory well above it. */
#define HTTP_GUARD_HEAD_MAX 32768
/* And hold at most this many header fields (Apache's LimitRequestFields;
 * browsers send some 20). libmicrohttpd keeps each field's record in the
 * connection's memory beside the head itself, so without a cap a head of
 * many short fields ran that memory out and got its bare 431 page, and the
 * memory had to be large, and was cleared after every request. */
#define HTTP_GUARD_FIELDS_MAX 100
/* And a query of at most this many parameters, for the same reason: each
 * is a record in that memory too (no endpoint takes more than a few). */
#define HTTP_GUARD_PARAMS_MAX 100
/* Empty lines a client may send before a request line. */
#define HTTP_GUARD_BLANK_LINES_MAX 16
/* libmicrohttpd's memory per connection (MHD_OPTION_CONNECTION_MEMORY_LIMIT)
 * for a server behind the guard: the largest head it lets through, the
 * records of its fields and parameters and the reply's header block. Less,
 * and the library answers a head the guard passes with its own page; more
 * is wasted, as it clears that memory after every request. */
#define HTTP_GUARD_CONNECTION_MEMORY ((size_t)HTTP_GUARD_HEAD_MAX + 16384)

/* One connection's place in its stream of requests. */
struct http_guard {
    int state;               /* enum in http_guard.c */
    char *head;              /* the current request's head so far */
    size_t head_len, head_cap;
    size_t line_start;       /* where head's current line begins */
    size_t head_lines;       /* its lines so far: the request line and header fields */
    uint64_t remaining;      /* bytes left of a body or a chunk */
    char line[128];          /* a chunk-size or trailer line so far */
    size_t line_len, trailer_bytes, trailer_fields;
    size_t blank_bytes;      /* CRs and LFs before the current request line */
    void *tls_session;       /* the connection's gnutls_session_t; NULL for plain HTTP */
    /* Set when a request is refused: the answer to send instead. */
    int refused, status;
    const char *code;
    char message[160];
};

/* Reads n more bytes of the connection and returns how many of them may
 * go to the HTTP library: n, or, when a request among them is refused
 * (g->refused set), the bytes before that request began (0 when it began
 * in an earlier read). Pure: no I/O. */
size_t http_guard_scan(struct http_guard *g, const char *p, size_t n);
/* Frees what the guard holds (not g itself). */
void http_guard_release(struct http_guard *g);

/* The HTTP server's sockets: guarded from open until close. A TLS
 * connection is opened with its GnuTLS session (libmicrohttpd's
 * MHD_CONNECTION_INFO_GNUTLS_SESSION), whose plaintext is checked instead
 * of the socket's bytes. */
void http_guard_open(int fd);
void http_guard_open_tls(int fd, void *tls_session);
/* The server switched the connection on socket fd to another protocol (a
 * WebSocket): its bytes are checked no further. */
void http_guard_upgraded(int fd);
void http_guard_close(int fd);
/* Whether the libraries read TLS records through this module (1), so that
 * the guard sees a TLS connection's plaintext; 0 where the dynamic linker
 * binds them to GnuTLS directly, and only the HTTP layer's own checks
 * apply over TLS. */
int http_guard_tls_interposed(void);
/* Requests refused so far (for /metrics). */
int64_t http_guard_refusals(void);

#endif
