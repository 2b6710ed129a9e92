/* conf.c: the configuration table engine described in conf.h. */
#include "conf.h"
#include "log.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct conf_option *conf_find(const struct conf_option *table, const char *name)
{
    for (const struct conf_option *o = table; o->name; o++)
        if (strcmp(o->name, name) == 0)
            return o;
    return NULL;
}

/* Strict integer: optional '-', digits only, no overflow. */
static int parse_int64(const char *s, int64_t *out)
{
    const char *p = s;
    if (*p == '-')
        p++;
    if (*p < '0' || *p > '9')
        return -1;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) { *out = 1; return 0; }
        if (strcasecmp(s, no[i]) == 0) { *out = 0; return 0; }
    }
    return -1;
}

static int conf_apply(const struct conf_option *o, void *conf, const char *value, char *err, size_t errlen)
{
    char *field = (char *)conf + o->offset;
    switch (o->type) {
    case CONF_INT: {
        int64_t v;
        if (parse_int64(value, &v) < 0) {
            snprintf(err, errlen, "%s: '%s' is not an integer", o->name, value);
            return -1;
        }
        if (v < o->min || v > o->max) {
            snprintf(err, errlen, "%s: %" PRId64 " is outside %" PRId64 "..%" PRId64, o->name, v, o->min, o->max);
            return -1;
        }
        int64_t old;
        memcpy(&old, field, sizeof old);
        memcpy(field, &v, sizeof v);
        if (o->validate && o->validate(field, err, errlen) < 0) {
            memcpy(field, &old, sizeof old);
            return -1;
        }
        return 0;
    }
    case CONF_BOOL: {
        int v;
        if (parse_bool(value, &v) < 0) {
            snprintf(err, errlen, "%s: '%s' is not true or false", o->name, value);
            return -1;
        }
        int old;
        memcpy(&old, field, sizeof old);
        memcpy(field, &v, sizeof v);
        if (o->validate && o->validate(field, err, errlen) < 0) {
            memcpy(field, &old, sizeof old);
            return -1;
        }
        return 0;
    }
    case CONF_STRING: {
        size_t n = strlen(value);
        if (n >= o->size) {
            snprintf(err, errlen, "%s: value longer than %zu bytes", o->name, o->size - 1);
            return -1;
        }
        char *saved = malloc(o->size);
        if (!saved) {
            snprintf(err, errlen, "%s: out of memory", o->name);
            return -1;
        }
        memcpy(saved, field, o->size);
        memcpy(field, value, n + 1);
        int rc = 0;
        if (o->validate && o->validate(field, err, errlen) < 0) {
            memcpy(field, saved, o->size);
            rc = -1;
        }
        free(saved);
        return rc;
    }
    }
    snprintf(err, errlen, "%s: unknown option type", o->name);
    return -1;
}

int conf_set_defaults(const struct conf_option *table, void *conf, char *err, size_t errlen)
{
    for (const struct conf_option *o = table; o->name; o++)
        if (conf_apply(o, conf, o->def, err, errlen) < 0)
            return -1;
    return 0;
}

int conf_set(const struct conf_option *table, void *conf, const char *name, const char *value,
             char *err, size_t errlen)
{
    const struct conf_option *o = conf_find(table, name);
    if (!o) {
        snprintf(err, errlen, "unknown option '%s'", name);
        return -1;
    }
    return conf_apply(o, conf, value, err, errlen);
}

struct file_ctx {
    const struct conf_option *table;
    void *conf;
    FILE *f;        /* the file being read */
    char *buf;      /* getline's buffer for the current line */
    size_t cap;     /* its size */
    int line;       /* lines read so far */
    int bad_line;   /* first line refused by the reader or the handler, or 0 */
    int read_errno; /* set if reading the file failed */
    char msg[512];  /* reason for bad_line */
};

/* inih's line reader, making the checks inih does not: a line too long for
 * inih's buffer would be split in two, an indented line would be handed on
 * as a second value for the key above (replacing its value), and a [section]
 * with no key after it would pass unnoticed. Such lines are refused here,
 * and reading stops at the first refused line so its reason is the one
 * reported. */
