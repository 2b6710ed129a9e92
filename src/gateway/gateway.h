/* gateway.h: gpurent-gateway (issue 17), the marketplace's data path, apart
 * from the control plane so it scales on its own and several may run.
 *
 *   main.c   options, the HTTP listener (libmicrohttpd's thread pool;
 *            connections that wait are suspended, see proxy.c), start
 *            and stop
 *   state.c  the last copy of what gpurentd said (apps, ready replicas,
 *            key hashes, funds, other gateways' holds) and the counters
 *            kept against it: in flight per replica and app, queued,
 *            rate-limit windows, the funds each consumer's calls in flight
 *            hold; the sync thread that refreshes the copy and the report
 *            thread that sends demand, holds and usage records (signed,
 *            sign.h)
 *   journal.c the usage journal in --state-dir: each record on disk
 *            before its call completes, removed once gpurentd answered
 *            for its id, re-read and resent at start; the progress of
 *            calls being answered, recorded at start for any the last
 *            gateway did not finish
 *   metrics.c the Prometheus metrics, on --metrics-listen (off by
 *            default): calls by status, their durations, calls in flight,
 *            paused upstreams, the copy's age, usage records pending
 *   usage.c  a call's usage read from the answer its replica sent, the
 *            events of a stream that the hold counts, and the stream
 *            filter that makes the usage event the client did not ask
 *            for a comment (proxy.c feeds them what it delivers)
 *   proxy.c  one call: key, app, limits and funds checked at its
 *            headers (before its body is read; its hold then grows as
 *            its answer comes, and it is cut where the funds end), a
 *            replica chosen (or
 *            waited for), the upstream called on the one upstream thread
 *            (libcurl's multi interface, with idle and total time limits)
 *            and its answer streamed through (one not a stream withheld
 *            until whole when the funds do not hold it a token a byte),
 *            usage taken from what the upstream reported in what was
 *            delivered, bounded by the bytes that passed and the request's
 *            max_tokens, and stamped with the prices it was admitted at */
#ifndef GPURENT_GATEWAY_H
#define GPURENT_GATEWAY_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "gpurent/ids.h"

struct gateway_opts {
    char listen_host[128];
    int listen_port;
    char control_url[512];     /* gpurentd's base URL */
    char secret[129];          /* from --secret-file */
    char gateway_id[65];       /* names this gateway in reports */
    int64_t sync_ms;           /* between state refreshes */
    int64_t report_ms;         /* between reports */
    int64_t cold_start_s;      /* longest a call waits for a replica */
    int64_t upstream_idle_s;   /* longest an upstream may send nothing */
    int64_t max_call_s;        /* longest a call's upstream may last */
    int64_t max_pending;       /* usage records held in memory while gpurentd is away */
    char state_dir[1024];      /* the usage journal's directory */
    char metrics_host[128];    /* --metrics-listen; metrics_port 0: no metrics listener */
    int metrics_port;
    int64_t header_timeout_s;  /* a request's headers must arrive within this of its start */
    int64_t body_timeout_s;    /* and its body within this of the headers */
    int64_t max_conns_per_client; /* connections one address may have still sending headers */
};
extern struct gateway_opts gw_opts;

/* Connections the gateway serves at once (libmicrohttpd's limit); each
 * holds at most one call, so counts per call fit tables of this size. */
#define GW_MAX_CONNECTIONS 4096

/* What a call learned of its app and consumer from the copy. */
struct gw_call_app {
    char app_id[ID_MAX];
    char user_id[ID_MAX];
    char key_id[ID_MAX];
    /* The app's prices when the call was admitted (micro-yuan), stamped on
     * its usage record. */
    int64_t price_request, price_input_1k, price_output_1k, price_second;
    /* Micro-yuan of the consumer's funds held for this call while it is in
     * flight (state.c, gw_hold); only changed under state.c's lock. */
    int64_t held;
    /* The input tokens that hold covers: the body's bytes (a token is at
     * least a byte: the most a record may claim) while the funds allow,
     * else gw_input_estimate of them. Set at admission; proxy.c lowers
     * it, under the call's lock once its upstream runs. */
    int64_t input_held;
    int consumer; /* its consumer's slot in state.c's table while in flight */
};

