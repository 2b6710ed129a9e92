/* terminal.c: the agent's end of the web terminal (docs/AGENT_PROTOCOL.md,
 * "Terminal"): GET /v1/workloads/{id}/terminal switches the signed request's
 * connection to a framed byte stream carrying the same shell an SSH session
 * with a PTY gets (ssh_shell_start), and one relay thread moves the bytes of
 * every open terminal between its socket and its PTY with poll(), so no HTTP
 * pool thread is held while a terminal is open.
 *
 * Frames are gpurent/term_frame.h's: terminal bytes either way, resizes
 * from the daemon, and the shell's end from the agent (its exit status, or
 * 128 + the signal that ended it), after which the agent closes. The daemon closing
 * the connection hangs the shell up (SIGHUP, then SIGKILL after a second). */
#include "agent.h"
#include "gpurent/clock.h"
#include "gpurent/log.h"
#include "gpurent/term_frame.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define TERM_OUT_HIGH (256 * 1024)    /* bytes queued for the daemon before the PTY is read no more */
#define TERM_HANGUP_GRACE_MS 1000     /* SIGHUP to SIGKILL */

struct term {
    struct http_upgraded *up;         /* hands the socket back */
    int sock;                         /* the daemon's connection */
    pid_t pid;                        /* the shell (its own session); 0 when none started */
    int master;                       /* its PTY, -1 when closed */
    char wl_id[AGENT_NAME_MAX];       /* for the log */
    char node[AGENT_NAME_MAX];
    unsigned char in[5 + TERM_FRAME_MAX]; /* a frame from the daemon being read */
    size_t in_len;
    unsigned char *to_pty;            /* data frames' bytes not yet written to the PTY */
    size_t to_pty_len;
    unsigned char *to_sock;           /* frames not yet sent */
    size_t to_sock_len, to_sock_cap;
    int reaped, wait_status;          /* the shell was waited for */
    int sock_gone;                    /* the daemon closed or broke the connection */
    int exit_queued;                  /* the 'x' frame is in to_sock */
    int64_t hangup_ms;                /* when SIGHUP went, 0 before */
    struct term *next;
};

struct agent_terminals {
    struct agent *agent;
    pthread_t thread;
    int started;
    int wake[2];                      /* a new terminal or stop: wakes poll */
    pthread_mutex_t lock;             /* guards incoming, stopping */
    struct term *incoming;            /* handed over by the upgrade callback */
    int stopping;
    struct term *open;                /* the relay thread's alone */
};

static void wake(struct agent_terminals *ts)
{
    char c = 1;
    if (write(ts->wake[1], &c, 1) < 0 && errno != EAGAIN)
        log_debug("terminal: cannot wake the relay: %s", strerror(errno));
}

/* The upgrade callback (a pool thread): starts the shell and hands the
 * terminal to the relay. A shell that cannot start is a terminal whose
 * output is why and whose end is status 127, as a shell says it. */
struct term_open {
    struct agent *agent;
    struct agent_node *node;
    char wl_id[AGENT_NAME_MAX];
    unsigned cols, rows;
};

static void term_free(struct term *t)
{
    if (t->master >= 0)
        close(t->master);
    if (t->up)
        http_upgraded_close(t->up);
    free(t->to_pty);
    free(t->to_sock);
    free(t);
}

static void end_all(struct term *list);

static void on_upgraded(void *ctx, int fd, const char *extra, size_t extra_len, struct http_upgraded *up)
{
    struct term_open *o = ctx;
    struct agent_terminals *ts = o->agent->terminals;
    if (!up) { /* the daemon left before the switch */
        free(o);
        return;
    }
    struct term *t = calloc(1, sizeof *t);
    if (!t) {
        http_upgraded_close(up);
        free(o);
        return;
    }
    t->up = up;
    t->sock = fd;
    t->master = -1;
    snprintf(t->wl_id, sizeof t->wl_id, "%s", o->wl_id);
    snprintf(t->node, sizeof t->node, "%s", o->node->name);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (extra_len > sizeof t->in)
        extra_len = sizeof t->in; /* more than one frame before the switch: the daemon never does it */
    memcpy(t->in, extra, extra_len);
    t->in_len = extra_len;
    pthread_mutex_lock(&ts->lock);
    int stopping = ts->stopping;
    pthread_mutex_unlock(&ts->lock);
    char msg[512] = "";
    if (stopping) {
        snprintf(msg, sizeof msg, "the agent is stopping");
    } else if (ssh_shell_start(o->agent, o->node, o->wl_id, "xterm-256color", o->cols, o->rows, &t->pid, &t->master,
                               msg, sizeof msg) == 0) {
        fcntl(t->master, F_SETFL, fcntl(t->master, F_GETFL) | O_NONBLOCK);
        log_info("terminal: node %s workload %s: shell started (%ux%u)", t->node, t->wl_id, o->cols, o->rows);
    } else {
        log_warn("terminal: node %s workload %s: cannot start a shell: %s", t->node, t->wl_id, msg);
    }
    if (t->pid == 0) {
        char line[600];
        int n = snprintf(line, sizeof line, "gpurent: %s\r\n", msg);
        t->reaped = 1;
        t->wait_status = 127 << 8;
        term_frame_append(&t->to_sock, &t->to_sock_len, &t->to_sock_cap, TERM_FRAME_DATA, line, n > 0 && (size_t)n < sizeof line ? (size_t)n : 0);
    }
    free(o);
    pthread_mutex_lock(&ts->lock);
    if (ts->stopping) {
        /* The relay may have gone already: this one ends here. */
        pthread_mutex_unlock(&ts->lock);
        end_all(t);
        return;
    }
    t->next = ts->incoming;
    ts->incoming = t;
    pthread_mutex_unlock(&ts->lock);
    wake(ts);
}

