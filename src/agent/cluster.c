/* cluster.c: the `cluster` member of a workload spec (the ranks of a
 * multi-node instance: their names, data addresses, SSH logins and slots,
 * and the instance's private key) and the files made from it for the
 * container: DeepSpeed's and MPI's hostfiles and an ssh directory (config,
 * id_ed25519, known_hosts) with which each rank reaches every other by its
 * hostfile name. The identity is a secret: it is kept only in the record
 * (0600) and the key file (0600), never in a reply, a log line or a
 * command line. */
#include "agent.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libssh/libssh.h>

/* Host names are hostfile words, ssh Host patterns and /etc/hosts names:
 * [a-z0-9-] keeps them all three without quoting. */
static int host_name_valid(const char *s, size_t len)
{
    if (len == 0 || len >= AGENT_NAME_MAX || s[0] == '-')
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return 0;
    return 1;
}

/* A DNS name: dot-separated labels of 1..63 letters, digits and '-', not
 * starting or ending with '-', 253 bytes at most, and not all digits and
 * dots (that would be a malformed IPv4 address). */
static int dns_name_valid(const char *s, size_t len)
{
    if (len == 0 || len > 253)
        return 0;
    size_t label = 0;
    int alpha = 0;
    for (size_t i = 0; i <= len; i++) {
        char c = i < len ? s[i] : '.';
        if (c == '.') {
            if (label == 0 || s[i - 1] == '-')
                return 0;
            label = 0;
            continue;
        }
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'))
            return 0;
        if (c == '-' && label == 0)
            return 0;
        alpha |= !(c >= '0' && c <= '9');
        if (++label > 63)
            return 0;
    }
    return alpha;
}

int cluster_address_valid(const char *s)
{
    unsigned char buf[16];
    size_t len = strlen(s);
    if (len == 0 || len >= SPEC_CLUSTER_ADDRESS_MAX)
        return 0;
    if (inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1)
        return 1;
    return dns_name_valid(s, len);
}

int cluster_address_is_ip(const char *s)
{
    unsigned char buf[16];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

void cluster_free(struct spec_cluster *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_hosts; i++)
        free(c->hosts[i].host_key);
    free(c->hosts);
    if (c->identity) {
        /* A private key: not left in freed memory. */
        memset(c->identity, 0, strlen(c->identity));
        free(c->identity);
    }
    memset(c, 0, sizeof *c);
}

/* The identity: an unencrypted OpenSSH ed25519 private key that libssh
 * reads, so a key that cannot work never reaches a container. */
static int identity_valid(const char *s, size_t len)
{
    static const char begin[] = "-----BEGIN OPENSSH PRIVATE KEY-----\n";
    if (len >= SPEC_CLUSTER_IDENTITY_MAX || strncmp(s, begin, sizeof begin - 1) != 0 ||
        !strstr(s, "-----END OPENSSH PRIVATE KEY-----"))
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= ' ' && s[i] <= '~') || s[i] == '\n' || s[i] == '\r'))
            return 0;
    ssh_key key = NULL;
    if (ssh_pki_import_privkey_base64(s, NULL, NULL, NULL, &key) != SSH_OK || !key)
        return 0;
    int ok = ssh_key_type(key) == SSH_KEYTYPE_ED25519 && ssh_key_is_private(key);
    ssh_key_free(key);
    return ok;
}

