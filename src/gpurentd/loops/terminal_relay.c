/* terminal_relay.c: the web terminal's relay. One thread and one poll()
 * loop carry every open terminal between the browser's WebSocket (RFC
 * 6455, framed by wslay) and the node agent's terminal stream
 * (docs/AGENT_PROTOCOL.md, "Terminal"), so an open terminal holds a
 * connection but no HTTP pool thread. The agent connection is made here,
 * not in the handler, without blocking: a dead node costs its own terminal
 * a close frame, never the others a stall.
 *
 * Browser to agent: binary messages are terminal bytes ('d' frames), a text
 * message {"type":"resize","cols":C,"rows":R} a resize ('r'). Agent to
 * browser: 'd' frames as binary messages; the shell's end ('x') as a close
 * with code 1000 and reason "exit N", once the output before it has gone.
 * Pings are answered by wslay; a message over TERM_WS_MAX is closed with
 * 1009, a malformed frame with 1002 (the headers wslay would close on
 * without a code are found first, ws_frames.h).
 * A browser silent for terminal_ping_s is pinged, so a reverse proxy's read
 * timeout never cuts an idle terminal; one silent three times as long, its
 * pongs too, is gone without a FIN (its network dropped) and its terminal
 * is freed, or it held a slot of max_terminals_per_user for ever. A close
 * (ours or wslay's) the browser does not take and answer within
 * TERM_CLOSE_GRACE_MS drops the connection, even while it waits behind
 * output the browser leaves unread. A terminal ends (1008) with the
 * authority of the API key that opened it (check_keys). */
#include "gpurent/clock.h"
#include "gpurent/log.h"
#include "gpurent/secrets.h"
#include "gpurent/sign.h"
#include "gpurent/term_frame.h"
#include "gpurent/ws_frames.h"
#include "loops/loops.h"
#include "store/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <wslay/wslay.h>

#define TERM_WS_MAX 65536            /* largest message from a browser */
#define TERM_HIGH (256 * 1024)       /* bytes queued one way before the other side is read no more */
#define TERM_CLOSE_GRACE_MS 2000     /* a close queued waits this long to be sent and answered */
#define TERM_WS_QUEUED_MAX (2 * TERM_HIGH) /* bytes queued for the browser before it is read no more */
#define TERM_WS_QUEUED_MSGS 4096     /* messages queued for the browser before it is read no more */

enum agent_state { AG_CONNECTING, AG_REQUEST, AG_RESPONSE, AG_OPEN, AG_GONE };

struct term {
    struct http_upgraded *up;         /* the browser's connection, handed back at the end */
    int ws_fd;
    wslay_event_context_ptr ws;
    int ws_dead;                      /* its socket failed or closed */
    int draining;                     /* our close is sent, the browser's bytes are read and dropped */
    struct ws_frames frames;          /* the browser's frame headers, checked before wslay reads them */
    const char *bad_frame;            /* why the stream stopped at a forbidden header, NULL while none */
    int64_t close_sent_ms;            /* when our close went, 0 before */
    char exit_reason[32];             /* "exit N" once the shell ended, its close waiting for the output */
    int64_t heard_ms;                 /* when the browser last sent bytes (a pong counts) */
    int64_t pinged_ms;                /* when we last pinged it, 0 before */
    int agent_fd;                     /* -1 when none */
    enum agent_state agent;
    int64_t agent_deadline_ms;        /* connect and switch by then */
    char request[2048];               /* the signed switch request */
    size_t request_len, request_off;
    char response[4096];              /* the agent's reply head */
    size_t response_len;
    unsigned char ain[5 + TERM_FRAME_MAX]; /* an agent frame being read */
    size_t ain_len;
    unsigned char *to_agent;          /* frames for the agent */
    size_t to_agent_len, to_agent_cap;
    struct terminal_target target;
    struct term *next;
};

static struct {
    pthread_mutex_t lock;             /* guards what follows but open */
    pthread_t thread;
    int started;
    int stopping;
    int wake[2];
    struct term *incoming;            /* handed over by the upgrade callback */
    int64_t reserved;                 /* terminals reserved or open */
    struct user_count {
        char user_id[ID_MAX];
        int64_t n;
    } *users;                         /* reserved or open per user; n == 0 slots are free */
    size_t n_users;
    struct term *open;                /* the relay thread's alone */
} R = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = {-1, -1}};

