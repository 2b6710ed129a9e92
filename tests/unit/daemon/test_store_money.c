/* test_store_money.c: the SQL of money (store_money.c): prices, posting
 * ledger transactions (balanced legs only, user accounts never below zero,
 * no cached balance past 64 bits), credit grants (spendable, expired,
 * expiries, spend, restore, void), invite codes, top-ups, and what billing
 * reads and writes of running intervals (users to bill, billables with
 * confirmed_until, funds to bill, funds and holdings, interval_billed,
 * payers). Grants and postings are made here with the store calls
 * themselves, so these tests show the store's rules, not the ledger's. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpurent/tariff.h"
#include "store_fixtures.h"

static char alice[ID_MAX], bob[ID_MAX];

static void setup_rows(void)
{
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    fx_tst_type(fx.s);
}

static int64_t txn_count(void) { return fx_sql_int(fx.s, "SELECT count(*) FROM ledger_transactions", NULL); }

/* ---------------------------------------------------------------- prices */

static void test_prices_are_the_schedule_oldest_first_and_a_repeat_replaces(void **state)
{
    setup_rows();
    assert_int_equal(store_price_insert(fx.s, FX_TST, 5000, 9000000, 60), STORE_OK);
    assert_int_equal(store_price_insert(fx.s, FX_TST, 2000, 7000000, 61), STORE_OK);
    struct price_point *pp;
    size_t n;
    assert_int_equal(store_prices(fx.s, FX_TST, &pp, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_int_equal(pp[0].effective_at, 0);
    assert_int_equal(pp[1].effective_at, 2000);
    assert_int_equal(pp[1].card_hour, 7000000);
    assert_int_equal(pp[2].effective_at, 5000);
    free(pp);
    /* The same moment again replaces that point's price. */
    assert_int_equal(store_price_insert(fx.s, FX_TST, 2000, 8000000, 70), STORE_OK);
    struct price_row rows[8];
    assert_int_equal(store_price_history(fx.s, FX_TST, rows, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_int_equal(rows[1].card_hour, 8000000);
    assert_int_equal(rows[1].created_at, 70);
    assert_string_equal(rows[1].gpu_model, FX_TST);
    /* No schedule for an unknown type, and no price can be set for one. */
    assert_int_equal(store_prices(fx.s, "NOSUCH", &pp, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(pp);
    assert_int_equal(store_price_insert(fx.s, "NOSUCH", 0, 1, 1), STORE_ERROR);
    assert_int_equal(store_price_insert(fx.s, FX_TST, 9000, -1, 1), STORE_ERROR);
}

static void test_price_history_lists_one_type_or_every_type(void **state)
{
    setup_rows();
    struct price_row rows[16];
    size_t n;
    assert_int_equal(store_price_history(fx.s, NULL, rows, 16, &n), STORE_OK);
    assert_int_equal(n, 4); /* the three seeded prices and TST's */
    assert_string_equal(rows[0].gpu_model, "MI300X");
    assert_int_equal(rows[0].card_hour, 2200000);
    assert_string_equal(rows[1].gpu_model, "MI450");
    assert_string_equal(rows[3].gpu_model, FX_TST);
    assert_int_equal(store_price_history(fx.s, NULL, rows, 2, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(store_price_history(fx.s, "MI450", rows, 16, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].card_hour, 1200000);
}

/* ---------------------------------------------------------------- posting */

static struct ledger_leg mk_leg(const char *account, int64_t amount)
{
    struct ledger_leg l;
    memset(&l, 0, sizeof l);
    snprintf(l.account_id, sizeof l.account_id, "%s", account);
    l.amount = amount;
    return l;
}

static int post(const char *kind, const struct ledger_leg *legs, size_t n)
{
    struct ledger_entry e = {.at = 500, .kind = kind, .user_id = alice, .reason = "test"};
    return store_ledger_post(fx.s, &e, legs, n, 600);
}

struct post_ctx {
    const struct ledger_leg *legs;
    size_t n;
};

static int post_txn(struct store *s, void *vctx)
{
    struct post_ctx *c = vctx;
    struct ledger_entry e = {.at = 500, .kind = "usage", .user_id = alice, .reason = "test"};
    return store_ledger_post(s, &e, c->legs, c->n, 600);
}

static void test_ledger_post_moves_balances_and_opens_accounts_on_first_use(void **state)
{
    setup_rows();
    char cash[48];
    snprintf(cash, sizeof cash, "cash:%s", alice);
    struct ledger_leg legs[3] = {mk_leg(cash, 700), mk_leg("payments", -700), mk_leg("revenue", 0)};
    struct ledger_entry e = {.at = 500, .kind = "topup", .user_id = alice, .reason = "a top-up", .topup_id = "top_x"};
    assert_int_equal(store_ledger_post(fx.s, &e, legs, 3, 600), STORE_OK);
    assert_int_equal(store_account_balance(fx.s, cash), 700);
    assert_int_equal(store_account_balance(fx.s, "payments"), -700);
    assert_int_equal(store_account_balance(fx.s, "revenue"), 0);
    char kind[16];
    fx_sql_text(fx.s, "SELECT kind || ':' || user_id FROM ledger_accounts WHERE id = ?1", cash, kind, sizeof kind);
    assert_int_equal(strncmp(kind, "cash:usr_", 9), 0);
    int64_t t = fx_sql_int(fx.s, "SELECT max(id) FROM ledger_transactions", NULL);
    /* The zero leg is not written: a posting always moves money. */
    assert_int_equal(fx_sql_int_n(fx.s, "SELECT count(*) FROM ledger_postings WHERE transaction_id = ?1", t), 2);
    char row[128];
    fx_sql_text(fx.s,
                "SELECT at || ' ' || kind || ' ' || reason || ' ' || topup_id || ' ' || created_at"
                " FROM ledger_transactions ORDER BY id DESC LIMIT 1",
                NULL, row, sizeof row);
    assert_string_equal(row, "500 topup a top-up top_x 600");
    /* A second posting moves the same account. */
    struct ledger_leg more[2] = {mk_leg(cash, 50), mk_leg("payments", -50)};
    assert_int_equal(post("topup", more, 2), STORE_OK);
    assert_int_equal(store_account_balance(fx.s, cash), 750);
}

/* Legs that do not balance are a caller's bug that would create or destroy
 * money: store_ledger_post ASSERTs, so the process aborts before writing. */
static void expect_abort(const char *kind, const struct ledger_leg *legs, size_t n)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        fclose(stderr); /* the assertion's log line is expected */
        post(kind, legs, n);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

static void test_ledger_post_aborts_on_unbalanced_and_single_legs_before_writing(void **state)
{
    setup_rows();
    char cash[48];
    snprintf(cash, sizeof cash, "cash:%s", alice);
    int64_t before = txn_count();
    struct ledger_leg unbalanced[2] = {mk_leg(cash, 700), mk_leg("payments", -699)};
    expect_abort("topup", unbalanced, 2);
    struct ledger_leg one[1] = {mk_leg("revenue", 0)};
    expect_abort("usage", one, 1);
    expect_abort("usage", one, 0);
    /* Amounts whose sum overflows 64 bits are judged exactly, not wrapped. */
    struct ledger_leg wraps[3] = {mk_leg(cash, INT64_MAX), mk_leg("payments", INT64_MAX), mk_leg("revenue", 2)};
    expect_abort("topup", wraps, 3);
    assert_int_equal(txn_count(), before);
    assert_int_equal(store_account_balance(fx.s, cash), 0);
}

static void test_ledger_post_refuses_a_user_account_below_zero(void **state)
{
    setup_rows();
    char cash[48];
    snprintf(cash, sizeof cash, "cash:%s", alice);
    struct ledger_leg fund[2] = {mk_leg(cash, 100), mk_leg("payments", -100)};
    assert_int_equal(post("topup", fund, 2), STORE_OK);
    int64_t before = txn_count();
    struct ledger_leg overdraw[2] = {mk_leg(cash, -101), mk_leg("revenue", 101)};
    struct post_ctx c = {overdraw, 2};
    assert_int_equal(store_txn(fx.s, post_txn, &c), STORE_CONFLICT);
    assert_int_equal(txn_count(), before);
    assert_int_equal(store_account_balance(fx.s, cash), 100);
    assert_int_equal(store_account_balance(fx.s, "revenue"), 0);
    /* Platform accounts may go negative: that is where money comes from. */
    assert_true(store_account_balance(fx.s, "payments") < 0);
}

static void test_ledger_post_refuses_a_balance_past_64_bits_and_an_unknown_platform_account(void **state)
{
    setup_rows();
    char cash[48];
    snprintf(cash, sizeof cash, "cash:%s", alice);
    struct ledger_leg fill[2] = {mk_leg(cash, INT64_MAX), mk_leg("payments", -INT64_MAX)};
    assert_int_equal(post("topup", fill, 2), STORE_OK);
    int64_t before = txn_count();
    struct ledger_leg over[2] = {mk_leg("payments", -1), mk_leg(cash, 1)};
    struct post_ctx c = {over, 2};
    assert_int_equal(store_txn(fx.s, post_txn, &c), STORE_ERROR);
    assert_int_equal(txn_count(), before);
    assert_int_equal(store_account_balance(fx.s, cash), INT64_MAX);
    assert_int_equal(store_account_balance(fx.s, "payments"), -INT64_MAX);
    struct ledger_leg nowhere[2] = {mk_leg("nosuch", 5), mk_leg("revenue", -5)};
    c = (struct post_ctx){nowhere, 2};
    assert_int_equal(store_txn(fx.s, post_txn, &c), STORE_ERROR);
    assert_int_equal(txn_count(), before);
}

static void test_balance_of_an_account_never_used_is_zero(void **state)
{
    setup_rows();
    assert_int_equal(store_account_balance(fx.s, "cash:usr_nobody"), 0);
    assert_int_equal(store_account_balance(fx.s, "revenue"), 0);
}

/* ---------------------------------------------------------------- grants */

static void mk_grant(const char *user, int64_t amount, int64_t remaining, int64_t expires_at, int64_t created_at,
                     char id[ID_MAX])
{
    struct grant g = {.amount = amount, .remaining = remaining, .expires_at = expires_at, .created_at = created_at};
    assert_int_equal(id_new("grt", g.id), 0);
    snprintf(g.user_id, sizeof g.user_id, "%s", user);
    snprintf(g.source, sizeof g.source, "admin");
    assert_int_equal(store_grant_insert(fx.s, &g), STORE_OK);
    memcpy(id, g.id, ID_MAX);
}

static void test_grants_spendable_are_live_ones_soonest_expiry_first_and_never_expiring_last(void **state)
{
    setup_rows();
    char late[ID_MAX], never[ID_MAX], soon[ID_MAX], gone[ID_MAX], empty[ID_MAX], voided[ID_MAX], theirs[ID_MAX];
    mk_grant(alice, 100, 100, 3000, 10, late);
    mk_grant(alice, 100, 100, 0, 11, never);
    mk_grant(alice, 100, 40, 2000, 12, soon);
    mk_grant(alice, 100, 100, 1500, 13, gone);
    mk_grant(alice, 100, 0, 2500, 14, empty);
    mk_grant(alice, 100, 100, 2600, 15, voided);
    assert_int_equal(store_grant_void(fx.s, voided, 1000), STORE_OK);
    mk_grant(bob, 100, 100, 2000, 16, theirs);
    struct grant g[8];
    size_t n;
    assert_int_equal(store_grants_spendable(fx.s, alice, 1500, g, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(g[0].id, soon);
    assert_int_equal(g[0].remaining, 40);
    assert_string_equal(g[1].id, late);
    assert_string_equal(g[2].id, never);
    assert_int_equal(g[2].expires_at, 0);
    /* One second earlier the grant expiring at 1500 is still live. */
    assert_int_equal(store_grants_spendable(fx.s, alice, 1499, g, 8, &n), STORE_OK);
    assert_int_equal(n, 4);
    assert_string_equal(g[0].id, gone);
    assert_int_equal(store_grants_spendable(fx.s, alice, 1499, g, 2, &n), STORE_OK);
    assert_int_equal(n, 2);
}

static void test_grants_of_are_every_grant_of_the_user_newest_first(void **state)
{
    setup_rows();
    char a[ID_MAX], b[ID_MAX], c[ID_MAX];
    mk_grant(alice, 100, 100, 0, 10, a);
    mk_grant(alice, 200, 0, 500, 30, c);
    mk_grant(alice, 300, 300, 0, 20, b);
    assert_int_equal(store_grant_void(fx.s, c, 500), STORE_OK);
    struct grant g[8];
    size_t n;
    assert_int_equal(store_grants_of(fx.s, alice, g, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(g[0].id, c);
    assert_int_equal(g[0].voided_at, 500);
    assert_string_equal(g[1].id, b);
    assert_string_equal(g[2].id, a);
    assert_string_equal(g[2].source, "admin");
    assert_string_equal(g[2].user_id, alice);
    assert_int_equal(store_grants_of(fx.s, bob, g, 8, &n), STORE_OK);
    assert_int_equal(n, 0);
}

static void test_grants_expired_are_the_user_s_or_those_of_users_with_nothing_to_bill(void **state)
{
    setup_rows();
    char a1[ID_MAX], a2[ID_MAX], a3[ID_MAX], b1[ID_MAX];
    mk_grant(alice, 100, 100, 1000, 10, a1);
    mk_grant(alice, 100, 100, 2000, 10, a2); /* not yet */
    mk_grant(alice, 100, 0, 900, 10, a3);    /* nothing left */
    mk_grant(bob, 100, 100, 1000, 10, b1);
    struct grant g[8];
    size_t n;
    assert_int_equal(store_grants_expired(fx.s, alice, 1000, g, 8, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(g[0].id, a1);
    assert_int_equal(store_grants_expired(fx.s, alice, 999, g, 8, &n), STORE_OK);
    assert_int_equal(n, 0);
    assert_int_equal(store_grants_expired(fx.s, NULL, 1000, g, 8, &n), STORE_OK);
    assert_int_equal(n, 2);
    /* Alice has running time to bill: only her own billing may void hers. */
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 500, &in, &iv);
    assert_int_equal(store_grants_expired(fx.s, NULL, 1000, g, 8, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(g[0].id, b1);
    assert_int_equal(store_grants_expired(fx.s, alice, 1000, g, 8, &n), STORE_OK);
    assert_int_equal(n, 1);
    /* Voided grants are done. */
    assert_int_equal(store_grant_void(fx.s, b1, 1000), STORE_OK);
    assert_int_equal(store_grants_expired(fx.s, NULL, 1000, g, 8, &n), STORE_OK);
    assert_int_equal(n, 0);
}

static void test_grant_expiries_are_distinct_times_in_the_window(void **state)
{
    setup_rows();
    char id[ID_MAX];
    mk_grant(alice, 100, 100, 1000, 10, id);
    mk_grant(alice, 100, 100, 2000, 10, id);
    mk_grant(alice, 100, 50, 2000, 10, id);
    mk_grant(alice, 100, 0, 2500, 10, id); /* nothing left */
    mk_grant(alice, 100, 100, 3000, 10, id);
    mk_grant(alice, 100, 100, 0, 10, id);  /* never */
    mk_grant(bob, 100, 100, 1500, 10, id);
    int64_t t[8];
    size_t n;
    assert_int_equal(store_grant_expiries(fx.s, alice, 1000, 3000, t, 8, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(t[0], 2000);
    assert_int_equal(t[1], 3000);
    assert_int_equal(store_grant_expiries(fx.s, alice, 0, 5000, t, 1, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(t[0], 1000);
}

static struct grant one_grant(const char *user, const char *id)
{
    struct grant g[16];
    size_t n;
    assert_int_equal(store_grants_of(fx.s, user, g, 16, &n), STORE_OK);
    for (size_t i = 0; i < n; i++)
        if (strcmp(g[i].id, id) == 0)
            return g[i];
    fail_msg("no grant %s", id);
    return g[0];
}

static void test_grant_spend_refuses_more_than_remains(void **state)
{
    setup_rows();
    char g[ID_MAX];
    mk_grant(alice, 100, 100, 0, 10, g);
    assert_int_equal(store_grant_spend(fx.s, g, 60), STORE_OK);
    assert_int_equal(one_grant(alice, g).remaining, 40);
    assert_int_equal(store_grant_spend(fx.s, g, 41), STORE_CONFLICT);
    assert_int_equal(store_grant_spend(fx.s, g, 40), STORE_OK);
    assert_int_equal(one_grant(alice, g).remaining, 0);
    assert_int_equal(store_grant_spend(fx.s, "grt_nosuch", 1), STORE_CONFLICT);
}

static void test_grant_restore_refuses_past_the_amount_and_on_a_voided_grant(void **state)
{
    setup_rows();
    char g[ID_MAX], v[ID_MAX];
    mk_grant(alice, 100, 30, 0, 10, g);
    assert_int_equal(store_grant_restore(fx.s, g, 70), STORE_OK);
    assert_int_equal(one_grant(alice, g).remaining, 100);
    assert_int_equal(store_grant_restore(fx.s, g, 1), STORE_CONFLICT);
    mk_grant(alice, 100, 30, 500, 10, v);
    assert_int_equal(store_grant_void(fx.s, v, 500), STORE_OK);
    assert_int_equal(store_grant_restore(fx.s, v, 10), STORE_CONFLICT);
    assert_int_equal(one_grant(alice, v).remaining, 0);
}

static void test_grant_void_zeroes_the_remainder_once(void **state)
{
    setup_rows();
    char g[ID_MAX];
    mk_grant(alice, 100, 30, 500, 10, g);
    assert_int_equal(store_grant_void(fx.s, g, 500), STORE_OK);
    struct grant got = one_grant(alice, g);
    assert_int_equal(got.remaining, 0);
    assert_int_equal(got.voided_at, 500);
    assert_int_equal(store_grant_void(fx.s, g, 600), STORE_NOT_FOUND);
    assert_int_equal(one_grant(alice, g).voided_at, 500);
    /* A grant's CHECKs: never more left than granted. */
    struct grant bad = {.amount = 10, .remaining = 11, .created_at = 1};
    assert_int_equal(id_new("grt", bad.id), 0);
    snprintf(bad.user_id, sizeof bad.user_id, "%s", alice);
    snprintf(bad.source, sizeof bad.source, "admin");
    assert_int_equal(store_grant_insert(fx.s, &bad), STORE_ERROR);
}

/* ---------------------------------------------------------------- invite codes */

static void test_invite_round_trips_with_its_optional_limits(void **state)
{
    setup_rows();
    struct invite_code c = {.amount = 5000000, .created_at = 10};
    snprintf(c.code, sizeof c.code, "FREE");
    assert_int_equal(store_invite_insert(fx.s, &c), STORE_OK);
    struct invite_code got;
    assert_int_equal(store_invite_get(fx.s, "FREE", &got), STORE_OK);
    assert_int_equal(got.amount, 5000000);
    assert_int_equal(got.credit_days, 0);
    assert_int_equal(got.expires_at, 0);
    assert_int_equal(got.max_uses, 0);
    assert_int_equal(got.uses, 0);
    struct invite_code limited = {.amount = 1, .credit_days = 7, .expires_at = 9000, .max_uses = 2, .created_at = 11};
    snprintf(limited.code, sizeof limited.code, "LIMITED");
    assert_int_equal(store_invite_insert(fx.s, &limited), STORE_OK);
    assert_int_equal(store_invite_get(fx.s, "LIMITED", &got), STORE_OK);
    assert_int_equal(got.credit_days, 7);
    assert_int_equal(got.expires_at, 9000);
    assert_int_equal(got.max_uses, 2);
    /* The seeded code, an unknown one, a repeat and a lowercase one. */
    assert_int_equal(store_invite_get(fx.s, "AMD6GW", &got), STORE_OK);
    assert_int_equal(store_invite_get(fx.s, "NOSUCH", &got), STORE_NOT_FOUND);
    assert_int_equal(store_invite_insert(fx.s, &c), STORE_CONFLICT);
    snprintf(c.code, sizeof c.code, "lower");
    assert_int_equal(store_invite_insert(fx.s, &c), STORE_ERROR);
}

static void test_invite_redeem_counts_uses_once_per_user_up_to_the_limit(void **state)
{
    setup_rows();
    char carol[ID_MAX], ga[ID_MAX], gb[ID_MAX], gc[ID_MAX];
    fx_user(fx.s, "carol@example.com", ROLE_USER, carol);
    struct invite_code c = {.amount = 100, .max_uses = 2, .created_at = 10};
    snprintf(c.code, sizeof c.code, "TWICE");
    assert_int_equal(store_invite_insert(fx.s, &c), STORE_OK);
    mk_grant(alice, 100, 100, 0, 20, ga);
    mk_grant(bob, 100, 100, 0, 20, gb);
    mk_grant(carol, 100, 100, 0, 20, gc);
    assert_int_equal(store_invite_redeem(fx.s, "TWICE", alice, ga, 20), STORE_OK);
    assert_int_equal(store_invite_redeem(fx.s, "TWICE", alice, ga, 21), STORE_CONFLICT);
    assert_int_equal(store_invite_redeem(fx.s, "TWICE", bob, gb, 22), STORE_OK);
    struct invite_code got;
    assert_int_equal(store_invite_get(fx.s, "TWICE", &got), STORE_OK);
    assert_int_equal(got.uses, 2);
    assert_int_equal(store_invite_redeem(fx.s, "TWICE", carol, gc, 23), STORE_NOT_FOUND); /* used up */
}

/* ---------------------------------------------------------------- top-ups */

static void test_topup_round_trips_by_payment_id_and_refuses_a_repeat(void **state)
{
    setup_rows();
    struct topup t = {.amount = 9000, .created_at = 40};
    assert_int_equal(id_new("top", t.id), 0);
    snprintf(t.user_id, sizeof t.user_id, "%s", alice);
    snprintf(t.payment_id, sizeof t.payment_id, "pay-123");
    snprintf(t.source, sizeof t.source, "webhook");
    assert_int_equal(store_topup_insert(fx.s, &t), STORE_OK);
    struct topup got;
    assert_int_equal(store_topup_by_payment(fx.s, "pay-123", &got), STORE_OK);
    assert_string_equal(got.id, t.id);
    assert_string_equal(got.user_id, alice);
    assert_int_equal(got.amount, 9000);
    assert_string_equal(got.source, "webhook");
    assert_int_equal(got.created_at, 40);
    assert_int_equal(store_topup_by_payment(fx.s, "pay-999", &got), STORE_NOT_FOUND);
    struct topup again = t;
    assert_int_equal(id_new("top", again.id), 0);
    assert_int_equal(store_topup_insert(fx.s, &again), STORE_CONFLICT);
    snprintf(again.payment_id, sizeof again.payment_id, "pay-124");
    snprintf(again.source, sizeof again.source, "cash");
    assert_int_equal(store_topup_insert(fx.s, &again), STORE_ERROR);
}

/* ---------------------------------------------------------------- billing state */

static void test_users_to_bill_are_those_with_unsettled_intervals(void **state)
{
    setup_rows();
    char carol[ID_MAX];
    fx_user(fx.s, "carol@example.com", ROLE_USER, carol);
    struct instance a, b;
    int64_t ia, ib;
    fx_running(fx.s, alice, FX_TST, 1, 100, &a, &ia);
    fx_running(fx.s, bob, FX_TST, 1, 100, &b, &ib);
    assert_int_equal(store_interval_close(fx.s, b.id, 200, "stop"), STORE_OK);
    assert_int_equal(store_interval_billed(fx.s, ib, 0, 1, -1), STORE_OK);
    char(*u)[ID_MAX];
    size_t n;
    assert_int_equal(store_users_to_bill(fx.s, &u, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(u[0], alice);
    free(u);
}

static void test_billables_are_every_unsettled_interval_of_the_user_by_id(void **state)
{
    setup_rows();
    struct instance in[4];
    int64_t iv[4];
    for (int i = 0; i < 4; i++)
        fx_running(fx.s, alice, FX_TST, i + 1, 100 * (i + 1), &in[i], &iv[i]);
    assert_int_equal(store_interval_close(fx.s, in[1].id, 250, "stop"), STORE_OK);
    assert_int_equal(store_interval_close(fx.s, in[3].id, 450, "stop"), STORE_OK);
    assert_int_equal(store_interval_billed(fx.s, iv[3], 0, 1, -1), STORE_OK);
    struct instance theirs;
    int64_t it;
    fx_running(fx.s, bob, FX_TST, 1, 100, &theirs, &it);
    struct billable *b;
    size_t n;
    assert_int_equal(store_billables(fx.s, alice, &b, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_int_equal(b[0].id, iv[0]);
    assert_int_equal(b[1].id, iv[1]);
    assert_int_equal(b[1].ended_at, 250);
    assert_int_equal(b[1].card_count, 2);
    assert_int_equal(b[1].confirmed_until, -1); /* ended: nothing caps it */
    assert_int_equal(b[2].id, iv[2]);
    assert_int_equal(b[2].ended_at, 0);
    free(b);
    assert_int_equal(store_billables_all(fx.s, &b, &n), STORE_OK);
    assert_int_equal(n, 4);
    /* By user, then id. */
    int alice_first = strcmp(alice, bob) < 0;
    assert_string_equal(b[alice_first ? 3 : 0].user_id, bob);
    assert_true(b[alice_first ? 0 : 1].id < b[alice_first ? 1 : 2].id);
    free(b);
    char carol[ID_MAX];
    fx_user(fx.s, "carol@example.com", ROLE_USER, carol);
    assert_int_equal(store_billables(fx.s, carol, &b, &n), STORE_OK);
    assert_int_equal(n, 0);
    assert_null(b);
}

static void test_confirmed_until_is_the_earliest_last_beat_of_a_node_that_missed_one(void **state)
{
    setup_rows();
    char n1[ID_MAX], n2[ID_MAX], n3[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, n1);
    fx_ready_node(fx.s, "n2", FX_TST, 8, "f1", 1000, n2);
    fx_ready_node(fx.s, "n3", FX_TST, 8, "f1", 1000, n3);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 24, 1000, &in, &iv);
    assert_int_equal(fx_claim(fx.s, in.id, 0, n1, 0xff), STORE_OK);
    assert_int_equal(fx_claim(fx.s, in.id, 1, n2, 0xff), STORE_OK);
    assert_int_equal(fx_claim(fx.s, in.id, 2, n3, 0xff), STORE_OK);
    assert_int_equal(fx_beat(fx.s, n1, 1300, FX_TST, 8, 0), STORE_OK);
    assert_int_equal(fx_beat(fx.s, n2, 1200, FX_TST, 8, 0), STORE_OK);
    assert_int_equal(fx_beat(fx.s, n3, 1100, FX_TST, 8, 0), STORE_OK); /* seen last, but answering */
    assert_int_equal(store_node_beat_missed(fx.s, n1, 1310, 3, 600, "t"), STORE_OK);
    assert_int_equal(store_node_beat_missed(fx.s, n2, 1310, 3, 600, "t"), STORE_OK);
    struct billable b;
    assert_int_equal(store_interval_get_open(fx.s, in.id, &b), STORE_OK);
    assert_int_equal(b.confirmed_until, 1200);
    struct billable *all;
    size_t n;
    assert_int_equal(store_billables(fx.s, alice, &all, &n), STORE_OK);
    assert_int_equal(all[0].confirmed_until, 1200);
    free(all);
    assert_int_equal(fx_beat(fx.s, n2, 1320, FX_TST, 8, 0), STORE_OK);
    assert_int_equal(store_interval_get_open(fx.s, in.id, &b), STORE_OK);
    assert_int_equal(b.confirmed_until, 1300);
}

static void test_interval_billed_records_the_money_and_settles_it(void **state)
{
    setup_rows();
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &in, &iv);
    assert_int_equal(store_interval_billed(fx.s, iv, 500, 0, -1), STORE_OK);
    struct billable b;
    assert_int_equal(store_interval_get_open(fx.s, in.id, &b), STORE_OK);
    assert_int_equal(b.billed, 500);
    assert_int_equal(b.ended_at, 0);
    assert_int_equal(store_interval_close(fx.s, in.id, 1100, "stop"), STORE_OK);
    assert_int_equal(store_interval_billed(fx.s, iv, 600, 1, -1), STORE_OK);
    struct billable *all;
    size_t n;
    assert_int_equal(store_billables(fx.s, alice, &all, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(all);
    assert_int_equal(fx_sql_int_n(fx.s, "SELECT billed FROM running_intervals WHERE id = ?1", iv), 600);
    assert_int_equal(store_interval_billed(fx.s, 99999, 1, 0, -1), STORE_NOT_FOUND);
    assert_int_equal(store_interval_billed(fx.s, iv, -1, 1, -1), STORE_ERROR); /* billed >= 0 */
}

static void test_interval_billed_with_exhausted_funds_ends_the_interval_there(void **state)
{
    setup_rows();
    struct instance open, early, before;
    int64_t io, ie, ib;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &open, &io);
    fx_running(fx.s, alice, FX_TST, 1, 1000, &early, &ie);
    assert_int_equal(store_interval_close(fx.s, early.id, 1200, "stop"), STORE_OK);
    fx_running(fx.s, alice, FX_TST, 1, 1600, &before, &ib);
    assert_int_equal(store_interval_billed(fx.s, io, 500, 0, 1500), STORE_OK);
    assert_int_equal(store_interval_billed(fx.s, ie, 200, 0, 1500), STORE_OK);
    assert_int_equal(store_interval_billed(fx.s, ib, 0, 0, 1500), STORE_OK);
    char row[64];
    fx_sql_text(fx.s, "SELECT ended_at || ' ' || end_reason FROM running_intervals WHERE instance_id = ?1", open.id,
                row, sizeof row);
    assert_string_equal(row, "1500 funds exhausted");
    fx_sql_text(fx.s, "SELECT ended_at || ' ' || end_reason FROM running_intervals WHERE instance_id = ?1", early.id,
                row, sizeof row);
    assert_string_equal(row, "1200 stop");
    fx_sql_text(fx.s, "SELECT ended_at || ' ' || end_reason FROM running_intervals WHERE instance_id = ?1", before.id,
                row, sizeof row);
    assert_string_equal(row, "1600 funds exhausted"); /* never before its start */
}

static void fund(const char *user, int64_t amount)
{
    char cash[48];
    snprintf(cash, sizeof cash, "cash:%s", user);
    struct ledger_leg legs[2] = {mk_leg(cash, amount), mk_leg("payments", -amount)};
    struct ledger_entry e = {.at = 10, .kind = "topup", .user_id = user, .reason = "test"};
    assert_int_equal(store_ledger_post(fx.s, &e, legs, 2, 10), STORE_OK);
}

static void test_funds_to_bill_are_what_each_billed_user_could_spend_the_second_before(void **state)
{
    setup_rows();
    char carol[ID_MAX], g[ID_MAX];
    fx_user(fx.s, "carol@example.com", ROLE_USER, carol);
    fund(alice, 1000);
    mk_grant(alice, 300, 300, 2000, 10, g);
    mk_grant(alice, 50, 50, 0, 10, g);
    fund(carol, 5); /* nothing to bill: not listed */
    struct instance a, b;
    int64_t ia, ib;
    fx_running(fx.s, alice, FX_TST, 1, 100, &a, &ia);
    fx_running(fx.s, bob, FX_TST, 1, 100, &b, &ib);
    struct user_funds *f;
    size_t n;
    assert_int_equal(store_funds_to_bill(fx.s, 2000, &f, &n), STORE_OK);
    assert_int_equal(n, 2);
    struct user_funds *fa = strcmp(f[0].user_id, alice) == 0 ? &f[0] : &f[1];
    struct user_funds *fb = fa == &f[0] ? &f[1] : &f[0];
    assert_int_equal(fa->cash, 1000);
    assert_int_equal(fa->credit, 350); /* the grant expiring at 2000 pays for 1999 */
    assert_int_equal(fa->expired_grants, 1);
    assert_string_equal(fb->user_id, bob);
    assert_int_equal(fb->cash, 0);
    assert_int_equal(fb->credit, 0);
    assert_int_equal(fb->expired_grants, 0);
    free(f);
    assert_int_equal(store_funds_to_bill(fx.s, 1999, &f, &n), STORE_OK);
    fa = strcmp(f[0].user_id, alice) == 0 ? &f[0] : &f[1];
    assert_int_equal(fa->expired_grants, 0);
    free(f);
    assert_int_equal(store_funds_to_bill(fx.s, 2001, &f, &n), STORE_OK);
    fa = strcmp(f[0].user_id, alice) == 0 ? &f[0] : &f[1];
    assert_int_equal(fa->credit, 50);
    free(f);
}

static void test_user_funds_count_live_credit_and_holdings_all_credit_not_voided(void **state)
{
    setup_rows();
    char g1[ID_MAX], g2[ID_MAX], g3[ID_MAX];
    fund(alice, 1000);
    mk_grant(alice, 300, 300, 2000, 10, g1);
    mk_grant(alice, 50, 50, 0, 10, g2);
    mk_grant(alice, 70, 70, 1500, 10, g3);
    assert_int_equal(store_grant_void(fx.s, g3, 1500), STORE_OK);
    int64_t cash, credit;
    assert_int_equal(store_user_funds(fx.s, alice, 1999, &cash, &credit), STORE_OK);
    assert_int_equal(cash, 1000);
    assert_int_equal(credit, 350);
    assert_int_equal(store_user_funds(fx.s, alice, 2000, &cash, &credit), STORE_OK);
    assert_int_equal(credit, 50);
    assert_int_equal(store_user_holdings(fx.s, alice, &cash, &credit), STORE_OK);
    assert_int_equal(cash, 1000);
    assert_int_equal(credit, 350); /* expired but not voided still counts */
    assert_int_equal(store_user_funds(fx.s, bob, 0, &cash, &credit), STORE_OK);
    assert_int_equal(cash + credit, 0);
    assert_int_equal(store_user_holdings(fx.s, bob, &cash, &credit), STORE_OK);
    assert_int_equal(cash + credit, 0);
}

static void test_interval_payers_net_usage_and_refunds_last_drawn_first(void **state)
{
    setup_rows();
    char g[ID_MAX];
    assert_int_equal(ledger_topup(fx.s, alice, "pay-1", 1000, "admin", 10, g, &(int){0}), STORE_OK);
    assert_int_equal(ledger_grant(fx.s, alice, "admin", 300, 5000, 10, "test", g), STORE_OK);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 100, &in, &iv);
    assert_int_equal(ledger_charge(fx.s, alice, 400, 200, in.id, iv, "usage"), STORE_OK); /* grant 300, cash 100 */
    assert_int_equal(ledger_charge(fx.s, alice, 50, 300, in.id, iv, "usage"), STORE_OK);  /* cash 50 */
    struct interval_payer *p;
    size_t n;
    assert_int_equal(store_interval_payers(fx.s, iv, &p, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(strncmp(p[0].account_id, "cash:", 5), 0);
    assert_int_equal(p[0].paid, 150);
    assert_string_equal(p[0].grant_id, "");
    assert_string_equal(p[1].grant_id, g);
    assert_int_equal(p[1].paid, 300);
    assert_int_equal(p[1].grant_voided_at, 0);
    free(p);
    /* A refund of all the cash leaves the grant alone as a payer. */
    struct billable b;
    assert_int_equal(store_interval_get_open(fx.s, in.id, &b), STORE_OK);
    assert_int_equal(ledger_refund(fx.s, &b, 150, 400, "test"), STORE_OK);
    assert_int_equal(store_interval_payers(fx.s, iv, &p, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(p[0].grant_id, g);
    free(p);
    /* No usage, no payers. */
    assert_int_equal(store_interval_payers(fx.s, 99999, &p, &n), STORE_OK);
    assert_int_equal(n, 0);
    assert_null(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        fx_test(test_prices_are_the_schedule_oldest_first_and_a_repeat_replaces),
        fx_test(test_price_history_lists_one_type_or_every_type),
        fx_test(test_ledger_post_moves_balances_and_opens_accounts_on_first_use),
        fx_test(test_ledger_post_aborts_on_unbalanced_and_single_legs_before_writing),
        fx_test(test_ledger_post_refuses_a_user_account_below_zero),
        fx_test(test_ledger_post_refuses_a_balance_past_64_bits_and_an_unknown_platform_account),
        fx_test(test_balance_of_an_account_never_used_is_zero),
        fx_test(test_grants_spendable_are_live_ones_soonest_expiry_first_and_never_expiring_last),
        fx_test(test_grants_of_are_every_grant_of_the_user_newest_first),
        fx_test(test_grants_expired_are_the_user_s_or_those_of_users_with_nothing_to_bill),
        fx_test(test_grant_expiries_are_distinct_times_in_the_window),
        fx_test(test_grant_spend_refuses_more_than_remains),
        fx_test(test_grant_restore_refuses_past_the_amount_and_on_a_voided_grant),
        fx_test(test_grant_void_zeroes_the_remainder_once),
        fx_test(test_invite_round_trips_with_its_optional_limits),
        fx_test(test_invite_redeem_counts_uses_once_per_user_up_to_the_limit),
        fx_test(test_topup_round_trips_by_payment_id_and_refuses_a_repeat),
        fx_test(test_users_to_bill_are_those_with_unsettled_intervals),
        fx_test(test_billables_are_every_unsettled_interval_of_the_user_by_id),
        fx_test(test_confirmed_until_is_the_earliest_last_beat_of_a_node_that_missed_one),
        fx_test(test_interval_billed_records_the_money_and_settles_it),
        fx_test(test_interval_billed_with_exhausted_funds_ends_the_interval_there),
        fx_test(test_funds_to_bill_are_what_each_billed_user_could_spend_the_second_before),
        fx_test(test_user_funds_count_live_credit_and_holdings_all_credit_not_voided),
        fx_test(test_interval_payers_net_usage_and_refunds_last_drawn_first),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
