"""test_money_bounds.py: money stays exact because it is bounded wherever it
enters. Every route that takes an amount (admin top-ups, the payment webhook,
admin grants, invite codes and what their redemptions grant, prices) takes
one exactly at its limit and refuses one micro-yuan more with 400
invalid_field naming the field and the limit, changing nothing (a dump of the
whole database before and after); a top-up or grant that would take a
user's balance over max_balance is refused the same way; the limits can be
configured and are checked at load; a refused top-up leaves nothing that
blocks its payment id later, and only a real payment id collision is a 409.
The top-up of 9223372036854.775807 that used to overflow the platform's
payments account (after which every top-up got a false 409) is refused, and
a cached balance that would still overflow fails that one request with a
500 naming the account, never a 409. `gpurentd ledger verify` runs after
every test, and reports a sum that overflows as a breach instead of
stopping."""
import concurrent.futures
import json
import os
import sqlite3

import pytest

from harness import run_gpurentd
from money_util import MICRO, cluster_fixture, iso, ledger_verify, new_cluster, verify_ledgers, webhook_headers, yuan  # noqa: F401
from test_money_validation import refused

SECRET = "whsec-bounds"
MAX_PRICE = 10_000 * MICRO
MAX_TOPUP = 1_000_000 * MICRO
MAX_GRANT = 100_000 * MICRO
MAX_BALANCE = 10_000_000 * MICRO
INT64_MAX = 2 ** 63 - 1
FUTURE = 2_000_000_000
bounds = cluster_fixture({}, {"payment_webhook_secret": SECRET})


def pay_id():
    return f"pay-{os.urandom(8).hex()}"


def topup(c, user, amount, payment_id=None, **extra):
    return c.admin("POST", f"/v1/admin/users/{user.id}/topups",
                   json={"amount": amount, "payment_id": payment_id or pay_id(), **extra})


def webhook(c, user_id, amount, payment_id=None):
    raw = json.dumps({"payment_id": payment_id or pay_id(), "user_id": user_id, "amount": amount, "currency": "CNY"})
    return c.d.post("/v1/payments/webhook", data=raw, headers=webhook_headers(SECRET, raw))


def holdings(c, user):
    """Cash and credit not voided, as max_balance counts them."""
    b = c.balance(user)
    return b["cash"] + b["credit"]


def over(c, what, method, path, field, option, limit, **kw):
    """One refusal for a limit: 400 invalid_field naming field, and the
    option with its value in the message; nothing written."""
    err = refused(c, method, path, 400, "invalid_field", field, what, **kw)
    assert option in err["message"] and f"{yuan(limit)} CNY" in err["message"], (what, err)
    return err


# ---------------------------------------------------------------- at the limit and one micro over

def test_admin_topup_takes_max_topup_and_refuses_one_micro_more(bounds):
    c = bounds
    u = c.cli_user()
    path = f"/v1/admin/users/{u.id}/topups"
    err = over(c, "max_topup + 1 micro", "POST", path, "amount", "max_topup", MAX_TOPUP, key=c.d.admin_key,
               json={"amount": yuan(MAX_TOPUP + 1), "payment_id": pay_id()})
    assert err["message"] == f"amount {yuan(MAX_TOPUP + 1)} is over max_topup {yuan(MAX_TOPUP)} CNY", err
    r = topup(c, u, yuan(MAX_TOPUP))
    assert r.status_code == 201, r.text
    assert c.balance(u)["cash"] == MAX_TOPUP


def test_webhook_takes_max_topup_and_refuses_one_micro_more(bounds):
    c = bounds
    u = c.cli_user()
    raw = json.dumps({"payment_id": pay_id(), "user_id": u.id, "amount": yuan(MAX_TOPUP + 1), "currency": "CNY"})
    over(c, "webhook over max_topup", "POST", "/v1/payments/webhook", "amount", "max_topup", MAX_TOPUP, data=raw,
         headers=webhook_headers(SECRET, raw))
    r = webhook(c, u.id, yuan(MAX_TOPUP))
    assert r.status_code == 201, r.text
    assert c.balance(u)["cash"] == MAX_TOPUP


