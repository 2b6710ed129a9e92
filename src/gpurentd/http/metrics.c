/* metrics.c: GET /metrics in the Prometheus text format (version 0.0.4):
 * HTTP requests and latency by method, route and status, counted as requests
 * finish; nodes, cards and instances by state and GPU type, and money
 * counters, read from the database at scrape time; billing pass duration
 * and agent call errors, counted by their loops (loops/counters.c). */
#include "gpurent/clock.h"
#include "http/api.h"
#include "store/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROUTES 128
#define STATUS_SLOTS 24
static const double bucket_seconds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
#define N_BUCKETS (sizeof bucket_seconds / sizeof bucket_seconds[0])

/* One status of one route: its request count and latency histogram. */
struct status_stats {
    unsigned status;            /* status code; 0: no answer (client went away) */
    int64_t count;              /* requests; 0 marks a free slot */
    int64_t buckets[N_BUCKETS]; /* requests at or below each bound */
    int64_t sum_us;             /* total duration */
};

/* One route's requests by status. Index MAX_ROUTES collects requests that
 * matched no route. Each route keeps at most STATUS_SLOTS statuses, which
 * bounds the series both the counter and the histogram can make: a route
 * only answers a handful of statuses, and the unmatched one only 404, 405,
 * 413, 414 and the like, whatever clients send. A status beyond the
 * slots is left out of both, rather than lumped under a wrong label. */
struct route_stats {
    struct status_stats slot[STATUS_SLOTS];
    int64_t total; /* all requests; non-zero marks a route that served some */
};

static struct route_stats routes[MAX_ROUTES + 1];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards routes */

void metrics_http_done(const struct http_request *req, int64_t us)
{
    size_t idx = MAX_ROUTES;
    if (req->route) {
        ptrdiff_t i = req->route - daemon_routes;
        if (i >= 0 && i < MAX_ROUTES)
            idx = (size_t)i;
    }
    unsigned status = req->replied ? req->status : 0;
    pthread_mutex_lock(&lock);
    struct route_stats *r = &routes[idx];
    /* A slot is free while its count is 0 (status 0 is a real value: a
     * request that got no answer), so unanswered requests never merge into
     * the next status seen. */
    struct status_stats *st = NULL;
    for (size_t k = 0; k < STATUS_SLOTS; k++) {
        if (r->slot[k].count == 0 || r->slot[k].status == status) {
            st = &r->slot[k];
            break;
        }
    }
    r->total++;
    if (st) {
        st->status = status;
        st->count++;
        for (size_t b = 0; b < N_BUCKETS; b++)
            if ((double)us <= bucket_seconds[b] * 1e6)
                st->buckets[b]++;
        st->sum_us += us;
    }
    pthread_mutex_unlock(&lock);
}

static void route_labels(size_t idx, char *out, size_t n)
{
    if (idx == MAX_ROUTES)
        snprintf(out, n, "method=\"\",route=\"unmatched\"");
    else
        snprintf(out, n, "method=\"%s\",route=\"%s\"", daemon_routes[idx].method, daemon_routes[idx].pattern);
}

static int write_http(FILE *f)
{
    /* A copy per scrape (the API's pool and the metrics listener may scrape
     * at once), so the lock is held for a memcpy, not for the formatting. */
    struct route_stats *copy = malloc(sizeof routes);
    if (!copy)
        return -1;
    pthread_mutex_lock(&lock);
    memcpy(copy, routes, sizeof routes);
    pthread_mutex_unlock(&lock);
    char labels[256];
    fprintf(f, "# HELP gpurent_http_requests_total HTTP requests by route and status (0: the connection closed"
               " before a reply).\n"
               "# TYPE gpurent_http_requests_total counter\n");
    for (size_t i = 0; i <= MAX_ROUTES; i++) {
        if (!copy[i].total)
            continue; /* only indexes of routes that served requests are valid */
        route_labels(i, labels, sizeof labels);
        for (size_t k = 0; k < STATUS_SLOTS && copy[i].slot[k].count; k++)
            fprintf(f, "gpurent_http_requests_total{%s,status=\"%u\"} %lld\n", labels, copy[i].slot[k].status,
                    (long long)copy[i].slot[k].count);
    }
    fprintf(f, "# HELP gpurent_http_request_duration_seconds Time from a request's first byte to its completion,"
               " by route and status.\n"
               "# TYPE gpurent_http_request_duration_seconds histogram\n");
    for (size_t i = 0; i <= MAX_ROUTES; i++) {
        if (!copy[i].total)
            continue;
        route_labels(i, labels, sizeof labels);
        for (size_t k = 0; k < STATUS_SLOTS && copy[i].slot[k].count; k++) {
            const struct status_stats *st = &copy[i].slot[k];
            for (size_t b = 0; b < N_BUCKETS; b++)
                fprintf(f, "gpurent_http_request_duration_seconds_bucket{%s,status=\"%u\",le=\"%g\"} %lld\n", labels,
                        st->status, bucket_seconds[b], (long long)st->buckets[b]);
            fprintf(f, "gpurent_http_request_duration_seconds_bucket{%s,status=\"%u\",le=\"+Inf\"} %lld\n", labels,
                    st->status, (long long)st->count);
            fprintf(f, "gpurent_http_request_duration_seconds_sum{%s,status=\"%u\"} %.6f\n", labels, st->status,
                    (double)st->sum_us / 1e6);
            fprintf(f, "gpurent_http_request_duration_seconds_count{%s,status=\"%u\"} %lld\n", labels, st->status,
                    (long long)st->count);
        }
    }
    free(copy);
    return 0;
}