static char *file_read_line(char *str, int num, void *stream)
{
    struct file_ctx *ctx = stream;
    if (ctx->bad_line)
        return NULL;
    ssize_t n = getline(&ctx->buf, &ctx->cap, ctx->f);
    if (n < 0) {
        if (ferror(ctx->f))
            ctx->read_errno = errno ? errno : EIO;
        return NULL;
    }
    ctx->line++;
    const char *s = ctx->buf;
    if (ctx->line == 1 && strncmp(s, "\xEF\xBB\xBF", 3) == 0)
        s += 3;
    size_t blank = strspn(s, " \t\r\n\v\f");
    const char *t = s + blank;
    int comment = !*t || *t == '#' || *t == ';';
    if (strlen(ctx->buf) != (size_t)n)
        snprintf(ctx->msg, sizeof ctx->msg, "line contains a NUL byte");
    else if ((size_t)n >= (size_t)num && !comment)
        snprintf(ctx->msg, sizeof ctx->msg, "line is longer than %d bytes", num - 2);
    else if (blank && !comment)
        snprintf(ctx->msg, sizeof ctx->msg,
                 "line starts with a blank; start every key at the beginning of its line (values do not continue onto the next line)");
    else if (*t == '[')
        snprintf(ctx->msg, sizeof ctx->msg, "sections are not used (%.*s); write plain key = value lines",
                 (int)strcspn(t, "\r\n"), t);
    else {
        snprintf(str, (size_t)num, "%s", comment ? "\n" : ctx->buf);
        return str;
    }
    ctx->bad_line = ctx->line;
    return NULL;
}

static int on_ini_line(void *user, const char *section, const char *name, const char *value)
{
    struct file_ctx *ctx = user;
    if (conf_set(ctx->table, ctx->conf, name, value, ctx->msg, sizeof ctx->msg) == 0)
        return 1;
    ctx->bad_line = ctx->line;
    return 0;
}

int conf_load_file(const struct conf_option *table, void *conf, const char *path, char *err, size_t errlen)
{
    struct file_ctx ctx = {.table = table, .conf = conf};
    ctx.f = fopen(path, "r");
    if (!ctx.f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    /* inih reports its first bad line (a syntax error, or the handler's);
     * ours may come later, when inih went on past a syntax error. */
    int line = ini_parse_stream(file_read_line, &ctx, on_ini_line, &ctx);
    fclose(ctx.f);
    free(ctx.buf);
    if (line < 0 || ctx.read_errno) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(ctx.read_errno ? ctx.read_errno : ENOMEM));
        return -1;
    }
    if (line > 0 && (!ctx.bad_line || line < ctx.bad_line)) {
        snprintf(err, errlen, "%s:%d: syntax error (expected key = value)", path, line);
        return -1;
    }
    if (ctx.bad_line) {
        snprintf(err, errlen, "%s:%d: %s", path, ctx.bad_line, ctx.msg);
        return -1;
    }
    return 0;
}

int conf_set_override(const struct conf_option *table, void *conf, const char *assignment, char *err,
                      size_t errlen)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        snprintf(err, errlen, "'%s': expected KEY=VALUE", assignment);
        return -1;
    }
    char name[128];
    size_t n = (size_t)(eq - assignment);
    if (n >= sizeof name) {
        snprintf(err, errlen, "'%s': option name too long", assignment);
        return -1;
    }
    memcpy(name, assignment, n);
    name[n] = '\0';
    return conf_set(table, conf, name, eq + 1, err, errlen);
}

void conf_print_help(const struct conf_option *table, void *stream)
{
    for (const struct conf_option *o = table; o->name; o++) {
        if (o->type == CONF_INT)
            fprintf(stream, "  %-28s %s (default %s, %" PRId64 "..%" PRId64 ")\n", o->name, o->help, o->def, o->min, o->max);
        else
            fprintf(stream, "  %-28s %s (default \"%s\")\n", o->name, o->help, o->def);
    }
}

int conf_parse_hostport(const char *s, char *host, size_t hostlen, int *port)
{
    const char *colon;
    const char *h = s;
    size_t hlen;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return -1;
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        /* An IPv6 address needs its brackets: "::1:8080" is ambiguous. */
        colon = strchr(s, ':');
        if (!colon || strchr(colon + 1, ':'))
            return -1;
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0 || hlen >= hostlen)
        return -1;
    int64_t p;
    if (colon[1] == '-' || parse_int64(colon + 1, &p) < 0 || p > 65535)
        return -1;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (int)p;
    return 0;
}

int conf_validate_listen(const void *field, char *err, size_t errlen)
{
    char host[128];
    int port;
    if (conf_parse_hostport(field, host, sizeof host, &port) < 0) {
        snprintf(err, errlen, "listen: '%s' is not HOST:PORT (e.g. 127.0.0.1:8080 or [::1]:8080)", (const char *)field);
        return -1;
    }
    return 0;
}

int conf_validate_log_level(const void *field, char *err, size_t errlen)
{
    enum log_level l;
    if (log_level_parse(field, &l) < 0) {
        snprintf(err, errlen, "log_level: '%s' is not error, warn, info or debug", (const char *)field);
        return -1;
    }
    return 0;
}
