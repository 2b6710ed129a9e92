/* agent_client.h: signed HTTP calls from gpurentd to node agents, as libcurl
 * easy handles that the caller runs on its own multi handle (the heartbeat
 * and reconciler loops), never from an HTTP handler thread. Every call has
 * connect and total timeouts and a cap on the response size, so a slow,
 * broken or hostile agent costs at most a failed call. */
#ifndef GPURENT_AGENT_CLIENT_H
#define GPURENT_AGENT_CLIENT_H

#include <curl/curl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define AGENT_CALL_ETAG_MAX 65 /* an ETag the daemon keeps and sends back, NUL included */

struct agent_client_opts {
    long connect_timeout_ms;   /* TCP (and TLS) connect */
    long total_timeout_ms;     /* whole call */
    size_t max_response_bytes; /* larger replies fail the call */
    const char *ca_file;       /* CA bundle for https agents, or NULL for the system's */
    /* How long a workload's PUT asks its agent to hold the answer until the
     * workload runs, and its DELETE until it is gone (Gpurent-Wait-Ms,
     * AGENT_PROTOCOL.md; agent_put_wait_ms). A start or removal as quick as
     * that is seen done in the pass that asked, with no re-poll; a pull of
     * minutes answers "pulling" after it, a container slow to stop
     * "removing", and is polled as before. 0: the header is not sent. */
    long wait_ms;
};

struct agent_call {
    CURL *easy;                       /* the libcurl handle; its PRIVATE points back here */
    struct curl_slist *headers;       /* signed headers, freed with the call */
    char *request_body;               /* copy of the body sent, or NULL */
    char *response;                   /* NUL-terminated reply body (may be NULL) */
    size_t response_len;              /* bytes in response */
    size_t response_cap;              /* allocated */
    size_t max_response_bytes;        /* from the options */
    int too_large;                    /* the reply went over max_response_bytes */
    long status;                      /* HTTP status, 0 if none */
    char error[CURL_ERROR_SIZE + 64]; /* why the call failed, "" if it did not */
    char etag[AGENT_CALL_ETAG_MAX];        /* the reply's ETag as sent, "" when none or not a plain printable one */
    int retry_after;                       /* the reply had a Retry-After: what it refused may work shortly */
    json_t *doc;                      /* the reply parsed by agent_call_json, or NULL */
    int doc_read;                     /* agent_call_json has parsed (or failed to parse) it */
};

/* The options every call of the daemon uses, from its configuration
 * (agent_connect_timeout_ms, agent_timeout_ms, agent_max_response_bytes,
 * agent_ca_file). */
struct agent_client_opts agent_client_opts_from_config(void);
/* Builds a signed call of method to base_url + path with an optional JSON
 * body. NULL on failure (logged). */
struct agent_call *agent_call_new(const char *base_url, const char *secret, const char *method, const char *path,
                                  const char *body, const struct agent_client_opts *opts);
/* Asks, before c runs, for 304 instead of the reply when its ETag is still
 * etag (If-None-Match), which must be one a reply carried (agent_call.etag).
 * 0, or -1 without memory (c is unchanged). */
int agent_call_if_none_match(struct agent_call *c, const char *etag);
/* After the transfer ends with result: fills status and error. Returns 0 if
 * an HTTP reply within the size cap arrived (any status), -1 otherwise. */
int agent_call_finish(struct agent_call *c, CURLcode result);
/* Calls made one at a time as agent_calls_stream needs them: make(ctx, i)
 * builds call i of the stream (NULL if it cannot); done(ctx, i, c, finished)
 * then owns it: finished 1 when it ended (agent_call_finish has filled it;
 * c is NULL if make failed), 0 when the stream stopped with it in flight. */
struct agent_call_stream {
    struct agent_call *(*make)(void *ctx, size_t i);
    void (*done)(void *ctx, size_t i, struct agent_call *c, int finished);
    void *ctx;
};
struct agent_multi; /* below */
/* Runs calls 0 .. n-1 of the stream on one multi handle (pool, or a new
 * one whose connections close at the end when pool is NULL), at most
 * max_parallel of them existing at once, each made when a slot frees up and
 * handed to done the moment it ends, so memory stays bounded however many
 * calls there are. Stops early, and returns -1, when stop() says so. */
int agent_calls_stream(struct agent_multi *pool, size_t n, long max_parallel, int (*stop)(void),
                       const struct agent_call_stream *st);
/* The same over calls the caller already made (NULL entries skipped); each
 * stays the caller's. Calls a stop left unfinished have status 0 and an
 * error. */
int agent_calls_run(struct agent_multi *pool, struct agent_call **calls, size_t n, long max_parallel,
                    int (*stop)(void));
/* A multi handle a thread keeps: the logs proxy's, whose calls come and go
 * (agent_multi_add … agent_multi_next_done), woken from other threads; and
 * the reconciler's pool, whose connections to agents outlive each run of
 * agent_calls_stream, so that a create's PUT and its polls, and the next
 * creates best-fit placement sends to the same node, do not each pay a TCP
 * (and TLS) handshake on both ends. At most max_parallel connections stay
 * open, the oldest closed first; an agent closes one idle past its
 * connection_timeout_s, and libcurl notices that before reusing it. Used by
 * one thread at a time. */
struct agent_multi *agent_multi_new(void);
/* Connections agent_calls_stream's calls on m opened so far (the others
 * reused one); 0 for NULL. */
int64_t agent_multi_connects(const struct agent_multi *m);
/* Starts c on m: 0, or -1 (c stays the caller's). */
int agent_multi_add(struct agent_multi *m, struct agent_call *c);
/* Takes c off m, finished or not. */
void agent_multi_remove(struct agent_multi *m, struct agent_call *c);
/* Waits up to wait_ms (less when a transfer's timer is due sooner) for a
 * socket to be ready or for agent_multi_wakeup, then moves on only the
 * transfers whose socket is ready or whose timer is due. */
void agent_multi_run(struct agent_multi *m, int wait_ms);
/* A call that has ended since the last run (agent_call_finish done: *ok is
 * its result, 0 or -1), still on m; NULL when there is none. */
struct agent_call *agent_multi_next_done(struct agent_multi *m, int *ok);
/* Cuts a wait in agent_multi_run short; any thread. */
void agent_multi_wakeup(struct agent_multi *m);
/* Frees m; its calls must have been removed. NULL is a no-op. */
void agent_multi_free(struct agent_multi *m);
/* Frees the call and its handle; the caller removes it from any multi
 * handle first. NULL is a no-op. */
void agent_call_free(struct agent_call *c);
/* The reply parsed as JSON (NULL if it is none), parsed on the first call
 * and kept with the call, which owns it. */
json_t *agent_call_json(struct agent_call *c);

#endif
