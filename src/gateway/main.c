/* main.c: gpurent-gateway's entry point: options, the listener (a thread
 * per connection, so a call held for a cold start or a long stream blocks
 * only its own), and an orderly stop on SIGTERM. See gateway.h. */
#include "gateway.h"
#include "gpurent/conf.h"
#include "gpurent/http_conns.h"
#include "gpurent/http_guard.h"
#include "gpurent/log.h"
#include "gpurent/secrets.h"

#include <curl/curl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gateway_opts gw_opts = {
    .listen_host = "127.0.0.1",
    .listen_port = 8090,
    .control_url = "http://127.0.0.1:8080",
    .gateway_id = "gw-1",
    .sync_ms = 1000,
    .report_ms = 1000,
    .cold_start_s = 120,
    .upstream_idle_s = 300,
    .max_call_s = 3600,
    .max_pending = 100000,
    .state_dir = "/var/lib/gpurent-gateway",
    .metrics_host = "127.0.0.1",
    .header_timeout_s = 30,
    .body_timeout_s = 300,
    .max_conns_per_client = 64,
};

static void usage(FILE *f)
{
    fprintf(f, "usage: gpurent-gateway --secret-file FILE [OPTIONS]\n"
               "  --listen HOST:PORT          where consumers call /apps/{slug}/... (127.0.0.1:8090)\n"
               "  --control-url URL           gpurentd's API (http://127.0.0.1:8080)\n"
               "  --secret-file FILE          the key shared with gpurentd's gateway_secret_file (mode 0600)\n"
               "  --gateway-id ID             this gateway's name in reports (gw-1)\n"
               "  --sync-ms MS                between refreshes of the copy (1000)\n"
               "  --report-ms MS              between reports of demand and usage (1000)\n"
               "  --cold-start-timeout-s S    longest a call waits for a replica to start (120)\n"
               "  --upstream-idle-s S         a call whose replica sends nothing for S s is ended (300);\n"
               "                              504 if nothing was answered yet\n"
               "  --max-call-s S              a call is ended S s after its replica was called (3600)\n"
               "  --max-pending N             usage records held in memory while gpurentd is away (100000)\n"
               "  --state-dir DIR             the usage journal: records not yet answered by gpurentd, resent\n"
               "                              after a restart or a crash (/var/lib/gpurent-gateway)\n"
               "  --metrics-listen HOST:PORT  serve Prometheus metrics at /metrics there (none: not served)\n"
               "  --header-timeout-s S        a request's headers, trickled or not, must be in within S s of its\n"
               "                              start, and an idle kept-alive connection is closed after S s (30)\n"
               "  --body-timeout-s S          a request's body must be in within S s of its headers (300)\n"
               "  --max-connections-per-client N\n"
               "                              connections one address may hold still sending headers; past it\n"
               "                              its longest-waiting one is closed (64)\n"
               "  --log-level LEVEL           error, warn, info, debug (info)\n");
}