def test_admin_grant_takes_max_grant_and_refuses_one_micro_more(bounds):
    c = bounds
    u = c.cli_user()
    path = f"/v1/admin/users/{u.id}/grants"
    over(c, "max_grant + 1 micro", "POST", path, "amount", "max_grant", MAX_GRANT, key=c.d.admin_key,
         json={"amount": yuan(MAX_GRANT + 1)})
    # An Idempotency-Key on a refused grant is not kept: the same key works
    # once the amount is right.
    h = {"Idempotency-Key": "grant-bounds-1"}
    over(c, "over max_grant with a key", "POST", path, "amount", "max_grant", MAX_GRANT, key=c.d.admin_key,
         json={"amount": yuan(MAX_GRANT + 1)}, headers=h)
    r = c.admin("POST", path, json={"amount": yuan(MAX_GRANT)}, headers=h)
    assert r.status_code == 201, r.text
    assert c.balance(u)["credit"] == MAX_GRANT


def test_invite_codes_take_max_grant_and_refuse_one_micro_more(bounds):
    c = bounds
    path = "/v1/admin/invite-codes"
    over(c, "code over max_grant", "POST", path, "amount", "max_grant", MAX_GRANT, key=c.d.admin_key,
         json={"code": "BOUNDS-OVER", "amount": yuan(MAX_GRANT + 1)})
    r = c.admin("POST", path, json={"code": "BOUNDS-MAX", "amount": yuan(MAX_GRANT)})
    assert r.status_code == 201, r.text
    u = c.cli_user()  # an account that has had no trial may redeem a code
    r = c.d.post("/v1/invite-codes/redeem", key=u.key, json={"code": "BOUNDS-MAX"})
    assert r.status_code == 201, r.text
    assert c.balance(u)["credit"] == MAX_GRANT


def test_prices_take_max_price_and_refuse_one_micro_more(bounds):
    c = bounds
    path = "/v1/admin/prices/RTX4090"
    err = over(c, "price over max", "PUT", path, "price_per_card_hour", "max_price_per_card_hour", MAX_PRICE,
               key=c.d.admin_key, json={"price_per_card_hour": yuan(MAX_PRICE + 1), "effective_at": iso(FUTURE)})
    assert err["message"].startswith("price_per_card_hour 10000.000001 is over max_price_per_card_hour"), err
    # The price of the issue: INT64_MAX micro-yuan per card-hour.
    over(c, "the overflowing price", "PUT", path, "price_per_card_hour", "max_price_per_card_hour", MAX_PRICE,
         key=c.d.admin_key, json={"price_per_card_hour": "9223372036854.775807", "effective_at": iso(FUTURE)})
    r = c.admin("PUT", path, json={"price_per_card_hour": yuan(MAX_PRICE), "effective_at": iso(FUTURE)})
    assert r.status_code == 200, r.text
    assert r.json()["price_per_card_hour"] == yuan(MAX_PRICE)


# ---------------------------------------------------------------- the overflow

def test_the_overflowing_topup_is_refused_and_later_topups_still_work(bounds):
    """A top-up of INT64_MAX micro-yuan used to be accepted; the user's balance
    then read 0.00, verify stopped on an integer overflow, and every later
    top-up to anyone was refused with a false 409."""
    c = bounds
    victim, other = c.signup(), c.cli_user()
    before = c.balance(victim)
    for send in (lambda pid: topup(c, victim, "9223372036854.775807", pid),
                 lambda pid: webhook(c, victim.id, "9223372036854.775807", pid)):
        dump = c.d.dump()
        r = send(pay_id())
        assert r.status_code == 400, r.text
        assert r.json()["error"]["field"] == "amount" and "max_topup" in r.json()["error"]["message"], r.text
        assert c.d.dump() == dump
    assert c.balance(victim)["available"] == before["available"] == 10 * MICRO
    c.verify()
    r = topup(c, other, "25.50")
    assert r.status_code == 201, r.text
    r = webhook(c, other.id, "4.50")
    assert r.status_code == 201, r.text
    assert c.balance(other)["cash"] == 30 * MICRO


# ---------------------------------------------------------------- max_balance

