/* test_store_reports.c: what the store reads back about money and the
 * fleet: a user's transactions, usage, funds before a time and burn rate
 * (store_money_reports.c), the money totals of /metrics (store_metrics.c),
 * the billing team's report views and online backups (store_reports.c),
 * and ledger verify's rules on a clean and a corrupted ledger
 * (store_verify.c, audit/ledger_verify.c). Money is moved with the ledger's
 * own calls, so the reports are read from a ledger as the daemon writes it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_fixtures.h"

#define DAY 86400
#define DAY0 (20000 * DAY) /* 2024-10-04T00:00:00Z */

static char alice[ID_MAX], bob[ID_MAX];

static void setup_rows(void)
{
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    fx_tst_type(fx.s);
}

static void topup(const char *user, const char *payment, int64_t amount, int64_t at)
{
    char id[ID_MAX];
    int dup;
    assert_int_equal(ledger_topup(fx.s, user, payment, amount, "admin", at, id, &dup), STORE_OK);
}

static void grant(const char *user, int64_t amount, int64_t expires_at, int64_t at, char id[ID_MAX])
{
    assert_int_equal(ledger_grant(fx.s, user, "admin", amount, expires_at, at, "test grant", id), STORE_OK);
}

/* Charges the open interval of instance `amount` at `at`, as billing does. */
static void bill(const char *instance, int64_t amount, int64_t at)
{
    struct billable b;
    assert_int_equal(store_interval_get_open(fx.s, instance, &b), STORE_OK);
    assert_int_equal(ledger_charge(fx.s, b.user_id, amount, at, b.instance_id, b.id, "usage"), STORE_OK);
    assert_int_equal(store_interval_billed(fx.s, b.id, b.billed + amount, 0, -1), STORE_OK);
}

static void refund(const char *instance, int64_t amount, int64_t at)
{
    struct billable b;
    assert_int_equal(store_interval_get_open(fx.s, instance, &b), STORE_OK);
    assert_int_equal(ledger_refund(fx.s, &b, amount, at, "test"), STORE_OK);
    assert_int_equal(store_interval_billed(fx.s, b.id, b.billed - amount, 0, -1), STORE_OK);
}

/* ---------------------------------------------------------------- a user's money */

