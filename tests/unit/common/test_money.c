/* test_money.c: unit tests for money.c. Tables of strings and amounts for the
 * edges, and fixed-seed random loops for the properties billing relies on:
 * ticks that post differences add up to the whole, and the affordable-seconds
 * answer is exact. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "gpurent/money.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
/* A value no function under test produces, to see that failures zero *out. */
#define POISON INT64_C(0x5a5a5a5a5a5a)

/* Prices from the worked examples in DESIGN.md, per card-hour. */
#define MI450_PRICE INT64_C(1200000)
#define MI300X_PRICE INT64_C(2200000)

/* splitmix64: a fixed seed makes a failing random case reproducible. */
static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* A value in [0, INT64_MAX] whose bit length is itself random, so that small,
 * realistic and huge values are all drawn often. */
static int64_t rng_magnitude(void)
{
    unsigned bits = (unsigned)(rng_next() % 64);
    return bits == 0 ? 0 : (int64_t)(rng_next() >> (64 - bits));
}

static int64_t rng_below(int64_t n) { return (int64_t)(rng_next() % (uint64_t)n); }

static void test_parse_valid(void **state)
{
    static const struct { const char *s; int64_t micro; } cases[] = {
        {"0", 0},
        {"0.0", 0},
        {"0.000000", 0},
        {"10", 10 * MONEY_UNIT},
        {"9.60", 9600000},
        {"9.6", 9600000},
        {"1.2", 1200000},
        {"1.20", 1200000},
        {"2.20", MI300X_PRICE},
        {"0.000001", 1},
        {"0.5", 500000},
        {"0.05", 50000},
        {"1.000001", 1000001},
        {"100", 100000000},
        {"123456.789012", INT64_C(123456789012)},
        {"9223372036854", INT64_C(9223372036854000000)},
        {"9223372036854.775807", INT64_MAX},
        {"9223372036854.7758", INT64_C(9223372036854775800)},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int64_t v = POISON;
        int rc = money_parse(cases[i].s, &v);
        if (rc != MONEY_OK || v != cases[i].micro)
            fail_msg("\"%s\": rc %d value %lld, want %lld", cases[i].s, rc, (long long)v,
                     (long long)cases[i].micro);
    }
}

