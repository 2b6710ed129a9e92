"""test_instances_restart_cards.py: a job restarted by its restart policy
never goes back on a card that failed. A restart is new work: it stays on its
cards while they can take new work, and otherwise is placed again, on its own
node first when that still has room, else anywhere (a gang as a whole); with
no room anywhere it ends failed, unbilled since its run ended, as a start
would be refused now. The card may fail before the restart is decided (its
agent restarted reporting the card failed, the job's process gone with it)
or during the restart's backoff, when the workloads are about to be put
again. A node set aside by its admin is left by a restart when another node
has room, and kept otherwise.

A sim fleet reports failed cards from inventory_failed_cards, so a card
fails by restarting the fleet with it; node_lost_after_s is long, so that
the restart makes its node unreachable for a moment, not lost."""
import pytest

from instances_util import cloud_with, wait  # noqa: F401  (fixtures)
from money_util import PRICE, accrue, charged_usage, ledger_verify

cloud_patient = cloud_with(node_lost_after_s="3600")

IMAGE = "example/train:1"


def _verify(cloud):
    rc, out = ledger_verify(cloud.d.db_path)
    assert rc == 0 and out.strip().splitlines()[-1] == "ledger OK", f"ledger verify failed ({rc}):\n{out}"


def _intervals(cloud, iid):
    return cloud.d.sql("SELECT started_at, ended_at FROM running_intervals WHERE instance_id = ? ORDER BY id", (iid,))


def _billed_exactly(cloud, u, iid, cards):
    """The user paid for the instance's running intervals and nothing else."""
    now = cloud.d.now()
    due = sum(accrue(PRICE["MI450"], cards, (e if e is not None else now) - b) for b, e in _intervals(cloud, iid))
    assert charged_usage(cloud, u) == due, (_intervals(cloud, iid), due)


def _restarts(cloud, u, iid):
    return [e["reason"] for e in cloud.events(u, iid) if e["reason"].startswith("restart ")]


def test_a_card_failing_under_a_job_moves_its_restart_to_healthy_cards_of_its_node(cloud_patient):
    cloud = cloud_patient
    a = cloud.fleet(1, prefix="a-")
    cloud.add_image(IMAGE)
    u = cloud.user()
    job = cloud.create(u, card_count=2, image=IMAGE, restart_policy="on_failure",
                       command=["sh", "-c", "echo epoch; sleep 600"])["id"]
    cloud.wait_state(u, job, "running")
    assert cloud.held_cards(job) == {"a-01": [0, 1]}
    # Card 1 fails. The agent restarted to report it has lost the job's
    # process, which it reports exited with an unknown status: a failure,
    # which the policy restarts, only not on card 1.
    cloud.fail_cards(a, "1")
    wait(lambda: cloud.get(u, job)["restart_count"] == 1, what="the restart")
    inst = cloud.get(u, job)
    assert inst["state"] == "pending" and inst["desired_state"] == "running", inst
    assert inst["state_reason"].startswith("restart 1 in 10s (restart_policy on_failure) on node a-01 cards [0,2],"
                                           " as card 1 of node a-01 failed: "), inst
    assert cloud.held_cards(job) == {"a-01": [0, 2]}, "the restart keeps to its node, off the failed card"
    t_back = cloud.d.advance_clock(10)
    cloud.wait_state(u, job, "running")
    cloud.check_running(u, job)
    assert cloud.held_cards(job) == {"a-01": [0, 2]}
    [(b0, e0), (b1, e1)] = _intervals(cloud, job)
    assert e0 is not None and e0 < t_back and b1 >= t_back and e1 is None, "billed while it waited"
    cloud.d.advance_clock(120)
    _billed_exactly(cloud, u, job, 2)
    cloud.check_cards_consistent()
    _verify(cloud)


