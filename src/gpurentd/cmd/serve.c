/* serve.c: `gpurentd serve`: load configuration, migrate, start the HTTP
 * server and background loops, then wait for signals: SIGHUP reloads what can
 * change safely, SIGTERM and SIGINT drain requests and exit 0. */
#include "gpurent/clock.h"
#include "gpurent/url.h"
#include "gpurentd.h"
#include "store/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#define MAX_OVERRIDES 64

static void serve_usage(FILE *f)
{
    fprintf(f, "usage: gpurentd [serve] [-c FILE] [--listen HOST:PORT] [--db PATH] [--log-level LEVEL]\n"
               "                [--clock-file PATH] [-o KEY=VALUE]... [-n]\n"
               "\n"
               "Runs the gpurent control plane until SIGTERM or SIGINT.\n"
               "  -c, --config FILE     configuration file (see conf/gpurentd.conf)\n"
               "  --listen HOST:PORT    overrides 'listen'\n"
               "  --db PATH             overrides 'database'\n"
               "  --log-level LEVEL     overrides 'log_level'\n"
               "  --clock-file PATH     TESTING ONLY: read the time from PATH (epoch seconds)\n"
               "  -o, --set KEY=VALUE   overrides any option\n"
               "  -n, --check           check the configuration, print 'configuration OK' and exit\n"
               "  -h, --help            this help; --help-config lists every option\n");
}

/* Parses the options shared by serve and the database subcommands into
 * overrides ("key=value" strings the caller frees). Returns 0, 1 when help
 * was printed, or -1 on a bad option. */
static int parse_serve_args(int argc, char **argv, const char **config_file, char **overrides, int *n_overrides,
                            int *check_only)
{
    static const struct option long_opts[] = {
        {"config",      required_argument, NULL, 'c'},
        {"listen",      required_argument, NULL, 'L'},
        {"db",          required_argument, NULL, 'D'},
        {"log-level",   required_argument, NULL, 'l'},
        {"clock-file",  required_argument, NULL, 'k'},
        {"set",         required_argument, NULL, 'o'},
        {"check",       no_argument,       NULL, 'n'},
        {"help",        no_argument,       NULL, 'h'},
        {"help-config", no_argument,       NULL, 'H'},
        {NULL,          0,                 NULL, 0  },
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:o:nh", long_opts, NULL)) != -1) {
        const char *key = NULL;
        switch (opt) {
        case 'c':
            *config_file = optarg;
            continue;
        case 'n':
            *check_only = 1;
            continue;
        case 'h':
            serve_usage(stdout);
            return 1;
        case 'H':
            conf_print_help(daemon_options, stdout);
            return 1;
        case 'L':
            key = "listen";
            break;
        case 'D':
            key = "database";
            break;
        case 'l':
            key = "log_level";
            break;
        case 'k':
            key = "clock_file";
            break;
        case 'o':
            key = "";
            break;
        default: /* getopt named the option */
            fputs("Try 'gpurentd serve --help'.\n", stderr);
            return -1;
        }
        if (*n_overrides >= MAX_OVERRIDES) {
            fprintf(stderr, "gpurentd: too many overrides\n");
            return -1;
        }
        char *o = NULL;
        if (asprintf(&o, "%s%s%s", key, key[0] ? "=" : "", optarg) < 0)
            return -1;
        overrides[(*n_overrides)++] = o;
    }
    if (optind < argc) {
        fprintf(stderr, "gpurentd: unexpected argument '%s'; try 'gpurentd serve --help'.\n", argv[optind]);
        return -1;
    }
    return 0;
}

/* Creates the first admin on an empty database and prints its key once:
 * the operator's way in. */