/* state.c */
int gw_state_start(void);
void gw_state_stop(void);
/* Good syncs since the start, and how old the copy is (-1: none yet). */
void gw_copy_info(int64_t *good_syncs, int64_t *age_ms);
/* Usage records not yet answered for by gpurentd (in memory). */
void gw_usage_pending(int64_t *records);
/* Checks the bearer token, the app's visibility, rate limits and funds for
 * slug: 0 with out filled, or an HTTP status (401, 404, 429 with
 * *retry_after, 402, 503 before any copy) and a message. The copy's funds
 * are drawn only when records settle, so an admitted call holds part of
 * them (out->held) until it ends: at first its per-call price, the input
 * its body_len announces (-1: unknown; a token a byte, or
 * gw_input_estimate when the funds do not hold that: out->input_held)
 * and a first grain of answer
 * (GW_HOLD_GRAIN_*); then proxy.c grows it (gw_hold) to what the answer may
 * cost as it comes (held_output); a call is refused 402 when the consumer's
 * funds, less what their other calls hold and what finished calls cost that
 * the copy cannot show yet, do not cover that. */
int gw_admit(const char *token, const char *slug, int64_t body_len, struct gw_call_app *out, int64_t *retry_after,
             char *msg, size_t msglen);
/* The answer a call's first hold covers beyond its price and input:
 * output tokens and upstream time. */
#define GW_HOLD_GRAIN_TOKENS 64
#define GW_HOLD_GRAIN_MS 1000
/* A prompt's tokens are known only from the usage its replica reports
 * after, and a token a byte of the request body is the bound a record
 * may claim but some 4 times what English text tokenizes to. So when the
 * funds do not hold the body a token a byte, it is held at a token per
 * GW_INPUT_BYTES_PER_TOKEN bytes (rounded up; gw_input_estimate), and the
 * call's record is still capped to what was held (proxy.c, within_hold):
 * the consumer never pays more than their funds held, and a prompt that
 * tokenizes denser than the estimate (CJK text, code) costs its seller
 * the difference only for consumers whose funds could not cover it. */
#define GW_INPUT_BYTES_PER_TOKEN 4
int64_t gw_input_estimate(int64_t body_bytes);
/* The most gpurentd charges a call answered under 400 with these counts
 * at the prices it was admitted with (apps.c, app_call_price). */
int64_t gw_call_cost(const struct gw_call_app *a, int64_t input_tokens, int64_t output_tokens, int64_t duration_ms);
/* Makes the call's hold at least need, taking from the consumer's free
 * funds (and, when they allow, a step more, so that a stream does not
 * come back for each chunk); when they do not cover need the hold stays
 * as it was. Returns the hold: under need, the call must go no further
 * than the hold covers. Any thread; one lock. */
int64_t gw_hold(struct gw_call_app *a, int64_t need);
/* The consumer's admitted call has ended without a record: it leaves
 * their calls in flight and its hold is given back. */
void gw_consumer_release(struct gw_call_app *a);
/* Picks the ready replica of app with the fewest calls outstanding, none
 * of the n_avoid in avoid, and one that failed a call unanswered in the
 * last GW_REFUSED_MS only if no other is left, and counts one more on it: its
 * URL into url, 0; -1 when none is ready. */
int gw_replica_take(const char *app_id, const char (*avoid)[ID_MAX], size_t n_avoid, char *url, size_t urllen,
                    char *instance_id);
void gw_replica_release(const char *instance_id);
/* The replica failed a call unanswered: others are preferred for a while. */
#define GW_REFUSED_MS 5000
void gw_replica_refused(const char *instance_id);
/* The app's demand counters. */
void gw_app_count(const char *app_id, int in_flight_delta, int queued_delta);
/* Journals a usage record (taken) and queues it for the next report; on
 * return it is on disk (journal.c), unless the journal failed (logged).
 * With release, the call it records leaves that consumer's calls in
 * flight and gives back its hold under the same lock as its cost joins
 * what admission takes off their funds (as gw_consumer_release, but never
 * one without the other). */
