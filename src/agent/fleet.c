/* fleet.c: `gpurent-agent sim-fleet`: one process serving many simulated
 * nodes under /nodes/{name}, each registered with a running gpurentd through
 * POST /v1/admin/nodes (libcurl). Secrets are saved in the state directory
 * (0600) before a node is brought in, so a re-run, which the control plane
 * answers 409, keeps working with the saved one. A node without a secret
 * refuses every call (401) until it has one. */
#include "agent.h"

#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_OVERRIDES 64
#define REPLY_MAX (64 * 1024)   /* the admin API's answer is small; more is refused */
#define MAX_FLEET_NODES 100000

struct fleet {
    const char *control_plane;     /* base URL of gpurentd */
    char admin_key[512];           /* bearer key of an admin */
    const char *model;             /* catalog model of every node */
    long nodes, cards, memory_gb;  /* fleet shape */
    const char *fabric, *region;   /* where the nodes are */
    char prefix[AGENT_NAME_MAX];   /* node names are prefix + number */
    char **names;                  /* in registration order */
    int registered, kept, failed;  /* outcome counts */
};

struct reply {
    char *data;                    /* NUL-terminated body */
    size_t len;                    /* bytes in data */
    int too_big;                   /* more than REPLY_MAX arrived */
};

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    struct reply *r = userdata;
    size_t n = size * nmemb;
    if (r->len + n > REPLY_MAX) {
        r->too_big = 1;
        return 0; /* aborts the transfer */
    }
    char *g = realloc(r->data, r->len + n + 1);
    if (!g)
        return 0;
    r->data = g;
    memcpy(r->data + r->len, ptr, n);
    r->len += n;
    r->data[r->len] = '\0';
    return n;
}

/* The base URL the control plane should call: advertise_url, or the bound
 * address with a wildcard replaced by loopback. */
static void base_url(struct agent *a, char *out, size_t outlen)
{
    if (a->conf->advertise_url[0]) {
        snprintf(out, outlen, "%s", a->conf->advertise_url);
        size_t n = strlen(out);
        while (n > 0 && out[n - 1] == '/')
            out[--n] = '\0';
        return;
    }
    char host[128];
    int port;
    conf_parse_hostport(a->conf->listen, host, sizeof host, &port);
    if (strcmp(host, "0.0.0.0") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    else if (strcmp(host, "::") == 0)
        snprintf(host, sizeof host, "::1");
    int v6 = strchr(host, ':') != NULL;
    snprintf(out, outlen, "%s://%s%s%s:%d", a->conf->tls_cert[0] ? "https" : "http", v6 ? "[" : "", host,
             v6 ? "]" : "", http_server_port(a->http));
}

static int stop_pending(void)
{
    sigset_t p;
    return sigpending(&p) == 0 && (sigismember(&p, SIGTERM) == 1 || sigismember(&p, SIGINT) == 1);
}

/* One POST /v1/admin/nodes; returns the HTTP status, or -1 for a transport
 * failure (with why). */
static long post_node(CURL *curl, const struct fleet *f, const char *name, const char *url, struct reply *r,
                      char *why, size_t whylen)
{
    char endpoint[1024], auth[600];
    snprintf(endpoint, sizeof endpoint, "%s/v1/admin/nodes", f->control_plane);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", f->admin_key);
    json_t *body = json_pack("{s:s, s:s, s:s, s:i, s:s, s:s, s:{}}", "name", name, "agent_url", url, "gpu_model",
                             f->model, "card_count", (int)f->cards, "fabric", f->fabric, "region", f->region, "labels");
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, auth);
    memset(auth, 0, sizeof auth);
    free(r->data);
    memset(r, 0, sizeof *r);
    curl_easy_setopt(curl, CURLOPT_URL, endpoint);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 30000L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode rc = curl_easy_perform(curl);
    long status = -1;
    if (rc == CURLE_OK)
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    else
        snprintf(why, whylen, "%s", r->too_big ? "reply larger than 64 KiB" : curl_easy_strerror(rc));
    curl_slist_free_all(h);
    free(text);
    return status;
}

