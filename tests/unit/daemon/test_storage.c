/* test_storage.c: storage billing below the billing loop (migration 0020):
 * the SQL of store_storage.c (prices by region, volumes' billing state,
 * deletions never put before a charge, known regions, statement lines),
 * the ledger's storage charge and owed storage, the storage schedule of a
 * region, and ledger verify's storage rules on rows corrupted on purpose. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "domain/ledger.h"
#include "gpurent/tariff.h"
#include "store_fixtures.h"

static char alice[ID_MAX];

static void setup_rows(void)
{
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
}

/* The breaches ledger verify finds; the text in *out (free it). */
static int verify(char **out)
{
    size_t len = 0;
    FILE *f = open_memstream(out, &len);
    assert_non_null(f);
    int breaches = ledger_verify(fx.s, f);
    fclose(f);
    return breaches;
}

static void test_storage_prices_by_region_oldest_first_and_a_repeat_replaces(void **state)
{
    setup_rows();
    assert_int_equal(store_storage_price_insert(fx.s, "", 500, 300000, 1), STORE_OK);
    assert_int_equal(store_storage_price_insert(fx.s, "eu", 900, 700000, 2), STORE_OK);
    assert_int_equal(store_storage_price_insert(fx.s, "eu", 200, 100000, 3), STORE_OK);
    assert_int_equal(store_storage_price_insert(fx.s, "eu", 900, 800000, 4), STORE_OK);
    struct price_point *pp;
    size_t n;
    assert_int_equal(store_storage_prices(fx.s, "eu", &pp, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(pp[0].effective_at, 200);
    assert_int_equal(pp[1].card_hour, 800000);
    free(pp);
    struct storage_price_row rows[8];
    assert_int_equal(store_storage_price_history(fx.s, NULL, rows, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(rows[0].region, "");
    assert_string_equal(rows[1].region, "eu");
    assert_int_equal(rows[2].created_at, 4);
    assert_int_equal(store_storage_price_history(fx.s, "", rows, 8, &n), STORE_OK);
    assert_int_equal(n, 1);
    /* The schema refuses a negative price and an over-long region. */
    assert_int_equal(store_storage_price_insert(fx.s, "", 1000, -1, 5), STORE_ERROR);
    char longr[80];
    memset(longr, 'r', 64);
    longr[64] = '\0';
    assert_int_equal(store_storage_price_insert(fx.s, longr, 1000, 1, 5), STORE_ERROR);
    /* A region is known once priced (or a live node is in it). */
    assert_int_equal(store_region_known(fx.s, "eu"), 1);
    assert_int_equal(store_region_known(fx.s, "us"), 0);
}

static void test_volumes_are_billable_only_once_a_price_above_zero_exists(void **state)
{
    setup_rows();
    char vid[ID_MAX];
    fx_volume(fx.s, alice, "data", vid);
    struct storage_billable *v;
    size_t n;
    assert_int_equal(store_storage_billables(fx.s, alice, &v, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(v);
    assert_int_equal(store_storage_price_insert(fx.s, "", 0, 0, 1), STORE_OK);
    assert_int_equal(store_storage_billables_all(fx.s, &v, &n), STORE_OK);
    assert_int_equal(n, 0); /* a price of 0 bills nothing */
    free(v);
    assert_int_equal(store_storage_price_insert(fx.s, "far", 0, 1, 1), STORE_OK);
    assert_int_equal(store_storage_billables(fx.s, alice, &v, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].volume_id, vid);
    assert_string_equal(v[0].region, "");
    assert_int_equal(v[0].size_gb, 100);
    assert_int_equal(v[0].created_at, 100);
    assert_int_equal(v[0].deleted_at, 0);
    free(v);
    /* Billed records the money and keeps the latest second. */
    assert_int_equal(store_storage_billed(fx.s, vid, 50, 700, 0), STORE_OK);
    assert_int_equal(store_storage_billed(fx.s, vid, 60, 0, 0), STORE_OK);
    assert_int_equal(store_storage_billables(fx.s, alice, &v, &n), STORE_OK);
    assert_int_equal(v[0].billed, 60);
    assert_int_equal(v[0].billed_to, 700);
    free(v);
    assert_int_equal(store_storage_billed_until(fx.s, ""), 700);
    assert_int_equal(store_storage_billed_until(fx.s, "far"), 0);
    /* A deletion at 300 (a clock stepped back) is put at 700. */
    assert_int_equal(store_volume_delete(fx.s, alice, vid, 300), STORE_OK);
    assert_int_equal(fx_sql_int(fx.s, "SELECT deleted_at FROM volumes WHERE id = ?1", vid), 700);
    /* Settled, it is billed no more. */
    assert_int_equal(store_storage_billed(fx.s, vid, 60, 0, 1), STORE_OK);
    assert_int_equal(store_storage_billables(fx.s, alice, &v, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(v);
    assert_int_equal(store_storage_billed(fx.s, "vol_nosuch", 1, 1, 0), STORE_NOT_FOUND);
}

/* One GB-month (30 days) of 100 GB at 0.30 is 30.00, charged from credit
 * then cash as one 'storage' transaction naming the volume. */
static void test_a_storage_charge_names_the_volume_and_verify_holds(void **state)
{
    setup_rows();
    char vid[ID_MAX], top[ID_MAX], grt[ID_MAX];
    int dup;
    fx_volume(fx.s, alice, "data", vid);
    assert_int_equal(store_storage_price_insert(fx.s, "", 0, 300000, 1), STORE_OK);
    assert_int_equal(ledger_grant(fx.s, alice, "admin", 10000000, 0, 100, "gift", grt), STORE_OK);
    assert_int_equal(ledger_topup(fx.s, alice, "pay-1", 50000000, "admin", 100, top, &dup), STORE_OK);
    int64_t owed;
    int64_t end = 100 + TARIFF_MONTH_SECONDS;
    assert_int_equal(ledger_storage_owed(fx.s, alice, end, &owed), STORE_OK);
    assert_int_equal(owed, 30000000);
    int64_t burn;
    assert_int_equal(ledger_storage_burn(fx.s, alice, end, &burn), STORE_OK);
    assert_int_equal(burn, INT64_C(300000) * 100 * 3600 / TARIFF_MONTH_SECONDS);
    assert_int_equal(ledger_charge_storage(fx.s, alice, owed, end, vid, "storage, 100 GB"), STORE_OK);
    assert_int_equal(store_storage_billed(fx.s, vid, owed, end, 0), STORE_OK);
    int64_t txn = fx_last_txn(fx.s);
    assert_int_equal(fx_sql_int_n(fx.s, "SELECT count(*) FROM ledger_transactions WHERE id = ?1 AND kind = 'storage'"
                                        " AND volume_id IS NOT NULL AND interval_id IS NULL",
                                  txn),
                     1);
    assert_int_equal(store_account_balance(fx.s, "revenue"), 30000000);
    char grant_acct[48], cash_acct[48];
    snprintf(grant_acct, sizeof grant_acct, "grant:%s", grt);
    snprintf(cash_acct, sizeof cash_acct, "cash:%s", alice);
    assert_int_equal(store_account_balance(fx.s, grant_acct), 0);
    assert_int_equal(store_account_balance(fx.s, cash_acct), 30000000);
    assert_int_equal(ledger_storage_owed(fx.s, alice, end, &owed), STORE_OK);
    assert_int_equal(owed, 0);
    struct storage_line lines[4];
    size_t n;
    assert_int_equal(store_storage_lines(fx.s, alice, 0, end + 1, lines, 4, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(lines[0].volume_id, vid);
    assert_int_equal(lines[0].cost, 30000000);
    assert_int_equal(lines[0].from_credit, 10000000);
    assert_int_equal(lines[0].from_cash, 20000000);
    char *text = NULL;
    int breaches = verify(&text);
    if (breaches != 0)
        fail_msg("ledger verify: %d\n%s", breaches, text);
    free(text);
    /* Deleted at its last charge and settled: exactly its tariff. */
    assert_int_equal(store_volume_delete(fx.s, alice, vid, end), STORE_OK);
    assert_int_equal(store_storage_billed(fx.s, vid, 30000000, 0, 1), STORE_OK);
    breaches = verify(&text);
    if (breaches != 0)
        fail_msg("ledger verify: %d\n%s", breaches, text);
    free(text);
}

static void test_verify_finds_storage_billed_other_than_its_tariff(void **state)
{
    setup_rows();
    char vid[ID_MAX], top[ID_MAX];
    int dup;
    fx_volume(fx.s, alice, "data", vid);
    assert_int_equal(store_storage_price_insert(fx.s, "", 0, 300000, 1), STORE_OK);
    assert_int_equal(ledger_topup(fx.s, alice, "pay-1", 50000000, "admin", 100, top, &dup), STORE_OK);
    /* 2.00 charged at second 1000: far over 900 s of 100 GB. */
    assert_int_equal(ledger_charge_storage(fx.s, alice, 2000000, 1000, vid, "too much"), STORE_OK);
    char *text = NULL;
    assert_int_equal(verify(&text), 1); /* storage_billed says 0, the revenue 2.00 */
    assert_non_null(strstr(text, "volume's storage revenue differs"));
    free(text);
    assert_int_equal(store_storage_billed(fx.s, vid, 2000000, 1000, 0), STORE_OK);
    assert_int_equal(verify(&text), 1);
    assert_non_null(strstr(text, "volume's storage billed beyond its tariff"));
    free(text);
    /* Settled while it exists, and settled short of its tariff. */
    assert_int_equal(store_storage_billed(fx.s, vid, 2000000, 1000, 1), STORE_OK);
    assert_true(verify(&text) >= 2);
    assert_non_null(strstr(text, "settled while it exists"));
    assert_non_null(strstr(text, "deleted volume's storage billed other than its tariff"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        fx_test(test_storage_prices_by_region_oldest_first_and_a_repeat_replaces),
        fx_test(test_volumes_are_billable_only_once_a_price_above_zero_exists),
        fx_test(test_a_storage_charge_names_the_volume_and_verify_holds),
        fx_test(test_verify_finds_storage_billed_other_than_its_tariff),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