def test_money_past_max_balance_is_refused_on_every_route(bounds):
    c = bounds
    u = c.cli_user()                            # no trial yet: it may still redeem a code
    for _ in range(9):
        assert topup(c, u, yuan(MAX_TOPUP)).status_code == 201
    assert c.admin("POST", f"/v1/admin/users/{u.id}/grants", json={"amount": yuan(MAX_GRANT)}).status_code == 201
    room = MAX_BALANCE - holdings(c, u)
    assert room == MAX_TOPUP - MAX_GRANT
    # Exactly up to the limit is fine; then not one micro more, by any route.
    assert topup(c, u, yuan(room - 1)).status_code == 201
    assert webhook(c, u.id, "0.000001").status_code == 201
    assert holdings(c, u) == MAX_BALANCE
    err = over(c, "top-up past max_balance", "POST", f"/v1/admin/users/{u.id}/topups", "amount", "max_balance",
               MAX_BALANCE, key=c.d.admin_key, json={"amount": "0.000001", "payment_id": pay_id()})
    assert f"to {yuan(MAX_BALANCE + 1)}" in err["message"] and u.id in err["message"], err
    raw = json.dumps({"payment_id": pay_id(), "user_id": u.id, "amount": "0.000001", "currency": "CNY"})
    over(c, "webhook past max_balance", "POST", "/v1/payments/webhook", "amount", "max_balance", MAX_BALANCE,
         data=raw, headers=webhook_headers(SECRET, raw))
    over(c, "grant past max_balance", "POST", f"/v1/admin/users/{u.id}/grants", "amount", "max_balance",
         MAX_BALANCE, key=c.d.admin_key, json={"amount": "0.000001"})
    over(c, "redemption past max_balance", "POST", "/v1/invite-codes/redeem", "code", "max_balance", MAX_BALANCE,
         key=u.key, json={"code": "AMD6GW"})
    assert holdings(c, u) == MAX_BALANCE


def test_max_balance_counts_the_limit_in_the_same_transaction_as_the_write(bounds):
    """Many top-ups at once towards the limit: exactly those that fit land."""
    c = bounds
    u = c.cli_user()
    for _ in range(9):
        assert topup(c, u, yuan(MAX_TOPUP)).status_code == 201
    # 1 000 000.00 of room left: twenty concurrent top-ups of 100 000.00 fit ten.
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(lambda _: topup(c, u, yuan(MAX_GRANT)).status_code, range(20)))
    assert sorted(codes) == [201] * 10 + [400] * 10, codes
    assert holdings(c, u) == MAX_BALANCE


# ---------------------------------------------------------------- refusals leave nothing behind

def test_a_refused_topup_leaves_its_payment_id_free(bounds):
    c = bounds
    full, fresh = c.cli_user(), c.cli_user()
    for _ in range(10):
        assert topup(c, full, yuan(MAX_TOPUP)).status_code == 201
    pid = pay_id()
    # Refused for its amount, for the balance it would make, and for an
    # unknown user: none of it records the payment.
    assert topup(c, fresh, yuan(MAX_TOPUP + 1), pid).status_code == 400
    assert topup(c, full, "1.00", pid).status_code == 400
    assert webhook(c, "usr_00000000000000000000", "1.00", pid).status_code == 404
    assert not c.d.sql("SELECT 1 FROM topups WHERE payment_id = ?", (pid,))
    r = webhook(c, fresh.id, "7.00", pid)
    assert r.status_code == 201, r.text
    assert r.json()["duplicate"] is False
    # And now it is recorded: the same again is a replay, not a second top-up.
    r = topup(c, fresh, "7.00", pid)
    assert r.status_code == 200 and r.json()["duplicate"] is True, r.text
    assert c.balance(fresh)["cash"] == 7 * MICRO


def test_only_a_real_payment_id_collision_is_a_409(bounds):
    c = bounds
    a, b = c.cli_user(), c.cli_user()
    pid = pay_id()
    assert topup(c, a, "5.00", pid).status_code == 201
    assert topup(c, a, "5.00", pid).status_code == 200
    for what, user, amount in [("another amount", a, "6.00"), ("another user", b, "5.00")]:
        r = refused(c, "POST", f"/v1/admin/users/{user.id}/topups", 409, "conflict", "payment_id", what,
                    key=c.d.admin_key, json={"amount": amount, "payment_id": pid})
        assert "already recorded" in r["message"], r
    r = webhook(c, b.id, "5.00", pid)
    assert r.status_code == 409 and r.json()["error"]["field"] == "payment_id", r.text
    assert c.balance(a)["cash"] == 5 * MICRO and c.balance(b)["cash"] == 0


# ---------------------------------------------------------------- configured limits

