/* test_ledger.c: the money movements of ledger.c on a temporary migrated
 * database: grants, top-ups (a repeated payment, a colliding one), charges
 * (grants soonest expiry first, then cash; all or nothing), expiry, invite
 * codes, refunds (last drawn first, a voided grant voided again, never more
 * than was charged), closing an interval below what was charged, the
 * billable end, and what a user can spend. Every movement runs in
 * store_txn, as the daemon runs it; after each, every new ledger
 * transaction must balance and ledger verify must find nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_fixtures.h"

/* ---------------------------------------------------------------- movements */

enum op_kind { OP_GRANT, OP_TOPUP, OP_CHARGE, OP_BILL, OP_EXPIRE, OP_REDEEM, OP_REFUND, OP_CLOSE };

/* One movement and what it needs; the outputs are filled by the callback. */
struct op {
    enum op_kind kind;
    const char *user;        /* whose money (OP_EXPIRE: NULL for everyone) */
    const char *text;        /* grant source, payment id, invite code */
    const char *instance;    /* OP_CHARGE, OP_BILL, OP_REFUND, OP_CLOSE */
    int64_t amount;          /* micro-yuan */
    int64_t at;              /* the time the movement is for */
    int64_t expires_at;      /* OP_GRANT: 0 never */
    int64_t interval_id;     /* OP_CHARGE */
    int64_t ended_at;        /* OP_CLOSE */
    char id[ID_MAX];         /* out: the grant or top-up made */
    int duplicate;           /* out: OP_TOPUP was a repeat */
};

/* OP_BILL and OP_REFUND also record what the interval has been charged,
 * as billing does after each, so the ledger stays whole. */
static int op_txn(struct store *s, void *vctx)
{
    struct op *o = vctx;
    struct billable b;
    int rc;
    switch (o->kind) {
    case OP_GRANT:
        return ledger_grant(s, o->user, o->text ? o->text : "admin", o->amount, o->expires_at, o->at, "test grant",
                            o->id);
    case OP_TOPUP:
        return ledger_topup(s, o->user, o->text, o->amount, "admin", o->at, o->id, &o->duplicate);
    case OP_CHARGE:
        return ledger_charge(s, o->user, o->amount, o->at, o->instance, o->interval_id, "test usage");
    case OP_BILL:
        if ((rc = store_interval_get_open(s, o->instance, &b)) != STORE_OK ||
            (rc = ledger_charge(s, b.user_id, o->amount, o->at, b.instance_id, b.id, "test usage")) != STORE_OK)
            return rc;
        return store_interval_billed(s, b.id, b.billed + o->amount, 0, -1);
    case OP_EXPIRE:
        return ledger_expire_grants(s, o->user, o->at);
    case OP_REDEEM:
        return ledger_redeem_invite(s, o->user, o->text, o->at, o->id);
    case OP_REFUND:
        if ((rc = store_interval_get_open(s, o->instance, &b)) != STORE_OK ||
            (rc = ledger_refund(s, &b, o->amount, o->at, "test refund")) != STORE_OK)
            return rc;
        return o->amount > 0 ? store_interval_billed(s, b.id, b.billed - o->amount, 0, -1) : STORE_OK;
    case OP_CLOSE:
        return ledger_close_interval(s, o->instance, o->ended_at, "test close", o->at);
    }
    return STORE_ERROR;
}

/* Every transaction after `after` balances and has two legs or more, and
 * ledger verify finds no breach anywhere. */
static void assert_ledger_whole(int64_t after)
{
    int64_t unbalanced = fx_sql_int_n(
        fx.s,
        "SELECT count(*) FROM (SELECT t.id FROM ledger_transactions t LEFT JOIN ledger_postings p"
        " ON p.transaction_id = t.id WHERE t.id > ?1 GROUP BY t.id"
        " HAVING coalesce(sum(p.amount), 0) <> 0 OR count(p.id) < 2)",
        after);
    assert_int_equal(unbalanced, 0);
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

/* Runs o in store_txn and checks the ledger after it; o's result. */
static int movement(struct op *o)
{
    int64_t before = fx_last_txn(fx.s);
    int rc = store_txn(fx.s, op_txn, o);
    assert_ledger_whole(before);
    return rc;
}

/* The ledger transactions posted by one movement. */
static int64_t txns_since(int64_t after)
{
    return fx_sql_int_n(fx.s, "SELECT count(*) FROM ledger_transactions WHERE id > ?1", after);
}

static int64_t balance(const char *prefix, const char *id)
{
    char account[64];
    snprintf(account, sizeof account, "%s%s", prefix, id);
    return store_account_balance(fx.s, account);
}

static int64_t cash(const char *user) { return balance("cash:", user); }

static struct grant grant_of(const char *user, const char *id)
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

static void grant(const char *user, int64_t amount, int64_t expires_at, char id[ID_MAX])
{
    struct op o = {.kind = OP_GRANT, .user = user, .amount = amount, .expires_at = expires_at, .at = 100};
    assert_int_equal(movement(&o), STORE_OK);
    if (id)
        memcpy(id, o.id, ID_MAX);
}

static void topup(const char *user, const char *payment, int64_t amount)
{
    struct op o = {.kind = OP_TOPUP, .user = user, .text = payment, .amount = amount, .at = 100};
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(o.duplicate, 0);
}

static void bill(const char *instance, int64_t amount, int64_t at)
{
    struct op o = {.kind = OP_BILL, .instance = instance, .amount = amount, .at = at};
    assert_int_equal(movement(&o), STORE_OK);
}

/* Amount of the leg of transaction txn on account. */
static int64_t leg(int64_t txn, const char *account)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT coalesce(sum(amount), 0) FROM ledger_postings WHERE transaction_id = %lld AND account_id = ?1",
             (long long)txn);
    return fx_sql_int(fx.s, sql, account);
}

