/* publish.c: published ports (see agent.h). Each node's host port range
 * comes from publish_port_range; podman and docker publish a workload's
 * ports themselves (-p in its run command line), except a multi-node
 * rank's, which has the host's network (where -p means nothing), and for
 * those and the sim runtime's, whose "containers" share the host's network
 * too, one thread here does it: it listens on 0.0.0.0:<host port> for
 * every such port of every running workload and relays each connection to
 * the socket a process of that workload listens on at <container port>
 * (listening.c; for podman and docker found through the container's main
 * process), the check and the address `ssh -L` uses too, or closes it
 * when there is none. It finds what to listen on by looking at the workload
 * lists every PUBLISH_RESCAN_MS rather than being told by the driver, so
 * the listeners follow the workloads across agent restarts too, and a
 * workload removed or no longer running loses its listeners and relays at
 * the next look. Everything is bounded: listeners, relays, their buffers.
 * For tests: like the rest of the sim, it isolates nothing. */
#include "agent.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpurent/clock.h"

#define RELAY_BUF 16384    /* bytes held per direction of a relay */
#define BIND_RETRY_MS 5000 /* a host port that would not bind is tried again after this */

struct pub_listener {
    int fd;                     /* -1 while the port would not bind */
    struct agent_node *node;    /* whose workload */
    char wl_id[AGENT_NAME_MAX]; /* the workload */
    int host, container;        /* host port -> container port */
    long pid;                   /* podman/docker: the container's main process, 0 until looked up; sim: 0 */
    int seen;                   /* still wanted at the last look */
    int64_t retry_ms;           /* fd -1: monotonic time of the next bind */
};

struct pub_pipe { /* one direction of a relay */
    char buf[RELAY_BUF];
    size_t len, off; /* bytes held, bytes of them sent */
    int eof;         /* the source ended; the destination was shut for writing once drained */
};

struct pub_relay {
    int fd[2];               /* the client, the workload's socket; -1 when free */
    struct agent_node *node; /* whose workload */
    char wl_id[AGENT_NAME_MAX];
    struct pub_pipe pipe[2]; /* pipe[0]: client to workload, pipe[1]: back */
};

/* What a running sim workload publishes, copied out under its node's lock. */
struct pub_want {
    struct agent_node *node;
    char wl_id[AGENT_NAME_MAX];
    int host, container;
    int have; /* rescan: a listener for it exists */
};

struct publisher {
    struct agent *agent;
    atomic_int stopping;
    pthread_t thread;
    struct pub_listener *ls; /* PUBLISH_MAX_LISTENERS entries, n_ls used */
    size_t n_ls;
    struct pub_relay *relays; /* PUBLISH_MAX_RELAYS entries */
    struct pollfd *pfd;       /* PUBLISH_MAX_LISTENERS + 2 * PUBLISH_MAX_RELAYS */
    struct pub_want *want;    /* rescan's scratch, PUBLISH_MAX_LISTENERS entries */
};

int publish_parse_range(const char *s, int *first, int *last)
{
    *first = *last = 0;
    if (!s[0])
        return 0;
    char *end;
    long a = strtol(s, &end, 10);
    if (end == s || *end != '-')
        return -1;
    const char *b_at = end + 1;
    long b = strtol(b_at, &end, 10);
    if (end == b_at || *end || a < 1 || b > 65535 || a > b)
        return -1;
    *first = (int)a;
    *last = (int)b;
    return 0;
}

int publish_assign_ranges(struct agent *a)
{
    int first, last;
    if (publish_parse_range(a->conf->publish_port_range, &first, &last) < 0) {
        log_error("publish_port_range '%s' is not FIRST-LAST", a->conf->publish_port_range);
        return -1;
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct agent_node *n = &a->nodes[i];
        n->publish_first = n->publish_last = 0;
        if (!first)
            continue;
        if (!a->fleet) {
            n->publish_first = first;
            n->publish_last = last;
            continue;
        }
        /* Every node of a sim fleet is on this one machine: each gets its
         * own slice, so no two hand out the same host port. */
        int64_t per = a->conf->sim_publish_ports_per_node;
        int64_t lo = first + (int64_t)i * per, hi = lo + per - 1;
        if (hi > last) {
            /* A fleet larger than the range: the nodes past it publish
             * nothing (placement then sends them no instance with ports). */
            log_warn("publish_port_range %d-%d has no %lld ports (sim_publish_ports_per_node) for node %s and the "
                     "%zu after it: they publish no ports",
                     first, last, (long long)per, n->name, a->n_nodes - i - 1);
            break;
        }
        n->publish_first = (int)lo;
        n->publish_last = (int)hi;
    }
    return 0;
}