def test_a_restart_with_no_healthy_cards_left_ends_the_job_failed(cloud_patient):
    cloud = cloud_patient
    a = cloud.fleet(1, prefix="a-")
    cloud.fleet(1, prefix="b-")
    cloud.add_image(IMAGE)
    u, other = cloud.user(), cloud.user()
    job = cloud.create(u, card_count=8, image=IMAGE, restart_policy="always", command=["sleep", "600"])["id"]
    cloud.wait_state(u, job, "running")
    hog = cloud.create(other, card_count=8)["id"]
    cloud.wait_state(other, hog, "running")
    assert cloud.held_cards(job) == {"a-01": list(range(8))} and cloud.held_cards(hog) == {"b-01": list(range(8))}
    cloud.fail_cards(a, "3")
    inst = cloud.wait_state(u, job, ("failed", "pending", "succeeded"))
    assert inst["state"] == "failed" and inst["desired_state"] == "stopped", inst
    assert inst["state_reason"].startswith("no cards to restart on (restart_policy always): card 3 of node a-01"
                                           " failed, and 8 MI450 cards requested but only 7 are free now"), inst
    assert inst["restart_count"] == 0 and inst["exit_code"] is None and inst["nodes"] == [], inst
    assert not _restarts(cloud, u, job), "a restart counted that was never made"
    assert cloud.held_cards(job) == {}
    [(b0, e0)] = _intervals(cloud, job)
    assert e0 is not None, "still billed"
    wait(lambda: cloud.workloads("a-01") == [], what="the job's workload to be deleted")
    # Settled: nothing tries it again, and its owner starts it once there
    # is room, on healthy cards.
    cloud.d.advance_clock(600)
    assert cloud.get(u, job)["state"] == "failed"
    r = cloud.d.post(f"/v1/instances/{job}/start", key=u.key)
    assert r.status_code == 409 and r.json()["error"]["code"] == "insufficient_capacity", r.text
    cloud.action(other, hog, "stop")
    cloud.wait_state(other, hog, "stopped")
    cloud.action(u, job, "start")
    cloud.wait_state(u, job, "running")
    assert cloud.held_cards(job) == {"b-01": list(range(8))}
    cloud.check_running(u, job)
    _billed_exactly(cloud, u, job, 8)
    cloud.check_cards_consistent()
    _verify(cloud)


def test_a_gang_whose_card_failed_restarts_as_a_whole_on_healthy_nodes(cloud_patient):
    cloud = cloud_patient
    a = cloud.fleet(1, prefix="a-")
    cloud.fleet(2, prefix="b-")
    cloud.add_image(IMAGE)
    u = cloud.user()
    job = cloud.create(u, card_count=16, image=IMAGE, restart_policy="on_failure", command=["sleep", "600"])["id"]
    inst = cloud.wait_state(u, job, "running")
    on = [p["node_name"] for p in inst["nodes"]]
    assert on == ["a-01", "b-01"], inst["nodes"]
    cloud.fail_cards(a, "5")
    wait(lambda: cloud.get(u, job)["restart_count"] == 1, what="the restart")
    inst = cloud.get(u, job)
    assert inst["state_reason"].startswith("restart 1 in 10s (restart_policy on_failure) on nodes b-01, b-02,"
                                           " as card 5 of node a-01 failed: "), inst
    assert cloud.held_cards(job) == {"b-01": list(range(8)), "b-02": list(range(8))}
    cloud.d.advance_clock(10)
    cloud.wait_state(u, job, "running")
    cloud.check_running(u, job)
    wait(lambda: cloud.workloads("a-01") == [], what="the old rank on a-01 to be deleted")
    _billed_exactly(cloud, u, job, 16)
    cloud.check_cards_consistent()
    _verify(cloud)


