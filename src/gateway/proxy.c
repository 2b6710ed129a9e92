/* proxy.c: one call through the gateway (see gateway.h). A thread of the
 * HTTP pool checks the key, the app, the limits and the funds against the
 * copy as soon as the request's headers are in, before any of its body is
 * read (only an admitted call's body is buffered, so a connection without
 * a valid key holds no more than its headers), and once the body is in
 * takes the replica with the fewest calls outstanding; the
 * upstream thread, which drives every call's upstream through one libcurl
 * multi handle, then calls the replica while the answer is streamed back
 * as it comes. No thread waits for a client, a replica or an upstream:
 * while none is ready (up to --cold-start-timeout-s or the client's
 * X-Gpurent-Wait-Seconds), while the upstream has not answered, and while
 * the answer has nothing new, the connection is suspended
 * (libmicrohttpd's suspend and resume), and the waiter thread, or the
 * upstream thread when something arrives, resumes it; while a slow client
 * has a full buffer, its upstream transfer is paused. So no connection
 * and no call costs a thread of its own. The copy lists only replicas
 * whose agent reports their health check passing, so the gateway probes
 * nothing itself; a replica that fails a call before answering a byte
 * (its server died in the seconds before its agent noticed) is passed over
 * and the call sent to another, up to GW_CONNECT_TRIES replicas. Usage is
 * what the upstream reported in what was handed to the client: the last
 * `usage` of the server-sent events delivered, or of a whole JSON body;
 * never an estimate (the funds a call holds while it is in flight are
 * one: input_held, held_output, settle_withheld). A client that leaves an answer under way is charged
 * for what the upstream reports in what it sent for the call: the answer
 * is read on, without a client, for up to GW_DRAIN_MS (drain_out), because
 * OpenAI-style servers report a stream's usage only in its last event, and
 * a client that hung up just before it would otherwise get every token
 * free; an answer not over by then is cut.
 *
 * When the usage record is written (and fdatasynced, journal.c): for an
 * answer streamed from the replica, in answer_read once the upstream has
 * ended and before it returns the end of the stream, that is before
 * libmicrohttpd sends the last chunk (the chunked terminator), without
 * which no client takes the answer for complete; for the gateway's own
 * error answers after admission, before the answer is queued. So a client
 * that saw a call complete has its record on disk whatever happens to the
 * gateway next, and a restart resends it. While an answer goes out, its
 * progress (what it has delivered: status, tokens, time) is journaled as
 * its first bytes go, unless the whole answer is already in hand, and then
 * every GW_PROGRESS_MS at most (journal.c): a gateway that ends
 * mid-answer, or just after its client left mid-answer, has the call
 * recorded at its next start for what it delivered up to its last
 * progress line, so at most GW_PROGRESS_MS of an answer goes uncharged,
 * in the consumer's favour. */
#include "gateway.h"
#include "gpurent/clock.h"
#include "gpurent/json_body.h"
#include "gpurent/log.h"
#include "gpurent/utf8.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define GW_BODY_MAX (8u << 20)    /* a request's body */
#define GW_BUFFER_MAX (1u << 20)  /* answer bytes waiting for a slow client */
#define GW_CONNECT_TRIES 3        /* replicas tried when they fail a call unanswered */
#define GW_PROGRESS_MS 1000       /* between progress lines of an answer going out */
#define GW_STOP_MS 5000           /* at a stop, the longest calls in progress get to end */
#define GW_DRAIN_MS 2000          /* an answer read on, for its usage, after its client left */

/* Where a call is: libmicrohttpd calls the handler again after each
 * resume, and the phase says what it was waiting for. */
/* Where a call's upstream is: not in the multi handle yet (or between two
 * replicas' tries), in it, or ended for good. */
enum up_state { UP_NEW, UP_RUNNING, UP_ENDED };

enum phase {
    P_REQUEST,      /* the request is arriving */
    P_WAIT_REPLICA, /* suspended until a replica is ready or its deadline */
    P_START,        /* a replica was found while it waited */
    P_NO_REPLICA,   /* none was, by the deadline */
    P_STOPPED,      /* the gateway stopped while it waited */
    P_WAIT_HEADERS, /* suspended until the upstream's answer begins (or fails) */
};

struct call {
    char *body;
    size_t body_len;
    size_t client_len; /* the body's bytes as the client sent them (ask_stream_usage may rewrite it) */
    int too_large;
    struct gw_call_app app;
    char instance_id[ID_MAX];
    char url[1200];
    char path_query[1200]; /* the part of url after the replica's base URL */
    char tried[GW_CONNECT_TRIES][ID_MAX]; /* replicas that failed this call unanswered */
    size_t n_tried;
    char content_type[128];
    char if_none_match[256]; /* the consumer's validators, passed on ("" none) */
    char method[16];   /* the consumer's, passed on */
    int admitted;      /* key, app, limits and funds passed, at the headers */
    int counted;       /* in the app's in_flight */
    int recorded;      /* its usage record is journaled and queued */
    int released;      /* no longer among the consumer's calls in flight */
    char record_id[100]; /* its usage record's id, made on first use; "" before */
    int64_t progress_ms; /* when its last progress line was written; 0: none yet */
    int has_replica;   /* holds a replica's outstanding count */
    int cold_start;    /* waited for a replica */
    int64_t start_ms, upstream_ms;
    struct MHD_Connection *conn;
    int phase;              /* enum phase: where the call is between the handler's calls */
    int64_t wait_s;         /* how long it may wait for a replica */
    int64_t wait_until_ms;  /* P_WAIT_REPLICA: the deadline */
    struct call *next_waiting, *next_live, *prev_live;
    /* The upstream thread's alone. */
    int up_state; /* enum up_state */
    CURL *curl;
    struct curl_slist *up_headers;
    /* Under up_lock. */
    int up_queued;
    struct call *next_up;
    /* Shared with the upstream thread. */
    pthread_mutex_t lock;
    int refs;      /* the connection's, the upstream's until it ends, and up_queue's */
    int suspended; /* the connection is suspended until wake() */
    int has_upstream; /* the upstream was handed to the upstream thread */
    int up_paused;    /* the upstream waits for the client to take what is buffered */
    char *out; /* answer bytes not yet handed to the client */
    size_t out_len;
    int headers_done, finished, client_gone;
    int body_complete; /* every byte its Content-Length announced has come */
    curl_off_t body_received; /* answer bytes from the upstream so far */
    int64_t up_end_ms;        /* when the upstream ended (0: not yet): the end of its billed time */
    int funds_out;            /* cut: the consumer's funds held no more of it (gw_hold) */
    /* An answer not a stream whose bytes the funds do not hold a token a
     * byte: kept from the client (in out) until it is whole, then held
     * for the usage it reports (settle_withheld). */
    int withheld;
    int dropped_whole; /* a withheld answer dropped, none of it passed: answered 402, or 502 (respond) */
    long status;
    char up_type[128];
    char up_etag[128]; /* the replica's ETag, passed on ("" none) */
    CURLcode curl_rc;
    /* Usage, from what was delivered (usage.c). */
    struct gw_usage usage;
    int delivered_all;
    /* Under lock: the events of the stream that came from the upstream,
     * and gw_sse_event_end's state over its bytes (event_ended reads it). */
    int64_t events_received;
    int up_sse_state;
    /* The most output tokens the request lets the replica generate
     * (request_output_bound); -1: no bound but the bytes. Set before the
     * upstream starts. */
    int64_t output_bound;
    int64_t delivered_bytes; /* answer bytes handed to the client */
    /* A client that left mid-answer: the answer read on for its usage. */
    int draining;            /* its bytes go to drain_out, not to a client */
    int resume_drain;        /* its transfer was paused for the client: to go on */
    int64_t drain_until_ms;  /* when the upstream is cut */
    int64_t drained_bytes;   /* answer bytes read for no client */
    struct call *next_drain; /* the upstream thread's list of draining calls */
    int status_sent;
    int app_call; /* to /apps/...: counted in the metrics (not /healthz) */
};

/* Set when the gateway stops: no call waits for a replica any more; and
 * once the calls in progress had GW_STOP_MS to end: nothing is suspended. */
static atomic_int stopping, ending;

/* Upstream transfers paused now for a slow client (GET /healthz), and
 * calls to /apps/... in progress (the metrics). */
static atomic_int paused_upstreams, app_calls_live;

void gw_proxy_counts(int64_t *calls, int64_t *paused)
{
    *calls = atomic_load(&app_calls_live);
    *paused = atomic_load(&paused_upstreams);
}

/* Under c->lock: resumes the connection if it is suspended waiting for the
 * upstream. A connection only completes while not suspended, so one that
 * is suspended is still there. */
static void wake(struct call *c)
{
    if (c->suspended) {
        c->suspended = 0;
        MHD_resume_connection(c->conn);
    }
}

/* Under c->lock: suspends the connection until wake(); 0 when the gateway
 * is ending (then the caller ends the call instead). */
static int suspend(struct call *c)
{
    if (ending)
        return 0;
    c->suspended = 1;
    MHD_suspend_connection(c->conn);
    return 1;
}

/* Every call from its first callback to its completion, for stop, and how
 * many are not yet freed (their upstream may outlive the connection). */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t freed_cond = PTHREAD_COND_INITIALIZER;
static struct call *live;
static int64_t calls_live, calls_unfreed; /* in the list; not yet freed */

static void live_add(struct call *c)
{
    pthread_mutex_lock(&live_lock);
    calls_unfreed++;
    calls_live++;
    c->next_live = live;
    if (live)
        live->prev_live = c;
    live = c;
    pthread_mutex_unlock(&live_lock);
}

static void live_remove(struct call *c)
{
    pthread_mutex_lock(&live_lock);
    if (c->prev_live)
        c->prev_live->next_live = c->next_live;
    else
        live = c->next_live;
    if (c->next_live)
        c->next_live->prev_live = c->prev_live;
    calls_live--;
    pthread_cond_broadcast(&freed_cond);
    pthread_mutex_unlock(&live_lock);
}

