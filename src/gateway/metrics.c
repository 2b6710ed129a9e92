/* metrics.c: the gateway's Prometheus metrics (text format 0.0.4), served
 * on a listener of their own, --metrics-listen, apart from the consumers'
 * port: calls by status and how long they took, calls in flight, upstreams
 * paused for slow clients, the copy's freshness and the usage records
 * gpurentd has not yet answered for are the operator's business, not the
 * consumers'. Off unless the option is given. */
#include "gateway.h"
#include "gpurent/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define STATUS_MAX 600 /* calls_by_status covers 100..599 */

/* The upper bounds of the duration histogram's buckets, in ms. */
static const int64_t bucket_ms[] = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000};
#define N_BUCKETS (sizeof bucket_ms / sizeof bucket_ms[0])

static atomic_llong calls_by_status[STATUS_MAX];
static atomic_llong calls_in_bucket[N_BUCKETS + 1]; /* the last: over every bound (+Inf only) */
static atomic_llong duration_ms_sum;
static struct MHD_Daemon *listener;

void gw_metrics_call(int status, int64_t duration_ms)
{
    if (status < 100 || status >= STATUS_MAX)
        status = 499; /* the client left before an answer began, as nginx logs it */
    if (duration_ms < 0)
        duration_ms = 0;
    atomic_fetch_add(&calls_by_status[status], 1);
    size_t b = 0;
    while (b < N_BUCKETS && duration_ms > bucket_ms[b])
        b++;
    atomic_fetch_add(&calls_in_bucket[b], 1);
    atomic_fetch_add(&duration_ms_sum, duration_ms);
}

/* A growing text; on running out of memory it stops growing and the
 * scrape fails (ok = 0). */
struct text {
    char *p;
    size_t len, cap;
    int ok;
};

static void put(struct text *t, const char *fmt, ...)
{
    for (int tries = 0; t->ok && tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->ok = 0;
        } else if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        } else {
            size_t cap = (t->cap + (size_t)n) * 2;
            char *grown = realloc(t->p, cap);
            if (!grown)
                t->ok = 0;
            else
                t->p = grown, t->cap = cap;
        }
    }
}

/* ms as seconds with three decimals, exactly (no float rounding). */
/* Milliseconds as seconds, exactly and in the shortest form ("0.01", "1",
 * "2.5"): a bucket's le is matched as text by PromQL selectors, and other
 * exporters (gpurentd's %g among them) write it so. */
static void put_seconds(struct text *t, int64_t ms)
{
    int64_t frac = ms % 1000;
    int digits = 3;
    while (frac && frac % 10 == 0)
        frac /= 10, digits--;
    if (frac)
        put(t, "%lld.%0*lld", (long long)(ms / 1000), digits, (long long)frac);
    else
        put(t, "%lld", (long long)(ms / 1000));
}

