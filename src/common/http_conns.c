/* http_conns.c: the table of open connections behind http_conns.h, its
 * accept policy and the reaper thread that ends connections whose request
 * is too slow to arrive. */
#include "gpurent/http_conns.h"

#include "gpurent/clock.h"
#include "gpurent/log.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct http_conn {
    int fd;                     /* libmicrohttpd's socket: it is closed only after the close notice */
    int family;                 /* AF_INET or AF_INET6 */
    unsigned char addr[16];     /* the peer's address bytes */
    enum http_conn_phase phase; /* where its current request is */
    int64_t deadline_ms;        /* monotonic; 0 = none */
    int64_t since_ms;           /* monotonic: when it entered its phase */
    int shut;                   /* the reaper already shut it down */
    struct http_conn *prev, *next;
};

struct http_conns {
    struct http_conns_limits limits;
    pthread_mutex_t lock;       /* guards everything below */
    pthread_cond_t wake;        /* stop */
    struct http_conn *head;     /* every tracked connection */
    int open;                   /* entries of the list */
    int stopping;
    pthread_t reaper;
    atomic_llong timed_out;
    atomic_llong evicted;
};

/* The reaper looks this often: deadlines are met to within it. */
#define REAP_EVERY_MS 200

static int addr_key(const struct sockaddr *sa, int *family, unsigned char out[16])
{
    memset(out, 0, 16);
    if (sa && sa->sa_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
        *family = AF_INET;
        return 0;
    }
    if (sa && sa->sa_family == AF_INET6) {
        memcpy(out, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
        *family = AF_INET6;
        return 0;
    }
    *family = 0;
    return -1;
}

static int64_t deadline_for(const struct http_conns *c, enum http_conn_phase phase)
{
    int64_t t = phase == HTTP_CONN_HEADERS ? c->limits.header_timeout_ms
                : phase == HTTP_CONN_BODY  ? c->limits.body_timeout_ms
                                           : 0;
    return t > 0 ? clock_mono_ms() + t : 0;
}

static void *reaper_main(void *arg)
{
    struct http_conns *c = arg;
    pthread_mutex_lock(&c->lock);
    while (!c->stopping) {
        int64_t now = clock_mono_ms();
        for (struct http_conn *p = c->head; p; p = p->next) {
            if (p->shut || !p->deadline_ms || now < p->deadline_ms)
                continue;
            /* libmicrohttpd sees the end of the stream and closes the
             * connection itself (its fd stays open until the close
             * notice, which takes this lock, so it cannot be reused). */
            shutdown(p->fd, SHUT_RDWR);
            p->shut = 1;
            atomic_fetch_add(&c->timed_out, 1);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += REAP_EVERY_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->wake, &c->lock, &ts);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

struct http_conns *http_conns_new(const struct http_conns_limits *limits)
{
    struct http_conns *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->limits = *limits;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->wake, NULL);
    if (pthread_create(&c->reaper, NULL, reaper_main, c) != 0) {
        log_error("http: cannot start the slow-request reaper");
        pthread_cond_destroy(&c->wake);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return NULL;
    }
    return c;
}

void http_conns_free(struct http_conns *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->stopping = 1;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->reaper, NULL);
    while (c->head) {
        struct http_conn *p = c->head;
        c->head = p->next;
        free(p);
    }
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

int http_conns_accept(struct http_conns *c, const struct sockaddr *addr)
{
    int family;
    unsigned char key[16];
    if (addr_key(addr, &family, key) < 0)
        return 1;
    pthread_mutex_lock(&c->lock);
    int waiting = 0;
    struct http_conn *oldest = NULL;
    for (struct http_conn *p = c->head; p; p = p->next)
        if (p->phase == HTTP_CONN_HEADERS && !p->shut && p->family == family && memcmp(p->addr, key, 16) == 0) {
            waiting++;
            if (!oldest || p->since_ms < oldest->since_ms)
                oldest = p;
        }
    int crowded = c->limits.max_connections > 0 && c->open >= c->limits.max_connections * 9 / 10;
    int cap = c->limits.max_headers_per_client;
    int ok = 1;
    if (crowded && waiting >= 2) {
        ok = 0;
    } else if (cap > 0 && waiting >= cap) {
        /* At its cap the address's longest-waiting connection makes room:
         * an idle keep-alive one of a NAT neighbour (its client reconnects)
         * or a trickler, never one whose request is being answered. */
        shutdown(oldest->fd, SHUT_RDWR);
        oldest->shut = 1;
        atomic_fetch_add(&c->evicted, 1);
    }
    pthread_mutex_unlock(&c->lock);
    return ok;
}

struct http_conn *http_conns_opened(struct http_conns *c, int fd, const struct sockaddr *addr)
{
    struct http_conn *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->fd = fd;
    addr_key(addr, &p->family, p->addr);
    p->phase = HTTP_CONN_HEADERS;
    p->deadline_ms = deadline_for(c, HTTP_CONN_HEADERS);
    p->since_ms = clock_mono_ms();
    pthread_mutex_lock(&c->lock);
    p->next = c->head;
    if (c->head)
        c->head->prev = p;
    c->head = p;
    c->open++;
    pthread_mutex_unlock(&c->lock);
    return p;
}

void http_conns_closed(struct http_conns *c, struct http_conn *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&c->lock);
    if (p->prev)
        p->prev->next = p->next;
    else
        c->head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    c->open--;
    pthread_mutex_unlock(&c->lock);
    free(p);
}

void http_conns_set_phase(struct http_conns *c, struct http_conn *p, enum http_conn_phase phase)
{
    if (!p)
        return;
    pthread_mutex_lock(&c->lock);
    p->phase = phase;
    p->deadline_ms = deadline_for(c, phase);
    p->since_ms = clock_mono_ms();
    pthread_mutex_unlock(&c->lock);
}

int64_t http_conns_timed_out(struct http_conns *c)
{
    return c ? (int64_t)atomic_load(&c->timed_out) : 0;
}