static char alice[ID_MAX], bob[ID_MAX];

static void users(void)
{
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    fx_tst_type(fx.s);
}

/* ---------------------------------------------------------------- grants */

static void test_grant_credits_a_grant_account_from_promotion(void **state)
{
    users();
    int64_t before = fx_last_txn(fx.s);
    char id[ID_MAX];
    grant(alice, 5000000, 0, id);
    assert_true(id_valid("grt", id));
    assert_int_equal(txns_since(before), 1);
    assert_int_equal(balance("grant:", id), 5000000);
    assert_int_equal(store_account_balance(fx.s, "promotion"), -5000000);
    struct grant g = grant_of(alice, id);
    assert_int_equal(g.amount, 5000000);
    assert_int_equal(g.remaining, 5000000);
    assert_int_equal(g.expires_at, 0);
    assert_string_equal(g.source, "admin");
    char kind[16];
    fx_sql_text(fx.s, "SELECT kind FROM ledger_transactions WHERE grant_id = ?1", id, kind, sizeof kind);
    assert_string_equal(kind, "grant");
}

static void test_grant_of_nothing_is_refused_and_posts_nothing(void **state)
{
    users();
    int64_t before = fx_last_txn(fx.s);
    struct op zero = {.kind = OP_GRANT, .user = alice, .amount = 0, .at = 100};
    struct op negative = {.kind = OP_GRANT, .user = alice, .amount = -1, .at = 100};
    assert_int_equal(movement(&zero), STORE_ERROR);
    assert_int_equal(movement(&negative), STORE_ERROR);
    assert_int_equal(txns_since(before), 0);
}

static void test_grant_past_max_balance_is_refused_and_posts_nothing(void **state)
{
    users();
    daemon_config->max_balance_micro = 10000000;
    topup(alice, "pay-1", 6000000);
    int64_t before = fx_last_txn(fx.s);
    struct op over = {.kind = OP_GRANT, .user = alice, .amount = 4000001, .at = 100};
    assert_int_equal(movement(&over), LEDGER_OVER_BALANCE);
    assert_int_equal(txns_since(before), 0);
    struct grant g[4];
    size_t n;
    assert_int_equal(store_grants_of(fx.s, alice, g, 4, &n), STORE_OK);
    assert_int_equal(n, 0);
    /* Up to the limit exactly is allowed. */
    grant(alice, 4000000, 0, NULL);
}

/* ---------------------------------------------------------------- top-ups */

static void test_topup_adds_cash_from_payments(void **state)
{
    users();
    struct op o = {.kind = OP_TOPUP, .user = alice, .text = "pay-1", .amount = 20000000, .at = 300};
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(o.duplicate, 0);
    assert_true(id_valid("top", o.id));
    assert_int_equal(cash(alice), 20000000);
    assert_int_equal(store_account_balance(fx.s, "payments"), -20000000);
    struct topup t;
    assert_int_equal(store_topup_by_payment(fx.s, "pay-1", &t), STORE_OK);
    assert_string_equal(t.id, o.id);
    assert_string_equal(t.user_id, alice);
    assert_int_equal(t.amount, 20000000);
    assert_int_equal(t.created_at, 300);
}

static void test_repeated_payment_is_a_duplicate_with_nothing_posted(void **state)
{
    users();
    struct op first = {.kind = OP_TOPUP, .user = alice, .text = "pay-1", .amount = 20000000, .at = 300};
    assert_int_equal(movement(&first), STORE_OK);
    int64_t before = fx_last_txn(fx.s);
    struct op again = first;
    memset(again.id, 0, sizeof again.id);
    again.at = 400;
    assert_int_equal(movement(&again), STORE_OK);
    assert_int_equal(again.duplicate, 1);
    assert_string_equal(again.id, first.id);
    assert_int_equal(txns_since(before), 0);
    assert_int_equal(cash(alice), 20000000);
}

static void test_same_payment_for_another_user_or_amount_is_a_conflict(void **state)
{
    users();
    topup(alice, "pay-1", 20000000);
    int64_t before = fx_last_txn(fx.s);
    struct op other_user = {.kind = OP_TOPUP, .user = bob, .text = "pay-1", .amount = 20000000, .at = 300};
    struct op other_amount = {.kind = OP_TOPUP, .user = alice, .text = "pay-1", .amount = 20000001, .at = 300};
    assert_int_equal(movement(&other_user), STORE_CONFLICT);
    assert_int_equal(movement(&other_amount), STORE_CONFLICT);
    assert_int_equal(txns_since(before), 0);
    assert_int_equal(cash(alice), 20000000);
    assert_int_equal(cash(bob), 0);
}

