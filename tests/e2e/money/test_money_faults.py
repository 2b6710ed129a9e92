"""test_money_faults.py: money under faults and late passes. A billing pass
may come every second or once an hour late (a daemon stopped, a disk full,
a crash): what it charges and where it stops an instance must not depend
on which. Expected amounts come from the design's formulas, floor(price x
cards x seconds / 3600) for card time and floor(price x size_gb x seconds
/ 2 592 000) for storage, never from the daemon; `gpurentd ledger verify`
runs after every test."""
import os
import random

from harness import assert_error
from money_util import (MICRO, PRICE, accrue, kill_during_passes, micro, new_cluster, quiet,  # noqa: F401
                        storage_cost, verify_ledgers, yuan)
from test_money_verify import assert_breach, base, copy, corrupt, verify_cluster  # noqa: F401

IMAGE = "rocm/pytorch:2.3-rocm6.2"
SEED = int(os.environ.get("MONEY_CRASH_SEED", "0")) or random.randrange(1, 10**9)


def run_out_second(funds, storage_price, size_gb, cards, horizon):
    """The last second s whose storage and card time together funds cover."""
    return max(s for s in range(horizon + 1)
               if storage_cost([(0, storage_price)], size_gb, 0, s) + accrue(PRICE["MI450"], cards, s) <= funds)


def test_funds_with_storage_run_out_at_the_same_second_whenever_passes_run(new_cluster):
    c = new_cluster(nodes={"MI450": 1})
    price = 30 * MICRO  # 30.00 a GB-month: 100 GB cost about as much as 1 card
    r = c.admin("PUT", "/v1/admin/storage-prices/far", json={"price_per_gb_month": yuan(price)})
    assert r.status_code == 200, r.text
    want = run_out_second(4 * MICRO, price, 100, 4, 3000)
    assert 1500 < want < 1700

    def run(step):
        """A user with 4.00, a 100 GB volume and 4 cards, billed every
        `step` seconds for 3 000 s; returns where the card time ended."""
        u = c.cli_user()
        c.topup(u, 4 * MICRO)
        t0 = c.d.now()
        r = c.d.post("/v1/volumes", key=u.key, json={"name": "data", "size_gb": 100, "region": "far"})
        assert r.status_code == 201, r.text
        vid = r.json()["id"]
        r = c.d.post("/v1/instances", key=u.key,
                     json={"gpu_type": "MI450", "card_count": 4, "image": IMAGE, "volume_id": vid})
        assert r.status_code == 201, r.text
        iid = r.json()["id"]
        c.wait_state(u, iid, "running")  # the clock stands still meanwhile
        while c.d.now() < t0 + 3000:
            c.d.set_clock(min(c.d.now() + step, t0 + 3000))
            c.billing()
        c.wait_state(u, iid, "stopped")
        [(start, end, billed, settled, reason)] = c.intervals(iid)
        assert (start, settled, reason) == (t0, 1, "funds exhausted")
        # Card time is charged to where the funds ran out; storage is charged
        # to there too and then takes what was left, owing the rest.
        assert billed == c.spent(u) == accrue(PRICE["MI450"], 4, end - start)
        [(storage_billed,)] = c.d.sql("SELECT storage_billed FROM volumes WHERE id = ?", (vid,))
        assert storage_billed == 4 * MICRO - billed
        assert storage_cost([(0, price)], 100, 0, end - t0) <= storage_billed
        assert c.balance(u)["cash"] == 0
        c.d.set_clock(t0 + 3600)
        return end - t0

    # Passes every 7 s, every 50 s, and one pass an hour late, as after a
    # daemon stopped or a disk full: the same second each time.
    assert [run(7), run(50), run(3000)] == [want] * 3