/* The error code and message of an error body, for the printed line. */
static void describe_error(const struct reply *r, char *out, size_t outlen)
{
    json_t *j = r->data ? json_loadb(r->data, r->len, 0, NULL) : NULL;
    const char *code = NULL, *msg = NULL;
    if (j && json_unpack(j, "{s:{s?s, s?s}}", "error", "code", &code, "message", &msg) == 0 && (code || msg))
        snprintf(out, outlen, "%s: %s", code ? code : "error", msg ? msg : "");
    else
        snprintf(out, outlen, "unexpected reply");
    json_decref(j);
}

/* Registers one node and prints its line. Returns 0, or -1 when the
 * control plane could not be reached at all. */
static int register_node(struct agent *a, struct fleet *f, CURL *curl, const char *name, const char *base)
{
    struct agent_node *n = agent_node_find(a, name);
    char url[1024], dir[PATH_MAX], why[512] = "", node_id[ID_MAX] = "", secret[65] = "";
    snprintf(url, sizeof url, "%s/nodes/%s", base, name);
    agent_node_dir(a, n, dir, sizeof dir);
    struct reply r = {0};
    long status = -1;
    /* A control plane that is still starting gets five seconds. */
    for (int attempt = 0; attempt < 10 && !stop_pending(); attempt++) {
        status = post_node(curl, f, name, url, &r, why, sizeof why);
        if (status >= 0)
            break;
        usleep(500 * 1000);
    }
    int rc = 0;
    if (status == 201) {
        json_t *j = json_loadb(r.data, r.len, 0, NULL);
        const char *id = NULL, *s = NULL;
        if (j && json_unpack(j, "{s:{s:s}, s:s}", "node", "id", &id, "secret", &s) == 0 && strlen(id) < ID_MAX &&
            secret_valid(s)) {
            snprintf(node_id, sizeof node_id, "%s", id);
            memcpy(secret, s, 65);
        }
        json_decref(j);
        if (!secret[0]) {
            printf("node %s FAILED url=%s: the control plane's 201 reply has no node id or secret\n", name, url);
            f->failed++;
        } else if (registration_save(dir, node_id, secret) < 0) {
            printf("node %s FAILED id=%s url=%s: cannot save its secret in %s: %s\n", name, node_id, url, dir,
                   strerror(errno));
            f->failed++;
        } else {
            agent_node_set_secret(n, secret);
            printf("node %s registered id=%s url=%s\n", name, node_id, url);
            f->registered++;
        }
    } else if (status == 409) {
        if (registration_load(dir, node_id, secret) == 0) {
            agent_node_set_secret(n, secret);
            printf("node %s kept id=%s url=%s (already registered; using the secret saved in %s)\n", name, node_id,
                   url, dir);
            f->kept++;
        } else {
            printf("node %s FAILED url=%s: already registered, but no secret is saved in %s; remove the node "
                   "from gpurentd or restore the state directory\n",
                   name, url, dir);
            f->failed++;
        }
    } else if (status > 0) {
        char err[400];
        describe_error(&r, err, sizeof err);
        printf("node %s FAILED url=%s: HTTP %ld %s\n", name, url, status, err);
        f->failed++;
    } else {
        printf("node %s FAILED url=%s: %s/v1/admin/nodes: %s\n", name, url, f->control_plane,
               why[0] ? why : "interrupted");
        f->failed++;
        rc = -1;
    }
    fflush(stdout);
    memset(secret, 0, sizeof secret);
    free(r.data);
    return rc;
}