/* Drops one reference; the last frees the call. */
static void call_unref(struct call *c)
{
    pthread_mutex_lock(&c->lock);
    int last = --c->refs == 0;
    pthread_mutex_unlock(&c->lock);
    if (!last)
        return;
    /* The replica is busy until its upstream call has ended too. */
    if (c->has_replica)
        gw_replica_release(c->instance_id);
    pthread_mutex_destroy(&c->lock);
    free(c->body);
    free(c->out);
    gw_usage_free(&c->usage);
    free(c);
    pthread_mutex_lock(&live_lock);
    calls_unfreed--;
    pthread_cond_broadcast(&freed_cond);
    pthread_mutex_unlock(&live_lock);
}

/* Copies the value of header line p (len bytes) into out if it is the
 * header name (with its colon); 1 if it was. */
static int header_value(const char *p, size_t len, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    if (len <= nl || strncasecmp(p, name, nl) != 0)
        return 0;
    const char *v = p + nl;
    while (*v == ' ' || *v == '\t')
        v++;
    size_t vl = len - (size_t)(v - p);
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
        vl--;
    snprintf(out, cap, "%.*s", (int)vl, v);
    return 1;
}

/* The replica's headers the client gets: its Content-Type, and its ETag, so
 * that a client's If-None-Match and the 304 it brings back mean something. */
static size_t up_header(char *p, size_t size, size_t n, void *vc)
{
    struct call *c = vc;
    size_t len = size * n;
    pthread_mutex_lock(&c->lock);
    if (!header_value(p, len, "Content-Type:", c->up_type, sizeof c->up_type))
        header_value(p, len, "ETag:", c->up_etag, sizeof c->up_etag);
    pthread_mutex_unlock(&c->lock);
    return len;
}

/* The first body byte (or the end) means the headers are in. */
static void headers_in(struct call *c)
{
    if (c->headers_done)
        return;
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &c->status);
    c->headers_done = 1;
    wake(c);
}

/* Under c->lock: the n bytes at p join the answer waiting for the client;
 * -1 when out of memory. */
static int out_append(struct call *c, const char *p, size_t n)
{
    if (n == 0)
        return 0;
    char *grown = realloc(c->out, c->out_len + n);
    if (!grown)
        return -1;
    memcpy(grown + c->out_len, p, n);
    c->out = grown;
    c->out_len += n;
    return 0;
}

/* Whether path's segments, empty ones left out (as servers that merge
 * slashes read them), are those of a completion: v1/completions or
 * v1/chat/completions. */
static int completion_path(const char *path)
{
    static const char *const want[][4] = {{"v1", "completions", NULL}, {"v1", "chat", "completions", NULL}};
    for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
        const char *p = path;
        size_t k = 0;
        for (;;) {
            p += strspn(p, "/");
            size_t n = strcspn(p, "/");
            if (n == 0 || !want[w][k] || strlen(want[w][k]) != n || strncmp(p, want[w][k], n) != 0)
                break;
            p += n;
            k++;
        }
        if (!*p && !want[w][k])
            return 1;
    }
    return 0;
}

/* Whether path has a "." or ".." segment, which a replica or libcurl
 * could resolve into another path than the one the gateway checked. */
static int dot_segment(const char *path)
{
    for (const char *p = path; *p;) {
        p += strspn(p, "/");
        size_t n = strcspn(p, "/");
        if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return 1;
        p += n;
    }
    return 0;
}

/* The most output tokens a completion request lets the replica generate:
 * its max_tokens or max_completion_tokens (the greater when both are set:
 * servers differ on which wins) times the sequences it asks for (n, or
 * best_of when more: a server generates, and counts, them all). -1 when it
 * sets no limit (their types were checked: completion_refused), or one
 * past what usage.c takes (GW_USAGE_TOKENS_MAX): the bytes alone bound the
 * tokens then. */
static int64_t request_output_bound(const json_t *request)
{
    static const char *const limits[] = {"max_tokens", "max_completion_tokens"}, *const copies[] = {"n", "best_of"};
    int64_t most = -1, times = 1;
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(request, limits[i]);
        if (json_is_integer(v) && json_integer_value(v) > most)
            most = json_integer_value(v);
    }
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(request, copies[i]);
        if (json_is_integer(v) && json_integer_value(v) > times)
            times = json_integer_value(v);
    }
    if (most < 0 || times > GW_USAGE_TOKENS_MAX || most > GW_USAGE_TOKENS_MAX / times)
        return -1;
    return most * times;
}

/* Why a call's request is refused before it is sent on: its status, error
 * code, the field at fault (NULL: none) and a sentence. */
struct refusal {
    unsigned status;
    const char *code, *field, *msg;
};

/* Whether a completion's JSON body j has a field the gateway reads (for
 * the stream's usage or the output it allows) of a type the replica might
 * read otherwise: `stream` and `stream_options.include_usage` booleans
 * (a server taking "true" or 1 for true would stream unasked),
 * `stream_options` an object, the output limits whole numbers of at least
 * 0 and the sequences of at least 1 (a server reading "100" or 100.0 as
 * 100 would be bounded by a limit the gateway did not see), each also
 * null, as OpenAI's API has them. 1 with *why filled when one is. */
static int completion_refused(const json_t *j, struct refusal *why)
{
    static const struct {
        const char *name;
        int least; /* -1: a boolean; -2: an object */
        const char *msg;
    } fields[] = {
        {"stream", -1, "`stream` must be true or false"},
        {"stream_options", -2, "`stream_options` must be an object"},
        {"max_tokens", 0, "`max_tokens` must be a whole number of at least 0"},
        {"max_completion_tokens", 0, "`max_completion_tokens` must be a whole number of at least 0"},
        {"n", 1, "`n` must be a whole number of at least 1"},
        {"best_of", 1, "`best_of` must be a whole number of at least 1"},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        json_t *v = json_object_get(j, fields[i].name);
        int least = fields[i].least;
        if (!v || json_is_null(v) || (least == -1 && json_is_boolean(v)) || (least == -2 && json_is_object(v)) ||
            (least >= 0 && json_is_integer(v) && json_integer_value(v) >= least))
            continue;
        *why = (struct refusal){400, "invalid_field", fields[i].name, fields[i].msg};
        return 1;
    }
    json_t *include = json_object_get(json_object_get(j, "stream_options"), "include_usage");
    if (include && !json_is_boolean(include) && !json_is_null(include)) {
        *why = (struct refusal){400, "invalid_field", "stream_options.include_usage",
                                "`stream_options.include_usage` must be true or false"};
        return 1;
    }
    return 0;
}

/* OpenAI-style servers (vLLM among them) put a stream's usage in it only
 * when the request asks (`stream_options.include_usage`), and a stream
 * without it would be charged no tokens, whether the client forgot or
 * said false on purpose. So a streamed completion whose client did not
 * ask is sent asking. The event the client did not ask for, usage with an
 * empty `choices`, then reaches it as an SSE comment line,
 * ":data: {...}", which every client's parser skips (a consumer reading
 * choices[0] of each chunk would fail on it), and gw_usage_scan still
 * reads the usage in it.
 *
 * The gateway must read the body as the replica will: sent as JSON
 * (content_type JSON, or none: it goes on as application/json; not
 * encoded, encoding), UTF-8 JSON without a repeated key (parsers differ on
 * which one counts), an object whose fields the gateway reads of their
 * types (completion_refused). Other fields are the app's: passed on, as
 * an OpenAI-compatible server takes fields of its own. Reading it, the
 * gateway also takes the output tokens it allows (c->output_bound). 0, or
 * -1 with *why when the body is refused. */
static int ask_stream_usage(struct call *c, const char *path, const char *content_type, const char *encoding,
                            struct refusal *why)
{
    if (strcmp(c->method, "POST") != 0 || c->body_len == 0 || !completion_path(path))
        return 0;
    if (encoding && strcasecmp(encoding, "identity") != 0) {
        *why = (struct refusal){415, "unsupported_media_type", "Content-Encoding",
                                "the body of a completion is read as it is sent: send it without Content-Encoding"};
        return -1;
    }
    if (content_type && content_type[0] && !json_body_media_type_ok(content_type)) {
        *why = (struct refusal){415, "unsupported_media_type", "Content-Type",
                                "the body of a completion must be JSON, sent with Content-Type: application/json"};
        return -1;
    }
    json_error_t err;
    json_t *j = json_loadb(c->body, c->body_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!j && json_error_code(&err) == json_error_duplicate_key) {
        *why = (struct refusal){400, "duplicate_key", NULL, "an object in the request body repeats a key"};
        return -1;
    }
    if (!j && json_error_code(&err) == json_error_invalid_utf8) {
        *why = (struct refusal){400, "invalid_encoding", NULL, "the body of a completion must be UTF-8"};
        return -1;
    }
    if (!j) {
        static __thread char text_why[200];
        snprintf(text_why, sizeof text_why, "the body of a completion must be JSON: %s", err.text);
        *why = (struct refusal){400, "malformed_json", NULL, text_why};
        return -1;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        *why = (struct refusal){400, "not_an_object", NULL, "the body of a completion must be a JSON object"};
        return -1;
    }
    if (completion_refused(j, why)) {
        json_decref(j);
        return -1;
    }
    c->output_bound = request_output_bound(j);
    json_t *stream = json_object_get(j, "stream"), *options = json_object_get(j, "stream_options");
    char *text = NULL;
    if (json_is_true(stream) && !json_is_true(json_object_get(options, "include_usage"))) {
        if (!json_is_object(options))
            json_object_set_new(j, "stream_options", options = json_object());
        json_object_set_new(options, "include_usage", json_true());
        /* Reals printed so that each reads back as the same number. */
        text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        if (!text) { /* out of memory: not sent unasked, so never unmetered */
            json_decref(j);
            *why = (struct refusal){500, "internal", NULL, "the gateway could not prepare the call; retry"};
            return -1;
        }
    }
    json_decref(j);
    if (text) {
        free(c->body);
        c->body = text;
        c->body_len = strlen(text);
        c->usage.usage_asked = 1;
    }
    return 0;
}