def test_kill_9_during_passes_with_storage_changes_no_total(new_cluster):
    """Users with a priced volume and an instance on it, some with funds
    that run out within the hour; the daemon is killed with SIGKILL in and
    between passes while the clock jumps. After each kill `ledger verify`
    passes; at the end every user's card time, storage and cash are what
    one late pass gives by the formulas: totals never depend on when passes
    ran or were cut short."""
    rng = random.Random(SEED)
    print(f"seed {SEED} (rerun with MONEY_CRASH_SEED={SEED})")
    c = new_cluster(nodes={"MI450": 5}, options={"billing_interval_ms": "100"})
    price = 30 * MICRO
    r = c.admin("PUT", "/v1/admin/storage-prices/far", json={"price_per_gb_month": yuan(price)})
    assert r.status_code == 200, r.text
    t0 = c.d.now()
    runs = []
    for cards, size_gb, funds in [(8, 100, 3), (8, 10, 20), (4, 100, 4), (4, 1000, 9), (2, 100, 2), (2, 50, 30),
                                  (1, 100, 1), (1, 500, 5), (4, 10, 1), (1, 1, 40)]:
        u = c.cli_user()
        c.topup(u, funds * MICRO)
        r = c.d.post("/v1/volumes", key=u.key, json={"name": "data", "size_gb": size_gb, "region": "far"})
        assert r.status_code == 201, r.text
        vid = r.json()["id"]
        r = c.d.post("/v1/instances", key=u.key,
                     json={"gpu_type": "MI450", "card_count": cards, "image": IMAGE, "volume_id": vid})
        assert r.status_code == 201, r.text
        runs.append((u, r.json()["id"], vid, cards, size_gb, funds * MICRO))
    for u, iid, *_ in runs:
        c.wait_state(u, iid, "running")

    kill_during_passes(c, rng, 16, (60, 300), SEED)
    t_end = c.d.advance_clock(61)
    c.billing()
    ran_out = 0
    for u, iid, vid, cards, size_gb, funds in runs:
        s = run_out_second(funds, price, size_gb, cards, t_end - t0)
        [(start, end, billed, settled, reason)] = c.intervals(iid)
        [(storage_billed,)] = c.d.sql("SELECT storage_billed FROM volumes WHERE id = ?", (vid,))
        cash = c.balance(u)["cash"]
        if s < t_end - t0:
            ran_out += 1
            want = (t0 + s, accrue(PRICE["MI450"], cards, s), 1, "funds exhausted", funds - billed, 0)
        else:
            want = (None, accrue(PRICE["MI450"], cards, t_end - t0), 0, "",
                    storage_cost([(0, price)], size_gb, 0, t_end - t0),
                    funds - billed - storage_cost([(0, price)], size_gb, 0, t_end - t0))
        assert (end, billed, settled, reason, storage_billed, cash) == want, f"{u} (seed {SEED})"
    assert 0 < ran_out < len(runs)


def test_ledger_verify_finds_an_open_interval_charged_for_time_it_had_not_run(copy):
    """A running interval's charges are dated when they were computed, and
    what it was billed can never be more than its tariff up to then (or up
    to its end): the auditor, and money_util's reading of the rows, find a
    charge for time not known to have run, not only a settled interval's."""
    path, ids = copy
    iv = ids["open"]
    started, billed = corrupt(path, lambda con: con.execute(
        "SELECT started_at, billed FROM running_intervals WHERE id = ?", (iv,)).fetchone())
    assert billed == accrue(PRICE["MI450"], 1, 600)
    # Its 600 s charged as if computed a minute after it started.
    corrupt(path, lambda con: con.execute("UPDATE ledger_transactions SET at = ? WHERE interval_id = ?"
                                          " AND kind = 'usage'", (started + 60, iv)))
    out = assert_breach(path, "interval billed beyond its tariff to its end or latest charge", f"{iv}: billed")
    assert f"{iv}: billed {billed}, due {accrue(PRICE['MI450'], 1, 60)}" in out, out


