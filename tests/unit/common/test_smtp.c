/* test_smtp.c: the message the mailer uploads (smtp_message): its headers,
 * and a body whose every line ends CRLF however it ended, a lone CR
 * included, so that nothing in it can end the message early at a relay. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "gpurent/smtp.h"

/* The body: what follows the blank line that ends the headers. */
static const char *body_of(const char *msg)
{
    const char *b = strstr(msg, "\r\n\r\n");
    assert_non_null(b);
    return b + 4;
}

static void test_headers_then_a_crlf_body(void **state)
{
    (void)state;
    size_t len;
    char *m = smtp_message("noreply@gpurent.test", "ada@example.com", "Hello", "one\ntwo\r\nthree\n", &len);
    assert_non_null(m);
    assert_int_equal(len, strlen(m));
    assert_non_null(strstr(m, "\r\nFrom: <noreply@gpurent.test>\r\nTo: <ada@example.com>\r\nSubject: Hello\r\n"));
    assert_string_equal(body_of(m), "one\r\ntwo\r\nthree\r\n");
    free(m);
}

static void test_a_lone_cr_or_lf_beside_a_dot_ends_no_message(void **state)
{
    (void)state;
    size_t len;
    char *m = smtp_message("a@b.test", "c@d.test", "s", "x\r.\ry\n.\nz\r", &len);
    assert_non_null(m);
    const char *b = body_of(m);
    assert_string_equal(b, "x\r\n.\r\ny\r\n.\r\nz\r\n");
    for (const char *p = b; *p; p++)
        if (*p == '\r')
            assert_int_equal(p[1], '\n');
        else if (*p == '\n')
            assert_int_equal(p[-1], '\r');
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headers_then_a_crlf_body),
        cmocka_unit_test(test_a_lone_cr_or_lf_beside_a_dot_ends_no_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