/* Under c->lock: gw_usage_hide's output joins the answer waiting for the
 * client (out_append). */
static int emit_out(void *vc, const char *p, size_t n)
{
    return out_append(vc, p, n);
}

/* Under c->lock: a last line held without its newline goes out, at the
 * answer's end (held still when out of memory). */
static void flush_line(struct call *c)
{
    gw_usage_flush_line(&c->usage, emit_out, c);
}

/* Under c->lock, for a call whose client left mid-answer: what came for
 * it is read for its usage as if delivered, and dropped. */
static void drain_out(struct call *c)
{
    gw_usage_scan(&c->usage, c->out, c->out_len);
    c->drained_bytes += (int64_t)c->out_len;
    c->out_len = 0;
}

/* Under c->lock: whether the answer is a stream of server-sent events whose
 * bytes so far end with a whole event (a blank line, with any of the
 * standard's line ends: gw_sse_event_end), so that one more may follow. */
static int event_ended(const struct call *c)
{
    return strncasecmp(c->up_type, "text/event-stream", 17) == 0 && c->usage.line_len == 0 &&
           gw_sse_event_boundary(c->up_sse_state);
}

/* Under c->lock: the output tokens the call's hold covers once received
 * answer bytes, events of them (a stream's), have come. What the record
 * may claim is bounded by the bytes (a token is at least a byte) and the
 * request's output_bound; but a stream of OpenAI-style chunks spends some
 * 100 to 200 bytes an event on a token or so, so holding a token a byte
 * held 100 to 200 times the answer's cost whenever the replica reported
 * usage only at its end, and consumers whose funds covered the answer
 * were refused or cut. So a stream is held a token an event (those it
 * last reported, then one an event since, and one for the event under
 * way): exact for servers that send a token an event (most
 * OpenAI-compatible servers, vLLM's among them, by default), short for
 * one that packs several into an event (speculative decoding). Short, the record still claims what the
 * replica reports within the bounds when the consumer's funds cover it
 * at the end (within_hold grows the hold), else what was held: the
 * consumer never pays more than their funds held, and the seller bears
 * what their server's chunking hid (a server that reports usage in every
 * event, as vLLM's continuous usage stats do, is held exactly). */
static int64_t held_output(struct call *c, int64_t received, int64_t events)
{
    int64_t slack = atomic_load(&c->usage.slack);
    int64_t out = received + (slack < 0 ? slack : 0);
    if (strncasecmp(c->up_type, "text/event-stream", 17) == 0) {
        int64_t guess = atomic_load(&c->usage.base) + events + 1;
        if (guess < out)
            out = guess;
    }
    if (c->output_bound >= 0 && c->output_bound < out)
        out = c->output_bound;
    return out < 0 ? 0 : out;
}

/* Under c->lock once the upstream runs (before, on the connection's
 * thread alone): whether the call's hold covers its price, its input
 * (app.input_held), output tokens and ms of upstream time, grown to that
 * when the funds allow. The input is held a token a byte of the body, the
 * most its record may claim, while the funds allow; once they do not, its
 * share drops for good to the estimate (GW_INPUT_BYTES_PER_TOKEN) and what
 * that frees holds the answer, so a long prompt does not cut an answer
 * its consumer could pay for. The hold itself never shrinks, and the
 * record is capped to it (within_hold). */
static int hold_covers(struct call *c, int64_t output, int64_t ms)
{
    int64_t need = gw_call_cost(&c->app, c->app.input_held, output, ms);
    if (gw_hold(&c->app, need) >= need)
        return 1;
    int64_t guess = gw_input_estimate((int64_t)c->client_len);
    if (c->app.input_held <= guess)
        return 0;
    need = gw_call_cost(&c->app, guess, output, ms);
    if (gw_hold(&c->app, need) < need)
        return 0;
    c->app.input_held = guess;
    return 1;
}

/* Under c->lock: whether the consumer's funds hold what the call may cost
 * with received answer bytes in all, events of them, its upstream's time
 * ahead_ms from now: its hold grows to that, or the call must stop short
 * of it. An error answer costs nothing, so it needs nothing held. */
static int hold_grows(struct call *c, int64_t received, int64_t events, int64_t ahead_ms)
{
    if (c->headers_done && c->status >= 400)
        return 1;
    return hold_covers(c, held_output(c, received, events), clock_mono_ms() - c->upstream_ms + ahead_ms);
}

/* Under c->lock: the consumer's funds hold no more of the call; it is cut
 * (see hold_grows). */
static void funds_cut(struct call *c)
{
    if (!c->funds_out && c->body_received > 0 && !c->draining && event_ended(c)) {
        /* A stream cut here says why, as an event an OpenAI client raises
         * as an error, before the connection ends without the stream's end. */
        static const char why[] = "data: {\"error\":{\"code\":\"insufficient_funds\",\"message\":"
                                  "\"your funds, less what your other calls hold, cover no more of this answer;"
                                  " top up first\",\"field\":null,\"type\":\"insufficient_quota\","
                                  "\"param\":null}}\n\n";
        out_append(c, why, sizeof why - 1);
    }
    if (!c->funds_out)
        log_info("gateway: call %s of app %s cut: the funds of %s hold no more of it",
                 c->record_id[0] ? c->record_id : "-", c->app.app_id, c->app.user_id);
    c->funds_out = 1;
}

/* Under c->lock: whether the consumer's funds hold what the call may cost
 * (hold_grows); if not, it is cut. */
static int funds_hold(struct call *c, int64_t received, int64_t events, int64_t ahead_ms)
{
    if (hold_grows(c, received, events, ahead_ms))
        return 1;
    funds_cut(c);
    return 0;
}

/* Under c->lock: a withheld answer is whole in out. It is held for what
 * its record will claim (the usage it reports, bounded as usage_record
 * bounds it) and goes to the client; or, when the funds do not hold that,
 * it is dropped and the call answered 402 (respond). A JSON answer reports
 * its usage at its end, so no token count is known before it is whole;
 * holding it back costs its client nothing, who can use it only whole. */
static void settle_withheld(struct call *c)
{
    c->withheld = 0;
    json_t *j = json_loadb(c->out, c->out_len, 0, NULL);
    json_t *u = json_object_get(j, "usage");
    json_int_t out = json_is_object(u) ? json_integer_value(json_object_get(u, "completion_tokens")) : 0;
    json_decref(j);
    if (out < 0 || out > GW_USAGE_TOKENS_MAX)
        out = 0; /* as usage.c: no usage in range is charged no tokens */
    if (out > (json_int_t)c->out_len)
        out = (json_int_t)c->out_len;
    if (c->output_bound >= 0 && out > c->output_bound)
        out = c->output_bound;
    if (hold_covers(c, out, clock_mono_ms() - c->upstream_ms)) {
        wake(c);
        return;
    }
    c->out_len = 0;
    c->dropped_whole = 1;
    funds_cut(c);
    wake(c);
}

/* Under c->lock: whether the n answer bytes that the funds do not hold a
 * token a byte may wait, withheld, for the answer's usage: an answer not a
 * stream, none of it passed on yet, still read for its client, and whole
 * within GW_BUFFER_MAX (past that it is cut: the buffer is the bound on
 * what an answer may keep waiting). */
static int may_withhold(const struct call *c, int stream, size_t n)
{
    return !stream && !c->draining && (c->withheld || c->body_received == 0) && c->out_len + n <= GW_BUFFER_MAX;
}

static size_t up_body(char *p, size_t size, size_t n, void *vc)
{
    struct call *c = vc;
    size_t len = size * n;
    pthread_mutex_lock(&c->lock);
    headers_in(c);
    if (c->client_gone && !c->draining) {
        pthread_mutex_unlock(&c->lock);
        return 0; /* aborts the upstream call */
    }
    /* (c->usage.streamed is set on the connection's side, maybe after this.) */
    int stream = strncasecmp(c->up_type, "text/event-stream", 17) == 0;
    int sse_state = c->up_sse_state;
    int64_t events = c->events_received;
    for (size_t i = 0; stream && i < len; i++)
        events += gw_sse_event_end(&sse_state, p[i]);
    /* Bytes the funds do not hold never pass: the answer is cut here, or
     * (an answer not a stream) withheld until it is whole. At its first
     * bytes, an answer not a stream is held for all it announces, so that
     * one the funds do not hold a token a byte is withheld from its start,
     * not cut after its first pieces passed; a JSON answer that announces
     * no length (chunked) is held so for all it may be withheld, 1 MiB:
     * its client could use it only whole, and cut it would get a 200 with
     * half a body. */
    int64_t upto = (int64_t)c->body_received + (int64_t)len;
    if (!stream && c->body_received == 0) {
        curl_off_t announced = -1;
        if (curl_easy_getinfo(c->curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &announced) != CURLE_OK)
            announced = -1;
        if (announced > upto)
            upto = (int64_t)announced;
        else if (announced < 0 && json_body_media_type_ok(c->up_type) && upto < (int64_t)GW_BUFFER_MAX)
            upto = GW_BUFFER_MAX;
    }
    if (c->withheld || !hold_grows(c, upto, events, 0)) {
        if (!may_withhold(c, stream, len)) {
            c->dropped_whole = c->withheld;
            c->withheld = 0;
            if (c->dropped_whole)
                c->out_len = 0;
            funds_cut(c);
            pthread_mutex_unlock(&c->lock);
            return 0;
        }
        c->withheld = 1;
    }
    if (!c->withheld && !c->draining && c->out_len && c->out_len + len > GW_BUFFER_MAX) {
        /* A slow client: the upstream waits (libcurl keeps these bytes)
         * until answer_read has handed on half of what is buffered. */
        c->up_paused = 1;
        paused_upstreams++;
        pthread_mutex_unlock(&c->lock);
        return CURL_WRITEFUNC_PAUSE;
    }
    c->up_sse_state = sse_state;
    c->events_received = events;
    int ok = c->usage.usage_asked && stream ? gw_usage_hide(&c->usage, p, len, emit_out, c) : out_append(c, p, len);
    if (ok == 0) {
        /* The whole body is in: the answer can end without waiting for
         * the transfer's end (one suspend and resume less a call). */
        curl_off_t want = -1;
        c->body_received += (curl_off_t)len;
        if (curl_easy_getinfo(c->curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &want) == CURLE_OK && want >= 0 &&
            c->body_received >= want) {
            c->body_complete = 1;
            flush_line(c);
            if (c->withheld)
                settle_withheld(c);
        }
    }
    if (c->draining)
        drain_out(c);
    else if (!c->withheld)
        wake(c);
    pthread_mutex_unlock(&c->lock);
    return ok == 0 ? len : 0;
}

