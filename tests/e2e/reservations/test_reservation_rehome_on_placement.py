"""test_reservation_rehome_on_placement.py: a block bound to a node that is
lost or set aside moves onto a spare when a placement inside it needs its
cards, in that placement's transaction, not at the next billing pass: a
reserved job whose node is lost restarts on the spare at once (as does one
that exits on a node cordoned meanwhile, or whose card fails), and a stop
and immediate start (or a create) of a reserved instance whose block sits
on a node set aside lands on the spare. It moves as billing's pass would
move it, so nothing is credited for the move, and cards the holder could not
use before it are credited as before. With no spare the outcome is as it
was: the job ends lost, the start or create is refused 409 naming the node,
and the pass credits the block's lost cards. No billing pass runs between
the loss or the stop and the placement, so each case fails if the block
moves only with the pass. `ledger verify` passes after every money step."""
import os
import sys


sys.path.insert(0, os.path.dirname(__file__))

from harness import assert_error  # noqa: E402
from instances_util import cloud, cloud_with, wait  # noqa: E402,F401  (fixture)
from money_util import micro  # noqa: E402
from resv_util import CUDA_IMAGE, ResvCloud, rc  # noqa: E402,F401  (rc is a fixture)

PRICE = 2_000_000  # H100-SXM, micro-yuan per card-hour


def credited(rc, acct, rid):
    return micro(rc.d.get(f"/v1/reservations/{rid}", key=acct.key).json()["credited"])


def reserved_job(rc, acct, rid, cards, **body):
    return rc.c.create(acct, gpu_type="H100-SXM", image=CUDA_IMAGE, card_count=cards, reservation_id=rid,
                       restart_policy="on_failure", **body)


def test_a_reserved_job_whose_node_is_lost_restarts_on_a_spare_with_its_block(rc):
    a = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 3)
    assert rc.bound(r["id"]) == [("a-01", 8)]
    rc.d.set_clock(rc.hour(1) + 60)
    job = reserved_job(rc, u, r["id"], 8)["id"]
    rc.c.wait_state(u, job, "running")
    a.stop()
    # No billing pass: the reconciler's verdict moves the block itself, in
    # the transaction that places the restart.
    wait(lambda: rc.c.get(u, job)["restart_count"] == 1, what="the restart")
    inst = rc.c.get(u, job)
    assert inst["state"] == "pending" and inst["desired_state"] == "running", inst
    assert inst["state_reason"].startswith("restart 1 in 10s (restart_policy on_failure): node a-01 "), inst
    assert rc.bound(r["id"]) == [("b-01", 8)]
    assert rc.c.held_cards(job) == {"b-01": list(range(8))}
    rc.d.advance_clock(10)
    rc.c.wait_state(u, job, "running")
    rc.c.check_running(u, job)
    rc.billing()
    rc.d.advance_clock(3600)
    rc.billing()
    assert rc.reservation_grants() == [] and credited(rc, u, r["id"]) == 0
    assert rc.d.sql("SELECT count(*) FROM running_intervals WHERE instance_id = ?", (job,)) == [(0,)]
    rc.c.check_cards_consistent()
    rc.verify()


def test_a_reserved_job_whose_node_is_lost_with_no_spare_ends_lost_and_is_credited(rc):
    a = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u, v = rc.c.user(), rc.c.user()
    x = rc.book(u, 8, rc.hour(1), 2)
    y = rc.book(v, 6, rc.hour(1), 2)
    assert rc.bound(x["id"]) == [("a-01", 8)] and rc.bound(y["id"]) == [("b-01", 6)]
    rc.d.set_clock(rc.hour(1) + 60)
    job = reserved_job(rc, u, x["id"], 8)["id"]
    rc.c.wait_state(u, job, "running")
    a.stop()
    inst = rc.c.wait_state(u, job, ("lost", "pending"))
    # b-01 has 2 cards spare, not 8: nothing to restart on.
    assert inst["state"] == "lost" and inst["restart_count"] == 0, inst
    assert "no cards to restart it on: the nodes of reservation " + x["id"] in inst["state_reason"], inst
    assert "node a-01 is offline" in inst["state_reason"], inst
    assert rc.bound(x["id"]) == [("a-01", 8)] and rc.c.held_cards(job) == {}
    rc.billing()
    rc.billing()  # the same hour: nothing more
    assert rc.reservation_grants() == [(u.id, PRICE * 8)]
    assert credited(rc, u, x["id"]) == PRICE * 8 and credited(rc, v, y["id"]) == 0
    rc.d.advance_clock(3600)
    rc.billing()
    assert rc.reservation_grants() == [(u.id, PRICE * 8)] * 2 and credited(rc, u, x["id"]) == 2 * PRICE * 8
    rc.verify()


