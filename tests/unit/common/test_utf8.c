/* test_utf8.c: unit tests for strict UTF-8 (utf8.c): the sequences it
 * accepts and the ones it refuses (overlong forms, surrogates, past
 * U+10FFFF, cut short), and scrubbing text so that jansson takes it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <string.h>

#include "gpurent/utf8.h"

static void test_sequences_accepted_and_refused(void **state)
{
    (void)state;
    static const struct { const char *bytes; size_t len; } cases[] = {
        {"a", 1},
        {"\xc3\xa9", 2},         /* é */
        {"\xe4\xb8\xad", 3},     /* 中 */
        {"\xf0\x9f\x98\x80", 4}, /* U+1F600 */
        {"\xf4\x8f\xbf\xbf", 4}, /* U+10FFFF, the last */
        {"\xc0\xaf", 0},         /* '/' written long */
        {"\xe0\x80\xaf", 0},     /* the same in three */
        {"\xed\xa0\x80", 0},     /* a surrogate */
        {"\xf4\x90\x80\x80", 0}, /* past U+10FFFF */
        {"\xff", 0},
        {"\x80", 0},             /* a continuation alone */
        {"\xc3", 0},             /* cut short */
        {"\xe4\xb8", 0},
        {"\xc3\x28", 0},         /* not followed by a continuation */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].bytes);
        assert_int_equal(utf8_sequence((const unsigned char *)cases[i].bytes, n), cases[i].len);
        assert_int_equal(utf8_valid(cases[i].bytes, n), cases[i].len == n);
    }
    assert_int_equal(utf8_sequence((const unsigned char *)"", 0), 0);
    assert_true(utf8_valid("", 0));
}

static void test_cut_tail_names_a_character_cut_short(void **state)
{
    (void)state;
    static const struct { const char *bytes; size_t tail; } cases[] = {
        {"ab", 0},
        {"a\xe4\xb8\xad", 0},          /* 中 whole */
        {"a\xe4", 1},                  /* 中 cut after its lead */
        {"a\xe4\xb8", 2},              /* and after one more */
        {"\xf0\x9f\x98", 3},           /* U+1F600 short of one byte */
        {"\xf0\x9f\x98\x80", 0},
        {"\xc3", 1},
        {"\xc3\xa9", 0},
        {"\x80\x80\x80\x80", 0},      /* no lead within reach: nothing to keep whole */
        {"a\xff", 0},                  /* not a lead byte */
        {"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(utf8_cut_tail((const unsigned char *)cases[i].bytes, strlen(cases[i].bytes)),
                         cases[i].tail);
}

static void test_scrub_keeps_valid_text_and_replaces_the_rest(void **state)
{
    (void)state;
    static const struct { const char *in, *out; } cases[] = {
        {"plain ascii", "plain ascii"},
        {"caf\xc3\xa9 \xe4\xb8\xad", "caf\xc3\xa9 \xe4\xb8\xad"},
        {"id \xff\xfe", "id ??"},
        {"ins_\xc0\xaf", "ins_??"},
        {"vol \xed\xa0\x80.", "vol ???."},
        {"cut \xc3\xa9\xc3", "cut \xc3\xa9?"},   /* truncated after a whole é */
        {"cut \xe4\xb8", "cut ??"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", cases[i].in);
        utf8_scrub(buf);
        assert_string_equal(buf, cases[i].out);
        assert_true(utf8_valid(buf, strlen(buf)));
        json_t *s = json_string(buf); /* what the error replies need */
        assert_non_null(s);
        json_decref(s);
    }
}

static void test_chars_counts_code_points_not_bytes(void **state)
{
    (void)state;
    static const struct { const char *bytes; size_t chars; } cases[] = {
        {"", 0},
        {"password", 8},
        {"caf\xc3\xa9", 4},                       /* é is two bytes */
        {"\xe4\xb8\xad\xe6\x96\x87", 2},              /* two CJK characters, three bytes each */
        {"\xf0\x9d\x95\x8f\xf0\x9d\x95\x8f", 2},     /* two astral characters, four bytes each */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(utf8_chars(cases[i].bytes, strlen(cases[i].bytes)), cases[i].chars);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequences_accepted_and_refused),
        cmocka_unit_test(test_scrub_keeps_valid_text_and_replaces_the_rest),
        cmocka_unit_test(test_cut_tail_names_a_character_cut_short),
        cmocka_unit_test(test_chars_counts_code_points_not_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
