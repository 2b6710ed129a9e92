"""test_money.py: billing end to end on the testing clock, with instances
running on a simulated fleet: the worked examples of the design (AMD6GW's
10.00 runs 8 x MI450 for exactly 3 750 s; 3 hours cost 28.80), the formula
to the micro-yuan, price changes mid-run, repeated and skipped passes, grant
expiry and the order grants are drawn in. Every expected amount is computed
here from the formula floor(price x cards x seconds / 3600), never read back
from the daemon; `gpurentd ledger verify` runs after every test."""
from agent_util import poll
from harness import assert_error
from money_util import (MICRO, PRICE, accrue, iso, micro, money_cluster, new_cluster,  # noqa: F401
                        verify_ledgers, yuan)

HOUR = 3600


def test_invite_credit_pays_exactly_until_second_3750(money_cluster):
    c = money_cluster
    u = c.signup(invite_code="AMD6GW")
    b = c.balance(u)
    assert (b["cash"], b["credit"], b["available"]) == (0, 10 * MICRO, 10 * MICRO)
    [g] = b["grants"].values()
    assert (g["source"], g["amount"], g["remaining"], g["expires_at"]) == ("invite:AMD6GW", 10 * MICRO, 10 * MICRO,
                                                                           None)
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 8)
    assert c.intervals(iid)[0][:2] == (t0, None)
    assert c.balance(u)["burn_rate_per_hour"] == 9_600_000
    assert c.instance(u, iid)["low_balance"] is False  # 10.00 lasts 62 minutes: above the 60-minute warning

    # Exactly one hour: 9.60 charged, 0.40 left, still running.
    c.d.set_clock(t0 + HOUR)
    c.billing()
    assert c.spent(u) == 9_600_000
    b = c.balance(u)
    assert (b["available"], b["credit"], b["cash"]) == (400_000, 400_000, 0)
    assert b["raw"]["low_balance"] is True and b["raw"]["runway_minutes"] == 2
    # The warning shows on the instance too.
    assert c.instance(u, iid)["state"] == "running" and c.instance(u, iid)["low_balance"] is True

    # Short of the end: still running, charged to the micro.
    c.d.set_clock(t0 + 3749)
    c.billing()
    assert c.spent(u) == accrue(PRICE["MI450"], 8, 3749) == 9_997_333
    assert c.instance(u, iid)["state"] == "running"

    # Keeps running past its funds: billing ends at second 3 750 exactly.
    c.d.set_clock(t0 + 4000)
    c.billing()
    assert accrue(PRICE["MI450"], 8, 3750) == 10 * MICRO
    assert c.spent(u) == 10 * MICRO
    [(start, end, billed, settled, reason)] = c.intervals(iid)
    assert (start, end, billed, settled, reason) == (t0, t0 + 3750, 10 * MICRO, 1, "funds exhausted")
    b = c.balance(u)
    assert (b["available"], b["credit"], b["cash"], b["burn_rate_per_hour"]) == (0, 0, 0, 0)
    body = c.wait_state(u, iid, "stopped")
    assert f"funds ran out at {iso(t0 + 3750)}" in body["state_reason"]
    assert "volume is kept" in body["state_reason"]
    reasons = [(e["state"], e["reason"]) for e in c.events(u, iid)]
    assert ("stopping", f"funds ran out at {iso(t0 + 3750)}; the volume is kept") in reasons, reasons
    assert reasons[-1][0] == "stopped"
    # The volume is kept; starting again needs funds.
    r = c.d.get(f"/v1/volumes/{body['volume_id']}", key=u.key)
    assert r.status_code == 200, r.text
    err = assert_error(c.start(u, iid), 402, "insufficient_funds")
    assert "1.60" in err["message"]
    # Later passes change nothing.
    c.d.advance_clock(HOUR)
    c.billing()
    assert c.spent(u) == 10 * MICRO
    usage = [t for t in c.transactions(u) if t["kind"] == "usage"]
    assert sum(micro(t["amount"]) for t in usage) == -10 * MICRO
    assert usage[-1]["at"] == iso(t0 + 3750)


