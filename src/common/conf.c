/* conf.c: the configuration table engine described in conf.h. */
#include "gpurent/conf.h"
#include "gpurent/log.h"

#include <arpa/inet.h>
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
    int *set_on;    /* per option of table, the line that set it, or 0 */
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
    /* A key written twice is refused rather than the last one winning: an
     * operator who appends "listen = ..." to the shipped file, or merges
     * two versions of it, would otherwise run with whichever line came
     * last without a word, and -n would call the file OK. */
    const struct conf_option *o = conf_find(ctx->table, name);
    int *first = o ? &ctx->set_on[o - ctx->table] : NULL;
    if (first && *first) {
        snprintf(ctx->msg, sizeof ctx->msg, "'%s' is set twice (first on line %d); keep one of the two lines", name,
                 *first);
        ctx->bad_line = ctx->line;
        return 0;
    }
    if (conf_set(ctx->table, ctx->conf, name, value, ctx->msg, sizeof ctx->msg) == 0) {
        if (first)
            *first = ctx->line;
        return 1;
    }
    ctx->bad_line = ctx->line;
    return 0;
}

int conf_load_file(const struct conf_option *table, void *conf, const char *path, char *err, size_t errlen)
{
    struct file_ctx ctx = {.table = table, .conf = conf};
    size_t options = 0;
    while (table[options].name)
        options++;
    ctx.set_on = calloc(options + 1, sizeof *ctx.set_on);
    if (!ctx.set_on) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(ENOMEM));
        return -1;
    }
    ctx.f = fopen(path, "r");
    if (!ctx.f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        free(ctx.set_on);
        return -1;
    }
    /* inih reports its first bad line (a syntax error, or the handler's);
     * ours may come later, when inih went on past a syntax error. */
    int line = ini_parse_stream(file_read_line, &ctx, on_ini_line, &ctx);
    fclose(ctx.f);
    free(ctx.buf);
    free(ctx.set_on);
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
    /* The servers bind numeric addresses only (no name is looked up at
     * start): a name is refused here, where `-n` sees it. */
    unsigned char addr[16];
    if (inet_pton(AF_INET, host, addr) != 1 && inet_pton(AF_INET6, host, addr) != 1) {
        snprintf(err, errlen, "listen: '%s': the host must be a numeric address such as 127.0.0.1, 0.0.0.0 or [::1]",
                 (const char *)field);
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

/* Calls check on each word of a list separated by spaces or commas (the
 * separators of http.c's list_contains, so the words checked here are the
 * words matched there), stopping at the first refusal. */
static int check_words(const char *name, const char *list,
                       int (*check)(const char *name, const char *w, size_t n, char *err, size_t errlen),
                       char *err, size_t errlen)
{
    for (const char *p = list; *p;) {
        p += strspn(p, " ,");
        size_t n = strcspn(p, " ,");
        if (n > 0 && check(name, p, n, err, errlen) < 0)
            return -1;
        p += n;
    }
    return 0;
}

/* Whether the n bytes at w are an address of family af: 1 if written exactly
 * as inet_ntop writes it, 0 if an address written otherwise (canon then holds
 * inet_ntop's form), -1 if not an address of that family. */
static int address_form(int af, const char *w, size_t n, char *canon, size_t canonlen)
{
    char buf[INET6_ADDRSTRLEN];
    unsigned char bin[sizeof(struct in6_addr)];
    if (n >= sizeof buf)
        return -1;
    memcpy(buf, w, n);
    buf[n] = '\0';
    if (inet_pton(af, buf, bin) != 1 || !inet_ntop(af, bin, canon, (socklen_t)canonlen))
        return -1;
    return strcmp(buf, canon) == 0;
}

static int check_address(const char *name, const char *w, size_t n, char *err, size_t errlen)
{
    char canon[INET6_ADDRSTRLEN];
    int form = address_form(AF_INET, w, n, canon, sizeof canon);
    if (form < 0)
        form = address_form(AF_INET6, w, n, canon, sizeof canon);
    if (form == 1)
        return 0;
    /* http.c compares the peer's address as inet_ntop wrote it, as text. */
    if (form == 0)
        snprintf(err, errlen, "%s: '%.*s' would never match a client; write it as '%s'", name, (int)n, w, canon);
    else if (memchr(w, '/', n))
        snprintf(err, errlen, "%s: '%.*s' is a range; ranges (CIDR) are not supported, list each proxy's address",
                 name, (int)n, w);
    else
        snprintf(err, errlen, "%s: '%.*s' is not an IP address (list each proxy's IPv4 or IPv6 address; no host names)",
                 name, (int)n, w);
    return -1;
}

int conf_check_address_list(const char *name, const char *list, char *err, size_t errlen)
{
    return check_words(name, list, check_address, err, errlen);
}

/* A host name as browsers put it in an origin: lower-case letters, digits,
 * '-', '_' and dots between non-empty labels; all digits and dots must be an
 * IPv4 address in its usual form. */
static int origin_host_ok(const char *h, size_t n)
{
    if (n == 0 || n > 253 || h[0] == '.' || h[n - 1] == '.')
        return 0;
    int numeric = 1;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (c == '.' && h[i + 1] == '.')
            return 0;
        if (c != '.' && (c < '0' || c > '9'))
            numeric = 0;
    }
    char canon[INET6_ADDRSTRLEN];
    return !numeric || address_form(AF_INET, h, n, canon, sizeof canon) == 1;
}