static void test_topup_past_max_balance_is_refused_and_not_recorded(void **state)
{
    users();
    daemon_config->max_balance_micro = 10000000;
    int64_t before = fx_last_txn(fx.s);
    struct op o = {.kind = OP_TOPUP, .user = alice, .text = "pay-big", .amount = 10000001, .at = 300};
    assert_int_equal(movement(&o), LEDGER_OVER_BALANCE);
    assert_int_equal(txns_since(before), 0);
    struct topup t;
    assert_int_equal(store_topup_by_payment(fx.s, "pay-big", &t), STORE_NOT_FOUND);
    /* The payment id is still free for the amount that fits. */
    topup(alice, "pay-big", 10000000);
}

/* ---------------------------------------------------------------- charges */

static void test_charge_draws_grants_soonest_expiry_first_then_cash(void **state)
{
    users();
    char later[ID_MAX], never[ID_MAX], soonest[ID_MAX];
    grant(alice, 300, 2000, later);
    grant(alice, 500, 0, never);
    grant(alice, 200, 1500, soonest);
    topup(alice, "pay-1", 1000);

    struct op o = {.kind = OP_CHARGE, .user = alice, .amount = 800, .at = 1000};
    assert_int_equal(movement(&o), STORE_OK);
    int64_t t = fx_last_txn(fx.s);
    /* 200 from the grant expiring at 1500, 300 from the one at 2000, the
     * rest from the one that never expires; no cash. */
    assert_int_equal(grant_of(alice, soonest).remaining, 0);
    assert_int_equal(grant_of(alice, later).remaining, 0);
    assert_int_equal(grant_of(alice, never).remaining, 200);
    assert_int_equal(cash(alice), 1000);
    char acct[64];
    snprintf(acct, sizeof acct, "grant:%s", soonest);
    assert_int_equal(leg(t, acct), -200);
    snprintf(acct, sizeof acct, "grant:%s", later);
    assert_int_equal(leg(t, acct), -300);
    snprintf(acct, sizeof acct, "grant:%s", never);
    assert_int_equal(leg(t, acct), -300);
    assert_int_equal(leg(t, "revenue"), 800);
    /* Every grant leg names its grant. */
    assert_int_equal(fx_sql_int_n(fx.s,
                                  "SELECT count(*) FROM ledger_postings WHERE transaction_id = ?1"
                                  " AND account_id LIKE 'grant:%' AND account_id = 'grant:' || grant_id",
                                  t),
                     3);

    /* The next charge takes the last 200 of credit, then cash. */
    o.amount = 500;
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(grant_of(alice, never).remaining, 0);
    assert_int_equal(cash(alice), 700);
    assert_int_equal(store_account_balance(fx.s, "revenue"), 1300);
}

static void test_charge_the_funds_cannot_cover_is_a_conflict_that_leaves_nothing(void **state)
{
    users();
    char g[ID_MAX];
    grant(alice, 300, 0, g);
    topup(alice, "pay-1", 200);
    int64_t before = fx_last_txn(fx.s);
    struct op o = {.kind = OP_CHARGE, .user = alice, .amount = 501, .at = 1000};
    assert_int_equal(movement(&o), STORE_CONFLICT);
    assert_int_equal(txns_since(before), 0);
    assert_int_equal(grant_of(alice, g).remaining, 300);
    assert_int_equal(cash(alice), 200);
    /* Exactly what there is goes through. */
    o.amount = 500;
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(cash(alice), 0);
}

/* Usage is charged for the second before `at`: a grant expiring at `at`
 * still pays, one expiring earlier does not. */
static void test_charge_may_draw_a_grant_expiring_at_its_own_second(void **state)
{
    users();
    char g[ID_MAX];
    grant(alice, 300, 1000, g);
    struct op at_expiry = {.kind = OP_CHARGE, .user = alice, .amount = 100, .at = 1000};
    assert_int_equal(movement(&at_expiry), STORE_OK);
    assert_int_equal(grant_of(alice, g).remaining, 200);
    struct op after = {.kind = OP_CHARGE, .user = alice, .amount = 100, .at = 1001};
    assert_int_equal(movement(&after), STORE_CONFLICT);
    assert_int_equal(grant_of(alice, g).remaining, 200);
}

static void test_charge_of_zero_posts_nothing_and_a_negative_one_is_an_error(void **state)
{
    users();
    topup(alice, "pay-1", 1000);
    int64_t before = fx_last_txn(fx.s);
    struct op zero = {.kind = OP_CHARGE, .user = alice, .amount = 0, .at = 1000};
    struct op negative = {.kind = OP_CHARGE, .user = alice, .amount = -5, .at = 1000};
    assert_int_equal(movement(&zero), STORE_OK);
    assert_int_equal(movement(&negative), STORE_ERROR);
    assert_int_equal(txns_since(before), 0);
    assert_int_equal(cash(alice), 1000);
}