def test_three_hours_on_cash_cost_28_80(money_cluster):
    c = money_cluster
    u = c.cli_user()  # no trial credit
    assert c.balance(u)["available"] == 0
    err = assert_error(c.create(u, "MI450", 8), 402, "insufficient_funds")
    assert "1.60" in err["message"]  # ten minutes of 8 x 1.20
    c.topup(u, 30 * MICRO)
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 8)
    c.d.set_clock(t0 + 3 * HOUR)
    c.billing()
    c.stop(u, iid)
    c.billing()
    assert c.spent(u) == 28_800_000
    b = c.balance(u)
    assert (b["cash"], b["credit"], b["available"]) == (1_200_000, 0, 1_200_000)
    usage = [t for t in c.transactions(u) if t["kind"] == "usage"]
    assert sum(micro(t["cash"]) for t in usage) == -28_800_000
    assert all(micro(t["credit"]) == 0 for t in usage)


def test_one_card_one_second_is_the_formula(money_cluster):
    c = money_cluster
    u = c.signup()
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 1)
    c.d.set_clock(t0 + 1)
    c.stop(u, iid)
    c.billing()
    assert c.spent(u) == 1_200_000 // 3600 == 333
    [t] = [t for t in c.transactions(u) if t["kind"] == "usage"]
    assert (t["amount"], t["credit"], t["cash"]) == ("-0.000333", "-0.000333", "0.00")
    assert c.balance(u)["available"] == 10 * MICRO - 333
    # MI300X, 3 cards, 7 seconds: floor(2.2 x 3 x 7 / 3600 yuan).
    t1 = c.d.now()
    iid = c.launch(u, "MI300X", 3)
    c.d.set_clock(t1 + 7)
    c.stop(u, iid)
    c.billing()
    assert c.spent(u) == 333 + accrue(PRICE["MI300X"], 3, 7) == 333 + 12_833


def test_repeated_passes_post_differences_never_drift(money_cluster):
    c = money_cluster
    u = c.signup()
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 1)
    for i in range(1, 101):
        c.d.set_clock(t0 + 7 * i)
        c.billing()
    # Recomputed from the start each time: not 100 x floor(7 s).
    assert c.spent(u) == accrue(PRICE["MI450"], 1, 700) == 233_333
    assert 100 * accrue(PRICE["MI450"], 1, 7) == 233_300
    txns = len(c.transactions(u))
    for _ in range(5):
        c.billing()
    assert len(c.transactions(u)) == txns
    assert c.spent(u) == 233_333
    c.stop(u, iid)
    c.billing()
    c.billing()
    assert c.spent(u) == 233_333
    [(start, end, billed, settled, _)] = c.intervals(iid)
    assert (end - start, billed, settled) == (700, 233_333, 1)


def test_two_instances_run_out_together_at_the_exact_second(money_cluster):
    c = money_cluster
    u = c.signup()
    t0 = c.d.now()
    a = c.launch(u, "MI450", 8)
    b = c.launch(u, "MI300X", 1)
    c.d.set_clock(t0 + 2 * HOUR)
    c.billing()
    # The last second both together are covered by 10.00.
    s = max(x for x in range(0, 4000)
            if accrue(PRICE["MI450"], 8, x) + accrue(PRICE["MI300X"], 1, x) <= 10 * MICRO)
    for iid in (a, b):
        [(start, end, _, settled, reason)] = c.intervals(iid)
        assert (start, end, settled, reason) == (t0, t0 + s, 1, "funds exhausted")
        c.wait_state(u, iid, "stopped")
    assert c.spent(u) == accrue(PRICE["MI450"], 8, s) + accrue(PRICE["MI300X"], 1, s)
    assert c.balance(u)["available"] == 10 * MICRO - c.spent(u)