void agent_terminal_open(struct http_request *req, struct agent_node *n, const char *wl_id)
{
    struct agent *a = http_server_app(req->server);
    int64_t cols, rows;
    if (http_query_int(req, "cols", 1, 1000, 80, &cols) < 0 || http_query_int(req, "rows", 1, 1000, 24, &rows) < 0)
        return;
    const char *upgrade = http_header(req, "Upgrade");
    if (!upgrade || strcmp(upgrade, AGENT_TERMINAL_PROTOCOL) != 0 ||
        !http_header_has_token(req, "Connection", "upgrade")) {
        http_error(req, ERR_BAD_REQUEST, NULL, "this route switches protocols: Upgrade: %s and Connection: Upgrade",
                   AGENT_TERMINAL_PROTOCOL);
        return;
    }
    pthread_mutex_lock(&n->lock);
    struct workload *w = agent_node_workload(n, wl_id);
    int found = w != NULL, running = w && !w->removing && w->phase == WL_RUNNING;
    pthread_mutex_unlock(&n->lock);
    if (!found) {
        http_error(req, ERR_NOT_FOUND, NULL, "no workload %s", wl_id);
        return;
    }
    if (!running) {
        http_error(req, ERR_INVALID_STATE, NULL, "workload %s is not running", wl_id);
        return;
    }
    struct term_open *o = calloc(1, sizeof *o);
    if (!o) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    o->agent = a;
    o->node = n;
    snprintf(o->wl_id, sizeof o->wl_id, "%s", wl_id);
    o->cols = (unsigned)cols;
    o->rows = (unsigned)rows;
    /* The shell starts only once the switch is sent: a client that left
     * before it leaves no process behind. */
    if (http_reply_upgrade(req, AGENT_TERMINAL_PROTOCOL, on_upgraded, o) < 0) {
        free(o);
        http_error(req, ERR_INTERNAL, NULL, NULL);
    }
}

/* ---------------------------------------------------------------- the relay */

/* A whole frame from the daemon: data to the PTY, a resize to its size.
 * -1 for a frame the protocol does not have (the connection is dropped). */
static int take_frame(struct term *t, unsigned char type, const unsigned char *p, size_t len)
{
    if (type == TERM_FRAME_DATA) {
        if (t->master < 0 || t->reaped)
            return 0; /* nobody reads it any more */
        unsigned char *grown = realloc(t->to_pty, t->to_pty_len + len);
        if (!grown)
            return -1;
        t->to_pty = grown;
        memcpy(t->to_pty + t->to_pty_len, p, len);
        t->to_pty_len += len;
        return 0;
    }
    if (type == TERM_FRAME_RESIZE && len == 4) {
        unsigned cols = (unsigned)p[0] << 8 | p[1], rows = (unsigned)p[2] << 8 | p[3];
        struct winsize ws = {.ws_col = (unsigned short)cols, .ws_row = (unsigned short)rows};
        if (cols >= 1 && cols <= 1000 && rows >= 1 && rows <= 1000 && t->master >= 0)
            ioctl(t->master, TIOCSWINSZ, &ws); /* the kernel sends the shell SIGWINCH */
        return 0;
    }
    return -1;
}

