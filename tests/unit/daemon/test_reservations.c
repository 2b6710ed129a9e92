/* test_reservations.c: the rules of domain/reservations.c: a window's checks
 * (pure), the cancellation refund rule, and on a temporary migrated
 * database the calendar check, the payment from credit then cash, and a
 * refund that goes back to a grant voided meanwhile (voided again). After
 * every money movement ledger verify must find nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_fixtures.h"

#define H 3600
#define NOW (1000 * H) /* a whole hour */

static void assert_ledger_whole(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    int breaches = ledger_verify(fx.s, out);
    fclose(out);
    if (breaches != 0)
        fail_msg("ledger verify: %d\n%s", breaches, text);
    free(text);
}

/* Expects the window refused with field (or accepted when field is NULL). */
static void expect_window(int64_t cards, int64_t start, int64_t end, const char *field)
{
    struct op_outcome o = {0};
    int rc = reservation_window_check(cards, start, end, NOW, &o);
    if (!field) {
        assert_int_equal(rc, STORE_OK);
        return;
    }
    assert_int_equal(rc, REFUSED);
    assert_int_equal(o.error, ERR_INVALID_FIELD);
    assert_string_equal(o.field, field);
    json_decref(o.extra);
}

static void test_windows_are_whole_future_hours_within_the_bounds(void **state)
{
    expect_window(8, NOW, NOW + H, NULL);
    expect_window(16, NOW + H, NOW + 3 * H, NULL);
    expect_window(1, NOW + H, NOW + 336 * H, NULL);              /* reservation_max_hours */
    expect_window(1, NOW + 1343 * H, NOW + 1344 * H, NULL);      /* the horizon's last hour */
    expect_window(0, NOW, NOW + H, "cards");
    expect_window(12, NOW, NOW + H, "cards");                    /* more than 8: whole nodes */
    expect_window(264, NOW, NOW + H, "cards");
    expect_window(-8, NOW, NOW + H, "cards");
    expect_window((int64_t)1 << 40, NOW, NOW + H, "cards");      /* an int's overflow is no way in */
    expect_window(8, NOW - H, NOW, "starts_at");                 /* past */
    expect_window(8, NOW + 60, NOW + H, "starts_at");            /* unaligned */
    expect_window(8, NOW, NOW + H + 1, "ends_at");
    expect_window(8, NOW + H, NOW + H, "ends_at");               /* end == start */
    expect_window(8, NOW + 2 * H, NOW + H, "ends_at");           /* end < start */
    expect_window(8, NOW + 1343 * H, NOW + 1345 * H, "ends_at"); /* beyond the horizon */
    expect_window(8, NOW, NOW + 337 * H, "ends_at");             /* too long */
}

static void test_the_refund_rule(void **state)
{
    struct reservation r = {.starts_at = NOW + 100 * H, .amount = 1000001};
    assert_int_equal(reservation_refund_due(&r, NOW), 1000001);
    assert_int_equal(reservation_refund_due(&r, r.starts_at - 48 * H), 1000001); /* at the notice: in full */
    assert_int_equal(reservation_refund_due(&r, r.starts_at - 48 * H + 1), 500000); /* 50%, rounded down */
    assert_int_equal(reservation_refund_due(&r, r.starts_at - 1), 500000);
    assert_int_equal(reservation_refund_due(&r, r.starts_at), 0);
    assert_int_equal(reservation_refund_due(&r, r.starts_at + H), 0);
    fx.conf.reservation_late_refund_percent = 0;
    assert_int_equal(reservation_refund_due(&r, r.starts_at - 1), 0);
}

/* ---------------------------------------------------------------- on a database */

struct book {
    const char *user;
    int64_t cards, start, end, now;
    struct op_outcome o;
    struct reservation r;
    int cancel; /* cancel r.id instead */
};

static int book_txn(struct store *s, void *vctx)
{
    struct book *b = vctx;
    json_decref(b->o.extra);
    memset(&b->o, 0, sizeof b->o);
    if (b->cancel)
        return reservation_cancel(s, b->user, b->r.id, b->now, &b->r, &b->o);
    return reservation_book(s, b->user, FX_TST, b->cards, b->start, b->end, b->now, &b->r, &b->o);
}

static int run(struct book *b)
{
    int rc = store_txn(fx.s, book_txn, b);
    json_decref(b->o.extra);
    b->o.extra = NULL;
    return rc;
}

/* A user with cash and an 8-card reserved TST node. */
static void setup_pool(char user[ID_MAX], int64_t cash)
{
    fx_tst_type(fx.s);
    char node[ID_MAX];
    fx_ready_node(fx.s, "r1", FX_TST, 8, "ib-1", NOW - H, node);
    assert_int_equal(store_node_set_pool(fx.s, node, "reserved", NOW - H), STORE_OK);
    fx_user(fx.s, "holder@example.com", ROLE_USER, user);
    if (cash) {
        char id[ID_MAX];
        int dup;
        assert_int_equal(ledger_topup(fx.s, user, "pay-1", cash, "admin", NOW - H, id, &dup), STORE_OK);
    }
}