void gw_usage_add(json_t *record, struct gw_call_app *release);

/* journal.c */
/* Opens (creating) DIR/usage.journal, locked against a second gateway,
 * and appends its records gpurentd has not answered for to recovered; the
 * file is compacted to them. 0, or -1 after a message on stderr. */
int gw_journal_open(const char *dir, json_t *recovered);
/* Appends record and returns once it is on disk (a group fdatasync): 0,
 * or -1 after a log line (the record then lives in memory only). */
int gw_journal_append(const json_t *record);
/* Appends what a call still being answered has delivered so far (a usage
 * record with completed 0): if the gateway ends before the call's record,
 * the next start records this for it. Not waited on to disk (journal.c). */
int gw_journal_progress(const json_t *record);
/* Notes that gpurentd answered for ids (an array of strings), so they are
 * not resent; compacts the file when most of it is answered. */
void gw_journal_answered(const json_t *ids);
/* Closes the journal and releases its lock, so that it can be opened again
 * (the fuzz target, tests/fuzz/fuzz_journal.c, starts twice in a
 * process). The gateway never calls it: it holds the journal until it
 * exits, so that a record that comes after its stop still reaches the disk. */
void gw_journal_close(void);

/* usage.c */
#define GW_KEEP_MAX (4u << 20)    /* a non-streamed answer kept to read its usage */
#define GW_TAIL_KEEP (64u << 10)  /* of one over GW_KEEP_MAX, the end kept to find its usage in */
#define GW_EVENT_MAX (256u << 10) /* one server-sent event, or a line gw_usage_hide holds */
#define GW_USAGE_TOKENS_MAX 100000000 /* a count over this is not taken */
/* What a call's answer has reported of its usage so far: the replica's
 * word, read from the bytes delivered (gw_usage_scan) and never an
 * estimate; and the events of a stream delivered, which the hold counts.
 * Zeroed to start; the caller serialises calls on one. */
struct gw_usage {
    int streamed;    /* the answer is server-sent events (else one JSON body) */
    int usage_asked; /* the gateway asked for the stream's usage, not the client */
    char *line;      /* gw_usage_hide: a line of the stream not yet whole; owned */
    size_t line_len;
    int line_passing; /* a line too long to be usage is going on as it comes */
    int hide_after_cr; /* the last line gone on ended at a '\r': a '\n' next is its line end's */
    char *event;      /* a server-sent event being read; owned */
    size_t event_len;
    char *keep; /* a whole answer being read, or (keep_tail) the end of one; owned */
    size_t keep_len;
    int keep_tail; /* the answer outgrew GW_KEEP_MAX: keep holds its last GW_TAIL_KEEP bytes */
    int64_t input_tokens, output_tokens; /* as the upstream reported them, 0 to GW_USAGE_TOKENS_MAX */
    int64_t scanned_bytes;               /* of a stream, the bytes gw_usage_scan has read */
    int64_t scanned_events;              /* of a stream, the events gw_usage_scan has read */
    int scan_sse_state;                  /* gw_sse_event_end's state over the bytes gw_usage_scan read */
    /* Of a stream whose usage the gateway asked for: the ':' of the lines
     * read that start ":data:" (those gw_usage_hide added, not the
     * replica's bytes), and how much of ":data:" the line being read
     * matches so far (-1: it does not start so). */
    int64_t comment_colons;
    int comment_match;
    /* Output tokens are at most those the stream last reported and a token
     * a byte of the replica's after that: the hold's bound is the bytes
     * received plus this (never above 0; 0 before any report), written as
     * each report is read and read by another thread (proxy.c's upstream
     * thread). */
    atomic_llong slack;
    /* The hold's estimate of a stream's output tokens (proxy.c,
     * held_output): those it last reported and a token an event after
     * that, so the events received plus this (reported less the events
     * through the report; 0 before any report). Written and read as slack. */
    atomic_llong base;
};
/* Whether byte b ends a server-sent event, given *state, what the bytes
 * before it ended with (it starts at 0, and b is added to it). By the
 * grammar of the standard (WHATWG HTML, server-sent events): a line ends
 * at "\r\n", '\n' or a lone '\r', and two line ends in a row (a blank
 * line) end an event. A line end is counted at its first byte, so a
 * "\r\n" ends its line at its '\r' (its '\n' ends nothing, in the same
 * piece or the next) and an event ending "\r\n\r\n" ends at its second
 * '\r'; after an event, the line ends are counted again from none.
 * proxy.c's upstream thread counts the events that came and gw_usage_scan
 * those delivered with this one rule, so that the two counts name the
 * same events. */