static int fleet_register(struct agent *a, void *ctx)
{
    struct fleet *f = ctx;
    char base[512];
    base_url(a, base, sizeof base);
    printf("fleet: serving %ld simulated %s nodes (%ld cards each) on %s/nodes/NAME; registering with %s\n",
           f->nodes, f->model, f->cards, base, f->control_plane);
    fflush(stdout);
    CURL *curl = curl_easy_init();
    if (!curl) {
        log_error("sim-fleet: cannot create a libcurl handle");
        return -1;
    }
    int reached = 0, rc = 0;
    for (long i = 0; i < f->nodes && !stop_pending(); i++) {
        int r = register_node(a, f, curl, f->names[i], base);
        if (r == 0)
            reached = 1;
        else if (!reached) {
            /* Nothing answered: a fleet nobody knows about is no use. */
            log_error("sim-fleet: the control plane at %s cannot be reached; stopping", f->control_plane);
            rc = -1;
            break;
        }
    }
    curl_easy_cleanup(curl);
    memset(f->admin_key, 0, sizeof f->admin_key);
    if (rc == 0) {
        printf("fleet ready: %ld nodes (%d registered, %d kept, %d failed); SIGTERM stops it\n", f->nodes,
               f->registered, f->kept, f->failed);
        fflush(stdout);
    }
    return rc;
}

static void fleet_usage(FILE *out)
{
    fprintf(out,
            "usage: gpurent-agent sim-fleet --control-plane URL (--admin-key KEY | --admin-key-file FILE)\n"
            "                     --model MODEL --nodes N --cards N --fabric NAME --region NAME\n"
            "                     [--listen HOST:PORT] [--state-dir DIR] [--name-prefix PREFIX]\n"
            "                     [--memory-gb GB] [--advertise-url URL] [--log-level LEVEL]\n"
            "                     [-c FILE] [-o KEY=VALUE]... [-n]\n"
            "\n"
            "Serves N simulated nodes of MODEL under http://HOST:PORT/nodes/NAME, registers each\n"
            "one with gpurentd (POST URL/v1/admin/nodes), prints one line per node, and serves\n"
            "until SIGTERM. Secrets are kept in DIR/nodes/NAME/registration.json, so running the\n"
            "same command again keeps the nodes working.\n"
            "  --name-prefix PREFIX  node names are PREFIX01, PREFIX02 ... (default sim-<model>-)\n"
            "  --memory-gb GB        memory per card (default: the model's)\n"
            "  --advertise-url URL   base URL given to gpurentd (default http://LISTEN)\n"
            "  --log-level LEVEL     default warn (a fleet logs every request at info)\n"
            "  -c, -o                configuration file and overrides, as for serve (sim_* delays …)\n"
            "  -n, --check           check the arguments and configuration and exit\n");
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int label_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~')
            return 0;
    return 1;
}

