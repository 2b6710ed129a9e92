/* test_store_apps.c: the marketplace's store (store_apps.c) and settlement
 * (app_call_settle) on a migrated database: apps by slug and id, the
 * public list against a publisher's, access, events, demand with busy
 * replicas, a call settled once, balanced, checked by ledger verify, and
 * each gateway's last committed report (0047). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_fixtures.h"

#include "domain/apps.h"
#include "domain/ledger.h"

static void fx_app(struct store *s, const char *publisher, const char *slug, const char *visibility, struct app *a)
{
    memset(a, 0, sizeof *a);
    assert_int_equal(id_new("app", a->id), 0);
    snprintf(a->slug, sizeof a->slug, "%s", slug);
    snprintf(a->name, sizeof a->name, "Echo");
    snprintf(a->publisher_id, sizeof a->publisher_id, "%s", publisher);
    snprintf(a->image, sizeof a->image, "rocm/pytorch:2.3-rocm6.2");
    snprintf(a->gpu_type, sizeof a->gpu_type, "MI450");
    snprintf(a->visibility, sizeof a->visibility, "%s", visibility);
    a->port = 8000;
    a->cards_per_replica = a->max_replicas = a->concurrency_target = 1;
    a->idle_seconds = 60;
    a->price_request = 10000;
    a->price_output_1k = 4000;
    a->created_at = a->updated_at = 100;
    assert_int_equal(store_app_insert(s, a), STORE_OK);
}

static void test_apps_rows(void **state)
{
    (void)state;
    char pub[ID_MAX], other[ID_MAX];
    fx_user(fx.s, "pub@example.com", ROLE_USER, pub);
    fx_user(fx.s, "other@example.com", ROLE_USER, other);
    struct app a, b, got;
    fx_app(fx.s, pub, "echo-a", "public", &a);
    fx_app(fx.s, pub, "echo-b", "private", &b);
    assert_int_equal(store_app_insert(fx.s, &a), STORE_CONFLICT); /* the slug once */
    assert_int_equal(store_app_get(fx.s, "echo-a", &got), STORE_OK);
    assert_string_equal(got.id, a.id);
    assert_string_equal(got.command, "[]");
    assert_int_equal(got.price_request, 10000);
    store_app_free(&got);
    struct app *list;
    size_t n;
    assert_int_equal(store_app_list(fx.s, NULL, -1, "", 10, &list, &n), STORE_OK);
    assert_int_equal(n, 1); /* the public one */
    store_app_free(&list[0]);
    free(list);
    assert_int_equal(store_app_list(fx.s, pub, -1, "", 10, &list, &n), STORE_OK);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++)
        store_app_free(&list[i]);
    free(list);
    /* Access, events. */
    assert_int_equal(store_app_access_add(fx.s, b.id, other), STORE_OK);
    char *json = NULL;
    assert_int_equal(store_app_access_json(fx.s, b.id, &json), STORE_OK);
    assert_non_null(strstr(json, other));
    free(json);
    assert_int_equal(store_app_event(fx.s, a.id, 200, "scale_refused", "quota"), STORE_OK);
    assert_int_equal(store_app_last_event_is(fx.s, a.id, "scale_refused", 150), 1);
    assert_int_equal(store_app_last_event_is(fx.s, a.id, "scale_refused", 250), 0);
    assert_int_equal(store_app_last_event_is(fx.s, a.id, "scale_up", 0), 0);
    /* Demand and busy replicas; a stale report does not count. */
    assert_int_equal(store_app_demand_put(fx.s, a.id, "gw-1", 3, 2, "[\"ins_aaaaaaaaaaaaaaaaaaaa\"]", 300), STORE_OK);
    assert_int_equal(store_app_demand_put(fx.s, a.id, "gw-2", 1, 0, NULL, 100), STORE_OK);
    assert_int_equal(store_app_demand(fx.s, a.id, 290), 5);
    assert_int_equal(store_app_demand(fx.s, a.id, 0), 6);
    assert_int_equal(store_app_replica_busy(fx.s, a.id, "ins_aaaaaaaaaaaaaaaaaaaa", 290), 1);
    assert_int_equal(store_app_replica_busy(fx.s, a.id, "ins_bbbbbbbbbbbbbbbbbbbb", 290), 0);
    assert_int_equal(store_app_replica_busy(fx.s, a.id, "ins_aaaaaaaaaaaaaaaaaaaa", 301), 0);
    /* Delete: gone by slug, there by id (late calls still settle). */
    assert_int_equal(store_app_delete(fx.s, b.id, 400), STORE_OK);
    assert_int_equal(store_app_delete(fx.s, b.id, 400), STORE_NOT_FOUND);
    assert_int_equal(store_app_get(fx.s, "echo-b", &got), STORE_NOT_FOUND);
    assert_int_equal(store_app_get_by_id(fx.s, b.id, &got), STORE_OK);
    assert_int_equal(got.deleted_at, 400);
    store_app_free(&got);
}