@pytest.mark.parametrize("cards", [2, 8])
def test_a_card_failing_during_the_restart_backoff_is_left_when_the_job_is_put_again(cloud_patient, cards):
    """The job exits and waits out its backoff on its cards; one of them
    fails meanwhile. When the backoff ends nothing is put on it: the job is
    placed again on its node's healthy cards, or, with too few of them and
    no other node, ends failed."""
    cloud = cloud_patient
    a = cloud.fleet(1, prefix="a-")
    cloud.add_image(IMAGE)
    u = cloud.user()
    flag = cloud.tmp / "keep-running"
    job = cloud.create(u, card_count=cards, image=IMAGE, restart_policy="on_failure",
                       command=["sh", "-c", f"test -e {flag} && exec sleep 600; exit 3"])["id"]
    wait(lambda: cloud.get(u, job)["restart_count"] == 1, what="the first run's exit and restart")
    first = cloud.get(u, job)
    assert first["state"] == "pending" and first["exit_code"] == 3, first
    assert "(restart_policy on_failure): " in first["state_reason"], first
    assert cloud.held_cards(job) == {"a-01": list(range(cards))}
    wait(lambda: cloud.workloads("a-01") == [], what="the exited workload to be deleted")
    cloud.fail_cards(a, "1")
    assert cloud.held_cards(job) == {"a-01": list(range(cards))}, "moved before its backoff ended"
    flag.touch()
    cloud.d.advance_clock(10)
    inst = cloud.wait_state(u, job, ("running", "failed"))
    events = [e["reason"] for e in cloud.events(u, job)]
    if cards == 2:
        assert inst["state"] == "running", inst
        assert cloud.held_cards(job) == {"a-01": [0, 2]}
        assert "card 1 of node a-01 failed before its workloads were put: placed again on node a-01 cards [0,2]" \
            in events, events
        cloud.check_running(u, job)
        cloud.d.advance_clock(60)
    else:
        assert inst["state"] == "failed" and inst["desired_state"] == "stopped", inst
        assert inst["state_reason"].startswith("no cards to run on: card 1 of node a-01 failed before its workloads"
                                               " were put, and 8 MI450 cards requested but only 7 are free"), inst
        assert cloud.held_cards(job) == {} and inst["nodes"] == [], inst
        assert cloud.workloads("a-01") == []
    assert cloud.get(u, job)["restart_count"] == 1 and len(_restarts(cloud, u, job)) == 1
    _billed_exactly(cloud, u, job, cards)
    cloud.check_cards_consistent()
    _verify(cloud)


def test_a_restart_leaves_a_node_set_aside_when_another_has_room(cloud_patient):
    cloud = cloud_patient
    cloud.fleet(1, prefix="a-")
    cloud.fleet(1, prefix="b-")
    cloud.add_image(IMAGE)
    u = cloud.user()
    flag = cloud.tmp / "exit-now"
    job = cloud.create(u, card_count=2, image=IMAGE, restart_policy="on_failure",
                       command=["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; rm -f {flag}; exit 3"])["id"]
    cloud.wait_state(u, job, "running")
    assert cloud.held_cards(job) == {"a-01": [0, 1]}
    # Cordoned: it keeps running there, but its restart goes to b-01.
    cloud.set_node_state("a-01", "cordoned")
    flag.touch()
    wait(lambda: cloud.get(u, job)["restart_count"] == 1, what="the first restart")
    assert cloud.get(u, job)["state_reason"].startswith(
        "restart 1 in 10s (restart_policy on_failure) on node b-01 cards [0,1], as node a-01 is cordoned: workload"
        " exited with status 3"), cloud.get(u, job)
    assert cloud.held_cards(job) == {"b-01": [0, 1]}
    cloud.d.advance_clock(10)
    cloud.wait_state(u, job, "running")
    cloud.check_running(u, job)
    # Both set aside: nowhere else has room, so it stays where it is.
    cloud.set_node_state("b-01", "draining")
    wait(lambda: not flag.exists() and cloud.get(u, job)["state"] == "running", what="the flag taken")
    flag.touch()
    wait(lambda: cloud.get(u, job)["restart_count"] == 2, what="the second restart")
    assert cloud.get(u, job)["state_reason"].startswith(
        "restart 2 in 20s (restart_policy on_failure): workload exited with status 3"), cloud.get(u, job)
    assert cloud.held_cards(job) == {"b-01": [0, 1]}
    cloud.d.advance_clock(20)
    cloud.wait_state(u, job, "running")
    cloud.check_running(u, job)
    _billed_exactly(cloud, u, job, 2)
    cloud.check_cards_consistent()
    _verify(cloud)
