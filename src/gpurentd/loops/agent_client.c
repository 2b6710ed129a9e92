/* agent_client.c: builds signed libcurl calls to node agents (see
 * agent_client.h and docs/AGENT_PROTOCOL.md). */
#include "loops/agent_client.h"
#include "gpurent/clock.h"
#include "gpurent/log.h"
#include "gpurent/sign.h"
#include "loops/loops.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct agent_client_opts agent_client_opts_from_config(void)
{
    const struct daemon_conf *cf = daemon_config;
    struct agent_client_opts o = {
        .connect_timeout_ms = cf->agent_connect_timeout_ms,
        .total_timeout_ms = cf->agent_timeout_ms,
        .max_response_bytes = (size_t)cf->agent_max_response_bytes,
        .ca_file = cf->agent_ca_file,
        .wait_ms = (long)cf->agent_put_wait_ms,
    };
    return o;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *userp)
{
    struct agent_call *c = userp;
    size_t n = size * nmemb;
    if (c->response_len + n > c->max_response_bytes) {
        c->too_large = 1;
        return 0; /* makes libcurl abort the transfer */
    }
    if (c->response_len + n + 1 > c->response_cap) {
        size_t cap = c->response_cap ? c->response_cap : 1024;
        while (cap < c->response_len + n + 1)
            cap *= 2;
        char *grown = realloc(c->response, cap);
        if (!grown)
            return 0;
        c->response = grown;
        c->response_cap = cap;
    }
    memcpy(c->response + c->response_len, data, n);
    c->response_len += n;
    c->response[c->response_len] = '\0';
    return n;
}

/* CURLOPT_HEADERFUNCTION: keeps the reply's ETag when it is one the daemon
 * may store and send back in a header: 1 to 64 printable ASCII characters;
 * and notes a Retry-After. */
static size_t on_header(char *data, size_t size, size_t nmemb, void *userp)
{
    struct agent_call *c = userp;
    size_t n = size * nmemb;
    static const char name[] = "etag:", retry[] = "retry-after:";
    if (n > sizeof retry - 1 && strncasecmp(data, retry, sizeof retry - 1) == 0)
        c->retry_after = 1;
    if (n > sizeof name - 1 && strncasecmp(data, name, sizeof name - 1) == 0) {
        const char *v = data + sizeof name - 1, *end = data + n;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
            end--;
        size_t len = (size_t)(end - v);
        int plain = len > 0 && len < sizeof c->etag;
        for (size_t i = 0; plain && i < len; i++)
            plain = v[i] >= 0x20 && v[i] <= 0x7e;
        c->etag[0] = '\0';
        if (plain) {
            memcpy(c->etag, v, len);
            c->etag[len] = '\0';
        }
    }
    return n;
}

/* The path part of base_url ("" for "http://host:port"), which the agent
 * sees and so must be signed. */
static const char *url_path(const char *base_url)
{
    const char *p = strstr(base_url, "://");
    p = p ? p + 3 : base_url;
    p = strchr(p, '/');
    return p ? p : "";
}

struct agent_call *agent_call_new(const char *base_url, const char *secret, const char *method, const char *path,
                                  const char *body, const struct agent_client_opts *opts)
{
    struct agent_call *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->max_response_bytes = opts->max_response_bytes;
    c->easy = curl_easy_init();
    if (!c->easy)
        goto fail;
    size_t base_len = strlen(base_url);
    while (base_len > 0 && base_url[base_len - 1] == '/')
        base_len--;
    char url[1024], signed_path[1024];
    int n = snprintf(url, sizeof url, "%.*s%s", (int)base_len, base_url, path);
    const char *base_path = url_path(base_url);
    size_t base_path_len = strlen(base_path);
    while (base_path_len > 0 && base_path[base_path_len - 1] == '/')
        base_path_len--;
    int m = snprintf(signed_path, sizeof signed_path, "%.*s%s", (int)base_path_len, base_path, path);
    if (n < 0 || (size_t)n >= sizeof url || m < 0 || (size_t)m >= sizeof signed_path)
        goto fail;

    struct sign_headers sh;
    size_t body_len = body ? strlen(body) : 0;
    if (sign_request(secret, method, signed_path, clock_wall(), body, body_len, &sh) < 0)
        goto fail;
    char line[128];
    snprintf(line, sizeof line, "%s: %s", SIGN_HDR_TIMESTAMP, sh.timestamp);
    c->headers = curl_slist_append(c->headers, line);
    snprintf(line, sizeof line, "%s: %s", SIGN_HDR_NONCE, sh.nonce);
    c->headers = curl_slist_append(c->headers, line);
    snprintf(line, sizeof line, "%s: %s", SIGN_HDR_SIGNATURE, sh.signature);
    c->headers = curl_slist_append(c->headers, line);
    c->headers = curl_slist_append(c->headers, "Content-Type: application/json");
    c->headers = curl_slist_append(c->headers, "Expect:"); /* no 100-continue round trip */
    if ((strcmp(method, "PUT") == 0 || strcmp(method, "DELETE") == 0) && opts->wait_ms > 0) {
        snprintf(line, sizeof line, "Gpurent-Wait-Ms: %ld", opts->wait_ms);
        c->headers = curl_slist_append(c->headers, line);
    }
    if (!c->headers)
        goto fail;

    CURL *e = c->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(e, CURLOPT_PRIVATE, c);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->error);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, opts->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, opts->total_timeout_ms);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)opts->max_response_bytes);
    if (opts->ca_file && opts->ca_file[0])
        curl_easy_setopt(e, CURLOPT_CAINFO, opts->ca_file);
    if (body) {
        c->request_body = strdup(body);
        if (!c->request_body)
            goto fail;
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, c->request_body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    } else if (strcmp(method, "GET") == 0) {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    }
    return c;