static void relay_close(struct pub_relay *r)
{
    for (int i = 0; i < 2; i++) {
        if (r->fd[i] >= 0)
            close(r->fd[i]);
        r->fd[i] = -1;
    }
}

static int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 64) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static struct pub_listener *find_listener(struct publisher *p, const struct pub_want *w)
{
    for (size_t i = 0; i < p->n_ls; i++)
        if (p->ls[i].node == w->node && p->ls[i].host == w->host && p->ls[i].container == w->container &&
            strcmp(p->ls[i].wl_id, w->wl_id) == 0)
            return &p->ls[i];
    return NULL;
}

/* Whether (node, wl_id) still has a listener: its relays live as long. */
static int workload_published(struct publisher *p, const struct agent_node *node, const char *wl_id)
{
    for (size_t i = 0; i < p->n_ls; i++)
        if (p->ls[i].node == node && strcmp(p->ls[i].wl_id, wl_id) == 0)
            return 1;
    return 0;
}

/* Brings the listeners in line with the running workloads this thread
 * publishes for (all of the sim's; podman's and docker's on the host's
 * network). */
static void rescan(struct publisher *p)
{
    struct agent *a = p->agent;
    struct pub_want *want = p->want;
    size_t n_want = 0, dropped = 0;
    for (size_t i = 0; i < p->n_ls; i++)
        p->ls[i].seen = 0;
    for (size_t k = 0; k < a->n_nodes; k++) {
        struct agent_node *n = &a->nodes[k];
        pthread_mutex_lock(&n->lock);
        for (size_t i = 0; i < n->n_wl; i++) {
            const struct workload *w = n->wl[i];
            if (w->removing || w->phase != WL_RUNNING ||
                (a->rt->ops != &sim_runtime_ops && !cluster_multi_node(&w->spec)))
                continue;
            for (int j = 0; j < w->spec.n_ports; j++) {
                if (n_want == PUBLISH_MAX_LISTENERS) {
                    dropped++;
                    continue;
                }
                struct pub_want *x = &want[n_want++];
                x->node = n;
                snprintf(x->wl_id, sizeof x->wl_id, "%s", w->id);
                x->host = w->spec.ports[j].host;
                x->container = w->spec.ports[j].container;
            }
        }
        pthread_mutex_unlock(&n->lock);
    }
    if (dropped)
        log_warn("publish: %zu published ports not served: more than %d at once", dropped, PUBLISH_MAX_LISTENERS);
    /* Those still wanted stay; the others (workload gone or no longer
     * running) are closed and dropped before new ones are added, so the
     * table never holds more than PUBLISH_MAX_LISTENERS. */
    for (size_t i = 0; i < n_want; i++) {
        struct pub_listener *l = find_listener(p, &want[i]);
        want[i].have = l != NULL;
        if (l)
            l->seen = 1;
    }
    for (size_t i = 0; i < p->n_ls;) {
        struct pub_listener *l = &p->ls[i];
        if (l->seen) {
            i++;
            continue;
        }
        if (l->fd >= 0) {
            close(l->fd);
            log_info("node %s: workload %s no longer publishes host port %d", l->node->name, l->wl_id, l->host);
        }
        p->ls[i] = p->ls[--p->n_ls];
    }
    for (size_t i = 0; i < n_want && p->n_ls < PUBLISH_MAX_LISTENERS; i++) {
        if (want[i].have)
            continue;
        struct pub_listener *l = &p->ls[p->n_ls++];
        memset(l, 0, sizeof *l);
        l->node = want[i].node;
        snprintf(l->wl_id, sizeof l->wl_id, "%s", want[i].wl_id);
        l->host = want[i].host;
        l->container = want[i].container;
        l->seen = 1;
        l->fd = -1;
    }
    int64_t now = clock_mono_ms();
    for (size_t i = 0; i < p->n_ls; i++) {
        struct pub_listener *l = &p->ls[i];
        if (l->fd >= 0 || now < l->retry_ms)
            continue;
        l->fd = listen_on(l->host);
        if (l->fd >= 0) {
            log_info("node %s: workload %s publishes host port %d -> %d", l->node->name, l->wl_id, l->host,
                     l->container);
        } else {
            if (l->retry_ms == 0)
                log_warn("node %s: cannot listen on host port %d for workload %s: %s (retrying)", l->node->name,
                         l->host, l->wl_id, strerror(errno));
            l->retry_ms = now + BIND_RETRY_MS;
        }
    }
    for (size_t i = 0; i < PUBLISH_MAX_RELAYS; i++) {
        struct pub_relay *r = &p->relays[i];
        if (r->fd[0] >= 0 && !workload_published(p, r->node, r->wl_id))
            relay_close(r);
    }
}