/* Whether the call's replica failed it before a byte of an answer: the
 * connection refused or never made, or (the usual sign of a dead server
 * behind a published port, whose relay accepts and then closes) closed
 * with nothing sent back. The client has seen nothing either, so the call
 * can go to another replica: a model call does nothing but answer, and
 * the consumer is charged once, for the answer delivered. */
static int failed_unanswered(const struct call *c, CURLcode rc)
{
    curl_off_t connect_us = 0;
    if (c->headers_done)
        return 0;
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
        return 1;
    case CURLE_OPERATION_TIMEDOUT: /* only the connect has a time limit */
        return curl_easy_getinfo(c->curl, CURLINFO_CONNECT_TIME_T, &connect_us) == CURLE_OK && connect_us == 0;
    default:
        return 0;
    }
}

/* The call's replica failed it unanswered: moves the call to another
 * ready replica of the app (not one already tried), 1; 0 when there is
 * none or the tries are spent. Only the upstream thread touches the call's
 * replica until it ends. */
static int another_replica(struct call *c, CURLcode why)
{
    gw_replica_refused(c->instance_id);
    if (c->n_tried >= GW_CONNECT_TRIES - 1)
        return 0;
    memcpy(c->tried[c->n_tried++], c->instance_id, ID_MAX);
    char base[1024], id[ID_MAX], url[sizeof c->url];
    if (gw_replica_take(c->app.app_id, (const char(*)[ID_MAX])c->tried, c->n_tried, base, sizeof base, id) != 0)
        return 0;
    gw_replica_release(c->instance_id);
    memcpy(c->instance_id, id, ID_MAX);
    if ((size_t)snprintf(url, sizeof url, "%s%s", base, c->path_query) >= sizeof url)
        return 0;
    log_info("gateway: replica %s of app %s failed a call unanswered (%s); it goes to replica %s",
             c->tried[c->n_tried - 1], c->app.app_id, curl_easy_strerror(why), id);
    memcpy(c->url, url, sizeof url);
    return 1;
}

/* The upstream calls. One thread drives them all through a libcurl multi
 * handle, so a call being answered costs no thread of its own, and they
 * share its connection cache: a call reuses a kept-alive connection to
 * its replica instead of opening one (through a node's published port a
 * new connection costs far more than the call). Other threads hand it
 * calls through up_queue, each entry holding a reference: a call to
 * start, one whose client has taken half of a full buffer (its transfer
 * was paused), or one whose client has left. */
static pthread_mutex_t up_lock = PTHREAD_MUTEX_INITIALIZER;
static struct call *up_queue; /* linked by next_up */
static struct call *drains;   /* calls read on for no client, the upstream thread's alone */
static int up_quit;
static CURLM *multi;
static pthread_t up_thread;
static int up_started;

/* Queues the call for the upstream thread's attention (once, however
 * often it is asked before the thread gets to it). */
static void up_enqueue(struct call *c)
{
    pthread_mutex_lock(&up_lock);
    if (!c->up_queued) {
        pthread_mutex_lock(&c->lock);
        c->refs++;
        pthread_mutex_unlock(&c->lock);
        c->up_queued = 1;
        c->next_up = up_queue;
        up_queue = c;
        curl_multi_wakeup(multi);
    }
    pthread_mutex_unlock(&up_lock);
}

static void finish_usage(struct call *c);
static void release_consumer(struct call *c);

/* The call's upstream has ended (rc): the connection learns it, and the
 * call drops the reference its upstream held. A call read on after its
 * client left is recorded now, for what came, and leaves the consumer's
 * calls in flight only then: its cost is not in the funds admission sees
 * until it is recorded. */
static void up_end(struct call *c, CURLcode rc)
{
    if (c->up_state == UP_RUNNING)
        curl_multi_remove_handle(multi, c->curl);
    pthread_mutex_lock(&c->lock);
    if (rc == CURLE_OK)
        headers_in(c);
    if (c->up_paused) { /* its client left */
        c->up_paused = 0;
        paused_upstreams--;
    }
    c->curl_rc = rc;
    c->up_end_ms = clock_mono_ms();
    flush_line(c);
    if (c->withheld && rc == CURLE_OK) {
        settle_withheld(c);
    } else if (c->withheld) { /* cut before the answer was whole, by its upstream or its funds */
        c->withheld = 0;
        c->out_len = 0;
        c->dropped_whole = 1;
    }
    c->finished = 1;
    int drained = c->draining;
    if (drained)
        drain_out(c);
    wake(c);
    pthread_mutex_unlock(&c->lock);
    if (drained) {
        for (struct call **p = &drains; *p; p = &(*p)->next_drain)
            if (*p == c) {
                *p = c->next_drain;
                break;
            }
        finish_usage(c);
        release_consumer(c);
    }
    c->up_state = UP_ENDED;
    curl_slist_free_all(c->up_headers);
    c->up_headers = NULL;
    if (c->curl)
        curl_easy_cleanup(c->curl);
    c->curl = NULL;
    call_unref(c);
}

static void up_start(struct call *c)
{
    char ct[200], inm[300];
    snprintf(ct, sizeof ct, "Content-Type: %s", c->content_type[0] ? c->content_type : "application/json");
    c->up_headers = curl_slist_append(c->up_headers, ct);
    /* A conditional GET is the replica's to answer (304 and its ETag). */
    if (c->if_none_match[0]) {
        snprintf(inm, sizeof inm, "If-None-Match: %s", c->if_none_match);
        c->up_headers = curl_slist_append(c->up_headers, inm);
    }
    c->up_headers = curl_slist_append(c->up_headers, "Expect:");
    CURL *curl = c->curl = curl_easy_init();
    if (!curl || !c->up_headers) {
        up_end(c, CURLE_FAILED_INIT);
        return;
    }
    curl_easy_setopt(curl, CURLOPT_URL, c->url);
    /* The path the replica gets is the one checked (no dot segments). */
    curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(curl, CURLOPT_PRIVATE, c);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, c->up_headers);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    /* A replica that never answers, or stops mid-answer, would hold the
     * call (and its client) for ever: it is ended after --upstream-idle-s
     * without a byte (under a byte a second over that time: libcurl's low
     * speed check). A call lasts --max-call-s at most, so its record's
     * duration stays within what gpurentd takes (a day). */
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, (long)gw_opts.upstream_idle_s);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)(gw_opts.max_call_s * 1000));
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, up_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, up_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, c);
    if (c->body_len || c->body || strcmp(c->method, "POST") == 0) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, c->body ? c->body : "");
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)c->body_len);
    }
    if (strcmp(c->method, "HEAD") == 0)
        curl_easy_setopt(curl, CURLOPT_NOBODY, 1L); /* else libcurl waits for a body a HEAD never has */
    else if (strcmp(c->method, "GET") != 0 && strcmp(c->method, "POST") != 0)
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, c->method);
    if (curl_multi_add_handle(multi, curl) != CURLM_OK) {
        up_end(c, CURLE_FAILED_INIT);
        return;
    }
    c->up_state = UP_RUNNING;
}

/* What a queued call asked for: to start, to go on after a pause, or
 * (its client gone) to stop, or to be read on until GW_DRAIN_MS. */
static void up_attend(struct call *c)
{
    pthread_mutex_lock(&c->lock);
    int gone = c->client_gone, drain = c->draining, resume = c->resume_drain;
    c->resume_drain = 0;
    pthread_mutex_unlock(&c->lock);
    if (c->up_state == UP_ENDED)
        return;
    if (gone && drain) {
        if (resume)
            curl_easy_pause(c->curl, CURLPAUSE_CONT);
        struct call *d = drains;
        while (d && d != c)
            d = d->next_drain;
        if (!d) {
            c->next_drain = drains;
            drains = c;
        }
    } else if (gone)
        up_end(c, CURLE_ABORTED_BY_CALLBACK);
    else if (c->up_state == UP_NEW)
        up_start(c);
    else
        curl_easy_pause(c->curl, CURLPAUSE_CONT); /* may hand on the bytes it kept, in up_body */
}

/* A transfer is done: sent to another replica when its replica failed it
 * unanswered, otherwise ended. */
static void up_done(struct call *c, CURLcode rc)
{
    curl_multi_remove_handle(multi, c->curl);
    c->up_state = UP_NEW;
    if (rc != CURLE_OK && failed_unanswered(c, rc) && another_replica(c, rc)) {
        curl_easy_setopt(c->curl, CURLOPT_URL, c->url);
        if (curl_multi_add_handle(multi, c->curl) == CURLM_OK) {
            c->up_state = UP_RUNNING;
            return;
        }
    }
    up_end(c, rc);
}

/* Whether the client of a suspended connection closed (or reset) it: a
 * peek reads 0 bytes, or fails otherwise than for want of data. A client
 * that only shut its sending side after the request (no HTTP client does;
 * HTTP/1.1 keeps the connection for its answer) is taken to have left. */
