/* model_server.c: `gpurent-agent sim-model-server`, a small OpenAI-compatible
 * server the sim runtime runs as an app replica's command (issue 17), so
 * the marketplace, the gateway and the scaler run without GPUs. POST
 * /v1/chat/completions and /v1/completions echo the input word by word,
 * each output word ("token") after --token-ms, with `usage` counts; a
 * `max_tokens` cuts the echo short or, above the input's length, repeats
 * the input until it is reached (up to MODEL_TOKENS_MAX), as a model
 * generating up to its limit would; with
 * "stream": true the words go out as server-sent events in OpenAI's chunk
 * shape, each chunk carrying the usage so far (as vLLM's continuous usage
 * stats do), the last one an empty delta and the totals, then
 * "data: [DONE]". An input holding "__fail__" answers
 * 500 (an upstream error) after the first-token delay. GET /health answers
 * 200 once listening. With --unwell-file PATH (relative: to the sim
 * container's directory, its working directory), once PATH exists the
 * server turns unwell for good: /health answers 503 and it stops listening
 * (calls in flight finish), so the agent's health check of this replica
 * fails even though another replica listens on the same port. Sim
 * replicas share this machine's network, so two replicas of one app on one
 * node both listen on the app's port (a container runtime gives each its
 * own network): each binds a loopback address of its own, derived from its
 * GPURENT_WORKLOAD, and the agent connects to the address the workload's
 * socket is bound to (listening.c). Started by hand, without that
 * variable, it listens on every address. */
#include "agent.h"

#include <jansson.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MODEL_BODY_MAX (1 << 20)
#define MODEL_WORDS_MAX 4096
#define MODEL_TOKENS_MAX 100000

struct model_opts {
    int port;
    long token_ms;       /* per output word */
    long first_token_ms; /* before the first */
    const char *unwell_file; /* once it exists: unwell (see above); NULL never */
};
static struct model_opts opts = {.port = 8000, .token_ms = 5, .first_token_ms = 20};
static volatile sig_atomic_t stopping;
static volatile sig_atomic_t unwell; /* set once by the main loop, read by connection threads */

static void sleep_ms(long ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && !stopping) {
    }
}

struct body {
    char *data;
    size_t len;
    int too_large;
};

/* A streamed answer: the words to send and how far it got. */
struct stream {
    char *words[MODEL_WORDS_MAX];
    int nwords;             /* in words */
    int n, sent, done_sent, chat; /* n: the tokens to send */
    long input_tokens;
    char pending[1024]; /* the event being written */
    size_t plen, poff;
};

static long count_words(const char *s)
{
    long n = 0;
    for (int in = 0; *s; s++) {
        int space = *s == ' ' || *s == '\n' || *s == '\t';
        n += !space && !in;
        in = !space;
    }
    return n ? n : 1;
}

/* The text a request asks to be echoed: the last message or the prompt. */
static const char *input_text(json_t *req, int chat)
{
    if (!chat)
        return json_string_value(json_object_get(req, "prompt"));
    json_t *msgs = json_object_get(req, "messages");
    json_t *last = json_array_get(msgs, json_array_size(msgs) ? json_array_size(msgs) - 1 : 0);
    return json_string_value(json_object_get(last, "content"));
}

static int split_words(const char *text, char **words, long max)
{
    int n = 0;
    const char *p = text;
    while (*p && n < max) {
        while (*p == ' ' || *p == '\n' || *p == '\t')
            p++;
        const char *e = p;
        while (*e && *e != ' ' && *e != '\n' && *e != '\t')
            e++;
        if (e > p)
            words[n++] = strndup(p, (size_t)(e - p));
        p = e;
    }
    return n;
}

static json_t *usage_json(long in, long out)
{
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)in, "completion_tokens", (json_int_t)out,
                     "total_tokens", (json_int_t)(in + out));
}

/* A completion or one streamed chunk of it, in OpenAI's shape: id,
 * object, created, model, choices (one, taken) and usage (taken). */
static json_t *completion_json(int chat, int chunk, json_t *choice, json_t *usage)
{
    const char *object = chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", "cmpl-sim", "object", object, "created",
                     (json_int_t)time(NULL), "model", "sim-echo", "choices", choice, "usage", usage);
}