static int bootstrap_admin(struct store *s, const struct daemon_conf *conf)
{
    int64_t admins = store_user_count_admins(s);
    if (admins < 0)
        return -1;
    if (admins > 0)
        return 0;
    struct user u = {.role = ROLE_ADMIN, .active = 1};
    const char *why;
    if (account_email_normalize(conf->bootstrap_admin_email, u.email, sizeof u.email, &why) < 0) {
        log_error("bootstrap_admin_email: %s", why);
        return -1;
    }
    char key_id[ID_MAX], token[API_TOKEN_LEN + 1];
    if (account_create(s, &u, "bootstrap", key_id, token) != STORE_OK) {
        log_error("cannot create the bootstrap admin %s", u.email);
        return -1;
    }
    log_warn("created the first admin account %s; its API key is printed once on standard output", u.email);
    printf("gpurentd: first admin account: %s\n"
           "gpurentd: admin API key (shown once, keep it safe):\n%s\n",
           u.email, token);
    fflush(stdout);
    return 0;
}

/* API keys, sign-up passwords and workload environments must not cross a
 * network in clear text (docs/OPERATIONS.md, TLS). Plain HTTP is fine on
 * loopback, where only this machine (a TLS reverse proxy) reaches it, and
 * an operator who named trusted_proxies has said a proxy is in front; any
 * other plain listener gets a warning at every start. */
static void warn_if_clear_text(const struct daemon_conf *conf, const char *host, int port)
{
    if (conf->tls_cert[0] || host_is_loopback(host) || conf->trusted_proxies[0])
        return;
    log_warn("serving plain HTTP on %s:%d, which is not a loopback address, and no trusted_proxies are set: "
             "passwords and API keys (and the environments of workloads) would cross the network in clear text; "
             "set tls_cert and tls_key, or listen on 127.0.0.1 behind a TLS reverse proxy named in trusted_proxies",
             host, port);
}

struct loaded {
    const char *file; /* -c FILE or NULL */
    char *overrides[MAX_OVERRIDES];
    int n_overrides;
};

static void reload(struct http_server *srv, struct loaded *l)
{
    struct daemon_conf fresh;
    char err[1024];
    if (daemon_read_config(&fresh, l->file, l->overrides, l->n_overrides, err, sizeof err) < 0) {
        log_error("reload: configuration has errors (%s); keeping the running one", err);
        return;
    }
    enum log_level level;
    log_level_parse(fresh.log_level, &level);
    http_server_reload(srv, fresh.cors_origins, (size_t)fresh.max_body_bytes, (int)fresh.max_json_depth);
    /* The login limits are read at each failed login (api_accounts.c) and
     * the throttle table keeps no copy of them, so new ones apply from the
     * next failure: a lower limit locks an address or account that already
     * has that many failures in its window; a lockout already running keeps
     * its end time. Atomic stores (the fields are _Atomic). */
    int64_t max_failures = fresh.login_max_failures, lockout_s = fresh.login_lockout_s;
    daemon_config->login_max_failures = max_failures;
    daemon_config->login_lockout_s = lockout_s;
    /* The sign-up limits likewise: read at each sign-up (api_signup.c). */
    int64_t per_address = fresh.signup_rate_per_address, per_subnet = fresh.signup_rate_per_subnet;
    daemon_config->signup_rate_per_address = per_address;
    daemon_config->signup_rate_per_subnet = per_subnet;
    /* And the password reset limits (api_password_reset.c). */
    int64_t reset_per_email = fresh.password_reset_rate_per_email,
            reset_per_address = fresh.password_reset_rate_per_address;
    daemon_config->password_reset_rate_per_email = reset_per_email;
    daemon_config->password_reset_rate_per_address = reset_per_address;
    log_level_change(level,
                     "reload: applied log_level=%s cors_origins='%s' max_body_bytes=%lld max_json_depth=%lld "
                     "login_max_failures=%lld (per client %lld) login_lockout_s=%lld "
                     "signup_rate_per_address=%lld signup_rate_per_subnet=%lld "
                     "password_reset_rate_per_email=%lld password_reset_rate_per_address=%lld; "
                     "other options take effect at the next restart",
                     fresh.log_level, fresh.cors_origins, (long long)fresh.max_body_bytes,
                     (long long)fresh.max_json_depth, (long long)max_failures, (long long)max_failures * 4,
                     (long long)lockout_s, (long long)per_address, (long long)per_subnet, (long long)reset_per_email,
                     (long long)reset_per_address);
}