/* More grants than one read of them returns (64): all are drawn, in order. */
static void test_charge_draws_more_grants_than_one_read_returns(void **state)
{
    users();
    for (int i = 0; i < 70; i++)
        grant(alice, 10, 5000 + i, NULL);
    struct op o = {.kind = OP_CHARGE, .user = alice, .amount = 695, .at = 1000};
    assert_int_equal(movement(&o), STORE_OK);
    int64_t t = fx_last_txn(fx.s);
    assert_int_equal(fx_sql_int_n(fx.s, "SELECT count(*) FROM ledger_postings WHERE transaction_id = ?1", t), 71);
    int64_t credit = 0, c = 0;
    assert_int_equal(store_user_funds(fx.s, alice, 1000, &c, &credit), STORE_OK);
    assert_int_equal(credit, 5);
    /* The grant left with money is the one expiring last. */
    struct grant g[1];
    size_t n;
    assert_int_equal(store_grants_spendable(fx.s, alice, 1000, g, 1, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(g[0].expires_at, 5069);
    assert_int_equal(g[0].remaining, 5);
}

/* ---------------------------------------------------------------- expiry */

static void test_expire_voids_the_remainder_of_expired_grants_only(void **state)
{
    users();
    char soon[ID_MAX], later[ID_MAX], never[ID_MAX];
    grant(alice, 500, 1000, soon);
    grant(alice, 500, 5000, later);
    grant(alice, 500, 0, never);
    struct op spend = {.kind = OP_CHARGE, .user = alice, .amount = 200, .at = 900};
    assert_int_equal(movement(&spend), STORE_OK);

    int64_t before = fx_last_txn(fx.s);
    struct op o = {.kind = OP_EXPIRE, .user = alice, .at = 1000};
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(txns_since(before), 1);
    struct grant g = grant_of(alice, soon);
    assert_int_equal(g.remaining, 0);
    assert_int_equal(g.voided_at, 1000);
    assert_int_equal(balance("grant:", soon), 0);
    int64_t t = fx_last_txn(fx.s);
    char kind[16];
    fx_sql_text(fx.s, "SELECT kind || ' ' || at FROM ledger_transactions WHERE grant_id = ?1 AND kind = 'expiry'", soon,
                kind, sizeof kind);
    assert_string_equal(kind, "expiry 1000");
    assert_int_equal(leg(t, "promotion"), 300);
    assert_int_equal(grant_of(alice, later).remaining, 500);
    assert_int_equal(grant_of(alice, never).remaining, 500);

    /* Nothing is left to void: a second pass posts nothing. */
    before = fx_last_txn(fx.s);
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(txns_since(before), 0);
}

static void test_expire_for_everyone_skips_users_with_running_time_to_bill(void **state)
{
    users();
    char a[ID_MAX], b[ID_MAX];
    grant(alice, 500, 1000, a);
    grant(bob, 500, 1000, b);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 900, &in, &iv);

    struct op everyone = {.kind = OP_EXPIRE, .user = NULL, .at = 2000};
    assert_int_equal(movement(&everyone), STORE_OK);
    assert_int_equal(grant_of(bob, b).voided_at, 1000);
    assert_int_equal(grant_of(alice, a).voided_at, 0);
    assert_int_equal(grant_of(alice, a).remaining, 500);
    /* Her own billing voids hers once it has spent up to the expiry. */
    struct op hers = {.kind = OP_EXPIRE, .user = alice, .at = 2000};
    assert_int_equal(movement(&hers), STORE_OK);
    assert_int_equal(grant_of(alice, a).voided_at, 1000);
}

/* ---------------------------------------------------------------- invite codes */

static void invite(const char *code, int64_t amount, int64_t credit_days, int64_t expires_at, int64_t max_uses)
{
    struct invite_code c = {.amount = amount, .credit_days = credit_days, .expires_at = expires_at,
                            .max_uses = max_uses, .created_at = 10};
    snprintf(c.code, sizeof c.code, "%s", code);
    assert_int_equal(store_invite_insert(fx.s, &c), STORE_OK);
}

static void test_redeem_invite_grants_its_credit_with_its_expiry(void **state)
{
    users();
    invite("WELCOME", 2000000, 2, 0, 0);
    struct op o = {.kind = OP_REDEEM, .user = alice, .text = "WELCOME", .at = 1000};
    assert_int_equal(movement(&o), STORE_OK);
    struct grant g = grant_of(alice, o.id);
    assert_string_equal(g.source, "invite:WELCOME");
    assert_int_equal(g.amount, 2000000);
    assert_int_equal(g.expires_at, 1000 + 2 * 86400);
    struct invite_code c;
    assert_int_equal(store_invite_get(fx.s, "WELCOME", &c), STORE_OK);
    assert_int_equal(c.uses, 1);
}

static void test_redeeming_twice_is_a_conflict_and_grants_once(void **state)
{
    users();
    invite("WELCOME", 2000000, 0, 0, 0);
    struct op o = {.kind = OP_REDEEM, .user = alice, .text = "WELCOME", .at = 1000};
    assert_int_equal(movement(&o), STORE_OK);
    int64_t before = fx_last_txn(fx.s);
    struct op again = {.kind = OP_REDEEM, .user = alice, .text = "WELCOME", .at = 1001};
    assert_int_equal(movement(&again), STORE_CONFLICT);
    assert_int_equal(txns_since(before), 0);
    struct grant g[4];
    size_t n;
    assert_int_equal(store_grants_of(fx.s, alice, g, 4, &n), STORE_OK);
    assert_int_equal(n, 1);
    struct invite_code c;
    assert_int_equal(store_invite_get(fx.s, "WELCOME", &c), STORE_OK);
    assert_int_equal(c.uses, 1);
    /* Someone else may. */
    struct op hers = {.kind = OP_REDEEM, .user = bob, .text = "WELCOME", .at = 1001};
    assert_int_equal(movement(&hers), STORE_OK);
}

static void test_unknown_expired_or_used_up_invite_is_not_found(void **state)
{
    users();
    invite("OLD", 1000000, 0, 2000, 0);
    invite("ONCE", 1000000, 0, 0, 1);
    int64_t before = fx_last_txn(fx.s);
    struct op unknown = {.kind = OP_REDEEM, .user = alice, .text = "NOSUCH", .at = 1000};
    struct op expired = {.kind = OP_REDEEM, .user = alice, .text = "OLD", .at = 2000};
    assert_int_equal(movement(&unknown), STORE_NOT_FOUND);
    assert_int_equal(movement(&expired), STORE_NOT_FOUND);
    assert_int_equal(txns_since(before), 0);
    struct op just_in_time = {.kind = OP_REDEEM, .user = alice, .text = "OLD", .at = 1999};
    assert_int_equal(movement(&just_in_time), STORE_OK);
    struct op first = {.kind = OP_REDEEM, .user = alice, .text = "ONCE", .at = 1000};
    struct op second = {.kind = OP_REDEEM, .user = bob, .text = "ONCE", .at = 1000};
    assert_int_equal(movement(&first), STORE_OK);
    before = fx_last_txn(fx.s);
    assert_int_equal(movement(&second), STORE_NOT_FOUND);
    assert_int_equal(txns_since(before), 0);
}

/* ---------------------------------------------------------------- the billable end */

static void test_billable_end_caps_an_open_interval_at_confirmed_until(void **state)
{
    struct billable b = {.started_at = 1000, .ended_at = 0, .confirmed_until = -1};
    assert_int_equal(ledger_billable_end(&b, 5000), 5000);
    b.confirmed_until = 3000;
    assert_int_equal(ledger_billable_end(&b, 5000), 3000);
    /* A cap later than now does not move the end past now. */
    b.confirmed_until = 9000;
    assert_int_equal(ledger_billable_end(&b, 5000), 5000);
    /* A node that missed a beat before the interval even started. */
    b.confirmed_until = 0;
    assert_int_equal(ledger_billable_end(&b, 5000), 0);
}

static void test_billable_end_of_an_ended_interval_is_its_end_not_capped(void **state)
{
    struct billable b = {.started_at = 1000, .ended_at = 4000, .confirmed_until = 2000};
    assert_int_equal(ledger_billable_end(&b, 5000), 4000);
    /* Before its end it is charged up to now. */
    assert_int_equal(ledger_billable_end(&b, 3000), 3000);
}

/* The store fills confirmed_until from the interval's nodes: the last good
 * beat of one that has missed one since, until a good beat clears it. */
static void test_an_interval_on_a_quiet_node_is_charged_to_its_last_good_beat(void **state)
{
    users();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 2, 1000, &in, &iv);
    assert_int_equal(fx_claim(fx.s, in.id, 0, node, 0x3), STORE_OK);
    assert_int_equal(fx_beat(fx.s, node, 1100, FX_TST, 8, 0), STORE_OK);
    assert_int_equal(store_node_beat_missed(fx.s, node, 1105, 3, 600, "timeout"), STORE_OK);

    struct billable b;
    assert_int_equal(store_interval_get_open(fx.s, in.id, &b), STORE_OK);
    assert_int_equal(b.confirmed_until, 1100);
    assert_int_equal(ledger_billable_end(&b, 1200), 1100);
    int64_t unbilled;
    assert_int_equal(ledger_unbilled(fx.s, alice, 1200, &unbilled), STORE_OK);
    assert_int_equal(unbilled, 2 * 100 * FX_TST_PER_SECOND);

    assert_int_equal(fx_beat(fx.s, node, 1210, FX_TST, 8, 0), STORE_OK);
    assert_int_equal(store_interval_get_open(fx.s, in.id, &b), STORE_OK);
    assert_int_equal(b.confirmed_until, -1);
    assert_int_equal(ledger_unbilled(fx.s, alice, 1210, &unbilled), STORE_OK);
    assert_int_equal(unbilled, 2 * 210 * FX_TST_PER_SECOND);
}