def test_funds_cut_while_the_clock_ran_ahead_ends_where_the_instance_stopped(new_cluster):
    """The clock jumps a day ahead (a bad NTP step), a pass finds the funds
    ran out at 1 875 s and stops the instance, and the clock steps back to
    100 s before the stop is done: the instance ran 100 s, so that is what
    it is billed, the rest given back."""
    c = new_cluster(nodes={"MI450": 1})
    u = c.cli_user()
    c.topup(u, 5 * MICRO)
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 8)
    # The agent holds the stop (its calls time out after seconds, far
    # longer than this) until the clock is back.
    with quiet(c.fleets[0]):
        c.d.set_clock(t0 + 86400)
        c.billing()
        [(_, end, billed, settled, reason)] = c.intervals(iid)
        assert (end, billed, settled, reason) == (t0 + 1875, 5 * MICRO, 1, "funds exhausted")
        c.d.set_clock(t0 + 100)
    c.wait_state(u, iid, "stopped")
    [(_, end, billed, settled, reason)] = c.intervals(iid)
    assert (end, billed, settled, reason) == (t0 + 100, accrue(PRICE["MI450"], 8, 100), 1, "funds exhausted")
    assert c.balance(u)["cash"] == 5 * MICRO - billed
    [refund] = [t for t in c.transactions(u) if t["kind"] == "refund"]
    assert refund["instance_id"] == iid and micro(refund["amount"]) == 5 * MICRO - billed
    # Passes after the clock catches up change nothing.
    c.d.set_clock(t0 + 90000)
    c.billing()
    assert c.intervals(iid)[0][1:3] == (t0 + 100, billed)


def test_credit_voided_while_the_clock_ran_ahead_comes_back_when_it_steps_back(new_cluster):
    """The clock jumps a day ahead, a pass voids a credit that expires in an
    hour, and the clock steps back: the next pass gives the credit back
    (what was left of it, less what it paid meanwhile), and it is voided
    again only at its real expiry. A credit an instance was drawing on is
    spent up to the pass's time first."""
    c = new_cluster(nodes={"MI450": 1})
    u, idle = c.cli_user(), c.cli_user()
    t0 = c.d.now()
    g = c.grant(u, 5 * MICRO, expires_at=t0 + 3600)
    g_idle = c.grant(idle, 2 * MICRO, expires_at=t0 + 3600)
    iid = c.launch(u, "MI450", 1)
    c.d.set_clock(t0 + 600)
    c.billing()
    spent = accrue(PRICE["MI450"], 1, 600)
    assert c.balance(u)["grants"][g]["remaining"] == 5 * MICRO - spent
    c.d.set_clock(t0 + 86400)  # a bad NTP step
    with quiet(c.fleets[0]):
        c.billing()
        voided = {k: v for (k, v) in c.d.sql("SELECT id, voided_at FROM credit_grants")}
        assert voided[g] == voided[g_idle] == t0 + 3600
        c.d.set_clock(t0 + 700)  # and back
    c.billing()
    b, b_idle = c.balance(u), c.balance(idle)
    assert b_idle["credit"] == 2 * MICRO and b_idle["grants"][g_idle]["remaining"] == 2 * MICRO
    # The instance drew on the credit up to the expiry in the pass ahead;
    # the clock back at 700 s, the stop at the end gives back the rest.
    assert b["grants"][g]["remaining"] > 0
    assert c.d.sql("SELECT count(*) FROM credit_grants WHERE voided_at IS NOT NULL") == [(0,)]
    back = [t for t in c.transactions(idle) if t["kind"] == "expiry"]
    assert [micro(t["amount"]) for t in back] in ([-2 * MICRO, 2 * MICRO], [2 * MICRO, -2 * MICRO])
    # At the real expiry it is voided once more, for what is left then.
    c.d.set_clock(t0 + 3600)
    c.billing()
    assert c.balance(idle)["credit"] == 0
    assert c.d.sql("SELECT voided_at FROM credit_grants WHERE id = ?", (g_idle,)) == [(t0 + 3600,)]
    c.stop(u, iid)


