"""test_instances_jobs.py: jobs and services (issue 12). A `never` job ends
succeeded or failed with its exit code and last log lines, billed to its exit
second, its cards free for anyone and its instance settled; `on_failure` and
`always` restart it on the same cards after a backoff, unbilled meanwhile,
and a stop during the backoff wins, and on other cards when its node is
lost; `max_runtime_minutes` warns, then stops;
a rank of a multi-node job that fails ends the whole gang. The sim images
say how a job ends: exit-after-MS, exit-code-N, only-rank-R (runtime.c)."""
import os
import signal
import time

import pytest

from agent_util import pause
from harness import assert_error
from instances_util import cloud, cloud_with, wait  # noqa: F401  (fixtures)
from money_util import PRICE, accrue, charged_usage, ledger_verify


def _verify(cloud):
    rc, out = ledger_verify(cloud.d.db_path)
    assert rc == 0 and out.strip().splitlines()[-1] == "ledger OK", f"ledger verify failed ({rc}):\n{out}"


def _image(cloud, ref):
    cloud.add_image(ref)
    return ref


def _intervals(cloud, iid):
    return cloud.d.sql("SELECT started_at, ended_at, end_reason FROM running_intervals WHERE instance_id = ?"
                       " ORDER BY id", (iid,))


def _workload_ids(cloud, iid):
    return [w for (w,) in cloud.d.sql("SELECT workload_id FROM instance_nodes WHERE instance_id = ? ORDER BY rank",
                                      (iid,))]


def _agent_ids(cloud):
    return {w["id"] for wls in cloud.all_workloads().values() for w in wls}


def test_job_fields_are_validated_and_shown(cloud):
    cloud.fleet(1)
    u = cloud.user()
    bad = [
        ({"restart_policy": 1}, "restart_policy"),
        ({"restart_policy": "sometimes"}, "restart_policy"),
        ({"restart_policy": ""}, "restart_policy"),
        ({"restart_policy": ["never"]}, "restart_policy"),
        ({"max_runtime_minutes": "10"}, "max_runtime_minutes"),
        ({"max_runtime_minutes": 0}, "max_runtime_minutes"),
        ({"max_runtime_minutes": -5}, "max_runtime_minutes"),
        ({"max_runtime_minutes": 43201}, "max_runtime_minutes"),
        ({"max_runtime_minutes": 1.5}, "max_runtime_minutes"),
        ({"max_runtime_minutes": True}, "max_runtime_minutes"),
        ({"restart_count": 3}, "restart_count"),  # shown, never set
        ({"exit_code": 0}, "exit_code"),
    ]
    for extra, field in bad:
        r = cloud.d.post("/v1/instances", key=u.key,
                         json={"gpu_type": "MI450", "card_count": 1, "image": "rocm/pytorch:2.3-rocm6.2", **extra})
        code = "unknown_field" if field in ("restart_count", "exit_code") else "invalid_field"
        err = assert_error(r, 400, code, field)
        assert field in err["message"], err
    assert cloud.d.sql("SELECT count(*) FROM instances") == [(0,)], "a refused create left an instance"
    plain = cloud.create(u, card_count=1)
    assert (plain["restart_policy"], plain["max_runtime_minutes"], plain["restart_count"], plain["exit_code"]) == \
        ("never", None, 0, None), plain
    nulls = cloud.create(u, card_count=1, restart_policy=None, max_runtime_minutes=None)
    assert (nulls["restart_policy"], nulls["max_runtime_minutes"]) == ("never", None), nulls
    svc = cloud.create(u, card_count=1, restart_policy="always", max_runtime_minutes=43200)
    assert (svc["restart_policy"], svc["max_runtime_minutes"]) == ("always", 43200), svc
    assert cloud.get(u, svc["id"])["restart_policy"] == "always"
    r = cloud.d.get("/v1/instances", key=u.key, params={"state": "succeeded"})
    assert r.status_code == 200 and r.json()["data"] == [], r.text