/* ---------------------------------------------------------------- refunds */

static void test_refund_goes_back_last_drawn_first(void **state)
{
    users();
    char g[ID_MAX];
    grant(alice, 300, 0, g);
    topup(alice, "pay-1", 1000);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &in, &iv);
    bill(in.id, 500, 1100); /* grant 300, then cash 200 */
    assert_int_equal(cash(alice), 800);

    struct op o = {.kind = OP_REFUND, .instance = in.id, .amount = 250, .at = 1200};
    assert_int_equal(movement(&o), STORE_OK);
    int64_t t = fx_last_txn(fx.s);
    char acct[64];
    snprintf(acct, sizeof acct, "cash:%s", alice);
    assert_int_equal(leg(t, acct), 200); /* cash, drawn last, first */
    snprintf(acct, sizeof acct, "grant:%s", g);
    assert_int_equal(leg(t, acct), 50);
    assert_int_equal(leg(t, "revenue"), -250);
    assert_int_equal(cash(alice), 1000);
    assert_int_equal(grant_of(alice, g).remaining, 50);
    assert_int_equal(store_account_balance(fx.s, "revenue"), 250);
    char kind[16];
    fx_sql_text(fx.s, "SELECT kind FROM ledger_transactions ORDER BY id DESC LIMIT 1", NULL, kind, sizeof kind);
    assert_string_equal(kind, "refund");
    assert_int_equal(fx_sql_int_n(fx.s, "SELECT interval_id FROM ledger_transactions WHERE id = ?1", t), iv);

    /* What is left to give back is what the grant still paid. */
    struct interval_payer *p;
    size_t n;
    assert_int_equal(store_interval_payers(fx.s, iv, &p, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(p[0].grant_id, g);
    assert_int_equal(p[0].paid, 250);
    free(p);
}

static void test_refund_to_a_grant_voided_meanwhile_is_voided_again(void **state)
{
    users();
    char g[ID_MAX];
    grant(alice, 300, 1500, g);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &in, &iv);
    bill(in.id, 200, 1400);
    struct op expire = {.kind = OP_EXPIRE, .user = alice, .at = 1600};
    assert_int_equal(movement(&expire), STORE_OK);
    assert_int_equal(grant_of(alice, g).voided_at, 1500);
    int64_t promotion = store_account_balance(fx.s, "promotion");

    int64_t before = fx_last_txn(fx.s);
    struct op o = {.kind = OP_REFUND, .instance = in.id, .amount = 150, .at = 1700};
    assert_int_equal(movement(&o), STORE_OK);
    /* A refund to the grant, then its void by an expiry transaction. */
    assert_int_equal(txns_since(before), 2);
    char kinds[64];
    fx_sql_text(fx.s, "SELECT group_concat(kind, ',') FROM (SELECT kind FROM ledger_transactions ORDER BY id DESC LIMIT 2)",
                NULL, kinds, sizeof kinds);
    assert_string_equal(kinds, "expiry,refund");
    assert_int_equal(grant_of(alice, g).remaining, 0);
    assert_int_equal(balance("grant:", g), 0);
    assert_int_equal(store_account_balance(fx.s, "promotion"), promotion + 150);
    assert_int_equal(store_account_balance(fx.s, "revenue"), 50);
}