int gw_sse_event_end(int *state, char b);
/* Whether the bytes read into state by gw_sse_event_end end with a whole
 * event (nothing after its blank line but line ends), so that another
 * event may follow. */
int gw_sse_event_boundary(int state);
/* Reads the n bytes at p, just delivered (or read for a client that
 * left): each whole event's usage of a stream, and its events, or the
 * body kept for gw_usage_finish. */
void gw_usage_scan(struct gw_usage *u, const char *p, size_t n);
/* After the whole answer was delivered: a JSON body's usage (of its last
 * GW_TAIL_KEEP bytes for one over GW_KEEP_MAX). -1 when such a big
 * answer had none there (no tokens are charged), else 0. */
int gw_usage_finish(struct gw_usage *u);
/* Where gw_usage_hide's output goes: 0, or -1 to stop (out of memory). */
typedef int (*gw_usage_emit)(void *ctx, const char *p, size_t n);
/* The n stream bytes at p go to emit a line at a time (a line ends at a
 * '\r' or a '\n', a "\r\n" at its '\r', as gw_sse_event_end reads
 * them, and its '\n' follows, in this piece or the next), a `data:` line
 * of usage with an empty `choices` (the event the gateway asked for, not
 * the client) made a comment by a ':' before it; a line longer than
 * GW_EVENT_MAX goes on as it comes. -1 when emit or memory failed. */
int gw_usage_hide(struct gw_usage *u, const char *p, size_t n, gw_usage_emit emit, void *ctx);
/* A last line gw_usage_hide holds without its newline goes to emit, at
 * the answer's end: 0, or -1 when emit failed (the line is still held). */
int gw_usage_flush_line(struct gw_usage *u, gw_usage_emit emit, void *ctx);
/* Frees what u holds (not u); its counts stay. */
void gw_usage_free(struct gw_usage *u);

/* proxy.c */
enum MHD_Result gw_handle(struct MHD_Connection *c, const char *url, const char *method, const char *upload,
                          size_t *upload_size, void **con_cls);
void gw_completed(void **con_cls, enum MHD_RequestTerminationCode toe);
/* Before the HTTP server stops: calls waiting for a replica, and new ones,
 * are answered 503; calls in progress get a few seconds to finish, and
 * then end, so that none is left suspended (libmicrohttpd cannot stop
 * with one). */
void gw_proxy_stop(void);
/* After it: waits up to timeout_ms for the upstream calls still going
 * (their clients are gone, so each is being stopped), then ends the
 * upstream thread. */
void gw_proxy_drain(int64_t timeout_ms);
/* Calls to /apps/... in progress (from their first byte to their
 * completion) and upstream transfers paused for slow clients, now. */
void gw_proxy_counts(int64_t *calls, int64_t *paused);

/* main.c: a listen address as a socket address (numeric or a name): 0,
 * or -1. */
int gw_resolve_listen(const char *host, int port, struct sockaddr_storage *sa, socklen_t *len);

/* metrics.c */
/* Counts a call to /apps/... at its completion: the status it was answered
 * with (0: none began) and how long it took. */
void gw_metrics_call(int status, int64_t duration_ms);
/* Starts the metrics listener when --metrics-listen was given: 0, or -1. */
int gw_metrics_start(void);
void gw_metrics_stop(void);

#endif