/* One connection to a published port: relayed when the workload listens
 * on its container port, closed otherwise. */
static void take_connection(struct publisher *p, struct pub_listener *l)
{
    int c = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0)
        return;
    struct pub_relay *r = NULL;
    for (size_t i = 0; i < PUBLISH_MAX_RELAYS && !r; i++)
        if (p->relays[i].fd[0] < 0)
            r = &p->relays[i];
    if (!r) {
        log_warn("publish: host port %d: %d connections are relayed already; refused", l->host, PUBLISH_MAX_RELAYS);
        close(c);
        return;
    }
    /* podman/docker: the container's sockets are known through its main
     * process, asked of the runtime (a command, so once per listener) and
     * asked again when the one known serves nothing: the container may
     * have been started anew. */
    const struct runtime *rt = p->agent->rt;
    int oci = rt->ops != &sim_runtime_ops, found = 0;
    struct listen_addr at;
    for (int fresh = 0; fresh < 2 && !found; fresh++) {
        char why[256];
        if (oci && (fresh || !l->pid) && rt->ops->main_pid(rt, l->wl_id, &l->pid, why, sizeof why) != STEP_OK) {
            log_info("node %s: host port %d: workload %s: %s", l->node->name, l->host, l->wl_id, why);
            break;
        }
        found = workload_listener(l->wl_id, l->pid, l->container, &at);
        if (!oci)
            break;
    }
    if (!found) {
        log_info("node %s: host port %d: nothing of workload %s listens on %d; connection closed", l->node->name,
                 l->host, l->wl_id, l->container);
        close(c);
        return;
    }
    /* Loopback: the connect is immediate, so it is made blocking. */
    int w = listen_addr_connect(l->pid, &at, 0);
    if (w < 0 || fcntl(w, F_SETFL, fcntl(w, F_GETFL) | O_NONBLOCK) < 0) {
        log_info("node %s: host port %d: cannot reach port %d of workload %s: %s", l->node->name, l->host, l->container,
                 l->wl_id, strerror(errno));
        if (w >= 0)
            close(w);
        close(c);
        return;
    }
    memset(r->pipe, 0, sizeof r->pipe);
    r->fd[0] = c;
    r->fd[1] = w;
    r->node = l->node;
    snprintf(r->wl_id, sizeof r->wl_id, "%s", l->wl_id);
}

/* Moves what it can of direction d of r; -1 when the relay is over. */
static int pump(struct pub_relay *r, int d, short src_ev, short dst_ev)
{
    struct pub_pipe *q = &r->pipe[d];
    int src = r->fd[d], dst = r->fd[1 - d];
    if (q->len == 0 && !q->eof && (src_ev & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t got = read(src, q->buf, sizeof q->buf);
        if (got > 0) {
            q->len = (size_t)got;
            q->off = 0;
        } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
            q->eof = 1;
            shutdown(dst, SHUT_WR);
        }
    }
    /* Non-blocking: a write that would block just waits for POLLOUT. */
    if (q->len > q->off) {
        /* MSG_NOSIGNAL: a peer gone is an error here, not a SIGPIPE. */
        ssize_t put = send(dst, q->buf + q->off, q->len - q->off, MSG_NOSIGNAL);
        if (put > 0) {
            q->off += (size_t)put;
            if (q->off == q->len)
                q->len = q->off = 0;
        } else if (put < 0 && errno != EAGAIN && errno != EINTR) {
            return -1;
        }
    }
    return 0;
}