static int write_store(FILE *f, struct store *s)
{
    static _Thread_local struct metric_row rows[512];
    static _Thread_local struct gpu_type types[64];
    size_t n;
    if (store_metrics_nodes(s, rows, 512, &n) != STORE_OK)
        return -1;
    fprintf(f, "# HELP gpurent_nodes Registered nodes by state and GPU type.\n# TYPE gpurent_nodes gauge\n");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "gpurent_nodes{state=\"%s\",gpu_type=\"%s\"} %lld\n", rows[i].a, rows[i].b,
                (long long)rows[i].value);
    if (store_gpu_type_list(s, types, 64, &n) != STORE_OK)
        return -1;
    fprintf(f, "# HELP gpurent_cards Cards by GPU type: total (accepted nodes), free (rentable now), in use.\n"
               "# TYPE gpurent_cards gauge\n");
    for (size_t i = 0; i < n; i++)
        fprintf(f,
                "gpurent_cards{gpu_type=\"%s\",status=\"total\"} %lld\n"
                "gpurent_cards{gpu_type=\"%s\",status=\"free\"} %lld\n"
                "gpurent_cards{gpu_type=\"%s\",status=\"in_use\"} %lld\n",
                types[i].code, (long long)types[i].cards_total, types[i].code, (long long)types[i].cards_free,
                types[i].code, (long long)types[i].cards_in_use);
    if (store_metrics_instances(s, rows, 512, &n) != STORE_OK)
        return -1;
    fprintf(f, "# HELP gpurent_instances Instances by state and GPU type.\n# TYPE gpurent_instances gauge\n");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "gpurent_instances{state=\"%s\",gpu_type=\"%s\"} %lld\n", rows[i].a, rows[i].b,
                (long long)rows[i].value);
    struct money_totals m;
    if (store_metrics_money(s, &m) != STORE_OK)
        return -1;
    fprintf(f,
            "# HELP gpurent_revenue_micro_total Usage charged, in micro-units of the platform currency.\n"
            "# TYPE gpurent_revenue_micro_total counter\ngpurent_revenue_micro_total %lld\n"
            "# HELP gpurent_credits_granted_micro_total Credit granted (sign-up, invite codes, admins).\n"
            "# TYPE gpurent_credits_granted_micro_total counter\ngpurent_credits_granted_micro_total %lld\n"
            "# HELP gpurent_credits_spent_micro_total Credit spent on usage.\n"
            "# TYPE gpurent_credits_spent_micro_total counter\ngpurent_credits_spent_micro_total %lld\n"
            "# HELP gpurent_credits_expired_micro_total Credit voided when it expired.\n"
            "# TYPE gpurent_credits_expired_micro_total counter\ngpurent_credits_expired_micro_total %lld\n"
            "# HELP gpurent_topups_micro_total Cash added by top-ups.\n"
            "# TYPE gpurent_topups_micro_total counter\ngpurent_topups_micro_total %lld\n"
            "# HELP gpurent_refunds_micro_total Usage charged and given back (time that turned out not to have"
            " run); revenue less this is what was earned.\n"
            "# TYPE gpurent_refunds_micro_total counter\ngpurent_refunds_micro_total %lld\n"
            "# HELP gpurent_credits_refunded_micro_total Of the refunds, what went back to credit grants.\n"
            "# TYPE gpurent_credits_refunded_micro_total counter\ngpurent_credits_refunded_micro_total %lld\n",
            (long long)m.revenue, (long long)m.credits_granted, (long long)m.credits_spent,
            (long long)m.credits_expired, (long long)m.topups, (long long)m.refunds, (long long)m.credits_refunded);
    return 0;
}