static int client_closed(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info)
        return 0;
    char b;
    ssize_t r = recv(info->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* libmicrohttpd watches no suspended connection, so a client that left
 * while its call waits for the upstream's first byte would be noticed
 * only when the replica answers or --upstream-idle-s passes, its replica
 * busy meanwhile. Called on the upstream thread about once a second: each
 * such client's socket is peeked at, and a call whose client closed is
 * ended (its connection then completes, recorded as unanswered). A
 * connection cannot complete while suspended, so its socket is still its
 * own. */
static void end_calls_of_gone_clients(void)
{
    enum { BATCH = 64 };
    struct call *gone[BATCH];
    size_t n = 0;
    pthread_mutex_lock(&live_lock);
    for (struct call *c = live; c && n < BATCH; c = c->next_live) {
        pthread_mutex_lock(&c->lock);
        if (c->suspended && c->phase == P_WAIT_HEADERS && c->has_upstream && !c->headers_done && !c->finished &&
            !c->client_gone && client_closed(c->conn)) {
            c->client_gone = 1;
            c->refs++; /* until it is ended below */
            gone[n++] = c;
        }
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&live_lock);
    for (size_t i = 0; i < n; i++) {
        if (gone[i]->up_state != UP_ENDED)
            up_end(gone[i], CURLE_ABORTED_BY_CALLBACK);
        call_unref(gone[i]);
    }
}

/* A call priced per second costs more while its upstream runs, with
 * bytes or without: called on the upstream thread about once a second,
 * this grows each such call's hold to cover its time until the next
 * check and a grain more (the loop may be late), and ends the calls whose
 * consumer's funds cannot (their connections then answer 402, or end the
 * answer where it was). */
static void end_calls_out_of_funds(void)
{
    enum { BATCH = 64 };
    struct call *out[BATCH];
    size_t n = 0;
    pthread_mutex_lock(&live_lock);
    for (struct call *c = live; c && n < BATCH; c = c->next_live) {
        /* up_state first: it is this thread's own, and a call with an
         * upstream running was admitted before it was handed over. */
        if (c->up_state != UP_RUNNING || c->app.price_second <= 0)
            continue;
        pthread_mutex_lock(&c->lock);
        if (!c->finished && !c->body_complete && !c->client_gone &&
            !funds_hold(c, c->withheld ? 0 : (int64_t)c->body_received, c->events_received, 1000 + GW_HOLD_GRAIN_MS)) {
            c->refs++; /* until it is ended below */
            out[n++] = c;
        }
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&live_lock);
    for (size_t i = 0; i < n; i++) {
        if (out[i]->up_state != UP_ENDED)
            up_end(out[i], CURLE_ABORTED_BY_CALLBACK);
        call_unref(out[i]);
    }
}

static void *up_main(void *arg)
{
    (void)arg;
    int64_t peeked_ms = 0;
    for (;;) {
        pthread_mutex_lock(&up_lock);
        int quit = up_quit;
        while (up_queue) {
            struct call *c = up_queue;
            up_queue = c->next_up;
            c->up_queued = 0;
            pthread_mutex_unlock(&up_lock);
            up_attend(c);
            call_unref(c); /* the queue's reference */
            pthread_mutex_lock(&up_lock);
        }
        pthread_mutex_unlock(&up_lock);
        int running = 0, left = 0;
        curl_multi_perform(multi, &running);
        CURLMsg *m;
        while ((m = curl_multi_info_read(multi, &left))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            CURLcode rc = m->data.result;
            struct call *c = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&c);
            if (c)
                up_done(c, rc);
        }
        int64_t now = clock_mono_ms(), wait_ms = 1000;
        for (struct call *d = drains, *next; d; d = next) {
            next = d->next_drain;
            if (quit || now >= d->drain_until_ms)
                up_end(d, CURLE_ABORTED_BY_CALLBACK); /* cut: recorded for what came */
            else if (d->drain_until_ms - now < wait_ms)
                wait_ms = d->drain_until_ms - now;
        }
        if (quit)
            return NULL;
        curl_multi_poll(multi, NULL, 0, (int)wait_ms, NULL);
        if (clock_mono_ms() - peeked_ms >= 1000) {
            peeked_ms = clock_mono_ms();
            end_calls_of_gone_clients();
            end_calls_out_of_funds();
        }
    }
}

/* Starts the upstream thread on first use: 0, or -1. */
static int up_ready(void)
{
    pthread_mutex_lock(&up_lock);
    if (!up_started && (multi = curl_multi_init()) != NULL) {
        if (pthread_create(&up_thread, NULL, up_main, NULL) == 0)
            up_started = 1;
        else
            curl_multi_cleanup(multi), multi = NULL;
    }
    int ok = up_started;
    pthread_mutex_unlock(&up_lock);
    return ok ? 0 : -1;
}

static void finish_usage(struct call *c);
static void note_progress(struct call *c, int more);

static ssize_t answer_read(void *vc, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct call *c = vc;
    pthread_mutex_lock(&c->lock);
    if (c->withheld || (c->out_len == 0 && !c->finished && !c->body_complete)) {
        /* Nothing new: no thread waits for it (the upstream wakes us). */
        int waiting = suspend(c);
        pthread_mutex_unlock(&c->lock);
        return waiting ? 0 : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (c->out_len == 0) {
        int ok = c->curl_rc == CURLE_OK;
        c->delivered_all = ok;
        pthread_mutex_unlock(&c->lock);
        /* Every byte is handed over; the terminator is not yet sent: the
         * record goes to disk now (see the top of this file). */
        finish_usage(c);
        return ok ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = c->out_len < max ? c->out_len : max;
    memcpy(buf, c->out, n);
    memmove(c->out, c->out + n, c->out_len - n);
    c->out_len -= n;
    int go_on = c->up_paused && c->out_len <= GW_BUFFER_MAX / 2;
    if (go_on) {
        c->up_paused = 0;
        paused_upstreams--;
    }
    int more = !(c->finished || c->body_complete);
    pthread_mutex_unlock(&c->lock);
    if (go_on)
        up_enqueue(c);
    c->delivered_bytes += (int64_t)n;
    gw_usage_scan(&c->usage, buf, n);
    note_progress(c, more);
    return (ssize_t)n;
}

/* Browsers: a web page on any origin may call an app (OpenAI-compatible
 * clients run in browsers too) with its consumer's key, which is a bearer
 * token and never a cookie, so every answer to /apps/... may be read by
 * any origin, and the replica's Retry-After with it. */
static void allow_origins(struct MHD_Response *r)
{
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "Retry-After, ETag");
}

/* Whether s is a list of header names a preflight may ask for: tokens,
 * commas and spaces only (it is echoed in the answer). */
static int header_names(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              strchr("!#$%&'*+-.^_`|~, ", *s)))
            return 0;
    return 1;
}

/* A browser's CORS preflight (OPTIONS with Access-Control-Request-Method)
 * carries no key, so it is answered here, before admission: any method
 * and the headers it asks for (an OpenAI SDK sends several of its own),
 * for ten minutes. An OPTIONS without it is an app's to answer. */
static enum MHD_Result reply_preflight(struct MHD_Connection *conn, struct call *c)
{
    const char *asked = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    c->status_sent = 204;
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    allow_origins(r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            asked && strlen(asked) < 2048 && header_names(asked)
                                ? asked
                                : "Authorization, Content-Type, If-None-Match, X-Gpurent-Wait-Seconds");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_NO_CONTENT, r);
    MHD_destroy_response(r);
    return ok;
}

/* The kind of error an OpenAI client library names by the error's "type"
 * (its exception classes follow the status; the type is what it keeps). */
static const char *openai_type(unsigned status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 402: return "insufficient_quota";
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* The API's error body, {"error": {"code", "message", "field"}}, field
 * naming the part of the request at fault (NULL: null), with OpenAI's
 * "type" and "param" (the same as field) beside them, since the apps are
 * called through OpenAI's client libraries. The message may quote the
 * client's bytes (an app's name), cut short: made valid UTF-8 first, or
 * jansson gives nothing to send. As the API's errors, a 401 names its
 * challenge (RFC 9110), a 415 what a POST takes and a 405 what the
 * resource allows. */