def test_a_topup_retried_with_its_idempotency_key_after_a_crash_gets_the_first_answer(new_cluster):
    """An admin's top-up sent again with the same Idempotency-Key (its
    answer lost to a daemon killed after the commit) gets the first answer
    again, 201 with the same body and Location, and adds the money once;
    the key with another body is 422. Without a key a repeated payment id
    still answers 200 duplicate."""
    c = new_cluster(nodes={})
    u = c.cli_user()
    path = f"/v1/admin/users/{u.id}/topups"
    body = {"amount": "12.34", "payment_id": "bank-7781"}
    first = c.admin("POST", path, json=body, headers={"Idempotency-Key": "tp-1"})
    assert first.status_code == 201, first.text
    c.d.proc.kill()
    c.d.proc.wait(timeout=30)
    c.d.proc = None
    c.d.start()
    again = c.admin("POST", path, json=body, headers={"Idempotency-Key": "tp-1"})
    assert (again.status_code, again.text, again.headers["Location"]) == (201, first.text, first.headers["Location"])
    assert again.headers["Idempotent-Replayed"] == "true"
    assert c.balance(u)["cash"] == 12_340_000
    r = c.admin("POST", path, json={**body, "amount": "12.35"}, headers={"Idempotency-Key": "tp-1"})
    assert_error(r, 422, "idempotency_key_reused", "Idempotency-Key")
    r = c.admin("POST", path, json=body)
    assert r.status_code == 200 and r.json()["duplicate"] is True, r.text
    assert r.json()["topup_id"] == first.json()["topup_id"]
    # A key first used for a repeated payment replays that answer too.
    r = c.admin("POST", path, json=body, headers={"Idempotency-Key": "tp-2"})
    assert r.status_code == 200 and r.json()["duplicate"] is True, r.text
    r2 = c.admin("POST", path, json=body, headers={"Idempotency-Key": "tp-2"})
    assert (r2.status_code, r2.text, r2.headers.get("Idempotent-Replayed")) == (200, r.text, "true")
    assert c.balance(u)["cash"] == 12_340_000
    assert c.d.sql("SELECT count(*) FROM admin_actions WHERE action = 'topup'") == [(1,)]


def test_a_redemption_retried_with_its_idempotency_key_after_a_crash_gets_the_first_answer(new_cluster):
    """A redemption whose answer was lost to a daemon killed after the
    commit, sent again with its Idempotency-Key, gets the first 201 again
    (not 409 "already redeemed") and the credit once; the key with another
    code is 422, and without a key a second redemption is still 409."""
    c = new_cluster(nodes={})
    for code in ("RETRY-1", "RETRY-2"):
        r = c.admin("POST", "/v1/admin/invite-codes", json={"code": code, "amount": "6.00"})
        assert r.status_code == 201, r.text
    u = c.cli_user()  # no trial yet, so it may redeem a code
    first = c.d.post("/v1/invite-codes/redeem", key=u.key, json={"code": "retry-1"},
                     headers={"Idempotency-Key": "redeem-1"})
    assert first.status_code == 201, first.text
    c.d.proc.kill()
    c.d.proc.wait(timeout=30)
    c.d.proc = None
    c.d.start()
    again = c.d.post("/v1/invite-codes/redeem", key=u.key, json={"code": "retry-1"},
                     headers={"Idempotency-Key": "redeem-1"})
    assert (again.status_code, again.text, again.headers["Location"]) == (201, first.text, "/v1/balance")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert c.balance(u)["credit"] == 6 * MICRO
    r = c.d.post("/v1/invite-codes/redeem", key=u.key, json={"code": "RETRY-2"}, headers={"Idempotency-Key": "redeem-1"})
    assert_error(r, 422, "idempotency_key_reused", "Idempotency-Key")
    r = c.d.post("/v1/invite-codes/redeem", key=u.key, json={"code": "retry-1"})
    assert_error(r, 409, "conflict", "code")
    assert c.d.sql("SELECT uses FROM invite_codes WHERE code = 'RETRY-1'") == [(1,)]