def test_never_job_succeeds_billed_to_its_exit_second(cloud):
    cloud.fleet(1)
    img = _image(cloud, "example/exit-after-3000:1")
    u, other = cloud.user(), cloud.user()
    created = time.time()
    iid = cloud.create(u, card_count=8, image=img)["id"]
    inst = cloud.wait_state(u, iid, "running")
    start = cloud.d.now()
    wl = _workload_ids(cloud, iid)[0]
    k = 120
    cloud.d.set_clock(start + k)
    moved = time.time()
    inst = cloud.wait_state(u, iid, ("succeeded", "failed", "stopped"))
    seen = time.time()
    assert inst["state"] == "succeeded", inst
    assert inst["exit_code"] == 0 and inst["desired_state"] == "stopped", inst
    assert inst["state_reason"].startswith("workload exited with status 0 on node "), inst
    assert "last lines: " in inst["state_reason"] and "sim: container exited with status 0" in inst["state_reason"]
    [(began, end, reason)] = _intervals(cloud, iid)
    assert began == start and reason.startswith("workload exited with status 0"), (began, reason)
    # Ended in the second the agent says it exited, placed on the daemon's clock.
    due = created + 3
    low = max(start, start + k - (int(seen) - int(due))) if due > moved else start
    assert low <= end <= start + k, (low, end, start + k)
    assert charged_usage(cloud, u) == accrue(PRICE["MI450"], 8, end - start)
    # Cards freed and the workload gone; the volume stays.
    assert inst["nodes"] == [] and cloud.held_cards(iid) == {}
    wait(lambda: wl not in _agent_ids(cloud), what="the job's workload to be deleted")
    assert cloud.volume(u, inst["volume_id"])["id"] == inst["volume_id"]
    events = cloud.events(u, iid)
    assert events[-1]["state"] == "succeeded", events
    listed = cloud.d.get("/v1/instances", key=u.key, params={"state": "succeeded"}).json()["data"]
    assert [i["id"] for i in listed] == [iid]
    # Settled: another user takes the cards, and an hour of passes later
    # nothing more has happened to it.
    cloud.d.advance_clock(3600)
    oid = cloud.create(other, card_count=8)["id"]
    cloud.wait_state(other, oid, "running")
    after = cloud.get(u, iid)
    assert (after["state"], after["desired_state"], after["state_since"]) == \
        ("succeeded", "stopped", inst["state_since"]), after
    assert charged_usage(cloud, u) == accrue(PRICE["MI450"], 8, end - start), "billed after the exit"
    # It can be started again; stopping it as it is is refused like failed.
    cloud.action(u, iid, "stop", expect=409)
    cloud.action(other, oid, "stop")
    cloud.wait_state(other, oid, "stopped")
    again = cloud.action(u, iid, "start")
    assert again["state"] == "pending" and again["exit_code"] is None, again
    cloud.wait_state(u, iid, ("running", "succeeded"))
    cloud.action(u, iid, "terminate")
    cloud.wait_state(u, iid, "terminated")
    cloud.check_cards_consistent()
    _verify(cloud)


def test_never_job_failing_ends_failed_with_code_and_last_lines(cloud):
    cloud.fleet(1)
    img = _image(cloud, "example/log-every-100-exit-after-1500-exit-code-3:1")
    u = cloud.user()
    iid = cloud.create(u, card_count=2, image=img)["id"]
    cloud.wait_state(u, iid, "running")
    wl = _workload_ids(cloud, iid)[0]
    inst = cloud.wait_state(u, iid, ("failed", "succeeded", "stopped"))
    assert inst["state"] == "failed" and inst["exit_code"] == 3 and inst["desired_state"] == "stopped", inst
    reason = inst["state_reason"]
    assert reason.startswith("workload exited with status 3 on node "), reason
    assert "tick " in reason and reason.endswith("sim: container exited with status 3"), reason
    assert inst["nodes"] == [] and cloud.held_cards(iid) == {}
    wait(lambda: wl not in _agent_ids(cloud), what="the job's workload to be deleted")
    [(_, end, ireason)] = _intervals(cloud, iid)
    assert end is not None and ireason.startswith("workload exited with status 3"), ireason
    _verify(cloud)