fail:
    log_error("agent client: cannot build %s %s%s", method, base_url, path);
    agent_call_free(c);
    return NULL;
}

int agent_call_if_none_match(struct agent_call *c, const char *etag)
{
    char line[16 + AGENT_CALL_ETAG_MAX];
    snprintf(line, sizeof line, "If-None-Match: %s", etag);
    /* Appended to the list CURLOPT_HTTPHEADER already points at. */
    return curl_slist_append(c->headers, line) ? 0 : -1;
}

int agent_call_finish(struct agent_call *c, CURLcode result)
{
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &c->status);
    if (c->too_large) {
        snprintf(c->error, sizeof c->error, "reply larger than %zu bytes", c->max_response_bytes);
        return -1;
    }
    if (result != CURLE_OK) {
        if (!c->error[0])
            snprintf(c->error, sizeof c->error, "%s", curl_easy_strerror(result));
        return -1;
    }
    c->error[0] = '\0';
    return 0;
}

void agent_call_free(struct agent_call *c)
{
    if (!c)
        return;
    if (c->easy)
        curl_easy_cleanup(c->easy);
    curl_slist_free_all(c->headers);
    free(c->request_body);
    free(c->response);
    json_decref(c->doc);
    free(c);
}

json_t *agent_call_json(struct agent_call *c)
{
    if (!c->doc_read) {
        c->doc = json_loadb(c->response ? c->response : "", c->response_len, 0, NULL);
        c->doc_read = 1;
    }
    return c->doc;
}

/* A multi handle driven through libcurl's socket interface. libcurl's
 * curl_multi_perform runs every transfer on each call, and each one still
 * waiting for its reply asks the kernel about its socket with a poll() of
 * its own: a pass with many calls in flight (the PUTs agents hold until
 * their workload runs) made some 28 polls a call. Here one poll() waits on
 * every socket libcurl named, and only the transfers whose socket is ready,
 * or whose timer is due, are run, told what the socket is ready for. */
struct agent_multi {
    CURLM *multi;         /* the handle */
    int64_t connects;     /* connections agent_calls_stream's calls on it opened */
    struct pollfd *watch; /* [0] the wake eventfd, then each socket libcurl asked to watch */
    struct pollfd *ready; /* scratch: the sockets one poll found ready */
    size_t n_watch;       /* entries in watch */
    size_t cap_watch;     /* allocated entries in watch and in ready */
    int *slot_of_fd;      /* a watched socket's index in watch; 0 when unwatched */
    size_t n_slot_of_fd;  /* entries in slot_of_fd */
    int64_t timer_at_us;  /* when libcurl wants its timeout action; -1: no timer */
};

/* Watches socket fd for events, or (remove) stops watching it. Returns 0,
 * or -1 without memory, in which case the transfer on it ends at its own
 * total timeout. */