static void test_parse_invalid(void **state)
{
    static const struct { const char *s; int rc; } cases[] = {
        /* empty and lone punctuation */
        {"", MONEY_ERR_SYNTAX},
        {".", MONEY_ERR_SYNTAX},
        {"..", MONEY_ERR_SYNTAX},
        /* signs */
        {"-1", MONEY_ERR_SYNTAX},
        {"+1", MONEY_ERR_SYNTAX},
        {"-0", MONEY_ERR_SYNTAX},
        {"1.-5", MONEY_ERR_SYNTAX},
        {"1.+5", MONEY_ERR_SYNTAX},
        {"1-", MONEY_ERR_SYNTAX},
        /* exponents */
        {"1e6", MONEY_ERR_SYNTAX},
        {"1E6", MONEY_ERR_SYNTAX},
        {"1.5e2", MONEY_ERR_SYNTAX},
        {"1e-6", MONEY_ERR_SYNTAX},
        /* white space anywhere */
        {" 1", MONEY_ERR_SYNTAX},
        {"1 ", MONEY_ERR_SYNTAX},
        {"1 000", MONEY_ERR_SYNTAX},
        {"1. 5", MONEY_ERR_SYNTAX},
        {"\t1", MONEY_ERR_SYNTAX},
        {"1\n", MONEY_ERR_SYNTAX},
        {"1.5\r", MONEY_ERR_SYNTAX},
        /* dots without digits on both sides, or more than one */
        {"1.", MONEY_ERR_SYNTAX},
        {".5", MONEY_ERR_SYNTAX},
        {"1..2", MONEY_ERR_SYNTAX},
        {"1.2.3", MONEY_ERR_SYNTAX},
        /* thousands and other separators */
        {"1,000", MONEY_ERR_SYNTAX},
        {"1,5", MONEY_ERR_SYNTAX},
        {"1_000", MONEY_ERR_SYNTAX},
        {"1'000", MONEY_ERR_SYNTAX},
        /* hex and other bases */
        {"0x10", MONEY_ERR_SYNTAX},
        {"0X1A", MONEY_ERR_SYNTAX},
        {"1a", MONEY_ERR_SYNTAX},
        {"0b1", MONEY_ERR_SYNTAX},
        /* leading zeros */
        {"007", MONEY_ERR_SYNTAX},
        {"00", MONEY_ERR_SYNTAX},
        {"00.5", MONEY_ERR_SYNTAX},
        {"01", MONEY_ERR_SYNTAX},
        {"01.000001", MONEY_ERR_SYNTAX},
        /* words, currency and non-ASCII digits */
        {"inf", MONEY_ERR_SYNTAX},
        {"nan", MONEY_ERR_SYNTAX},
        {"1yuan", MONEY_ERR_SYNTAX},
        {"\xc2\xa5" "1", MONEY_ERR_SYNTAX},  /* U+00A5 YEN SIGN */
        {"\xef\xbc\x91", MONEY_ERR_SYNTAX},  /* U+FF11 FULLWIDTH DIGIT ONE */
        {"\xd9\xa3", MONEY_ERR_SYNTAX},      /* U+0663 ARABIC-INDIC DIGIT THREE */
        /* too many fraction digits, zeros included */
        {"0.0000001", MONEY_ERR_PRECISION},
        {"1.0000000", MONEY_ERR_PRECISION},
        {"1.1234567", MONEY_ERR_PRECISION},
        {"9.600000000000000000000000", MONEY_ERR_PRECISION},
        /* syntax wins over precision, precision over overflow */
        {"1.1234567x", MONEY_ERR_SYNTAX},
        {"99999999999999999999.1234567", MONEY_ERR_PRECISION},
        /* just too large, and far too large */
        {"9223372036854.775808", MONEY_ERR_OVERFLOW},
        {"9223372036854.775809", MONEY_ERR_OVERFLOW},
        {"9223372036854.78", MONEY_ERR_OVERFLOW},
        {"9223372036855", MONEY_ERR_OVERFLOW},
        {"9223372036860", MONEY_ERR_OVERFLOW},
        {"10000000000000", MONEY_ERR_OVERFLOW},
        {"9223372036854775807", MONEY_ERR_OVERFLOW},
        {"18446744073709551616", MONEY_ERR_OVERFLOW},
        {"99999999999999999999999999999999999999999999999999", MONEY_ERR_OVERFLOW},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int64_t v = POISON;
        int rc = money_parse(cases[i].s, &v);
        if (rc != cases[i].rc || v != 0)
            fail_msg("\"%s\": rc %d value %lld, want rc %d value 0", cases[i].s, rc,
                     (long long)v, cases[i].rc);
    }
}

static void test_parse_null_and_embedded_nul(void **state)
{
    int64_t v = POISON;
    assert_int_equal(money_parse(NULL, &v), MONEY_ERR_SYNTAX);
    assert_int_equal(v, 0);
    v = POISON;
    assert_int_equal(money_parse_n(NULL, 0, &v), MONEY_ERR_SYNTAX);
    assert_int_equal(v, 0);

    /* A JSON string like "1\u00005" reaches C with its length; the NUL must
     * not cut it short into a valid "1". */
    static const struct { const char *s; size_t len; } nul_cases[] = {
        {"1\0" "5", 3}, {"1.\0" "5", 4}, {"1.5\0", 4}, {"\0" "1", 2}, {"\0", 1},
    };
    for (size_t i = 0; i < ARRAY_LEN(nul_cases); i++) {
        v = POISON;
        assert_int_equal(money_parse_n(nul_cases[i].s, nul_cases[i].len, &v), MONEY_ERR_SYNTAX);
        assert_int_equal(v, 0);
    }

    /* The length is honoured: only the first len bytes are read. */
    assert_int_equal(money_parse_n("9.60xyz", 4, &v), MONEY_OK);
    assert_int_equal(v, 9600000);
    assert_int_equal(money_parse_n("9.60", 0, &v), MONEY_ERR_SYNTAX);
    assert_int_equal(v, 0);
}