def test_on_failure_restarts_with_backoff_and_count(cloud):
    cloud.fleet(1)
    img = _image(cloud, "example/exit-after-800-exit-code-2:1")
    u = cloud.user()
    iid = cloud.create(u, card_count=4, image=img, restart_policy="on_failure")["id"]
    cloud.wait_state(u, iid, "running")
    cards = cloud.held_cards(iid)
    first = _workload_ids(cloud, iid)
    t0 = cloud.d.now()
    wait(lambda: cloud.get(u, iid)["restart_count"] == 1, what="the first restart")
    inst = cloud.get(u, iid)
    assert inst["state"] == "pending" and inst["exit_code"] == 2 and inst["desired_state"] == "running", inst
    assert inst["state_reason"].startswith("restart 1 in 10s (restart_policy on_failure): workload exited with "
                                           "status 2"), inst
    assert cloud.held_cards(iid) == cards, "the restart keeps its cards"
    [(b0, e0, _)] = _intervals(cloud, iid)
    assert b0 == t0 and e0 == t0, "billed past the exit, or not closed"
    (nxt,) = cloud.d.sql("SELECT next_attempt_at FROM instances WHERE id = ?", (iid,))[0]
    assert nxt == t0 + 10, nxt
    second = _workload_ids(cloud, iid)
    assert set(second).isdisjoint(first), "a restart runs under fresh workload ids"
    wait(lambda: not set(first) & _agent_ids(cloud), what="the exited workload to be deleted")
    assert not set(second) & _agent_ids(cloud), "put again before the backoff ended"
    cloud.d.advance_clock(10)
    cloud.wait_state(u, iid, "running")
    assert cloud.held_cards(iid) == cards
    t1 = cloud.d.now()
    wait(lambda: cloud.get(u, iid)["restart_count"] == 2, what="the second restart")
    inst = cloud.get(u, iid)
    assert inst["state_reason"].startswith("restart 2 in 20s "), inst
    assert [(b, e) for b, e, _ in _intervals(cloud, iid)] == [(t0, t0), (t1, t1)]
    restarts = [e for e in cloud.events(u, iid) if e["reason"].startswith("restart ")]
    assert [e["reason"][:10] for e in restarts] == ["restart 1 ", "restart 2 "], restarts
    # A stop during the backoff wins: it winds down and never comes back.
    cloud.action(u, iid, "stop")
    inst = cloud.wait_state(u, iid, "stopped")
    assert inst["restart_count"] == 2 and cloud.held_cards(iid) == {}, inst
    cloud.d.advance_clock(600)
    wait(lambda: not set(_workload_ids(cloud, iid)) & _agent_ids(cloud), what="nothing left on the agent")
    assert cloud.get(u, iid)["state"] == "stopped"
    assert len(_intervals(cloud, iid)) == 2
    # A start begins afresh.
    inst = cloud.action(u, iid, "start")
    assert inst["restart_count"] == 0 and inst["exit_code"] is None, inst
    cloud.action(u, iid, "terminate")
    cloud.wait_state(u, iid, "terminated")
    cloud.check_cards_consistent()
    _verify(cloud)


def test_on_failure_ends_succeeded_and_always_restarts_after_exit_0(cloud):
    cloud.fleet(1)
    img = _image(cloud, "example/exit-after-800:1")
    u = cloud.user()
    job = cloud.create(u, card_count=2, image=img, restart_policy="on_failure")["id"]
    svc = cloud.create(u, card_count=2, image=img, restart_policy="always")["id"]
    inst = cloud.wait_state(u, job, ("succeeded", "failed"))
    assert inst["state"] == "succeeded" and inst["restart_count"] == 0 and inst["exit_code"] == 0, inst
    wait(lambda: cloud.get(u, svc)["restart_count"] == 1, what="the service's restart")
    inst = cloud.get(u, svc)
    assert inst["state"] == "pending" and inst["exit_code"] == 0, inst
    assert inst["state_reason"].startswith("restart 1 in 10s (restart_policy always): workload exited with status 0")
    cloud.action(u, svc, "terminate")
    cloud.wait_state(u, svc, "terminated")
    cloud.check_cards_consistent()
    _verify(cloud)