static void test_the_calendar_is_checked_every_hour(void **state)
{
    char user[ID_MAX];
    setup_pool(user, 1000000000);
    struct book a = {.user = user, .cards = 6, .start = NOW + 2 * H, .end = NOW + 5 * H, .now = NOW};
    assert_int_equal(run(&a), STORE_OK);
    assert_int_equal(a.r.amount, 6 * 3 * 3600 * FX_TST_PER_SECOND);
    /* 3 more overlap the block's last hour only: refused there. */
    struct book b = {.user = user, .cards = 3, .start = NOW + 4 * H, .end = NOW + 6 * H, .now = NOW};
    assert_int_equal(run(&b), REFUSED);
    assert_int_equal(b.o.error, ERR_INSUFFICIENT_CAPACITY);
    /* 2 fit beside it; 3 fit after it. */
    struct book c = {.user = user, .cards = 2, .start = NOW + 2 * H, .end = NOW + 5 * H, .now = NOW};
    assert_int_equal(run(&c), STORE_OK);
    struct book d = {.user = user, .cards = 3, .start = NOW + 5 * H, .end = NOW + 6 * H, .now = NOW};
    assert_int_equal(run(&d), STORE_OK);
    int64_t free_cards[6];
    assert_int_equal(reservation_free_hours(fx.s, FX_TST, NOW, NOW + 6 * H, free_cards, NULL), STORE_OK);
    int64_t want[6] = {8, 8, 0, 0, 0, 5};
    assert_memory_equal(free_cards, want, sizeof want);
    /* A cancelled block frees its hours. */
    a.cancel = 1;
    assert_int_equal(run(&a), STORE_OK);
    assert_int_equal(a.r.refunded, a.r.amount / 2); /* 2 hours ahead: inside the 48-hour notice */
    assert_int_equal(run(&b), STORE_OK);
    assert_ledger_whole();
}

static void test_a_block_is_paid_from_credit_then_cash_and_refunded_the_same_way(void **state)
{
    char user[ID_MAX], grant[ID_MAX];
    setup_pool(user, 0);
    /* 5 cards x 1 hour = 18.00; credit 10.00 (expiring), cash 20.00. */
    assert_int_equal(ledger_grant(fx.s, user, "admin", 10000000, NOW + 10 * H, NOW - H, "test", grant), STORE_OK);
    char id[ID_MAX];
    int dup;
    assert_int_equal(ledger_topup(fx.s, user, "pay-2", 20000000, "admin", NOW - H, id, &dup), STORE_OK);
    struct book a = {.user = user, .cards = 5, .start = NOW + 100 * H, .end = NOW + 101 * H, .now = NOW};
    assert_int_equal(run(&a), STORE_OK);
    char cash_acct[48];
    snprintf(cash_acct, sizeof cash_acct, "cash:%s", user);
    assert_int_equal(store_account_balance(fx.s, cash_acct), 12000000);
    assert_int_equal(fx_sql_int(fx.s, "SELECT remaining FROM credit_grants WHERE id = ?", grant), 0);
    /* Too little left for another hour of it: 402, nothing written. */
    int64_t txns = fx_last_txn(fx.s);
    struct book b = {.user = user, .cards = 5, .start = NOW + 102 * H, .end = NOW + 103 * H, .now = NOW};
    assert_int_equal(run(&b), REFUSED);
    assert_int_equal(b.o.error, ERR_INSUFFICIENT_FUNDS);
    assert_int_equal(fx_last_txn(fx.s), txns);
    /* The credit expires (spent: nothing to void); a late cancel (inside
     * the notice) refunds 50%, 9.00: the last drawn first, so the 8.00 of
     * cash, then 1.00 to the grant, which the next expiry pass voids. */
    assert_int_equal(ledger_expire_grants(fx.s, NULL, NOW + 11 * H), STORE_OK);
    a.cancel = 1;
    a.now = NOW + 60 * H;
    assert_int_equal(run(&a), STORE_OK);
    assert_int_equal(a.r.refunded, 9000000);
    assert_int_equal(store_account_balance(fx.s, cash_acct), 20000000);
    assert_int_equal(fx_sql_int(fx.s, "SELECT remaining FROM credit_grants WHERE id = ?", grant), 1000000);
    assert_ledger_whole();
    assert_int_equal(ledger_expire_grants(fx.s, NULL, NOW + 61 * H), STORE_OK);
    assert_int_equal(fx_sql_int(fx.s, "SELECT remaining FROM credit_grants WHERE id = ?", grant), 0);
    assert_ledger_whole();
}

