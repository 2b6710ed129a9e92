/* http_conns.h: the HTTP server's table of open connections (used by
 * src/common's server and by gpurent-gateway's listener): which are still sending a request's headers or body, the
 * deadline each must meet, the accept policy that bounds them per client
 * address, and the thread that closes connections past their deadline.
 * libmicrohttpd's own idle timeout restarts with every byte, so a client
 * sending a header line every few seconds would hold a connection for
 * ever; these deadlines count from the start of the request instead. */
#ifndef GPURENT_HTTP_CONNS_H
#define GPURENT_HTTP_CONNS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

enum http_conn_phase {
    HTTP_CONN_HEADERS, /* waiting for (the rest of) a request's headers, idle keep-alive included */
    HTTP_CONN_BODY,    /* headers read, the body is arriving */
    HTTP_CONN_BUSY,    /* the request is handled or its reply sent: no deadline */
};

struct http_conns_limits {
    int64_t header_timeout_ms;   /* a request's headers must arrive within this of its start; 0 = none */
    int64_t body_timeout_ms;     /* and its body within this of the headers' end; 0 = none */
    int max_connections;         /* the server's limit on open connections */
    int max_headers_per_client;  /* connections one address may have in HTTP_CONN_HEADERS; 0 = no limit */
};

struct http_conns;
struct http_conn;

/* A table and its reaper thread; NULL on failure. */
struct http_conns *http_conns_new(const struct http_conns_limits *limits);
/* Stops the reaper and frees the table (after the server has stopped). */
void http_conns_free(struct http_conns *c);
/* The accept policy: 1 to take a new connection from addr. An address
 * with max_headers_per_client connections still sending headers gets in,
 * and its longest-waiting one of them is closed. Past 90 % of
 * max_connections, only an address with fewer than 2 connections still
 * sending headers gets in, so clients that trickle headers from many
 * connections cannot fill the last slots. */
int http_conns_accept(struct http_conns *c, const struct sockaddr *addr);
/* A connection was accepted (fd, its peer): tracked from now on, in
 * HTTP_CONN_HEADERS. NULL when out of memory (then untracked). */
struct http_conn *http_conns_opened(struct http_conns *c, int fd, const struct sockaddr *addr);
/* It closed: untracked and freed. NULL is a no-op. */
void http_conns_closed(struct http_conns *c, struct http_conn *conn);
/* It moved to phase (its deadline restarts accordingly). NULL is a no-op. */
void http_conns_set_phase(struct http_conns *c, struct http_conn *conn, enum http_conn_phase phase);
/* Connections closed for missing a deadline so far. */
int64_t http_conns_timed_out(struct http_conns *c);

#endif