static void test_transactions_show_each_movement_with_its_credit_and_cash_split(void **state)
{
    setup_rows();
    char g[ID_MAX];
    topup(alice, "pay-1", 1000, 100);
    grant(alice, 500, 0, 200, g);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 250, &in, &iv);
    bill(in.id, 700, 300); /* grant 500, cash 200 */
    refund(in.id, 100, 400);
    topup(bob, "pay-2", 5, 150);
    struct ledger_txn_row t[8];
    size_t n;
    struct ledger_txn_filter all = {.user_id = alice, .from = 0, .to = INT64_MAX};
    assert_int_equal(store_ledger_transactions(fx.s, &all, t, 8, &n), STORE_OK);
    assert_int_equal(n, 4);
    assert_string_equal(t[0].kind, "topup");
    assert_int_equal(t[0].user_delta, 1000);
    assert_int_equal(t[0].cash_delta, 1000);
    assert_int_equal(t[0].credit_delta, 0);
    assert_string_equal(t[1].kind, "grant");
    assert_int_equal(t[1].credit_delta, 500);
    assert_string_equal(t[1].reason, "test grant");
    assert_string_equal(t[2].kind, "usage");
    assert_int_equal(t[2].at, 300);
    assert_int_equal(t[2].user_delta, -700);
    assert_int_equal(t[2].credit_delta, -500);
    assert_int_equal(t[2].cash_delta, -200);
    assert_string_equal(t[2].instance_id, in.id);
    assert_string_equal(t[3].kind, "refund");
    assert_int_equal(t[3].user_delta, 100);
    assert_int_equal(t[3].cash_delta, 100);
    struct ledger_txn_filter usage = {.user_id = alice, .kind = "usage", .from = 0, .to = INT64_MAX};
    assert_int_equal(store_ledger_transactions(fx.s, &usage, t, 8, &n), STORE_OK);
    assert_int_equal(n, 1);
    struct ledger_txn_filter window = {.user_id = alice, .from = 200, .to = 400};
    assert_int_equal(store_ledger_transactions(fx.s, &window, t, 8, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(t[0].kind, "grant");
    struct ledger_txn_filter page = {.user_id = alice, .from = 0, .to = INT64_MAX};
    assert_int_equal(store_ledger_transactions(fx.s, &page, t, 3, &n), STORE_OK);
    assert_int_equal(n, 3);
    page.after_id = t[2].id;
    assert_int_equal(store_ledger_transactions(fx.s, &page, t, 3, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(t[0].kind, "refund");
}

static void test_usage_clips_running_time_to_the_period_by_instance_or_type(void **state)
{
    setup_rows();
    topup(alice, "pay-1", 10000000, 10);
    struct instance a, b, c;
    int64_t ia, ib, ic;
    fx_running(fx.s, alice, FX_TST, 2, 900, &a, &ia);
    fx_running(fx.s, alice, FX_TST, 1, 1500, &b, &ib);
    fx_running(fx.s, alice, "MI450", 1, 1200, &c, &ic);
    bill(a.id, 5000, 950);  /* before the period */
    bill(a.id, 7000, 1100); /* within it */
    bill(c.id, 300, 1300);
    assert_int_equal(store_interval_close(fx.s, a.id, 2000, "stop"), STORE_OK);
    assert_int_equal(store_interval_close(fx.s, c.id, 1300, "stop"), STORE_OK);
    struct usage_row u[8];
    size_t n;
    assert_int_equal(store_usage(fx.s, alice, 1000, 1800, 1700, 0, u, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(u[i].key, a.id) == 0) {
            assert_int_equal(u[i].card_seconds, 2 * 800);
            assert_int_equal(u[i].cost, 7000);
            assert_int_equal(u[i].from_cash, 7000);
            assert_string_equal(u[i].gpu_model, FX_TST);
        } else if (strcmp(u[i].key, b.id) == 0) {
            assert_int_equal(u[i].card_seconds, 200); /* open: counted up to now */
            assert_int_equal(u[i].cost, 0);
        } else {
            assert_string_equal(u[i].key, c.id);
            assert_int_equal(u[i].card_seconds, 100);
            assert_int_equal(u[i].cost, 300);
        }
    }
    assert_int_equal(store_usage(fx.s, alice, 1000, 1800, 1700, 1, u, 8, &n), STORE_OK);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(u[i].key, FX_TST) == 0) {
            assert_int_equal(u[i].card_seconds, 1800);
            assert_int_equal(u[i].cost, 7000);
        } else {
            assert_string_equal(u[i].key, "MI450");
            assert_int_equal(u[i].card_seconds, 100);
        }
    }
    assert_int_equal(store_usage(fx.s, bob, 1000, 1800, 1700, 0, u, 8, &n), STORE_OK);
    assert_int_equal(n, 0);
    assert_int_equal(store_usage(fx.s, alice, 1000, 1800, 1700, 0, u, 1, &n), STORE_OK);
    assert_int_equal(n, 1);
}

/* GET /v1/usage's cost is what was finally charged in the period: a refund
 * given in it lowers it, as the report views net refunds out. */
static void test_usage_cost_nets_refunds_out(void **state)
{
    setup_rows();
    topup(alice, "pay-1", 100000, 10);
    struct instance a;
    int64_t ia;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &a, &ia);
    bill(a.id, 5000, 1100);
    refund(a.id, 2000, 1200);
    struct usage_row u[4];
    size_t n;
    assert_int_equal(store_usage(fx.s, alice, 1000, 2000, 1300, 0, u, 4, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(u[0].cost, 3000);
}

static void test_funds_before_are_the_ledger_as_it_stood(void **state)
{
    setup_rows();
    char g[ID_MAX];
    topup(alice, "pay-1", 1000, 100);
    grant(alice, 500, 350, 200, g);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 250, &in, &iv);
    bill(in.id, 300, 300);
    assert_int_equal(ledger_expire_grants(fx.s, alice, 400), STORE_OK);
    assert_int_equal(store_user_funds_before(fx.s, alice, 100), 0);
    assert_int_equal(store_user_funds_before(fx.s, alice, 101), 1000);
    assert_int_equal(store_user_funds_before(fx.s, alice, 201), 1500);
    assert_int_equal(store_user_funds_before(fx.s, alice, 301), 1200);
    assert_int_equal(store_user_funds_before(fx.s, alice, 1000), 1000); /* the rest expired at 350 */
    assert_int_equal(store_user_funds_before(fx.s, bob, 1000), 0);
}

static void test_burn_rate_is_price_times_cards_of_what_runs(void **state)
{
    setup_rows();
    struct instance a, b, c;
    int64_t ia, ib, ic;
    fx_running(fx.s, alice, FX_TST, 2, 100, &a, &ia);
    fx_running(fx.s, alice, "MI450", 1, 100, &b, &ib);
    fx_running(fx.s, alice, FX_TST, 8, 100, &c, &ic);
    assert_int_equal(store_interval_close(fx.s, c.id, 200, "stop"), STORE_OK);
    assert_int_equal(store_user_burn_rate(fx.s, alice, 300), 2 * 3600000 + 1200000);
    assert_int_equal(store_price_insert(fx.s, FX_TST, 1000, 0, 50), STORE_OK);
    assert_int_equal(store_user_burn_rate(fx.s, alice, 999), 2 * 3600000 + 1200000);
    assert_int_equal(store_user_burn_rate(fx.s, alice, 1000), 1200000);
    assert_int_equal(store_user_burn_rate(fx.s, bob, 300), 0);
}

/* ---------------------------------------------------------------- /metrics money */

static void test_money_totals_add_up_every_kind_of_movement(void **state)
{
    setup_rows();
    char g1[ID_MAX], g2[ID_MAX];
    topup(alice, "pay-1", 1000, 10);
    topup(bob, "pay-2", 20, 10);
    grant(alice, 500, 0, 10, g1);
    grant(alice, 40, 350, 10, g2);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 100, &in, &iv);
    bill(in.id, 600, 300); /* grant 40 (soonest), grant 500, cash 60 */
    refund(in.id, 100, 400); /* cash 60, then grant 40 back to g1 */
    assert_int_equal(ledger_expire_grants(fx.s, alice, 500), STORE_OK); /* g2 had nothing left */
    struct money_totals m;
    assert_int_equal(store_metrics_money(fx.s, &m), STORE_OK);
    assert_int_equal(m.revenue, 600);
    assert_int_equal(m.refunds, 100);
    assert_int_equal(m.credits_refunded, 40);
    assert_int_equal(m.credits_granted, 540);
    assert_int_equal(m.credits_spent, 540);
    assert_int_equal(m.credits_expired, 0);
    assert_int_equal(m.topups, 1020);
    assert_int_equal(m.credit_outstanding, 40);
    assert_int_equal(m.cash_held, 1000 + 20);
}