/* ---------------------------------------------------------------- limits */

static struct user_count *user_slot(const char *user_id, int create)
{
    struct user_count *free_slot = NULL;
    for (size_t i = 0; i < R.n_users; i++) {
        if (R.users[i].n > 0 && strcmp(R.users[i].user_id, user_id) == 0)
            return &R.users[i];
        if (R.users[i].n == 0 && !free_slot)
            free_slot = &R.users[i];
    }
    if (!create)
        return NULL;
    if (!free_slot) {
        struct user_count *grown = realloc(R.users, (R.n_users + 16) * sizeof *grown);
        if (!grown)
            return NULL;
        memset(grown + R.n_users, 0, 16 * sizeof *grown);
        R.users = grown;
        free_slot = &R.users[R.n_users];
        R.n_users += 16;
    }
    snprintf(free_slot->user_id, sizeof free_slot->user_id, "%s", user_id);
    return free_slot;
}

int terminal_relay_reserve(const char *user_id)
{
    pthread_mutex_lock(&R.lock);
    int rc = 0;
    struct user_count *u = user_slot(user_id, 0);
    if (R.stopping || !R.started || R.reserved >= daemon_config->max_terminals)
        rc = -1;
    else if (u && u->n >= daemon_config->max_terminals_per_user)
        rc = -2;
    else if (!(u = user_slot(user_id, 1)))
        rc = -1;
    if (rc == 0) {
        u->n++;
        R.reserved++;
    }
    pthread_mutex_unlock(&R.lock);
    return rc;
}

void terminal_relay_release(const char *user_id)
{
    pthread_mutex_lock(&R.lock);
    struct user_count *u = user_slot(user_id, 0);
    if (u) {
        u->n--;
        R.reserved--;
    }
    pthread_mutex_unlock(&R.lock);
}

int64_t terminal_relay_open_count(void)
{
    pthread_mutex_lock(&R.lock);
    int64_t n = R.reserved;
    pthread_mutex_unlock(&R.lock);
    return n;
}

/* ---------------------------------------------------------------- the agent side */

/* The agent connection ends (the agent hangs up a shell still running). */
static void agent_end(struct term *t)
{
    if (t->agent_fd >= 0) {
        close(t->agent_fd);
        t->agent_fd = -1;
    }
    t->agent = AG_GONE;
}

/* Our close to the browser (once); the agent connection ends with it. */
static void ws_close(struct term *t, uint16_t code, const char *reason)
{
    if (!t->close_sent_ms) {
        wslay_event_queue_close(t->ws, code, (const uint8_t *)reason, strlen(reason));
        t->close_sent_ms = clock_mono_ms();
    }
    agent_end(t);
}

static void agent_fail(struct term *t, const char *why)
{
    log_warn("terminal: instance %s rank %lld on node %s: %s", t->target.instance_id, (long long)t->target.rank,
             t->target.node_name, why);
    char reason[120];
    snprintf(reason, sizeof reason, "node %.40s: %.60s", t->target.node_name, why);
    ws_close(t, WSLAY_CODE_INTERNAL_SERVER_ERROR, reason);
}

/* Host, port and path prefix of an http:// agent URL; -1 for https or
 * anything else. */
static int parse_agent_url(const char *url, char *host, size_t hostlen, char *port, size_t portlen, const char **path)
{
    if (strncmp(url, "http://", 7) != 0)
        return -1;
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    *path = slash ? slash : "";
    const char *colon = NULL;
    if (h[0] == '[') {
        const char *close_b = memchr(h, ']', hl);
        if (!close_b)
            return -1;
        if ((size_t)(close_b - h - 1) >= hostlen)
            return -1;
        snprintf(host, hostlen, "%.*s", (int)(close_b - h - 1), h + 1);
        colon = close_b + 1 < h + hl && close_b[1] == ':' ? close_b + 1 : NULL;
    } else {
        colon = memchr(h, ':', hl);
        size_t n = colon ? (size_t)(colon - h) : hl;
        if (n == 0 || n >= hostlen)
            return -1;
        snprintf(host, hostlen, "%.*s", (int)n, h);
    }
    if (colon)
        snprintf(port, portlen, "%.*s", (int)(h + hl - colon - 1), colon + 1);
    else
        snprintf(port, portlen, "80");
    return 0;
}

