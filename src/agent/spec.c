/* spec.c: the workload spec of PUT /v1/workloads/{id} (see agent.h): every
 * field checked against its bounds, and against what could change the
 * meaning of a podman/docker command line built from it. */
#include "agent.h"
#include "gpurent/image_transport.h"
#include "gpurent/secrets.h"
#include "gpurent/utf8.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libssh/libssh.h>

int agent_name_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (n >= AGENT_NAME_MAX - 1 || !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return n > 0;
}

static const char *const phase_names[] = {"pulling", "mounting", "starting", "running", "exited", "failed"};

const char *wl_phase_name(enum wl_phase p)
{
    return (unsigned)p < sizeof phase_names / sizeof phase_names[0] ? phase_names[p] : "unknown";
}

int wl_phase_parse(const char *name, enum wl_phase *out)
{
    for (size_t i = 0; i < sizeof phase_names / sizeof phase_names[0]; i++) {
        if (strcmp(name, phase_names[i]) == 0) {
            *out = (enum wl_phase)i;
            return 0;
        }
    }
    return -1;
}

void spec_free(struct wl_spec *spec)
{
    if (!spec)
        return;
    free(spec->image);
    for (int i = 0; i < spec->n_volumes; i++) {
        free(spec->volumes[i].source);
        free(spec->volumes[i].target);
    }
    for (int i = 0; i < spec->n_env; i++) {
        free(spec->env[i].name);
        free(spec->env[i].value);
    }
    free(spec->env);
    for (int i = 0; i < spec->n_command; i++)
        free(spec->command[i]);
    free(spec->command);
    spec_ssh_keys_free(spec->ssh.keys, spec->ssh.n_keys);
    cluster_free(&spec->cluster);
    memset(spec, 0, sizeof *spec);
}

void workload_free(struct workload *w)
{
    if (!w)
        return;
    spec_free(&w->spec);
    free(w);
}

void workload_message_set(struct workload *w, const char *msg)
{
    size_t n = strlen(msg), cap = sizeof w->message - 1;
    if (n > cap)
        n = cap - utf8_cut_tail((const unsigned char *)msg, cap);
    memcpy(w->message, msg, n);
    w->message[n] = '\0';
    utf8_scrub(w->message);
}

/* Image references: registry/name:tag@digest characters, the same rule as
 * gpurentd's image catalog (so nothing it accepts is refused here). A
 * leading '-' is refused because the image is a word on podman's command
 * line and would be read as an option (--privileged …), and a transport
 * prefix ("oci-archive:/srv/x") because podman would read a host path. */
static int image_valid(const char *s, size_t len)
{
    if (len == 0 || len >= SPEC_IMAGE_MAX || s[0] == '-' || s[0] == '/' || s[0] == ':' ||
        image_names_transport(s, len))
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-' || c == '/' || c == ':' || c == '@' || c == '+'))
            return 0;
    }
    return 1;
}

/* Volume sources go into the mount command template: printable ASCII, no
 * blanks (a word must stay one word), no leading '-' (an option to mount),
 * and, with a bind-mount template, nothing that names the host's root or
 * climbs out of where volumes live: every '/'-separated segment of its
 * path (after a "host:" of NFS) is a name, not empty ("/", "a//b", "a/"),
 * "." or "..". */
static int source_valid(const char *s, size_t len)
{
    if (len == 0 || len >= SPEC_SOURCE_MAX || s[0] == '-')
        return 0;
    for (size_t i = 0; i < len; i++)
        if (s[i] <= ' ' || s[i] > '~')
            return 0;
    /* The "host:" of NFS is a host name or a bracketed IPv6 address; a
     * ':' after anything else is part of a path ("../../dev/block/8:0"),
     * whose segments are then all checked. */
    const char *colon = memchr(s, ':', len);
    if (s[0] == '[') {
        const char *close = memchr(s, ']', len);
        colon = close && close + 1 < s + len && close[1] == ':' ? close + 1 : NULL;
    } else {
        for (const char *p = s; colon && p < colon; p++)
            if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-')
                colon = NULL;
    }
    if (colon == s)
        return 0;
    const char *path = colon ? colon + 1 : s, *end = s + len;
    if (path < end && *path == '/')
        path++;
    for (const char *seg = path; seg <= end;) {
        const char *slash = memchr(seg, '/', (size_t)(end - seg));
        size_t n = (size_t)((slash ? slash : end) - seg);
        if (n == 0 || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
            return 0;
        if (!slash)
            break;
        seg = slash + 1;
    }
    return 1;
}

/* Targets go into "-v HOST:TARGET": an absolute path without ':' or ','
 * (volume option separators), without "." or ".." segments, and not '/'. */
static int target_valid(const char *s, size_t len)
{
    if (len < 2 || len >= SPEC_TARGET_MAX || s[0] != '/' || s[len - 1] == '/')
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-' || c == '/'))
            return 0;
        if (c == '/' && i + 1 < len) {
            const char *seg = s + i + 1;
            size_t seglen = strcspn(seg, "/");
            if (seglen == 0 || (seglen == 1 && seg[0] == '.') || (seglen == 2 && seg[0] == '.' && seg[1] == '.'))
                return 0;
        }
    }
    return 1;
}