static void test_refund_larger_than_was_charged_is_an_error_that_leaves_nothing(void **state)
{
    users();
    topup(alice, "pay-1", 1000);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &in, &iv);
    bill(in.id, 300, 1100);
    int64_t before = fx_last_txn(fx.s);
    struct op o = {.kind = OP_REFUND, .instance = in.id, .amount = 301, .at = 1200};
    assert_int_equal(movement(&o), STORE_ERROR);
    assert_int_equal(txns_since(before), 0);
    assert_int_equal(cash(alice), 700);
    /* A negative refund is an error too, a zero one nothing at all. */
    o.amount = -1;
    assert_int_equal(movement(&o), STORE_ERROR);
    o.amount = 0;
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(txns_since(before), 0);
}

/* ---------------------------------------------------------------- closing an interval */

static void test_close_interval_refunds_what_was_charged_past_its_new_end(void **state)
{
    users();
    topup(alice, "pay-1", 1000000);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &in, &iv);
    bill(in.id, 100 * FX_TST_PER_SECOND, 1100);
    int64_t before = fx_last_txn(fx.s);
    struct op o = {.kind = OP_CLOSE, .instance = in.id, .ended_at = 1050, .at = 1200};
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(txns_since(before), 1);
    assert_int_equal(cash(alice), 1000000 - 50 * FX_TST_PER_SECOND);
    struct billable *b;
    size_t n;
    assert_int_equal(store_billables(fx.s, alice, &b, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(b[0].ended_at, 1050);
    assert_int_equal(b[0].billed, 50 * FX_TST_PER_SECOND);
    free(b);
    struct billable open;
    assert_int_equal(store_interval_get_open(fx.s, in.id, &open), STORE_NOT_FOUND);
}

static void test_close_interval_past_what_was_charged_refunds_nothing(void **state)
{
    users();
    topup(alice, "pay-1", 1000000);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &in, &iv);
    bill(in.id, 100 * FX_TST_PER_SECOND, 1100);
    int64_t before = fx_last_txn(fx.s);
    struct op o = {.kind = OP_CLOSE, .instance = in.id, .ended_at = 1200, .at = 1200};
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(txns_since(before), 0);
    struct billable *b;
    size_t n;
    assert_int_equal(store_billables(fx.s, alice, &b, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(b[0].ended_at, 1200);
    assert_int_equal(b[0].billed, 100 * FX_TST_PER_SECOND);
    free(b);
}

static void test_close_interval_before_its_start_ends_there_and_refunds_everything(void **state)
{
    users();
    topup(alice, "pay-1", 1000000);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &in, &iv);
    bill(in.id, 30 * FX_TST_PER_SECOND, 1030);
    struct op o = {.kind = OP_CLOSE, .instance = in.id, .ended_at = 900, .at = 1200};
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(cash(alice), 1000000);
    assert_int_equal(fx_sql_int_n(fx.s, "SELECT ended_at FROM running_intervals WHERE id = ?1", iv), 1000);
    assert_int_equal(fx_sql_int_n(fx.s, "SELECT billed FROM running_intervals WHERE id = ?1", iv), 0);
}

static void test_close_without_an_open_interval_is_a_no_op(void **state)
{
    users();
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "stopped", 1000, &in);
    int64_t before = fx_last_txn(fx.s);
    struct op o = {.kind = OP_CLOSE, .instance = in.id, .ended_at = 1050, .at = 1200};
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(txns_since(before), 0);
    /* Nor does an interval never charged post anything when it closes. */
    int64_t iv;
    struct instance running;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &running, &iv);
    o.instance = running.id;
    assert_int_equal(movement(&o), STORE_OK);
    assert_int_equal(txns_since(before), 0);
    assert_int_equal(fx_sql_int_n(fx.s, "SELECT ended_at FROM running_intervals WHERE id = ?1", iv), 1050);
}

