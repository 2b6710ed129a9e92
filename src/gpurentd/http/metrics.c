/* metrics.c: GET /metrics in the Prometheus text format (version 0.0.4):
 * HTTP requests and latency by method, route and status, counted as requests
 * finish; nodes, cards and instances by state and GPU type, and money
 * counters, read from the database at scrape time; billing pass duration
 * and agent call errors, counted by their loops (loops/counters.c). */
#include "gpurent/clock.h"
#include "gpurent/http_guard.h"
#include "http/api.h"
#include "store/store.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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
        snprintf(out, n, "method=\"any\",route=\"unmatched\""); /* not "": Prometheus reads it as no label */
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
    fprintf(f, "# HELP gpurent_http_requests_refused_unread_total Requests refused before libmicrohttpd read them"
               " (a raw NUL byte in a head, a malformed chunk, a head over its cap; http_guard.h).\n"
               "# TYPE gpurent_http_requests_refused_unread_total counter\n"
               "gpurent_http_requests_refused_unread_total %lld\n",
            (long long)http_guard_refusals());
    return 0;
}

/* One gauge family by state and GPU type, every row of it. */
static int write_labelled(FILE *f, struct store *s, int (*read)(struct store *, struct metric_row **, size_t *),
                          const char *name, const char *help)
{
    struct metric_row *rows;
    size_t n;
    if (read(s, &rows, &n) != STORE_OK)
        return -1;
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s{state=\"%s\",gpu_type=\"%s\"} %lld\n", name, rows[i].a, rows[i].b, (long long)rows[i].value);
    free(rows);
    return 0;
}

static int write_store(FILE *f, struct store *s)
{
    struct gpu_type *types;
    size_t n;
    if (write_labelled(f, s, store_metrics_nodes, "gpurent_nodes", "Registered nodes by state and GPU type.") < 0 ||
        store_gpu_type_list(s, &types, &n) != STORE_OK)
        return -1;
    /* The parts only (Prometheus: a sum over a metric's series must mean
     * something), and the whole as a metric of its own. */
    fprintf(f, "# HELP gpurent_cards Cards on accepted nodes by GPU type: free (rentable now), reserved (idle in"
               " the pool rented through reservations), in use (held by instances), unavailable (unhealthy, or on"
               " nodes not taking work); they sum to gpurent_cards_capacity.\n"
               "# TYPE gpurent_cards gauge\n");
    for (size_t i = 0; i < n; i++) {
        const struct gpu_type *t = &types[i];
        int64_t rest = t->cards_total - t->cards_free - t->cards_reserved_idle - t->cards_in_use;
        fprintf(f,
                "gpurent_cards{gpu_type=\"%s\",status=\"free\"} %lld\n"
                "gpurent_cards{gpu_type=\"%s\",status=\"reserved\"} %lld\n"
                "gpurent_cards{gpu_type=\"%s\",status=\"in_use\"} %lld\n"
                "gpurent_cards{gpu_type=\"%s\",status=\"unavailable\"} %lld\n",
                t->code, (long long)t->cards_free, t->code, (long long)t->cards_reserved_idle, t->code,
                (long long)t->cards_in_use, t->code, (long long)(rest > 0 ? rest : 0));
    }
    fprintf(f, "# HELP gpurent_cards_capacity Cards on accepted nodes (up or offline) by GPU type.\n"
               "# TYPE gpurent_cards_capacity gauge\n");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "gpurent_cards_capacity{gpu_type=\"%s\"} %lld\n", types[i].code, (long long)types[i].cards_total);
    free(types);
    if (write_labelled(f, s, store_metrics_instances, "gpurent_instances", "Instances by state and GPU type.") < 0)
        return -1;
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
            "# TYPE gpurent_credits_refunded_micro_total counter\ngpurent_credits_refunded_micro_total %lld\n"
            "# HELP gpurent_storage_revenue_micro_total Storage of volumes charged (per GB-month), not in"
            " gpurent_revenue_micro_total.\n"
            "# TYPE gpurent_storage_revenue_micro_total counter\ngpurent_storage_revenue_micro_total %lld\n"
            "# HELP gpurent_storage_credits_spent_micro_total Credit spent on storage, not in"
            " gpurent_credits_spent_micro_total.\n"
            "# TYPE gpurent_storage_credits_spent_micro_total counter\ngpurent_storage_credits_spent_micro_total %lld\n",
            (long long)m.revenue, (long long)m.credits_granted, (long long)m.credits_spent,
            (long long)m.credits_expired, (long long)m.topups, (long long)m.refunds, (long long)m.credits_refunded,
            (long long)m.storage_revenue, (long long)m.storage_credits_spent);
    return 0;
}