def test_funds_exhausted_before_the_user_stopped(money_cluster):
    """The user stops after the funds ran out but before any pass: billing
    still ends at the second the funds did, and the interval says so."""
    c = money_cluster
    u = c.signup()
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 8)
    c.d.set_clock(t0 + 4000)
    c.stop(u, iid)
    assert c.intervals(iid)[0][1] == t0 + 4000
    c.billing()
    assert c.spent(u) == 10 * MICRO
    [(start, end, billed, settled, _)] = c.intervals(iid)
    assert (start, end, billed, settled) == (t0, t0 + 3750, 10 * MICRO, 1)
    assert c.balance(u)["available"] == 0
    # A stopped-then-started instance: the first interval ended before the
    # funds ran out, the second is cut at the exact second.
    v = c.signup()
    t1 = c.d.now()
    iid = c.launch(v, "MI450", 8)
    c.d.set_clock(t1 + 600)
    c.stop(v, iid)
    r = c.start(v, iid)
    assert r.status_code == 200, r.text
    c.wait_state(v, iid, "running")
    c.d.set_clock(t1 + 5000)
    c.billing()
    (s1, e1, b1, _, _), (s2, e2, b2, st2, _) = c.intervals(iid)
    assert (s1, e1, b1) == (t1, t1 + 600, 1_600_000)
    assert (s2, e2, b2, st2) == (t1 + 600, t1 + 3750, 8_400_000, 1)
    c.wait_state(v, iid, "stopped")


def test_price_change_mid_run_charges_each_side_at_its_price(new_cluster):
    c = new_cluster(nodes={"MI450": 2})
    u = c.signup()
    c.topup(u, 20 * MICRO)
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 8)
    # Never backwards.
    r = c.admin("PUT", "/v1/admin/prices/MI450", json={"price_per_card_hour": "2.40", "effective_at": iso(t0 - 1)})
    assert_error(r, 400, "invalid_field", "effective_at")
    c.set_price("MI450", 2_400_000, t0 + 1800)
    c.d.set_clock(t0 + 1000)
    c.billing()
    assert c.spent(u) == accrue(1_200_000, 8, 1000)
    c.d.set_clock(t0 + HOUR)
    c.billing()
    assert c.spent(u) == accrue(1_200_000, 8, 1800) + accrue(2_400_000, 8, 1800) == 14_400_000
    # The history and the current price show it.
    hist = c.d.get("/v1/prices", params={"gpu_type": "MI450"}).json()["data"]
    assert [(p["price_per_card_hour"], p["effective_at"]) for p in hist] == [
        ("1.20", iso(0)), ("2.40", iso(t0 + 1800))]
    types = {t["code"]: t for t in c.d.get("/v1/gpu-types").json()["data"]}
    assert types["MI450"]["price_per_card_hour"] == "2.40", types["MI450"]
    est = c.d.get("/v1/estimate", params={"gpu_type": "MI450", "card_count": 8, "hours": 1}).json()
    assert est["total"] == "19.20"
    c.stop(u, iid)
    # A short run across a change: each side floored on its own piece.
    v = c.signup()
    t1 = c.d.now()
    c.set_price("MI450", 1_300_000, t1 + 5)
    iid = c.launch(v, "MI450", 1)
    c.d.set_clock(t1 + 12)
    c.stop(v, iid)
    c.billing()
    assert c.spent(v) == accrue(2_400_000, 1, 5) + accrue(1_300_000, 1, 7) == 3_333 + 2_527
    assert c.spent(u) == 14_400_000


