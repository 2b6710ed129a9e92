"""test_reservation_nodes.py: blocks bound to nodes (migration 0028). A block
of up to 8 cards holds cards of one reserved node for its whole window, a
larger one whole nodes of one fabric: the 6/6/4 case (the 4 is refused at
booking while the hour is fragmented, and books once a node has room; every
block's instance then lands on its own node), availability's largest block,
re-homing onto a spare when a bound node is lost (no credit; for a
multi-node block what a spare takes), the credit
when no spare has room, a pool change that re-homes or is refused, and
blocks booked before 0028 bound by the pass. A block is never re-homed
from under its instances: on a node set aside it stays while they run
there (credited the cards they leave unused) and moves once they stop; on
a node refused for its hardware it waits, neither moved nor credited,
until they are lost, then moves to the spare.
`ledger verify` passes after every money step."""
import os
import sqlite3
import sys


sys.path.insert(0, os.path.dirname(__file__))

from harness import assert_error  # noqa: E402
from instances_util import cloud, cloud_with, wait  # noqa: E402,F401  (fixture)
from money_util import iso, micro  # noqa: E402
from resv_util import ResvCloud, rc  # noqa: E402,F401  (rc is a fixture)

PRICE = 2_000_000  # H100-SXM, micro-yuan per card-hour


def availability(rc, acct, start, hours):
    r = rc.d.get("/v1/reservations/availability", key=acct.key,
                 params={"gpu_type": "H100-SXM", "from": iso(start), "to": iso(start + hours * 3600)})
    assert r.status_code == 200, r.text
    return r.json()["hours"]


def test_six_six_four_each_block_on_its_own_node(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1", prefix="a-")
    u = rc.c.user(max_cards=64)
    start = rc.hour(2)
    x = rc.book(u, 6, start, 2)
    y = rc.book(u, 6, start, 2)
    assert rc.bound(x["id"]) == [("a-01", 6)] and rc.bound(y["id"]) == [("a-02", 6)]
    # 4 more fit the totals (2 + 2 free) but no single node: refused at
    # booking, nothing paid, and availability says why.
    before = rc.counts()
    err = assert_error(rc.d.post("/v1/reservations", key=u.key,
                                 json={"gpu_type": "H100-SXM", "cards": 4, "starts_at": iso(start),
                                       "ends_at": iso(start + 7200)}), 409, "insufficient_capacity", "cards")
    assert err["single_node"] is True and "no single" in err["message"], err
    assert rc.counts() == before
    hours = availability(rc, u, start, 2)
    assert [(h["cards_free"], h["largest_block"]) for h in hours] == [(4, 2), (4, 2)], hours
    # A third node gives the 4 a node of its own.
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="c-")
    wait(lambda: availability(rc, u, start, 1)[0]["largest_block"] == 8, what="c-01 reservable")
    z = rc.book(u, 4, start, 2)
    assert rc.bound(z["id"]) == [("c-01", 4)]
    rc.verify()
    # In the window the 4-card block launches first; best fit over the pool
    # would have put it on a-01 (8 free, first by name), the node x holds.
    rc.d.set_clock(start + 60)
    zi = rc.launch(u, z["id"], 4)
    xi = rc.launch(u, x["id"], 6)
    yi = rc.launch(u, y["id"], 6)
    for inst, node in ((zi, "c-01"), (xi, "a-01"), (yi, "a-02")):
        assert [p["node_name"] for p in inst["nodes"]] == [node], inst
    for inst in (zi, xi, yi):
        rc.c.wait_state(u, inst["id"], "running")
    # No block takes more than its cards on its node.
    assert_error(rc.d.post("/v1/instances", key=u.key,
                           json={"gpu_type": "H100-SXM", "card_count": 1, "reservation_id": z["id"],
                                 "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"}),
                 409, "insufficient_capacity", "card_count")
    assert rc.d.sql("SELECT n.name, count(*) FROM node_cards c JOIN nodes n ON n.id = c.node_id"
                    " WHERE c.instance_id IS NOT NULL GROUP BY n.name ORDER BY n.name") == [
        ("a-01", 6), ("a-02", 6), ("c-01", 4)]
    rc.verify()