def test_max_runtime_warns_then_stops(cloud):
    cloud.fleet(1)
    u = cloud.user()
    iid = cloud.create(u, card_count=8, max_runtime_minutes=30)["id"]
    cloud.wait_state(u, iid, "running")
    start = cloud.d.now()
    # 10 minutes before the end (max_runtime_warning_minutes' default).
    cloud.d.set_clock(start + 20 * 60)

    def warned():
        return [e for e in cloud.events(u, iid) if e["state"] == "max_runtime_warning"]
    [w] = wait(warned, what="the max_runtime_warning event")
    assert "stopped in 600 seconds" in w["reason"] and "max_runtime_minutes is 30" in w["reason"], w
    assert cloud.get(u, iid)["state"] == "running"
    cloud.d.set_clock(start + 31 * 60)
    inst = cloud.wait_state(u, iid, "stopped")
    assert inst["state_reason"].startswith("max_runtime_minutes reached: stopped after 30 minutes"), inst
    assert inst["desired_state"] == "stopped" and cloud.held_cards(iid) == {}, inst
    [(began, end, reason)] = _intervals(cloud, iid)
    assert (began, end) == (start, start + 1800) and reason.startswith("max_runtime_minutes reached"), (began, end)
    assert charged_usage(cloud, u) == accrue(PRICE["MI450"], 8, 1800)
    assert len(warned()) == 1
    assert cloud.volume(u, inst["volume_id"])["id"] == inst["volume_id"]
    _verify(cloud)


def test_max_runtime_warning_at_half_of_a_short_run(cloud):
    cloud.fleet(1)
    u = cloud.user()
    iid = cloud.create(u, card_count=1, max_runtime_minutes=4)["id"]
    cloud.wait_state(u, iid, "running")
    start = cloud.d.now()
    cloud.d.set_clock(start + 120)

    def warned():
        return [e for e in cloud.events(u, iid) if e["state"] == "max_runtime_warning"]
    [w] = wait(warned, what="the max_runtime_warning event")
    assert w["reason"].endswith("stopped in 120 seconds"), w
    assert cloud.get(u, iid)["state"] == "running"
    cloud.d.set_clock(start + 240)
    inst = cloud.wait_state(u, iid, "stopped")
    assert "after 4 minutes" in inst["state_reason"], inst
    assert [(b, e) for b, e, _ in _intervals(cloud, iid)] == [(start, start + 240)]
    _verify(cloud)


@pytest.mark.parametrize("nodes", [2, 4])
def test_multinode_rank_failing_ends_the_gang(cloud, nodes):
    cloud.fleet(nodes)
    img = _image(cloud, "example/exit-after-1500-exit-code-5-only-rank-1:1")
    u = cloud.user()
    iid = cloud.create(u, card_count=8 * nodes, image=img)["id"]
    cloud.wait_state(u, iid, "running")
    start = cloud.d.now()
    wls = _workload_ids(cloud, iid)
    assert len(wls) == nodes
    cloud.d.set_clock(start + 60)
    inst = cloud.wait_state(u, iid, ("failed", "succeeded"))
    assert inst["state"] == "failed" and inst["exit_code"] == 5, inst
    assert "workload exited with status 5 on node " in inst["state_reason"], inst
    assert inst["nodes"] == [] and cloud.held_cards(iid) == {}
    # Every rank's workload is removed, the ones still running too.
    wait(lambda: not set(wls) & _agent_ids(cloud), what="every rank's workload to be deleted")
    [(began, end, _)] = _intervals(cloud, iid)
    assert began == start and start <= end <= start + 60
    assert charged_usage(cloud, u) == accrue(PRICE["MI450"], 8 * nodes, end - start)
    cloud.check_cards_consistent()
    _verify(cloud)


def test_multinode_job_succeeds_when_every_rank_exits_0(cloud):
    cloud.fleet(2)
    img = _image(cloud, "example/exit-after-1500:1")
    u = cloud.user()
    iid = cloud.create(u, card_count=16, image=img)["id"]
    cloud.wait_state(u, iid, "running")
    start = cloud.d.now()
    cloud.d.set_clock(start + 30)
    inst = cloud.wait_state(u, iid, ("failed", "succeeded"))
    assert inst["state"] == "succeeded" and inst["exit_code"] == 0, inst
    assert "on every node" in inst["state_reason"], inst
    [(began, end, reason)] = _intervals(cloud, iid)
    assert began == start and start <= end <= start + 30 and reason.startswith("workload exited with status 0")
    assert charged_usage(cloud, u) == accrue(PRICE["MI450"], 16, end - start)
    assert inst["nodes"] == [] and cloud.held_cards(iid) == {}
    cloud.wait_no_orphans()
    _verify(cloud)


