/* test_apps.c: the marketplace's pure rules (domain/apps.c): what a call
 * costs (per-call and per-second only for answers below 400, tokens
 * floored together per 1000) and the scaler's target (ceil of demand over
 * the concurrency target within [min, max], down only after the window,
 * to min after idle). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "domain/apps.h"
#include "store/store.h"

static struct app app(void)
{
    struct app a;
    memset(&a, 0, sizeof a);
    a.price_request = 10000;  /* 0.01 */
    a.price_input_1k = 2000;  /* 0.002 */
    a.price_output_1k = 4000; /* 0.004 */
    a.price_second = 1000;    /* 0.001 */
    a.min_replicas = 0;
    a.max_replicas = 3;
    a.concurrency_target = 2;
    a.idle_seconds = 60;
    return a;
}

static void test_call_price(void **state)
{
    (void)state;
    struct app a = app();
    struct app_call c = {.status = 200, .input_tokens = 3, .output_tokens = 3, .duration_ms = 1500};
    /* 10000 + (3*2000 + 3*4000)/1000 + 1500*1000/1000 */
    assert_int_equal(app_call_price(&a, &c), 10000 + 18 + 1500);
    /* An error answer costs nothing, whatever tokens the replica claimed. */
    c.status = 500;
    assert_int_equal(app_call_price(&a, &c), 0);
    /* Stamped at admission: each price the lower of then and now. */
    c = (struct app_call){.status = 200, .input_tokens = 3, .output_tokens = 3, .duration_ms = 1500, .has_prices = 1,
                          .price_request = 5000, .price_input_1k = 9000, .price_output_1k = 1000, .price_second = 0};
    assert_int_equal(app_call_price(&a, &c), 5000 + (3 * 2000 + 3 * 1000) / 1000 + 0);
    c.has_prices = 0; /* an older gateway's record: today's prices */
    assert_int_equal(app_call_price(&a, &c), 10000 + 18 + 1500);
    /* Tokens floor once, together: 1 in + 1 out = 6 micro-yuan, not 2 + 4 floored apart. */
    a.price_input_1k = 999;
    a.price_output_1k = 1;
    c = (struct app_call){.status = 200, .input_tokens = 1, .output_tokens = 1};
    assert_int_equal(app_call_price(&a, &c), 10000 + 1);
    /* The largest inputs stay exact and positive. */
    a.price_input_1k = a.price_output_1k = a.price_request = a.price_second = 1000000000;
    c = (struct app_call){.status = 200, .input_tokens = APP_MAX_TOKENS, .output_tokens = APP_MAX_TOKENS,
                          .duration_ms = APP_MAX_DURATION_MS};
    assert_true(app_call_price(&a, &c) > 0);
}

static void test_scale_target(void **state)
{
    (void)state;
    struct app a = app();
    int64_t now = 1000;
    a.last_call_at = now;
    assert_int_equal(app_scale_target(&a, 1, 0, now, 30), 1); /* from zero on the first call */
    assert_int_equal(app_scale_target(&a, 5, 1, now, 30), 3); /* ceil(5/2) = 3 */
    assert_int_equal(app_scale_target(&a, 50, 3, now, 30), 3); /* never beyond max */
    /* Fewer would do: kept until demand has fit them for the window. */
    a.below_since = now - 10;
    assert_int_equal(app_scale_target(&a, 2, 3, now, 30), 3);
    a.below_since = now - 30;
    assert_int_equal(app_scale_target(&a, 2, 3, now, 30), 1);
    /* Quiet but not idle: kept; idle: to min. */
    a.below_since = 0;
    a.last_call_at = now - 59;
    assert_int_equal(app_scale_target(&a, 0, 2, now, 30), 2);
    a.last_call_at = now - 60;
    assert_int_equal(app_scale_target(&a, 0, 2, now, 30), 0);
    a.min_replicas = 1;
    assert_int_equal(app_scale_target(&a, 0, 2, now, 30), 1);
    assert_int_equal(app_scale_target(&a, 0, 0, now, 30), 1); /* min holds even idle */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_call_price),
        cmocka_unit_test(test_scale_target),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