/* ---------------------------------------------------------------- reports */

struct table {
    int n_cols;
    char header[512];      /* names joined by ',' */
    int rows;
    char row[8][512];      /* the first rows, values joined by '|' ("NULL" for none) */
    int ints[8][32];       /* is_int of those rows */
};

static void collect(void *ctx, int n, const char *const *names, const char *const *values, const int *is_int)
{
    struct table *t = ctx;
    if (!values) {
        t->n_cols = n;
        for (int c = 0; c < n; c++)
            snprintf(t->header + strlen(t->header), sizeof t->header - strlen(t->header), "%s%s", c ? "," : "",
                     names[c]);
        return;
    }
    if (t->rows < 8) {
        char *r = t->row[t->rows];
        for (int c = 0; c < n; c++) {
            snprintf(r + strlen(r), 512 - strlen(r), "%s%s", c ? "|" : "", values[c] ? values[c] : "NULL");
            if (c < 32)
                t->ints[t->rows][c] = is_int[c];
        }
    }
    t->rows++;
}

static void test_report_names_are_eleven_then_null(void **state)
{
    static const char *const want[] = {"daily-revenue",       "usage",
                                       "utilisation",         "credit-liability",
                                       "topups",              "admin-actions",
                                       "storage",             "reservation-revenue",
                                       "reservation-utilisation", "reservation-refunds",
                                       "account-events"};
    for (size_t i = 0; i < 11; i++)
        assert_string_equal(store_report_name(i), want[i]);
    assert_null(store_report_name(11));
    assert_null(store_report_name(1000));
}