static enum MHD_Result reply_error(struct MHD_Connection *conn, struct call *c, unsigned status, const char *code,
                                   const char *field, const char *msg, int64_t retry_after)
{
    c->status_sent = (int)status;
    char message[512];
    snprintf(message, sizeof message, "%s", msg);
    utf8_scrub(message);
    json_t *j = json_pack("{s:{s:s, s:s, s:o, s:s, s:o}}", "error", "code", code, "message", message, "field",
                          field ? json_string(field) : json_null(), "type", openai_type(status), "param",
                          field ? json_string(field) : json_null());
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text)
        return MHD_NO; /* out of memory: the connection is closed */
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    allow_origins(r);
    if (status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    else if (status == 415)
        MHD_add_response_header(r, "Accept-Post", "application/json");
    else if (status == 405)
        MHD_add_response_header(r, "Allow", "GET, HEAD");
    char ra[24];
    if (retry_after > 0) {
        snprintf(ra, sizeof ra, "%lld", (long long)retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    enum MHD_Result ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* GET /healthz: 200 once a copy is loaded, with the copy's age and the
 * good syncs so far, for operators (and tests) to see how fresh what it
 * serves from is, the calls open and the upstreams paused for slow
 * clients; 503 before. */
static enum MHD_Result reply_health(struct MHD_Connection *conn)
{
    int64_t syncs, age_ms;
    gw_copy_info(&syncs, &age_ms);
    pthread_mutex_lock(&live_lock);
    int64_t open_calls = calls_live - 1; /* not this one */
    pthread_mutex_unlock(&live_lock);
    json_t *j = age_ms >= 0 ? json_pack("{s:s, s:I, s:I, s:I, s:i}", "status", "serving", "copy_age_ms",
                                        (json_int_t)age_ms, "syncs", (json_int_t)syncs, "calls", (json_int_t)open_calls,
                                        "paused_upstreams", (int)paused_upstreams)
                            : json_pack("{s:{s:s, s:s}}", "error", "code", "no_copy", "message",
                                        "no copy of the marketplace yet");
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    struct MHD_Response *r = text ? MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!r) {
        free(text);
        return MHD_NO; /* out of memory: the connection is closed */
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (age_ms < 0)
        MHD_add_response_header(r, "Retry-After", "1");
    enum MHD_Result ok = MHD_queue_response(conn, age_ms >= 0 ? 200 : 503, r);
    MHD_destroy_response(r);
    return ok;
}

/* A request not to /apps/...: GET or HEAD /healthz, or a 404 (405 for
 * another method on /healthz), answered at its headers, before any body
 * is read: only an admitted call's body is buffered, so a connection
 * without a key never holds more than its headers (libmicrohttpd reads no
 * body after an early answer and closes the connection). */
static enum MHD_Result reply_other(struct MHD_Connection *conn, struct call *c, const char *url, const char *method)
{
    if (strcmp(url, "/healthz") != 0)
        return reply_error(conn, c, 404, "not_found", NULL, "calls go to /apps/{slug}/…", 0);
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply_error(conn, c, 405, "method_not_allowed", NULL, "/healthz takes GET or HEAD", 0);
    return reply_health(conn);
}

/* Takes a ready replica for the call (one the copy lists: healthy by its
 * agent's check): 0, or -1 when none is. */
static int take_replica(struct call *c)
{
    char base[1024];
    if (gw_replica_take(c->app.app_id, NULL, 0, base, sizeof base, c->instance_id) != 0)
        return -1;
    snprintf(c->url, sizeof c->url, "%s", base);
    c->has_replica = 1;
    return 0;
}

/* The realtime clock ms from now, for pthread_cond_timedwait. */
static struct timespec in_ms(long ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    return ts;
}

/* Calls waiting for a replica (suspended), and the thread that looks for
 * one for each every GW_WAIT_POLL_MS and resumes it when it has one or its
 * deadline has passed. */
#define GW_WAIT_POLL_MS 100
static pthread_mutex_t wait_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wait_cond = PTHREAD_COND_INITIALIZER;
static struct call *waiting;
static pthread_t waiter;
static int waiter_started;

static void *waiter_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&wait_lock);
    while (!stopping) {
        int64_t now = clock_mono_ms();
        for (struct call **p = &waiting; *p;) {
            struct call *c = *p;
            int found = take_replica(c) == 0;
            if (!found && now < c->wait_until_ms) {
                p = &c->next_waiting;
                continue;
            }
            *p = c->next_waiting;
            c->phase = found ? P_START : P_NO_REPLICA;
            gw_app_count(c->app.app_id, 0, -1);
            MHD_resume_connection(c->conn);
        }
        struct timespec ts = in_ms(GW_WAIT_POLL_MS);
        pthread_cond_timedwait(&wait_cond, &wait_lock, &ts);
    }
    /* Stopping: every call still waiting is answered 503 now. */
    while (waiting) {
        struct call *c = waiting;
        waiting = c->next_waiting;
        c->phase = P_STOPPED;
        gw_app_count(c->app.app_id, 0, -1);
        MHD_resume_connection(c->conn);
    }
    pthread_mutex_unlock(&wait_lock);
    return NULL;
}

/* Suspends the call until a replica is ready, at most until its
 * wait_until_ms; counted as queued meanwhile, so the scaler sees demand
 * waiting. 0, or -1 when it cannot wait (stopping, no waiter thread). */
static int wait_for_replica(struct call *c)
{
    pthread_mutex_lock(&wait_lock);
    if (!waiter_started && pthread_create(&waiter, NULL, waiter_main, NULL) == 0)
        waiter_started = 1;
    if (stopping || !waiter_started) {
        pthread_mutex_unlock(&wait_lock);
        return -1;
    }
    c->phase = P_WAIT_REPLICA;
    c->cold_start = 1;
    gw_app_count(c->app.app_id, 0, 1);
    c->next_waiting = waiting;
    waiting = c;
    /* Under wait_lock, so the waiter cannot resume it before it is suspended. */
    MHD_suspend_connection(c->conn);
    pthread_mutex_unlock(&wait_lock);
    return 0;
}

/* Waits up to timeout_ms, under live_lock, until *count is 0. */
static void wait_until_none(const int64_t *count, int64_t timeout_ms)
{
    int64_t until = clock_mono_ms() + timeout_ms;
    while (*count > 0 && clock_mono_ms() < until) {
        struct timespec ts = in_ms(50);
        pthread_cond_timedwait(&freed_cond, &live_lock, &ts);
    }
}

void gw_proxy_drain(int64_t timeout_ms)
{
    pthread_mutex_lock(&live_lock);
    wait_until_none(&calls_unfreed, timeout_ms);
    int64_t unfreed = calls_unfreed;
    pthread_mutex_unlock(&live_lock);
    pthread_mutex_lock(&up_lock);
    int started = up_started;
    up_quit = 1;
    if (multi)
        curl_multi_wakeup(multi);
    pthread_mutex_unlock(&up_lock);
    if (started) {
        pthread_join(up_thread, NULL);
        if (unfreed == 0) /* else upstreams still hold it */
            curl_multi_cleanup(multi);
    }
}

void gw_proxy_stop(void)
{
    pthread_mutex_lock(&wait_lock);
    stopping = 1;
    pthread_cond_signal(&wait_cond);
    int started = waiter_started;
    pthread_mutex_unlock(&wait_lock);
    if (started)
        pthread_join(waiter, NULL);
    /* Calls in progress get GW_STOP_MS to finish their answers; then those
     * still waiting for their upstream or for more of its answer end:
     * libmicrohttpd cannot stop with a connection suspended. Each resumed
     * call answers (503, or the end of what it had) on a pool thread, and
     * stopping the server before would drop it unanswered. */
    pthread_mutex_lock(&live_lock);
    wait_until_none(&calls_live, GW_STOP_MS);
    ending = 1;
    for (struct call *c = live; c; c = c->next_live) {
        pthread_mutex_lock(&c->lock);
        wake(c);
        pthread_mutex_unlock(&c->lock);
    }
    wait_until_none(&calls_live, 1000);
    pthread_mutex_unlock(&live_lock);
}

/* The counts of a call answered under 400, made to cost no more than its
 * consumer's funds hold for it: the hold grows to their cost when the
 * funds allow; when they do not (the upstream's time ran on between two
 * checks, or a replica reported more tokens at the end than as it went),
 * the consumer pays what is held, the time given up first, then output
 * tokens, then input. So no call's record costs more than its consumer
 * could pay when it was made. */
static void within_hold(struct call *c, int64_t *in, int64_t *out, int64_t *ms)
{
    const struct gw_call_app *a = &c->app;
    int64_t cost = gw_call_cost(a, *in, *out, *ms);
    int64_t held = gw_hold(&c->app, cost);
    if (held >= cost)
        return;
    log_warn("gateway: call %s of app %s cost %lld micro-yuan, over the %lld its consumer's funds held; charged that",
             c->record_id, a->app_id, (long long)cost, (long long)held);
    /* floor(x / 1000) <= r exactly when x <= (r + 1) * 1000 - 1. */
    __int128 room = (__int128)held - gw_call_cost(a, *in, *out, 0);
    if (room < 0)
        *ms = 0;
    else if (a->price_second > 0)
        *ms = (int64_t)(((room + 1) * 1000 - 1) / a->price_second);
    if (room >= 0)
        return;
    room = ((__int128)held - a->price_request + 1) * 1000 - 1; /* for the tokens: price_input_1k x in + ... */
    __int128 left = room - (__int128)*in * a->price_input_1k;
    if (left < 0) {
        *out = 0;
        *in = a->price_input_1k > 0 ? (int64_t)(room / a->price_input_1k) : *in;
    } else if (a->price_output_1k > 0) {
        *out = (int64_t)(left / a->price_output_1k);
    }
}

/* The call's usage as delivered so far (completed: delivered in full), as
 * gpurentd takes it: its id is made once, so the call's progress lines and
 * its record name the same call. */
static json_t *usage_record(struct call *c, int completed)
{
    if (!c->record_id[0]) {
        char rid[ID_MAX];
        if (id_new("use", rid) < 0)
            return NULL;
        snprintf(c->record_id, sizeof c->record_id, "%.40s-%s", gw_opts.gateway_id, rid + 4);
        for (char *p = c->record_id; *p; p++)
            if (*p >= 'A' && *p <= 'Z')
                *p = (char)(*p - 'A' + 'a');
    }
    pthread_mutex_lock(&c->lock);
    int64_t end_ms = c->up_end_ms ? c->up_end_ms : clock_mono_ms();
    int64_t received = (int64_t)c->body_received;
    pthread_mutex_unlock(&c->lock);
    /* Per second is the upstream's time: a slow client taking the last
     * bytes after it ended adds nothing; and it ends by --max-call-s. */
    int64_t up = c->upstream_ms ? end_ms - c->upstream_ms : 0;
    if (up > gw_opts.max_call_s * 1000)
        up = gw_opts.max_call_s * 1000;
    /* The replica's counts are its word only: bounded by what passed
     * through here, a token being at least a byte of text each way (of
     * the replica's answer: not the bytes the gateway adds to it), and
     * the output by what the request allowed (request_output_bound): the
     * hold's bounds (held_output). */
    int64_t in = c->usage.input_tokens < (int64_t)c->client_len ? c->usage.input_tokens : (int64_t)c->client_len;
    int64_t sent = c->delivered_bytes + c->drained_bytes;
    if (sent > received)
        sent = received;
    int64_t out = c->usage.output_tokens < sent ? c->usage.output_tokens : sent;
    if (c->output_bound >= 0 && out > c->output_bound)
        out = c->output_bound;
    int status = c->status_sent > 0 ? c->status_sent : 502;
    if (status < 400)
        within_hold(c, &in, &out, &up);
    /* The prices the call was admitted with: gpurentd charges each no
     * more than this, whatever the app's price is when the record lands. */
    json_t *prices = json_pack("{s:I, s:I, s:I, s:I}", "request", (json_int_t)c->app.price_request, "input_1k",
                               (json_int_t)c->app.price_input_1k, "output_1k", (json_int_t)c->app.price_output_1k,
                               "second", (json_int_t)c->app.price_second);
    if (!prices)
        return NULL;
    return json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "id", c->record_id, "app_id",
                     c->app.app_id, "user_id", c->app.user_id, "key_id", c->app.key_id, "at", (json_int_t)clock_wall(),
                     "status", (json_int_t)status, "input_tokens", (json_int_t)in, "output_tokens", (json_int_t)out,
                     "duration_ms", (json_int_t)up, "cold_start", (json_int_t)c->cold_start, "completed",
                     (json_int_t)completed, "prices", prices);
}