/* ---------------------------------------------------------------- funds */

static void test_funds_count_cash_and_credit_valid_at_the_second(void **state)
{
    users();
    topup(alice, "pay-1", 1000);
    grant(alice, 500, 2000, NULL);
    grant(alice, 70, 0, NULL);
    struct funds f;
    assert_int_equal(ledger_funds(fx.s, alice, 1999, &f), STORE_OK);
    assert_int_equal(f.cash, 1000);
    assert_int_equal(f.credit, 570);
    assert_int_equal(f.available, 1570);
    assert_int_equal(f.unbilled, 0);
    assert_int_equal(ledger_funds(fx.s, alice, 2000, &f), STORE_OK);
    assert_int_equal(f.credit, 70);
    assert_int_equal(f.available, 1070);
    /* Someone with nothing has nothing. */
    assert_int_equal(ledger_funds(fx.s, bob, 2000, &f), STORE_OK);
    assert_int_equal(f.available, 0);
}

static void test_unbilled_is_what_ran_beyond_what_was_posted(void **state)
{
    users();
    topup(alice, "pay-1", 1000000);
    struct instance a, b;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 2, 1000, &a, &iv);
    int64_t unbilled;
    assert_int_equal(ledger_unbilled(fx.s, alice, 1000, &unbilled), STORE_OK);
    assert_int_equal(unbilled, 0);
    assert_int_equal(ledger_unbilled(fx.s, alice, 1010, &unbilled), STORE_OK);
    assert_int_equal(unbilled, 2 * 10 * FX_TST_PER_SECOND);
    bill(a.id, 5000, 1005);
    assert_int_equal(ledger_unbilled(fx.s, alice, 1010, &unbilled), STORE_OK);
    assert_int_equal(unbilled, 20000 - 5000);
    /* An ended interval counts up to its end only. */
    fx_running(fx.s, alice, FX_TST, 1, 1000, &b, &iv);
    assert_int_equal(store_interval_close(fx.s, b.id, 1004, "stop"), STORE_OK);
    assert_int_equal(ledger_unbilled(fx.s, alice, 1010, &unbilled), STORE_OK);
    assert_int_equal(unbilled, 15000 + 4 * FX_TST_PER_SECOND);
    /* Others' usage is not hers. */
    assert_int_equal(ledger_unbilled(fx.s, bob, 1010, &unbilled), STORE_OK);
    assert_int_equal(unbilled, 0);
}

/* The worked example on the seeded catalog: 8 x MI450 for an hour. */
static void test_unbilled_hour_of_eight_mi450_is_9_60(void **state)
{
    users();
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, "MI450", 8, 1700000000, &in, &iv);
    int64_t unbilled;
    assert_int_equal(ledger_unbilled(fx.s, alice, 1700000000 + 3600, &unbilled), STORE_OK);
    assert_int_equal(unbilled, 9600000);
    assert_int_equal(ledger_unbilled(fx.s, alice, 1700000000 + 3 * 3600, &unbilled), STORE_OK);
    assert_int_equal(unbilled, 28800000);
}