static void test_every_report_runs_on_an_empty_ledger_with_its_header(void **state)
{
    for (size_t i = 0; store_report_name(i); i++) {
        struct table t;
        memset(&t, 0, sizeof t);
        assert_int_equal(store_report(fx.s, store_report_name(i), NULL, NULL, collect, &t), STORE_OK);
        assert_true(t.n_cols >= 5);
        assert_non_null(strstr(t.header, "day"));
        assert_int_equal(t.rows, 0);
    }
    struct table t;
    memset(&t, 0, sizeof t);
    assert_int_equal(store_report(fx.s, "no-such-report", NULL, NULL, collect, &t), STORE_NOT_FOUND);
    assert_int_equal(t.n_cols, 0);
}

static void test_daily_revenue_nets_refunds_per_day_and_type(void **state)
{
    setup_rows();
    char g[ID_MAX];
    topup(alice, "pay-1", 100000, DAY0);
    grant(alice, 1000, 0, DAY0, g);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, DAY0, &in, &iv);
    bill(in.id, 5000, DAY0 + 100);        /* credit 1000, cash 4000 */
    refund(in.id, 500, DAY0 + 200);       /* cash */
    bill(in.id, 3000, DAY0 + DAY + 100);  /* the next day, cash */
    struct table t;
    memset(&t, 0, sizeof t);
    assert_int_equal(store_report(fx.s, "daily-revenue", NULL, NULL, collect, &t), STORE_OK);
    assert_string_equal(t.header, "day,gpu_type,revenue_micro,paid_by_credit_micro,paid_by_cash_micro,transactions");
    assert_int_equal(t.rows, 2);
    assert_string_equal(t.row[0], "2024-10-04|TST|4500|1000|3500|2");
    assert_string_equal(t.row[1], "2024-10-05|TST|3000|0|3000|1");
    assert_int_equal(t.ints[0][2], 1);
    assert_int_equal(t.ints[0][0], 0);
    memset(&t, 0, sizeof t);
    assert_int_equal(store_report(fx.s, "daily-revenue", "2024-10-05", NULL, collect, &t), STORE_OK);
    assert_int_equal(t.rows, 1);
    memset(&t, 0, sizeof t);
    assert_int_equal(store_report(fx.s, "daily-revenue", NULL, "2024-10-05", collect, &t), STORE_OK);
    assert_int_equal(t.rows, 1);
    assert_int_equal(strncmp(t.row[0], "2024-10-04|", 11), 0);
}

static void test_topups_and_credit_liability_reports_list_their_rows(void **state)
{
    setup_rows();
    char g[ID_MAX];
    topup(alice, "pay-1", 700, DAY0 + 5);
    grant(alice, 900, DAY0 + 3 * DAY, DAY0, g);
    struct table t;
    memset(&t, 0, sizeof t);
    assert_int_equal(store_report(fx.s, "topups", "2024-10-04", "2024-10-05", collect, &t), STORE_OK);
    assert_int_equal(t.rows, 1);
    assert_non_null(strstr(t.row[0], "alice@example.com"));
    assert_non_null(strstr(t.row[0], "|pay-1|admin|700"));
    memset(&t, 0, sizeof t);
    assert_int_equal(store_report(fx.s, "credit-liability", NULL, NULL, collect, &t), STORE_OK);
    assert_int_equal(t.rows, 1);
    assert_int_equal(strncmp(t.row[0], "2024-10-07|", 11), 0);
    assert_non_null(strstr(t.row[0], "|900|900|"));
}

/* ---------------------------------------------------------------- verify */

struct breaches {
    int n;
    char what[16][128];
    char id[16][64];
};

