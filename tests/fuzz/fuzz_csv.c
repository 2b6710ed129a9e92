/* fuzz_csv.c: fuzz target for CSV fields (csv_field), which carry names,
 * reasons and payment ids users chose into statements: read back as RFC
 * 4180 reads a field, the text is the value, or the value after a single
 * quote when a spreadsheet would take it for a formula; and a cell never
 * starts with a formula character unless it is a plain number. */
#include "gpurent/csv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A plain decimal number, as a spreadsheet shows one: a sign, digits and at
 * most one point. */
static int plain_number(const char *v)
{
    const char *p = v + (*v == '-' || *v == '+');
    size_t digits = strspn(p, "0123456789.");
    const char *point = strchr(p, '.');
    return p[digits] == '\0' && digits > (point ? 1u : 0u) && (!point || !strchr(point + 1, '.'));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *v = malloc(size + 1);
    if (!v)
        return 0;
    memcpy(v, data, size);
    v[size] = '\0';

    char *out = NULL;
    size_t out_len = 0;
    FILE *f = open_memstream(&out, &out_len);
    if (!f)
        abort();
    csv_field(f, v);
    fclose(f);

    /* RFC 4180: a quoted field's quotes are doubled; an unquoted one holds
     * no comma, quote or line break. */
    char *cell = malloc(out_len + 1);
    size_t n = 0;
    if (!cell)
        abort();
    if (out_len > 0 && out[0] == '"') {
        if (out_len < 2 || out[out_len - 1] != '"')
            abort();
        for (size_t i = 1; i < out_len - 1; i++) {
            if (out[i] == '"' && (i + 1 >= out_len - 1 || out[++i] != '"'))
                abort(); /* a lone quote inside */
            cell[n++] = out[i];
        }
    } else {
        if (strpbrk(out, ",\"\r\n"))
            abort();
        memcpy(cell, out, out_len);
        n = out_len;
    }
    cell[n] = '\0';
    int formula = v[0] && strchr("=+-@\t\r", v[0]) && !plain_number(v);
    if (formula ? (cell[0] != '\'' || strcmp(cell + 1, v) != 0) : strcmp(cell, v) != 0)
        abort();
    if (cell[0] && strchr("=+-@\t\r", cell[0]) && !plain_number(cell))
        abort();
    free(cell);
    free(out);
    free(v);
    return 0;
}