def test_a_block_no_single_node_holds_is_refused_though_the_total_fits(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    start = rc.hour(3)
    rc.book(u, 5, start, 1)
    rc.book(u, 5, start, 1)
    before = rc.counts()
    for cards in (6, 4):
        err = assert_error(rc.d.post("/v1/reservations", key=u.key,
                                     json={"gpu_type": "H100-SXM", "cards": cards, "starts_at": iso(start),
                                           "ends_at": iso(start + 3600)}), 409, "insufficient_capacity", "cards")
        assert "no single H100-SXM node" in err["message"], err
    assert rc.counts() == before
    b = rc.book(u, 3, start, 1)
    assert rc.bound(b["id"])[0][1] == 3
    rc.verify()


def test_a_lost_node_rehomes_its_block_onto_a_spare_without_credit(rc):
    a = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 3)
    assert rc.bound(r["id"]) == [("a-01", 8)]
    rc.d.set_clock(rc.hour(1) + 60)
    a.stop()
    wait(lambda: rc.d.sql("SELECT health FROM nodes WHERE name = 'a-01'") == [("offline",)], what="a-01 offline")
    rc.billing()
    assert rc.bound(r["id"]) == [("b-01", 8)]
    assert rc.d.sql("SELECT count(*) FROM credit_grants WHERE source = 'reservation'") == [(0,)]
    inst = rc.launch(u, r["id"], 8)
    assert [p["node_name"] for p in inst["nodes"]] == ["b-01"], inst
    rc.c.wait_state(u, inst["id"], "running")
    rc.d.advance_clock(3600)
    rc.billing()
    assert rc.d.get(f"/v1/reservations/{r['id']}", key=u.key).json()["credited"] == "0.00"
    rc.verify()


def test_a_lost_node_without_a_spare_is_credited(rc):
    a = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u, v = rc.c.user(), rc.c.user()
    x = rc.book(u, 8, rc.hour(1), 2)
    y = rc.book(v, 6, rc.hour(1), 2)
    assert rc.bound(x["id"]) == [("a-01", 8)] and rc.bound(y["id"]) == [("b-01", 6)]
    rc.d.set_clock(rc.hour(1) + 60)
    a.stop()
    wait(lambda: rc.d.sql("SELECT health FROM nodes WHERE name = 'a-01'") == [("offline",)], what="a-01 offline")
    rc.billing()
    rc.billing()  # the same hour: nothing more
    # b-01 has 2 cards spare, not 8: x stays on a-01 and is credited.
    assert rc.bound(x["id"]) == [("a-01", 8)]
    assert rc.d.sql("SELECT user_id, amount FROM credit_grants WHERE source = 'reservation'") == [(u.id, PRICE * 8)]
    assert micro(rc.d.get(f"/v1/reservations/{x['id']}", key=u.key).json()["credited"]) == PRICE * 8
    assert rc.d.get(f"/v1/reservations/{y['id']}", key=v.key).json()["credited"] == "0.00"
    rc.verify()


def test_hours_no_pass_saw_are_credited_when_the_node_was_offline(rc):
    """A pass credits the hour it runs in; hours in which none ran (the
    daemon down, its clock moved on) are credited by the next one, for the
    nodes offline since before them: here a block's node went offline before
    it began and the first pass after it comes a second after its end. Its
    three hours are credited, once, however many passes follow."""
    a = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    u = rc.c.user()
    x = rc.book(u, 8, rc.hour(1), 3)
    a.stop()
    wait(lambda: rc.d.sql("SELECT health FROM nodes WHERE name = 'a-01'") == [("offline",)], what="a-01 offline")
    rc.d.set_clock(rc.hour(4) + 1)
    rc.billing()
    rc.billing()
    got = rc.d.get(f"/v1/reservations/{x['id']}", key=u.key).json()
    assert micro(got["credited"]) == PRICE * 8 * 3, got
    hours = rc.d.sql("SELECT hour, cards FROM reservation_credits WHERE reservation_id = ? ORDER BY hour", (x["id"],))
    assert hours == [(x_hour, 8) for x_hour in range(rc.hour(-3), rc.hour(0), 3600)], hours
    rc.verify()