int agent_cmd_fleet(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"control-plane", required_argument, NULL, 'C'}, {"admin-key", required_argument, NULL, 'K'},
        {"admin-key-file", required_argument, NULL, 'F'}, {"model", required_argument, NULL, 'M'},
        {"nodes", required_argument, NULL, 'N'},         {"cards", required_argument, NULL, 'D'},
        {"fabric", required_argument, NULL, 'B'},        {"region", required_argument, NULL, 'R'},
        {"listen", required_argument, NULL, 'L'},        {"state-dir", required_argument, NULL, 'S'},
        {"name-prefix", required_argument, NULL, 'P'},   {"memory-gb", required_argument, NULL, 'G'},
        {"advertise-url", required_argument, NULL, 'A'}, {"log-level", required_argument, NULL, 'l'},
        {"config", required_argument, NULL, 'c'},        {"set", required_argument, NULL, 'o'},
        {"check", no_argument, NULL, 'n'},               {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct fleet f = {.cards = 8};
    const char *file = NULL, *key_file = NULL, *key = NULL, *listen = NULL, *state_dir = NULL, *advertise = NULL;
    const char *log_level = "warn", *prefix = NULL;
    char *overrides[MAX_OVERRIDES + 16];
    int n_overrides = 0, check_only = 0, status = 2, opt;
    static struct agent_conf conf;
    struct agent a = {.conf = &conf, .fleet = 1};
    char *name_store = NULL;

    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:o:nh", long_opts, NULL)) != -1) {
        switch (opt) {
        case 'C': f.control_plane = optarg; break;
        case 'K': key = optarg; break;
        case 'F': key_file = optarg; break;
        case 'M': f.model = optarg; break;
        case 'N':
            if (parse_long(optarg, 1, MAX_FLEET_NODES, &f.nodes) < 0) {
                fprintf(stderr, "gpurent-agent sim-fleet: --nodes must be 1 to %d\n", MAX_FLEET_NODES);
                goto out;
            }
            break;
        case 'D':
            if (parse_long(optarg, 1, DISCOVERY_MAX_CARDS, &f.cards) < 0) {
                fprintf(stderr, "gpurent-agent sim-fleet: --cards must be 1 to %d\n", DISCOVERY_MAX_CARDS);
                goto out;
            }
            break;
        case 'G':
            if (parse_long(optarg, 1, 4096, &f.memory_gb) < 0) {
                fprintf(stderr, "gpurent-agent sim-fleet: --memory-gb must be 1 to 4096\n");
                goto out;
            }
            break;
        case 'B': f.fabric = optarg; break;
        case 'R': f.region = optarg; break;
        case 'L': listen = optarg; break;
        case 'S': state_dir = optarg; break;
        case 'P': prefix = optarg; break;
        case 'A': advertise = optarg; break;
        case 'l': log_level = optarg; break;
        case 'c': file = optarg; break;
        case 'n': check_only = 1; break;
        case 'h': fleet_usage(stdout); status = 0; goto out;
        case 'o':
            if (n_overrides >= MAX_OVERRIDES) {
                fprintf(stderr, "gpurent-agent sim-fleet: too many overrides\n");
                goto out;
            }
            if (!(overrides[n_overrides] = strdup(optarg)))
                goto out;
            n_overrides++;
            break;
        default: fputs("Try 'gpurent-agent sim-fleet --help'.\n", stderr); goto out; /* getopt named the option */
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gpurent-agent sim-fleet: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    if (!f.control_plane || (!key && !key_file) || !f.model || !f.nodes || !f.fabric || !f.region) {
        fprintf(stderr, "gpurent-agent sim-fleet: --control-plane, --admin-key (or --admin-key-file), --model, "
                        "--nodes, --fabric and --region are required\n");
        fleet_usage(stderr);
        goto out;
    }
    if (strncmp(f.control_plane, "http://", 7) != 0 && strncmp(f.control_plane, "https://", 8) != 0) {
        fprintf(stderr, "gpurent-agent sim-fleet: --control-plane must be an http:// or https:// URL\n");
        goto out;
    }
    if (!label_valid(f.fabric) || !label_valid(f.region)) {
        fprintf(stderr, "gpurent-agent sim-fleet: --fabric and --region must be 1 to 63 printable characters\n");
        goto out;
    }
    if (key_file) {
        size_t len = 0;
        char *text = state_read_file(key_file, sizeof f.admin_key - 1, &len);
        if (!text) {
            fprintf(stderr, "gpurent-agent sim-fleet: cannot read %s: %s\n", key_file, strerror(errno));
            goto out;
        }
        text[strcspn(text, "\r\n")] = '\0';
        snprintf(f.admin_key, sizeof f.admin_key, "%s", text);
        memset(text, 0, len);
        free(text);
    } else if (strlen(key) >= sizeof f.admin_key) {
        fprintf(stderr, "gpurent-agent sim-fleet: --admin-key is too long\n");
        goto out;
    } else {
        snprintf(f.admin_key, sizeof f.admin_key, "%s", key);
    }
    if (!f.admin_key[0] || strpbrk(f.admin_key, " \t\r\n")) {
        fprintf(stderr, "gpurent-agent sim-fleet: the admin key is empty or has blanks\n");
        goto out;
    }
    if (prefix) {
        snprintf(f.prefix, sizeof f.prefix, "%s", prefix);
    } else {
        snprintf(f.prefix, sizeof f.prefix, "sim-%s-", f.model);
        for (char *p = f.prefix; *p; p++)
            if (*p >= 'A' && *p <= 'Z')
                *p = (char)(*p - 'A' + 'a');
    }

    /* The fleet's own settings come last so a configuration file cannot
     * turn it into something that is not a simulation. */
    status = 1;
    /* log_level goes first, so -o log_level=... still wins over it. */
    memmove(overrides + 1, overrides, (size_t)n_overrides * sizeof *overrides);
    if (asprintf(&overrides[0], "log_level=%s", log_level) < 0) {
        memmove(overrides, overrides + 1, (size_t)n_overrides * sizeof *overrides);
        goto out;
    }
    n_overrides++;
    if (asprintf(&overrides[n_overrides++], "runtime=sim") < 0 ||
        asprintf(&overrides[n_overrides++], "discovery=config") < 0 ||
        asprintf(&overrides[n_overrides++], "inventory_model=%s", f.model) < 0 ||
        asprintf(&overrides[n_overrides++], "inventory_cards=%ld", f.cards) < 0 ||
        asprintf(&overrides[n_overrides++], "inventory_memory_gb=%ld", f.memory_gb) < 0 ||
        (listen && asprintf(&overrides[n_overrides++], "listen=%s", listen) < 0) ||
        (state_dir && asprintf(&overrides[n_overrides++], "state_dir=%s", state_dir) < 0) ||
        (advertise && asprintf(&overrides[n_overrides++], "advertise_url=%s", advertise) < 0))
        goto out;
    if (agent_load_config(&conf, file, overrides, n_overrides) < 0)
        goto out;
    /* SIGHUP reads the same again, the fleet's own settings included. */
    a.conf_file = file;
    a.conf_overrides = overrides;
    a.n_conf_overrides = n_overrides;

    int width = 2;
    for (long v = f.nodes; v >= 100; v /= 10)
        width++;
    if (strlen(f.prefix) + (size_t)width >= AGENT_NAME_MAX) {
        fprintf(stderr, "gpurent-agent sim-fleet: --name-prefix is too long for %ld nodes\n", f.nodes);
        goto out;
    }
    f.names = calloc((size_t)f.nodes, sizeof *f.names);
    name_store = calloc((size_t)f.nodes, AGENT_NAME_MAX);
    if (!f.names || !name_store)
        goto out;
    for (long i = 0; i < f.nodes; i++) {
        f.names[i] = name_store + (size_t)i * AGENT_NAME_MAX;
        int w = snprintf(f.names[i], AGENT_NAME_MAX, "%s%0*ld", f.prefix, width, i + 1);
        if (w < 0 || w >= AGENT_NAME_MAX)
            goto out; /* cannot happen: the length was checked above */
    }
    if (agent_nodes_init(&a, f.names, (size_t)f.nodes) < 0) {
        fprintf(stderr, "gpurent-agent sim-fleet: node names from --name-prefix '%s' must be a-z, 0-9, '_' and '-'\n",
                f.prefix);
        goto out;
    }
    if (check_only) {
        printf("configuration OK\n");
        status = 0;
        goto out;
    }
    /* Secrets from an earlier run: those nodes answer at once, before the
     * control plane is asked again. */
    for (size_t i = 0; i < a.n_nodes; i++) {
        char dir[PATH_MAX], id[ID_MAX], secret[65];
        if (agent_node_dir(&a, &a.nodes[i], dir, sizeof dir) == 0 && registration_load(dir, id, secret) == 0)
            agent_node_set_secret(&a.nodes[i], secret);
        memset(secret, 0, sizeof secret);
    }
    f.memory_gb = conf.inventory_memory_gb;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    status = agent_serve(&a, fleet_register, &f);
    curl_global_cleanup();
out:
    agent_nodes_free(&a);
    memset(f.admin_key, 0, sizeof f.admin_key);
    free(f.names);
    free(name_store);
    for (int i = 0; i < n_overrides; i++)
        free(overrides[i]);
    return status;
}