static void test_format_table(void **state)
{
    static const struct { int64_t micro; const char *s; } cases[] = {
        {0, "0.00"},
        {1, "0.000001"},
        {10, "0.00001"},
        {5000, "0.005"},
        {10000, "0.01"},
        {500000, "0.50"},
        {1200000, "1.20"},
        {1230000, "1.23"},
        {1234000, "1.234"},
        {1234567, "1.234567"},
        {9600000, "9.60"},
        {28800000, "28.80"},
        {100000000, "100.00"},
        {-1, "-0.000001"},
        {-9600000, "-9.60"},
        {-100000000, "-100.00"},
        {INT64_MAX, "9223372036854.775807"},
        {INT64_MAX - 7, "9223372036854.7758"},
        {INT64_MIN, "-9223372036854.775808"},
        {INT64_MIN + 8, "-9223372036854.7758"},
    };
    char buf[MONEY_FMT_LEN];
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        memset(buf, 'x', sizeof buf);
        assert_ptr_equal(money_format(cases[i].micro, buf), buf);
        assert_string_equal(buf, cases[i].s);
    }
}

static void test_format_parse_round_trip(void **state)
{
    char buf[MONEY_FMT_LEN], neg[MONEY_FMT_LEN], want[MONEY_FMT_LEN + 1];
    rng_state = 1;
    for (int i = 0; i < 200000; i++) {
        int64_t v = rng_magnitude();
        int64_t back = POISON;
        money_format(v, buf);
        if (money_parse(buf, &back) != MONEY_OK || back != v)
            fail_msg("%lld formats as \"%s\", parses back as %lld", (long long)v, buf,
                     (long long)back);
        /* A negative amount is its magnitude with a minus sign. */
        if (v > 0) {
            snprintf(want, sizeof want, "-%s", buf);
            assert_string_equal(money_format(-v, neg), want);
        }
    }
}

static void test_add_sub(void **state)
{
    static const struct { int64_t a, b, sum, diff; int sum_rc, diff_rc; } cases[] = {
        {0, 0, 0, 0, MONEY_OK, MONEY_OK},
        {9600000, 400000, 10000000, 9200000, MONEY_OK, MONEY_OK},
        {400000, 9600000, 10000000, -9200000, MONEY_OK, MONEY_OK},
        {INT64_MAX, 0, INT64_MAX, INT64_MAX, MONEY_OK, MONEY_OK},
        {INT64_MAX, 1, 0, INT64_MAX - 1, MONEY_ERR_OVERFLOW, MONEY_OK},
        {INT64_MAX, -1, INT64_MAX - 1, 0, MONEY_OK, MONEY_ERR_OVERFLOW},
        {INT64_MAX, INT64_MAX, 0, 0, MONEY_ERR_OVERFLOW, MONEY_OK},
        {INT64_MIN, 0, INT64_MIN, INT64_MIN, MONEY_OK, MONEY_OK},
        {INT64_MIN, -1, 0, INT64_MIN + 1, MONEY_ERR_OVERFLOW, MONEY_OK},
        {INT64_MIN, 1, INT64_MIN + 1, 0, MONEY_OK, MONEY_ERR_OVERFLOW},
        {INT64_MIN, INT64_MIN, 0, 0, MONEY_ERR_OVERFLOW, MONEY_OK},
        {INT64_MIN, INT64_MAX, -1, 0, MONEY_OK, MONEY_ERR_OVERFLOW},
        {0, INT64_MIN, INT64_MIN, 0, MONEY_OK, MONEY_ERR_OVERFLOW},
        {-1, INT64_MIN, 0, INT64_MAX, MONEY_ERR_OVERFLOW, MONEY_OK},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int64_t v = POISON;
        assert_int_equal(money_add(cases[i].a, cases[i].b, &v), cases[i].sum_rc);
        assert_int_equal(v, cases[i].sum);
        v = POISON;
        assert_int_equal(money_sub(cases[i].a, cases[i].b, &v), cases[i].diff_rc);
        assert_int_equal(v, cases[i].diff);
    }
}