/* Reads what the daemon sent and acts on each whole frame. */
static void read_sock(struct term *t)
{
    for (;;) {
        size_t want = t->in_len < 5 ? 5 - t->in_len : 5 + term_get_be32(t->in + 1) - t->in_len;
        if (t->in_len >= 5 && term_get_be32(t->in + 1) > TERM_FRAME_MAX) {
            t->sock_gone = 1;
            return;
        }
        if (want == 0) {
            if (take_frame(t, t->in[0], t->in + 5, t->in_len - 5) < 0) {
                log_warn("terminal: node %s workload %s: a frame of type 0x%02x and %zu bytes is not one of the "
                         "protocol's; closing",
                         t->node, t->wl_id, t->in[0], t->in_len - 5);
                t->sock_gone = 1;
                return;
            }
            t->in_len = 0;
            if (t->to_pty_len > 0)
                return; /* written first: what is not yet taken stays in the socket */
            continue;
        }
        ssize_t n = recv(t->sock, t->in + t->in_len, want, 0);
        if (n > 0) {
            t->in_len += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        t->sock_gone = 1;
        return;
    }
}

static void write_pty(struct term *t)
{
    while (t->to_pty_len > 0 && t->master >= 0) {
        ssize_t n = write(t->master, t->to_pty, t->to_pty_len);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                t->to_pty_len = 0; /* the shell is gone: its input goes nowhere */
            return;
        }
        memmove(t->to_pty, t->to_pty + n, t->to_pty_len - (size_t)n);
        t->to_pty_len -= (size_t)n;
    }
}

/* The shell's output as data frames; the PTY closes on its end (EIO). */
static void read_pty(struct term *t)
{
    unsigned char buf[16384];
    while (t->master >= 0 && t->to_sock_len < TERM_OUT_HIGH) {
        ssize_t n = read(t->master, buf, sizeof buf);
        if (n > 0) {
            if (term_frame_append(&t->to_sock, &t->to_sock_len, &t->to_sock_cap, TERM_FRAME_DATA, buf, (size_t)n) < 0)
                t->sock_gone = 1;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        close(t->master); /* EIO: nothing holds the other side any more */
        t->master = -1;
    }
}

static void write_sock(struct term *t)
{
    while (t->to_sock_len > 0 && !t->sock_gone) {
        ssize_t n = send(t->sock, t->to_sock, t->to_sock_len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                t->sock_gone = 1;
            return;
        }
        memmove(t->to_sock, t->to_sock + n, t->to_sock_len - (size_t)n);
        t->to_sock_len -= (size_t)n;
    }
}

static int exit_code(int st)
{
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 255;
}

/* Reaps the shell, hangs it up when the daemon left, queues its end.
 * 1 when the terminal is over and can be freed. */
static int advance(struct term *t)
{
    if (t->pid > 0 && !t->reaped && waitpid(t->pid, &t->wait_status, WNOHANG) == t->pid)
        t->reaped = 1;
    if (t->sock_gone) {
        if (t->reaped)
            return 1;
        int64_t now = clock_mono_ms();
        if (!t->hangup_ms) {
            kill(-t->pid, SIGHUP); /* as a terminal that is closed does */
            t->hangup_ms = now;
        } else if (now - t->hangup_ms > TERM_HANGUP_GRACE_MS) {
            kill(-t->pid, SIGKILL);
        }
        return 0;
    }
    if (t->reaped && !t->exit_queued) {
        /* As an SSH session: the end comes after what the shell wrote. */
        if (t->master >= 0 && t->to_sock_len < TERM_OUT_HIGH)
            read_pty(t);
        if (t->master >= 0 && t->to_sock_len < TERM_OUT_HIGH) {
            close(t->master); /* whatever the shell left behind keeps it no longer */
            t->master = -1;
        }
        if (t->master < 0) {
            unsigned char st[4];
            term_put_be32(st, (uint32_t)exit_code(t->wait_status));
            if (term_frame_append(&t->to_sock, &t->to_sock_len, &t->to_sock_cap, TERM_FRAME_EXIT, st, 4) < 0)
                return 1;
            t->exit_queued = 1;
            log_info("terminal: node %s workload %s: shell ended with status %d", t->node, t->wl_id,
                     exit_code(t->wait_status));
        }
    }
    return t->exit_queued && t->to_sock_len == 0;
}

/* At stop: every shell is hung up, then killed, and reaped. */
static void end_all(struct term *list)
{
    for (struct term *t = list; t; t = t->next)
        if (t->pid > 0 && !t->reaped)
            kill(-t->pid, SIGHUP);
    int64_t deadline = clock_mono_ms() + TERM_HANGUP_GRACE_MS;
    for (struct term *t = list; t; t = t->next) {
        while (t->pid > 0 && !t->reaped) {
            if (waitpid(t->pid, &t->wait_status, WNOHANG) == t->pid) {
                t->reaped = 1;
            } else if (clock_mono_ms() > deadline) {
                kill(-t->pid, SIGKILL);
                waitpid(t->pid, &t->wait_status, 0);
                t->reaped = 1;
            } else {
                usleep(10000);
            }
        }
    }
    while (list) {
        struct term *next = list->next;
        term_free(list);
        list = next;
    }
}

static void *relay_main(void *arg)
{
    struct agent_terminals *ts = arg;
    struct pollfd *pfd = NULL;
    size_t cap = 0;
    for (;;) {
        pthread_mutex_lock(&ts->lock);
        int stopping = ts->stopping;
        while (ts->incoming) {
            struct term *t = ts->incoming;
            ts->incoming = t->next;
            t->next = ts->open;
            ts->open = t;
        }
        pthread_mutex_unlock(&ts->lock);
        if (stopping)
            break;
        size_t n = 1;
        for (struct term *t = ts->open; t; t = t->next)
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
        pfd[0] = (struct pollfd){.fd = ts->wake[0], .events = POLLIN};
        size_t i = 1;
        for (struct term *t = ts->open; t; t = t->next, i += 2) {
            short se = 0, me = 0;
            if (!t->sock_gone && t->to_pty_len == 0)
                se |= POLLIN;
            if (!t->sock_gone && t->to_sock_len > 0)
                se |= POLLOUT;
            if (t->master >= 0 && t->to_sock_len < TERM_OUT_HIGH && !t->sock_gone)
                me |= POLLIN;
            if (t->master >= 0 && t->to_pty_len > 0)
                me |= POLLOUT;
            pfd[i] = (struct pollfd){.fd = se ? t->sock : -1, .events = se};
            pfd[i + 1] = (struct pollfd){.fd = me ? t->master : -1, .events = me};
        }
        /* Children are reaped by polling waitpid: a tenth of a second is
         * soon enough for a shell's end to reach the browser. */
        poll(pfd, n, ts->open ? 100 : -1);
        if (pfd[0].revents) {
            char buf[64];
            while (read(ts->wake[0], buf, sizeof buf) > 0) {
            }
        }
        i = 1;
        for (struct term **pp = &ts->open; *pp; i += 2) {
            struct term *t = *pp;
            if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))
                read_sock(t);
            if (pfd[i + 1].revents & (POLLOUT | POLLERR | POLLHUP))
                write_pty(t);
            if (t->to_pty_len > 0)
                write_pty(t);
            if (t->to_pty_len == 0 && t->in_len >= 5 && !t->sock_gone)
                read_sock(t); /* a frame held back while the PTY was full */
            if (pfd[i + 1].revents & (POLLIN | POLLHUP | POLLERR))
                read_pty(t);
            if (t->to_sock_len > 0)
                write_sock(t);
            if (advance(t)) {
                write_sock(t);
                *pp = t->next;
                t->next = NULL;
                end_all(t);
                continue;
            }
            pp = &t->next;
        }
    }
    free(pfd);
    end_all(ts->open);
    ts->open = NULL;
    return NULL;
}