static void test_a_refund_to_an_expired_grant_is_voided_again(void **state)
{
    char user[ID_MAX], grant[ID_MAX];
    setup_pool(user, 0);
    assert_int_equal(ledger_grant(fx.s, user, "admin", 20000000, NOW + 10 * H, NOW - H, "test", grant), STORE_OK);
    struct book a = {.user = user, .cards = 2, .start = NOW + 100 * H, .end = NOW + 101 * H, .now = NOW};
    assert_int_equal(run(&a), STORE_OK); /* 7.20 from the grant */
    assert_int_equal(ledger_expire_grants(fx.s, NULL, NOW + 11 * H), STORE_OK);
    a.cancel = 1;
    a.now = NOW + 12 * H;
    assert_int_equal(run(&a), STORE_OK);
    assert_int_equal(a.r.refunded, a.r.amount);
    /* Back to the grant and voided at once: nothing spendable came of it. */
    assert_int_equal(fx_sql_int(fx.s, "SELECT remaining FROM credit_grants WHERE id = ?", grant), 0);
    assert_int_equal(fx_sql_int(fx.s, "SELECT count(*) FROM ledger_transactions WHERE kind = 'expiry' AND grant_id = ?",
                                grant),
                     2);
    /* Cancelled twice: refused, nothing more. */
    assert_int_equal(run(&a), REFUSED);
    assert_int_equal(a.o.error, ERR_INVALID_STATE);
    assert_ledger_whole();
}

/* A block is bound to one node for its whole window (0028): 6 and 6 take
 * a node each; 4 more fit the pool's totals (2 + 2) but no single node, so
 * they are refused at booking rather than after paying. Availability says
 * 4 cards free and 2 as the largest block; a 2-card block still books. */
static void test_a_block_is_bound_to_one_node_and_fragments_are_refused(void **state)
{
    char user[ID_MAX], node2[ID_MAX];
    setup_pool(user, 1000000000);
    fx_ready_node(fx.s, "r2", FX_TST, 8, "ib-1", NOW - H, node2);
    assert_int_equal(store_node_set_pool(fx.s, node2, "reserved", NOW - H), STORE_OK);
    struct book a = {.user = user, .cards = 6, .start = NOW + 2 * H, .end = NOW + 4 * H, .now = NOW};
    struct book b = {.user = user, .cards = 6, .start = NOW + 3 * H, .end = NOW + 5 * H, .now = NOW};
    assert_int_equal(run(&a), STORE_OK);
    assert_int_equal(run(&b), STORE_OK);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(DISTINCT node_id) FROM reservation_nodes WHERE reservation_id IN ('%s', '%s')",
             a.r.id, b.r.id);
    assert_int_equal(fx_sql_int(fx.s, sql, NULL), 2);
    struct book c = {.user = user, .cards = 4, .start = NOW + 3 * H, .end = NOW + 4 * H, .now = NOW};
    int64_t txns = fx_last_txn(fx.s);
    assert_int_equal(store_txn(fx.s, book_txn, &c), REFUSED);
    assert_int_equal(c.o.error, ERR_INSUFFICIENT_CAPACITY);
    assert_true(json_is_true(json_object_get(c.o.extra, "single_node")));
    assert_non_null(strstr(c.o.message, "no single"));
    json_decref(c.o.extra);
    c.o.extra = NULL;
    assert_int_equal(fx_last_txn(fx.s), txns);
    int64_t free_cards[3], largest[3];
    assert_int_equal(reservation_free_hours(fx.s, FX_TST, NOW + 2 * H, NOW + 5 * H, free_cards, largest), STORE_OK);
    int64_t want_free[3] = {10, 4, 10}, want_largest[3] = {8, 2, 8};
    assert_memory_equal(free_cards, want_free, sizeof want_free);
    assert_memory_equal(largest, want_largest, sizeof want_largest);
    /* Outside the overlap the 4 fit on the node the other 6 leaves. */
    struct book d = {.user = user, .cards = 4, .start = NOW + 2 * H, .end = NOW + 3 * H, .now = NOW};
    assert_int_equal(run(&d), STORE_OK);
    struct book e = {.user = user, .cards = 2, .start = NOW + 3 * H, .end = NOW + 4 * H, .now = NOW};
    assert_int_equal(run(&e), STORE_OK);
    assert_ledger_whole();
}

/* ledger verify sees a block whose rows were changed behind the ledger. */
static void test_ledger_verify_catches_a_tampered_block(void **state)
{
    char user[ID_MAX];
    setup_pool(user, 1000000000);
    struct book a = {.user = user, .cards = 4, .start = NOW + 100 * H, .end = NOW + 102 * H, .now = NOW};
    assert_int_equal(run(&a), STORE_OK);
    assert_ledger_whole();
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE reservations SET refunded = 5 WHERE id = '%s'", a.r.id);
    fx_sql_exec(fx.s, sql);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    int breaches = ledger_verify(fx.s, out);
    fclose(out);
    assert_true(breaches >= 2); /* revenue against paid less refunded, and a refund without a cancellation */
    assert_non_null(strstr(text, a.r.id));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_windows_are_whole_future_hours_within_the_bounds, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_the_refund_rule, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_the_calendar_is_checked_every_hour, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_a_block_is_paid_from_credit_then_cash_and_refunded_the_same_way,
                                        fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_a_refund_to_an_expired_grant_is_voided_again, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_a_block_is_bound_to_one_node_and_fragments_are_refused, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_ledger_verify_catches_a_tampered_block, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
