/* runspec.c: what an instance runs (command, env, working_dir), each field
 * checked with a reason naming it, the public view of env (secret values
 * never leave), and the image policy: the catalog only, or any reference of
 * an allowed registry, with the reference grammar. Pure functions apart
 * from the configuration read by image_policy_check. */
#include "domain/domain.h"
#include "gpurent/image_transport.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int fail(struct op_outcome *o, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(struct op_outcome *o, const char *field, const char *fmt, ...)
{
    o->failed = 1;
    o->error = ERR_INVALID_FIELD;
    snprintf(o->field, sizeof o->field, "%s", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->message, sizeof o->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* A JSON string C sees whole (jansson allows "\u0000"). */
static const char *plain(const json_t *v, size_t *len)
{
    if (!json_is_string(v))
        return NULL;
    *len = json_string_length(v);
    return strlen(json_string_value(v)) == *len ? json_string_value(v) : NULL;
}

int run_command_check(const json_t *cmd, struct op_outcome *o)
{
    if (!cmd)
        return 0;
    if (!json_is_array(cmd) || json_array_size(cmd) > RUN_COMMAND_MAX_WORDS)
        return fail(o, "command", "command must be an array of at most %d strings (the program and its arguments)",
                    RUN_COMMAND_MAX_WORDS);
    size_t total = 0, i;
    json_t *v;
    json_array_foreach((json_t *)(uintptr_t)cmd, i, v)
    {
        size_t len = 0;
        if (!plain(v, &len))
            return fail(o, "command", "command[%zu] must be a string without NUL", i);
        if (len > RUN_WORD_MAX)
            return fail(o, "command", "command[%zu] is over %d bytes", i, RUN_WORD_MAX);
        if (i == 0 && len == 0)
            return fail(o, "command", "command[0], the program, must not be empty");
        total += len;
    }
    if (total > RUN_COMMAND_MAX_BYTES)
        return fail(o, "command", "command is %zu bytes in all, over %d", total, RUN_COMMAND_MAX_BYTES);
    return 0;
}

/* Set by the agent (cards) or the control plane (ranks, rendezvous): a user
 * value would be overridden or, worse, break the job. GPURENT_* is refused
 * as a prefix. */
static const char *const reserved_names[] = {
    "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES",
    NULL,
};

int run_env_name_valid(const char *s, size_t len, const char **why)
{
    *why = "must be 1 to 127 of letters, digits and _, not starting with a digit";
    if (len == 0 || len > RUN_ENV_NAME_MAX || isdigit((unsigned char)s[0]))
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_'))
            return 0;
    *why = "is reserved: the platform sets it";
    if (strncmp(s, "GPURENT_", 8) == 0)
        return 0;
    for (const char *const *r = reserved_names; *r; r++)
        if (strcmp(s, *r) == 0)
            return 0;
    return 1;
}

int run_env_check(const json_t *env, json_t **norm, struct op_outcome *o)
{
    *norm = NULL;
    if (!env)
        return 0;
    if (!json_is_array(env) || json_array_size(env) > RUN_ENV_MAX)
        return fail(o, "env", "env must be an array of at most %d {\"name\", \"value\", \"secret\"} objects",
                    RUN_ENV_MAX);
    json_t *out = json_array();
    size_t i;
    json_t *e;
    json_array_foreach((json_t *)(uintptr_t)env, i, e)
    {
        const char *key;
        json_t *m;
        if (!json_is_object(e)) {
            json_decref(out);
            return fail(o, "env", "env[%zu] must be an object {\"name\", \"value\", \"secret\"}", i);
        }
        json_object_foreach(e, key, m)
        {
            if (strcmp(key, "name") && strcmp(key, "value") && strcmp(key, "secret")) {
                json_decref(out);
                return fail(o, "env", "env[%zu] has an unknown field '%.32s' (name, value, secret)", i, key);
            }
        }
        size_t nlen = 0, vlen = 0;
        const char *name = plain(json_object_get(e, "name"), &nlen), *why = "must be a string";
        if (!name || !run_env_name_valid(name, nlen, &why)) {
            json_decref(out);
            return fail(o, "env", "env[%zu].name %.40s%s%s", i, name ? name : "", name ? " " : " ", why);
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(name, json_string_value(json_object_get(json_array_get(out, j), "name"))) == 0) {
                json_decref(out);
                return fail(o, "env", "env names %.64s twice", name);
            }
        const char *value = plain(json_object_get(e, "value"), &vlen);
        /* Values reach podman/docker as lines of an env file. */
        if (!value || vlen > RUN_ENV_VALUE_MAX || strpbrk(value, "\r\n")) {
            json_decref(out);
            return fail(o, "env", "env[%zu].value must be a string of at most %d bytes without NUL or line breaks", i,
                        RUN_ENV_VALUE_MAX);
        }
        json_t *secret = json_object_get(e, "secret");
        if (secret && !json_is_boolean(secret) && !json_is_null(secret)) {
            json_decref(out);
            return fail(o, "env", "env[%zu].secret must be true or false", i);
        }
        json_array_append_new(out, json_pack("{s:s, s:s, s:b}", "name", name, "value", value, "secret",
                                             json_is_true(secret)));
    }
    *norm = out;
    return 0;
}

int run_working_dir_check(const char *dir, struct op_outcome *o)
{
    if (!dir || !dir[0])
        return 0;
    size_t n = strlen(dir);
    if (dir[0] != '/' || n > RUN_WORKING_DIR_MAX)
        return fail(o, "working_dir", "working_dir must be an absolute path of at most %d bytes",
                    RUN_WORKING_DIR_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)dir[i];
        if (c < 0x20 || c == 0x7f || c == ':' || c == ',')
            return fail(o, "working_dir", "working_dir must not hold control characters, ':' or ','");
        if (c == '/' && i + 1 < n) {
            const char *seg = dir + i + 1;
            size_t len = strcspn(seg, "/");
            if (len == 2 && seg[0] == '.' && seg[1] == '.')
                return fail(o, "working_dir", "working_dir must not hold '..'");
        }
    }
    return 0;
}

json_t *run_env_public(const json_t *env)
{
    json_t *out = json_array();
    size_t i;
    json_t *e;
    json_array_foreach((json_t *)(uintptr_t)env, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name)
            continue;
        if (json_is_true(json_object_get(e, "secret")))
            json_array_append_new(out, json_pack("{s:s, s:b}", "name", name, "secret", 1));
        else
            json_array_append_new(out, json_pack("{s:s, s:s, s:b}", "name", name, "value",
                                                 json_string_value(json_object_get(e, "value")) ?: "", "secret", 0));
    }
    return out;
}

