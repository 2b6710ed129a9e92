"""test_money_terms.py: the terms money is offered on, end to end: invite
codes that expire or give credit that expires after credit_days, the catalog's
price per GB of GPU memory (price per card-hour / memory_gb, rounded down to
the micro-yuan), and a daemon configured with another currency and another
trial credit. No instance runs here, so no fleet: the clock is the testing
clock and every expected amount is computed here."""
from harness import assert_error
from money_util import (MICRO, PRICE, accrue, cluster_fixture, iso, micro, new_cluster, verify_ledgers,  # noqa: F401
                        yuan)

DAY = 86400

terms = cluster_fixture({})


def make_code(c, code, amount, **fields):
    body = {"code": code, "amount": yuan(amount), **fields}
    r = c.admin("POST", "/v1/admin/invite-codes", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def redeem(c, user, code):
    return c.d.post("/v1/invite-codes/redeem", key=user.key, json={"code": code})


def test_an_expired_invite_code_is_refused_and_changes_nothing(terms):
    c = terms
    t0 = c.d.now()
    make_code(c, "LATE-1", 5 * MICRO, expires_at=iso(t0 + 60))
    early, late = c.cli_user(), c.cli_user()  # accounts with no trial yet
    # The last second before its expiry it still counts...
    c.d.set_clock(t0 + 59)
    r = redeem(c, early, "late-1")
    assert r.status_code == 201, r.text
    # ...and from its expiry on it is refused, saying why, and nothing moves.
    c.d.set_clock(t0 + 60)
    before, balance = c.d.dump(), c.balance(late)
    err = assert_error(redeem(c, late, "late-1"), 400, "invalid_invite_code", "code")
    assert err["message"] == f"invite code LATE-1 expired at {iso(t0 + 60)}", err
    assert c.d.dump() == before
    assert c.balance(late) == balance
    assert c.d.sql("SELECT uses FROM invite_codes WHERE code = 'LATE-1'") == [(1,)]
    assert c.d.sql("SELECT count(*) FROM invite_redemptions WHERE user_id = ?", (late.id,)) == [(0,)]
    # Signing up with it is refused too, and makes no account.
    r = c.d.post("/v1/signup", json={"email": "late-signup@example.test", "password": "correct horse battery",
                                     "invite_code": "LATE-1"})
    err = assert_error(r, 400, "invalid_invite_code", "invite_code")
    assert err["message"] == f"invite code LATE-1 expired at {iso(t0 + 60)}", err
    assert c.d.sql("SELECT count(*) FROM users WHERE email = 'late-signup@example.test'") == [(0,)]


def test_unknown_and_used_up_invite_codes_say_which(terms):
    c = terms
    u, v = c.cli_user(), c.cli_user()
    err = assert_error(redeem(c, u, "NO-SUCH-CODE"), 400, "invalid_invite_code", "code")
    assert err["message"] == "no invite code NO-SUCH-CODE", err
    make_code(c, "ONCE-1", 1 * MICRO, max_uses=1)
    assert redeem(c, u, "ONCE-1").status_code == 201
    err = assert_error(redeem(c, v, "ONCE-1"), 400, "invalid_invite_code", "code")
    assert err["message"] == "invite code ONCE-1 has been used up", err
    # Sign-up says the same of a used-up or unknown code.
    for code, message in [("ONCE-1", "invite code ONCE-1 has been used up"),
                          ("NO-SUCH-CODE", "no invite code NO-SUCH-CODE")]:
        r = c.d.post("/v1/signup", json={"email": f"{code.lower()}@example.test", "password": "correct horse battery",
                                         "invite_code": code})
        err = assert_error(r, 400, "invalid_invite_code", "invite_code")
        assert err["message"] == message, err
    # A code this account already has, still open to others, is a conflict.
    # (u had its trial with ONCE-1: a third account.)
    w = c.cli_user()
    make_code(c, "TWICE-1", 1 * MICRO, max_uses=2)
    assert redeem(c, w, "TWICE-1").status_code == 201
    err = assert_error(redeem(c, w, "TWICE-1"), 409, "conflict", "code")
    assert err["message"] == "this account has already redeemed TWICE-1", err
    # Another code for an account that had its trial: refused too.
    err = assert_error(redeem(c, u, "TWICE-1"), 409, "conflict", "code")
    assert "trial" in err["message"], err


def test_credit_days_give_a_grant_that_expires_after_them(terms):
    c = terms
    t0 = c.d.now()
    made = make_code(c, "DAYS-3", 2 * MICRO, credit_days=3)
    assert (made["credit_days"], made["expires_at"], made["amount"]) == (3, None, "2.00")
    u = c.cli_user()
    c.d.set_clock(t0 + 100)
    r = redeem(c, u, "DAYS-3")
    assert r.status_code == 201, r.text
    gid = r.json()["grant_id"]
    assert (r.json()["amount"], r.json()["code"]) == ("2.00", "DAYS-3")
    g = c.balance(u)["grants"][gid]
    # Days of 86 400 s from the redemption, not from the code's creation.
    assert (g["source"], g["amount"], g["remaining"], g["expires_at"]) == ("invite:DAYS-3", 2 * MICRO, 2 * MICRO,
                                                                           iso(t0 + 100 + 3 * DAY))
    assert c.d.sql("SELECT expires_at FROM credit_grants WHERE id = ?", (gid,)) == [(t0 + 100 + 3 * DAY,)]
    signup_credit = 0  # an account made by an admin, so that it may redeem the code
    # Spendable up to the second before its expiry, then void.
    c.d.set_clock(t0 + 100 + 3 * DAY - 1)
    assert c.balance(u)["credit"] == signup_credit + 2 * MICRO
    c.d.set_clock(t0 + 100 + 3 * DAY)
    assert c.balance(u)["credit"] == signup_credit
    c.billing()
    assert c.d.sql("SELECT remaining, voided_at FROM credit_grants WHERE id = ?", (gid,)) == [
        (0, t0 + 100 + 3 * DAY)]
    # A sign-up with such a code gets the same terms instead of the trial credit.
    now = c.d.now()
    w = c.signup(invite_code="days-3")
    [g] = c.balance(w)["grants"].values()
    assert (g["source"], g["amount"], g["expires_at"]) == ("invite:DAYS-3", 2 * MICRO, iso(now + 3 * DAY))


def test_price_per_gb_hour_is_the_card_price_over_memory_rounded_down(terms):
    c = terms

    def catalog():
        r = c.d.get("/v1/gpu-types")  # public
        assert r.status_code == 200, r.text
        return {t["code"]: t for t in r.json()["data"]}
    types = catalog()
    memory = {code: t["memory_gb"] for code, t in types.items()}
    assert memory["MI450"] == 192 and memory["MI300X"] == 96 and memory["RTX4090"] == 24
    for code, price in PRICE.items():
        t = types[code]
        assert t["price_per_card_hour"] == yuan(price)
        assert t["price_per_gb_hour"] == yuan(price // t["memory_gb"]), t
    # 1.20 / 192 and 0.90 / 24 are exact; 2.20 / 96 = 0.0229166… is cut, not rounded up.
    assert types["MI450"]["price_per_gb_hour"] == "0.00625"
    assert types["RTX4090"]["price_per_gb_hour"] == "0.0375"
    assert types["MI300X"]["price_per_gb_hour"] == "0.022916"
    # A type with no price has neither.
    assert (types["MI250"]["price_per_card_hour"], types["MI250"]["price_per_gb_hour"]) == (None, None)
    # Prices that do not divide: 0.999999 / 128 = 0.0078124…; 0.000023 / 24 < one micro-yuan.
    now = c.d.now()
    c.set_price("MI250", 999_999, now)
    c.set_price("RTX4090", 23, now)
    # One scheduled later does not count until it is in force.
    c.set_price("MI450", 1_000_003, now + 3600)
    types = catalog()
    assert (types["MI250"]["price_per_card_hour"], types["MI250"]["price_per_gb_hour"]) == ("0.999999", "0.007812")
    assert (types["RTX4090"]["price_per_card_hour"], types["RTX4090"]["price_per_gb_hour"]) == ("0.000023", "0.00")
    assert types["MI450"]["price_per_gb_hour"] == "0.00625"
    c.d.set_clock(now + 3600)
    types = catalog()
    assert (types["MI450"]["price_per_card_hour"], types["MI450"]["price_per_gb_hour"]) == ("1.000003", "0.005208")
    assert 1_000_003 // 192 == 5208


def test_another_currency_and_trial_credit_show_everywhere(new_cluster):
    credit = 1_234_567
    c = new_cluster(nodes={}, options={"currency": "USD", "signup_credit": yuan(credit)})
    u = c.signup()
    b = c.balance(u)
    assert b["raw"]["currency"] == "USD"
    assert (b["cash"], b["credit"], b["available"]) == (0, credit, credit)
    [g] = b["grants"].values()
    assert (g["source"], g["amount"], g["remaining"], g["expires_at"]) == ("signup", credit, credit, None)
    [t] = c.transactions(u)
    assert (t["kind"], t["amount"], t["credit"], t["cash"], t["currency"]) == ("grant", "1.234567", "1.234567",
                                                                              "0.00", "USD")
    r = c.d.get("/v1/estimate", params={"gpu_type": "MI450", "card_count": 8, "hours": 3})
    assert r.status_code == 200, r.text
    assert (r.json()["total"], r.json()["currency"]) == ("28.80", "USD")
    r = c.d.get("/v1/gpu-types")
    assert {t["currency"] for t in r.json()["data"]} == {"USD"}
    r = c.d.get("/v1/prices")
    assert r.status_code == 200, r.text
    assert {p["currency"] for p in r.json()["data"]} == {"USD"}
    r = c.d.get("/v1/usage", key=u.key)
    assert r.status_code == 200 and r.json()["currency"] == "USD", r.text
    assert c.topup(u, 1)["currency"] == "USD"
    # 8 x MI450 for the 10-minute minimum run is 1.60: more than 1.234568.
    err = assert_error(c.create(u, "MI450", 8), 402, "insufficient_funds")
    assert (err["needed"], err["available"], err["currency"]) == ("1.60", "1.234568", "USD"), err
    assert err["message"].startswith("1.60 USD needed"), err
    assert accrue(PRICE["MI450"], 8, 600) == 1_600_000
    assert micro(err["available"]) == credit + 1


def test_admins_list_every_invite_code_with_its_uses_a_page_at_a_time(terms):
    c = terms
    made = [make_code(c, f"LIST-{k}", (k + 1) * MICRO, max_uses=5)["code"] for k in range(5)]
    # A code of the longest length pages too (its cursor holds all 32 bytes).
    made.append(make_code(c, "L" * 32, MICRO)["code"])
    user = c.cli_user()
    assert redeem(c, user, "LIST-2").status_code == 201
    seen, cursor = [], None
    while True:
        r = c.admin("GET", "/v1/admin/invite-codes", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["data"]) <= 2
        seen += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    codes = [x["code"] for x in seen]
    assert len(codes) == len(set(codes)), codes  # no code twice across pages
    assert [x for x in codes if x in made] == made, codes  # oldest first, none missing
    by_code = {x["code"]: x for x in seen}
    assert (by_code["LIST-2"]["uses"], by_code["LIST-2"]["amount"], by_code["LIST-2"]["max_uses"]) == (1, "3.00", 5)
    assert by_code["LIST-0"]["uses"] == 0
    # Each entry is what the code's own page shows.
    assert c.admin("GET", "/v1/admin/invite-codes/LIST-2").json() == by_code["LIST-2"]
    # Admins only; bad queries say which.
    assert_error(c.d.get("/v1/admin/invite-codes", key=user.key), 403, "forbidden")
    for q, field in (({"limit": 0}, "limit"), ({"limit": 201}, "limit"), ({"limit": "x"}, "limit"),
                     ({"cursor": "!!"}, "cursor"), ({"sort": "code"}, "sort")):
        assert_error(c.admin("GET", "/v1/admin/invite-codes", params=q), 400, "invalid_query", field)
