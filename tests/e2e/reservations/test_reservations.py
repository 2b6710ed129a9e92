"""test_reservations.py: capacity blocks through the real daemon and sim
fleets on the testing clock: pools and the catalog, booking, listing,
availability and cancelling with its refund rule, payment and 402, using a
block (its window, its cards, no per-second charge, the warning and the
stop at the end, a terminate under way at the end), the credit for a node lost mid-window, other users' ids,
Idempotency-Key, and bad requests that change nothing. `ledger verify`
passes after every money step."""
import json
import os
import sys
import time


sys.path.insert(0, os.path.dirname(__file__))

from harness import assert_error  # noqa: E402
from instances_util import cloud, cloud_with, wait  # noqa: E402,F401  (fixture)
from money_util import from_iso, iso, ledger_verify, micro, run_gpurentd  # noqa: E402
from resv_util import ResvCloud, rc  # noqa: E402,F401  (rc is a fixture)

PRICE = 2_000_000  # H100-SXM, micro-yuan per card-hour


def balance(rc, acct):
    r = rc.d.get("/v1/balance", key=acct.key)
    assert r.status_code == 200, r.text
    return micro(r.json()["cash"]) + micro(r.json()["credit"])


def types(rc):
    r = rc.d.get("/v1/gpu-types")
    assert r.status_code == 200, r.text
    return {t["code"]: t for t in r.json()["data"]}


# ------------------------------------------------------------ pools and catalog