/* Starts the non-blocking connect and writes the signed request; -1 with
 * the terminal closed when it cannot. */
static int agent_connect(struct term *t)
{
    const struct terminal_target *g = &t->target;
    char host[256], port[16];
    const char *base_path;
    if (parse_agent_url(g->agent_url, host, sizeof host, port, sizeof port, &base_path) < 0) {
        agent_fail(t, "the web terminal reaches agents on http:// only");
        return -1;
    }
    size_t bl = strlen(base_path);
    while (bl > 0 && base_path[bl - 1] == '/')
        bl--;
    char path[1024];
    int n = snprintf(path, sizeof path, "%.*s/v1/workloads/%s/terminal?cols=%u&rows=%u", (int)bl, base_path,
                     g->workload_id, g->cols, g->rows);
    struct sign_headers sh;
    if (n < 0 || (size_t)n >= sizeof path || sign_request(g->secret, "GET", path, clock_wall(), NULL, 0, &sh) < 0) {
        agent_fail(t, "cannot sign the request");
        return -1;
    }
    n = snprintf(t->request, sizeof t->request,
                 "GET %s HTTP/1.1\r\nHost: %s:%s\r\nUpgrade: gpurent-terminal\r\nConnection: Upgrade\r\n"
                 "%s: %s\r\n%s: %s\r\n%s: %s\r\n\r\n",
                 path, host, port, SIGN_HDR_TIMESTAMP, sh.timestamp, SIGN_HDR_NONCE, sh.nonce, SIGN_HDR_SIGNATURE,
                 sh.signature);
    if (n < 0 || (size_t)n >= sizeof t->request) {
        agent_fail(t, "the request is too long");
        return -1;
    }
    t->request_len = (size_t)n;
    /* Agents are named by address in practice; a host name is resolved
     * here, which is the one wait this thread may do. */
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai) {
        agent_fail(t, "cannot resolve the agent's address");
        return -1;
    }
    t->agent_fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int rc = t->agent_fd < 0 ? -1 : connect(t->agent_fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (rc < 0 && errno != EINPROGRESS) {
        agent_fail(t, "cannot connect to the agent");
        return -1;
    }
    int one = 1;
    setsockopt(t->agent_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* keystrokes go at once */
    t->agent = AG_CONNECTING;
    t->agent_deadline_ms = clock_mono_ms() + daemon_config->agent_timeout_ms;
    return 0;
}

/* A whole frame from the agent. */
static void agent_frame(struct term *t, unsigned char type, const unsigned char *p, size_t len)
{
    if (type == TERM_FRAME_DATA) {
        struct wslay_event_msg m = {.opcode = WSLAY_BINARY_FRAME, .msg = p, .msg_length = len};
        if (len > 0 && !t->close_sent_ms)
            wslay_event_queue_msg(t->ws, &m);
    } else if (type == TERM_FRAME_EXIT && len == 4) {
        /* The close waits for the output queued before it (term_step):
         * wslay sends a close ahead of the messages queued, and none after. */
        snprintf(t->exit_reason, sizeof t->exit_reason, "exit %u", term_get_be32(p));
        log_info("terminal: instance %s rank %lld user %s: the shell ended (%s)", t->target.instance_id,
                 (long long)t->target.rank, t->target.user_id, t->exit_reason);
        agent_end(t);
    } else {
        agent_fail(t, "sent a frame that is not in the protocol");
    }
}

/* The agent's reply head: 101 opens the stream; anything else says why. */
static void agent_response(struct term *t)
{
    char *end = memmem(t->response, t->response_len, "\r\n\r\n", 4);
    if (!end) {
        if (t->response_len == sizeof t->response)
            agent_fail(t, "sent a reply head that is too long");
        return;
    }
    int status = 0;
    if (sscanf(t->response, "HTTP/1.%*d %d", &status) != 1 || status != 101) {
        char why[64];
        snprintf(why, sizeof why, "answered HTTP %d to the terminal request", status);
        agent_fail(t, status == 404 || status == 409 ? "the workload is not running there" : why);
        return;
    }
    size_t head = (size_t)(end + 4 - t->response), rest = t->response_len - head;
    t->agent = AG_OPEN;
    if (rest > sizeof t->ain) {
        agent_fail(t, "sent more than a frame with its switch");
        return;
    }
    memcpy(t->ain, t->response + head, rest);
    t->ain_len = rest;
}

/* Frames in t->ain, acted on while the browser's queue has room. */
static void agent_frames(struct term *t)
{
    while (t->agent == AG_OPEN && t->ain_len >= 5) {
        uint32_t len = term_get_be32(t->ain + 1);
        if (len > TERM_FRAME_MAX) {
            agent_fail(t, "sent a frame over 64 KiB");
            return;
        }
        if (t->ain_len < 5 + len)
            return;
        agent_frame(t, t->ain[0], t->ain + 5, len);
        memmove(t->ain, t->ain + 5 + len, t->ain_len - 5 - len);
        t->ain_len -= 5 + len;
    }
}

static void agent_io(struct term *t, short revents)
{
    if (t->agent == AG_CONNECTING && revents) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(t->agent_fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err) {
            agent_fail(t, strerror(err));
            return;
        }
        t->agent = AG_REQUEST;
    }
    if (t->agent == AG_REQUEST) {
        ssize_t n = send(t->agent_fd, t->request + t->request_off, t->request_len - t->request_off, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            agent_fail(t, strerror(errno));
            return;
        }
        if (n > 0 && (t->request_off += (size_t)n) == t->request_len)
            t->agent = AG_RESPONSE;
    }
    if (t->agent == AG_RESPONSE && (revents & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t n = recv(t->agent_fd, t->response + t->response_len, sizeof t->response - t->response_len, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            agent_fail(t, "closed the connection before switching to the terminal");
            return;
        }
        if (n > 0) {
            t->response_len += (size_t)n;
            agent_response(t);
        }
    }
    if (t->agent != AG_OPEN)
        return;
    while (t->to_agent_len > 0) {
        ssize_t n = send(t->agent_fd, t->to_agent, t->to_agent_len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                agent_fail(t, "the connection broke");
            break;
        }
        memmove(t->to_agent, t->to_agent + n, t->to_agent_len - (size_t)n);
        t->to_agent_len -= (size_t)n;
    }
    agent_frames(t);
    while (t->agent == AG_OPEN && (revents & (POLLIN | POLLHUP | POLLERR)) &&
           wslay_event_get_queued_msg_length(t->ws) < TERM_HIGH) {
        ssize_t n = recv(t->agent_fd, t->ain + t->ain_len, sizeof t->ain - t->ain_len, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            agent_frames(t);
            if (t->agent == AG_OPEN)
                agent_fail(t, "closed the terminal without the shell's end");
            return;
        }
        if (n < 0)
            return;
        t->ain_len += (size_t)n;
        agent_frames(t);
    }
}

/* ---------------------------------------------------------------- the browser side */

/* Whether the browser's bytes may be read now. Not while the agent's queue
 * is full, and not while the browser leaves unread what is queued for it:
 * wslay answers every ping with a pong queued in memory, so a client that
 * sent pings and read nothing grew the daemon by gigabytes a minute (empty
 * pings add no bytes to the queue, only messages, hence both bounds). The
 * byte bound is above what the agent's output can fill (TERM_HIGH and one
 * read), so only a browser's own pings reach it. Checked in ws_recv too:
 * one wslay_event_recv reads for as long as bytes keep coming. */
static int browser_readable(struct term *t)
{
    return t->to_agent_len < TERM_HIGH && wslay_event_get_queued_msg_length(t->ws) < TERM_WS_QUEUED_MAX &&
           wslay_event_get_queued_msg_count(t->ws) < TERM_WS_QUEUED_MSGS;
}

static ssize_t ws_recv(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user)
{
    struct term *t = user;
    if (!t->bad_frame && !browser_readable(t)) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    /* Past a forbidden header wslay reads nothing more: it would close
     * without a status code, and we close with 1002 and say why. */
    ssize_t n = t->bad_frame ? -1 : recv(t->ws_fd, buf, len, 0);
    if (n > 0) {
        t->heard_ms = clock_mono_ms();
        size_t ok = ws_frames_follow(&t->frames, buf, (size_t)n, &t->bad_frame);
        if (ok > 0)
            return (ssize_t)ok;
    }
    if (t->bad_frame || (n < 0 && (errno == EAGAIN || errno == EINTR))) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    } else {
        t->ws_dead = 1;
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    }
    return -1;
}

