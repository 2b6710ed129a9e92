/* csv.c: CSV fields (see csv.h). */
#include "gpurent/csv.h"

#include <string.h>

/* Whether v is a plain decimal number: a sign, digits, at most one point. */
static int is_number(const char *v)
{
    const char *p = v + (*v == '-' || *v == '+');
    int digits = 0, points = 0;
    for (; *p; p++) {
        if (*p >= '0' && *p <= '9')
            digits++;
        else if (*p == '.' && !points++)
            continue;
        else
            return 0;
    }
    return digits > 0;
}

void csv_field(FILE *f, const char *v)
{
    int formula = v[0] && strchr("=+-@\t\r", v[0]) && !is_number(v);
    if (!formula && !strpbrk(v, ",\"\r\n")) {
        fputs(v, f);
        return;
    }
    fputc('"', f);
    if (formula)
        fputc('\'', f);
    for (const char *p = v; *p; p++) {
        if (*p == '"')
            fputc('"', f);
        fputc(*p, f);
    }
    fputc('"', f);
}