def test_hours_no_pass_saw_are_credited_for_cards_that_failed_before_them(rc):
    """The same for a node that answers with failed cards: each card is
    credited from the hour it was first reported failed (node_cards.failed_at),
    beyond the node's spare cards. Node a holds a block of 8 (two cards fail),
    node b a block of 6 (one fails, and b has two spare): only a's block lost
    cards, two in each of its three hours."""
    fa = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    fb = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u, v = rc.c.user(), rc.c.user()
    x = rc.book(u, 8, rc.hour(1), 3)
    y = rc.book(v, 6, rc.hour(1), 3)
    assert rc.bound(x["id"]) == [("a-01", 8)] and rc.bound(y["id"]) == [("b-01", 6)]
    for f, failed in ((fa, "2,5"), (fb, "1")):
        f.stop()
        f.args += ["-o", f"inventory_failed_cards={failed}"]
        rc.c.restart_fleet(f)
    wait(lambda: rc.d.sql("SELECT n.name, count(*) FROM node_cards c JOIN nodes n ON n.id = c.node_id"
                          " WHERE c.healthy = 0 AND c.failed_at IS NOT NULL GROUP BY n.name ORDER BY n.name")
         == [("a-01", 2), ("b-01", 1)], what="three failed cards reported, with when")
    rc.d.set_clock(rc.hour(4) + 1)  # no pass ran in the blocks' three hours
    rc.billing()
    rc.billing()
    hours = rc.d.sql("SELECT hour, cards FROM reservation_credits WHERE reservation_id = ? ORDER BY hour", (x["id"],))
    assert hours == [(h, 2) for h in range(rc.hour(-3), rc.hour(0), 3600)], hours
    assert micro(rc.d.get(f"/v1/reservations/{x['id']}", key=u.key).json()["credited"]) == PRICE * 2 * 3
    assert rc.d.get(f"/v1/reservations/{y['id']}", key=v.key).json()["credited"] == "0.00"
    rc.verify()


def test_a_pool_change_rehomes_bound_blocks_or_is_refused(rc):
    rc.c.fleet(2, model="MI450")
    ids = [i for (i,) in rc.d.sql("SELECT id FROM nodes ORDER BY name")]
    for i in ids:
        assert rc.c.admin("PATCH", f"/v1/admin/nodes/{i}", json={"pool": "reserved"}).status_code == 200
    u = rc.c.user()
    start = rc.hour(4)
    b = rc.book(u, 4, start, 2, gpu="MI450")
    assert [n for (n,) in rc.d.sql("SELECT node_id FROM reservation_nodes WHERE reservation_id = ?", (b["id"],))] \
        == [ids[0]]
    # The first node leaves: the block moves to the second, which has room.
    r = rc.c.admin("PATCH", f"/v1/admin/nodes/{ids[0]}", json={"pool": "on_demand"})
    assert r.status_code == 200, r.text
    assert [n for (n,) in rc.d.sql("SELECT node_id FROM reservation_nodes WHERE reservation_id = ?", (b["id"],))] \
        == [ids[1]]
    # The second cannot leave: no reserved node is left to take the block.
    for r in (rc.c.admin("PATCH", f"/v1/admin/nodes/{ids[1]}", json={"pool": "on_demand"}),
              rc.c.admin("DELETE", f"/v1/admin/nodes/{ids[1]}")):
        err = assert_error(r, 409, "conflict")
        assert err["hour"] == iso(start), err
    assert rc.d.sql("SELECT pool FROM nodes WHERE id = ?", (ids[1],)) == [("reserved",)]
    rc.verify()


def test_a_node_taken_out_of_service_moves_its_block_to_a_spare_without_credit(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1", prefix="a-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 2)
    assert rc.bound(r["id"]) == [("a-01", 8)]
    node = rc.d.sql("SELECT id FROM nodes WHERE name = 'a-01'")[0][0]
    s = rc.c.admin("POST", f"/v1/admin/nodes/{node}/state", json={"state": "maintenance", "reason": "firmware"})
    assert s.status_code == 200, s.text
    rc.d.set_clock(rc.hour(1) + 60)
    rc.billing()
    assert rc.bound(r["id"]) == [("a-02", 8)]
    inst = rc.launch(u, r["id"], 8)
    assert [p["node_name"] for p in inst["nodes"]] == ["a-02"], inst
    assert rc.d.sql("SELECT count(*) FROM credit_grants WHERE source = 'reservation'") == [(0,)]
    rc.verify()