static ssize_t ws_send(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *user)
{
    struct term *t = user;
    ssize_t n = send(t->ws_fd, data, len, MSG_NOSIGNAL);
    if (n >= 0)
        return n;
    if (errno == EAGAIN || errno == EINTR) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    } else {
        t->ws_dead = 1;
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    }
    return -1;
}

/* {"type":"resize","cols":C,"rows":R} with C and R from 1 to 1000. */
static int parse_resize(const uint8_t *msg, size_t len, unsigned *cols, unsigned *rows)
{
    json_t *j = json_loadb((const char *)msg, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *type = json_object_get(j, "type"), *c = json_object_get(j, "cols"), *r = json_object_get(j, "rows");
    int ok = json_is_object(j) && json_object_size(j) == 3 && json_is_string(type) &&
             strcmp(json_string_value(type), "resize") == 0 && json_is_integer(c) && json_is_integer(r) &&
             json_integer_value(c) >= 1 && json_integer_value(c) <= 1000 && json_integer_value(r) >= 1 &&
             json_integer_value(r) <= 1000;
    if (ok) {
        *cols = (unsigned)json_integer_value(c);
        *rows = (unsigned)json_integer_value(r);
    }
    json_decref(j);
    return ok ? 0 : -1;
}

static void ws_message(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg, void *user)
{
    struct term *t = user;
    if (arg->opcode == WSLAY_BINARY_FRAME) {
        if (t->agent != AG_GONE && term_frame_append(&t->to_agent, &t->to_agent_len, &t->to_agent_cap, TERM_FRAME_DATA, arg->msg, arg->msg_length) < 0)
            ws_close(t, WSLAY_CODE_INTERNAL_SERVER_ERROR, "out of memory");
    } else if (arg->opcode == WSLAY_TEXT_FRAME) {
        unsigned cols, rows;
        if (parse_resize(arg->msg, arg->msg_length, &cols, &rows) < 0) {
            ws_close(t, WSLAY_CODE_UNSUPPORTED_DATA, "text messages are {\"type\":\"resize\",\"cols\":C,\"rows\":R}");
            return;
        }
        unsigned char p[4] = {(unsigned char)(cols >> 8), (unsigned char)cols, (unsigned char)(rows >> 8),
                              (unsigned char)rows};
        if (t->agent != AG_GONE)
            term_frame_append(&t->to_agent, &t->to_agent_len, &t->to_agent_cap, TERM_FRAME_RESIZE, p, sizeof p);
    } else if (arg->opcode == WSLAY_CONNECTION_CLOSE) {
        /* The browser closed: wslay answers it; the agent hangs the shell up. */
        if (!t->close_sent_ms)
            t->close_sent_ms = clock_mono_ms();
        agent_end(t);
    }
}

static const struct wslay_event_callbacks ws_callbacks = {
    .recv_callback = ws_recv,
    .send_callback = ws_send,
    .on_msg_recv_callback = ws_message,
};

static void term_free(struct term *t)
{
    if (t->agent_fd >= 0)
        close(t->agent_fd);
    if (t->ws)
        wslay_event_context_free(t->ws);
    if (t->up)
        http_upgraded_close(t->up);
    terminal_relay_release(t->target.user_id);
    secret_wipe(t->target.secret, sizeof t->target.secret);
    secret_wipe(t->request, sizeof t->request);
    free(t->to_agent);
    free(t);
}

static void wake_relay(void)
{
    char c = 1;
    if (R.wake[1] >= 0 && write(R.wake[1], &c, 1) < 0 && errno != EAGAIN)
        log_debug("terminal: cannot wake the relay: %s", strerror(errno));
}

void terminal_relay_upgraded(void *ctx, int fd, const char *extra, size_t extra_len, struct http_upgraded *up)
{
    struct terminal_target *g = ctx;
    if (!up) { /* the browser left before the switch */
        terminal_relay_release(g->user_id);
        secret_wipe(g->secret, sizeof g->secret);
        free(g);
        return;
    }
    struct term *t = calloc(1, sizeof *t);
    if (!t || wslay_event_context_server_init(&t->ws, &ws_callbacks, t) != 0) {
        free(t);
        http_upgraded_close(up);
        terminal_relay_release(g->user_id);
        secret_wipe(g->secret, sizeof g->secret);
        free(g);
        return;
    }
    t->target = *g;
    secret_wipe(g->secret, sizeof g->secret);
    free(g);
    t->up = up;
    t->ws_fd = fd;
    t->agent_fd = -1;
    t->heard_ms = clock_mono_ms();
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    wslay_event_config_set_max_recv_msg_length(t->ws, TERM_WS_MAX);
    /* A browser sends nothing before the switch it asked for; bytes that
     * came early are not framed by anything we told it. */
    if (extra_len > 0) {
        ws_close(t, WSLAY_CODE_PROTOCOL_ERROR, "data before the handshake finished");
    }
    log_info("terminal: instance %s rank %lld user %s: opened (node %s)", t->target.instance_id,
             (long long)t->target.rank, t->target.user_id, t->target.node_name);
    pthread_mutex_lock(&R.lock);
    int stopping = R.stopping;
    if (!stopping) {
        t->next = R.incoming;
        R.incoming = t;
    }
    pthread_mutex_unlock(&R.lock);
    if (stopping)
        term_free(t);
    else
        wake_relay();
}

/* 1 when the terminal is over. */
static int term_over(struct term *t)
{
    if (t->ws_dead)
        return 1;
    /* wslay closes by itself on what it finds wrong in a frame (1002,
     * 1007, 1009): it reads no more, and its close waits as ours does. */
    if (!t->close_sent_ms && !wslay_event_want_read(t->ws))
        t->close_sent_ms = clock_mono_ms();
    if (!wslay_event_want_read(t->ws) && !wslay_event_want_write(t->ws)) {
        if (wslay_event_get_close_received(t->ws))
            return 1; /* closes sent and received */
        /* We closed (1009, 1002 ...) with the browser's bytes still coming:
         * closing the socket now would reset it before our close frame is
         * read, so what it sends is read and dropped until it closes. */
        if (!t->draining) {
            t->draining = 1;
            if (!t->close_sent_ms)
                t->close_sent_ms = clock_mono_ms();
            shutdown(t->ws_fd, SHUT_WR);
        }
        return clock_mono_ms() - t->close_sent_ms > TERM_CLOSE_GRACE_MS;
    }
    if (!t->close_sent_ms || clock_mono_ms() - t->close_sent_ms <= TERM_CLOSE_GRACE_MS)
        return 0;
    /* The close had its grace: the browser never answered it, or never
     * took it. It waits behind the output queued for the browser, and one
     * that reads nothing while its workload floods the terminal (its
     * kernel buffers full, its window shut) held the terminal and a slot
     * of max_terminals_per_user for ever: browser_gone no longer looks
     * once a close is queued, and TCP keeps a connection whose peer
     * answers with a shut window. Such a one is reset, so the kernel does
     * not go on holding what it was sent (under TLS the fd is one end of
     * libmicrohttpd's socket pair, and the reset stops there). */
    if (wslay_event_want_write(t->ws)) {
        struct linger reset = {.l_onoff = 1, .l_linger = 0};
        setsockopt(t->ws_fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
        log_info("terminal: instance %s rank %lld user %s: the close could not be sent in %d ms, the browser"
                 " reads nothing: dropped",
                 t->target.instance_id, (long long)t->target.rank, t->target.user_id, TERM_CLOSE_GRACE_MS);
    }
    return 1;
}

/* Pings a silent browser; 1 when it has been silent too long to be there. */
static int browser_gone(struct term *t)
{
    int64_t now = clock_mono_ms(), every = daemon_config->terminal_ping_s * 1000;
    if (t->close_sent_ms || now - t->heard_ms < every)
        return 0;
    if (now - t->heard_ms >= 3 * every) {
        log_info("terminal: instance %s rank %lld user %s: the browser answered no ping in %lld s", t->target.instance_id,
                 (long long)t->target.rank, t->target.user_id, (long long)(now - t->heard_ms) / 1000);
        return 1;
    }
    if (now - t->pinged_ms >= every) {
        struct wslay_event_msg ping = {.opcode = WSLAY_PING, .msg = NULL, .msg_length = 0};
        wslay_event_queue_msg(t->ws, &ping);
        t->pinged_ms = now;
    }
    return 0;
}

static void term_step(struct term *t, short ws_rev, short ag_rev)
{
    if (t->agent == AG_CONNECTING && t->agent_fd < 0 && !t->close_sent_ms)
        agent_connect(t);
    if (t->draining) {
        unsigned char junk[16384];
        ssize_t n;
        while ((n = recv(t->ws_fd, junk, sizeof junk, 0)) > 0) {
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            t->ws_dead = 1;
        return;
    }
    if (ws_rev & (POLLIN | POLLHUP | POLLERR)) {
        if (wslay_event_recv(t->ws) != 0 && !t->ws_dead)
            ws_close(t, WSLAY_CODE_PROTOCOL_ERROR, "");
        /* Past a forbidden header nothing more is read, whether or not
         * our close went already (an exit, a 1009): the socket stays
         * readable, and wslay still wanting to read would spin this loop. */
        if (t->bad_frame) {
            if (!t->close_sent_ms)
                ws_close(t, WSLAY_CODE_PROTOCOL_ERROR, t->bad_frame);
            wslay_event_shutdown_read(t->ws);
        }
    }
    if (browser_gone(t)) {
        t->ws_dead = 1; /* no close handshake with a peer that is not there */
        return;
    }
    if (t->agent_fd >= 0 && (t->agent != AG_OPEN || ag_rev || t->to_agent_len))
        agent_io(t, ag_rev);
    if (t->agent != AG_OPEN && t->agent != AG_GONE && clock_mono_ms() > t->agent_deadline_ms && t->agent_fd >= 0)
        agent_fail(t, "did not open the terminal in time");
    if (wslay_event_want_write(t->ws) && !t->ws_dead)
        wslay_event_send(t->ws);
    if (t->exit_reason[0] && !t->close_sent_ms && !t->ws_dead && wslay_event_get_queued_msg_count(t->ws) == 0) {
        ws_close(t, WSLAY_CODE_NORMAL_CLOSURE, t->exit_reason);
        wslay_event_send(t->ws);
    }
}

/* Ends each terminal whose API key no longer grants its owner's authority
 * (revoked, expired, the owner suspended), as the next request with that
 * key would be refused: within a poll of a change this process committed,
 * which moves store_auth_generation(), and within a second of one made
 * elsewhere or of an expiry. The agent connection closes with the
 * browser's, which hangs the shell up. */
static void check_keys(void)
{
    static struct key_watch watch;
    struct store *s;
    if (!R.open || !key_watch_due(&watch) || !(s = store_thread()))
        return;
    int64_t now = clock_now();
    for (struct term *t = R.open; t; t = t->next) {
        if (t->close_sent_ms)
            continue;
        enum key_standing k = account_key_standing(s, t->target.key_id, now);
        if (k != KEY_GONE && k != KEY_OWNER_DISABLED)
            continue; /* a store that cannot answer ends nothing */
        const char *why = k == KEY_GONE ? "the API key that opened this terminal is revoked or expired"
                                        : "the account is suspended";
        log_info("terminal: instance %s rank %lld user %s: closed, %s", t->target.instance_id,
                 (long long)t->target.rank, t->target.user_id, why);
        ws_close(t, WSLAY_CODE_POLICY_VIOLATION, why);
    }
}

static void *relay_main(void *arg)
{
    struct pollfd *pfd = NULL;
    size_t cap = 0;
    for (;;) {
        pthread_mutex_lock(&R.lock);
        int stopping = R.stopping;
        while (R.incoming) {
            struct term *t = R.incoming;
            R.incoming = t->next;
            t->next = R.open;
            R.open = t;
        }
        pthread_mutex_unlock(&R.lock);
        if (stopping)
            break;
        size_t n = 1;
        for (struct term *t = R.open; t; t = t->next)
            n += 2;
        if (n > cap) {
            struct pollfd *p = realloc(pfd, n * sizeof *p);
            if (!p) {
                usleep(100000);
                continue;
            }
            pfd = p;
            cap = n;
        }
        pfd[0] = (struct pollfd){.fd = R.wake[0], .events = POLLIN};
        size_t i = 1;
        for (struct term *t = R.open; t; t = t->next, i += 2) {
            short we = 0, ae = 0;
            if (t->draining || (wslay_event_want_read(t->ws) && browser_readable(t)))
                we |= POLLIN;
            if (wslay_event_want_write(t->ws))
                we |= POLLOUT;
            if (t->agent == AG_CONNECTING || t->agent == AG_REQUEST || (t->agent == AG_OPEN && t->to_agent_len))
                ae |= POLLOUT;
            if (t->agent == AG_RESPONSE ||
                (t->agent == AG_OPEN && wslay_event_get_queued_msg_length(t->ws) < TERM_HIGH))
                ae |= POLLIN;
            pfd[i] = (struct pollfd){.fd = we ? t->ws_fd : -1, .events = we};
            pfd[i + 1] = (struct pollfd){.fd = ae && t->agent_fd >= 0 ? t->agent_fd : -1, .events = ae};
        }
        /* Wakes at least every 200 ms for the deadlines (connect, close). */
        poll(pfd, n, R.open ? 200 : -1);
        if (pfd[0].revents) {
            char buf[64];
            while (read(R.wake[0], buf, sizeof buf) > 0) {
            }
        }
        check_keys();
        i = 1;
        for (struct term **pp = &R.open; *pp; i += 2) {
            struct term *t = *pp;
            /* A terminal added since the poll has no entry of its own. */
            short wr = i < n ? pfd[i].revents : 0, ar = i + 1 < n ? pfd[i + 1].revents : 0;
            term_step(t, wr, ar);
            if (term_over(t)) {
                *pp = t->next;
                log_info("terminal: instance %s rank %lld user %s: closed", t->target.instance_id,
                         (long long)t->target.rank, t->target.user_id);
                term_free(t);
                continue;
            }
            pp = &t->next;
        }
    }
    free(pfd);
    return NULL;
}

int terminal_relay_start(void)
{
    if (pipe2(R.wake, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    R.stopping = 0;
    if (pthread_create(&R.thread, NULL, relay_main, NULL) != 0) {
        close(R.wake[0]), close(R.wake[1]);
        R.wake[0] = R.wake[1] = -1;
        return -1;
    }
    pthread_setname_np(R.thread, "terminal-relay");
    pthread_mutex_lock(&R.lock);
    R.started = 1;
    pthread_mutex_unlock(&R.lock);
    return 0;
}

/* At stop: each browser is told the server is going away (what one send
 * takes), each agent connection closed (the agent hangs its shell up). */
static void end_all(struct term *list)
{
    while (list) {
        struct term *next = list->next;
        if (!list->close_sent_ms && !list->ws_dead) {
            wslay_event_queue_close(list->ws, WSLAY_CODE_GOING_AWAY, (const uint8_t *)"server stopping", 15);
            wslay_event_send(list->ws);
        }
        term_free(list);
        list = next;
    }
}

void terminal_relay_stop(void)
{
    pthread_mutex_lock(&R.lock);
    int started = R.started;
    R.stopping = 1;
    R.started = 0;
    pthread_mutex_unlock(&R.lock);
    if (!started)
        return;
    wake_relay();
    pthread_join(R.thread, NULL);
    pthread_mutex_lock(&R.lock);
    struct term *left = R.incoming;
    R.incoming = NULL;
    pthread_mutex_unlock(&R.lock);
    end_all(R.open);
    R.open = NULL;
    end_all(left);
}

void terminal_relay_free(void)
{
    terminal_relay_stop();
    if (R.wake[0] >= 0)
        close(R.wake[0]), close(R.wake[1]);
    R.wake[0] = R.wake[1] = -1;
    free(R.users);
    R.users = NULL;
    R.n_users = 0;
}