/* The agent sets these itself to give a container its cards, and the sim
 * runtime marks each workload's processes with GPURENT_WORKLOAD (one that
 * set another's could pass as it for its ports); a spec may not set them. */
static const char *const reserved_env[] = {
    "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES", "GPURENT_WORKLOAD", NULL,
};

static int env_name_valid(const char *s, size_t len)
{
    if (len == 0 || len >= SPEC_ENV_NAME_MAX || (s[0] >= '0' && s[0] <= '9'))
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

static int env_cmp(const void *a, const void *b)
{
    return strcmp(((const struct spec_env *)a)->name, ((const struct spec_env *)b)->name);
}

int spec_bad(char *field, size_t fieldlen, const char *f, char *err, size_t errlen, const char *fmt, ...)
{
    snprintf(field, fieldlen, "%s", f);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

const char *spec_plain_string(const json_t *v, size_t *len)
{
    if (!json_is_string(v))
        return NULL;
    const char *s = json_string_value(v);
    *len = json_string_length(v);
    return strlen(s) == *len ? s : NULL;
}

/* ssh.user: the login name, which the SSH server matches exactly. */
static int ssh_user_valid(const char *s, size_t len)
{
    if (len == 0 || len >= SPEC_SSH_USER_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int spec_ssh_key_import(const char *line, ssh_key *out)
{
    *out = NULL;
    const char *sp = strchr(line, ' ');
    if (!sp || sp == line || sp - line >= 64 || !sp[1] || strchr(sp + 1, ' '))
        return -1;
    char type_name[64];
    memcpy(type_name, line, (size_t)(sp - line));
    type_name[sp - line] = '\0';
    enum ssh_keytypes_e type = ssh_key_type_from_name(type_name);
    if (type == SSH_KEYTYPE_UNKNOWN)
        return -1;
    ssh_key key = NULL;
    if (ssh_pki_import_pubkey_base64(sp + 1, type, &key) != SSH_OK || !key)
        return -1;
    /* The blob names its own type; a line whose words disagree is refused
     * rather than believed either way. */
    enum ssh_keytypes_e got = ssh_key_type(key);
    const char *blob_type = got == SSH_KEYTYPE_ECDSA_P256 || got == SSH_KEYTYPE_ECDSA_P384 ||
                                    got == SSH_KEYTYPE_ECDSA_P521
                                ? ssh_pki_key_ecdsa_name(key)
                                : ssh_key_type_to_char(got);
    if (!blob_type || strcmp(blob_type, type_name) != 0) {
        ssh_key_free(key);
        return -1;
    }
    *out = key;
    return 0;
}

int spec_ssh_keys_parse(const json_t *keys, const char *name, struct spec_ssh *out, char *field, size_t fieldlen,
                        char *err, size_t errlen)
{
    char f[96];
    size_t len = 0, i;
    json_t *v;
    out->keys = NULL;
    out->n_keys = 0;
    if (!json_is_array(keys) || json_array_size(keys) > SPEC_SSH_MAX_KEYS)
        return spec_bad(field, fieldlen, name, err, errlen, "%s must be an array of at most %d public keys", name,
                        SPEC_SSH_MAX_KEYS);
    if (json_array_size(keys) > 0 && !(out->keys = calloc(json_array_size(keys), sizeof *out->keys)))
        return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
    json_array_foreach(keys, i, v) {
        snprintf(f, sizeof f, "%.64s[%zu]", name, i);
        const char *line = spec_plain_string(v, &len);
        ssh_key parsed = NULL;
        if (!line || len >= SPEC_SSH_KEY_MAX || spec_ssh_key_import(line, &parsed) < 0)
            return spec_bad(field, fieldlen, f, err, errlen,
                       "%s must be a public key \"<type> <base64>\" (no comment, at most %d bytes) whose blob is "
                       "of that type",
                       f, SPEC_SSH_KEY_MAX - 1);
        ssh_key_free(parsed);
        if (!(out->keys[out->n_keys] = strdup(line)))
            return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
        out->n_keys++;
    }
    return 0;
}

void spec_ssh_keys_free(char **keys, int n_keys)
{
    for (int i = 0; i < n_keys; i++)
        free(keys[i]);
    free(keys);
}

void spec_ssh_keys_digest(const struct spec_ssh *ssh, char out[65])
{
    /* Each line and its newline, as gpurentd hashes what it sent. */
    const void *parts[2 * SPEC_SSH_MAX_KEYS];
    size_t lens[2 * SPEC_SSH_MAX_KEYS], n = 0;
    for (int i = 0; i < ssh->n_keys && i < SPEC_SSH_MAX_KEYS; i++) {
        parts[n] = ssh->keys[i];
        lens[n++] = strlen(ssh->keys[i]);
        parts[n] = "\n";
        lens[n++] = 1;
    }
    sha256_hex_parts(parts, lens, n, out);
}

static int parse_ssh(const json_t *ssh, struct wl_spec *out, char *field, size_t fieldlen, char *err, size_t errlen)
{
    char f[64];
    const char *key;
    json_t *v;
    size_t len = 0;
    if (!json_is_object(ssh))
        return spec_bad(field, fieldlen, "ssh", err, errlen, "ssh must be an object with user and authorized_keys");
    json_object_foreach((json_t *)(uintptr_t)ssh, key, v) {
        if (strcmp(key, "user") && strcmp(key, "authorized_keys")) {
            snprintf(f, sizeof f, "ssh.%.48s", key);
            return spec_bad(field, fieldlen, f, err, errlen, "unknown field '%s'", f);
        }
    }
    const char *user = spec_plain_string(json_object_get(ssh, "user"), &len);
    if (!user || !ssh_user_valid(user, len))
        return spec_bad(field, fieldlen, "ssh.user", err, errlen, "ssh.user must be 1 to %d of a-z, 0-9, _ and -",
                   SPEC_SSH_USER_MAX - 1);
    snprintf(out->ssh.user, sizeof out->ssh.user, "%s", user);
    if (spec_ssh_keys_parse(json_object_get(ssh, "authorized_keys"), "ssh.authorized_keys", &out->ssh, field,
                            fieldlen, err, errlen) < 0)
        return -1;
    out->ssh.present = 1;
    return 0;
}

/* ports: [{"container": c, "host": h}], each port 1..65535, no container
 * port and no host port twice. Whether the host ports are the node's is
 * the API's check (it knows the node). */
static int parse_ports(const json_t *ports, struct wl_spec *out, char *field, size_t fieldlen, char *err,
                       size_t errlen)
{
    char f[64];
    if (!json_is_array(ports) || json_array_size(ports) > SPEC_MAX_PORTS)
        return spec_bad(field, fieldlen, "ports", err, errlen, "ports must be an array of at most %d entries",
                   SPEC_MAX_PORTS);
    size_t i;
    json_t *p;
    json_array_foreach((json_t *)(uintptr_t)ports, i, p) {
        snprintf(f, sizeof f, "ports[%zu]", i);
        json_t *c = json_object_get(p, "container"), *h = json_object_get(p, "host");
        if (!json_is_object(p) || json_object_size(p) != 2 || !json_is_integer(c) || !json_is_integer(h) ||
            json_integer_value(c) < 1 || json_integer_value(c) > 65535 || json_integer_value(h) < 1 ||
            json_integer_value(h) > 65535)
            return spec_bad(field, fieldlen, f, err, errlen,
                       "%s must be {\"container\": 1..65535, \"host\": 1..65535} and nothing else", f);
        int container = (int)json_integer_value(c), host = (int)json_integer_value(h);
        for (int j = 0; j < out->n_ports; j++)
            if (out->ports[j].container == container || out->ports[j].host == host)
                return spec_bad(field, fieldlen, f, err, errlen, "%s repeats a container or host port of ports[%d]", f,
                           j);
        out->ports[out->n_ports].container = container;
        out->ports[out->n_ports].host = host;
        out->n_ports++;
    }
    return 0;
}

/* health: {"port": 1..65535, "path": "/...", "interval_s": 1..3600}, all
 * three, nothing else. The path goes on a request line, so it is printable
 * ASCII without blanks. */
static int parse_health(const json_t *h, struct wl_spec *out, char *field, size_t fieldlen, char *err, size_t errlen)
{
    char f[64];
    const char *key;
    json_t *v;
    size_t len = 0;
    if (!json_is_object(h))
        return spec_bad(field, fieldlen, "health", err, errlen, "health must be an object with port, path and interval_s");
    json_object_foreach((json_t *)(uintptr_t)h, key, v) {
        if (strcmp(key, "port") && strcmp(key, "path") && strcmp(key, "interval_s")) {
            snprintf(f, sizeof f, "health.%.48s", key);
            return spec_bad(field, fieldlen, f, err, errlen, "unknown field '%s'", f);
        }
    }
    json_t *port = json_object_get(h, "port"), *interval = json_object_get(h, "interval_s");
    if (!json_is_integer(port) || json_integer_value(port) < 1 || json_integer_value(port) > 65535)
        return spec_bad(field, fieldlen, "health.port", err, errlen, "health.port must be an integer from 1 to 65535");
    const char *path = spec_plain_string(json_object_get(h, "path"), &len);
    int path_ok = path && len >= 1 && len < SPEC_HEALTH_PATH_MAX && path[0] == '/';
    for (size_t i = 0; path_ok && i < len; i++)
        path_ok = path[i] > ' ' && path[i] <= '~';
    if (!path_ok)
        return spec_bad(field, fieldlen, "health.path", err, errlen,
                   "health.path must start with / and be at most %d printable characters without blanks",
                   SPEC_HEALTH_PATH_MAX - 1);
    if (!json_is_integer(interval) || json_integer_value(interval) < 1 ||
        json_integer_value(interval) > SPEC_HEALTH_INTERVAL_MAX)
        return spec_bad(field, fieldlen, "health.interval_s", err, errlen,
                   "health.interval_s must be an integer from 1 to %d", SPEC_HEALTH_INTERVAL_MAX);
    out->health.port = (int)json_integer_value(port);
    snprintf(out->health.path, sizeof out->health.path, "%s", path);
    out->health.interval_s = (int)json_integer_value(interval);
    out->health.present = 1;
    return 0;
}

/* working_dir: an absolute path without "..", control characters or ','
 * (it is one word of --workdir, never split, but kept plain). */
static int working_dir_valid(const char *s, size_t len)
{
    if (len == 0 || len >= SPEC_WORKING_DIR_MAX || s[0] != '/')
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == ',')
            return 0;
        if (c == '/' && i + 1 < len) {
            const char *seg = s + i + 1;
            size_t seglen = strcspn(seg, "/");
            if (seglen == 2 && seg[0] == '.' && seg[1] == '.')
                return 0;
        }
    }
    return 1;
}

/* command, working_dir and secret_env (after env, whose names secret_env
 * must be). */
static int parse_run(const json_t *obj, struct wl_spec *out, char *field, size_t fieldlen, char *err, size_t errlen)
{
    size_t len = 0, total = 0, i;
    json_t *v;
    json_t *cmd = json_object_get(obj, "command");
    if (cmd && !json_is_null(cmd)) {
        if (!json_is_array(cmd) || json_array_size(cmd) < 1 || json_array_size(cmd) > SPEC_COMMAND_MAX_WORDS)
            return spec_bad(field, fieldlen, "command", err, errlen, "command must be an array of 1 to %d strings",
                       SPEC_COMMAND_MAX_WORDS);
        if (!(out->command = calloc(json_array_size(cmd), sizeof *out->command)))
            return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
        json_array_foreach(cmd, i, v) {
            const char *word = spec_plain_string(v, &len);
            if (!word || len > SPEC_COMMAND_WORD_MAX || (i == 0 && len == 0))
                return spec_bad(field, fieldlen, "command", err, errlen,
                           "command[%zu] must be a string of at most %d bytes without NUL (the first not empty)", i,
                           SPEC_COMMAND_WORD_MAX);
            total += len;
            if (total > SPEC_COMMAND_MAX_BYTES)
                return spec_bad(field, fieldlen, "command", err, errlen, "command is over %d bytes in all",
                           SPEC_COMMAND_MAX_BYTES);
            if (!(out->command[out->n_command] = strdup(word)))
                return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
            out->n_command++;
        }
    }
    json_t *wd = json_object_get(obj, "working_dir");
    if (wd && !json_is_null(wd)) {
        const char *dir = spec_plain_string(wd, &len);
        if (!dir || !working_dir_valid(dir, len))
            return spec_bad(field, fieldlen, "working_dir", err, errlen,
                       "working_dir must be an absolute path of at most %d bytes without .., ',' or control "
                       "characters",
                       SPEC_WORKING_DIR_MAX - 1);
        snprintf(out->working_dir, sizeof out->working_dir, "%s", dir);
    }
    json_t *secret = json_object_get(obj, "secret_env");
    if (secret && !json_is_null(secret)) {
        if (!json_is_array(secret) || json_array_size(secret) > SPEC_MAX_ENV)
            return spec_bad(field, fieldlen, "secret_env", err, errlen,
                       "secret_env must be an array of at most %d names of env", SPEC_MAX_ENV);
        json_array_foreach(secret, i, v) {
            const char *name = spec_plain_string(v, &len);
            struct spec_env *found = NULL;
            for (int k = 0; name && k < out->n_env && !found; k++)
                if (strcmp(out->env[k].name, name) == 0)
                    found = &out->env[k];
            if (!found)
                return spec_bad(field, fieldlen, "secret_env", err, errlen, "secret_env[%zu] must name an entry of env", i);
            /* It travels in an env file of NAME=VALUE lines. */
            if (strpbrk(found->value, "\r\n"))
                return spec_bad(field, fieldlen, "secret_env", err, errlen,
                           "secret_env[%zu]: a secret value cannot hold a line break", i);
            found->secret = 1;
        }
    }
    return 0;
}

static int parse_into(const json_t *obj, struct wl_spec *out, char *field, size_t fieldlen, char *err, size_t errlen)
{
    char f[64];
    size_t len = 0;
    const char *key;
    json_t *v;

    if (!json_is_object(obj))
        return spec_bad(field, fieldlen, "", err, errlen, "the spec must be a JSON object");
    json_object_foreach((json_t *)(uintptr_t)obj, key, v) {
        if (strcmp(key, "image") && strcmp(key, "gpus") && strcmp(key, "stack") && strcmp(key, "volumes") &&
            strcmp(key, "env") && strcmp(key, "ssh") && strcmp(key, "ports") && strcmp(key, "command") &&
            strcmp(key, "working_dir") && strcmp(key, "secret_env") && strcmp(key, "cluster") &&
            strcmp(key, "health"))
            return spec_bad(field, fieldlen, key, err, errlen, "unknown field '%.64s'", key);
    }

    const char *image = spec_plain_string(json_object_get(obj, "image"), &len);
    if (!image)
        return spec_bad(field, fieldlen, "image", err, errlen, "image must be a string");
    if (!image_valid(image, len))
        return spec_bad(field, fieldlen, "image", err, errlen,
                   "image must be 1 to %d characters of letters, digits and . _ - / : @ +, not starting with - / or :",
                   SPEC_IMAGE_MAX - 1);
    if (!(out->image = strdup(image)))
        return spec_bad(field, fieldlen, "", err, errlen, "out of memory");

    json_t *gpus = json_object_get(obj, "gpus");
    if (gpus && !json_is_null(gpus)) {
        if (!json_is_array(gpus) || json_array_size(gpus) > SPEC_MAX_GPUS)
            return spec_bad(field, fieldlen, "gpus", err, errlen, "gpus must be an array of at most %d card indices",
                       SPEC_MAX_GPUS);
        size_t i;
        json_array_foreach(gpus, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= DISCOVERY_MAX_CARDS)
                return spec_bad(field, fieldlen, "gpus", err, errlen, "gpus[%zu] must be a card index from 0 to %d", i,
                           DISCOVERY_MAX_CARDS - 1);
            int g = (int)json_integer_value(v);
            for (int k = 0; k < out->n_gpus; k++)
                if (out->gpus[k] == g)
                    return spec_bad(field, fieldlen, "gpus", err, errlen, "gpus lists card %d twice", g);
            out->gpus[out->n_gpus++] = g;
        }
    }

    json_t *stack = json_object_get(obj, "stack");
    if (stack && !json_is_null(stack)) {
        const char *s = spec_plain_string(stack, &len);
        if (!s || (strcmp(s, "ROCm") != 0 && strcmp(s, "CUDA") != 0))
            return spec_bad(field, fieldlen, "stack", err, errlen, "stack must be \"ROCm\" or \"CUDA\"");
        snprintf(out->stack, sizeof out->stack, "%s", s);
    }

    json_t *vols = json_object_get(obj, "volumes");
    if (vols && !json_is_null(vols)) {
        if (!json_is_array(vols) || json_array_size(vols) > SPEC_MAX_VOLUMES)
            return spec_bad(field, fieldlen, "volumes", err, errlen, "volumes must be an array of at most %d objects",
                       SPEC_MAX_VOLUMES);
        size_t i;
        json_array_foreach(vols, i, v) {
            snprintf(f, sizeof f, "volumes[%zu]", i);
            if (!json_is_object(v))
                return spec_bad(field, fieldlen, f, err, errlen, "%s must be an object with source and target", f);
            json_t *member;
            json_object_foreach(v, key, member) {
                if (strcmp(key, "source") && strcmp(key, "target") && strcmp(key, "size_gb")) {
                    snprintf(f, sizeof f, "volumes[%zu].%.32s", i, key);
                    return spec_bad(field, fieldlen, f, err, errlen, "unknown field '%s'", f);
                }
            }
            size_t slen = 0, tlen = 0;
            const char *src = spec_plain_string(json_object_get(v, "source"), &slen);
            const char *tgt = spec_plain_string(json_object_get(v, "target"), &tlen);
            if (!src || !source_valid(src, slen)) {
                snprintf(f, sizeof f, "volumes[%zu].source", i);
                return spec_bad(field, fieldlen, f, err, errlen,
                           "%s must be 1 to %d printable characters without blanks, not starting with -", f,
                           SPEC_SOURCE_MAX - 1);
            }
            if (!tgt || !target_valid(tgt, tlen)) {
                snprintf(f, sizeof f, "volumes[%zu].target", i);
                return spec_bad(field, fieldlen, f, err, errlen,
                           "%s must be an absolute path (letters, digits, . _ - /) without . or .. segments", f);
            }
            for (int k = 0; k < out->n_volumes; k++) {
                if (strcmp(out->volumes[k].target, tgt) == 0) {
                    snprintf(f, sizeof f, "volumes[%zu].target", i);
                    return spec_bad(field, fieldlen, f, err, errlen, "two volumes are mounted at %s", tgt);
                }
            }
            /* The quota reaches mount_command as {size_gb}. Optional, so a
             * control plane that does not send it is still served; null is
             * not "absent" here, since no control plane ever sent one. */
            json_t *size = json_object_get(v, "size_gb");
            int64_t size_gb = 0;
            if (size) {
                if (!json_is_integer(size) || json_integer_value(size) < 1 ||
                    json_integer_value(size) > SPEC_SIZE_GB_MAX) {
                    snprintf(f, sizeof f, "volumes[%zu].size_gb", i);
                    return spec_bad(field, fieldlen, f, err, errlen, "%s must be an integer from 1 to %d", f,
                               SPEC_SIZE_GB_MAX);
                }
                size_gb = (int64_t)json_integer_value(size);
            }
            struct spec_volume *sv = &out->volumes[out->n_volumes];
            sv->size_gb = size_gb;
            sv->source = strdup(src);
            sv->target = strdup(tgt);
            out->n_volumes++; /* counted first, so spec_free frees a half-made entry */
            if (!sv->source || !sv->target)
                return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
        }
    }

    json_t *env = json_object_get(obj, "env");
    if (env && !json_is_null(env)) {
        if (!json_is_object(env) || json_object_size(env) > SPEC_MAX_ENV)
            return spec_bad(field, fieldlen, "env", err, errlen, "env must be an object of at most %d strings", SPEC_MAX_ENV);
        if (json_object_size(env) > 0 && !(out->env = calloc(json_object_size(env), sizeof *out->env)))
            return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
        json_object_foreach(env, key, v) {
            snprintf(f, sizeof f, "env.%.48s", key);
            if (!env_name_valid(key, strlen(key)))
                return spec_bad(field, fieldlen, f, err, errlen,
                           "environment names are 1 to %d of letters, digits and _, not starting with a digit",
                           SPEC_ENV_NAME_MAX - 1);
            for (const char *const *r = reserved_env; *r; r++)
                if (strcmp(key, *r) == 0)
                    return spec_bad(field, fieldlen, f, err, errlen, "%s is set by the agent from gpus", key);
            size_t vlen;
            const char *val = spec_plain_string(v, &vlen);
            if (!val || vlen >= SPEC_ENV_VALUE_MAX)
                return spec_bad(field, fieldlen, f, err, errlen, "%s must be a string of at most %d bytes without NUL", f,
                           SPEC_ENV_VALUE_MAX - 1);
            struct spec_env *e = &out->env[out->n_env++];
            e->name = strdup(key);
            e->value = strdup(val);
            if (!e->name || !e->value)
                return spec_bad(field, fieldlen, "", err, errlen, "out of memory");
        }
        if (out->n_env > 1)
            qsort(out->env, (size_t)out->n_env, sizeof *out->env, env_cmp);
    }

    if (parse_run(obj, out, field, fieldlen, err, errlen) < 0)
        return -1;
    json_t *ssh = json_object_get(obj, "ssh");
    if (ssh && !json_is_null(ssh) && parse_ssh(ssh, out, field, fieldlen, err, errlen) < 0)
        return -1;
    json_t *ports = json_object_get(obj, "ports");
    if (ports && !json_is_null(ports) && parse_ports(ports, out, field, fieldlen, err, errlen) < 0)
        return -1;
    json_t *cluster = json_object_get(obj, "cluster");
    if (cluster && !json_is_null(cluster) && cluster_parse(cluster, &out->cluster, field, fieldlen, err, errlen) < 0)
        return -1;
    json_t *health = json_object_get(obj, "health");
    if (health && !json_is_null(health) && parse_health(health, out, field, fieldlen, err, errlen) < 0)
        return -1;
    return 0;
}

int spec_parse(const json_t *obj, struct wl_spec *out, char *field, size_t fieldlen, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (parse_into(obj, out, field, fieldlen, err, errlen) < 0) {
        spec_free(out);
        return -1;
    }
    return 0;
}

json_t *spec_to_json(const struct wl_spec *spec)
{
    json_t *gpus = json_array(), *vols = json_array(), *env = json_object();
    for (int i = 0; i < spec->n_gpus; i++)
        json_array_append_new(gpus, json_integer(spec->gpus[i]));
    for (int i = 0; i < spec->n_volumes; i++) {
        json_t *vol = json_pack("{s:s, s:s}", "source", spec->volumes[i].source, "target", spec->volumes[i].target);
        /* Only when given, so a record made from an older control plane's
         * spec reads back as the same spec. */
        if (vol && spec->volumes[i].size_gb > 0)
            json_object_set_new(vol, "size_gb", json_integer((json_int_t)spec->volumes[i].size_gb));
        json_array_append_new(vols, vol);
    }
    for (int i = 0; i < spec->n_env; i++)
        json_object_set_new(env, spec->env[i].name, json_string(spec->env[i].value));
    json_t *o = json_pack("{s:s, s:o, s:o, s:o}", "image", spec->image, "gpus", gpus, "volumes", vols, "env", env);
    if (o && spec->stack[0])
        json_object_set_new(o, "stack", json_string(spec->stack));
    /* Only when given, so a record from before SSH reads back the same. */
    if (o && spec->ssh.present) {
        json_t *keys = json_array();
        for (int i = 0; i < spec->ssh.n_keys; i++)
            json_array_append_new(keys, json_string(spec->ssh.keys[i]));
        json_object_set_new(o, "ssh", json_pack("{s:s, s:o}", "user", spec->ssh.user, "authorized_keys", keys));
    }
    /* Each only when given, so older records read back the same. */
    if (o && spec->n_command > 0) {
        json_t *cmd = json_array();
        for (int i = 0; i < spec->n_command; i++)
            json_array_append_new(cmd, json_string(spec->command[i]));
        json_object_set_new(o, "command", cmd);
    }
    if (o && spec->working_dir[0])
        json_object_set_new(o, "working_dir", json_string(spec->working_dir));
    json_t *secret = json_array();
    for (int i = 0; i < spec->n_env; i++)
        if (spec->env[i].secret)
            json_array_append_new(secret, json_string(spec->env[i].name));
    if (o && json_array_size(secret) > 0)
        json_object_set(o, "secret_env", secret);
    json_decref(secret);
    /* Likewise only when there are some. */
    if (o && spec->n_ports > 0) {
        json_t *ports = json_array();
        for (int i = 0; i < spec->n_ports; i++)
            json_array_append_new(ports, json_pack("{s:i, s:i}", "container", spec->ports[i].container, "host",
                                                   spec->ports[i].host));
        json_object_set_new(o, "ports", ports);
    }
    if (o && spec->cluster.present)
        json_object_set_new(o, "cluster", cluster_to_json(&spec->cluster));
    if (o && spec->health.present)
        json_object_set_new(o, "health", json_pack("{s:i, s:s, s:i}", "port", spec->health.port, "path",
                                                   spec->health.path, "interval_s", spec->health.interval_s));
    return o;
}

/* Whether a and b ask for the same thing, their ssh.authorized_keys
 * compared too when with_keys. */
static int specs_equal(const struct wl_spec *a, const struct wl_spec *b, int with_keys)
{
    if (strcmp(a->image, b->image) != 0 || strcmp(a->stack, b->stack) != 0 || a->n_gpus != b->n_gpus ||
        a->n_volumes != b->n_volumes || a->n_env != b->n_env)
        return 0;
    if (memcmp(a->gpus, b->gpus, (size_t)a->n_gpus * sizeof a->gpus[0]) != 0)
        return 0;
    for (int i = 0; i < a->n_volumes; i++)
        if (strcmp(a->volumes[i].source, b->volumes[i].source) ||
            strcmp(a->volumes[i].target, b->volumes[i].target) || a->volumes[i].size_gb != b->volumes[i].size_gb)
            return 0;
    /* env is kept sorted by name, so equal maps compare entry by entry. */
    for (int i = 0; i < a->n_env; i++)
        if (strcmp(a->env[i].name, b->env[i].name) || strcmp(a->env[i].value, b->env[i].value) ||
            a->env[i].secret != b->env[i].secret)
            return 0;
    if (a->n_command != b->n_command || strcmp(a->working_dir, b->working_dir) != 0)
        return 0;
    for (int i = 0; i < a->n_command; i++)
        if (strcmp(a->command[i], b->command[i]) != 0)
            return 0;
    if (a->ssh.present != b->ssh.present || strcmp(a->ssh.user, b->ssh.user) != 0)
        return 0;
    if (with_keys && a->ssh.n_keys != b->ssh.n_keys)
        return 0;
    for (int i = 0; with_keys && i < a->ssh.n_keys; i++)
        if (strcmp(a->ssh.keys[i], b->ssh.keys[i]) != 0)
            return 0;
    if (a->n_ports != b->n_ports)
        return 0;
    for (int i = 0; i < a->n_ports; i++)
        if (a->ports[i].container != b->ports[i].container || a->ports[i].host != b->ports[i].host)
            return 0;
    if (a->health.present != b->health.present || a->health.port != b->health.port ||
        a->health.interval_s != b->health.interval_s || strcmp(a->health.path, b->health.path) != 0)
        return 0;
    return cluster_equal(&a->cluster, &b->cluster);
}

int spec_equal(const struct wl_spec *a, const struct wl_spec *b)
{
    return specs_equal(a, b, 1);
}

int spec_equal_but_ssh_keys(const struct wl_spec *a, const struct wl_spec *b)
{
    return specs_equal(a, b, 0);
}

void spec_public_json(const struct wl_spec *spec, json_t *j)
{
    json_t *cmd = NULL, *env = json_object();
    if (spec->n_command > 0) {
        cmd = json_array();
        for (int i = 0; i < spec->n_command; i++)
            json_array_append_new(cmd, json_string(spec->command[i]));
    }
    for (int i = 0; i < spec->n_env; i++)
        json_object_set_new(env, spec->env[i].name, json_string(spec->env[i].secret ? "***" : spec->env[i].value));
    json_object_set_new(j, "command", cmd ? cmd : json_null());
    json_object_set_new(j, "working_dir", json_string(spec->working_dir));
    json_object_set_new(j, "env", env);
}

int spec_image_has(const struct wl_spec *spec, const char *word)
{
    return spec->image && strstr(spec->image, word) != NULL;
}
