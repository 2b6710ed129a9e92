/* argv.c: argument vectors for the commands the agent runs. Commands are
 * never given to a shell: each word is one argv entry, and templates are
 * split on spaces before anything is substituted, so a value can never
 * become two words or an operator. */
#include "agent.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void argv_add(struct argv_buf *a, const char *word)
{
    if (a->overflow)
        return;
    if (a->n >= ARGV_MAX || !(a->v[a->n] = strdup(word))) {
        a->overflow = 1;
        return;
    }
    a->v[++a->n] = NULL;
}

void argv_addf(struct argv_buf *a, const char *fmt, ...)
{
    char *s = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) {
        a->overflow = 1;
        return;
    }
    argv_add(a, s);
    free(s);
}

void argv_free(struct argv_buf *a)
{
    if (!a)
        return;
    for (int i = 0; i < a->n; i++)
        free(a->v[i]);
    memset(a, 0, sizeof *a);
}

void argv_join(const struct argv_buf *a, char *out, size_t outlen)
{
    size_t used = 0;
    if (outlen == 0)
        return;
    out[0] = '\0';
    for (int i = 0; i < a->n && used + 1 < outlen; i++) {
        int n = snprintf(out + used, outlen - used, "%s%s", i ? " " : "", a->v[i]);
        if (n < 0)
            break;
        used += (size_t)n < outlen - used ? (size_t)n : outlen - used - 1;
    }
}

/* A placeholder and its value; a NULL value makes a template that names
 * it fail to expand. */
struct placeholder {
    const char *name;
    size_t len;
    const char *value;
};

/* Appends one template word with its placeholders replaced. */
static int expand_word(struct argv_buf *a, const char *w, size_t wlen, const struct placeholder *ph, size_t nph)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < wlen;) {
        if (w[i] != '{') {
            fputc(w[i++], f);
            continue;
        }
        const struct placeholder *hit = NULL;
        for (size_t k = 0; k < nph && !hit; k++)
            if (wlen - i >= ph[k].len && strncmp(w + i, ph[k].name, ph[k].len) == 0)
                hit = &ph[k];
        if (!hit || !hit->value) {
            rc = -1;
            break;
        }
        fputs(hit->value, f);
        i += hit->len;
    }
    if (fclose(f) != 0)
        rc = -1;
    if (rc == 0)
        argv_add(a, buf);
    free(buf);
    return rc;
}

int argv_from_template_sized(struct argv_buf *a, const char *tmpl, const char *source, const char *target,
                             const char *size_gb)
{
    const struct placeholder ph[] = {
        {"{source}", 8, source},
        {"{target}", 8, target},
        {"{size_gb}", 9, size_gb},
    };
    int words = 0;
    for (const char *p = tmpl; *p;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        size_t n = strcspn(p, " \t");
        if (expand_word(a, p, n, ph, sizeof ph / sizeof ph[0]) < 0)
            return -1;
        words++;
        p += n;
    }
    return words > 0 && !a->overflow ? 0 : -1;
}

int argv_from_template(struct argv_buf *a, const char *tmpl, const char *source, const char *target)
{
    return argv_from_template_sized(a, tmpl, source, target, NULL);
}

int argv_template_uses_size(const char *tmpl)
{
    return strstr(tmpl, "{size_gb}") != NULL;
}

int argv_template_check(const char *tmpl, int want_source, char *err, size_t errlen)
{
    struct argv_buf a = {0};
    int rc = -1;
    size_t first = strcspn(tmpl + strspn(tmpl, " \t"), " \t");
    /* Only a mount knows a volume, so only mount_command may ask for its size. */
    if (argv_from_template_sized(&a, tmpl, "S", "T", want_source ? "1" : NULL) < 0) {
        snprintf(err, errlen, "'%s': a command template needs words, and only %s placeholders", tmpl,
                 want_source ? "{source}, {target} and {size_gb}" : "{target}");
    } else if (memchr(tmpl + strspn(tmpl, " \t"), '{', first)) {
        snprintf(err, errlen, "'%s': the program (first word) cannot be a placeholder", tmpl);
    } else if (!strstr(tmpl, "{target}")) {
        snprintf(err, errlen, "'%s': the template must use {target}", tmpl);
    } else if (want_source && !strstr(tmpl, "{source}")) {
        snprintf(err, errlen, "'%s': the template must use {source}", tmpl);
    } else if (!want_source && strstr(tmpl, "{source}")) {
        snprintf(err, errlen, "'%s': only {target} is known here", tmpl);
    } else {
        rc = 0;
    }
    argv_free(&a);
    return rc;
}