static void note(void *ctx, const char *what, const char *id, const char *detail)
{
    struct breaches *b = ctx;
    (void)detail;
    if (b->n < 16) {
        snprintf(b->what[b->n], sizeof b->what[0], "%s", what);
        snprintf(b->id[b->n], sizeof b->id[0], "%s", id ? id : "(cannot check)");
    }
    b->n++;
}

/* A small but complete ledger: a top-up, two grants, usage, a refund, an
 * expiry, and an interval settled at exactly its tariff. */
static void busy_ledger(void)
{
    setup_rows();
    char g1[ID_MAX], g2[ID_MAX];
    topup(alice, "pay-1", 100000, 10);
    grant(alice, 500, 0, 10, g1);
    grant(alice, 40, 102, 10, g2); /* expired before the charge: never spent */
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 100, &in, &iv);
    bill(in.id, 3 * FX_TST_PER_SECOND, 103);   /* g1 500, cash 2500 */
    refund(in.id, 1 * FX_TST_PER_SECOND, 104); /* back to cash */
    assert_int_equal(ledger_expire_grants(fx.s, alice, 500), STORE_OK); /* voids g2's 40 */
    assert_int_equal(ledger_close_interval(fx.s, in.id, 102, "stop", 600), STORE_OK);
    struct billable *b;
    size_t n;
    assert_int_equal(store_billables(fx.s, alice, &b, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(b[0].billed, 2 * FX_TST_PER_SECOND);
    assert_int_equal(store_interval_billed(fx.s, b[0].id, b[0].billed, 1, -1), STORE_OK);
    free(b);
    assert_int_equal(fx_sql_int(fx.s, "SELECT count(*) FROM ledger_transactions WHERE kind = 'expiry'", NULL), 1);
}

static char *verify_text(int *breaches)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    *breaches = ledger_verify(fx.s, out);
    fclose(out);
    return text;
}

static void test_verify_finds_nothing_on_a_clean_ledger(void **state)
{
    busy_ledger();
    struct breaches b = {0};
    assert_int_equal(store_verify_rules(fx.s, note, &b), 0);
    assert_int_equal(b.n, 0);
    int n;
    char *text = verify_text(&n);
    if (n != 0)
        fail_msg("%s", text);
    assert_string_equal(text, "");
    free(text);
}