def test_job_failing_before_every_rank_runs_ends_failed_unbilled(cloud):
    """A rank whose job exits non-zero while another still pulls: the job
    ran, so it is over (not retried on other cards), failed with its status,
    and nothing is billed."""
    cloud.fleet(1, prefix="fast-", sim={"sim_pull_ms": "0"})
    cloud.fleet(1, prefix="slow-", sim={"sim_pull_ms": "4000"})
    img = _image(cloud, "example/exit-after-100-exit-code-4:1")
    u = cloud.user()
    iid = cloud.create(u, card_count=16, image=img)["id"]
    inst = cloud.wait_state(u, iid, ("stopped", "failed", "succeeded"))
    assert inst["state"] == "failed" and inst["exit_code"] == 4 and inst["desired_state"] == "stopped", inst
    assert "workload exited before every node was seen running" in inst["state_reason"], inst
    assert "sim: container exited with status 4" in inst["state_reason"], inst
    assert _intervals(cloud, iid) == []
    assert cloud.d.sql("SELECT attempts FROM instances WHERE id = ?", (iid,)) == [(0,)]
    cloud.wait_no_orphans()
    _verify(cloud)


def test_max_runtime_keeps_counting_across_restarts(cloud):
    """An `always` service that keeps exiting: max_runtime_minutes counts
    from the first time the run was seen running, restarts included, so it
    is stopped at that bound even while it waits to restart."""
    cloud.fleet(1)
    img = _image(cloud, "example/exit-after-800:1")
    u = cloud.user()
    iid = cloud.create(u, card_count=1, image=img, restart_policy="always", max_runtime_minutes=1)["id"]
    cloud.wait_state(u, iid, "running")
    start = cloud.d.now()
    first = _workload_ids(cloud, iid)
    wait(lambda: cloud.get(u, iid)["restart_count"] == 1, what="the first restart")
    wait(lambda: not set(first) & _agent_ids(cloud), what="the exited workload to be deleted")
    cloud.d.set_clock(start + 10)
    wait(lambda: cloud.get(u, iid)["restart_count"] == 2, what="the second restart")
    cloud.d.set_clock(start + 30)  # half the minute: the warning, counted from the first run
    wait(lambda: [e for e in cloud.events(u, iid) if e["state"] == "max_runtime_warning"], what="the warning")
    cloud.d.set_clock(start + 60)
    inst = cloud.wait_state(u, iid, "stopped")
    assert inst["state_reason"].startswith("max_runtime_minutes reached: stopped after 1 minutes"), inst
    ivs = _intervals(cloud, iid)
    # Runs from start, start + 10 and maybe start + 30 (the third restart's
    # backoff ends with the warning's step): none billed past the bound.
    assert [b for b, _, _ in ivs][:2] == [start, start + 10] and len(ivs) <= 3, ivs
    assert all(e is not None and e <= start + 60 for _, e, _ in ivs), ivs
    assert cloud.held_cards(iid) == {}
    _verify(cloud)


cloud_patient = cloud_with(node_lost_after_s="3600")


