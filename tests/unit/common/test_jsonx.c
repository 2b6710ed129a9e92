/* test_jsonx.c: unit tests for RFC 3339 times and pagination cursors
 * (jsonx.c): known times, null for unset times, cursor round trips and known
 * encodings, and cursors that are not ones we made, built from raw text with
 * an encoder written here independently of jsonx.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "gpurent/jsonx.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void test_time_known(void **state)
{
    (void)state;
    /* Expected values from date -u -d @T +%Y-%m-%dT%H:%M:%SZ. */
    static const struct { int64_t t; const char *s; } cases[] = {
        {0, "1970-01-01T00:00:00Z"},
        {1, "1970-01-01T00:00:01Z"},
        {-1, "1969-12-31T23:59:59Z"},
        {951782400, "2000-02-29T00:00:00Z"},
        {1700000000, "2023-11-14T22:13:20Z"},
        {1795977117, "2026-11-29T18:31:57Z"},
        {4102444800, "2100-01-01T00:00:00Z"},
        {253402300799, "9999-12-31T23:59:59Z"},
        /* Years of fewer digits still have four (RFC 3339's date-fullyear). */
        {-30610224000, "1000-01-01T00:00:00Z"},
        {-30641760000, "0999-01-01T00:00:00Z"},
        {-62135596800, "0001-01-01T00:00:00Z"},
        {-62167219200, "0000-01-01T00:00:00Z"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        json_t *v = json_time(cases[i].t, 0);
        assert_non_null(v);
        if (!json_is_string(v) || strcmp(json_string_value(v), cases[i].s) != 0)
            fail_msg("%lld: got %s, want %s", (long long)cases[i].t,
                     json_is_string(v) ? json_string_value(v) : "non-string", cases[i].s);
        /* A new reference the caller owns. */
        assert_int_equal(v->refcount, 1);
        json_decref(v);
        if (cases[i].t > 0) {
            v = json_time(cases[i].t, 1);
            assert_string_equal(json_string_value(v), cases[i].s);
            json_decref(v);
        }
    }
}

static void test_time_null(void **state)
{
    (void)state;
    static const int64_t unset[] = {0, -1, -1700000000, INT64_MIN};
    for (size_t i = 0; i < ARRAY_LEN(unset); i++) {
        json_t *v = json_time(unset[i], 1);
        assert_non_null(v);
        assert_true(json_is_null(v));
        json_decref(v);
    }
    /* Out of gmtime's range, or of four digits of year: null, never a wrong
     * or garbled string. */
    static const int64_t beyond[] = {INT64_MAX, 253402300800 /* 10000-01-01 */, -62167219201 /* year -1 */};
    for (size_t i = 0; i < ARRAY_LEN(beyond); i++) {
        json_t *v = json_time(beyond[i], 0);
        assert_non_null(v);
        assert_true(json_is_null(v));
        json_decref(v);
    }
}

/* Standard base64url without padding, three bytes at a time. */
static void b64url(const char *raw, size_t n, char *out)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const unsigned char *s = (const unsigned char *)raw;
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        out[o++] = a[v >> 18 & 63];
        out[o++] = a[v >> 12 & 63];
        out[o++] = a[v >> 6 & 63];
        out[o++] = a[v & 63];
    }
    if (n - i == 1) {
        out[o++] = a[s[i] >> 2];
        out[o++] = a[(s[i] & 3) << 4];
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)s[i] << 8 | s[i + 1];
        out[o++] = a[v >> 10 & 63];
        out[o++] = a[v >> 4 & 63];
        out[o++] = a[(v & 15) << 2];
    }
    out[o] = '\0';
}