/* An integer option within [min, max]: 0, or -1 after a message. */
static int int_opt(const char *name, const char *v, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*end || end == v || x < min || x > max) {
        fprintf(stderr, "gpurent-gateway: %s must be an integer from %lld to %lld\n", name, (long long)min,
                (long long)max);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse(int argc, char **argv)
{
    char secret_file[1024] = "";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(o, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strncmp(o, "--", 2) != 0) {
            fprintf(stderr, "gpurent-gateway: unexpected argument '%s' (options only; see --help)\n", o);
            return -1;
        }
        /* Named before its value is looked for: a misspelt last option
         * was reported as "needs a value", sending the operator to look
         * for a value the option was never going to take. Every option
         * the chain below takes, and no other. */
        static const char *const known[] = {"--listen", "--metrics-listen", "--control-url", "--secret-file",
                                            "--gateway-id", "--sync-ms", "--report-ms", "--cold-start-timeout-s",
                                            "--upstream-idle-s", "--max-call-s", "--header-timeout-s",
                                            "--body-timeout-s", "--max-connections-per-client", "--max-pending",
                                            "--state-dir", "--log-level"};
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] && strcmp(o, known[k]) != 0)
            k++;
        if (k == sizeof known / sizeof known[0]) {
            fprintf(stderr, "gpurent-gateway: unknown option %s (see --help)\n", o);
            return -1;
        }
        if (!v) {
            fprintf(stderr, "gpurent-gateway: %s needs a value\n", o);
            return -1;
        }
        i++;
        int rc = 0;
        if (strcmp(o, "--listen") == 0)
            rc = conf_parse_hostport(v, gw_opts.listen_host, sizeof gw_opts.listen_host, &gw_opts.listen_port) < 0
                     ? (fprintf(stderr, "gpurent-gateway: --listen must be HOST:PORT, PORT 0 to 65535\n"), -1)
                     : 0;
        else if (strcmp(o, "--metrics-listen") == 0)
            rc = conf_parse_hostport(v, gw_opts.metrics_host, sizeof gw_opts.metrics_host, &gw_opts.metrics_port) < 0 ||
                         gw_opts.metrics_port == 0
                     ? (fprintf(stderr, "gpurent-gateway: --metrics-listen must be HOST:PORT, PORT 1 to 65535\n"), -1)
                     : 0;
        else if (strcmp(o, "--control-url") == 0)
            snprintf(gw_opts.control_url, sizeof gw_opts.control_url, "%s", v);
        else if (strcmp(o, "--secret-file") == 0)
            snprintf(secret_file, sizeof secret_file, "%s", v);
        else if (strcmp(o, "--gateway-id") == 0)
            rc = strlen(v) == 0 || strlen(v) > 40 || strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789-") != strlen(v)
                     ? (fprintf(stderr, "gpurent-gateway: --gateway-id is 1 to 40 of a-z, 0-9 and '-'\n"), -1)
                     : (snprintf(gw_opts.gateway_id, sizeof gw_opts.gateway_id, "%s", v), 0);
        else if (strcmp(o, "--sync-ms") == 0)
            rc = int_opt(o, v, 50, 600000, &gw_opts.sync_ms);
        else if (strcmp(o, "--report-ms") == 0)
            rc = int_opt(o, v, 50, 600000, &gw_opts.report_ms);
        else if (strcmp(o, "--cold-start-timeout-s") == 0)
            rc = int_opt(o, v, 0, 3600, &gw_opts.cold_start_s);
        else if (strcmp(o, "--upstream-idle-s") == 0)
            rc = int_opt(o, v, 1, 86400, &gw_opts.upstream_idle_s);
        else if (strcmp(o, "--max-call-s") == 0)
            rc = int_opt(o, v, 1, 86000, &gw_opts.max_call_s);
        else if (strcmp(o, "--header-timeout-s") == 0)
            rc = int_opt(o, v, 1, 3600, &gw_opts.header_timeout_s);
        else if (strcmp(o, "--body-timeout-s") == 0)
            rc = int_opt(o, v, 1, 86400, &gw_opts.body_timeout_s);
        else if (strcmp(o, "--max-connections-per-client") == 0)
            rc = int_opt(o, v, 1, GW_MAX_CONNECTIONS, &gw_opts.max_conns_per_client);
        else if (strcmp(o, "--max-pending") == 0)
            rc = int_opt(o, v, 1, 10000000, &gw_opts.max_pending);
        else if (strcmp(o, "--state-dir") == 0)
            rc = !v[0] || strlen(v) >= sizeof gw_opts.state_dir
                     ? (fprintf(stderr, "gpurent-gateway: --state-dir must be a directory path\n"), -1)
                     : (snprintf(gw_opts.state_dir, sizeof gw_opts.state_dir, "%s", v), 0);
        else if (strcmp(o, "--log-level") == 0) {
            enum log_level l;
            rc = log_level_parse(v, &l) < 0 ? (fprintf(stderr, "gpurent-gateway: bad --log-level\n"), -1) : 0;
            if (rc == 0)
                log_set_level(l);
        } else {
            fprintf(stderr, "gpurent-gateway: %s is known but not handled\n", o);
            return -1;
        }
        if (rc < 0)
            return -1;
    }
    char err[512];
    if (!secret_file[0]) {
        fprintf(stderr, "gpurent-gateway: --secret-file is required\n");
        return -1;
    }
    if (secret_file_read(secret_file, gw_opts.secret, sizeof gw_opts.secret, err, sizeof err) < 0) {
        fprintf(stderr, "gpurent-gateway: %s\n", err);
        return -1;
    }
    return 0;
}

/* See gateway.h. */
int gw_resolve_listen(const char *host, int port, struct sockaddr_storage *sa, socklen_t *len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    char service[8];
    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(host, service, &hints, &res) != 0)
        return -1;
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* The open connections and their deadlines (gpurent/http_conns.h), as
 * the API has them: libmicrohttpd's idle timeout restarts with every byte,
 * so without these a client trickling a header line every few seconds held
 * a connection for ever, and one address could hold every one of
 * GW_MAX_CONNECTIONS, leaving no consumer a call. */
