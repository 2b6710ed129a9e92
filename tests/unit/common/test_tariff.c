/* test_tariff.c: unit tests for tariff.c, what an interval costs under a
 * price schedule that changes over time: the schedule's edges (none, before
 * the first price, changes inside the interval, split exactly at
 * effective_at), degenerate intervals and card counts, the floor of each
 * piece at awkward values, overflow, and the worked examples of the design
 * (8 x MI450 at 1.20 a card-hour). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "gpurent/money.h"
#include "gpurent/tariff.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
/* A value tariff_due never produces, to see that it writes *out. */
#define POISON INT64_C(0x5a5a5a5a5a5a)

/* 3.60 a card-hour is 1000 micro a card-second: costs are easy to read. */
#define PER_SECOND_1000 INT64_C(3600000)
#define MI450_PRICE INT64_C(1200000) /* 1.20 yuan a card-hour */

static int64_t due(const struct price_point *pp, size_t n, int64_t cards, int64_t start, int64_t end, int *rc)
{
    int64_t out = POISON;
    *rc = tariff_due(pp, n, cards, start, end, &out);
    return out;
}

static void test_empty_schedule_costs_nothing(void **state)
{
    int rc;
    assert_int_equal(due(NULL, 0, 8, 0, 86400, &rc), 0);
    assert_int_equal(rc, MONEY_OK);
    assert_int_equal(tariff_price_at(NULL, 0, 0), -1);
    assert_int_equal(tariff_price_at(NULL, 0, INT64_MAX), -1);
}

static void test_time_before_the_first_price_is_free(void **state)
{
    const struct price_point pp[] = {{1000, PER_SECOND_1000}};
    int rc;
    /* Wholly before the first price. */
    assert_int_equal(due(pp, 1, 1, 0, 1000, &rc), 0);
    assert_int_equal(rc, MONEY_OK);
    /* Straddling it: only [1000, 2000) is charged. */
    assert_int_equal(due(pp, 1, 1, 0, 2000, &rc), 1000 * 1000);
    assert_int_equal(rc, MONEY_OK);
    assert_int_equal(tariff_price_at(pp, 1, 999), -1);
    assert_int_equal(tariff_price_at(pp, 1, 1000), PER_SECOND_1000);
}

static void test_a_change_inside_the_interval_splits_it_at_effective_at(void **state)
{
    /* 1000 micro a card-second until 1000, then 2000. */
    const struct price_point pp[] = {{0, PER_SECOND_1000}, {1000, 2 * PER_SECOND_1000}};
    int rc;
    assert_int_equal(due(pp, 2, 1, 900, 1100, &rc), 100 * 1000 + 100 * 2000);
    assert_int_equal(rc, MONEY_OK);
    /* The second before the change is at the old price, the second at it at the new one. */
    assert_int_equal(due(pp, 2, 1, 999, 1000, &rc), 1000);
    assert_int_equal(due(pp, 2, 1, 1000, 1001, &rc), 2000);
    assert_int_equal(due(pp, 2, 1, 999, 1001, &rc), 3000);
    /* An interval that ends exactly at the change pays none of the new price. */
    assert_int_equal(due(pp, 2, 3, 0, 1000, &rc), 3 * 1000 * 1000);
    assert_int_equal(tariff_price_at(pp, 2, 999), PER_SECOND_1000);
    assert_int_equal(tariff_price_at(pp, 2, 1000), 2 * PER_SECOND_1000);
}

static void test_several_changes_each_charge_their_own_piece(void **state)
{
    const struct price_point pp[] = {
        {100, PER_SECOND_1000},     /* 1000/s from 100 */
        {200, 3 * PER_SECOND_1000}, /* 3000/s from 200 */
        {300, 0},                   /* free from 300 */
        {400, 2 * PER_SECOND_1000}, /* 2000/s from 400 */
    };
    int rc;
    /* [0, 500): free to 100, then 100 s at each price. */
    assert_int_equal(due(pp, 4, 2, 0, 500, &rc), 2 * (100 * 1000 + 100 * 3000 + 0 + 100 * 2000));
    assert_int_equal(rc, MONEY_OK);
    /* Wholly inside one piece, the others are not touched. */
    assert_int_equal(due(pp, 4, 1, 210, 250, &rc), 40 * 3000);
    /* Only inside the free piece. */
    assert_int_equal(due(pp, 4, 8, 300, 400, &rc), 0);
    /* A piece that started before the interval and one after it ends. */
    assert_int_equal(due(pp, 4, 1, 150, 350, &rc), 50 * 1000 + 100 * 3000);
    /* The price in force after the last change is the last one, forever. */
    assert_int_equal(tariff_price_at(pp, 4, 399), 0);
    assert_int_equal(tariff_price_at(pp, 4, INT64_MAX), 2 * PER_SECOND_1000);
}