static void test_cursor_known(void **state)
{
    (void)state;
    /* Expected values from Python's base64.urlsafe_b64encode, '=' removed. */
    static const struct { int64_t t; const char *id, *cursor; } cases[] = {
        {1700000000, "usr_0123456789abcdefghjk", "MTcwMDAwMDAwMC51c3JfMDEyMzQ1Njc4OWFiY2RlZmdoams"},
        {0, "a", "MC5h"},
        {5, "abc", "NS5hYmM"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char out[CURSOR_MAX];
        cursor_encode(cases[i].t, cases[i].id, out);
        assert_string_equal(out, cases[i].cursor);
        int64_t t = -1;
        char id[64];
        assert_int_equal(cursor_decode(cases[i].cursor, &t, id, sizeof id), 0);
        assert_true(t == cases[i].t);
        assert_string_equal(id, cases[i].id);
    }
}

static void test_cursor_round_trip(void **state)
{
    (void)state;
    static const struct { int64_t t; const char *id; } cases[] = {
        {0, "a"},
        {1, "0"},
        {9, "_"},
        {10, "key_zzzzzzzzzzzzzzzzzzzz"},
        {1795977117, "ins_0123456789abcdefghjk"},
        {253402300799, "abcdefghij_0123456789abcdefghjk"},
        {INT64_C(922337203685477580), "usr_0123456789abcdefghjk"},
        {INT64_MAX - 1, "usr_0123456789abcdefghjk"},
        {INT64_MAX, "abcdefghij_0123456789abcdefghjk"},
        {1795977117, "AMD6GW"},                           /* invite codes page by their code */
        {1795977117, "LATE-1-ABCDEFGHIJKLMNOPQRSTUVWXYZ"}, /* the longest, 32 bytes */
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char cur[CURSOR_MAX], want[CURSOR_MAX], raw[80];
        memset(cur, 'X', sizeof cur);
        cursor_encode(cases[i].t, cases[i].id, cur);
        int n = snprintf(raw, sizeof raw, "%lld.%s", (long long)cases[i].t, cases[i].id);
        b64url(raw, (size_t)n, want);
        assert_string_equal(cur, want);
        assert_true(strlen(cur) < CURSOR_MAX);
        for (const char *p = cur; *p; p++)
            assert_non_null(strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", *p));
        int64_t t = -1;
        char id[64];
        if (cursor_decode(cur, &t, id, sizeof id) != 0)
            fail_msg("%lld.%s: '%s' refused", (long long)cases[i].t, cases[i].id, cur);
        assert_true(t == cases[i].t);
        assert_string_equal(id, cases[i].id);
    }
}

/* The id buffer's size is honoured: idlen-1 bytes fit, idlen do not. */
static void test_cursor_idlen(void **state)
{
    (void)state;
    char cur[CURSOR_MAX], id[8];
    int64_t t = 42;
    cursor_encode(7, "abcdefg", cur);
    assert_int_equal(cursor_decode(cur, &t, id, 8), 0);
    assert_string_equal(id, "abcdefg");
    assert_int_equal(t, 7);
    t = 42;
    strcpy(id, "keep");
    assert_int_equal(cursor_decode(cur, &t, id, 7), -1);
    assert_string_equal(id, "keep");
    assert_int_equal(t, 42);
    assert_int_equal(cursor_decode(cur, &t, id, 1), -1);
}

static void test_cursor_malformed_text(void **state)
{
    (void)state;
    char good[CURSOR_MAX];
    cursor_encode(5, "abc", good); /* "NS5hYmM" */
    static const char *bad[] = {
        "",
        "=",
        "NS5hYmM=",
        "NS5hYmM==",
        "NS5h YmM",
        " NS5hYmM",
        "NS5hYmM\n",
        "NS5h+mM",
        "NS5h/mM",
        "NS5h.mM",
        "NS5h%59mM",
        "NS5hYm\xC3\xA9",
        /* extra characters that carry no whole byte, or only a NUL */
        "NS5hYmMA",
        "NS5hYmMAA",
        "NS5hYmMAAA",
        /* unused low bits of the last character set */
        "NS5hYmN",
        "NS5hYmP",
        /* far too long */
        "MTcwMDAwMDAwMC51c3JfMDEyMzQ1Njc4OWFiY2RlZmdoamtfMDEyMzQ1Njc4OWFiY2RlZmdoamtfMDEyMzQ1Njc4OWFiY2RlZmdo",
    };
    int64_t t = 42;
    char id[64];
    assert_int_equal(cursor_decode(good, &t, id, sizeof id), 0);
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        t = 42;
        strcpy(id, "keep");
        if (cursor_decode(bad[i], &t, id, sizeof id) != -1)
            fail_msg("'%s' decoded as %lld.%s", bad[i], (long long)t, id);
        assert_int_equal(t, 42);
        assert_string_equal(id, "keep");
    }
}

/* Well-encoded text that is not "TIME.ID" as cursor_encode writes it. */
static void test_cursor_malformed_content(void **state)
{
    (void)state;
    static const struct { const char *raw; size_t len; } bad[] = {
        {"", 0},
        {"123", 0},
        {"abc", 0},
        {".abc", 0},
        {"123.", 0},
        {"12a.abc", 0},
        {"-5.abc", 0},
        {"+5.abc", 0},
        {" 5.abc", 0},
        {"5 .abc", 0},
        {"05.abc", 0},
        {"00.abc", 0},
        {"0x5.abc", 0},
        {"5.a.b", 0},
        {"5.a b", 0},
        {"5.abc\n", 0},
        {"5.a/../b", 0},
        {"5.\xC3\xA9", 0},
        {"5..abc", 0},
        {"9223372036854775808.abc", 0},
        {"9223372036854775810.abc", 0},
        {"99999999999999999999.abc", 0},
        {"18446744073709551621.abc", 0},
        {"5.abc\0def", 9},
        {"5.\0abc", 6},
        {"5\0.abc", 6},
        {"\0" "5.abc", 6},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        char cur[CURSOR_MAX];
        size_t n = bad[i].len ? bad[i].len : strlen(bad[i].raw);
        b64url(bad[i].raw, n, cur);
        int64_t t = 42;
        char id[64] = "keep";
        if (cursor_decode(cur, &t, id, sizeof id) != -1)
            fail_msg("case %zu ('%s' from '%s') decoded as %lld.%s", i, cur, bad[i].raw, (long long)t, id);
        assert_int_equal(t, 42);
        assert_string_equal(id, "keep");
    }
}

/* RFC 3339 with offsets, fractions and lower case, all naming
 * 2026-11-29T18:22:00Z (1795976520, from date -u -d); the strict parser
 * takes only the Z form. */
static void test_time_parse_rfc3339(void **state)
{
    (void)state;
    static const struct { const char *s; int64_t t; int fraction; } good[] = {
        {"2026-11-29T18:22:00Z", 1795976520, 0},
        {"2026-11-30T02:22:00+08:00", 1795976520, 0},
        {"2026-11-29T13:22:00-05:00", 1795976520, 0},
        {"2026-11-29T23:52:00+05:30", 1795976520, 0},
        {"2026-11-29T18:22:00+00:00", 1795976520, 0},
        {"2026-11-29T18:22:00-00:00", 1795976520, 0},
        {"2026-11-29t18:22:00z", 1795976520, 0},
        {"2026-11-29T18:22:00.000Z", 1795976520, 0},
        {"2026-11-29T18:22:00.000000000+00:00", 1795976520, 0},
        {"2026-11-29T18:22:00.5Z", 1795976520, 1},
        {"2026-11-30T02:22:00.000001+08:00", 1795976520, 1},
        /* A leap day east of UTC is the day before in UTC. */
        {"2028-02-29T01:00:00+02:00", 1835391600, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(good); i++) {
        int64_t t = 0;
        int fraction = -1;
        if (json_time_parse_rfc3339(good[i].s, &t, &fraction) != 0 || t != good[i].t ||
            fraction != good[i].fraction)
            fail_msg("%s: got %lld (fraction %d), want %lld (%d)", good[i].s, (long long)t, fraction,
                     (long long)good[i].t, good[i].fraction);
    }
    static const char *const bad[] = {
        "", "2026-11-29T18:22:00", "2026-11-29 18:22:00Z", "2026-11-29T18:22Z", "2026-11-29T18:22:00+8:00",
        "2026-11-29T18:22:00+0800", "2026-11-29T18:22:00+24:00", "2026-11-29T18:22:00+08:60",
        "2026-11-29T18:22:00.Z", "2026-11-29T18:22:00.5", "2026-11-29T18:22:00+08:00x", "2026-11-29T18:22:00ZZ",
        "2027-02-29T00:00:00Z", "2026-11-31T00:00:00+08:00", "2026-13-01T00:00:00Z", "2026-11-29T18:22:00.-1Z",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        int64_t t = 42;
        int fraction;
        if (json_time_parse_rfc3339(bad[i], &t, &fraction) != -1)
            fail_msg("%s parsed as %lld", bad[i], (long long)t);
    }
    static const char *const not_strict[] = {"2026-11-30T02:22:00+08:00", "2026-11-29t18:22:00Z",
                                             "2026-11-29T18:22:00z", "2026-11-29T18:22:00.000Z"};
    for (size_t i = 0; i < ARRAY_LEN(not_strict); i++) {
        int64_t t;
        assert_int_equal(json_time_parse(not_strict[i], &t), -1);
    }
    int64_t t;
    assert_int_equal(json_time_parse("2026-11-29T18:22:00Z", &t), 0);
    assert_int_equal(t, 1795976520);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_time_known),
        cmocka_unit_test(test_time_null),
        cmocka_unit_test(test_time_parse_rfc3339),
        cmocka_unit_test(test_cursor_known),
        cmocka_unit_test(test_cursor_round_trip),
        cmocka_unit_test(test_cursor_idlen),
        cmocka_unit_test(test_cursor_malformed_text),
        cmocka_unit_test(test_cursor_malformed_content),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