static void test_verify_names_each_kind_of_corruption(void **state)
{
    busy_ledger();
    static const struct {
        const char *sql;   /* the corruption */
        const char *what;  /* a rule it must break */
    } cases[] = {
        {"UPDATE ledger_accounts SET balance = balance + 1 WHERE id = 'revenue'",
         "cached balance differs from the sum of postings"},
        {"UPDATE ledger_accounts SET balance = balance + 1 WHERE id = 'revenue'", "money exists outside the ledger"},
        {"UPDATE ledger_postings SET amount = amount + 1 WHERE id = (SELECT max(id) FROM ledger_postings)",
         "transaction does not balance"},
        {"DELETE FROM ledger_postings WHERE transaction_id = (SELECT min(id) FROM ledger_transactions)"
         " AND account_id = 'payments'",
         "transaction has fewer than two postings"},
        {"UPDATE credit_grants SET remaining = remaining + 1 WHERE voided_at IS NULL",
         "grant's remaining differs from its account"},
        {"UPDATE credit_grants SET remaining = 1 WHERE voided_at IS NOT NULL", "voided grant still has money"},
        {"UPDATE ledger_postings SET grant_id = NULL WHERE account_id LIKE 'grant:%'",
         "grant leg does not name its grant"},
        {"UPDATE running_intervals SET billed = billed + 1", "interval's revenue differs from what it says was billed"},
        {"UPDATE running_intervals SET ended_at = NULL", "interval settled while still open"},
        {"UPDATE topups SET amount = amount + 1", "top-up differs from the cash it added"},
        {"UPDATE credit_grants SET amount = amount + 1 WHERE voided_at IS NULL", "grant overspent or never funded"},
        {"UPDATE ledger_transactions SET interval_id = NULL WHERE kind = 'refund'",
         "refund names no interval or moves other than revenue back to its payers"},
        {"UPDATE ledger_postings SET amount = -amount WHERE account_id LIKE 'cash:%'"
         " AND transaction_id = (SELECT min(id) FROM ledger_transactions)",
         "user account went below zero"},
        {"UPDATE ledger_postings SET amount = 5000 WHERE account_id LIKE 'cash:%'"
         " AND transaction_id = (SELECT id FROM ledger_transactions WHERE kind = 'refund')",
         "account refunded more than it paid for an interval"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fx_sql_exec(fx.s, "SAVEPOINT corrupt");
        fx_sql_exec(fx.s, cases[i].sql);
        struct breaches b = {0};
        int n = store_verify_rules(fx.s, note, &b);
        fx_sql_exec(fx.s, "ROLLBACK TO corrupt");
        fx_sql_exec(fx.s, "RELEASE corrupt");
        int found = 0;
        for (int k = 0; k < b.n && k < 16; k++)
            found |= strcmp(b.what[k], cases[i].what) == 0;
        if (n < 1 || n != b.n || !found)
            fail_msg("%s: %d breaches, none '%s' (first: '%s')", cases[i].sql, n, cases[i].what, b.n ? b.what[0] : "");
    }
    struct breaches clean = {0};
    assert_int_equal(store_verify_rules(fx.s, note, &clean), 0);
}

static void test_verify_finds_a_settled_interval_charged_other_than_its_tariff(void **state)
{
    busy_ledger();
    fx_sql_exec(fx.s, "UPDATE running_intervals SET ended_at = ended_at + 10");
    int n;
    char *text = verify_text(&n);
    assert_int_equal(n, 1);
    assert_non_null(strstr(text, "breach: settled interval billed other than its tariff"));
    free(text);
}

static void test_verify_reports_a_sum_past_64_bits_as_a_breach(void **state)
{
    busy_ledger();
    /* Two postings whose running sum on one account leaves int64_t. */
    fx_sql_exec(fx.s, "INSERT INTO ledger_transactions (at, kind, user_id, reason, created_at)"
                      " SELECT 1, 'topup', id, 'huge', 1 FROM users LIMIT 1");
    fx_sql_exec(fx.s, "INSERT INTO ledger_postings (transaction_id, account_id, amount) VALUES"
                      " ((SELECT max(id) FROM ledger_transactions), 'payments', 9223372036854775807),"
                      " ((SELECT max(id) FROM ledger_transactions), 'payments', 9223372036854775807),"
                      " ((SELECT max(id) FROM ledger_transactions), 'revenue', -9223372036854775807),"
                      " ((SELECT max(id) FROM ledger_transactions), 'revenue', -9223372036854775807)");
    struct breaches b = {0};
    int n = store_verify_rules(fx.s, note, &b);
    assert_true(n >= 1);
    int overflow = 0;
    for (int k = 0; k < b.n && k < 16; k++)
        overflow |= strcmp(b.id[k], "") == 0;
    assert_true(overflow);
}

static void test_verify_that_cannot_run_a_rule_says_so_and_fails(void **state)
{
    busy_ledger();
    fx_sql_exec(fx.s, "DROP TABLE topups");
    struct breaches b = {0};
    assert_int_equal(store_verify_rules(fx.s, note, &b), -1);
    assert_string_equal(b.id[b.n - 1], "(cannot check)");
    int n;
    char *text = verify_text(&n);
    assert_int_equal(n, -1);
    assert_non_null(strstr(text, "cannot check 'top-up differs from the cash it added'"));
    free(text);
}

struct seen {
    int n;
    int64_t ids[8];
    char models[8][33];
    int stop_after; /* 0: never */
};

static int see(void *ctx, const struct charged_interval *iv)
{
    struct seen *s = ctx;
    if (s->n < 8) {
        s->ids[s->n] = iv->id;
        snprintf(s->models[s->n], sizeof s->models[0], "%s", iv->gpu_model);
    }
    s->n++;
    return s->stop_after && s->n >= s->stop_after;
}

static void settle(const char *user, const char *model, int64_t cards, int64_t start, int64_t end)
{
    struct instance in;
    int64_t iv;
    fx_running(fx.s, user, model, cards, start, &in, &iv);
    assert_int_equal(store_interval_close(fx.s, in.id, end, "stop"), STORE_OK);
    assert_int_equal(store_interval_billed(fx.s, iv, 0, 1, -1), STORE_OK);
}

static void test_settled_intervals_come_by_type_then_id_and_a_callback_can_stop_them(void **state)
{
    setup_rows();
    settle(alice, FX_TST, 1, 100, 100);
    settle(alice, "MI450", 1, 100, 100);
    settle(bob, FX_TST, 2, 200, 200);
    struct instance open;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 100, &open, &iv); /* not settled */
    struct seen s = {0};
    assert_int_equal(store_charged_intervals(fx.s, see, &s), STORE_OK);
    assert_int_equal(s.n, 3);
    assert_string_equal(s.models[0], "MI450");
    assert_string_equal(s.models[1], FX_TST);
    assert_string_equal(s.models[2], FX_TST);
    assert_true(s.ids[1] < s.ids[2]);
    struct seen stop = {.stop_after = 2};
    assert_int_equal(store_charged_intervals(fx.s, see, &stop), STORE_ERROR);
    assert_int_equal(stop.n, 2);
}