static void test_funds_now_subtract_unbilled_and_never_go_below_zero(void **state)
{
    users();
    topup(alice, "pay-1", 10000);
    grant(alice, 2000, 0, NULL);
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &in, &iv);
    struct funds f;
    assert_int_equal(ledger_funds_now(fx.s, alice, 1004, &f), STORE_OK);
    assert_int_equal(f.cash, 10000);
    assert_int_equal(f.credit, 2000);
    assert_int_equal(f.unbilled, 4000);
    assert_int_equal(f.available, 8000);
    assert_int_equal(ledger_funds_now(fx.s, alice, 1020, &f), STORE_OK);
    assert_int_equal(f.unbilled, 20000);
    assert_int_equal(f.available, 0);
}

static void test_price_at_reads_the_type_schedule(void **state)
{
    users();
    assert_int_equal(store_price_insert(fx.s, FX_TST, 5000, 7200000, 60), STORE_OK);
    assert_int_equal(ledger_price_at(fx.s, FX_TST, 4999), 3600000);
    assert_int_equal(ledger_price_at(fx.s, FX_TST, 5000), 7200000);
    assert_int_equal(ledger_price_at(fx.s, "MI450", 0), 1200000);
    assert_int_equal(ledger_price_at(fx.s, "NOSUCH", 0), -1);
}

static void test_runway_is_how_long_funds_last_at_the_current_burn(void **state)
{
    users();
    struct funds f;
    int64_t burn = -5, runway = -5;
    int low = -5;
    assert_int_equal(ledger_runway(fx.s, alice, 1000, &f, &burn, &runway, &low), STORE_OK);
    assert_int_equal(burn, 0);
    assert_int_equal(runway, -1); /* nothing burns */
    assert_int_equal(low, 0);
    topup(alice, "pay-1", 3600000); /* an hour of one TST card */
    struct instance in;
    int64_t iv;
    fx_running(fx.s, alice, FX_TST, 1, 1000, &in, &iv);
    assert_int_equal(ledger_runway(fx.s, alice, 1000, &f, &burn, &runway, &low), STORE_OK);
    assert_int_equal(burn, 3600000);
    assert_int_equal(f.available, 3600000);
    assert_int_equal(runway, 60);
    assert_int_equal(low, 0); /* low_balance_minutes is 60: under it, not at it */
    assert_int_equal(ledger_runway(fx.s, alice, 1001, NULL, NULL, &runway, &low), STORE_OK);
    assert_int_equal(runway, 59);
    assert_int_equal(low, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        fx_test(test_grant_credits_a_grant_account_from_promotion),
        fx_test(test_grant_of_nothing_is_refused_and_posts_nothing),
        fx_test(test_grant_past_max_balance_is_refused_and_posts_nothing),
        fx_test(test_topup_adds_cash_from_payments),
        fx_test(test_repeated_payment_is_a_duplicate_with_nothing_posted),
        fx_test(test_same_payment_for_another_user_or_amount_is_a_conflict),
        fx_test(test_topup_past_max_balance_is_refused_and_not_recorded),
        fx_test(test_charge_draws_grants_soonest_expiry_first_then_cash),
        fx_test(test_charge_the_funds_cannot_cover_is_a_conflict_that_leaves_nothing),
        fx_test(test_charge_may_draw_a_grant_expiring_at_its_own_second),
        fx_test(test_charge_of_zero_posts_nothing_and_a_negative_one_is_an_error),
        fx_test(test_charge_draws_more_grants_than_one_read_returns),
        fx_test(test_expire_voids_the_remainder_of_expired_grants_only),
        fx_test(test_expire_for_everyone_skips_users_with_running_time_to_bill),
        fx_test(test_redeem_invite_grants_its_credit_with_its_expiry),
        fx_test(test_redeeming_twice_is_a_conflict_and_grants_once),
        fx_test(test_unknown_expired_or_used_up_invite_is_not_found),
        cmocka_unit_test(test_billable_end_caps_an_open_interval_at_confirmed_until),
        cmocka_unit_test(test_billable_end_of_an_ended_interval_is_its_end_not_capped),
        fx_test(test_an_interval_on_a_quiet_node_is_charged_to_its_last_good_beat),
        fx_test(test_refund_goes_back_last_drawn_first),
        fx_test(test_refund_to_a_grant_voided_meanwhile_is_voided_again),
        fx_test(test_refund_larger_than_was_charged_is_an_error_that_leaves_nothing),
        fx_test(test_close_interval_refunds_what_was_charged_past_its_new_end),
        fx_test(test_close_interval_past_what_was_charged_refunds_nothing),
        fx_test(test_close_interval_before_its_start_ends_there_and_refunds_everything),
        fx_test(test_close_without_an_open_interval_is_a_no_op),
        fx_test(test_funds_count_cash_and_credit_valid_at_the_second),
        fx_test(test_unbilled_is_what_ran_beyond_what_was_posted),
        fx_test(test_unbilled_hour_of_eight_mi450_is_9_60),
        fx_test(test_funds_now_subtract_unbilled_and_never_go_below_zero),
        fx_test(test_price_at_reads_the_type_schedule),
        fx_test(test_runway_is_how_long_funds_last_at_the_current_burn),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