static void test_accrue_table(void **state)
{
    static const struct { int64_t price, cards, seconds, micro; int rc; } cases[] = {
        /* DESIGN.md: 8 x MI450 at 1.20 for 3 h is 28.80, for 1 h 9.60 */
        {MI450_PRICE, 8, 3 * 3600, 28800000, MONEY_OK},
        {MI450_PRICE, 8, 3600, 9600000, MONEY_OK},
        /* 10.00 pays for 3750 s exactly; one second less is floored */
        {MI450_PRICE, 8, 3750, 10000000, MONEY_OK},
        {MI450_PRICE, 8, 3749, 9997333, MONEY_OK},
        /* 1 card for 1 s: floor(1200000 / 3600) */
        {MI450_PRICE, 1, 1, 333, MONEY_OK},
        {MI300X_PRICE, 1, 3600, 2200000, MONEY_OK},
        {MI300X_PRICE, 8, 3600, 17600000, MONEY_OK},
        {MI300X_PRICE, 1, 1, 611, MONEY_OK},
        /* floor edges */
        {3600, 1, 1, 1, MONEY_OK},
        {3599, 1, 1, 0, MONEY_OK},
        {1, 1, 3599, 0, MONEY_OK},
        {1, 1, 3600, 1, MONEY_OK},
        {1, 1, 7199, 1, MONEY_OK},
        {1, 1, 7200, 2, MONEY_OK},
        /* zeros */
        {0, 8, 3600, 0, MONEY_OK},
        {MI450_PRICE, 0, 3600, 0, MONEY_OK},
        {MI450_PRICE, 8, 0, 0, MONEY_OK},
        {0, INT64_MAX, INT64_MAX, 0, MONEY_OK},
        {INT64_MAX, INT64_MAX, 0, 0, MONEY_OK},
        /* the largest results, and just past them */
        {INT64_MAX, 1, 3600, INT64_MAX, MONEY_OK},
        {1, INT64_MAX, 3600, INT64_MAX, MONEY_OK},
        {1, 3600, INT64_MAX, INT64_MAX, MONEY_OK},
        {INT64_MAX, 1, 3601, 0, MONEY_ERR_OVERFLOW},
        {1, 3601, INT64_MAX, 0, MONEY_ERR_OVERFLOW},
        {INT64_MAX, INT64_MAX, 1, 0, MONEY_ERR_OVERFLOW},
        {INT64_MAX, INT64_MAX, INT64_MAX, 0, MONEY_ERR_OVERFLOW},
        /* rate * seconds is exactly 2^128, which wraps to 0 in 128 bits */
        {INT64_C(1) << 62, INT64_C(1) << 62, 16, 0, MONEY_ERR_OVERFLOW},
        /* negative inputs */
        {-1, 1, 1, 0, MONEY_ERR_NEGATIVE},
        {1, -1, 1, 0, MONEY_ERR_NEGATIVE},
        {1, 1, -1, 0, MONEY_ERR_NEGATIVE},
        {INT64_MIN, 0, 0, 0, MONEY_ERR_NEGATIVE},
        {0, 0, INT64_MIN, 0, MONEY_ERR_NEGATIVE},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int64_t v = POISON;
        int rc = money_accrue(cases[i].price, cases[i].cards, cases[i].seconds, &v);
        if (rc != cases[i].rc || v != cases[i].micro)
            fail_msg("accrue(%lld, %lld, %lld): rc %d value %lld, want rc %d value %lld",
                     (long long)cases[i].price, (long long)cases[i].cards,
                     (long long)cases[i].seconds, rc, (long long)v, cases[i].rc,
                     (long long)cases[i].micro);
    }

    /* The 10-yuan trial credit covers 8 x MI450 for an hour. */
    int64_t trial, hour;
    assert_int_equal(money_parse("10", &trial), MONEY_OK);
    assert_int_equal(money_accrue(MI450_PRICE, 8, 3600, &hour), MONEY_OK);
    assert_true(hour <= trial);
}