void api_metrics(struct http_request *req)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    struct store *s = store_thread();
    if (!f || !s) {
        if (f)
            fclose(f);
        free(text);
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    int ok = write_http(f) == 0;
    ok = ok && write_store(f, s) == 0;
    struct store_txn_stats txn;
    store_txn_stats(&txn);
    fprintf(f,
            "# HELP gpurent_store_commits_total Durable commits (one fsync each) of write transactions.\n"
            "# TYPE gpurent_store_commits_total counter\ngpurent_store_commits_total %lld\n"
            "# HELP gpurent_store_transactions_total Write transactions committed; several share a commit when"
            " writers queue.\n"
            "# TYPE gpurent_store_transactions_total counter\ngpurent_store_transactions_total %lld\n"
            "# HELP gpurent_store_writers_waiting Write transactions queued for the next commit.\n"
            "# TYPE gpurent_store_writers_waiting gauge\ngpurent_store_writers_waiting %lld\n"
            "# HELP gpurent_store_disk_full 1 while writes fail because the database's file system is full.\n"
            "# TYPE gpurent_store_disk_full gauge\ngpurent_store_disk_full %d\n",
            (long long)txn.commits, (long long)txn.transactions, (long long)txn.waiting, store_disk_full());
    fprintf(f,
            "# HELP gpurent_logs_reads_pending Log reads (GET /v1/instances/{id}/logs) waiting on a node's agent.\n"
            "# TYPE gpurent_logs_reads_pending gauge\ngpurent_logs_reads_pending %lld\n",
            (long long)logs_proxy_pending());
    signup_metrics_write(f);
    struct billing_failures bf;
    billing_failures(&bf);
    struct loop_counters lc;
    loop_counters(&lc);
    fprintf(f,
            "# HELP gpurent_billing_user_failures_total Times billing one user failed and the user was skipped"
            " for the pass.\n"
            "# TYPE gpurent_billing_user_failures_total counter\ngpurent_billing_user_failures_total %lld\n"
            "# HELP gpurent_billing_users_failing Users whose last billing failed.\n"
            "# TYPE gpurent_billing_users_failing gauge\ngpurent_billing_users_failing %lld\n"
            "# HELP gpurent_billing_users_failing_repeatedly Users whose billing failed in more than one pass in a"
            " row.\n"
            "# TYPE gpurent_billing_users_failing_repeatedly gauge\ngpurent_billing_users_failing_repeatedly %lld\n",
            (long long)bf.total, (long long)bf.users, (long long)bf.users_repeated);
    fprintf(f,
            "# HELP gpurent_billing_passes_total Billing passes run.\n"
            "# TYPE gpurent_billing_passes_total counter\ngpurent_billing_passes_total %lld\n"
            "# HELP gpurent_billing_pass_duration_seconds How long the last billing pass took.\n"
            "# TYPE gpurent_billing_pass_duration_seconds gauge\ngpurent_billing_pass_duration_seconds %.6f\n"
            "# HELP gpurent_billing_pass_seconds_total Time spent in billing passes.\n"
            "# TYPE gpurent_billing_pass_seconds_total counter\ngpurent_billing_pass_seconds_total %.6f\n"
            "# HELP gpurent_agent_call_errors_total Calls to node agents that got no usable reply.\n"
            "# TYPE gpurent_agent_call_errors_total counter\ngpurent_agent_call_errors_total %lld\n"
            "# HELP gpurent_testing_clock 1 when time comes from a clock file (never in production).\n"
            "# TYPE gpurent_testing_clock gauge\ngpurent_testing_clock %d\n",
            (long long)lc.billing_passes, (double)lc.billing_last_us / 1e6, (double)lc.billing_total_us / 1e6,
            (long long)lc.agent_errors, clock_is_testing());
    fclose(f);
    if (ok)
        http_reply_raw(req, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    else
        http_error(req, ERR_INTERNAL, NULL, NULL);
    free(text);
}