def _expiry_scenario(c, pass_times):
    """A user with a 6.00 grant expiring at +1800, the 10.00 trial credit and
    5.00 cash runs 8 x MI450 (9.60/h) until the funds run out; billing passes
    run at pass_times (seconds after the start). Returns what happened."""
    u = c.signup()
    t0 = c.d.now()
    g = c.grant(u, 6 * MICRO, expires_at=t0 + 1800, reason="launch week")
    c.topup(u, 5 * MICRO)
    iid = c.launch(u, "MI450", 8)
    for t in pass_times:
        c.d.set_clock(t0 + t)
        c.billing()
    c.wait_state(u, iid, "stopped")
    b = c.balance(u)
    [signup] = [x for x in b["grants"] if x != g]
    postings = c.d.sql(
        "SELECT t.kind, t.at - ?, p.account_id, p.amount, p.grant_id FROM ledger_postings p"
        " JOIN ledger_transactions t ON t.id = p.transaction_id WHERE t.user_id = ? AND p.account_id LIKE 'grant:%'"
        " AND t.kind = 'expiry'", (t0, u.id))
    by_source = c.d.sql(
        "SELECT coalesce(p.grant_id, 'cash'), -sum(p.amount) FROM ledger_postings p"
        " JOIN ledger_transactions t ON t.id = p.transaction_id JOIN ledger_accounts a ON a.id = p.account_id"
        " WHERE t.user_id = ? AND t.kind = 'usage' AND a.kind IN ('cash', 'grant') GROUP BY 1", (u.id,))
    by_source = {("expiring" if k == g else "signup" if k == signup else k): v for k, v in by_source}
    [(start, end, _, _, _)] = c.intervals(iid)
    return {
        "grant": (b["grants"][g]["remaining"], b["grants"][g]["expired"]),
        "voided": c.d.sql("SELECT voided_at - ?, remaining FROM credit_grants WHERE id = ?", (t0, g))[0],
        "expiry postings": [(k, at, amount, gid == g and acct == f"grant:{g}") for k, at, acct, amount, gid in postings],
        "drawn": by_source,
        "spent": c.spent(u),
        "ran": end - start,
        "balance": (b["cash"], b["credit"], b["available"]),
    }


def test_grant_expiry_and_skipped_passes_agree(new_cluster):
    c = new_cluster(nodes={"MI450": 2})
    every_5_min = _expiry_scenario(c, range(300, 8101, 300))
    one_late_pass = _expiry_scenario(c, [8000])
    odd = _expiry_scenario(c, [1, 1799, 1800, 1801, 7424, 7425, 7426, 9000])
    expected = {
        "grant": (0, True),
        "voided": (1800, 0),
        # 4.80 of usage before the expiry came from the grant; 1.20 is void.
        "expiry postings": [("expiry", 1800, -1_200_000, True)],
        "drawn": {"expiring": 4_800_000, "signup": 10 * MICRO, "cash": 5 * MICRO},
        "spent": 19_800_000,
        # 15.00 after the expiry lasts 5 625 s more at 9.60/h.
        "ran": 1800 + 5625,
        "balance": (0, 0, 0),
    }
    assert every_5_min == expected
    assert one_late_pass == expected
    assert odd == expected


def test_grant_expires_and_is_voided_without_usage(money_cluster):
    c = money_cluster
    u = c.signup()
    t0 = c.d.now()
    g = c.grant(u, 3 * MICRO, expires_at=t0 + 600)
    b = c.balance(u)
    assert (b["credit"], b["available"]) == (13 * MICRO, 13 * MICRO)
    assert b["grants"][g]["expires_at"] == iso(t0 + 600) and b["grants"][g]["expired"] is False
    c.d.set_clock(t0 + 600)
    b = c.balance(u)  # expired at its second, before any pass
    assert (b["credit"], b["grants"][g]["remaining"], b["grants"][g]["expired"]) == (10 * MICRO, 0, True)
    c.billing()
    [t] = c.transactions(u, kind="expiry")
    assert (t["at"], t["amount"], t["credit"], t["cash"]) == (iso(t0 + 600), "-3.00", "-3.00", "0.00")
    assert c.d.sql("SELECT remaining, voided_at FROM credit_grants WHERE id = ?", (g,)) == [(0, t0 + 600)]
    c.billing()
    assert len(c.transactions(u, kind="expiry")) == 1