/* ------------------------------------------------------------ image references */

/* A registry host: dot-separated labels of letters, digits and '-', the
 * first and last character of each alphanumeric, then an optional :port. */
static int registry_valid(const char *s, size_t n)
{
    const char *colon = memchr(s, ':', n);
    size_t host = colon ? (size_t)(colon - s) : n;
    if (host == 0 || host > 253)
        return 0;
    size_t label = 0;
    for (size_t i = 0; i < host; i++) {
        char c = s[i];
        if (c == '.') {
            if (label == 0 || s[i - 1] == '-')
                return 0;
            label = 0;
            continue;
        }
        if (!(isalnum((unsigned char)c) || (c == '-' && label > 0)))
            return 0;
        label++;
    }
    if (label == 0 || s[host - 1] == '-')
        return 0;
    if (colon) {
        size_t plen = n - host - 1;
        if (plen == 0 || plen > 5)
            return 0;
        long port = 0;
        for (size_t i = host + 1; i < n; i++) {
            if (!isdigit((unsigned char)s[i]))
                return 0;
            port = port * 10 + (s[i] - '0');
        }
        if (port < 1 || port > 65535)
            return 0;
    }
    return 1;
}

/* A path component: [a-z0-9]+ joined by '.', '_', '__' or runs of '-'. */
static int component_valid(const char *s, size_t n)
{
    if (n == 0 || !(islower((unsigned char)s[0]) || isdigit((unsigned char)s[0])))
        return 0;
    for (size_t i = 0; i < n;) {
        if (islower((unsigned char)s[i]) || isdigit((unsigned char)s[i])) {
            i++;
            continue;
        }
        size_t sep = i;
        if (s[i] == '.')
            i++;
        else if (s[i] == '_')
            i += i + 1 < n && s[i + 1] == '_' ? 2 : 1;
        else if (s[i] == '-')
            while (i < n && s[i] == '-')
                i++;
        else
            return 0;
        if (i == sep || i >= n || !(islower((unsigned char)s[i]) || isdigit((unsigned char)s[i])))
            return 0;
    }
    return 1;
}