def test_a_rank_failing_while_another_node_is_silent_ends_the_gang_at_once(cloud_patient, tmp_path):
    """Node b stops answering (unreachable: billing stops, the job is given
    node_lost_after_s to come back), then rank 0, on a node that answers,
    exits 7, as a rank whose peer is gone does: the gang is broken whatever
    b comes back with, so the job fails at once with that status, its
    cards free, rather than holding every card until b answers or goes
    offline. When b answers again its rank is deleted."""
    cloud = cloud_patient
    cloud.fleet(1, prefix="a-")
    b = cloud.fleet(1, prefix="b-")
    img = _image(cloud, "example/job:1")
    u = cloud.user()
    go = tmp_path / "go"
    script = f'if [ "$NODE_RANK" = 0 ]; then while [ ! -f {go} ]; do sleep 0.05; done; echo peer lost; exit 7; fi; ' \
             'sleep 600'
    iid = cloud.create(u, card_count=16, image=img, command=["sh", "-c", script])["id"]
    cloud.wait_state(u, iid, "running")
    wls = _workload_ids(cloud, iid)
    pause(b.proc)
    try:
        cloud.wait_state(u, iid, "unreachable")
        go.write_text("")
        inst = cloud.wait_state(u, iid, ("failed", "lost", "succeeded"))
        assert inst["state"] == "failed" and inst["exit_code"] == 7 and inst["desired_state"] == "stopped", inst
        assert inst["state_reason"].startswith("workload exited with status 7 on node a-01"), inst
        assert "while node b-01 was not answering" in inst["state_reason"] and "peer lost" in inst["state_reason"]
        assert inst["nodes"] == [] and cloud.held_cards(iid) == {}
        wait(lambda: cloud.workloads("a-01") == [], what="rank 0 to be deleted")
        [(began, end, _)] = _intervals(cloud, iid)
        assert end is not None and end >= began, (began, end)
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    # Back, b's rank is nobody's: deleted.
    wait(lambda: wls[1] not in _agent_ids(cloud), what="rank 1 to be deleted once its node answers")
    assert charged_usage(cloud, u) == accrue(PRICE["MI450"], 16, end - began)
    cloud.check_cards_consistent()
    _verify(cloud)


def test_an_on_failure_job_whose_node_is_lost_restarts_on_other_cards(cloud):
    """The node under an on_failure job dies: the run is billed to the node's
    last good beat and the job is placed again, on the other node, after
    the restart backoff (a `never` job ends lost: test_instances_failures)."""
    a = cloud.fleet(1, prefix="a-")
    img = _image(cloud, "example/train:1")
    u = cloud.user()
    job = cloud.create(u, card_count=8, image=img, restart_policy="on_failure",
                       command=["sh", "-c", "echo epoch; sleep 600"])["id"]
    cloud.wait_state(u, job, "running")
    cloud.fleet(1, prefix="b-")
    t_seen = cloud.d.advance_clock(60)
    wait(lambda: cloud.d.sql("SELECT last_seen_at FROM nodes JOIN node_liveness ON node_id = id"
                             " WHERE name = 'a-01'") == [(t_seen,)], what="a heartbeat")
    a.proc.kill()
    a.proc.wait()
    wait(lambda: cloud.get(u, job)["restart_count"] == 1, what="the restart after the loss")
    inst = cloud.get(u, job)
    assert inst["state"] == "pending" and "a-01" in inst["state_reason"], inst
    assert inst["state_reason"].startswith("restart 1 in 10s (restart_policy on_failure): "), inst
    assert [p["node_name"] for p in inst["nodes"]] == ["b-01"], inst
    assert _intervals(cloud, job)[0][1] == t_seen, _intervals(cloud, job)
    cloud.d.advance_clock(10)
    inst = cloud.wait_state(u, job, "running")
    assert [p["node_name"] for p in inst["nodes"]] == ["b-01"], inst
    cloud.check_cards_consistent()
    _verify(cloud)


@pytest.mark.parametrize("agent_now, exited_at", [(None, -2**63), (2**63 - 1, -1)], ids=["end-at-int64-min",
                                                                                      "clock-at-int64-max"])
def test_an_agent_reporting_an_end_out_of_time_ends_the_job_now(cloud, agent_now, exited_at):
    # The agent's list says when a workload ended by the agent's clock; an
    # agent is not trusted, and the difference of two such numbers
    # overflowed (undefined behaviour, which the sanitized daemon dies of).
    # An end no clock can show is taken as this pass.
    from inventory_util import register
    from ssh_util import SshFakeAgent
    agent = SshFakeAgent(name="liar")
    try:
        register(cloud.d, "liar", agent.url)
        cloud.wait_nodes_up(["liar"])
        u = cloud.user()
        iid = cloud.create(u, card_count=1)["id"]
        cloud.wait_state(u, iid, "running")
        with agent.lock:
            [wl] = agent.workloads
            agent.workloads[wl].update(phase="exited", exit_code=1, exited_at=exited_at)
            if agent_now is not None:
                agent.now = agent_now
            agent.facts["workload_exits"] = 1
        inst = cloud.wait_state(u, iid, ("failed", "succeeded", "stopped"))
        assert inst["state"] == "failed" and inst["exit_code"] == 1, inst
        assert cloud.d.get("/healthz").status_code == 200
    finally:
        agent.close()