/* Where plain int64_t arithmetic is enough, it must agree with money_accrue. */
static void test_accrue_matches_int64(void **state)
{
    rng_state = 2;
    for (int i = 0; i < 200000; i++) {
        int64_t p = rng_below(1000 * MONEY_UNIT), c = rng_below(65), s = rng_below(400 * 86400);
        int64_t pc, pcs, v = POISON;
        assert_false(__builtin_mul_overflow(p, c, &pc));
        assert_false(__builtin_mul_overflow(pc, s, &pcs));
        assert_int_equal(money_accrue(p, c, s, &v), MONEY_OK);
        assert_int_equal(v, pcs / 3600);
    }
}

/* Ticks post accrue(now) - accrue(last tick): however irregular, repeated or
 * late the ticks, their sum is the accrual over the whole segment. Separate
 * segments, each floored on its own, lose at most one micro per split. */
static void test_accrue_ticks_sum_to_total(void **state)
{
    rng_state = 3;
    for (int round = 0; round < 2000; round++) {
        int64_t p = rng_below(50 * MONEY_UNIT) + 1, c = rng_below(16) + 1;
        int64_t t = 0, posted = 0, separate = 0, splits = 0;
        int ticks = (int)rng_below(200) + 1;
        for (int k = 0; k < ticks; k++) {
            /* steps of 0 are repeated ticks; large steps are late ones */
            int64_t step = rng_below(4) == 0 ? 0 : rng_below(rng_below(2) ? 60 : 100000);
            int64_t now = t + step, before, after, delta, piece;
            assert_int_equal(money_accrue(p, c, t, &before), MONEY_OK);
            assert_int_equal(money_accrue(p, c, now, &after), MONEY_OK);
            assert_int_equal(money_sub(after, before, &delta), MONEY_OK);
            assert_true(delta >= 0);
            assert_int_equal(money_add(posted, delta, &posted), MONEY_OK);
            assert_int_equal(money_accrue(p, c, step, &piece), MONEY_OK);
            separate += piece;
            splits++;
            t = now;
        }
        int64_t total;
        assert_int_equal(money_accrue(p, c, t, &total), MONEY_OK);
        assert_int_equal(posted, total);
        assert_true(separate <= total && total - separate <= splits);
    }
}