def test_a_reserved_jobs_restart_leaves_a_node_set_aside_with_its_block(rc):
    """A restart is new work: a reserved job that exits on a node cordoned
    meanwhile restarts on the spare, its block moved there in the same
    transaction, as an on-demand job's restart leaves such a node."""
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1", prefix="a-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 2)
    assert rc.bound(r["id"]) == [("a-01", 8)]
    rc.d.set_clock(rc.hour(1) + 60)
    flag = rc.c.tmp / "exit-now"
    job = rc.c.create(u, gpu_type="H100-SXM", image=CUDA_IMAGE, card_count=8, reservation_id=r["id"],
                      restart_policy="on_failure",
                      command=["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; rm -f {flag}; exit 3"])["id"]
    rc.c.wait_state(u, job, "running")
    rc.c.set_node_state("a-01", "cordoned")
    flag.touch()
    wait(lambda: rc.c.get(u, job)["restart_count"] == 1, what="the restart")
    assert rc.c.get(u, job)["state_reason"].startswith(
        "restart 1 in 10s (restart_policy on_failure) on node a-02 cards [0,1,2,3,4,5,6,7], as node a-01 is"
        " cordoned: workload exited with status 3"), rc.c.get(u, job)
    assert rc.bound(r["id"]) == [("a-02", 8)]
    rc.d.advance_clock(10)
    rc.c.wait_state(u, job, "running")
    rc.c.check_running(u, job)
    rc.billing()
    assert rc.reservation_grants() == []
    rc.verify()


# A card fails by restarting its fleet: long enough a node_lost_after_s
# keeps the node unreachable for that moment, not lost.
cloud_patient = cloud_with(node_lost_after_s="3600")


def test_a_reserved_jobs_restart_leaves_a_failed_card_with_its_block(cloud_patient):
    """A card failing under a reserved job of a whole block: the restart
    cannot stay on that node, so it goes to the spare with its block, in
    the transaction that places it, and nothing is credited."""
    rc = ResvCloud(cloud_patient)
    rc.price("H100-SXM", "2.00")
    a = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 2)
    assert rc.bound(r["id"]) == [("a-01", 8)]
    rc.d.set_clock(rc.hour(1) + 60)
    job = reserved_job(rc, u, r["id"], 8, command=["sleep", "600"])["id"]
    rc.c.wait_state(u, job, "running")
    rc.c.fail_cards(a, "3")
    wait(lambda: rc.c.get(u, job)["restart_count"] == 1, what="the restart")
    inst = rc.c.get(u, job)
    assert inst["state_reason"].startswith("restart 1 in 10s (restart_policy on_failure) on node b-01 cards"
                                           " [0,1,2,3,4,5,6,7], as card 3 of node a-01 failed"), inst
    assert rc.bound(r["id"]) == [("b-01", 8)]
    assert rc.c.held_cards(job) == {"b-01": list(range(8))}
    rc.d.advance_clock(10)
    rc.c.wait_state(u, job, "running")
    rc.c.check_running(u, job)
    rc.billing()
    assert rc.reservation_grants() == [] and credited(rc, u, r["id"]) == 0
    rc.c.check_cards_consistent()
    rc.verify()


def test_a_stop_and_immediate_start_moves_the_block_off_a_node_set_aside(rc):
    """A block of 8 whose 4-card instance runs on a node put in maintenance
    stays with it there, credited the 4 cards it cannot use; stopped and at
    once started, the instance takes the block to the spare. Nothing more is
    credited in that hour or after."""
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 3)
    assert rc.bound(r["id"]) == [("a-01", 8)]
    rc.d.set_clock(rc.hour(1) + 60)
    inst = rc.launch(u, r["id"], 4)
    rc.c.wait_state(u, inst["id"], "running")
    rc.c.set_node_state("a-01", "maintenance")
    rc.billing()
    assert rc.bound(r["id"]) == [("a-01", 8)] and rc.reservation_grants() == [(u.id, 4 * PRICE)]
    rc.c.action(u, inst["id"], "stop")
    rc.c.wait_state(u, inst["id"], "stopped")
    started = rc.c.action(u, inst["id"], "start")
    assert [p["node_name"] for p in started["nodes"]] == ["b-01"], started
    assert rc.bound(r["id"]) == [("b-01", 8)]
    rc.c.wait_state(u, inst["id"], "running")
    rc.c.check_running(u, inst["id"])
    rc.billing()
    rc.d.advance_clock(3600)
    rc.billing()
    assert rc.reservation_grants() == [(u.id, 4 * PRICE)] and credited(rc, u, r["id"]) == 4 * PRICE
    rc.c.check_cards_consistent()
    rc.verify()