def test_draw_order_soonest_expiry_first_then_cash(money_cluster):
    c = money_cluster
    u = c.signup()  # 10.00 that never expires
    t0 = c.d.now()
    later = c.grant(u, 2 * MICRO, expires_at=t0 + 7200)
    sooner = c.grant(u, 1 * MICRO, expires_at=t0 + 3600)
    c.topup(u, 5 * MICRO)
    signup = [g for g in c.balance(u)["grants"] if g not in (later, sooner)][0]
    iid = c.launch(u, "MI450", 8)

    def legs_of_last_usage():
        [(txn,)] = c.d.sql("SELECT max(id) FROM ledger_transactions WHERE user_id = ? AND kind = 'usage'", (u.id,))
        return c.d.sql("SELECT account_id, amount, grant_id FROM ledger_postings WHERE transaction_id = ?"
                       " ORDER BY id", (txn,))

    c.d.set_clock(t0 + 1800)
    c.billing()  # 4.80
    assert legs_of_last_usage() == [
        (f"grant:{sooner}", -1 * MICRO, sooner),
        (f"grant:{later}", -2 * MICRO, later),
        (f"grant:{signup}", -1_800_000, signup),
        ("revenue", 4_800_000, None),
    ]
    c.d.set_clock(t0 + 3000)
    c.billing()  # 3.20
    assert legs_of_last_usage() == [(f"grant:{signup}", -3_200_000, signup), ("revenue", 3_200_000, None)]
    c.d.set_clock(t0 + 5400)
    c.billing()  # 6.40: the rest of the trial credit, then cash
    assert legs_of_last_usage() == [(f"grant:{signup}", -5 * MICRO, signup), (f"cash:{u.id}", -1_400_000, None),
                                    ("revenue", 6_400_000, None)]
    b = c.balance(u)
    assert (b["cash"], b["credit"]) == (3_600_000, 0)
    assert c.spent(u) == accrue(PRICE["MI450"], 8, 5400)
    c.stop(u, iid)


def test_grant_expiry_with_more_users_than_one_billing_batch(new_cluster):
    """Every user's credit is spent up to its expiry, whichever batch of the
    pass bills them."""
    n = 230
    c = new_cluster(nodes={"MI450": 29})
    t0 = c.d.now()
    users = [c.signup() for _ in range(n)]
    grants = [c.grant(u, 1 * MICRO, expires_at=t0 + 1800) for u in users]
    ids = []
    for u in users:
        r = c.create(u, "MI450", 1)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    for u, iid in zip(users, ids):
        c.wait_state(u, iid, "running")
    c.d.set_clock(t0 + HOUR)
    c.billing()
    wrong = []
    for u, g in zip(users, grants):
        rows = c.d.sql("SELECT remaining, voided_at FROM credit_grants WHERE id = ?", (g,))
        expiry = c.d.sql("SELECT -sum(p.amount) FROM ledger_postings p JOIN ledger_transactions t"
                         " ON t.id = p.transaction_id WHERE t.kind = 'expiry' AND p.grant_id = ?", (g,))[0][0]
        if rows != [(0, t0 + 1800)] or expiry != 400_000 or c.spent(u) != 1_200_000:
            wrong.append((u.id, rows, expiry, c.spent(u)))
    assert not wrong, f"{len(wrong)} of {n} users billed wrongly, e.g. {wrong[:3]}"