def test_configured_limits_are_honoured(new_cluster):
    c = new_cluster(nodes={}, options={"payment_webhook_secret": SECRET, "max_price_per_card_hour": "5.00",
                                       "max_topup": "50.00", "max_grant": "20.00", "max_balance": "100.00"})
    u = c.cli_user()
    path = f"/v1/admin/users/{u.id}/"
    over(c, "topup", "POST", path + "topups", "amount", "max_topup", 50 * MICRO, key=c.d.admin_key,
         json={"amount": "50.000001", "payment_id": pay_id()})
    raw = json.dumps({"payment_id": pay_id(), "user_id": u.id, "amount": "50.01", "currency": "CNY"})
    over(c, "webhook", "POST", "/v1/payments/webhook", "amount", "max_topup", 50 * MICRO, data=raw,
         headers=webhook_headers(SECRET, raw))
    over(c, "grant", "POST", path + "grants", "amount", "max_grant", 20 * MICRO, key=c.d.admin_key,
         json={"amount": "20.000001"})
    over(c, "invite code", "POST", "/v1/admin/invite-codes", "amount", "max_grant", 20 * MICRO, key=c.d.admin_key,
         json={"code": "SMALL", "amount": "20.01"})
    over(c, "price", "PUT", "/v1/admin/prices/MI450", "price_per_card_hour", "max_price_per_card_hour", 5 * MICRO,
         key=c.d.admin_key, json={"price_per_card_hour": "5.000001"})
    assert c.admin("PUT", "/v1/admin/prices/MI450", json={"price_per_card_hour": "5.00"}).status_code == 200
    assert topup(c, u, "50.00").status_code == 201
    assert webhook(c, u.id, "30.00").status_code == 201
    assert c.admin("POST", path + "grants", json={"amount": "20.00"}).status_code == 201
    over(c, "balance", "POST", path + "grants", "amount", "max_balance", 100 * MICRO, key=c.d.admin_key,
         json={"amount": "0.01"})
    assert holdings(c, u) == 100 * MICRO
    # A new account's trial credit (10.00) is within the limits; an invite
    # code of 20.00 is too, and redeeming it (an account with no trial yet)
    # takes this user to 20.00.
    assert holdings(c, c.signup()) == 10 * MICRO
    assert c.admin("POST", "/v1/admin/invite-codes", json={"code": "SMALL", "amount": "20.00"}).status_code == 201
    v = c.cli_user()
    assert c.d.post("/v1/invite-codes/redeem", key=v.key, json={"code": "SMALL"}).status_code == 201
    assert holdings(c, v) == 20 * MICRO