/* ---------------------------------------------------------------- backup */

static void test_backup_is_a_complete_copy_that_appears_only_when_done(void **state)
{
    busy_ledger();
    char dest[200], partial[220], err[256] = "";
    snprintf(dest, sizeof dest, "%s/backup.db", fx.dir);
    snprintf(partial, sizeof partial, "%s.partial", dest);
    assert_int_equal(store_backup(fx.s, dest, err, sizeof err), 0);
    assert_int_equal(access(partial, F_OK), -1);
    struct store *copy = store_open_readonly(dest, err, sizeof err);
    assert_non_null(copy);
    struct user u;
    assert_int_equal(store_user_get(copy, alice, &u), STORE_OK);
    assert_int_equal(store_schema_version(copy), store_latest_version());
    char cash[48];
    snprintf(cash, sizeof cash, "cash:%s", alice);
    assert_int_equal(store_account_balance(copy, cash), store_account_balance(fx.s, cash));
    assert_int_equal(ledger_verify(copy, stderr), 0);
    store_close(copy);
    fx_unlink_db(dest);
}

static void test_backup_to_a_folder_that_does_not_exist_fails_with_a_reason(void **state)
{
    char dest[200], err[256] = "";
    snprintf(dest, sizeof dest, "%s/no-such-dir/backup.db", fx.dir);
    assert_int_equal(store_backup(fx.s, dest, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot create"));
    assert_int_equal(access(dest, F_OK), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        fx_test(test_transactions_show_each_movement_with_its_credit_and_cash_split),
        fx_test(test_usage_clips_running_time_to_the_period_by_instance_or_type),
        fx_test(test_usage_cost_nets_refunds_out),
        fx_test(test_funds_before_are_the_ledger_as_it_stood),
        fx_test(test_burn_rate_is_price_times_cards_of_what_runs),
        fx_test(test_money_totals_add_up_every_kind_of_movement),
        cmocka_unit_test(test_report_names_are_eleven_then_null),
        fx_test(test_every_report_runs_on_an_empty_ledger_with_its_header),
        fx_test(test_daily_revenue_nets_refunds_per_day_and_type),
        fx_test(test_topups_and_credit_liability_reports_list_their_rows),
        fx_test(test_verify_finds_nothing_on_a_clean_ledger),
        fx_test(test_verify_names_each_kind_of_corruption),
        fx_test(test_verify_finds_a_settled_interval_charged_other_than_its_tariff),
        fx_test(test_verify_reports_a_sum_past_64_bits_as_a_breach),
        fx_test(test_verify_that_cannot_run_a_rule_says_so_and_fails),
        fx_test(test_settled_intervals_come_by_type_then_id_and_a_callback_can_stop_them),
        fx_test(test_backup_is_a_complete_copy_that_appears_only_when_done),
        fx_test(test_backup_to_a_folder_that_does_not_exist_fails_with_a_reason),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