def test_reservation_required_type_has_no_on_demand_cards(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1")
    t = types(rc)["H100-SXM"]
    assert t["reservation_required"] is True
    assert t["cards_free"] == 0 and t["cards_reservable"] == 16, t
    assert t["reservation_price_per_card_hour"] == "2.00", t
    u = rc.c.user()
    r = rc.d.post("/v1/instances", key=u.key, json={"gpu_type": "H100-SXM", "card_count": 8,
                                                     "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"})
    err = assert_error(r, 403, "reservation_required", "gpu_type")
    assert "POST /v1/reservations" in err["message"], err
    assert rc.d.sql("SELECT count(*) FROM instances") == [(0,)]


def test_pools_keep_on_demand_and_reserved_placement_apart(rc):
    f = rc.c.fleet(2, model="MI450")
    names = sorted(f.nodes)
    node = rc.d.sql("SELECT id FROM nodes WHERE name = ?", (names[0],))[0][0]
    r = rc.c.admin("PATCH", f"/v1/admin/nodes/{node}", json={"pool": "reserved"})
    assert r.status_code == 200 and r.json()["pool"] == "reserved", r.text
    t = types(rc)["MI450"]
    assert t["cards_free"] == 8 and t["cards_reservable"] == 8, t
    u = rc.c.user()
    a = rc.c.create(u, card_count=8)
    assert [p["node_name"] for p in a["nodes"]] == [names[1]], a
    # The reserved node is not on-demand capacity, even with the other full.
    err = assert_error(rc.d.post("/v1/instances", key=u.key,
                                 json={"gpu_type": "MI450", "card_count": 1, "image": "rocm/pytorch:2.3-rocm6.2"}),
                       409, "insufficient_capacity", "card_count")
    assert err["cards_free"] == 0, err
    # A busy node does not change pools; a bad pool is a 400.
    busy = rc.d.sql("SELECT id FROM nodes WHERE name = ?", (names[1],))[0][0]
    assert_error(rc.c.admin("PATCH", f"/v1/admin/nodes/{busy}", json={"pool": "reserved"}), 409, "conflict", "pool")
    assert_error(rc.c.admin("PATCH", f"/v1/admin/nodes/{busy}", json={"pool": "spot"}), 400, "invalid_field", "pool")
    assert_error(rc.c.admin("PATCH", f"/v1/admin/nodes/{busy}", json={"pool": 3}), 400, "invalid_field", "pool")
    assert rc.d.sql("SELECT pool FROM nodes WHERE id = ?", (busy,)) == [("on_demand",)]
    # A reservation of MI450 runs on the reserved node only.
    b = rc.book(u, 8, rc.hour(1), 1, gpu="MI450")
    rc.d.advance_clock(rc.hour(1) - rc.d.now())
    inst = rc.c.create(u, card_count=8, reservation_id=b["id"])
    assert [p["node_name"] for p in inst["nodes"]] == [names[0]], inst
    assert inst["reservation_id"] == b["id"]
    rc.verify()


def test_a_node_leaves_the_reserved_pool_only_if_the_rest_holds_every_booking(rc):
    f = rc.c.fleet(2, model="MI450")
    ids = [i for (i,) in rc.d.sql("SELECT id FROM nodes ORDER BY name")]
    for i in ids:
        assert rc.c.admin("PATCH", f"/v1/admin/nodes/{i}", json={"pool": "reserved"}).status_code == 200
    u = rc.c.user()
    b = rc.book(u, 16, rc.hour(5), 1, gpu="MI450")
    for r in (rc.c.admin("PATCH", f"/v1/admin/nodes/{ids[0]}", json={"pool": "on_demand"}),
              rc.c.admin("DELETE", f"/v1/admin/nodes/{ids[0]}")):
        err = assert_error(r, 409, "conflict")
        assert err["hour"] == iso(rc.hour(5)), err
    assert rc.d.sql("SELECT count(*) FROM nodes WHERE pool = 'reserved' AND removed_at IS NULL") == [(2,)]
    assert rc.d.delete(f"/v1/reservations/{b['id']}", key=u.key).status_code == 200
    r = rc.c.admin("PATCH", f"/v1/admin/nodes/{ids[0]}", json={"pool": "on_demand"})
    assert r.status_code == 200 and r.json()["pool"] == "on_demand", r.text
    assert len(f.nodes) == 2
    rc.verify()


# ------------------------------------------------------------ booking

def test_book_list_get_availability_and_cancel_with_full_refund(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    before = balance(rc, u)
    start = rc.hour(72)
    b = rc.book(u, 8, start, 3)
    assert b["state"] == "upcoming" and b["cards"] == 8 and b["hours"] == 3, b
    assert micro(b["amount"]) == PRICE * 8 * 3 and b["price_per_card_hour"] == "2.00", b
    assert balance(rc, u) == before - PRICE * 24
    rc.verify()
    listed = rc.d.get("/v1/reservations", key=u.key).json()
    assert [x["id"] for x in listed["data"]] == [b["id"]] and listed["next_cursor"] is None, listed
    assert rc.d.get(f"/v1/reservations/{b['id']}", key=u.key).json() == b
    r = rc.d.get("/v1/reservations/availability", key=u.key,
                 params={"gpu_type": "H100-SXM", "from": iso(start - 3600), "to": iso(start + 4 * 3600)})
    assert r.status_code == 200, r.text
    assert [h["cards_free"] for h in r.json()["hours"]] == [16, 8, 8, 8, 16], r.json()
    assert r.json()["hours"][1]["starts_at"] == iso(start)
    # "availability" is a resource of its own, not a reservation's id.
    r = rc.d.request("OPTIONS", "/v1/reservations/availability", key=u.key)
    assert r.status_code == 204 and r.headers["Allow"] == "GET, HEAD", r.headers
    r = rc.d.delete("/v1/reservations/availability", key=u.key)
    assert_error(r, 405, "method_not_allowed")
    assert r.headers["Allow"] == "GET, HEAD", r.headers
    # Cancelled well before the notice period: everything back.
    r = rc.d.delete(f"/v1/reservations/{b['id']}", key=u.key)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled" and r.json()["refunded"] == b["amount"], r.json()
    assert balance(rc, u) == before
    assert_error(rc.d.delete(f"/v1/reservations/{b['id']}", key=u.key), 409, "invalid_state")
    r = rc.d.get("/v1/reservations/availability", key=u.key,
                 params={"gpu_type": "H100-SXM", "from": iso(start), "to": iso(start + 3600)})
    assert [h["cards_free"] for h in r.json()["hours"]] == [16]
    rc.verify()
    # ledger verify's totals and the revenue report agree on it.
    _, out = ledger_verify(rc.d.db_path)
    assert f"reservation totals: paid {b['amount']}, refunded {b['amount']}," in out, out
    p = run_gpurentd("report", "reservation-revenue", "--db", rc.d.db_path, "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [(r["gpu_model"], r["reservations"], r["paid"], r["refunded"], r["revenue"]) for r in rows] == \
        [("H100-SXM", 1, b["amount"], b["amount"], "0.00")], rows


def test_the_list_filters_by_state_and_type_and_pages_within_the_filter(rc):
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    rc.c.fleet(1, model="MI450")
    mi = rc.d.sql("SELECT id FROM nodes WHERE gpu_model = 'MI450'")[0][0]
    assert rc.c.admin("PATCH", f"/v1/admin/nodes/{mi}", json={"pool": "reserved"}).status_code == 200
    u, other = rc.c.user(), rc.c.user()
    made = {}
    for name, start, gpu in [("a", 1, "H100-SXM"), ("b", 3, "H100-SXM"), ("c", 2, "MI450"), ("d", 5, "H100-SXM")]:
        made[name] = rc.book(u, 1, rc.hour(start), 1, gpu=gpu)["id"]
        rc.d.advance_clock(1)  # newest first is then the booking order, reversed
    rc.book(other, 1, rc.hour(3), 1)
    assert rc.d.delete(f"/v1/reservations/{made['d']}", key=u.key).status_code == 200
    rc.d.set_clock(rc.hour(1) + 60)

    def ids(**params):
        r = rc.d.get("/v1/reservations", key=u.key, params=params)
        assert r.status_code == 200, r.text
        return [x["id"] for x in r.json()["data"]], r.json()["next_cursor"]

    assert ids() == ([made[k] for k in "dcba"], None)
    assert ids(state="active") == ([made["a"]], None)
    assert ids(state="upcoming") == ([made["c"], made["b"]], None)
    assert ids(state="cancelled") == ([made["d"]], None)
    assert ids(state="ended") == ([], None)
    assert ids(gpu_type="MI450") == ([made["c"]], None)
    assert ids(gpu_type="H100-SXM", state="upcoming") == ([made["b"]], None)
    first, cursor = ids(state="upcoming", limit="1")
    assert first == [made["c"]] and cursor
    assert ids(state="upcoming", limit="1", cursor=cursor) == ([made["b"]], None)
    rc.d.set_clock(rc.hour(4))
    assert ids(state="ended") == ([made[k] for k in "cba"], None)
    assert_error(rc.d.get("/v1/reservations", key=u.key, params={"state": "booked"}), 400, "invalid_query", "state")
    assert_error(rc.d.get("/v1/reservations", key=u.key, params={"gpu_type": "H" * 33}), 400, "invalid_query",
                 "gpu_type")
    rc.verify()


def test_late_cancel_refunds_half_and_a_started_block_nothing(rc):
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    before = balance(rc, u)
    late = rc.book(u, 4, rc.hour(10), 2)  # inside the 48-hour notice: 50%
    started = rc.book(u, 4, rc.hour(1), 2)
    paid = PRICE * 4 * 2
    r = rc.d.delete(f"/v1/reservations/{late['id']}", key=u.key)
    assert r.status_code == 200 and micro(r.json()["refunded"]) == paid // 2, r.text
    rc.d.advance_clock(rc.hour(1) - rc.d.now())
    err = assert_error(rc.d.delete(f"/v1/reservations/{started['id']}", key=u.key), 409, "invalid_state")
    assert err["state"] == "active", err
    assert balance(rc, u) == before - paid - paid // 2
    rows = rc.d.sql("SELECT kind, count(*) FROM ledger_transactions WHERE reservation_id IS NOT NULL GROUP BY kind")
    assert sorted(rows) == [("reservation", 2), ("reservation_refund", 1)]
    # The user's transactions show and filter both kinds.
    for kind, n in (("reservation", 2), ("reservation_refund", 1)):
        r = rc.d.get(f"/v1/transactions?kind={kind}", key=u.key)
        assert r.status_code == 200 and [t["kind"] for t in r.json()["data"]] == [kind] * n, r.text
    rc.verify()


def test_a_refund_makes_the_next_low_balance_worth_a_notice_again(rc):
    """The low-balance notice is sent once until money comes in; a late
    cancel's refund is money coming in, as a top-up is."""
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    rc.c.fleet(1)  # MI450, on demand at 1.20 a card-hour
    u = rc.c.user(funds="2.00")  # and the 10.00 of signing up
    b = rc.book(u, 1, rc.hour(10), 2)  # 4.00, half of it refunded when cancelled now
    iid = rc.c.create(u, gpu_type="MI450", card_count=8, image="rocm/pytorch:2.3-rocm6.2")["id"]  # 9.60 an hour
    rc.c.wait_state(u, iid, "running")

    def marked():
        [(at,)] = rc.d.sql("SELECT low_balance_noticed_at FROM users WHERE id = ?", (u.id,))
        return at is not None

    def notices():
        [(n,)] = rc.d.sql("SELECT count(*) FROM outbox WHERE user_id = ? AND subject LIKE 'Low balance%'", (u.id,))
        return n

    rc.billing()  # 7.84 left: 49 minutes
    assert rc.d.get("/v1/balance", key=u.key).json()["low_balance"] is True
    assert marked() and notices() == 1
    r = rc.d.delete(f"/v1/reservations/{b['id']}", key=u.key)
    assert r.status_code == 200 and micro(r.json()["refunded"]) == PRICE, r.text
    assert not marked()
    rc.billing()  # the refund makes 61 minutes: not low
    assert notices() == 1
    rc.d.advance_clock(600)
    rc.billing()  # low again: told again
    assert marked() and notices() == 2
    rc.verify()


def test_booking_without_funds_is_402_and_changes_nothing(rc):
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    u = rc.d.signup()  # only the 10-yuan trial: 8 cards x 1 hour is 16
    before = rc.counts()
    err = assert_error(rc.d.post("/v1/reservations", key=u.key,
                                 json={"gpu_type": "H100-SXM", "cards": 8, "starts_at": iso(rc.hour(2)),
                                       "ends_at": iso(rc.hour(3))}), 402, "insufficient_funds")
    assert err["price"] == "16.00", err
    assert rc.counts() == before
    # What the credit covers is paid from it.
    b = rc.book(u, 2, rc.hour(2), 1)
    assert micro(b["amount"]) == PRICE * 2
    assert micro(rc.d.get("/v1/balance", key=u.key).json()["credit"]) == 10_000_000 - PRICE * 2
    rc.verify()


def test_a_late_cancel_says_the_rules_percentage_whatever_the_rounding(rc):
    """An amount of an odd number of micro-yuan refunds half rounded down;
    the statement line still says the rule's 50 %, not 49."""
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    r = rc.c.admin("PUT", "/v1/admin/prices/H100-SXM",
                   json={"price_per_card_hour": "2.00", "reservation_price_per_card_hour": "1.333333"})
    assert r.status_code == 200, r.text
    u = rc.c.user()
    b = rc.book(u, 1, rc.hour(10), 1)
    r = rc.d.delete(f"/v1/reservations/{b['id']}", key=u.key)
    assert r.status_code == 200 and r.json()["refunded"] == "0.666666", r.text
    [(reason,)] = rc.d.sql("SELECT reason FROM ledger_transactions WHERE reservation_id = ? AND kind ="
                           " 'reservation_refund'", (b["id"],))
    assert reason == f"reservation {b['id']} cancelled: 50% refunded", reason
    rc.verify()


def test_a_reservation_price_applies_to_blocks_booked_after_it(rc):
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    before = rc.book(u, 2, rc.hour(3), 1)
    r = rc.c.admin("PUT", "/v1/admin/prices/H100-SXM",
                   json={"price_per_card_hour": "2.00", "reservation_price_per_card_hour": "1.50",
                         "reason": "block discount"})
    assert r.status_code == 200 and r.json()["reservation_price_per_card_hour"] == "1.50", r.text
    assert types(rc)["H100-SXM"]["reservation_price_per_card_hour"] == "1.50"
    after = rc.book(u, 2, rc.hour(3), 1)
    assert (before["amount"], after["amount"]) == ("4.00", "3.00"), (before, after)
    assert rc.d.get(f"/v1/reservations/{before['id']}", key=u.key).json()["amount"] == "4.00"
    for bad in ("-1", "1.2345678", "abc"):
        assert_error(rc.c.admin("PUT", "/v1/admin/prices/H100-SXM",
                                json={"price_per_card_hour": "2.00", "reservation_price_per_card_hour": bad}),
                     400, "invalid_field", "reservation_price_per_card_hour")
    assert_error(rc.c.admin("PUT", "/v1/admin/prices/H100-SXM",
                            json={"price_per_card_hour": "2.00", "reservation_price_per_card_hour": 2}),
                 400, "invalid_field", "reservation_price_per_card_hour")
    assert rc.d.sql("SELECT card_hour FROM reservation_prices") == [(1_500_000,)]
    rc.verify()


def test_idempotency_key_books_once(rc):
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    h = {"Idempotency-Key": "book-once-1"}
    a = rc.book(u, 8, rc.hour(5), 1, headers=h)
    r = rc.d.post("/v1/reservations", key=u.key, headers=h,
                  json={"gpu_type": "H100-SXM", "cards": 8, "starts_at": iso(rc.hour(5)), "ends_at": iso(rc.hour(6))})
    assert r.status_code == 201 and r.headers.get("Idempotent-Replayed") == "true" and r.json() == a, r.text
    assert r.headers["Location"] == f"/v1/reservations/{a['id']}"
    assert_error(rc.d.post("/v1/reservations", key=u.key, headers=h,
                           json={"gpu_type": "H100-SXM", "cards": 4, "starts_at": iso(rc.hour(5)),
                                 "ends_at": iso(rc.hour(6))}), 422, "idempotency_key_reused", "Idempotency-Key")
    assert rc.d.sql("SELECT count(*) FROM reservations") == [(1,)]
    rc.verify()


def test_multi_node_blocks_are_whole_nodes_of_one_fabric(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-2", prefix="b-")
    u = rc.c.user()
    # 24 cards fit the pool's 24, but no fabric has three nodes.
    assert_error(rc.d.post("/v1/reservations", key=u.key,
                           json={"gpu_type": "H100-SXM", "cards": 24, "starts_at": iso(rc.hour(3)),
                                 "ends_at": iso(rc.hour(4))}), 409, "insufficient_capacity", "cards")
    b = rc.book(u, 16, rc.hour(3), 1)
    assert b["fabric"] == "ib-1", b
    assert_error(rc.d.post("/v1/reservations", key=u.key,
                           json={"gpu_type": "H100-SXM", "cards": 16, "starts_at": iso(rc.hour(3)),
                                 "ends_at": iso(rc.hour(4))}), 409, "insufficient_capacity", "cards")
    # Once it starts, a 16-card instance takes the two whole nodes of ib-1.
    rc.d.set_clock(rc.hour(3))
    inst = rc.launch(u, b["id"], 16)
    assert sorted(p["node_name"] for p in inst["nodes"]) == ["a-01", "a-02"], inst
    rc.c.wait_state(u, inst["id"], "running")
    rc.verify()


# ------------------------------------------------------------ using a block

def test_a_block_is_used_within_its_window_and_cards_and_not_billed_per_second(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1")
    u = rc.c.user(max_cards=64)
    b = rc.book(u, 8, rc.hour(1), 2)
    err = assert_error(rc.d.post("/v1/instances", key=u.key,
                                 json={"gpu_type": "H100-SXM", "card_count": 4, "reservation_id": b["id"],
                                       "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"}),
                       409, "invalid_state", "reservation_id")
    assert err["state"] == "upcoming", err
    rc.d.advance_clock(rc.hour(1) - rc.d.now())
    paid = balance(rc, u)
    one = rc.launch(u, b["id"], 4)
    two = rc.launch(u, b["id"], 4)
    err = assert_error(rc.d.post("/v1/instances", key=u.key,
                                 json={"gpu_type": "H100-SXM", "card_count": 1, "reservation_id": b["id"],
                                       "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"}),
                       409, "insufficient_capacity", "card_count")
    assert err["reserved"] == 8 and err["in_use"] == 8, err
    # The block's type is the instance's.
    assert_error(rc.d.post("/v1/instances", key=u.key,
                           json={"gpu_type": "MI450", "card_count": 1, "reservation_id": b["id"],
                                 "image": "rocm/pytorch:2.3-rocm6.2"}), 400, "invalid_field", "gpu_type")
    for i in (one, two):
        rc.c.wait_state(u, i["id"], "running")
    assert rc.d.sql("SELECT count(*) FROM running_intervals") == [(0,)]
    rc.d.advance_clock(1800)
    rc.billing()
    assert balance(rc, u) == paid
    assert rc.d.sql("SELECT count(*) FROM ledger_transactions WHERE kind = 'usage'") == [(0,)]
    # reservation_warning_minutes (15) before the end: an event on each.
    end = from_iso(b["ends_at"])
    rc.d.set_clock(end - 14 * 60)
    rc.billing()
    for i in (one, two):
        ev = rc.c.events(u, i["id"])
        assert any(e["state"] == "reservation_warning" and b["id"] in e["reason"] for e in ev), ev
    # At the end: stopped, saying why, the volume kept.
    rc.d.set_clock(end)
    rc.billing()
    for i in (one, two):
        done = rc.c.wait_state(u, i["id"], "stopped")
        assert b["id"] in done["state_reason"] and "ended" in done["state_reason"], done
        assert rc.c.volume(u, done["volume_id"])["id"] == done["volume_id"]
    err = assert_error(rc.d.post(f"/v1/instances/{one['id']}/start", key=u.key), 409, "invalid_state",
                       "reservation_id")
    assert err["state"] == "ended", err
    assert balance(rc, u) == paid
    rc.verify()


# A silent node stays unreachable (its instances' stops wait on it) for an hour.
cloud_patient = cloud_with(node_lost_after_s="3600")


def test_a_terminate_still_under_way_when_the_window_ends_stays_a_terminate(cloud_patient):
    """The end of a block stops its instances, but one its user terminated
    whose node has not answered yet is left on its way: the end does not
    turn the terminate into a stop."""
    rc = ResvCloud(cloud_patient)
    rc.price("H100-SXM", "2.00")
    f = rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    b = rc.book(u, 8, rc.hour(1), 1)
    rc.d.set_clock(rc.hour(1) + 60)
    inst = rc.launch(u, b["id"], 8)
    rc.c.wait_state(u, inst["id"], "running")
    end = from_iso(b["ends_at"])
    rc.d.set_clock(end - 30)
    f.stop()
    wait(lambda: rc.d.sql("SELECT unreachable_since IS NOT NULL FROM nodes") == [(1,)], what="node unreachable")
    assert rc.c.action(u, inst["id"], "terminate")["state"] == "stopping"
    rc.d.set_clock(end)
    rc.billing()
    assert rc.d.sql("SELECT desired FROM instances") == [("terminated",)]
    rc.c.restart_fleet(f)
    done = rc.c.wait_state(u, inst["id"], "terminated")
    assert done["state_reason"] == "terminate requested by the user", done
    rc.verify()


def test_a_node_lost_mid_window_is_credited_as_a_grant(rc):
    f = rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    node = rc.d.sql("SELECT id FROM nodes")[0][0]
    u = rc.c.user()
    b = rc.book(u, 8, rc.hour(1), 3)
    rc.d.advance_clock(rc.hour(1) - rc.d.now() + 60)
    inst = rc.launch(u, b["id"], 8)
    rc.c.wait_state(u, inst["id"], "running")
    before = balance(rc, u)
    f.stop()
    wait(lambda: rc.d.sql("SELECT health FROM nodes WHERE id = ?", (node,)) == [("offline",)], what="node offline")
    rc.billing()
    rc.billing()  # a second pass in the same hour credits nothing more
    grants = rc.d.sql("SELECT amount, source FROM credit_grants WHERE user_id = ? AND source = 'reservation'", (u.id,))
    assert grants == [(PRICE * 8, "reservation")], grants
    reason = rc.d.sql("SELECT reason FROM ledger_transactions WHERE kind = 'grant' AND user_id = ?"
                      " AND grant_id IN (SELECT id FROM credit_grants WHERE source = 'reservation')", (u.id,))[0][0]
    assert b["id"] in reason and node in reason, reason
    assert balance(rc, u) == before + PRICE * 8
    # The next hour lost is credited too.
    rc.d.advance_clock(3600)
    rc.billing()
    got = rc.d.get(f"/v1/reservations/{b['id']}", key=u.key).json()
    assert micro(got["credited"]) == PRICE * 16, got
    rows = run_gpurentd("report", "reservation-refunds", "--db", rc.d.db_path, "--format", "json")
    assert rows.returncode == 0, rows.stderr
    assert b["id"] in rows.stdout and "sla_credit" in rows.stdout, rows.stdout
    rc.verify()


def test_failed_cards_under_a_block_are_credited_per_hour(rc):
    f = rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    node = rc.d.sql("SELECT id FROM nodes")[0][0]
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(2), 2)
    # Two cards fail before the block starts (the agent reports them so).
    f.stop()
    f.args += ["-o", "inventory_failed_cards=3,5"]
    rc.c.restart_fleet(f)
    wait(lambda: rc.d.sql("SELECT health, (SELECT count(*) FROM node_cards WHERE node_id = n.id AND healthy = 0)"
                          " FROM nodes n") == [("up", 2)], what="two failed cards reported")
    rc.billing()
    assert rc.d.sql("SELECT count(*) FROM credit_grants WHERE source = 'reservation'") == [(0,)]  # not started
    rc.d.set_clock(rc.hour(2) + 30)
    rc.billing()
    rc.d.advance_clock(3600)
    rc.billing()
    rows = rc.d.sql("SELECT amount FROM credit_grants WHERE source = 'reservation' AND user_id = ?", (u.id,))
    assert rows == [(PRICE * 2,), (PRICE * 2,)], rows
    reasons = [x for (x,) in rc.d.sql("SELECT reason FROM ledger_transactions WHERE kind = 'grant' AND user_id = ?"
                                      " AND reason LIKE 'SLA credit%'", (u.id,))]
    assert len(reasons) == 2 and all(r["id"] in x and node in x for x in reasons), reasons
    # The block can still run on the six good cards, not on eight.
    assert_error(rc.d.post("/v1/instances", key=u.key,
                           json={"gpu_type": "H100-SXM", "card_count": 8, "reservation_id": r["id"],
                                 "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"}),
                 409, "insufficient_capacity", "card_count")
    inst = rc.launch(u, r["id"], 6)
    assert sorted(inst["nodes"][0]["cards"]) == [0, 1, 2, 4, 6, 7], inst
    rc.verify()


def test_spare_reserved_capacity_replaces_a_lost_node_without_credit(rc):
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    b_fleet = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 2)
    rc.d.set_clock(rc.hour(1) + 60)
    b_fleet.stop()
    wait(lambda: rc.d.sql("SELECT health FROM nodes WHERE name = 'b-01'") == [("offline",)], what="b-01 offline")
    rc.billing()
    assert rc.d.sql("SELECT count(*) FROM credit_grants WHERE source = 'reservation'") == [(0,)]
    # The block still launches, on the node that is left.
    inst = rc.launch(u, r["id"], 8)
    assert [p["node_name"] for p in inst["nodes"]] == ["a-01"], inst
    assert rc.d.get(f"/v1/reservations/{r['id']}", key=u.key).json()["credited"] == "0.00"
    rc.verify()


# ------------------------------------------------------------ ids and bad input

def test_another_users_reservation_is_404(rc):
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    a, other = rc.c.user(), rc.c.user()
    b = rc.book(a, 4, rc.hour(1), 1)
    assert_error(rc.d.get(f"/v1/reservations/{b['id']}", key=other.key), 404, "not_found")
    assert_error(rc.d.delete(f"/v1/reservations/{b['id']}", key=other.key), 404, "not_found")
    assert_error(rc.d.get("/v1/reservations/rsv_nope", key=a.key), 404, "not_found")
    assert rc.d.get("/v1/reservations", key=other.key).json()["data"] == []
    rc.d.advance_clock(rc.hour(1) - rc.d.now())
    assert_error(rc.d.post("/v1/instances", key=other.key,
                           json={"gpu_type": "H100-SXM", "card_count": 1, "reservation_id": b["id"],
                                 "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"}),
                 400, "invalid_field", "reservation_id")
    assert rc.d.sql("SELECT state FROM reservations") == [("booked",)]
    rc.verify()


def _bad_bodies(rc):
    h = rc.hour(2)
    ok = {"gpu_type": "H100-SXM", "cards": 4, "starts_at": iso(h), "ends_at": iso(h + 3600)}
    return [
        ({**ok, "starts_at": iso(rc.hour(-1))}, 400, "invalid_field", "starts_at"),          # past
        ({**ok, "starts_at": iso(h + 60)}, 400, "invalid_field", "starts_at"),                # unaligned
        ({**ok, "ends_at": iso(h + 3600 + 1)}, 400, "invalid_field", "ends_at"),
        ({**ok, "ends_at": iso(h)}, 400, "invalid_field", "ends_at"),                          # end == start
        ({**ok, "ends_at": iso(h - 3600)}, 400, "invalid_field", "ends_at"),                   # end < start
        ({**ok, "starts_at": iso(rc.hour(1340)), "ends_at": iso(rc.hour(1350))}, 400, "invalid_field", "ends_at"),
        ({**ok, "ends_at": iso(h + 400 * 3600)}, 400, "invalid_field", "ends_at"),             # too long
        ({**ok, "cards": 0}, 400, "invalid_field", "cards"),
        ({**ok, "cards": 12}, 400, "invalid_field", "cards"),
        ({**ok, "cards": -8}, 400, "invalid_field", "cards"),
        ({**ok, "cards": 2 ** 62}, 400, "invalid_field", "cards"),
        ({**ok, "cards": "4"}, 400, "invalid_field", "cards"),                                 # wrong types
        ({**ok, "starts_at": 1800000000}, 400, "invalid_field", "starts_at"),
        ({**ok, "starts_at": "tomorrow"}, 400, "invalid_field", "starts_at"),
        ({**ok, "gpu_type": "B200"}, 400, "invalid_field", "gpu_type"),
        ({**ok, "colour": "red"}, 400, "unknown_field", "colour"),
        ({k: v for k, v in ok.items() if k != "ends_at"}, 400, "missing_field", "ends_at"),
    ]


def test_a_block_past_the_holders_card_quota_in_any_hour_is_not_sold(rc):
    """The card quota is the most cards a user may hold at once, and a
    block's instances hold its cards: a block that, with the user's other
    booked blocks of any type, passes the quota in some hour could never run
    in full, so it is refused (403, nothing charged) rather than sold. A
    cancelled block holds nothing."""
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1")
    rc.c.fleet(1, model="MI450")
    mi = rc.d.sql("SELECT id FROM nodes WHERE gpu_model = 'MI450'")[0][0]
    assert rc.c.admin("PATCH", f"/v1/admin/nodes/{mi}", json={"pool": "reserved"}).status_code == 200
    u = rc.c.user(max_cards=8)
    before = rc.counts()
    err = assert_error(rc.d.post("/v1/reservations", key=u.key,
                                 json={"gpu_type": "H100-SXM", "cards": 16, "starts_at": iso(rc.hour(1)),
                                       "ends_at": iso(rc.hour(3))}), 403, "quota_exceeded", "cards")
    assert (err["limit"], err["in_use"], err["hour"]) == (8, 0, iso(rc.hour(1))), err
    # More than the fleet holds is told so first, whatever the quota.
    assert_error(rc.d.post("/v1/reservations", key=u.key,
                           json={"gpu_type": "H100-SXM", "cards": 24, "starts_at": iso(rc.hour(1)),
                                 "ends_at": iso(rc.hour(3))}), 409, "insufficient_capacity", "cards")
    assert rc.counts() == before
    first = rc.book(u, 6, rc.hour(1), 2)
    rc.book(u, 2, rc.hour(2), 2, gpu="MI450")
    err = assert_error(rc.d.post("/v1/reservations", key=u.key,
                                 json={"gpu_type": "H100-SXM", "cards": 1, "starts_at": iso(rc.hour(1)),
                                       "ends_at": iso(rc.hour(4))}), 403, "quota_exceeded", "cards")
    assert (err["in_use"], err["hour"]) == (8, iso(rc.hour(2))), err
    rc.book(u, 2, rc.hour(1), 1)  # the hour before the MI450 block: 6 + 2
    assert rc.d.delete(f"/v1/reservations/{first['id']}", key=u.key).status_code == 200
    rc.book(u, 6, rc.hour(2), 2)
    rc.verify()


def test_times_with_an_offset_or_a_fraction_book_the_same_utc_hours(rc):
    """starts_at and ends_at are RFC 3339 date-times: a team in Beijing
    books 09:00 to 18:00 its time with +08:00, a zero fraction of a second
    is the same time, and the answer gives the hours in UTC. An offset that
    puts the time off the hour, or a fraction that is not zero, is not a
    whole hour."""
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    day = rc.hour(72) - rc.hour(72) % 86400 + 86400  # a coming midnight UTC
    local = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(day + 9 * 3600))
    b = rc.d.post("/v1/reservations", key=u.key,
                  json={"gpu_type": "H100-SXM", "cards": 8, "starts_at": local + "+08:00",
                        "ends_at": local.replace("T09:", "T18:") + ".000+08:00"})
    assert b.status_code == 201, b.text
    assert (b.json()["starts_at"], b.json()["ends_at"], b.json()["hours"]) == (iso(day + 3600), iso(day + 10 * 3600), 9)
    assert micro(b.json()["amount"]) == PRICE * 8 * 9
    z = iso(day + 20 * 3600)
    ok = rc.d.post("/v1/reservations", key=u.key,
                   json={"gpu_type": "H100-SXM", "cards": 1, "starts_at": z.replace("Z", ".000Z").lower(),
                         "ends_at": iso(day + 21 * 3600).replace("Z", "-00:00")})
    assert ok.status_code == 201, ok.text
    assert ok.json()["starts_at"] == z
    before = rc.counts()
    for start in [z.replace("Z", "+05:30"), z.replace("Z", ".5Z"), z.replace("Z", "+8:00"), z.replace("Z", "+24:00")]:
        assert_error(rc.d.post("/v1/reservations", key=u.key,
                               json={"gpu_type": "H100-SXM", "cards": 1, "starts_at": start,
                                     "ends_at": iso(day + 23 * 3600)}), 400, "invalid_field", "starts_at")
    assert rc.counts() == before
    # Availability takes the same times ('+' sent as %2B, as requests does).
    hours = rc.d.get("/v1/reservations/availability", key=u.key,
                     params={"gpu_type": "H100-SXM", "from": local + "+08:00",
                             "to": local.replace("T09:", "T11:") + "+08:00"})
    assert hours.status_code == 200, hours.text
    assert [(h["starts_at"], h["cards_free"]) for h in hours.json()["hours"]] == \
        [(iso(day + 3600), 0), (iso(day + 7200), 0)], hours.text
    assert_error(rc.d.get("/v1/reservations/availability", key=u.key,
                          params={"gpu_type": "H100-SXM", "from": z.replace("Z", "+05:30"), "to": z}),
                 400, "invalid_query", "from")
    rc.verify()


def test_bad_requests_are_clear_4xx_that_change_nothing(rc):
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    before = rc.counts()
    for body, status, code, field in _bad_bodies(rc):
        assert_error(rc.d.post("/v1/reservations", key=u.key, json=body), status, code, field)
    assert_error(rc.d.post("/v1/reservations", key=u.key, data=b"{\"gpu_type\": ",
                           headers={"Content-Type": "application/json"}), 400, "malformed_json")
    assert_error(rc.d.post("/v1/reservations", key=u.key, json=[1, 2]), 400, "not_an_object")
    big = b"{\"gpu_type\": \"" + b"x" * (2 * 1024 * 1024) + b"\"}"
    assert rc.d.post("/v1/reservations", key=u.key, data=big,
                     headers={"Content-Type": "application/json"}).status_code == 413
    for params, field in [({"gpu_type": "H100-SXM", "from": iso(rc.hour(1)), "to": iso(rc.hour(1))}, "to"),
                          ({"gpu_type": "H100-SXM", "from": iso(rc.hour(1) + 5), "to": iso(rc.hour(2))}, "from"),
                          ({"gpu_type": "H100-SXM", "from": iso(rc.hour(1))}, "to"),
                          ({"gpu_type": "B200", "from": iso(rc.hour(1)), "to": iso(rc.hour(2))}, "gpu_type"),
                          ({"from": iso(rc.hour(1)), "to": iso(rc.hour(2))}, "gpu_type"),
                          ({"gpu_type": "H100-SXM", "from": iso(rc.hour(1)), "to": iso(rc.hour(2)), "x": "1"}, "x")]:
        assert_error(rc.d.get("/v1/reservations/availability", key=u.key, params=params), 400, "invalid_query", field)
    assert rc.counts() == before
    assert_error(rc.d.get("/v1/reservations", key=u.key, params={"limit": "0"}), 400, "invalid_query", "limit")
    # The paths' methods, as the OpenAPI document gives them.
    for path, allow in [("/v1/reservations", "GET, HEAD, POST"), ("/v1/reservations/rsv_x", "GET, HEAD, DELETE")]:
        r = rc.d.request("OPTIONS", path)
        assert r.status_code == 204 and set(r.headers["Allow"].split(", ")) == set(allow.split(", ")), \
            (path, r.status_code, r.headers)
    assert_error(rc.d.request("PUT", "/v1/reservations", key=u.key, json={}), 405, "method_not_allowed")
    assert rc.d.request("HEAD", "/v1/reservations", key=u.key).status_code == 200
    rc.verify()