def test_an_invite_code_worth_more_than_max_balance_is_refused_where_it_lands(new_cluster):
    """max_grant may be above max_balance: such a code can be made, but no
    redemption of it can land, at sign-up (no account is made) or later."""
    c = new_cluster(nodes={}, options={"max_grant": "200.00", "max_balance": "100.00"})
    assert c.admin("POST", "/v1/admin/invite-codes", json={"code": "BIG", "amount": "150.00"}).status_code == 201
    r = c.d.post("/v1/signup", json={"email": "big@example.test", "password": "correct horse battery",
                                     "invite_code": "big"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["field"] == "invite_code" and "max_balance 100.00 CNY" in err["message"], r.text
    assert not c.d.sql("SELECT 1 FROM users WHERE email = 'big@example.test'")
    u = c.cli_user()
    err = over(c, "redeem BIG", "POST", "/v1/invite-codes/redeem", "code", "max_balance", 100 * MICRO, key=u.key,
               json={"code": "BIG"})
    assert err["message"] == (f"invite code BIG's credit of 150.00 would take the balance of {u.id} to 150.00,"
                              " over max_balance 100.00 CNY"), err


@pytest.mark.parametrize("options, needle", [
    (["signup_credit=100000.01"], "signup_credit 100000.01 is over max_grant 100000.00"),
    (["max_grant=5.00"], "signup_credit 10.00 is over max_grant 5.00"),
    (["max_balance=9.99"], "signup_credit 10.00 is over max_balance 9.99"),
    (["max_balance=1000000000000.000001"], "max_balance: 1000000000000.000001 is over 1000000000000.00"),
    (["max_topup=1000000000001"], "max_topup: 1000000000001 is over 1000000000000.00"),
    (["max_grant=9223372036854.775807"], "max_grant: 9223372036854.775807 is over 1000000000000.00"),
    (["max_price_per_card_hour=1000000.000001"], "max_price_per_card_hour: 1000000.000001 is over 1000000.00"),
    (["max_topup=-1"], "max_topup: '-1' is not an amount"),
    (["max_topup=1e6"], "max_topup: '1e6' is not an amount"),
    (["max_balance=9223372036854.775808"], "max_balance: '9223372036854.775808' is not an amount"),
])
def test_bad_limits_are_refused_at_load(options, needle):
    args = ["-n"]
    for o in options:
        args += ["-o", o]
    p = run_gpurentd(*args)
    assert p.returncode != 0, p.stdout
    assert needle in p.stderr, p.stderr


def test_the_hard_caps_themselves_load():
    p = run_gpurentd("-n", "-o", "max_topup=1000000000000.00", "-o", "max_grant=1000000000000",
                     "-o", "max_balance=1000000000000.00", "-o", "max_price_per_card_hour=1000000.00",
                     "-o", "signup_credit=0")
    assert p.returncode == 0 and p.stdout == "configuration OK\n", p.stderr


# ---------------------------------------------------------------- overflow that still happens fails loudly

def test_a_cached_balance_that_would_overflow_fails_that_request_only(new_cluster):
    """With every limit at its hard cap, the platform's payments account (the
    other side of every top-up) fills up after nine users at the cap: the
    tenth top-up would take it past INT64_MIN. It fails with a 500 and a log
    line naming the account; no top-up, no 409, nothing written; other
    requests go on."""
    cap = "1000000000000.00"
    c = new_cluster(nodes={}, options={"max_topup": cap, "max_balance": cap, "max_grant": cap, "signup_credit": "0"})
    users = [c.cli_user() for _ in range(10)]
    for u in users[:9]:
        assert topup(c, u, cap).status_code == 201
    pid = pay_id()
    dump = c.d.dump()
    r = topup(c, users[9], cap, pid)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal", r.text
    assert c.d.dump() == dump
    c.d.wait_for_log(r"ledger account payments: balance -9000000000000000000 -1000000000000000000 overflows"
                     r" 64-bit integers")
    # The same payment again: still the same failure, never a collision.
    assert topup(c, users[9], cap, pid).status_code == 500
    # Smaller amounts still fit, and the user's own balance is exact.
    r = topup(c, users[9], "100000000000.00", pid)
    assert r.status_code == 201, r.text
    assert c.balance(users[9])["cash"] == 100_000_000_000 * MICRO
    assert c.balance(users[0])["cash"] == 1_000_000_000_000 * MICRO


def test_ledger_verify_reports_an_overflowing_sum_as_a_breach_and_goes_on(bounds, tmp_path):
    """A ledger corrupted so that sums of its postings overflow: the checks
    that sum them report 'sum overflows 64-bit integers' as breaches, the
    checks after them still run (a top-up changed by hand is found too), and
    the command exits 1 with its count, never 'cannot check'."""
    c = bounds
    u = c.cli_user()
    top = topup(c, u, "12.00").json()["topup_id"]
    db = str(tmp_path / "overflow.db")
    src = sqlite3.connect(f"file:{c.d.db_path}?mode=ro", uri=True)
    dst = sqlite3.connect(db)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    con = sqlite3.connect(db)
    try:
        with con:
            cur = con.execute("INSERT INTO ledger_transactions (at, kind, user_id, reason, created_at)"
                              " VALUES (?, 'topup', ?, 'corrupt', ?)", (c.d.now(), u.id, c.d.now()))
            for _ in range(2):
                con.execute("INSERT INTO ledger_postings (transaction_id, account_id, amount) VALUES (?, 'revenue', ?)",
                            (cur.lastrowid, INT64_MAX))
            con.execute("UPDATE topups SET amount = amount + 1 WHERE id = ?", (top,))
    finally:
        con.close()
    rc, out = ledger_verify(db)
    assert rc == 1, out
    lines = out.strip().splitlines()
    assert "breach: transaction does not balance: sum overflows 64-bit integers" in lines, out
    assert "breach: cached balance differs from the sum of postings: sum overflows 64-bit integers" in lines, out
    assert any(line.startswith(f"breach: top-up differs from the cash it added: {top}:") for line in lines), out
    assert not any("cannot check" in line for line in lines), out
    assert lines[-1] == f"ledger verify: {sum(line.startswith('breach: ') for line in lines)} breaches", out