static void test_seconds_affordable_table(void **state)
{
    static const struct { int64_t price, cards, funds, seconds; int rc; } cases[] = {
        /* 10.00 affords 8 x MI450 for exactly 3750 s (8 * 1.2 * 3750 / 3600) */
        {MI450_PRICE, 8, 10000000, 3750, MONEY_OK},
        {MI450_PRICE, 8, 9999999, 3749, MONEY_OK},
        {MI450_PRICE, 8, 28800000, 3 * 3600, MONEY_OK},
        {MI450_PRICE, 1, 333, 1, MONEY_OK},
        {MI450_PRICE, 1, 332, 0, MONEY_OK},
        {MI300X_PRICE, 1, 2200000, 3600, MONEY_OK},
        {MI450_PRICE, 8, 0, 0, MONEY_OK},
        {3600, 1, 0, 0, MONEY_OK},
        /* a rate of 1 micro per hour is free for the first 3599 s */
        {1, 1, 0, 3599, MONEY_OK},
        {1, 1, 1, 7199, MONEY_OK},
        /* a free rate, and answers past INT64_MAX, are capped */
        {0, 8, 5, INT64_MAX, MONEY_OK},
        {MI450_PRICE, 0, 5, INT64_MAX, MONEY_OK},
        {0, 0, 0, INT64_MAX, MONEY_OK},
        {1, 1, INT64_MAX, INT64_MAX, MONEY_OK},
        {3600, 1, INT64_MAX, INT64_MAX, MONEY_OK},
        {3601, 1, INT64_MAX, INT64_C(9220810700549067733), MONEY_OK},
        /* a rate so high that one second overflows */
        {INT64_MAX, INT64_MAX, INT64_MAX, 0, MONEY_OK},
        {INT64_MAX, 1, INT64_MAX, 3600, MONEY_OK},
        /* negative inputs */
        {-1, 1, 1, 0, MONEY_ERR_NEGATIVE},
        {1, -1, 1, 0, MONEY_ERR_NEGATIVE},
        {1, 1, -1, 0, MONEY_ERR_NEGATIVE},
        {0, 0, INT64_MIN, 0, MONEY_ERR_NEGATIVE},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int64_t v = POISON;
        int rc = money_seconds_affordable(cases[i].price, cases[i].cards, cases[i].funds, &v);
        if (rc != cases[i].rc || v != cases[i].seconds)
            fail_msg("affordable(%lld, %lld, %lld): rc %d value %lld, want rc %d value %lld",
                     (long long)cases[i].price, (long long)cases[i].cards,
                     (long long)cases[i].funds, rc, (long long)v, cases[i].rc,
                     (long long)cases[i].seconds);
    }
}

/* accrue(s) <= funds < accrue(s + 1), where an overflowing accrue(s + 1) is
 * certainly more than any funds. */
static void check_affordable_exact(int64_t p, int64_t c, int64_t funds)
{
    int64_t s, at, next;
    assert_int_equal(money_seconds_affordable(p, c, funds, &s), MONEY_OK);
    assert_true(s >= 0);
    assert_int_equal(money_accrue(p, c, s, &at), MONEY_OK);
    if (at > funds)
        fail_msg("affordable(%lld, %lld, %lld) = %lld costs %lld", (long long)p, (long long)c,
                 (long long)funds, (long long)s, (long long)at);
    if (s == INT64_MAX)
        return;
    if (money_accrue(p, c, s + 1, &next) == MONEY_OK && next <= funds)
        fail_msg("affordable(%lld, %lld, %lld) = %lld, but %lld s cost only %lld", (long long)p,
                 (long long)c, (long long)funds, (long long)s, (long long)(s + 1),
                 (long long)next);
}

static void test_seconds_affordable_exact(void **state)
{
    rng_state = 4;
    for (int i = 0; i < 200000; i++) {
        /* realistic prices, card counts and balances */
        check_affordable_exact(rng_below(100 * MONEY_UNIT), rng_below(17),
                               rng_below(100000 * MONEY_UNIT));
        /* and anything at all */
        check_affordable_exact(rng_magnitude(), rng_magnitude(), rng_magnitude());
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_invalid),
        cmocka_unit_test(test_parse_null_and_embedded_nul),
        cmocka_unit_test(test_format_table),
        cmocka_unit_test(test_format_parse_round_trip),
        cmocka_unit_test(test_add_sub),
        cmocka_unit_test(test_accrue_table),
        cmocka_unit_test(test_accrue_matches_int64),
        cmocka_unit_test(test_accrue_ticks_sum_to_total),
        cmocka_unit_test(test_seconds_affordable_table),
        cmocka_unit_test(test_seconds_affordable_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