static int watch_socket(struct agent_multi *m, int fd, short events, int remove)
{
    if (fd < 0)
        return -1;
    size_t at = (size_t)fd < m->n_slot_of_fd ? (size_t)m->slot_of_fd[fd] : 0;
    if (remove) {
        if (at == 0)
            return 0;
        m->watch[at] = m->watch[--m->n_watch];
        m->slot_of_fd[m->watch[at].fd] = (int)at; /* the moved entry, or fd itself when it was last */
        m->slot_of_fd[fd] = 0;
        return 0;
    }
    if (at == 0) {
        if ((size_t)fd >= m->n_slot_of_fd) {
            size_t n = m->n_slot_of_fd ? m->n_slot_of_fd : 64;
            while (n <= (size_t)fd)
                n *= 2;
            int *grown = realloc(m->slot_of_fd, n * sizeof *grown);
            if (!grown)
                return -1;
            memset(grown + m->n_slot_of_fd, 0, (n - m->n_slot_of_fd) * sizeof *grown);
            m->slot_of_fd = grown;
            m->n_slot_of_fd = n;
        }
        if (m->n_watch == m->cap_watch) {
            size_t cap = m->cap_watch * 2;
            struct pollfd *w = realloc(m->watch, cap * sizeof *w);
            if (w)
                m->watch = w;
            struct pollfd *r = w ? realloc(m->ready, cap * sizeof *r) : NULL;
            if (r)
                m->ready = r;
            if (!w || !r)
                return -1;
            m->cap_watch = cap;
        }
        at = m->n_watch++;
        m->watch[at].fd = fd;
        m->slot_of_fd[fd] = (int)at;
    }
    m->watch[at].events = events;
    m->watch[at].revents = 0;
    return 0;
}

/* CURLMOPT_SOCKETFUNCTION: what libcurl wants to hear about a socket. */
static int on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    (void)easy, (void)socketp;
    struct agent_multi *m = userp;
    short events = (short)((what & CURL_POLL_IN ? POLLIN : 0) | (what & CURL_POLL_OUT ? POLLOUT : 0));
    if (watch_socket(m, (int)s, events, what == CURL_POLL_REMOVE) < 0)
        log_error("agent client: cannot watch a socket (out of memory); its call ends at its timeout");
    return 0;
}

/* CURLMOPT_TIMERFUNCTION: when libcurl next wants its timeout action. */
static int on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    (void)multi;
    struct agent_multi *m = userp;
    m->timer_at_us = timeout_ms < 0 ? -1 : clock_mono_us() + (int64_t)timeout_ms * 1000;
    return 0;
}

struct agent_multi *agent_multi_new(void)
{
    struct agent_multi *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->cap_watch = 16;
    m->watch = calloc(m->cap_watch, sizeof *m->watch);
    m->ready = calloc(m->cap_watch, sizeof *m->ready);
    m->timer_at_us = -1;
    int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!m->watch || !m->ready || wake < 0 || !(m->multi = curl_multi_init())) {
        if (wake >= 0)
            close(wake);
        free(m->watch);
        free(m->ready);
        free(m);
        return NULL;
    }
    m->watch[0] = (struct pollfd){.fd = wake, .events = POLLIN};
    m->n_watch = 1;
    curl_multi_setopt(m->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(m->multi, CURLMOPT_SOCKETDATA, m);
    curl_multi_setopt(m->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(m->multi, CURLMOPT_TIMERDATA, m);
    return m;
}

void agent_multi_run(struct agent_multi *m, int wait_ms)
{
    int timeout = wait_ms;
    if (m->timer_at_us >= 0) {
        int64_t left_us = m->timer_at_us - clock_mono_us();
        int64_t left_ms = left_us <= 0 ? 0 : (left_us + 999) / 1000;
        if (left_ms < timeout)
            timeout = (int)left_ms;
    }
    size_t n_ready = 0;
    if (poll(m->watch, (nfds_t)m->n_watch, timeout) > 0) {
        if (m->watch[0].revents) {
            uint64_t wakes;
            while (read(m->watch[0].fd, &wakes, sizeof wakes) > 0)
                ;
        }
        /* Copied first: acting on one socket can make libcurl close
         * others, which changes the watch list. */
        for (size_t i = 1; i < m->n_watch; i++)
            if (m->watch[i].revents)
                m->ready[n_ready++] = m->watch[i];
    }
    int running;
    for (size_t i = 0; i < n_ready; i++) {
        short r = m->ready[i].revents;
        int bits = (r & (POLLIN | POLLHUP) ? CURL_CSELECT_IN : 0) | (r & POLLOUT ? CURL_CSELECT_OUT : 0) |
                   (r & (POLLERR | POLLNVAL) ? CURL_CSELECT_ERR : 0);
        curl_multi_socket_action(m->multi, m->ready[i].fd, bits, &running);
    }
    if (m->timer_at_us >= 0 && clock_mono_us() >= m->timer_at_us)
        curl_multi_socket_action(m->multi, CURL_SOCKET_TIMEOUT, 0, &running);
}

int agent_calls_stream(struct agent_multi *pool, size_t n, long max_parallel, int (*stop)(void),
                       const struct agent_call_stream *st)
{
    /* Only max_parallel calls exist at a time: a handle waiting in the multi
     * for a connection already holds its buffers (some 17 KB), which for a
     * pass over 10 000 agents would be 170 MB; so each call is made when a
     * slot frees up and handed back the moment it ends. */
    size_t window = max_parallel > 0 ? (size_t)max_parallel : 1;
    struct {
        struct agent_call *c; /* in flight, or NULL: a free slot */
        size_t i;             /* its index in the stream */
    } *slot = calloc(window, sizeof *slot);
    struct agent_multi *m = !slot ? NULL : pool ? pool : agent_multi_new();
    if (!m) {
        free(slot);
        return -1;
    }
    CURLM *multi = m->multi;
    curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)window);
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long)window);
    size_t next = 0, active = 0;
    int stopped = 0;
    for (;;) {
        for (size_t k = 0; k < window && next < n; k++) {
            if (slot[k].c)
                continue;
            size_t i = next++;
            struct agent_call *c = st->make(st->ctx, i);
            if (!c) {
                st->done(st->ctx, i, NULL, 1);
                continue;
            }
            /* What the call says if it never runs; libcurl empties the
             * buffer when the transfer starts. */
            snprintf(c->error, sizeof c->error, "not run");
            if (curl_multi_add_handle(multi, c->easy) != CURLM_OK) {
                st->done(st->ctx, i, c, 1);
                continue;
            }
            slot[k].c = c;
            slot[k].i = i;
            active++;
        }
        if (active == 0) {
            if (next == n)
                break;
            continue; /* every call of that round failed to start: make more */
        }
        /* Wait for traffic only when every slot is busy or nothing is left
         * to start; otherwise just move what is ready and start more. */
        agent_multi_run(m, active == window || next == n ? 100 : 0);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct agent_call *c;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c);
            if (agent_call_finish(c, msg->data.result) < 0 || c->status >= 500)
                metrics_agent_error();
            long connects = 0;
            if (curl_easy_getinfo(c->easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK)
                m->connects += connects;
            curl_multi_remove_handle(multi, c->easy);
            size_t i = 0;
            for (size_t k = 0; k < window; k++)
                if (slot[k].c == c) {
                    i = slot[k].i;
                    slot[k].c = NULL;
                }
            active--;
            st->done(st->ctx, i, c, 1);
        }
        if (active == 0 && next == n)
            break;
        if (stop && stop()) {
            stopped = 1;
            break;
        }
    }
    for (size_t k = 0; k < window; k++) {
        if (slot[k].c) {
            curl_multi_remove_handle(multi, slot[k].c->easy);
            st->done(st->ctx, slot[k].i, slot[k].c, 0);
        }
    }
    if (!pool)
        agent_multi_free(m);
    free(slot);
    return stopped ? -1 : 0;
}

