/* test_notices.c: the list of stopped instances a funds notice names
 * (notices.c): one line each, "  id (name)" or "  id", the first 50 listed
 * and the rest only counted, a label's control characters as '?', and a
 * line never longer than its buffer whatever the name's length. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "domain/domain.h"

static void test_lines_with_and_without_a_name(void **state)
{
    (void)state;
    struct notice_stopped n;
    notice_stopped_init(&n);
    assert_int_equal(notice_stopped_add(&n, "ins_a", "train"), 0);
    assert_int_equal(notice_stopped_add(&n, "ins_b", ""), 0);
    assert_string_equal(n.lines, "  ins_a (train)\n  ins_b\n");
    assert_int_equal(n.len, strlen(n.lines));
    assert_int_equal(n.count, 2);
    notice_stopped_free(&n);
    assert_null(n.lines);
    assert_int_equal(n.count, 0);
}

static void test_only_the_first_fifty_are_listed(void **state)
{
    (void)state;
    struct notice_stopped n;
    notice_stopped_init(&n);
    char id[32];
    for (int i = 0; i < 60; i++) {
        snprintf(id, sizeof id, "ins_%02d", i);
        assert_int_equal(notice_stopped_add(&n, id, "x"), 0);
    }
    assert_int_equal(n.count, 60);
    assert_int_equal(n.len, strlen(n.lines));
    assert_int_equal(n.len, 50 * strlen("  ins_00 (x)\n"));
    assert_non_null(strstr(n.lines, "  ins_49 (x)\n"));
    assert_null(strstr(n.lines, "ins_50"));
    notice_stopped_free(&n);
}

static void test_a_label_forges_no_line(void **state)
{
    (void)state;
    struct notice_stopped n;
    notice_stopped_init(&n);
    assert_int_equal(notice_stopped_add(&n, "ins_a", "a\r\n.\r\nQUIT\x7f\tb"), 0);
    assert_string_equal(n.lines, "  ins_a (a??.??QUIT??b)\n");
    notice_stopped_free(&n);
}

/* A name or id longer than any the API takes now is clipped, not copied
 * past the line's buffer: the length kept is the length written. */
static void test_a_long_name_is_clipped(void **state)
{
    (void)state;
    char name[300], id[100];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    memset(id, 'i', sizeof id - 1);
    id[sizeof id - 1] = '\0';
    struct notice_stopped n;
    notice_stopped_init(&n);
    assert_int_equal(notice_stopped_add(&n, id, name), 0);
    assert_int_equal(notice_stopped_add(&n, "ins_c", "after"), 0);
    assert_int_equal(n.len, strlen(n.lines));
    const char *second = strstr(n.lines, ")\n  ins_c (after)\n");
    assert_non_null(second);
    assert_true(n.len < 200);
    notice_stopped_free(&n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_with_and_without_a_name),
        cmocka_unit_test(test_only_the_first_fifty_are_listed),
        cmocka_unit_test(test_a_label_forges_no_line),
        cmocka_unit_test(test_a_long_name_is_clipped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
