/* test_throttle.c: the network a client address counts against for the
 * sign-up and password reset limits (throttle_network): an IPv4 address
 * or its /24, an IPv4-mapped IPv6 address as its IPv4 form, and any other
 * IPv6 address as its /64, so one host cannot spread its requests over the
 * addresses it is given. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "http/api.h"

static const char *net(const char *ip, int v4_bits)
{
    static char out[80];
    throttle_network(ip, v4_bits, out, sizeof out);
    return out;
}

static void test_ipv4_is_the_address_or_its_slash_24(void **state)
{
    (void)state;
    assert_string_equal(net("203.0.113.77", 32), "203.0.113.77");
    assert_string_equal(net("203.0.113.77", 24), "203.0.113.0/24");
    assert_string_equal(net("::ffff:203.0.113.77", 32), "203.0.113.77");
    assert_string_equal(net("::ffff:203.0.113.77", 24), "203.0.113.0/24");
}

static void test_ipv6_is_its_slash_64_whatever_the_prefix_asked(void **state)
{
    (void)state;
    assert_string_equal(net("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 32), "2001:db8:1:2::/64");
    assert_string_equal(net("2001:db8:1:2::9", 24), "2001:db8:1:2::/64");
    assert_string_equal(net("::1", 32), "::/64");
}

static void test_anything_else_is_kept_as_it_is(void **state)
{
    (void)state;
    assert_string_equal(net("unix", 32), "unix");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipv4_is_the_address_or_its_slash_24),
        cmocka_unit_test(test_ipv6_is_its_slash_64_whatever_the_prefix_asked),
        cmocka_unit_test(test_anything_else_is_kept_as_it_is),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