def test_a_create_in_a_block_on_a_node_set_aside_moves_it_before_any_pass(rc):
    """A block bound to a node cordoned before its window: its first launch
    in the window moves it to the spare, though no pass has run since the
    window began."""
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1", prefix="a-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 2)
    assert rc.bound(r["id"]) == [("a-01", 8)]
    rc.c.set_node_state("a-01", "cordoned")
    rc.d.set_clock(rc.hour(1) + 60)
    inst = rc.launch(u, r["id"], 8)
    assert [p["node_name"] for p in inst["nodes"]] == ["a-02"], inst
    assert rc.bound(r["id"]) == [("a-02", 8)]
    rc.c.wait_state(u, inst["id"], "running")
    rc.billing()
    assert rc.reservation_grants() == []
    rc.verify()


def test_a_start_with_no_spare_is_refused_naming_the_node_and_the_block_is_credited(rc):
    """The only reserved node is drained under a block's instance: stopped,
    it cannot start again anywhere (409 naming the node, nothing changed),
    and the pass credits the block's cards for the hour."""
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 2)
    rc.d.set_clock(rc.hour(1) + 60)
    inst = rc.launch(u, r["id"], 8)
    rc.c.wait_state(u, inst["id"], "running")
    rc.c.set_node_state("a-01", "draining")
    rc.billing()
    assert rc.reservation_grants() == []  # its instance runs on all 8 cards
    rc.c.action(u, inst["id"], "stop")
    rc.c.wait_state(u, inst["id"], "stopped")
    err = assert_error(rc.d.post(f"/v1/instances/{inst['id']}/start", key=u.key), 409, "insufficient_capacity",
                       "card_count")
    assert f"the nodes of reservation {r['id']} have no room for 8 H100-SXM cards now: node a-01 is draining" \
        in err["message"] and "credited" in err["message"], err
    got = rc.c.get(u, inst["id"])
    assert got["state"] == "stopped" and got["desired_state"] == "stopped" and got["nodes"] == [], got
    assert rc.bound(r["id"]) == [("a-01", 8)]
    rc.billing()
    assert rc.reservation_grants() == [(u.id, 8 * PRICE)] and credited(rc, u, r["id"]) == 8 * PRICE
    rc.verify()


def test_hours_no_pass_saw_are_credited_before_a_launch_moves_the_block(rc):
    """The block's node went offline before its window and no pass ran in
    its first two hours (the clock moved on): a launch in the third hour
    moves it to the spare, and the two hours the lost node could not give
    are credited first, from the node it leaves, as the pass would have
    credited them; the hour it moved in is not."""
    a = rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1", prefix="b-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 4)
    assert rc.bound(r["id"]) == [("a-01", 8)]
    a.stop()
    wait(lambda: rc.d.sql("SELECT health FROM nodes WHERE name = 'a-01'") == [("offline",)], what="a-01 offline")
    rc.d.set_clock(rc.hour(3) + 60)
    inst = rc.launch(u, r["id"], 8)
    assert [p["node_name"] for p in inst["nodes"]] == ["b-01"], inst
    assert rc.bound(r["id"]) == [("b-01", 8)]
    hours = rc.d.sql("SELECT hour, cards FROM reservation_credits WHERE reservation_id = ? ORDER BY hour", (r["id"],))
    assert hours == [(rc.hour(-2), 8), (rc.hour(-1), 8)], hours
    rc.billing()
    rc.billing()
    assert rc.reservation_grants() == [(u.id, 8 * PRICE)] * 2 and credited(rc, u, r["id"]) == 2 * 8 * PRICE
    rc.verify()


def test_a_block_whose_instance_holds_cards_on_a_node_set_aside_stays_and_a_second_launch_is_refused(rc):
    """A spare has room, but the block's first instance runs on its node,
    now cordoned: the block stays with it (moved, it would hold the spare's
    cards too while the instance kept the old node's), so a second instance
    in the block cannot be placed; the refusal says why."""
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1", prefix="a-")
    u = rc.c.user()
    r = rc.book(u, 8, rc.hour(1), 2)
    rc.d.set_clock(rc.hour(1) + 60)
    first = rc.launch(u, r["id"], 4)
    rc.c.wait_state(u, first["id"], "running")
    rc.c.set_node_state("a-01", "cordoned")
    err = assert_error(rc.d.post("/v1/instances", key=u.key,
                                 json={"gpu_type": "H100-SXM", "card_count": 4, "reservation_id": r["id"],
                                       "image": CUDA_IMAGE}), 409, "insufficient_capacity", "card_count")
    assert "node a-01 is cordoned, and the block stays with its instances, which hold cards there" \
        in err["message"], err
    assert rc.bound(r["id"]) == [("a-01", 8)]
    assert rc.c.get(u, first["id"])["state"] == "running"
    rc.verify()