int image_ref_parse(const char *ref, char *registry, size_t reglen, const char **why)
{
    size_t n = strlen(ref);
    *why = "is empty or over 255 bytes";
    if (n == 0 || n > 255)
        return -1;
    *why = "starts with the name of a transport podman reads other than a registry (oci-archive:, dir:, ...)";
    if (image_names_transport(ref, n))
        return -1;
    /* @sha256:<64 lowercase hex> ends it, when present. */
    const char *at = strchr(ref, '@');
    size_t name_end = at ? (size_t)(at - ref) : n;
    if (at) {
        const char *d = at + 1;
        *why = "has a digest that is not sha256: and 64 lowercase hex digits";
        if (strncmp(d, "sha256:", 7) != 0 || strlen(d + 7) != 64 || strspn(d + 7, "0123456789abcdef") != 64)
            return -1;
    }
    /* The first component is the registry when it looks like a host:
     * a '.' or a ':' in it, or "localhost" (docker's rule). */
    const char *slash = memchr(ref, '/', name_end);
    size_t first = slash ? (size_t)(slash - ref) : name_end, path_at = 0;
    int has_registry = slash && (memchr(ref, '.', first) || memchr(ref, ':', first) ||
                                 (first == 9 && strncmp(ref, "localhost", 9) == 0));
    if (has_registry) {
        *why = "names a registry that is not host[:port]";
        if (!registry_valid(ref, first))
            return -1;
        path_at = first + 1;
    }
    /* The tag: after the last ':' past the last '/'. */
    const char *last_slash = ref + path_at;
    for (const char *p = ref + path_at; p < ref + name_end; p++)
        if (*p == '/')
            last_slash = p;
    const char *colon = memchr(last_slash, ':', (size_t)(ref + name_end - last_slash));
    size_t path_end = colon ? (size_t)(colon - ref) : name_end;
    if (colon) {
        size_t tlen = name_end - path_end - 1;
        *why = "has a tag that is not 1 to 128 of letters, digits, '_', '.' and '-' (not starting with '.' or '-')";
        if (tlen == 0 || tlen > 128 || colon[1] == '.' || colon[1] == '-')
            return -1;
        for (size_t i = 1; i <= tlen; i++)
            if (!(isalnum((unsigned char)colon[i]) || colon[i] == '_' || colon[i] == '.' || colon[i] == '-'))
                return -1;
    }
    *why = "has a name whose parts are not lowercase letters and digits joined by '.', '_' or '-'";
    if (path_end <= path_at)
        return -1;
    for (size_t i = path_at; i < path_end;) {
        const char *s = memchr(ref + i, '/', path_end - i);
        size_t end = s ? (size_t)(s - ref) : path_end;
        if (!component_valid(ref + i, end - i))
            return -1;
        i = end + 1;
        if (s && i >= path_end)
            return -1; /* a trailing '/' */
    }
    int w = has_registry ? snprintf(registry, reglen, "%.*s", (int)first, ref)
                         : snprintf(registry, reglen, "%s", "docker.io");
    *why = "names a registry that is too long";
    if (w < 0 || (size_t)w >= reglen)
        return -1;
    for (char *p = registry; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    return 0;
}

int image_registry_listed(const char *registry, const char *list)
{
    size_t rlen = strlen(registry);
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t len = strcspn(p, ", ");
        if (len == rlen && strncasecmp(p, registry, len) == 0)
            return 1;
        p += len;
    }
    return 0;
}

int image_registries_valid(const char *list, char *bad, size_t badlen)
{
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t len = strcspn(p, ", ");
        if (len && !registry_valid(p, len)) {
            snprintf(bad, badlen, "%.*s", (int)len, p);
            return 0;
        }
        p += len;
    }
    return 1;
}