static void set_event(struct stream *st, json_t *chunk)
{
    char *text = json_dumps(chunk, JSON_COMPACT);
    json_decref(chunk);
    st->plen = (size_t)snprintf(st->pending, sizeof st->pending, "data: %s\n\n", text ? text : "{}");
    if (st->plen >= sizeof st->pending)
        st->plen = sizeof st->pending - 1;
    st->poff = 0;
    free(text);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream *st = cls;
    if (st->poff >= st->plen) {
        if (st->done_sent)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (st->sent < st->n) {
            sleep_ms(st->sent == 0 ? opts.first_token_ms : opts.token_ms);
            char piece[600];
            snprintf(piece, sizeof piece, "%s%s", st->sent ? " " : "", st->words[st->sent % st->nwords]);
            st->sent++;
            /* The first chat delta names the role, as OpenAI's does. */
            json_t *choice = st->chat ? json_pack("{s:i, s:{s:s, s:s*}, s:n}", "index", 0, "delta", "content", piece,
                                                  "role", st->sent == 1 ? "assistant" : NULL, "finish_reason")
                                      : json_pack("{s:i, s:s, s:n}", "index", 0, "text", piece, "finish_reason");
            set_event(st, completion_json(st->chat, 1, choice, usage_json(st->input_tokens, st->sent)));
        } else {
            /* The last chunk: an empty delta (or text) and the reason, so a
             * client reading every chunk's delta finds one here too. */
            json_t *choice = st->chat ? json_pack("{s:i, s:{}, s:s}", "index", 0, "delta", "finish_reason", "stop")
                                      : json_pack("{s:i, s:s, s:s}", "index", 0, "text", "", "finish_reason", "stop");
            set_event(st, completion_json(st->chat, 1, choice, usage_json(st->input_tokens, st->n)));
            st->plen = (size_t)snprintf(st->pending + st->plen, sizeof st->pending - st->plen, "data: [DONE]\n\n") +
                       st->plen;
            st->done_sent = 1;
        }
    }
    size_t n = st->plen - st->poff < max ? st->plen - st->poff : max;
    memcpy(buf, st->pending + st->poff, n);
    st->poff += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    for (int i = 0; i < st->nwords; i++)
        free(st->words[i]);
    free(st);
}

/* Every answer names the workload that made it, so a test can tell which
 * replica served a call. */
static void name_workload(struct MHD_Response *r)
{
    const char *wl = getenv("GPURENT_WORKLOAD");
    if (wl && wl[0])
        MHD_add_response_header(r, "X-Sim-Workload", wl);
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    name_workload(r);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result complete(struct MHD_Connection *c, const char *url, struct body *b)
{
    int chat = strcmp(url, "/v1/chat/completions") == 0;
    json_t *req = b->too_large ? NULL : json_loadb(b->data ? b->data : "", b->len, 0, NULL);
    const char *text = req ? input_text(req, chat) : NULL;
    if (!text) {
        json_decref(req);
        return reply_json(c, 400, json_pack("{s:{s:s, s:s}}", "error", "message",
                                            chat ? "messages[-1].content is required" : "prompt is required", "type",
                                            "invalid_request_error"));
    }
    if (strstr(text, "__fail__")) {
        json_decref(req);
        sleep_ms(opts.first_token_ms);
        return reply_json(c, 500, json_pack("{s:{s:s, s:s}}", "error", "message", "simulated upstream failure", "type",
                                            "server_error"));
    }
    struct stream *st = calloc(1, sizeof *st);
    json_int_t max_tokens = json_integer_value(json_object_get(req, "max_tokens"));
    st->chat = chat;
    st->input_tokens = count_words(text);
    st->nwords = split_words(text, st->words, MODEL_WORDS_MAX);
    st->n = max_tokens > 0 && st->nwords > 0 ? (int)(max_tokens < MODEL_TOKENS_MAX ? max_tokens : MODEL_TOKENS_MAX)
                                             : st->nwords;
    int streamed = json_is_true(json_object_get(req, "stream"));
    json_decref(req);
    if (streamed) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, stream_read, st, stream_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        name_workload(r);
        enum MHD_Result ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ok;
    }
    sleep_ms(opts.first_token_ms + opts.token_ms * (st->n > 0 ? st->n - 1 : 0));
    size_t len = 0;
    for (int i = 0; i < st->n; i++)
        len += strlen(st->words[i % st->nwords]) + 1;
    char *out = calloc(1, len + 1), *end = out;
    for (int i = 0; out && i < st->n; i++)
        end += sprintf(end, "%s%s", i ? " " : "", st->words[i % st->nwords]);
    json_t *choice = chat ? json_pack("{s:i, s:{s:s, s:s}, s:s}", "index", 0, "message", "role", "assistant", "content",
                                      out, "finish_reason", "stop")
                          : json_pack("{s:i, s:s, s:s}", "index", 0, "text", out, "finish_reason", "stop");
    json_t *j = completion_json(chat, 0, choice, usage_json(st->input_tokens, st->n));
    free(out);
    stream_free(st);
    return reply_json(c, 200, j);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    struct body *b = *con_cls;
    if (!b) {
        *con_cls = calloc(1, sizeof *b);
        return *con_cls ? MHD_YES : MHD_NO;
    }
    if (*upload_size) {
        if (b->len + *upload_size > MODEL_BODY_MAX) {
            b->too_large = 1;
        } else {
            char *grown = realloc(b->data, b->len + *upload_size + 1);
            if (!grown)
                return MHD_NO;
            memcpy(grown + b->len, upload, *upload_size);
            b->data = grown;
            b->len += *upload_size;
            b->data[b->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "GET") == 0 && strcmp(url, "/health") == 0)
        return unwell ? reply_json(c, 503, json_pack("{s:s}", "status", "unwell"))
                      : reply_json(c, 200, json_pack("{s:s}", "status", "ok"));
    if (strcmp(method, "GET") == 0 && strcmp(url, "/v1/models") == 0)
        return reply_json(c, 200, json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id",
                                            "sim-echo", "object", "model", "created", (json_int_t)time(NULL),
                                            "owned_by", "gpurent"));
    if (strcmp(method, "POST") == 0 &&
        (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/v1/completions") == 0))
        return complete(c, url, b);
    return reply_json(c, 404, json_pack("{s:{s:s}}", "error", "message", "no such route"));
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    struct body *b = *con_cls;
    if (b)
        free(b->data);
    free(b);
    *con_cls = NULL;
}

/* Small replies go out at once (no Nagle wait for the client's delayed ACK). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    (void)cls;
    (void)socket_context;
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int one = 1;
    if (code == MHD_CONNECTION_NOTIFY_STARTED && info)
        setsockopt(info->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* 127.A.B.C from the workload's id (A and C 1..254, so never 127.0.0.1;
 * two workloads share one in about 16 million), or INADDR_ANY without
 * one. Host order. */
static uint32_t workload_loopback(const char *wl_id)
{
    if (!wl_id || !wl_id[0])
        return INADDR_ANY;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)wl_id; *p; p++)
        h = (h ^ *p) * 16777619u;
    return 127u << 24 | (1 + (h >> 16) % 254) << 16 | ((h >> 8) & 255) << 8 | (1 + h % 254);
}

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