/* The admitted call leaves the consumer's calls in flight, once. */
static void release_consumer(struct call *c)
{
    if (c->admitted && !c->released) {
        c->released = 1;
        gw_consumer_release(&c->app);
    }
}

/* The record's cost joins what admission takes off the consumer's funds in
 * the same step as the call leaves their calls in flight (gw_usage_add):
 * the client may send its next call as soon as the last bytes arrive, and
 * that call must see this one's cost once, not twice. */
static void record_usage(struct call *c)
{
    json_t *r = usage_record(c, c->delivered_all);
    if (!r) {
        release_consumer(c);
        return;
    }
    struct gw_call_app *release = c->admitted && !c->released ? &c->app : NULL;
    c->released = c->released || release;
    gw_usage_add(r, release);
}

/* After answer bytes went out: the call's progress, at its first bytes
 * unless the whole answer is in hand (more: some is still to come), then
 * every GW_PROGRESS_MS (see the top of this file). */
static void note_progress(struct call *c, int more)
{
    int64_t now = clock_mono_ms();
    if (!c->counted || c->recorded)
        return;
    if (c->progress_ms ? now - c->progress_ms < GW_PROGRESS_MS : !more)
        return;
    c->progress_ms = now;
    json_t *r = usage_record(c, 0);
    if (r)
        gw_journal_progress(r);
    json_decref(r);
}

/* Logs, once per app (of the first GW_NO_USAGE_APPS), that an answer too
 * big to keep had no usage in its end, so went uncharged for tokens: the
 * publisher's server should put `usage` last. */
#define GW_NO_USAGE_APPS 256
static void log_no_usage_once(const char *app_id)
{
    static pthread_mutex_t logged_lock = PTHREAD_MUTEX_INITIALIZER;
    static char logged[GW_NO_USAGE_APPS][ID_MAX];
    static int n_logged;
    pthread_mutex_lock(&logged_lock);
    int seen = 0;
    for (int i = 0; i < n_logged && !seen; i++)
        seen = strcmp(logged[i], app_id) == 0;
    if (!seen && n_logged < GW_NO_USAGE_APPS) {
        snprintf(logged[n_logged++], ID_MAX, "%s", app_id);
        log_warn("gateway: app %s answered over %u MiB without a `usage` in its last %u KiB: no tokens charged"
                 " (logged once per app)", app_id, GW_KEEP_MAX >> 20, GW_TAIL_KEEP >> 10);
    }
    pthread_mutex_unlock(&logged_lock);
}

/* Records the call's usage once, from what was delivered (or read on for
 * a client that left): a whole JSON answer's `usage` is read here, the
 * stream's as it went. Called from the connection's thread, or for a call
 * read on after its client left from the upstream thread at its end (the
 * record's fdatasync then holds that thread: the price of a client leaving
 * mid-answer, which its funds pay for). */
static void finish_usage(struct call *c)
{
    if (!c->counted || c->recorded)
        return;
    c->recorded = 1;
    /* Whole: delivered, or read to the upstream's good end after the client left. */
    int whole = c->delivered_all || (c->draining && c->finished && c->curl_rc == CURLE_OK);
    /* A whole JSON answer's usage is read now; no usage in the end of one
     * too big to keep: no tokens charged (never an estimate). */
    if (whole && gw_usage_finish(&c->usage) < 0)
        log_no_usage_once(c->app.app_id);
    record_usage(c);
}

/* A gateway's own error answer to an admitted call: its record on disk
 * first, then the answer. */
static enum MHD_Result reply_counted_error(struct MHD_Connection *conn, struct call *c, unsigned status,
                                           const char *code, const char *field, const char *msg,
                                           int64_t retry_after)
{
    c->status_sent = (int)status;
    finish_usage(c);
    return reply_error(conn, c, status, code, field, msg, retry_after);
}

/* Appends the query arguments (libmicrohttpd hands the path without them)
 * to c->url, each escaped again; -1 when they do not fit. */
struct query_ctx {
    struct call *c;
    int n, overflow;
};

static enum MHD_Result add_arg(void *vq, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    struct query_ctx *q = vq;
    char *k = curl_easy_escape(NULL, key, 0), *v = value ? curl_easy_escape(NULL, value, 0) : NULL;
    size_t used = strlen(q->c->url);
    int n = k ? snprintf(q->c->url + used, sizeof q->c->url - used, "%c%s%s%s", q->n++ ? '&' : '?', k, v ? "=" : "",
                         v ? v : "")
              : -1;
    if (n < 0 || (size_t)n >= sizeof q->c->url - used)
        q->overflow = 1;
    curl_free(k);
    curl_free(v);
    return q->overflow ? MHD_NO : MHD_YES;
}

/* No replica became ready for the call in the time it could wait. */
static enum MHD_Result reply_no_replica(struct MHD_Connection *conn, struct call *c, const char *url)
{
    char msg[256];
    const char *rest = url + 6, *slash = strchr(rest, '/');
    int sl = slash ? (int)(slash - rest) : (int)strlen(rest);
    snprintf(msg, sizeof msg, "no replica of %.*s became ready within %lld s; retry", sl > 40 ? 40 : sl, rest,
             (long long)c->wait_s);
    return reply_counted_error(conn, c, 503, "no_replica", NULL, msg, 5);
}

/* The answer has begun (or the upstream failed first): queued as it comes. */
static enum MHD_Result respond(struct MHD_Connection *conn, struct call *c)
{
    pthread_mutex_lock(&c->lock);
    /* A withheld answer is begun only once its funds are settled. */
    if (c->withheld && suspend(c)) {
        pthread_mutex_unlock(&c->lock);
        return MHD_YES;
    }
    int got = c->headers_done;
    long up_status = c->status;
    CURLcode rc = c->curl_rc;
    int unfunded = c->funds_out && (c->body_received == 0 || c->dropped_whole);
    int dropped = c->dropped_whole && !c->funds_out; /* withheld, and its upstream failed */
    char type[128], etag[128];
    snprintf(type, sizeof type, "%s", c->up_type);
    snprintf(etag, sizeof etag, "%s", c->up_etag);
    pthread_mutex_unlock(&c->lock);
    if (unfunded)
        return reply_counted_error(conn, c, 402, "insufficient_funds", NULL,
                                   "your funds, less what your other calls hold, do not cover this call; top up first",
                                   0);
    if (dropped)
        return reply_counted_error(conn, c, 502, "bad_gateway", NULL,
                                   "the replica's answer ended before it was whole", 0);
    if (!got && ending)
        return reply_counted_error(conn, c, 503, "unavailable", NULL, "the gateway is stopping; retry", 1);
    if (!got && rc == CURLE_OPERATION_TIMEDOUT)
        return reply_counted_error(conn, c, 504, "gateway_timeout", NULL, "the replica did not answer in time", 0);
    if (!got)
        return reply_counted_error(conn, c, 502, "bad_gateway", NULL, "the replica did not answer", 0);
    c->usage.streamed = strncasecmp(type, "text/event-stream", 17) == 0;
    c->status_sent = (int)up_status;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, answer_read, c, NULL);
    if (!r)
        return MHD_NO;
    /* An answer with no body (to a HEAD, or a 304) goes unchunked and the
     * connection closes after it: libmicrohttpd would otherwise send the
     * empty last chunk of a body it must not have, bytes the client would
     * read as the start of its next answer. */
    if (strcmp(c->method, "HEAD") == 0 || up_status == 304)
        MHD_set_response_options(r, MHD_RF_HTTP_1_0_COMPATIBLE_STRICT, MHD_RO_END);
    if (type[0])
        MHD_add_response_header(r, "Content-Type", type);
    if (etag[0])
        MHD_add_response_header(r, "ETag", etag);
    if (c->usage.streamed)
        MHD_add_response_header(r, "Cache-Control", "no-cache");
    allow_origins(r);
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)up_status, r);
    MHD_destroy_response(r);
    return ok;
}

/* The call has its replica: the upstream thread starts, and the connection
 * waits (suspended) for the answer to begin. */
/* Appends path (decoded, as libmicrohttpd gives it) to out, encoded again
 * as RFC 3986 allows in a path: a space, a CR or LF, a '?' or '#' the
 * client sent encoded reach the replica encoded, not as a broken URL or a
 * query. -1 if it does not fit. */
static int append_path(char *out, size_t cap, const char *path)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(out);
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                    strchr("-._~!$&'()*+,;=:@/", *p);
        if (n + (plain ? 1 : 3) >= cap)
            return -1;
        if (plain) {
            out[n++] = (char)*p;
        } else {
            out[n++] = '%';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        }
    }
    out[n] = '\0';
    return 0;
}