/* The process metrics every Prometheus client library exports, by their
 * standard names, from /proc and getrusage. */
static void write_process(FILE *f)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        fprintf(f, "# HELP process_cpu_seconds_total User and system CPU time spent.\n"
                   "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.6f\n",
                (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    long page = sysconf(_SC_PAGESIZE);
    unsigned long long vsize = 0, rss = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    if (statm) {
        if (fscanf(statm, "%llu %llu", &vsize, &rss) == 2)
            fprintf(f, "# HELP process_virtual_memory_bytes Virtual memory size.\n"
                       "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n"
                       "# HELP process_resident_memory_bytes Resident memory size.\n"
                       "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %llu\n",
                    vsize * (unsigned long long)page, rss * (unsigned long long)page);
        fclose(statm);
    }
    DIR *fds = opendir("/proc/self/fd");
    if (fds) {
        long open = -1; /* the directory's own descriptor is not the process's */
        while (readdir(fds))
            open++;
        closedir(fds);
        open -= 2; /* "." and ".." */
        fprintf(f, "# HELP process_open_fds Open file descriptors.\n"
                   "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n", open > 0 ? open : 0);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        fprintf(f, "# HELP process_max_fds The limit on open file descriptors.\n"
                   "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
    /* Start time: the 22nd field of /proc/self/stat (clock ticks after
     * boot) plus the boot time, so it is the real clock's, as Prometheus
     * expects, whatever the testing clock says. The boot time is the real
     * clock less the time since boot (CLOCK_BOOTTIME, the clock that field
     * counts in), not /proc/stat's btime: the shipped unit's ProcSubset=pid
     * hides /proc/stat. */
    char buf[1024];
    FILE *st = fopen("/proc/self/stat", "r");
    size_t got = st ? fread(buf, 1, sizeof buf - 1, st) : 0;
    if (st)
        fclose(st);
    buf[got] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ticks = 0;
    for (int field = 2; p && *p && field < 22; p++)
        if (*p == ' ')
            field++;
    struct timespec real, boot;
    if (p && sscanf(p, "%llu", &ticks) == 1 && clock_gettime(CLOCK_REALTIME, &real) == 0 &&
        clock_gettime(CLOCK_BOOTTIME, &boot) == 0) {
        double booted = (double)(real.tv_sec - boot.tv_sec) + (double)(real.tv_nsec - boot.tv_nsec) / 1e9;
        fprintf(f,
                "# HELP process_start_time_seconds Start time of the process since the epoch.\n"
                "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n",
                booted + (double)ticks / (double)sysconf(_SC_CLK_TCK));
    }
    fprintf(f, "# HELP gpurent_build_info The running gpurentd's version (always 1).\n"
               "# TYPE gpurent_build_info gauge\ngpurent_build_info{version=\"%s\"} 1\n",
            GPURENTD_VERSION);
}

void api_metrics(struct http_request *req)
{
    req->routine = 1; /* a scraper's */
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
    write_process(f);
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
    fprintf(f,
            "# HELP gpurent_terminals_open Web terminals open or opening (each holds a connection, no HTTP thread).\n"
            "# TYPE gpurent_terminals_open gauge\ngpurent_terminals_open %lld\n",
            (long long)terminal_relay_open_count());
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
            "# HELP gpurent_reconciler_passes_total Reconciler passes run: sweeps read every instance holding"
            " cards, the passes between them only those needing attention.\n"
            "# TYPE gpurent_reconciler_passes_total counter\n"
            "gpurent_reconciler_passes_total{kind=\"sweep\"} %lld\n"
            "gpurent_reconciler_passes_total{kind=\"attention\"} %lld\n"
            "# HELP gpurent_reconciler_instances_read_total Instances read by reconciler passes.\n"
            "# TYPE gpurent_reconciler_instances_read_total counter\n"
            "gpurent_reconciler_instances_read_total{kind=\"sweep\"} %lld\n"
            "gpurent_reconciler_instances_read_total{kind=\"attention\"} %lld\n"
            "# HELP gpurent_reconciler_workload_calls_total Calls the reconciler made to agents about one workload,"
            " by method: PUT to place it, GET to follow it, DELETE to remove it.\n"
            "# TYPE gpurent_reconciler_workload_calls_total counter\n"
            "gpurent_reconciler_workload_calls_total{method=\"PUT\"} %lld\n"
            "gpurent_reconciler_workload_calls_total{method=\"GET\"} %lld\n"
            "gpurent_reconciler_workload_calls_total{method=\"DELETE\"} %lld\n"
            "# HELP gpurent_reconciler_agent_connections_total Connections to agents the reconciler's calls opened;"
            " the other calls reused one kept from an earlier call.\n"
            "# TYPE gpurent_reconciler_agent_connections_total counter\n"
            "gpurent_reconciler_agent_connections_total %lld\n"
            "# HELP gpurent_agent_call_errors_total Calls to node agents that got no usable reply.\n"
            "# TYPE gpurent_agent_call_errors_total counter\ngpurent_agent_call_errors_total %lld\n"
            "# HELP gpurent_heartbeat_replies_total Good facts replies to the heartbeat: judged, the same bytes"
            " as the reply last recorded for the node, or 304 for that reply's ETag; the last two only move its"
            " last-seen time.\n"
            "# TYPE gpurent_heartbeat_replies_total counter\n"
            "gpurent_heartbeat_replies_total{kind=\"judged\"} %lld\n"
            "gpurent_heartbeat_replies_total{kind=\"repeated\"} %lld\n"
            "gpurent_heartbeat_replies_total{kind=\"not_modified\"} %lld\n"
            "# HELP gpurent_heartbeat_agent_connections_total Connections to agents the heartbeat's polls opened;"
            " the other polls reused one kept from an earlier pass.\n"
            "# TYPE gpurent_heartbeat_agent_connections_total counter\n"
            "gpurent_heartbeat_agent_connections_total %lld\n"
            "# HELP gpurent_testing_clock 1 when time comes from a clock file (never in production).\n"
            "# TYPE gpurent_testing_clock gauge\ngpurent_testing_clock %d\n",
            (long long)lc.billing_passes, (double)lc.billing_last_us / 1e6, (double)lc.billing_total_us / 1e6,
            (long long)lc.reconcile_passes[0], (long long)lc.reconcile_passes[1],
            (long long)lc.reconcile_instances_read[0], (long long)lc.reconcile_instances_read[1],
            (long long)lc.reconcile_calls[0], (long long)lc.reconcile_calls[1], (long long)lc.reconcile_calls[2],
            (long long)lc.reconcile_connections, (long long)lc.agent_errors, (long long)lc.heartbeat_replies[0],
            (long long)lc.heartbeat_replies[1], (long long)lc.heartbeat_replies[2], (long long)lc.heartbeat_connections, clock_is_testing());
    fclose(f);
    if (ok)
        http_reply_raw(req, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    else
        http_error(req, ERR_INTERNAL, NULL, NULL);
    free(text);
}