struct settle_ctx {
    struct app_call c;
    int duplicate;
};

static int settle_txn(struct store *s, void *vctx)
{
    struct settle_ctx *ctx = vctx;
    return app_call_settle(s, &ctx->c, 500, &ctx->duplicate);
}

static void test_call_settled_once_and_balanced(void **state)
{
    (void)state;
    char pub[ID_MAX], con[ID_MAX], grant[ID_MAX];
    fx_user(fx.s, "pub@example.com", ROLE_USER, pub);
    fx_user(fx.s, "con@example.com", ROLE_USER, con);
    struct app a;
    fx_app(fx.s, pub, "echo-a", "public", &a);
    assert_int_equal(ledger_grant(fx.s, con, "admin", 1000000, 0, 100, "test", grant), STORE_OK);
    struct settle_ctx ctx = {.c = {.id = "gw-1-call0001", .status = 200, .input_tokens = 5, .output_tokens = 7,
                                   .completed = 1}};
    snprintf(ctx.c.app_id, sizeof ctx.c.app_id, "%s", a.id);
    snprintf(ctx.c.consumer_id, sizeof ctx.c.consumer_id, "%s", con);
    snprintf(ctx.c.key_id, sizeof ctx.c.key_id, "key_aaaaaaaaaaaaaaaaaaaa");
    snprintf(ctx.c.gateway_id, sizeof ctx.c.gateway_id, "gw-1");
    assert_int_equal(store_txn(fx.s, settle_txn, &ctx), STORE_OK);
    assert_int_equal(ctx.duplicate, 0);
    int64_t charge = 10000 + 7 * 4000 / 1000, fee = charge * daemon_config->app_platform_fee_ppm / 1000000;
    assert_int_equal(ctx.c.charge, charge);
    assert_int_equal(ctx.c.fee, fee);
    assert_int_equal(ctx.c.earning, charge - fee);
    char cash[48];
    snprintf(cash, sizeof cash, "cash:%s", pub);
    assert_int_equal(store_account_balance(fx.s, cash), charge - fee);
    /* Again: a duplicate, nothing posted. */
    int64_t txns = fx_last_txn(fx.s);
    assert_int_equal(store_txn(fx.s, settle_txn, &ctx), STORE_OK);
    assert_int_equal(ctx.duplicate, 1);
    assert_int_equal(fx_last_txn(fx.s), txns);
    assert_int_equal(fx_sql_int(fx.s, "SELECT transaction_id FROM app_calls WHERE id = ?1", "gw-1-call0001"), txns);
    char *json = NULL;
    assert_int_equal(store_app_stats_json(fx.s, a.id, 0, 1000, &json), STORE_OK);
    assert_non_null(strstr(json, "\"calls\":1"));
    free(json);
    assert_int_equal(store_app_usage_json(fx.s, con, 0, 1000, &json), STORE_OK);
    assert_non_null(strstr(json, "\"output_tokens\":7"));
    free(json);
    assert_int_equal(ledger_verify(fx.s, stderr), 0);
}

/* A gateway's row keeps its run's highest report, whatever order they
 * commit in; a new run replaces it; rows older than forget_before go, and
 * the list gives those since its bound. */
static void test_gateway_reports_keep_each_runs_highest(void **state)
{
    (void)state;
    char *json = NULL;
    assert_int_equal(store_gateway_report_put(fx.s, "gw-2", "run-c", 5, 50, 0), STORE_OK);
    assert_int_equal(store_gateway_report_put(fx.s, "gw-1", "run-a", 3, 100, 0), STORE_OK);
    assert_int_equal(store_gateway_report_put(fx.s, "gw-1", "run-a", 2, 101, 0), STORE_OK); /* a slow one, late */
    assert_int_equal(store_gateway_reported_json(fx.s, 0, &json), STORE_OK);
    assert_non_null(strstr(json, "{\"gateway_id\":\"gw-1\",\"run\":\"run-a\",\"seq\":3}"));
    assert_non_null(strstr(json, "{\"gateway_id\":\"gw-2\",\"run\":\"run-c\",\"seq\":5}"));
    free(json);
    assert_int_equal(store_gateway_reported_json(fx.s, 60, &json), STORE_OK);
    assert_null(strstr(json, "gw-2"));
    free(json);
    assert_int_equal(store_gateway_report_put(fx.s, "gw-1", "run-b", 1, 200, 60), STORE_OK); /* restarted */
    assert_int_equal(store_gateway_reported_json(fx.s, 0, &json), STORE_OK);
    assert_string_equal(json, "[{\"gateway_id\":\"gw-1\",\"run\":\"run-b\",\"seq\":1}]");
    free(json);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        fx_test(test_apps_rows),
        fx_test(test_call_settled_once_and_balanced),
        fx_test(test_gateway_reports_keep_each_runs_highest),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