static int ssh_user_ok(const char *s, size_t len)
{
    if (len == 0 || len >= SPEC_SSH_USER_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

static int parse_host(const json_t *h, size_t i, struct spec_cluster_host *out, char *field, size_t fieldlen,
                      char *err, size_t errlen)
{
    char f[64];
    const char *key;
    json_t *v;
    size_t len = 0;
    snprintf(f, sizeof f, "cluster.hosts[%zu]", i);
    if (!json_is_object(h))
        return spec_bad(field, fieldlen, f, err, errlen,
                   "%s must be an object with name, address, ssh_port, user, slots and host_key", f);
    json_object_foreach((json_t *)(uintptr_t)h, key, v) {
        if (strcmp(key, "name") && strcmp(key, "address") && strcmp(key, "ssh_port") && strcmp(key, "user") &&
            strcmp(key, "slots") && strcmp(key, "host_key")) {
            snprintf(f, sizeof f, "cluster.hosts[%zu].%.24s", i, key);
            return spec_bad(field, fieldlen, f, err, errlen, "unknown field '%s'", f);
        }
    }
    const char *name = spec_plain_string(json_object_get(h, "name"), &len);
    if (!name || !host_name_valid(name, len)) {
        snprintf(f, sizeof f, "cluster.hosts[%zu].name", i);
        return spec_bad(field, fieldlen, f, err, errlen, "%s must be 1 to %d of a-z, 0-9 and -, not starting with -", f,
                   AGENT_NAME_MAX - 1);
    }
    snprintf(out->name, sizeof out->name, "%s", name);
    const char *addr = spec_plain_string(json_object_get(h, "address"), &len);
    if (!addr || len >= SPEC_CLUSTER_ADDRESS_MAX || !cluster_address_valid(addr)) {
        snprintf(f, sizeof f, "cluster.hosts[%zu].address", i);
        return spec_bad(field, fieldlen, f, err, errlen, "%s must be an IPv4 address, an IPv6 address or a host name", f);
    }
    snprintf(out->address, sizeof out->address, "%s", addr);
    json_t *port = json_object_get(h, "ssh_port");
    if (!json_is_integer(port) || json_integer_value(port) < 1 || json_integer_value(port) > 65535) {
        snprintf(f, sizeof f, "cluster.hosts[%zu].ssh_port", i);
        return spec_bad(field, fieldlen, f, err, errlen, "%s must be an integer from 1 to 65535", f);
    }
    out->ssh_port = (int)json_integer_value(port);
    const char *user = spec_plain_string(json_object_get(h, "user"), &len);
    if (!user || !ssh_user_ok(user, len)) {
        snprintf(f, sizeof f, "cluster.hosts[%zu].user", i);
        return spec_bad(field, fieldlen, f, err, errlen, "%s must be 1 to %d of a-z, 0-9, _ and -", f,
                   SPEC_SSH_USER_MAX - 1);
    }
    snprintf(out->user, sizeof out->user, "%s", user);
    json_t *slots = json_object_get(h, "slots");
    if (!json_is_integer(slots) || json_integer_value(slots) < 1 ||
        json_integer_value(slots) > SPEC_CLUSTER_SLOTS_MAX) {
        snprintf(f, sizeof f, "cluster.hosts[%zu].slots", i);
        return spec_bad(field, fieldlen, f, err, errlen, "%s must be an integer from 1 to %d", f, SPEC_CLUSTER_SLOTS_MAX);
    }
    out->slots = (int)json_integer_value(slots);
    const char *hk = spec_plain_string(json_object_get(h, "host_key"), &len);
    struct ssh_key_struct *parsed = NULL;
    if (!hk || len >= SPEC_SSH_KEY_MAX || spec_ssh_key_import(hk, &parsed) < 0) {
        snprintf(f, sizeof f, "cluster.hosts[%zu].host_key", i);
        return spec_bad(field, fieldlen, f, err, errlen, "%s must be a public key \"<type> <base64>\" (no comment)", f);
    }
    ssh_key_free(parsed);
    if (!(out->host_key = strdup(hk)))
        return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
    return 0;
}

static int parse_into(const json_t *obj, struct spec_cluster *out, char *field, size_t fieldlen, char *err,
                      size_t errlen)
{
    const char *key;
    json_t *v;
    char f[64];
    size_t len = 0;
    if (!json_is_object(obj))
        return spec_bad(field, fieldlen, "cluster", err, errlen, "cluster must be an object with rank, hosts and identity");
    json_object_foreach((json_t *)(uintptr_t)obj, key, v) {
        if (strcmp(key, "rank") && strcmp(key, "hosts") && strcmp(key, "identity")) {
            snprintf(f, sizeof f, "cluster.%.48s", key);
            return spec_bad(field, fieldlen, f, err, errlen, "unknown field '%s'", f);
        }
    }
    json_t *hosts = json_object_get(obj, "hosts");
    if (!json_is_array(hosts) || json_array_size(hosts) < 1 || json_array_size(hosts) > SPEC_CLUSTER_MAX_HOSTS)
        return spec_bad(field, fieldlen, "cluster.hosts", err, errlen,
                   "cluster.hosts must be an array of 1 to %d hosts, in rank order", SPEC_CLUSTER_MAX_HOSTS);
    if (!(out->hosts = calloc(json_array_size(hosts), sizeof *out->hosts)))
        return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
    size_t i;
    json_array_foreach(hosts, i, v) {
        struct spec_cluster_host *h = &out->hosts[out->n_hosts];
        int rc = parse_host(v, i, h, field, fieldlen, err, errlen);
        out->n_hosts++; /* counted first, so cluster_free frees a half-made entry */
        if (rc < 0)
            return -1;
        for (int k = 0; k + 1 < out->n_hosts; k++) {
            if (strcmp(out->hosts[k].name, h->name) == 0) {
                snprintf(f, sizeof f, "cluster.hosts[%zu].name", i);
                return spec_bad(field, fieldlen, f, err, errlen, "%s repeats the name of cluster.hosts[%d]", f, k);
            }
        }
    }
    json_t *rank = json_object_get(obj, "rank");
    if (!json_is_integer(rank) || json_integer_value(rank) < 0 || json_integer_value(rank) >= out->n_hosts)
        return spec_bad(field, fieldlen, "cluster.rank", err, errlen,
                   "cluster.rank must be an integer from 0 to %d (this node's entry of cluster.hosts)",
                   out->n_hosts - 1);
    out->rank = (int)json_integer_value(rank);
    /* The value is never quoted in the message: it is a private key. */
    const char *id = spec_plain_string(json_object_get(obj, "identity"), &len);
    if (!id || !identity_valid(id, len))
        return spec_bad(field, fieldlen, "cluster.identity", err, errlen,
                   "cluster.identity must be an unencrypted OpenSSH ed25519 private key (at most %d bytes)",
                   SPEC_CLUSTER_IDENTITY_MAX - 1);
    if (!(out->identity = strdup(id)))
        return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
    out->present = 1;
    return 0;
}

int cluster_parse(const json_t *obj, struct spec_cluster *out, char *field, size_t fieldlen, char *err,
                  size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (parse_into(obj, out, field, fieldlen, err, errlen) < 0) {
        cluster_free(out);
        return -1;
    }
    return 0;
}

json_t *cluster_to_json(const struct spec_cluster *c)
{
    json_t *hosts = json_array();
    for (int i = 0; i < c->n_hosts; i++) {
        const struct spec_cluster_host *h = &c->hosts[i];
        json_array_append_new(hosts, json_pack("{s:s, s:s, s:i, s:s, s:i, s:s}", "name", h->name, "address",
                                               h->address, "ssh_port", h->ssh_port, "user", h->user, "slots",
                                               h->slots, "host_key", h->host_key));
    }
    return json_pack("{s:i, s:o, s:s}", "rank", c->rank, "hosts", hosts, "identity", c->identity);
}

int cluster_equal(const struct spec_cluster *a, const struct spec_cluster *b)
{
    if (a->present != b->present)
        return 0;
    if (!a->present)
        return 1;
    if (a->rank != b->rank || a->n_hosts != b->n_hosts || strcmp(a->identity, b->identity) != 0)
        return 0;
    for (int i = 0; i < a->n_hosts; i++) {
        const struct spec_cluster_host *x = &a->hosts[i], *y = &b->hosts[i];
        if (strcmp(x->name, y->name) || strcmp(x->address, y->address) || x->ssh_port != y->ssh_port ||
            strcmp(x->user, y->user) || x->slots != y->slots || strcmp(x->host_key, y->host_key))
            return 0;
    }
    return 1;
}

int cluster_multi_node(const struct wl_spec *s)
{
    return s->cluster.present && s->cluster.n_hosts > 1;
}

/* ------------------------------------------------------------ the files */

/* A growing string; on failure buf is freed and NULL. */
struct text {
    char *buf;
    size_t len, cap;
    int failed;
};

static void addf(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(struct text *t, const char *fmt, ...)
{
    if (t->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            break;
        }
        if (t->buf && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap <= t->len + (size_t)n)
            cap *= 2;
        char *g = realloc(t->buf, cap);
        if (!g) {
            t->failed = 1;
            break;
        }
        t->buf = g;
        t->cap = cap;
    }
    free(t->buf);
    t->buf = NULL;
}

static char *text_done(struct text *t)
{
    if (t->failed)
        return NULL;
    if (!t->buf)
        return strdup("");
    return t->buf;
}

char *cluster_hostfile(const struct spec_cluster *c, int mpi)
{
    struct text t = {0};
    for (int i = 0; i < c->n_hosts; i++)
        addf(&t, mpi ? "%s:%d\n" : "%s slots=%d\n", c->hosts[i].name, c->hosts[i].slots);
    return text_done(&t);
}

/* A path for ssh_config: quoted when it holds a blank. -1 for characters
 * ssh would read otherwise ('"', '%' tokens, control characters). */
static int config_path(const char *home, const char *file, char *out, size_t outlen)
{
    for (const char *p = home; *p; p++)
        if (*p == '"' || *p == '%' || *p == '\\' || (unsigned char)*p < ' ' || *p == 0x7f)
            return -1;
    int n = strchr(home, ' ') ? snprintf(out, outlen, "\"%s/%s\"", home, file)
                              : snprintf(out, outlen, "%s/%s", home, file);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

char *cluster_ssh_config(const struct spec_cluster *c, const char *ssh_home)
{
    char id[PATH_MAX + 32], kh[PATH_MAX + 32];
    if (config_path(ssh_home, "id_ed25519", id, sizeof id) < 0 ||
        config_path(ssh_home, "known_hosts", kh, sizeof kh) < 0)
        return NULL;
    struct text t = {0};
    addf(&t, "# Written by gpurent-agent: every rank of this instance by its hostfile name.\n");
    for (int i = 0; i < c->n_hosts; i++) {
        const struct spec_cluster_host *h = &c->hosts[i];
        addf(&t,
             "Host %s\n    HostName %s\n    Port %d\n    User %s\n    IdentityFile %s\n    IdentitiesOnly yes\n"
             "    StrictHostKeyChecking yes\n    UserKnownHostsFile %s\n",
             h->name, h->address, h->ssh_port, h->user, id, kh);
    }
    return text_done(&t);
}

char *cluster_known_hosts(const struct spec_cluster *c)
{
    struct text t = {0};
    /* OpenSSH looks a host up as "[address]:port", except on port 22 where
     * it uses the bare address. */
    for (int i = 0; i < c->n_hosts; i++) {
        const struct spec_cluster_host *h = &c->hosts[i];
        if (h->ssh_port == 22)
            addf(&t, "%s %s\n", h->address, h->host_key);
        else
            addf(&t, "[%s]:%d %s\n", h->address, h->ssh_port, h->host_key);
    }
    return text_done(&t);
}

static int write_text(const char *dir, const char *name, char *text, unsigned mode, char *msg, size_t msglen)
{
    if (!text) {
        snprintf(msg, msglen, "cluster files: cannot build %s", name);
        return -1;
    }
    int rc = state_write_atomic(dir, name, text, strlen(text), mode);
    if (rc < 0)
        snprintf(msg, msglen, "cluster files: cannot write %s/%s: %s", dir, name, strerror(errno));
    memset(text, 0, strlen(text));
    free(text);
    return rc;
}

int cluster_write_files(const struct spec_cluster *c, const char *etc_dir, const char *ssh_dir, const char *ssh_home,
                        char *msg, size_t msglen)
{
    if (state_mkdirs(etc_dir) < 0 || state_mkdirs(ssh_dir) < 0) {
        snprintf(msg, msglen, "cluster files: cannot create %s: %s", etc_dir, strerror(errno));
        return -1;
    }
    /* The identity ends with a newline, or OpenSSH refuses to load it. */
    size_t n = strlen(c->identity);
    char *key = malloc(n + 2);
    if (key) {
        memcpy(key, c->identity, n);
        key[n] = '\0';
        if (n == 0 || key[n - 1] != '\n')
            strcat(key, "\n");
    }
    /* Everything is readable by root in the container only where a secret
     * lies (0600); the hostfiles and known_hosts are public knowledge. */
    if (write_text(etc_dir, "hostfile", cluster_hostfile(c, 0), 0644, msg, msglen) < 0 ||
        write_text(etc_dir, "hostfile.mpi", cluster_hostfile(c, 1), 0644, msg, msglen) < 0 ||
        write_text(ssh_dir, "known_hosts", cluster_known_hosts(c), 0644, msg, msglen) < 0 ||
        write_text(ssh_dir, "config", cluster_ssh_config(c, ssh_home), 0600, msg, msglen) < 0 ||
        write_text(ssh_dir, "id_ed25519", key, 0600, msg, msglen) < 0)
        return -1;
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    if (remove(path) < 0 && errno != ENOENT)
        log_warn("cannot remove %s: %s", path, strerror(errno));
    return 0;
}

void cluster_remove_dir(const char *dir)
{
    if (access(dir, F_OK) == 0)
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