static void test_zero_length_interval_costs_nothing(void **state)
{
    const struct price_point pp[] = {{0, MI450_PRICE}};
    int rc;
    assert_int_equal(due(pp, 1, 8, 5000, 5000, &rc), 0);
    assert_int_equal(rc, MONEY_OK);
}

static void test_reversed_interval_is_refused_with_out_zeroed(void **state)
{
    const struct price_point pp[] = {{0, MI450_PRICE}};
    int rc;
    assert_int_equal(due(pp, 1, 8, 5001, 5000, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_NEGATIVE);
}

static void test_zero_cards_cost_nothing_and_negative_cards_are_refused(void **state)
{
    const struct price_point pp[] = {{0, MI450_PRICE}};
    int rc;
    assert_int_equal(due(pp, 1, 0, 0, 86400, &rc), 0);
    assert_int_equal(rc, MONEY_OK);
    assert_int_equal(due(pp, 1, -1, 0, 86400, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_NEGATIVE);
}

static void test_a_negative_price_is_refused(void **state)
{
    const struct price_point pp[] = {{0, -1}};
    int rc;
    assert_int_equal(due(pp, 1, 1, 0, 3600, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_NEGATIVE);
}

static void test_each_piece_is_floored_at_awkward_values(void **state)
{
    static const struct {
        int64_t price, cards, seconds, want;
    } cases[] = {
        {1, 1, 1, 0},               /* 1 micro a card-hour, one second: nothing */
        {1, 1, 3599, 0},            /* a second short of the hour */
        {1, 1, 3600, 1},            /* the hour */
        {1, 3600, 1, 1},            /* 3600 cards for a second */
        {1, 1, 7199, 1},            /* floor, not round */
        {3599, 1, 1, 0},
        {3600, 1, 1, 1},
        {3601, 1, 1, 1},
        {MI450_PRICE, 1, 1, 333},   /* 333.33 */
        {MI450_PRICE, 7, 1, 2333},  /* 2333.33 */
        {MI450_PRICE, 1, 3, 1000},  /* exact */
        {MI450_PRICE, 256, 1, 85333}, /* 85333.33 */
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const struct price_point pp[] = {{0, cases[i].price}};
        int rc;
        int64_t got = due(pp, 1, cases[i].cards, 1000, 1000 + cases[i].seconds, &rc);
        if (rc != MONEY_OK || got != cases[i].want)
            fail_msg("price %lld x %lld cards x %lld s: rc %d, %lld, want %lld", (long long)cases[i].price,
                     (long long)cases[i].cards, (long long)cases[i].seconds, rc, (long long)got,
                     (long long)cases[i].want);
    }
}

/* The floor is taken per price piece: a change that splits an hour at 1
 * micro a card-hour into two halves leaves two pieces worth nothing. */
static void test_the_floor_is_per_piece_not_per_interval(void **state)
{
    const struct price_point split[] = {{0, 1}, {1800, 1}};
    const struct price_point whole[] = {{0, 1}};
    int rc;
    assert_int_equal(due(whole, 1, 1, 0, 3600, &rc), 1);
    assert_int_equal(due(split, 2, 1, 0, 3600, &rc), 0);
    assert_int_equal(rc, MONEY_OK);
}

/* Billing recomputes from the interval's start and posts the difference:
 * that only works if what is due never falls as the end moves on. */
static void test_due_never_falls_as_the_end_moves_on(void **state)
{
    const struct price_point pp[] = {{0, MI450_PRICE}, {7, 1}, {100, 2200000}, {3000, 0}, {3500, 999999}};
    int64_t last = 0;
    for (int64_t end = 0; end <= 5000; end++) {
        int rc;
        int64_t d = due(pp, ARRAY_LEN(pp), 3, 0, end, &rc);
        if (rc != MONEY_OK || d < last)
            fail_msg("end %lld: rc %d, due %lld after %lld", (long long)end, rc, (long long)d, (long long)last);
        last = d;
    }
}

static void test_overflow_of_a_piece_is_reported_with_out_zeroed(void **state)
{
    const struct price_point pp[] = {{0, INT64_MAX}};
    int rc;
    assert_int_equal(due(pp, 1, 256, 0, 3600, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_OVERFLOW);
}

static void test_overflow_of_the_sum_of_pieces_is_reported_with_out_zeroed(void **state)
{
    /* Each hour alone fits; the two together do not. */
    const int64_t half = INT64_MAX / 2 + 1;
    const struct price_point pp[] = {{0, half}, {3600, half}};
    int rc;
    assert_int_equal(due(pp, 2, 1, 0, 3600, &rc), half);
    assert_int_equal(rc, MONEY_OK);
    assert_int_equal(due(pp, 2, 1, 0, 7200, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_OVERFLOW);
}

/* The worked examples of the design: 8 x MI450 at 1.20 a card-hour. */
static void test_worked_example_eight_mi450_for_three_hours_is_28_80(void **state)
{
    const struct price_point pp[] = {{0, MI450_PRICE}};
    int rc;
    assert_int_equal(due(pp, 1, 8, 1700000000, 1700000000 + 3 * 3600, &rc), 28800000);
    assert_int_equal(rc, MONEY_OK);
    char buf[MONEY_FMT_LEN];
    assert_string_equal(money_format(due(pp, 1, 8, 0, 3 * 3600, &rc), buf), "28.80");
}

static void test_worked_example_eight_mi450_for_one_hour_is_9_60(void **state)
{
    const struct price_point pp[] = {{0, MI450_PRICE}};
    int rc;
    assert_int_equal(due(pp, 1, 8, 1700000000, 1700000000 + 3600, &rc), 9600000);
    assert_int_equal(rc, MONEY_OK);
    char buf[MONEY_FMT_LEN];
    assert_string_equal(money_format(due(pp, 1, 8, 0, 3600, &rc), buf), "9.60");
}

/* A piece longer than INT64_MAX seconds is an overflow, not undefined
 * behaviour in `to - from` (UBSan, make SAN=1, would stop here). */
static void test_a_piece_longer_than_int64_seconds_is_an_overflow(void **state)
{
    const struct price_point pp[] = {{INT64_MIN, 1}};
    int rc;
    assert_int_equal(due(pp, 1, 1, INT64_MIN, INT64_MAX, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_OVERFLOW);
}

/* ------------------------------------------------------------ storage */

static int64_t sdue(const struct price_point *pp, size_t n, int64_t gb, int64_t start, int64_t end, int *rc)
{
    int64_t out = 77;
    *rc = tariff_storage_due(pp, n, gb, start, end, &out);
    return out;
}

/* 0.30 a GB-month for 100 GB over one 30-day month is exactly 30.00. */
static void test_storage_a_whole_month_costs_price_times_size(void **state)
{
    (void)state;
    const struct price_point pp[] = {{0, 300000}};
    int rc;
    assert_int_equal(sdue(pp, 1, 100, 1000, 1000 + TARIFF_MONTH_SECONDS, &rc), 30000000);
    assert_int_equal(rc, MONEY_OK);
    assert_int_equal(TARIFF_MONTH_SECONDS, 30 * 86400);
}

/* floor(300000 × 100 × 3600 / 2592000) = floor(41666.67) = 41666. */
static void test_storage_an_hour_is_floored(void **state)
{
    (void)state;
    const struct price_point pp[] = {{0, 300000}};
    int rc;
    assert_int_equal(sdue(pp, 1, 100, 0, 3600, &rc), 41666);
    assert_int_equal(sdue(pp, 1, 1, 0, 1, &rc), 0); /* 0.115 micro */
    assert_int_equal(sdue(pp, 1, 1, 0, 9, &rc), 1);
    assert_int_equal(sdue(NULL, 0, 100, 0, 3600, &rc), 0);
    assert_int_equal(rc, MONEY_OK);
}

/* A change splits the volume's time; each piece floored on its own. */
static void test_storage_a_price_change_splits_the_time(void **state)
{
    (void)state;
    const struct price_point pp[] = {{100, 300000}, {1000, 600000}};
    int rc;
    /* free before 100; [100,1000) at 0.30; [1000,2000) at 0.60; 10 GB */
    int64_t a = (int64_t)((__int128)300000 * 10 * 900 / 2592000), b = (int64_t)((__int128)600000 * 10 * 1000 / 2592000);
    assert_int_equal(sdue(pp, 2, 10, 0, 2000, &rc), a + b);
    assert_int_equal(rc, MONEY_OK);
}

static void test_storage_bad_input_and_overflow(void **state)
{
    (void)state;
    const struct price_point pp[] = {{0, INT64_MAX}};
    int rc;
    assert_int_equal(sdue(pp, 1, 1048576, 0, INT64_MAX, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_OVERFLOW);
    assert_int_equal(sdue(pp, 1, 1, 10, 5, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_NEGATIVE);
    assert_int_equal(sdue(pp, 1, -1, 0, 5, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_NEGATIVE);
    const struct price_point neg[] = {{0, -1}};
    assert_int_equal(sdue(neg, 1, 1, 0, 5, &rc), 0);
    assert_int_equal(rc, MONEY_ERR_NEGATIVE);
}

/* Due never falls as time moves on (what billing's differences rely on). */
static void test_storage_due_is_monotonic(void **state)
{
    (void)state;
    const struct price_point pp[] = {{0, 123457}, {5000, 1}, {9000, 999999}};
    int rc;
    int64_t prev = 0;
    for (int64_t t = 0; t < 20000; t += 7) {
        int64_t d = sdue(pp, 3, 37, 3, t + 3, &rc);
        assert_int_equal(rc, MONEY_OK);
        assert_true(d >= prev);
        prev = d;
    }
}

/* A region's own prices replace the global ones from its first on. */
static void test_storage_schedule_merges_global_then_region(void **state)
{
    (void)state;
    const struct price_point g[] = {{0, 1}, {100, 2}, {300, 3}};
    const struct price_point r[] = {{200, 10}, {400, 20}};
    struct price_point out[5];
    size_t n = tariff_storage_schedule(g, 3, r, 2, out);
    assert_int_equal(n, 4);
    assert_int_equal(out[0].effective_at, 0);
    assert_int_equal(out[1].effective_at, 100);
    assert_int_equal(out[2].effective_at, 200);
    assert_int_equal(out[2].card_hour, 10);
    assert_int_equal(out[3].card_hour, 20);
    assert_int_equal(tariff_storage_schedule(g, 3, NULL, 0, out), 3);
    assert_int_equal(tariff_storage_schedule(NULL, 0, r, 2, out), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_schedule_costs_nothing),
        cmocka_unit_test(test_time_before_the_first_price_is_free),
        cmocka_unit_test(test_a_change_inside_the_interval_splits_it_at_effective_at),
        cmocka_unit_test(test_several_changes_each_charge_their_own_piece),
        cmocka_unit_test(test_zero_length_interval_costs_nothing),
        cmocka_unit_test(test_reversed_interval_is_refused_with_out_zeroed),
        cmocka_unit_test(test_zero_cards_cost_nothing_and_negative_cards_are_refused),
        cmocka_unit_test(test_a_negative_price_is_refused),
        cmocka_unit_test(test_each_piece_is_floored_at_awkward_values),
        cmocka_unit_test(test_the_floor_is_per_piece_not_per_interval),
        cmocka_unit_test(test_due_never_falls_as_the_end_moves_on),
        cmocka_unit_test(test_overflow_of_a_piece_is_reported_with_out_zeroed),
        cmocka_unit_test(test_overflow_of_the_sum_of_pieces_is_reported_with_out_zeroed),
        cmocka_unit_test(test_worked_example_eight_mi450_for_three_hours_is_28_80),
        cmocka_unit_test(test_worked_example_eight_mi450_for_one_hour_is_9_60),
        cmocka_unit_test(test_a_piece_longer_than_int64_seconds_is_an_overflow),
        cmocka_unit_test(test_storage_a_whole_month_costs_price_times_size),
        cmocka_unit_test(test_storage_an_hour_is_floored),
        cmocka_unit_test(test_storage_a_price_change_splits_the_time),
        cmocka_unit_test(test_storage_bad_input_and_overflow),
        cmocka_unit_test(test_storage_due_is_monotonic),
        cmocka_unit_test(test_storage_schedule_merges_global_then_region),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