def test_estimates_match_the_worked_examples(money_cluster):
    d = money_cluster.d

    def est(**q):
        r = d.get("/v1/estimate", params=q)
        assert r.status_code == 200, r.text
        return r.json()
    e = est(gpu_type="MI450", card_count=8, hours=3)
    assert (e["total"], e["price_per_card_hour"], e["currency"], e["runs"]) == ("28.80", "1.20", "CNY", 1)
    assert est(gpu_type="MI450", card_count=8, hours=1)["total"] == "9.60"
    assert est(gpu_type="MI450", card_count=1, hours="0.000278")["total"] == yuan(accrue(PRICE["MI450"], 1, 1))
    assert est(gpu_type="MI300X", card_count=8, hours="1.5")["total"] == "26.40"
    e = est(gpu_type="MI450", card_count=8, hours_per_day=2, days=5)
    assert (e["cost_per_run"], e["runs"], e["total"]) == ("19.20", 5, "96.00")
    for bad in ({"gpu_type": "MI450", "card_count": 8},
                {"gpu_type": "MI450", "card_count": 8, "hours": "1.0000001"},
                {"gpu_type": "MI450", "card_count": 8, "hours": "-1"},
                {"gpu_type": "MI450", "card_count": 8, "hours": "1e3"},
                {"gpu_type": "MI450", "card_count": 8, "hours": " 1"},
                {"gpu_type": "MI450", "card_count": 8, "hours": "0"},
                {"gpu_type": "MI450", "card_count": 0, "hours": "1"},
                {"gpu_type": "MI450", "card_count": 8, "hours": "1", "hours_per_day": "2"},
                {"gpu_type": "MI450", "card_count": 8, "hours": "1", "days": "2"},
                {"gpu_type": "MI450", "card_count": 8, "hours_per_day": "25", "days": "2"},
                {"gpu_type": "NOPE", "card_count": 8, "hours": "1"},
                {"gpu_type": "MI450", "card_count": 8, "hours": "1", "extra": "1"},
                {"card_count": 8, "hours": "1"}):
        r = d.get("/v1/estimate", params=bad)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_query", (bad, r.text)


def test_unbilled_usage_counts_against_a_new_start(money_cluster):
    """Between passes the balance shows what has accrued, and the minimum-run
    check counts it: funds already used cannot start another instance."""
    c = money_cluster
    u = c.signup()
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 8)
    c.d.set_clock(t0 + 3000)
    b = c.balance(u)
    assert (b["credit"], b["unbilled"], b["available"]) == (10 * MICRO, 8 * MICRO, 2 * MICRO)
    # 1.60 for the new one and 1.60 for the 8 cards already held: 2.00 is short.
    err = assert_error(c.create(u, "MI450", 8), 402, "insufficient_funds")
    assert "3.20" in err["message"] and "2.00" in err["message"], err
    c.billing()
    b = c.balance(u)
    assert (b["credit"], b["unbilled"], b["available"]) == (2 * MICRO, 0, 2 * MICRO)
    # Past the end of the funds, before a pass: nothing is left, not less.
    c.d.set_clock(t0 + 4000)
    b = c.balance(u)
    assert (b["unbilled"], b["available"]) == (accrue(PRICE["MI450"], 8, 4000) - 8 * MICRO, 0)
    c.billing()
    assert c.spent(u) == 10 * MICRO
    c.wait_state(u, iid, "stopped")


def test_a_create_s_reply_warns_of_a_low_balance_as_its_funds_check_saw_it(money_cluster):
    """A create's reply takes its low_balance from the funds its own check
    read (unbilled usage included) against the owner's burn: nothing
    running is never low; 2.00 left at 9.60 an hour is."""
    c = money_cluster
    u = c.signup()
    t0 = c.d.now()
    r = c.create(u, "MI450", 8)
    assert r.status_code == 201, r.text
    assert r.json()["low_balance"] is False  # nothing burns yet
    first = r.json()["id"]
    c.wait_state(u, first, "running")
    c.d.set_clock(t0 + 3000)
    b = c.balance(u)
    assert (b["available"], b["raw"]["low_balance"]) == (2 * MICRO, True)
    # 1.80 covers ten minutes of 1 + 8 cards: created, and warned.
    r = c.create(u, "MI450", 1)
    assert r.status_code == 201, r.text
    assert r.json()["low_balance"] is True
    assert c.instance(u, r.json()["id"])["low_balance"] is True
    assert c.instance(u, first)["low_balance"] is True


def test_background_passes_post_within_minutes_and_stop_at_the_exact_second(new_cluster):
    c = new_cluster(nodes={"MI450": 2}, options={"billing_interval_ms": "100"})
    u = c.signup()
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 8)
    # More than the posting period later, a periodic pass posts it all.
    c.d.set_clock(t0 + 400)
    poll(lambda: c.spent(u) == accrue(PRICE["MI450"], 8, 400), 20, "the usage to be posted")
    assert c.balance(u)["available"] == 10 * MICRO - accrue(PRICE["MI450"], 8, 400)
    # Funds run out: the periodic pass notices without being asked.
    c.d.set_clock(t0 + 5000)
    body = c.wait_state(u, iid, "stopped")
    assert f"funds ran out at {iso(t0 + 3750)}" in body["state_reason"]
    [(start, end, billed, settled, _)] = c.intervals(iid)
    assert (end - start, billed, settled) == (3750, 10 * MICRO, 1)
    assert c.spent(u) == 10 * MICRO


