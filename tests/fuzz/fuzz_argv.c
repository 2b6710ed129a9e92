/* fuzz_argv.c: fuzz target for the agent's command templates (argv.c):
 * mount_command and umount_command from its configuration, filled with a
 * volume's source and target from a renter's spec. Input: the template, a
 * NUL, the source, a NUL, the target. Whatever the values hold (blanks,
 * braces, placeholders' names), a template gives one argument per word,
 * the program word as written; a template the configuration check accepts
 * always expands; a refusal says why. */
#include "agent.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The template's words, as argv.c splits them: on spaces and tabs. */
static int count_words(const char *t, size_t *first_len)
{
    int n = 0;
    *first_len = 0;
    for (const char *p = t; *p;) {
        p += strspn(p, " \t");
        if (!*p)
            break;
        size_t len = strcspn(p, " \t");
        if (n == 0)
            *first_len = len;
        n++;
        p += len;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Three C strings; a missing one is empty. */
    char *copy = malloc(size + 3);
    if (!copy)
        abort();
    memcpy(copy, data, size);
    copy[size] = copy[size + 1] = copy[size + 2] = '\0';
    const char *tmpl = copy, *source = tmpl + strlen(tmpl) + 1;
    const char *target = source + strlen(source) + 1;

    size_t first_len;
    int words = count_words(tmpl, &first_len);
    const char *first = tmpl + strspn(tmpl, " \t");
    for (int want_source = 0; want_source <= 1; want_source++) {
        char err[256] = "";
        int accepted = argv_template_check(tmpl, want_source, err, sizeof err) == 0;
        if (!accepted && !err[0])
            abort(); /* a refusal without a reason */
        struct argv_buf *a = calloc(1, sizeof *a);
        if (!a)
            abort();
        int rc = argv_from_template_sized(a, tmpl, source, target, want_source ? "7" : NULL);
        if (accepted && rc != 0)
            abort(); /* checked at start, failing at a mount */
        if (rc == 0) {
            if (a->n != words || a->v[a->n] != NULL)
                abort(); /* a value split a word or joined two */
            if (accepted && (strlen(a->v[0]) != first_len || memcmp(a->v[0], first, first_len) != 0))
                abort(); /* the program is the template's first word */
        }
        argv_free(a);
        free(a);
    }
    free(copy);
    return 0;
}