static struct http_conns *conns;

/* Where the connection carrying c's request is now, for its deadline. */
static void conn_phase(struct MHD_Connection *c, enum http_conn_phase phase)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci)
        http_conns_set_phase(conns, ci->socket_context, phase);
}

static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)cls;
    (void)addrlen;
    return http_conns_accept(conns, addr) ? MHD_YES : MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    /* The first call has the headers: the body's deadline runs from here.
     * A later call without bytes is the body's end or a resume: the call is
     * answered from then on, with no deadline (a stream may last hours). */
    if (!*con_cls)
        conn_phase(c, HTTP_CONN_BODY);
    else if (!*upload_size)
        conn_phase(c, HTTP_CONN_BUSY);
    return gw_handle(c, url, method, upload, upload_size, con_cls);
}

/* Threads answering connections. They never wait for a client, a replica
 * or an upstream; what they do wait for is the journal's fdatasync before
 * an answer ends (proxy.c), which holds the thread and every connection it
 * serves: enough threads that the syncs of parallel calls overlap (and
 * share one, journal.c) rather than queue. */
#define GW_HTTP_THREADS 16

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    conn_phase(c, HTTP_CONN_HEADERS); /* the next request on it, if any */
    gw_completed(con_cls, toe);
}

/* Answers go out as they come, in small writes (headers, then each chunk
 * of a stream): without TCP_NODELAY, Nagle holds each write until the
 * client's delayed ACK, about 40 ms a call. What consumers send is checked
 * before libmicrohttpd reads it, as for the API (http_guard.h). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    (void)cls;
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (info)
            http_guard_close(info->connect_fd);
        http_conns_closed(conns, *socket_context);
        *socket_context = NULL;
        return;
    }
    if (!info)
        return;
    const union MHD_ConnectionInfo *peer = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    *socket_context = http_conns_opened(conns, info->connect_fd, peer ? peer->client_addr : NULL);
    int one = 1;
    setsockopt(info->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    http_guard_open(info->connect_fd);
}

int main(int argc, char **argv)
{
    if (parse(argc, argv) < 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || gw_state_start() < 0)
        return 1;
    struct sockaddr_storage sa;
    socklen_t salen;
    if (gw_resolve_listen(gw_opts.listen_host, gw_opts.listen_port, &sa, &salen) < 0) {
        fprintf(stderr, "gpurent-gateway: cannot use --listen %s:%d\n", gw_opts.listen_host, gw_opts.listen_port);
        return 2;
    }
    /* The metrics listener first: failing it, no consumer was let in. */
    if (gw_metrics_start() < 0) {
        gw_state_stop();
        return 1;
    }
    /* The per-address cap counts only connections still sending headers,
     * so consumers behind one NAT address whose calls are under way are
     * not refused by it (http_conns.c). */
    struct http_conns_limits limits = {
        .header_timeout_ms = gw_opts.header_timeout_s * 1000,
        .body_timeout_ms = gw_opts.body_timeout_s * 1000,
        .max_connections = GW_MAX_CONNECTIONS,
        .max_headers_per_client = (int)gw_opts.max_conns_per_client,
    };
    conns = http_conns_new(&limits);
    if (!conns) {
        gw_metrics_stop();
        gw_state_stop();
        return 1;
    }
    /* A pool of threads over epoll: a connection waiting for a replica or
     * an upstream is suspended and holds none of them (proxy.c). */
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_TURBO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
            (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
        0, on_accept, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED,
        on_done, NULL, MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)600, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)GW_MAX_CONNECTIONS, MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)GW_HTTP_THREADS,
        /* Room for what the guard lets through, which it refuses beyond
         * with the API's error (the library's default was less). */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTP_GUARD_CONNECTION_MEMORY, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "gpurent-gateway: cannot listen on %s:%d\n", gw_opts.listen_host, gw_opts.listen_port);
        http_conns_free(conns);
        gw_metrics_stop();
        gw_state_stop();
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    log_info("gpurent-gateway %s listening on %s:%u for %s", gw_opts.gateway_id, gw_opts.listen_host,
             info ? info->port : 0, gw_opts.control_url);

    int sig = 0;
    sigwait(&sigs, &sig);
    log_info("gpurent-gateway: stopping (signal %d); sending the last usage records", sig);
    MHD_quiesce_daemon(d);
    gw_proxy_stop();
    MHD_stop_daemon(d);
    http_conns_free(conns);
    gw_metrics_stop();
    gw_proxy_drain(5000);
    gw_state_stop();
    curl_global_cleanup();
    return 0;
}