static enum MHD_Result start_upstream(struct MHD_Connection *conn, struct call *c, const char *url)
{
    const char *slash = strchr(url + 6, '/'); /* the path after "/apps/{slug}" */
    char base[sizeof c->url];
    memcpy(base, c->url, sizeof base);
    if (append_path(c->url, sizeof c->url, slash ? slash : "/") < 0)
        return reply_counted_error(conn, c, 414, "uri_too_long", NULL, "the path is too long", 0);
    struct query_ctx q = {.c = c};
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, add_arg, &q);
    if (q.overflow)
        return reply_counted_error(conn, c, 414, "uri_too_long", NULL, "the path and query are too long", 0);
    snprintf(c->path_query, sizeof c->path_query, "%s", c->url + strlen(base));
    const char *inm = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "If-None-Match");
    snprintf(c->if_none_match, sizeof c->if_none_match, "%s", inm && strlen(inm) < sizeof c->if_none_match ? inm : "");
    if (up_ready() < 0)
        return reply_counted_error(conn, c, 500, "internal", NULL, "cannot start the upstream call", 0);
    c->upstream_ms = clock_mono_ms();
    c->phase = P_WAIT_HEADERS;
    /* Suspended before the upstream thread can answer, so that its wake()
     * finds the connection suspended. */
    pthread_mutex_lock(&c->lock);
    int wait = suspend(c);
    if (wait) {
        c->has_upstream = 1;
        c->refs++; /* the upstream's, until up_end */
    }
    pthread_mutex_unlock(&c->lock);
    if (!wait)
        return respond(conn, c);
    up_enqueue(c);
    return MHD_YES;
}

/* The key, the app, the limits and the funds, checked as soon as the
 * request's headers are in and before a byte of its body is read: a body
 * is buffered (up to GW_BODY_MAX) only for a call that may be made, so
 * connections without a valid key cost no more than their headers. 0 with
 * c->app filled, or an error answer was queued (*r): libmicrohttpd then
 * reads no body and closes the connection after the answer. */
static int admit_headers(struct MHD_Connection *conn, struct call *c, const char *url, enum MHD_Result *r)
{
    const char *rest = url + 6; /* after "/apps/" */
    const char *slash = strchr(rest, '/');
    char slug[64];
    size_t sl = slash ? (size_t)(slash - rest) : strlen(rest);
    if (sl == 0 || sl >= sizeof slug)
        return *r = reply_error(conn, c, 404, "not_found", NULL, "no such app", 0), -1;
    snprintf(slug, sizeof slug, "%.*s", (int)sl, rest);
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    const char *token = auth && strncasecmp(auth, "Bearer ", 7) == 0 ? auth + 7 : NULL;
    char msg[256];
    int64_t retry = 0;
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    int64_t announced = cl ? (int64_t)strtoull(cl, NULL, 10) : -1;
    int status = gw_admit(token, slug, announced > GW_BODY_MAX ? -1 : announced, &c->app, &retry, msg, sizeof msg);
    if (status) {
        static const char *const codes[][2] = {{"401", "unauthorized"}, {"402", "insufficient_funds"},
                                               {"404", "not_found"},    {"429", "too_many_requests"},
                                               {"503", "unavailable"}};
        const char *code = "error";
        char s[8];
        snprintf(s, sizeof s, "%d", status);
        for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
            if (strcmp(codes[i][0], s) == 0)
                code = codes[i][1];
        return *r = reply_error(conn, c, (unsigned)status, code, NULL, msg, retry), -1;
    }
    c->admitted = 1; /* counted in flight for its consumer until recorded */
    /* A body announced over the bound is refused before it is read too. */
    if (cl && strtoull(cl, NULL, 10) > GW_BODY_MAX)
        return *r = reply_error(conn, c, 413, "body_too_large", NULL, "the request body is over 8 MiB", 0), -1;
    return 0;
}

/* A whole request of an admitted call: a replica now or (suspended) once
 * one is ready. */
static enum MHD_Result admit(struct MHD_Connection *conn, struct call *c, const char *url)
{
    if (c->too_large)
        return reply_error(conn, c, 413, "body_too_large", NULL, "the request body is over 8 MiB", 0);
    gw_app_count(c->app.app_id, 1, 0);
    c->counted = 1;
    const char *path = strchr(url + 6, '/'); /* after "/apps/{slug}" */
    if (path && dot_segment(path))
        return reply_counted_error(conn, c, 400, "invalid_path", NULL,
                                   "a path with a . or .. segment is not passed on", 0);
    c->client_len = c->body_len;
    /* A body longer than announced (or sent chunked) holds its input now:
     * a token a byte if the funds allow, else the estimate (hold_covers). */
    c->app.input_held = (int64_t)c->client_len;
    if (!hold_covers(c, GW_HOLD_GRAIN_TOKENS, GW_HOLD_GRAIN_MS))
        return reply_counted_error(conn, c, 402, "insufficient_funds", NULL,
                                   "your funds, less what your other calls hold, do not cover this call's input;"
                                   " top up first",
                                   0);
    const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
    snprintf(c->content_type, sizeof c->content_type, "%s", ct ? ct : "");
    const char *encoding = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Encoding");
    struct refusal why;
    if (ask_stream_usage(c, path ? path : "/", ct, encoding, &why) < 0)
        return reply_counted_error(conn, c, why.status, why.code, why.field, why.msg, 0);
    int64_t wait_s = gw_opts.cold_start_s;
    const char *w = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Gpurent-Wait-Seconds");
    if (w) {
        char *end;
        long v = strtol(w, &end, 10);
        if (*end || v < 0 || end == w)
            return reply_counted_error(conn, c, 400, "invalid_header", "X-Gpurent-Wait-Seconds",
                                       "X-Gpurent-Wait-Seconds must be a whole number", 0);
        if (v < wait_s)
            wait_s = v;
    }
    if (stopping)
        return reply_counted_error(conn, c, 503, "unavailable", NULL, "the gateway is stopping; retry", 1);
    if (take_replica(c) == 0)
        return start_upstream(conn, c, url);
    c->wait_s = wait_s;
    c->wait_until_ms = clock_mono_ms() + wait_s * 1000;
    if (wait_s > 0 && wait_for_replica(c) == 0)
        return MHD_YES;
    return reply_no_replica(conn, c, url);
}

enum MHD_Result gw_handle(struct MHD_Connection *conn, const char *url, const char *method, const char *upload,
                          size_t *upload_size, void **con_cls)
{
    struct call *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c)
            return MHD_NO;
        pthread_mutex_init(&c->lock, NULL);
        c->refs = 1; /* the connection's, until gw_completed */
        c->output_bound = -1; /* until a completion's body says otherwise */
        c->conn = conn;
        c->start_ms = clock_mono_ms();
        snprintf(c->method, sizeof c->method, "%s", method);
        c->app_call = strncmp(url, "/apps/", 6) == 0;
        if (c->app_call)
            app_calls_live++;
        live_add(c);
        *con_cls = c;
        if (c->app_call && strcmp(method, "OPTIONS") == 0 &&
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Access-Control-Request-Method"))
            return reply_preflight(conn, c);
        if (!c->app_call)
            return reply_other(conn, c, url, method);
        enum MHD_Result r;
        if (admit_headers(conn, c, url, &r) < 0)
            return r;
        return MHD_YES;
    }
    if (*upload_size) {
        /* Only an admitted call's body is kept; any other was answered at
         * its headers, and what more comes is dropped. */
        if (!c->admitted) {
            /* dropped */
        } else if (c->body_len + *upload_size > GW_BODY_MAX) {
            c->too_large = 1;
        } else {
            char *grown = realloc(c->body, c->body_len + *upload_size + 1);
            if (!grown)
                return MHD_NO;
            memcpy(grown + c->body_len, upload, *upload_size);
            c->body = grown;
            c->body_len += *upload_size;
            c->body[c->body_len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* Called again after a resume: on with what the call waited for. */
    switch (c->phase) {
    case P_START:
        return start_upstream(conn, c, url);
    case P_NO_REPLICA:
        return reply_no_replica(conn, c, url);
    case P_STOPPED:
        return reply_counted_error(conn, c, 503, "unavailable", NULL, "the gateway is stopping; retry", 1);
    case P_WAIT_HEADERS:
        return respond(conn, c);
    default:
        break;
    }
    if (!c->admitted) /* refused at its headers (admit_headers) */
        return reply_error(conn, c, 404, "not_found", NULL, "calls go to /apps/{slug}/…", 0);
    return admit(conn, c, url);
}

/* An answer the gateway ended with an error (a stream cut: its replica
 * died, its time or its consumer's funds ran out) must reach its client
 * as a closed connection at once, for that is all that tells it the answer
 * is not whole. libmicrohttpd closes the socket of a connection it ended
 * so only the next time its thread wakes, which for a thread with no other
 * connection busy may be minutes away: the client would wait on a stream
 * that will never go on. Shutting the socket down here sends the FIN now;
 * the descriptor stays libmicrohttpd's to close. */
static void end_socket(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info)
        shutdown(info->connect_fd, SHUT_RDWR);
}

void gw_completed(void **con_cls, enum MHD_RequestTerminationCode toe)
{
    struct call *c = *con_cls;
    *con_cls = NULL;
    if (!c)
        return;
    if (toe == MHD_REQUEST_TERMINATED_WITH_ERROR)
        end_socket(c->conn);
    pthread_mutex_lock(&c->lock);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        c->delivered_all = 0;
    c->client_gone = 1;
    int upstream = c->has_upstream && !c->finished;
    /* A client that left an answer under way (a replica's, not an error):
     * what came for it and was not delivered is read for its usage, and an
     * upstream still going is read on (up_body) until its end or
     * GW_DRAIN_MS, then recorded (up_end). Not when the gateway itself cut
     * the answer, stopping: that is not the client's doing. */
    int drain = 0;
    if (!c->delivered_all && c->counted && !c->recorded && c->status_sent > 0 && c->status_sent < 400 && !ending) {
        c->draining = 1;
        drain_out(c);
        drain = upstream;
        c->drain_until_ms = clock_mono_ms() + GW_DRAIN_MS;
        if (c->up_paused) {
            c->up_paused = 0;
            paused_upstreams--;
            c->resume_drain = 1;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (upstream)
        up_enqueue(c); /* to stop it, or read it on */
    if (c->counted)
        gw_app_count(c->app.app_id, -1, 0);
    if (!drain) {
        /* Recorded now, for what it got (or what came for it). */
        finish_usage(c);
        release_consumer(c);
    }
    if (c->app_call) {
        gw_metrics_call(c->status_sent, clock_mono_ms() - c->start_ms);
        app_calls_live--;
    }
    live_remove(c);
    call_unref(c);
}
