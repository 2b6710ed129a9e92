/* test_csv.c: unit tests for CSV fields (csv.c): plain text as it is,
 * separators, quotes and line breaks quoted (RFC 4180), numbers of either
 * sign as they are, and text a spreadsheet would run as a formula shown
 * after a single quote. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpurent/csv.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void test_fields(void **state)
{
    (void)state;
    static const struct { const char *in, *out; } cases[] = {
        {"", ""},
        {"plain text", "plain text"},
        {"9.60", "9.60"},
        {"-1.20", "-1.20"},
        {"+3", "+3"},
        {"2027-01-15", "2027-01-15"},
        {"a,b", "\"a,b\""},
        {"say \"hi\"", "\"say \"\"hi\"\"\""},
        {"two\nlines", "\"two\nlines\""},
        {"=1+2", "\"'=1+2\""},
        {"=HYPERLINK(\"http://x\")", "\"'=HYPERLINK(\"\"http://x\"\")\""},
        {"+cmd", "\"'+cmd\""},
        {"-2+3", "\"'-2+3\""},
        {"@SUM(A1)", "\"'@SUM(A1)\""},
        {"\tx", "\"'\tx\""},
        {"a=b", "a=b"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        assert_non_null(f);
        csv_field(f, cases[i].in);
        fclose(f);
        if (strcmp(buf, cases[i].out) != 0)
            fail_msg("csv_field(%s): got %s, want %s", cases[i].in, buf, cases[i].out);
        free(buf);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