int agent_cmd_model_server(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--port") == 0 && v)
            opts.port = atoi(argv[++i]);
        else if (strcmp(argv[i], "--token-ms") == 0 && v)
            opts.token_ms = atol(argv[++i]);
        else if (strcmp(argv[i], "--first-token-ms") == 0 && v)
            opts.first_token_ms = atol(argv[++i]);
        else if (strcmp(argv[i], "--unwell-file") == 0 && v && v[0])
            opts.unwell_file = argv[++i];
        else {
            fprintf(stderr, "usage: gpurent-agent sim-model-server [--port N] [--token-ms MS] [--first-token-ms MS]"
                            " [--unwell-file PATH]\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    if (opts.port < 1 || opts.port > 65535 || opts.token_ms < 0 || opts.first_token_ms < 0) {
        fprintf(stderr, "sim-model-server: --port must be 1..65535 and the delays >= 0\n");
        return 2;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)opts.port)};
    sa.sin_addr.s_addr = htonl(workload_loopback(getenv("GPURENT_WORKLOAD")));
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC,
        (uint16_t)opts.port, NULL, NULL, on_request, NULL, MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)120, MHD_OPTION_END);
    char addr[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, addr, sizeof addr);
    if (!d) {
        fprintf(stderr, "sim-model-server: cannot listen on %s:%d\n", addr, opts.port);
        return 1;
    }
    printf("sim-model-server listening on %s:%d\n", addr, opts.port);
    fflush(stdout);
    while (!stopping) {
        if (!opts.unwell_file) {
            pause();
            continue;
        }
        if (!unwell && access(opts.unwell_file, F_OK) == 0) {
            unwell = 1;
            /* No new connections: the agent sees nothing of this workload
             * listening on the port. */
            MHD_socket fd = MHD_quiesce_daemon(d);
            if (fd != MHD_INVALID_SOCKET)
                close(fd);
            printf("sim-model-server: %s exists: unwell, no longer listening\n", opts.unwell_file);
            fflush(stdout);
        }
        sleep_ms(100);
    }
    MHD_stop_daemon(d);
    return 0;
}