/* Checks the n bytes at w as an origin; messages quote the whole word (qn
 * bytes at w), which is longer than n when the path after w is cut off. */
static int check_origin_part(const char *name, const char *w, size_t n, size_t qn, char *err, size_t errlen)
{
    if (n == 1 && w[0] == '*')
        return 0;
    const char *end = w + n;
    /* http.c compares the browser's Origin header as text, and browsers send
     * it in lower case: an upper-case letter could never match. */
    for (const char *q = w; q < end; q++)
        if (*q >= 'A' && *q <= 'Z') {
            snprintf(err, errlen, "%s: '%.*s' has upper-case letters; browsers send origins in lower case", name,
                     (int)qn, w);
            return -1;
        }
    int https;
    const char *p;
    if (n > 7 && strncmp(w, "http://", 7) == 0) {
        https = 0;
        p = w + 7;
    } else if (n > 8 && strncmp(w, "https://", 8) == 0) {
        https = 1;
        p = w + 8;
    } else {
        goto bad;
    }
    const char *slash = memchr(p, '/', (size_t)(end - p));
    if (slash) {
        /* Report what is wrong before the path first, if anything is. */
        if (check_origin_part(name, w, (size_t)(slash - w), qn, err, errlen) < 0)
            return -1;
        snprintf(err, errlen, "%s: '%.*s' has a path or a trailing slash; an origin is scheme://host[:port] alone: '%.*s'",
                 name, (int)qn, w, (int)(slash - w), w);
        return -1;
    }
    if (*p == '[') {
        const char *close = memchr(p, ']', (size_t)(end - p));
        char canon[INET6_ADDRSTRLEN];
        int form = close ? address_form(AF_INET6, p + 1, (size_t)(close - p - 1), canon, sizeof canon) : -1;
        if (form < 0)
            goto bad;
        if (form == 0) {
            snprintf(err, errlen, "%s: '%.*s' would never match; browsers send the address as [%s]", name, (int)qn, w,
                     canon);
            return -1;
        }
        p = close + 1;
    } else {
        /* The separators and NUL are outside the set, so the span stays
         * within the word. */
        size_t h = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789-_.");
        if (!origin_host_ok(p, h))
            goto bad;
        p += h;
    }
    if (p < end && *p == ':') {
        size_t d = strspn(p + 1, "0123456789");
        long port = d >= 1 && d <= 5 && p[1] != '0' ? strtol(p + 1, NULL, 10) : 0;
        if (port < 1 || port > 65535) {
            snprintf(err, errlen, "%s: '%.*s' has a bad port (1 to 65535, no leading zeros)", name, (int)qn, w);
            return -1;
        }
        if (port == (https ? 443 : 80)) {
            snprintf(err, errlen, "%s: '%.*s' names the default port, which browsers leave out: '%.*s'", name, (int)qn,
                     w, (int)(p - w), w);
            return -1;
        }
        p += 1 + d;
    }
    if (p == end)
        return 0;
bad:
    snprintf(err, errlen,
             "%s: '%.*s' is not an origin: scheme://host[:port] with scheme http or https, e.g. https://console.example.com",
             name, (int)qn, w);
    return -1;
}

static int check_origin(const char *name, const char *w, size_t n, char *err, size_t errlen)
{
    return check_origin_part(name, w, n, n, err, errlen);
}

int conf_check_origin_list(const char *name, const char *list, char *err, size_t errlen)
{
    return check_words(name, list, check_origin, err, errlen);
}