/* One daemon per database: two would each reconcile the same instances
 * against the agents and bill the same users, every transaction consistent
 * but their decisions crossed (a workload one puts the other deletes as an
 * orphan). The second is refused. The lock is a file of its own beside the
 * database, held until the process ends; flock, so SQLite's own POSIX
 * locks on the database file are not touched. */
static int lock_database(const char *database)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s.serve-lock", database) >= (int)sizeof path) {
        log_error("database path %s is too long", database);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0600); /* flock needs no write access */
    if (fd < 0) {
        log_error("cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        log_error("another gpurentd serve is using %s (it holds %s): %s", database, path,
                  errno == EWOULDBLOCK ? "refusing to start a second" : strerror(errno));
        close(fd);
        return -1;
    }
    return 0; /* fd stays open, and locked, until exit */
}

int cmd_serve(int argc, char **argv)
{
    struct loaded l = {0};
    int check_only = 0, status = 1;
    int rc = parse_serve_args(argc, argv, &l.file, l.overrides, &l.n_overrides, &check_only);
    static struct daemon_conf conf;
    struct store *s = NULL;
    struct http_server *srv = NULL, *metrics_srv = NULL;
    char mhost[128];
    if (rc != 0) {
        status = rc > 0 ? 0 : 2;
        goto out;
    }
    if (daemon_load_config(&conf, l.file, l.overrides, l.n_overrides) < 0)
        goto out;
    daemon_config = &conf;
    if (check_only) {
        printf("configuration OK\n");
        status = 0;
        goto out;
    }
    enum log_level level;
    log_level_parse(conf.log_level, &level);
    log_set_level(level);
    if (clock_use_file(conf.clock_file) < 0) {
        log_error("clock_file %s cannot be read or does not hold epoch seconds", conf.clock_file);
        goto out;
    }
    if (clock_is_testing())
        log_warn("TESTING CLOCK IN USE: time comes from %s, not the system clock; never do this in production",
                 conf.clock_file);

    /* Signals are handled by this thread alone (sigwait below): block them
     * before any other thread exists so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* libcurl's global state must be set up before any thread uses it. */
    if (agent_client_global_init() != 0) {
        log_error("cannot initialise libcurl");
        goto out;
    }
    if (lock_database(conf.database) < 0)
        goto out;
    char err[1024];
    s = store_open(conf.database, err, sizeof err);
    if (!s) {
        log_error("%s", err);
        goto out;
    }
    if (store_migrate(s, 0, err, sizeof err) < 0) {
        log_error("%s", err);
        goto out;
    }
    /* The first admin once the addresses are known to be free: a start
     * refused for a taken port leaves no admin whose key a failed run
     * printed. (Checked, not held: taken in the moment between, it fails
     * as before.) */
    char host[128];
    int port, mport;
    conf_parse_hostport(conf.listen, host, sizeof host, &port);
    if (http_address_free(host, port, err, sizeof err) < 0 ||
        (conf.metrics_listen[0] && conf_parse_hostport(conf.metrics_listen, mhost, sizeof mhost, &mport) == 0 &&
         http_address_free(mhost, mport, err, sizeof err) < 0)) {
        log_error("%s", err);
        goto out;
    }
    if (bootstrap_admin(s, &conf) < 0)
        goto out;
    store_close(s);
    s = NULL;
    store_set_path(conf.database);
    /* Before the server: creates queue their transactions for it. */
    if (store_committer_start() < 0)
        goto out;

    struct http_config hc = {
        .host = host,
        .port = port,
        .threads = (int)conf.threads,
        .max_connections = (int)conf.max_connections,
        .max_connections_per_ip = (int)conf.max_connections_per_client,
        .connection_timeout_s = (int)conf.connection_timeout_s,
        .header_timeout_s = (int)conf.header_timeout_s,
        .body_min_rate = conf.body_min_rate,
        .max_body_bytes = (size_t)conf.max_body_bytes,
        .max_json_depth = (int)conf.max_json_depth,
        .cors_origins = conf.cors_origins,
        .trusted_proxies = conf.trusted_proxies,
        .on_done = auth_request_done,
        .unavailable_cause = api_unavailable_cause,
        .cert_file = conf.tls_cert,
        .key_file = conf.tls_key,
        .refuse_cross_site_writes = 1,
    };
    srv = http_server_start(&hc, daemon_routes, auth_authenticate, NULL);
    if (!srv || heartbeat_start() < 0 || reconciler_start() < 0 || billing_start() < 0 || logs_proxy_start() < 0 ||
        mailer_start() < 0 || app_scaler_start() < 0 || terminal_relay_start() < 0)
        goto out;
    if (conf.metrics_listen[0]) {
        /* Same limits, no TLS and no key: a private scrape address. */
        struct http_config mc = hc;
        conf_parse_hostport(conf.metrics_listen, mhost, sizeof mhost, &mc.port);
        mc.host = mhost;
        mc.threads = 2; /* libmicrohttpd warns about a pool of one */
        mc.cors_origins = "";
        mc.on_done = NULL;
        mc.cert_file = mc.key_file = NULL;
        if (!(metrics_srv = http_server_start(&mc, metrics_routes, auth_authenticate, NULL)))
            goto out;
        log_info("metrics on http://%s:%d/metrics", mhost, http_server_port(metrics_srv));
    }
    log_info("gpurentd listening on %s://%s:%d (database %s, schema version %d)", conf.tls_cert[0] ? "https" : "http",
             host, http_server_port(srv), conf.database, store_latest_version());
    warn_if_clear_text(&conf, host, http_server_port(srv));
    /* Port open and migrations applied: systemd may start what depends on us.
     * READY=1 goes first: a watchdog ping before it would be out of order. */
    sd_notifyf(0, "READY=1\nSTATUS=serving on %s:%d", host, http_server_port(srv));
    if (watchdog_start(host, http_server_port(srv), conf.tls_cert[0] != 0) < 0)
        goto out;

    for (;;) {
        int sig = 0;
        if (sigwait(&sigs, &sig) != 0)
            continue;
        if (sig == SIGHUP) {
            sd_notify(0, "RELOADING=1");
            log_flush(); /* the access lines before the reload's own */
            reload(srv, &l);
            sd_notify(0, "READY=1");
            continue;
        }
        sd_notify(0, "STOPPING=1");
        log_info("received %s: draining requests (up to %llds) and stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                 (long long)conf.drain_timeout_s);
        break;
    }
    /* Deferred log reads are answered first: the server cannot stop while
     * a connection is suspended. */
    logs_proxy_stop();
    /* Open terminals likewise: the server cannot stop with upgraded
     * connections. */
    terminal_relay_stop();
    /* The committer keeps answering while the server drains: a create
     * waiting for its commit is a suspended connection too. */
    http_server_stop(srv, (int)conf.drain_timeout_s * 1000);
    srv = NULL;
    status = 0;
    log_info("stopping background loops");
    log_flush(); /* access lines before the last word */
    log_info("gpurentd stopped");
out:
    watchdog_stop();
    logs_proxy_stop();
    terminal_relay_stop();
    http_server_stop(metrics_srv, 0);
    http_server_stop(srv, 0);
    terminal_relay_free();
    heartbeat_stop();
    reconciler_stop();
    billing_stop();
    mailer_stop();
    app_scaler_stop();
    store_committer_stop();
    store_close(s);
    store_close_threads();
    agent_client_global_cleanup();
    log_flush(); /* the last second of access lines */
    for (int i = 0; i < l.n_overrides; i++)
        free(l.overrides[i]);
    return status;
}