static void *publish_main(void *arg)
{
    struct publisher *p = arg;
    int64_t next_scan = 0;
    while (!atomic_load(&p->stopping)) {
        int64_t now = clock_mono_ms();
        if (now >= next_scan) {
            rescan(p);
            next_scan = now + PUBLISH_RESCAN_MS;
        }
        size_t n = 0;
        for (size_t i = 0; i < p->n_ls; i++)
            p->pfd[n++] = (struct pollfd){.fd = p->ls[i].fd, .events = POLLIN};
        size_t relay_base = n;
        for (size_t i = 0; i < PUBLISH_MAX_RELAYS; i++) {
            struct pub_relay *r = &p->relays[i];
            for (int d = 0; d < 2; d++) {
                /* Read while this side's buffer is empty; write while the
                 * other direction holds bytes for it. */
                short ev = 0;
                if (r->fd[0] >= 0 && r->pipe[d].len == 0 && !r->pipe[d].eof)
                    ev |= POLLIN;
                if (r->fd[0] >= 0 && r->pipe[1 - d].len > r->pipe[1 - d].off)
                    ev |= POLLOUT;
                p->pfd[n++] = (struct pollfd){.fd = r->fd[0] >= 0 ? r->fd[d] : -1, .events = ev};
            }
        }
        int64_t wait = next_scan - clock_mono_ms();
        if (poll(p->pfd, n, wait > 0 ? (int)wait : 0) < 0 && errno != EINTR) {
            log_warn("publish: poll: %s", strerror(errno));
            continue;
        }
        for (size_t i = 0; i < p->n_ls && i < relay_base; i++)
            if (p->ls[i].fd >= 0 && (p->pfd[i].revents & POLLIN))
                take_connection(p, &p->ls[i]);
        for (size_t i = 0; i < PUBLISH_MAX_RELAYS; i++) {
            struct pub_relay *r = &p->relays[i];
            /* Slots taken by take_connection just now have no events yet. */
            struct pollfd *ev = &p->pfd[relay_base + 2 * i];
            if (r->fd[0] < 0 || ev[0].fd != r->fd[0])
                continue;
            if (pump(r, 0, ev[0].revents, ev[1].revents) < 0 || pump(r, 1, ev[1].revents, ev[0].revents) < 0 ||
                (r->pipe[0].eof && r->pipe[1].eof && r->pipe[0].len == 0 && r->pipe[1].len == 0))
                relay_close(r);
        }
    }
    for (size_t i = 0; i < p->n_ls; i++)
        if (p->ls[i].fd >= 0)
            close(p->ls[i].fd);
    p->n_ls = 0;
    for (size_t i = 0; i < PUBLISH_MAX_RELAYS; i++)
        relay_close(&p->relays[i]);
    return NULL;
}

int publish_start(struct agent *a, struct publisher **out)
{
    *out = NULL;
    int any = 0;
    for (size_t i = 0; i < a->n_nodes; i++)
        any |= a->nodes[i].publish_first > 0;
    if (!any)
        return 0;
    struct publisher *p = calloc(1, sizeof *p);
    if (p) {
        p->agent = a;
        p->ls = calloc(PUBLISH_MAX_LISTENERS, sizeof *p->ls);
        p->relays = calloc(PUBLISH_MAX_RELAYS, sizeof *p->relays);
        p->pfd = calloc(PUBLISH_MAX_LISTENERS + 2 * PUBLISH_MAX_RELAYS, sizeof *p->pfd);
        p->want = calloc(PUBLISH_MAX_LISTENERS, sizeof *p->want);
    }
    if (!p || !p->ls || !p->relays || !p->pfd || !p->want) {
        log_error("publish: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < PUBLISH_MAX_RELAYS; i++)
        p->relays[i].fd[0] = p->relays[i].fd[1] = -1;
    if (pthread_create(&p->thread, NULL, publish_main, p) != 0) {
        log_error("publish: cannot start its thread");
        goto fail;
    }
    *out = p;
    return 0;
fail:
    if (p) {
        free(p->ls);
        free(p->relays);
        free(p->pfd);
        free(p->want);
        free(p);
    }
    return -1;
}

void publish_stop(struct publisher *p)
{
    if (!p)
        return;
    atomic_store(&p->stopping, 1);
    pthread_join(p->thread, NULL);
    free(p->ls);
    free(p->relays);
    free(p->pfd);
    free(p->want);
    free(p);
}