def test_blocks_booked_before_binding_are_bound_by_the_pass(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    small = rc.book(u, 6, rc.hour(2), 2)
    big = rc.book(u, 16, rc.hour(5), 1)
    # As a database migrated from 0024 has them: booked, bound nowhere.
    con = sqlite3.connect(rc.d.db_path, timeout=10)
    with con:
        con.execute("DELETE FROM reservation_nodes")
    con.close()
    assert rc.d.sql("SELECT count(*) FROM reservation_nodes") == [(0,)]
    rc.billing()
    assert [c for (_, c) in rc.bound(small["id"])] == [6]
    assert [c for (_, c) in rc.bound(big["id"])] == [8, 8]
    rc.d.set_clock(rc.hour(2) + 60)
    inst = rc.launch(u, small["id"], 6)
    assert [p["node_name"] for p in inst["nodes"]] == [rc.bound(small["id"])[0][0]], inst
    rc.verify()


def test_a_multi_node_block_rehomes_what_a_spare_takes_and_is_credited_the_rest(rc):
    a = rc.c.fleet(2, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u = rc.c.user()
    r = rc.book(u, 16, rc.hour(1), 2)
    assert rc.bound(r["id"]) == [("a-01", 8), ("a-02", 8)]
    rc.d.set_clock(rc.hour(1) + 60)
    a.stop()
    wait(lambda: rc.d.sql("SELECT count(*) FROM nodes WHERE name LIKE 'a-%' AND health = 'offline'") == [(2,)],
         what="a-01 and a-02 offline")
    rc.billing()
    rc.billing()
    # One whole spare node of ib-1: one of the two moves there, the other's
    # 8 cards are credited for the hour.
    got = rc.bound(r["id"])
    assert ("b-01", 8) in got and len(got) == 2, got
    assert rc.d.sql("SELECT amount FROM credit_grants WHERE source = 'reservation' AND user_id = ?",
                    (u.id,)) == [(PRICE * 8,)]
    rc.verify()


def test_a_node_out_of_service_without_a_spare_credits_the_cards_its_blocks_cannot_use(rc):
    """Nothing new is placed on a node an admin took out of service, so a
    block bound to it that no spare can take cannot launch there: the cards
    its instances do not already run on are credited each hour, as for
    failed hardware. A block whose instance keeps running there loses
    nothing."""
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    idle, busy = rc.c.user(), rc.c.user()
    x = rc.book(idle, 4, rc.hour(1), 2)
    y = rc.book(busy, 4, rc.hour(1), 2)
    assert rc.bound(x["id"]) == [("a-01", 4)] and rc.bound(y["id"]) == [("a-01", 4)]
    rc.d.set_clock(rc.hour(1) + 60)
    inst = rc.launch(busy, y["id"], 4)
    rc.c.wait_state(busy, inst["id"], "running")
    node = rc.d.sql("SELECT id FROM nodes WHERE name = 'a-01'")[0][0]
    s = rc.c.admin("POST", f"/v1/admin/nodes/{node}/state", json={"state": "maintenance", "reason": "firmware"})
    assert s.status_code == 200, s.text
    rc.billing()
    err = assert_error(rc.d.post("/v1/instances", key=idle.key,
                                 json={"gpu_type": "H100-SXM", "card_count": 4, "reservation_id": x["id"],
                                       "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"}),
                       409, "insufficient_capacity", "card_count")
    assert "credited" in err["message"], err
    rc.d.advance_clock(3600)
    rc.billing()
    rc.billing()  # the same hour: nothing more
    got = rc.d.get(f"/v1/reservations/{x['id']}", key=idle.key).json()
    assert micro(got["credited"]) == 2 * 4 * PRICE, got
    assert rc.d.sql("SELECT user_id, amount FROM credit_grants WHERE source = 'reservation' ORDER BY created_at") \
        == [(idle.id, 4 * PRICE), (idle.id, 4 * PRICE)]
    assert rc.d.get(f"/v1/reservations/{y['id']}", key=busy.key).json()["credited"] == "0.00"
    assert rc.c.get(busy, inst["id"])["state"] == "running"
    rc.verify()


def test_availability_shows_no_more_than_booking_sells_while_a_bound_node_is_lost(rc):
    """A block bound to a node lost before its window still needs a spare
    when it starts, so booking counts it against the healthy pool: the
    lost node's block holds the only live node's cards in its hours.
    Availability says the same, never cards that booking then refuses."""
    a = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u, v = rc.c.user(), rc.c.user()
    x = rc.book(u, 8, rc.hour(2), 2)
    assert rc.bound(x["id"]) == [("a-01", 8)]
    a.stop()
    wait(lambda: rc.d.sql("SELECT health FROM nodes WHERE name = 'a-01'") == [("offline",)], what="a-01 offline")
    shown = availability(rc, v, rc.hour(1), 4)
    assert [(h["cards_free"], h["largest_block"]) for h in shown] == [(8, 8), (0, 0), (0, 0), (8, 8)], shown
    err = assert_error(rc.d.post("/v1/reservations", key=v.key,
                                 json={"gpu_type": "H100-SXM", "cards": 1, "starts_at": iso(rc.hour(2)),
                                       "ends_at": iso(rc.hour(3))}), 409, "insufficient_capacity", "cards")
    assert err["cards_free"] == shown[1]["cards_free"], err
    y = rc.book(v, 8, rc.hour(4), 1)
    assert rc.bound(y["id"]) == [("b-01", 8)]
    rc.verify()


def test_availability_shows_nothing_free_in_hours_booking_does_not_sell(rc):
    """An hour already begun and an hour ending past the booking horizon
    are not for sale, so availability shows nothing free in them, as
    booking refuses them."""
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    u = rc.c.user()
    rc.d.advance_clock(60)
    shown = availability(rc, u, rc.hour(-1), 3)
    assert [(h["cards_free"], h["largest_block"]) for h in shown] == [(0, 0), (0, 0), (8, 8)], shown
    assert_error(rc.d.post("/v1/reservations", key=u.key,
                           json={"gpu_type": "H100-SXM", "cards": 1, "starts_at": iso(rc.hour(0)),
                                 "ends_at": iso(rc.hour(1))}), 400, "invalid_field", "starts_at")
    horizon = 1344  # reservation_horizon_hours, its default
    last = availability(rc, u, rc.hour(horizon - 1), 2)
    assert [h["cards_free"] for h in last] == [8, 0], last
    assert_error(rc.d.post("/v1/reservations", key=u.key,
                           json={"gpu_type": "H100-SXM", "cards": 1, "starts_at": iso(rc.hour(horizon)),
                                 "ends_at": iso(rc.hour(horizon + 1))}), 400, "invalid_field", "ends_at")
    rc.book(u, 8, rc.hour(horizon - 1), 1)
    rc.verify()


def on_nodes(rc, acct, inst_id):
    return [p["node_name"] for p in rc.c.get(acct, inst_id)["nodes"]]


def test_a_block_stays_with_its_instance_on_a_node_set_aside_and_moves_once_it_stops(rc):
    """A node an admin drains keeps running what runs there, so a block
    whose instance runs on it stays bound to it: moved, it would hold a
    spare's cards as well while the instance kept the old node's outside
    any block. The idle block beside it moves to the spare. Once the
    instance stops the block moves too, and the instance starts again on
    the spare. Nothing is credited: neither holder lacked a card."""
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    busy, idle = rc.c.user(), rc.c.user()
    y = rc.book(busy, 4, rc.hour(1), 3)
    x = rc.book(idle, 4, rc.hour(1), 3)
    assert rc.bound(y["id"]) == [("a-01", 4)] and rc.bound(x["id"]) == [("a-01", 4)]
    rc.d.set_clock(rc.hour(1) + 60)
    inst = rc.launch(busy, y["id"], 4)
    rc.c.wait_state(busy, inst["id"], "running")
    s = rc.c.admin("POST", f"/v1/admin/nodes/{rc.node_id('a-01')}/state", json={"state": "draining"})
    assert s.status_code == 200, s.text
    for _ in range(2):
        rc.billing()
        assert rc.bound(x["id"]) == [("b-01", 4)]
        assert rc.bound(y["id"]) == [("a-01", 4)]
        assert rc.c.get(busy, inst["id"])["state"] == "running" and on_nodes(rc, busy, inst["id"]) == ["a-01"]
        rc.d.advance_clock(3600)
    rc.c.action(busy, inst["id"], "stop")
    rc.c.wait_state(busy, inst["id"], "stopped")
    rc.billing()
    assert rc.bound(y["id"]) == [("b-01", 4)]
    rc.c.action(busy, inst["id"], "start")
    rc.c.wait_state(busy, inst["id"], "running")
    assert on_nodes(rc, busy, inst["id"]) == ["b-01"]
    assert rc.reservation_grants() == []
    rc.verify()


def test_a_block_its_instance_half_uses_on_a_node_set_aside_is_credited_the_other_half(rc):
    """Nothing new is placed on a node in maintenance, so a block of 8 whose
    4-card instance runs there, and which cannot move while it does, cannot
    use its other 4 cards: they are credited each hour, though a spare
    node is free (the block is not moved from under its instance). Once
    the instance stops, the block moves to the spare and nothing more is
    credited."""
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 3)
    assert rc.bound(r["id"]) == [("a-01", 8)]
    rc.d.set_clock(rc.hour(1) + 60)
    inst = rc.launch(u, r["id"], 4)
    rc.c.wait_state(u, inst["id"], "running")
    s = rc.c.admin("POST", f"/v1/admin/nodes/{rc.node_id('a-01')}/state",
                   json={"state": "maintenance", "reason": "firmware"})
    assert s.status_code == 200, s.text
    rc.billing()
    rc.billing()  # the same hour: nothing more
    assert rc.bound(r["id"]) == [("a-01", 8)]
    assert on_nodes(rc, u, inst["id"]) == ["a-01"]
    assert rc.reservation_grants() == [(u.id, 4 * PRICE)]
    rc.d.advance_clock(3600)
    rc.billing()
    assert rc.reservation_grants() == [(u.id, 4 * PRICE)] * 2
    rc.c.action(u, inst["id"], "stop")
    rc.c.wait_state(u, inst["id"], "stopped")
    rc.billing()
    assert rc.bound(r["id"]) == [("b-01", 8)]
    rc.d.advance_clock(3600)
    rc.billing()
    got = rc.d.get(f"/v1/reservations/{r['id']}", key=u.key).json()
    assert micro(got["credited"]) == 2 * 4 * PRICE, got
    rc.verify()


# A node that stops giving its cards keeps its instances for ten minutes.
cloud_patient = cloud_with(node_lost_after_s="600")


def test_a_block_stays_with_its_instance_on_a_node_that_gives_nothing_until_the_instance_is_lost(cloud_patient):
    """A node that comes back reporting 4 cards where 8 were registered is
    refused and gives its blocks nothing, but its instances keep their
    cards for node_lost_after_s (their workloads may still run). The block
    of such an instance is neither moved nor credited meanwhile, though a
    spare has room: it would hold the spare's cards as well while the
    instance kept the old node's, and could launch there too. Once the
    instance is lost, the next pass moves the block to the spare, without
    credit, and the instance starts again there."""
    rc = ResvCloud(cloud_patient)
    rc.price("H100-SXM", "2.00")
    fa = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u = rc.c.user()
    r = rc.book(u, 4, rc.hour(1), 2)
    assert rc.bound(r["id"]) == [("a-01", 4)]
    rc.d.set_clock(rc.hour(1) + 60)
    inst = rc.launch(u, r["id"], 4)
    rc.c.wait_state(u, inst["id"], "running")
    port = fa.base_url.rsplit(":", 1)[1]  # the node is registered at it
    fa.stop()
    fa.args[fa.args.index("--cards") + 1] = "4"
    fa.args += ["--listen", f"127.0.0.1:{port}"]
    fa.start(expect_ready=False)
    wait(lambda: rc.d.sql("SELECT health FROM nodes WHERE name = 'a-01'") == [("rejected",)], what="a-01 refused")
    rc.c.wait_state(u, inst["id"], "unreachable")
    rc.billing()
    rc.billing()
    assert rc.bound(r["id"]) == [("a-01", 4)]
    assert {n: len(c) for n, c in rc.c.held_cards(inst["id"]).items()} == {"a-01": 4}
    assert rc.reservation_grants() == []
    # Past node_lost_after_s from its last accepted report: lost, its cards let go.
    rc.d.advance_clock(601)
    rc.c.wait_state(u, inst["id"], "lost")
    rc.billing()
    assert rc.bound(r["id"]) == [("b-01", 4)]
    rc.c.action(u, inst["id"], "start")
    rc.c.wait_state(u, inst["id"], "running")
    assert on_nodes(rc, u, inst["id"]) == ["b-01"]
    assert rc.reservation_grants() == []
    rc.verify()