static char *render(size_t *len)
{
    struct text t = {.p = malloc(8192), .cap = 8192, .ok = 1};
    if (!t.p)
        return NULL;
    t.p[0] = '\0';
    put(&t, "# HELP gpurent_gateway_calls_total Calls to /apps/{slug}/..., by the status they were answered with "
            "(the gateway's own refusals included; 499: the client left before an answer began).\n"
            "# TYPE gpurent_gateway_calls_total counter\n");
    for (int s = 100; s < STATUS_MAX; s++) {
        long long n = atomic_load(&calls_by_status[s]);
        if (n)
            put(&t, "gpurent_gateway_calls_total{code=\"%d\"} %lld\n", s, n);
    }
    put(&t, "# HELP gpurent_gateway_call_duration_seconds From a call's request to the end of its answer.\n"
            "# TYPE gpurent_gateway_call_duration_seconds histogram\n");
    long long cumulative = 0;
    for (size_t b = 0; b < N_BUCKETS; b++) {
        cumulative += atomic_load(&calls_in_bucket[b]);
        put(&t, "gpurent_gateway_call_duration_seconds_bucket{le=\"");
        put_seconds(&t, bucket_ms[b]);
        put(&t, "\"} %lld\n", cumulative);
    }
    cumulative += atomic_load(&calls_in_bucket[N_BUCKETS]);
    put(&t, "gpurent_gateway_call_duration_seconds_bucket{le=\"+Inf\"} %lld\n", cumulative);
    put(&t, "gpurent_gateway_call_duration_seconds_sum ");
    put_seconds(&t, atomic_load(&duration_ms_sum));
    put(&t, "\ngpurent_gateway_call_duration_seconds_count %lld\n", cumulative);

    int64_t in_flight, paused, syncs, age_ms, pending;
    gw_proxy_counts(&in_flight, &paused);
    gw_copy_info(&syncs, &age_ms);
    gw_usage_pending(&pending);
    put(&t, "# HELP gpurent_gateway_calls_in_flight Calls between their request and the end of their answer.\n"
            "# TYPE gpurent_gateway_calls_in_flight gauge\ngpurent_gateway_calls_in_flight %lld\n"
            "# HELP gpurent_gateway_upstreams_paused Upstream transfers paused while a slow client catches up.\n"
            "# TYPE gpurent_gateway_upstreams_paused gauge\ngpurent_gateway_upstreams_paused %lld\n"
            "# HELP gpurent_gateway_syncs_total Copies of the marketplace taken from gpurentd.\n"
            "# TYPE gpurent_gateway_syncs_total counter\ngpurent_gateway_syncs_total %lld\n"
            "# HELP gpurent_gateway_copy_loaded 1 once a copy is loaded and calls are served.\n"
            "# TYPE gpurent_gateway_copy_loaded gauge\ngpurent_gateway_copy_loaded %d\n",
        (long long)in_flight, (long long)paused, (long long)syncs, age_ms >= 0);
    if (age_ms >= 0) {
        put(&t, "# HELP gpurent_gateway_copy_age_seconds Since the copy served from was taken.\n"
                "# TYPE gpurent_gateway_copy_age_seconds gauge\ngpurent_gateway_copy_age_seconds ");
        put_seconds(&t, age_ms);
        put(&t, "\n");
    }
    put(&t, "# HELP gpurent_gateway_usage_records_pending Usage records gpurentd has not yet answered for.\n"
            "# TYPE gpurent_gateway_usage_records_pending gauge\ngpurent_gateway_usage_records_pending %lld\n",
        (long long)pending);
    if (!t.ok) {
        free(t.p);
        return NULL;
    }
    *len = t.len;
    return t.p;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type, char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned status, const char *text)
{
    char *body = strdup(text);
    return body ? reply(conn, status, "text/plain; charset=utf-8", body, strlen(body)) : MHD_NO;
}

static enum MHD_Result on_scrape(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    (void)upload;
    if (!*con_cls) { /* headers in; a body, if any, is read and dropped */
        *con_cls = (void *)1;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(url, "/metrics") != 0)
        return reply_text(conn, 404, "only /metrics here\n");
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply_text(conn, 405, "GET /metrics\n");
    size_t len = 0;
    char *text = render(&len);
    if (!text)
        return MHD_NO; /* out of memory: the connection is closed */
    return reply(conn, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

int gw_metrics_start(void)
{
    if (!gw_opts.metrics_port)
        return 0;
    struct sockaddr_storage sa;
    socklen_t salen;
    if (gw_resolve_listen(gw_opts.metrics_host, gw_opts.metrics_port, &sa, &salen) < 0) {
        log_error("gateway: cannot use --metrics-listen %s:%d", gw_opts.metrics_host, gw_opts.metrics_port);
        return -1;
    }
    /* poll or epoll, not select: the gateway's own sockets may number
     * past FD_SETSIZE, and select() could not take a scrape's then. */
    listener = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG |
                                    (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
                                0, NULL, NULL, on_scrape, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned int)64, MHD_OPTION_CONNECTION_TIMEOUT,
                                (unsigned int)30, MHD_OPTION_END);
    if (!listener) {
        log_error("gateway: cannot listen on %s:%d for metrics", gw_opts.metrics_host, gw_opts.metrics_port);
        return -1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(listener, MHD_DAEMON_INFO_BIND_PORT);
    log_info("gpurent-gateway: metrics on %s:%u/metrics", gw_opts.metrics_host, info ? info->port : 0);
    return 0;
}

void gw_metrics_stop(void)
{
    if (listener)
        MHD_stop_daemon(listener);
    listener = NULL;
}