def test_a_user_with_more_grants_than_one_read_spends_them_all(money_cluster):
    c = money_cluster
    u = c.cli_user()
    t0 = c.d.now()
    grants = [c.grant(u, 100_000, expires_at=t0 + 86400 + 60 * (i % 7)) for i in range(70)]
    c.topup(u, 1 * MICRO)
    iid = c.launch(u, "MI450", 8)
    c.d.set_clock(t0 + 3000)  # 8.00: all 70 grants (7.00) and the cash
    c.billing()
    b = c.balance(u)
    assert (b["credit"], b["cash"], c.spent(u)) == (0, 0, 8 * MICRO)
    assert all(b["grants"][g]["remaining"] == 0 for g in grants)
    assert c.instance(u, iid)["state"] == "running"  # exactly enough is not too little
    c.d.set_clock(t0 + 3001)
    c.billing()
    [(start, end, billed, _, _)] = c.intervals(iid)
    assert (end - start, billed) == (3000, 8 * MICRO)
    c.wait_state(u, iid, "stopped")


def test_users_billed_in_a_batch_and_one_by_one_in_the_same_pass(money_cluster):
    """One pass bills, in one batch of users, those whose funds cover what
    they owe (here: one drawing its trial credit and then cash, one whose
    instance stopped before the pass) and, one by one, one whose funds ran
    out. Each is charged exactly the formula, in the order credit then cash,
    and the one out of funds is stopped at the exact second."""
    c = money_cluster
    rich, stopped, short = c.signup(), c.signup(), c.signup()
    c.topup(rich, 20 * MICRO)
    t0 = c.d.now()
    a = c.launch(rich, "MI450", 8)
    b = c.launch(stopped, "MI450", 1)
    s = c.launch(short, "MI450", 8)
    c.d.set_clock(t0 + 600)
    c.stop(stopped, b)
    c.d.set_clock(t0 + 2 * HOUR)
    c.billing()
    # rich: 19.20, the 10.00 of trial credit first, then 9.20 of cash.
    [(txn,)] = c.d.sql("SELECT max(id) FROM ledger_transactions WHERE user_id = ? AND kind = 'usage'", (rich.id,))
    [trial] = c.balance(rich)["grants"]
    assert c.d.sql("SELECT account_id, amount FROM ledger_postings WHERE transaction_id = ? ORDER BY id", (txn,)) == [
        (f"grant:{trial}", -10 * MICRO), (f"cash:{rich.id}", -9_200_000), ("revenue", 19_200_000)]
    assert c.spent(rich) == accrue(PRICE["MI450"], 8, 2 * HOUR)
    assert c.balance(rich)["cash"] == 20 * MICRO - 9_200_000
    # stopped: 600 s of one card, settled.
    [(start, end, billed, settled, _)] = c.intervals(b)
    assert (start, end, billed, settled) == (t0, t0 + 600, accrue(PRICE["MI450"], 1, 600), 1)
    assert c.spent(stopped) == billed
    # short: the 10.00 lasts 3 750 s of 8 cards, and the instance stops.
    [(start, end, billed, settled, reason)] = c.intervals(s)
    assert (start, end, billed, settled, reason) == (t0, t0 + 3750, 10 * MICRO, 1, "funds exhausted")
    c.wait_state(short, s, "stopped")
    # A second pass at the same second posts nothing more.
    before = c.d.sql("SELECT count(*) FROM ledger_transactions")[0][0]
    c.billing()
    assert c.d.sql("SELECT count(*) FROM ledger_transactions")[0][0] == before
    c.stop(rich, a)