int agent_terminals_start(struct agent *a)
{
    struct agent_terminals *ts = calloc(1, sizeof *ts);
    if (!ts)
        return -1;
    ts->agent = a;
    pthread_mutex_init(&ts->lock, NULL);
    if (pipe2(ts->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        pthread_mutex_destroy(&ts->lock);
        free(ts);
        return -1;
    }
    if (pthread_create(&ts->thread, NULL, relay_main, ts) != 0) {
        close(ts->wake[0]), close(ts->wake[1]);
        pthread_mutex_destroy(&ts->lock);
        free(ts);
        return -1;
    }
    ts->started = 1;
    a->terminals = ts;
    return 0;
}

void agent_terminals_stop(struct agent *a)
{
    struct agent_terminals *ts = a->terminals;
    if (!ts || !ts->started)
        return;
    pthread_mutex_lock(&ts->lock);
    ts->stopping = 1;
    pthread_mutex_unlock(&ts->lock);
    wake(ts);
    pthread_join(ts->thread, NULL);
    ts->started = 0;
    /* Terminals handed over after the relay's last look. */
    pthread_mutex_lock(&ts->lock);
    struct term *left = ts->incoming;
    ts->incoming = NULL;
    pthread_mutex_unlock(&ts->lock);
    end_all(left);
}

void agent_terminals_free(struct agent *a)
{
    struct agent_terminals *ts = a->terminals;
    if (!ts)
        return;
    agent_terminals_stop(a);
    close(ts->wake[0]), close(ts->wake[1]);
    pthread_mutex_destroy(&ts->lock);
    free(ts);
    a->terminals = NULL;
}
