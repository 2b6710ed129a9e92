/* serve.c: `gpurent-agent [serve]` and the serving life cycle shared with
 * sim-fleet: load configuration, take the state directory, read the GPU
 * inventory, reload workload records and resume them, serve the signed API,
 * then wait for signals. SIGTERM and SIGINT stop the agent and exit 0 while
 * containers keep running: a restarted agent finds them again. SIGHUP
 * re-reads a single node's secret file and reloads what can change while
 * running, between RELOADING=1 and READY=1 as systemd's notify-reload
 * expects. */
#include "agent.h"
#include "gpurent/clock.h"
#include "gpurent/sign.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#define MAX_OVERRIDES 64

/* The thread that reads GPU health again every discovery_interval_s. */
struct refresher {
    struct agent *agent;  /* whose inventory */
    pthread_mutex_t lock; /* guards stop */
    pthread_cond_t cond;  /* signalled on stop */
    int stop;             /* the thread exits */
    pthread_t thread;     /* the thread */
    int started;          /* thread was created */
};

static void *refresher_main(void *arg)
{
    struct refresher *r = arg;
    pthread_mutex_lock(&r->lock);
    while (!r->stop) {
        atomic_store(&r->agent->refresher_alive_ms, clock_mono_ms()); /* for the watchdog */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += (time_t)r->agent->conf->discovery_interval_s;
        if (pthread_cond_timedwait(&r->cond, &r->lock, &ts) != ETIMEDOUT || r->stop)
            continue;
        pthread_mutex_unlock(&r->lock);
        agent_inventory_refresh(r->agent);
        pthread_mutex_lock(&r->lock);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

static void refresher_start(struct refresher *r, struct agent *a)
{
    memset(r, 0, sizeof *r);
    r->agent = a;
    pthread_mutex_init(&r->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cond, &ca);
    pthread_condattr_destroy(&ca);
    /* The configured inventory never changes; only real tools are re-read. */
    if (strcmp(a->conf->discovery, "config") != 0) {
        atomic_store(&a->refresher_alive_ms, clock_mono_ms());
        r->started = pthread_create(&r->thread, NULL, refresher_main, r) == 0;
        if (!r->started)
            atomic_store(&a->refresher_alive_ms, 0);
    }
}

static void refresher_stop(struct refresher *r)
{
    pthread_mutex_lock(&r->lock);
    r->stop = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    if (r->started)
        pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
}

static void reread_secret(struct agent *a)
{
    char secret[65], err[512];
    if (a->fleet)
        return;
    if (secret_read(a->conf->secret_file, secret, err, sizeof err) < 0) {
        log_error("SIGHUP: keeping the current secret: %s", err);
        return;
    }
    agent_node_set_secret(&a->nodes[0], secret);
    memset(secret, 0, sizeof secret);
    log_info("SIGHUP: re-read the node secret from %s", a->conf->secret_file);
}

/* Options reload() applies; every other one waits for a restart. */
static const char *const reloadable[] = {"log_level", "max_body_bytes", "max_json_depth", NULL};

static int is_reloadable(const char *name)
{
    for (const char *const *r = reloadable; *r; r++)
        if (strcmp(*r, name) == 0)
            return 1;
    return 0;
}

/* SIGHUP: the secret, then the configuration from the same file and
 * overrides as at start. A file with errors changes nothing. */
static void reload(struct agent *a)
{
    reread_secret(a);
    struct agent_conf *fresh = malloc(sizeof *fresh);
    if (!fresh) {
        log_error("reload: out of memory; keeping the running configuration");
        return;
    }
    char err[1024];
    if (agent_read_config(fresh, a->conf_file, a->conf_overrides, a->n_conf_overrides, err, sizeof err) < 0) {
        log_error("reload: configuration has errors (%s); keeping the running one", err);
        free(fresh);
        return;
    }
    /* Name what changed but cannot be applied now, so an operator is not
     * left believing a reload moved the listen address. */
    char later[512] = "";
    for (const struct conf_option *o = agent_options; o->name; o++) {
        const char *was = (const char *)a->conf + o->offset, *now = (const char *)fresh + o->offset;
        int differs = o->type == CONF_STRING ? strncmp(was, now, o->size) != 0 : memcmp(was, now, o->size) != 0;
        if (differs && !is_reloadable(o->name)) {
            size_t len = strlen(later);
            snprintf(later + len, sizeof later - len, "%s%s", len ? ", " : "", o->name);
        }
    }
    enum log_level level;
    log_level_parse(fresh->log_level, &level);
    http_server_reload(a->http, "", (size_t)fresh->max_body_bytes, (int)fresh->max_json_depth);
    /* Only the main thread reads these after start; they are written back so
     * the next reload compares against what is in force. */
    snprintf(a->conf->log_level, sizeof a->conf->log_level, "%s", fresh->log_level);
    a->conf->max_body_bytes = fresh->max_body_bytes;
    a->conf->max_json_depth = fresh->max_json_depth;
    log_level_change(level, "reload: applied log_level=%s max_body_bytes=%lld max_json_depth=%lld; %s%s",
                     fresh->log_level, (long long)fresh->max_body_bytes, (long long)fresh->max_json_depth,
                     later[0] ? "changed but applied only at the next restart: "
                              : "other options apply at the next restart",
                     later);
    free(fresh);
}

static void load_node_records(struct agent *a)
{
    size_t total = 0;
    for (size_t i = 0; i < a->n_nodes; i++) {
        char dir[PATH_MAX];
        if (agent_node_dir(a, &a->nodes[i], dir, sizeof dir) == 0) {
            int n = records_load(dir, &a->nodes[i], driver_adopt, a);
            total += n > 0 ? (size_t)n : 0;
            wl_log_sweep(dir, a->conf->ended_log_keep_s, a->conf->ended_logs_max);
        }
    }
    if (total)
        log_info("resumed %zu workloads from %s", total, a->conf->state_dir);
}

int agent_serve(struct agent *a, int (*on_ready)(struct agent *a, void *ctx), void *ctx)
{
    const struct agent_conf *conf = a->conf;
    int status = 1, lock_fd = -1;
    struct refresher refresh;
    int refresh_started = 0, replay_started = 0;
    struct publisher *publisher = NULL;
    struct agent_watchdog *watchdog = NULL;

    enum log_level level;
    log_level_parse(conf->log_level, &level);
    log_set_level(level);
    /* Signals are handled by this thread alone: block them before any
     * other thread exists so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* libcurl's global state (for the watchdog's self-check) before any
     * thread exists; reference-counted, so sim-fleet's own call is fine. */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    pthread_mutex_init(&a->inv.lock, NULL);
    if (state_mkdirs(conf->state_dir) < 0) {
        log_error("cannot create state_dir %s: %s", conf->state_dir, strerror(errno));
        goto out;
    }
    if ((lock_fd = state_lock(conf->state_dir)) < 0)
        goto out;
    /* Only now: the previous run has let go of the directory, so it accepts
     * nothing more. */
    agent_replay_init(a);
    replay_started = 1;
    agent_inventory_refresh(a); /* a failure is logged; facts answer 503 until it works */

    size_t entries = (size_t)conf->replay_cache_entries;
    if (entries == 0)
        entries = a->n_nodes * 96 > 65536 ? a->n_nodes * 96 : 65536;
    a->replay = replay_cache_new((int)conf->max_clock_skew_s, entries);
    if (!a->replay) {
        log_error("cannot allocate a replay cache of %zu entries", entries);
        goto out;
    }
    a->rt = runtime_new(a);
    if (!a->rt)
        goto out;
    a->driver = driver_start(a, (int)conf->workers);
    if (!a->driver)
        goto out;
    if (!a->fleet) {
        char secret[65], err[512];
        if (secret_read(conf->secret_file, secret, err, sizeof err) == 0)
            agent_node_set_secret(&a->nodes[0], secret);
        else
            log_warn("node %s has no secret yet, so every signed call is refused: %s", a->nodes[0].name, err);
        memset(secret, 0, sizeof secret);
    }
    load_node_records(a);
    /* Before the API: facts report the SSH port and host key from the start. */
    if (ssh_server_start(a, &a->ssh) < 0)
        goto out;
    /* Before the API too: facts report each node's range, and a spec's
     * host ports are checked against it. */
    if (publish_assign_ranges(a) < 0 || publish_start(a, &publisher) < 0)
        goto out;
    agent_replay_wait(a);
    if (agent_terminals_start(a) < 0) {
        log_error("cannot start the terminal relay");
        goto out;
    }

    char host[128];
    int port;
    conf_parse_hostport(conf->listen, host, sizeof host, &port);
    struct http_config hc = {
        .host = host,
        .port = port,
        .threads = (int)conf->threads,
        .max_connections = (int)conf->max_connections,
        .max_connections_per_ip = (int)conf->max_connections_per_client,
        .connection_timeout_s = (int)conf->connection_timeout_s,
        /* A client trickling its headers a byte at a time is cut off here;
         * libmicrohttpd's timeout restarts with every byte. */
        .header_timeout_s = (int)conf->header_timeout_s,
        .max_body_bytes = (size_t)conf->max_body_bytes,
        .max_json_depth = (int)conf->max_json_depth,
        .max_path_bytes = 512,
        .cors_origins = "",
        .cert_file = conf->tls_cert,
        .key_file = conf->tls_key,
    };
    a->http = http_server_start(&hc, a->fleet ? agent_routes_fleet : agent_routes_single, agent_authenticate, a);
    if (!a->http)
        goto out;
    log_info("gpurent-agent listening on %s://%s:%d (runtime %s, %zu node%s, state %s)",
             conf->tls_cert[0] ? "https" : "http", host, http_server_port(a->http), conf->runtime, a->n_nodes,
             a->n_nodes == 1 ? "" : "s", conf->state_dir);
    refresher_start(&refresh, a);
    refresh_started = 1;
    if (on_ready && on_ready(a, ctx) != 0)
        goto out;
    /* READY=1 goes first: a watchdog ping before it would be out of order. */
    sd_notifyf(0, "READY=1\nSTATUS=serving %zu node%s", a->n_nodes, a->n_nodes == 1 ? "" : "s");
    watchdog = agent_watchdog_start(a, host, http_server_port(a->http), conf->tls_cert[0] != 0);

    for (;;) {
        int sig = 0;
        if (sigwait(&sigs, &sig) != 0)
            continue;
        if (sig == SIGHUP) {
            /* systemd's notify-reload wants the time the reload began. */
            sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%" PRId64, clock_mono_us());
            reload(a);
            sd_notify(0, "READY=1");
            continue;
        }
        log_info("received %s: stopping (containers keep running)", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        break;
    }
    status = 0;
out:
    sd_notify(0, "STOPPING=1");
    /* First, so that stopping the API is not reported as a failure. */
    agent_watchdog_stop(watchdog);
    atomic_store(&a->stopping, 1);
    /* Before the API: libmicrohttpd cannot stop with upgraded connections. */
    agent_terminals_stop(a);
    if (a->http)
        http_server_stop(a->http, (int)conf->drain_timeout_s * 1000);
    agent_terminals_free(a);
    a->http = NULL;
    ssh_server_stop(a->ssh);
    a->ssh = NULL;
    publish_stop(publisher);
    driver_stop(a->driver);
    a->driver = NULL;
    if (refresh_started)
        refresher_stop(&refresh);
    runtime_free((struct runtime *)(uintptr_t)a->rt);
    a->rt = NULL;
    replay_cache_free(a->replay);
    a->replay = NULL;
    if (replay_started)
        agent_replay_free(a);
    pthread_mutex_destroy(&a->inv.lock);
    if (lock_fd >= 0)
        close(lock_fd);
    curl_global_cleanup();
    if (status == 0)
        log_info("gpurent-agent stopped");
    return status;
}

static void serve_usage(FILE *f)
{
    fprintf(f,
            "usage: gpurent-agent [serve] [-c FILE] [--listen HOST:PORT] [--state-dir DIR] [--log-level LEVEL]\n"
            "                     [-o KEY=VALUE]... [-n]\n"
            "       gpurent-agent sim-fleet --help\n"
            "\n"
            "Runs the gpurent node agent until SIGTERM or SIGINT (containers keep running).\n"
            "  -c, --config FILE     configuration file (see conf/gpurent-agent.conf)\n"
            "  --listen HOST:PORT    overrides 'listen'\n"
            "  --state-dir DIR       overrides 'state_dir'\n"
            "  --log-level LEVEL     overrides 'log_level'\n"
            "  -o, --set KEY=VALUE   overrides any option\n"
            "  -n, --check           check the configuration, print 'configuration OK' and exit\n"
            "  -h, --help            this help; --help-config lists every option\n");
}

/* The host name as a node name: lowercase, other characters as '-'. */
static void default_node_name(char out[AGENT_NAME_MAX])
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    size_t n = 0;
    for (const char *p = host; *p && *p != '.' && n < AGENT_NAME_MAX - 1; p++) {
        char c = *p;
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        out[n++] = ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-') ? c : '-';
    }
    out[n] = '\0';
    if (!agent_name_valid(out))
        snprintf(out, AGENT_NAME_MAX, "node");
}

int agent_cmd_serve(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"config", required_argument, NULL, 'c'},   {"listen", required_argument, NULL, 'L'},
        {"state-dir", required_argument, NULL, 'S'}, {"log-level", required_argument, NULL, 'l'},
        {"set", required_argument, NULL, 'o'},      {"check", no_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},           {"help-config", no_argument, NULL, 'H'},
        {NULL, 0, NULL, 0},
    };
    const char *file = NULL;
    char *overrides[MAX_OVERRIDES];
    int n_overrides = 0, check_only = 0, status = 2, opt;
    static struct agent_conf conf;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:o:nh", long_opts, NULL)) != -1) {
        const char *key = NULL;
        switch (opt) {
        case 'c': file = optarg; continue;
        case 'n': check_only = 1; continue;
        case 'h': serve_usage(stdout); status = 0; goto out;
        case 'H': conf_print_help(agent_options, stdout); status = 0; goto out;
        case 'L': key = "listen"; break;
        case 'S': key = "state_dir"; break;
        case 'l': key = "log_level"; break;
        case 'o': key = ""; break;
        default: fputs("Try 'gpurent-agent serve --help'.\n", stderr); goto out; /* getopt named the option */
        }
        if (n_overrides >= MAX_OVERRIDES) {
            fprintf(stderr, "gpurent-agent: too many overrides\n");
            goto out;
        }
        if (asprintf(&overrides[n_overrides], "%s%s%s", key, key[0] ? "=" : "", optarg) < 0)
            goto out;
        n_overrides++;
    }
    if (optind < argc) {
        fprintf(stderr, "gpurent-agent: unexpected argument '%s'; try 'gpurent-agent serve --help'.\n", argv[optind]);
        goto out;
    }
    status = 1;
    if (agent_load_config(&conf, file, overrides, n_overrides) < 0)
        goto out;
    if (check_only) {
        printf("configuration OK\n");
        status = 0;
        goto out;
    }
    struct agent a = {.conf = &conf, .conf_file = file, .conf_overrides = overrides, .n_conf_overrides = n_overrides};
    char name[AGENT_NAME_MAX];
    if (conf.node_name[0])
        snprintf(name, sizeof name, "%s", conf.node_name);
    else
        default_node_name(name);
    char *names[1] = {name};
    if (agent_nodes_init(&a, names, 1) < 0)
        goto out;
    status = agent_serve(&a, NULL, NULL);
    agent_nodes_free(&a);
out:
    for (int i = 0; i < n_overrides; i++)
        free(overrides[i]);
    return status;
}