/* agent_calls_run's stream: the calls the caller made, left with it. */
static struct agent_call *take_made(void *ctx, size_t i)
{
    return ((struct agent_call **)ctx)[i];
}
static void leave_with_caller(void *ctx, size_t i, struct agent_call *c, int finished)
{
    (void)ctx, (void)i, (void)c, (void)finished;
}

int agent_calls_run(struct agent_multi *pool, struct agent_call **calls, size_t n, long max_parallel,
                    int (*stop)(void))
{
    for (size_t i = 0; i < n; i++)
        if (calls[i]) /* calls a stop leaves unstarted say so too */
            snprintf(calls[i]->error, sizeof calls[i]->error, "not run");
    const struct agent_call_stream st = {take_made, leave_with_caller, calls};
    return agent_calls_stream(pool, n, max_parallel, stop, &st);
}

int agent_multi_add(struct agent_multi *m, struct agent_call *c)
{
    return curl_multi_add_handle(m->multi, c->easy) == CURLM_OK ? 0 : -1;
}

void agent_multi_remove(struct agent_multi *m, struct agent_call *c)
{
    curl_multi_remove_handle(m->multi, c->easy);
}

struct agent_call *agent_multi_next_done(struct agent_multi *m, int *ok)
{
    CURLMsg *msg;
    int left = 0;
    while ((msg = curl_multi_info_read(m->multi, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        struct agent_call *c = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c);
        if (!c)
            continue;
        *ok = agent_call_finish(c, msg->data.result);
        return c;
    }
    return NULL;
}

void agent_multi_wakeup(struct agent_multi *m)
{
    uint64_t one = 1;
    if (write(m->watch[0].fd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is full, so a wake is pending anyway */
    }
}

int64_t agent_multi_connects(const struct agent_multi *m)
{
    return m ? m->connects : 0;
}

void agent_multi_free(struct agent_multi *m)
{
    if (!m)
        return;
    curl_multi_cleanup(m->multi);
    close(m->watch[0].fd);
    free(m->watch);
    free(m->ready);
    free(m->slot_of_fd);
    free(m);
}

int agent_client_global_init(void)
{
    return curl_global_init(CURL_GLOBAL_DEFAULT) == 0 ? 0 : -1;
}

void agent_client_global_cleanup(void)
{
    curl_global_cleanup();
}
