"""test_instances_failures.py: what goes wrong while provisioning ends in a
sensible state, with nothing left behind on the agents: an image that cannot
be pulled, a volume that cannot be mounted, an agent killed mid-provisioning,
gpurentd itself killed (SIGKILL) mid-provisioning and restarted, workloads
no instance owns (also through a narrow window of agent calls), and an
agent restarted under a running instance."""
import os
import signal

import pytest

from agent_util import pause
from harness import assert_error
from instances_util import cloud, cloud_with, wait  # noqa: F401  (fixtures)

cloud_one_attempt = cloud_with(provision_max_attempts="1")
# Heartbeats every 500 ms and a node offline only after 100 misses (50 s):
# an agent restart, which takes a second or two, never makes its node
# offline, so what the test sees is what the agent's restart itself does.
cloud_patient = cloud_with(heartbeat_interval_ms="500", heartbeat_miss_limit="100")
# Two agent calls at a time: a sweep of five nodes streams its lists and
# deletes through a window smaller than itself.
cloud_narrow = cloud_with(agent_max_parallel="2")
# A removal the agent takes longer over than this ends the instance anyway.
cloud_no_patience = cloud_with(provision_timeout_s="1")
# No sweep after the first: a workload no instance owns stays on its node
# until something else finds it.
cloud_no_sweep = cloud_with(provision_max_attempts="1", reconcile_sweep_ms="3600000")
cloud_fail_mount = cloud_with(provision_max_attempts="1",
                              volume_source_template="nfs.example:/export/fail-mount/{volume_id}")


def _failed_cleanly(cloud, acct, inst_id, reason_words):
    """The instance failed with a reason, holds no cards, was never billed,
    and no agent runs anything for it."""
    inst = cloud.wait_state(acct, inst_id, "failed")
    for w in reason_words:
        assert w in inst["state_reason"], inst
    assert inst["nodes"] == [] and cloud.held_cards(inst_id) == {}
    assert cloud.d.sql("SELECT * FROM running_intervals WHERE instance_id = ?", (inst_id,)) == []
    assert cloud.volume(acct, inst["volume_id"])["in_use"] is False
    cloud.wait_no_orphans()
    for name, wls in cloud.all_workloads().items():
        assert wls == [], (name, wls)
    cloud.check_cards_consistent()
    events = cloud.events(acct, inst_id)
    assert events[-1]["state"] == "failed" and events[-1]["reason"] == inst["state_reason"], events
    return inst


def test_image_pull_failure_retries_then_fails(cloud):
    """A pull that fails is retried on fresh cards after a backoff; after
    provision_max_attempts (3) the instance fails with the agent's reason."""
    cloud.fleet(2, prefix="n-")
    cloud.add_image("example/fail-pull:1")
    u = cloud.user()
    inst = cloud.create(u, card_count=8, image="example/fail-pull:1")
    iid = inst["id"]
    for attempt in (1, 2):
        def retrying():
            i = cloud.get(u, iid)
            return i["state"] == "pending" and f"attempt {attempt} failed" in i["state_reason"] and i
        i = wait(retrying, what=f"attempt {attempt} to fail")
        assert "fail-pull" in i["state_reason"], i
        # Fresh cards are claimed for the retry, and the failed workload is
        # removed from its agent before the backoff ends.
        assert sum(len(c) for c in cloud.held_cards(iid).values()) == 8
        cloud.wait_no_orphans()
        cloud.check_cards_consistent()
        # Nothing is put again before the backoff (10 s, then 20 s) is over.
        assert all(wls == [] for wls in cloud.all_workloads().values())
        cloud.d.advance_clock(10 * attempt)
    inst = _failed_cleanly(cloud, u, iid, ["gave up after 3 attempts", "pull", "fail-pull"])
    states = [e["state"] for e in cloud.events(u, iid) if e["state"] in ("pending", "provisioning", "failed")]
    assert states == ["pending", "provisioning", "pending", "provisioning", "pending", "provisioning", "failed"]
    # A failed instance can be terminated, or started again (and fail again).
    cloud.action(u, iid, "terminate")
    cloud.wait_state(u, iid, "terminated")


def test_image_pull_failure_one_attempt(cloud_one_attempt):
    cloud = cloud_one_attempt
    cloud.fleet(2, prefix="n-")
    cloud.add_image("example/fail-pull:1")
    u = cloud.user()
    inst = cloud.create(u, card_count=16, image="example/fail-pull:1")
    _failed_cleanly(cloud, u, inst["id"], ["gave up after 1 attempts", "fail-pull"])
    # The cards are free for someone else.
    ok = cloud.create(u, card_count=16)
    cloud.wait_state(u, ok["id"], "running")
    cloud.check_running(u, ok["id"])
    # A failed instance may be started again, when there is room.
    assert_error(cloud.d.post(f"/v1/instances/{inst['id']}/start", key=u.key), 409, "insufficient_capacity",
                 "card_count")
    assert cloud.get(u, inst["id"])["state"] == "failed"
    cloud.action(u, ok["id"], "terminate")
    cloud.wait_state(u, ok["id"], "terminated")
    again = cloud.action(u, inst["id"], "start")
    assert again["state"] == "pending" and len(again["nodes"]) == 2
    _failed_cleanly(cloud, u, inst["id"], ["gave up after 1 attempts", "fail-pull"])


def test_mount_failure(cloud_fail_mount):
    cloud = cloud_fail_mount
    cloud.fleet(1, prefix="n-")
    u = cloud.user()
    inst = cloud.create(u, card_count=4)
    _failed_cleanly(cloud, u, inst["id"], ["mount", "fail-mount"])


def test_start_failure(cloud_one_attempt):
    cloud = cloud_one_attempt
    cloud.fleet(1, prefix="n-")
    cloud.add_image("example/fail-start:1")
    u = cloud.user()
    inst = cloud.create(u, card_count=2, image="example/fail-start:1")
    _failed_cleanly(cloud, u, inst["id"], ["fail-start"])


def test_agent_killed_mid_provisioning(cloud):
    """The node's agent dies while pulling: the node goes offline, the
    attempt fails, the instance is retried on another node and runs there.
    When the dead agent comes back with its old workload on disk, the sweep
    removes it."""
    a = cloud.fleet(1, prefix="a-", sim={"sim_pull_ms": "60000"})
    cloud.fleet(1, prefix="b-")
    u = cloud.user()
    inst = cloud.create(u, card_count=8)
    iid = inst["id"]
    assert [p["node_name"] for p in inst["nodes"]] == ["a-01"]
    wait(lambda: [w["phase"] for w in cloud.workloads("a-01")] == ["pulling"], what="a-01 pulling")
    a.proc.kill()
    a.proc.wait()

    def retrying():
        i = cloud.get(u, iid)
        return i["state"] == "pending" and "attempt 1 failed" in i["state_reason"] and i
    i = wait(retrying, what="the attempt on the dead node to fail")
    assert "a-01" in i["state_reason"] and "offline" in i["state_reason"], i
    assert [p["node_name"] for p in i["nodes"]] == ["b-01"]
    assert cloud.d.sql("SELECT health FROM nodes WHERE name = 'a-01'") == [("offline",)]
    cloud.d.advance_clock(10)
    cloud.wait_state(u, iid, "running")
    cloud.check_running(u, iid)
    # The agent comes back (same state directory, so the same secret and
    # the workload record it had accepted).
    cloud.restart_fleet(a)
    cloud.wait_nodes_up(["a-01"])
    cloud.wait_no_orphans()
    assert cloud.workloads("a-01") == []
    assert cloud.get(u, iid)["state"] == "running"
    cloud.check_running(u, iid)
    cloud.check_cards_consistent()


def test_agent_killed_without_spare_capacity(cloud_one_attempt):
    """With nowhere else to go, the instance fails and releases its cards;
    the returning agent is cleaned up and the node can be rented again."""
    cloud = cloud_one_attempt
    a = cloud.fleet(2, prefix="a-", sim={"sim_pull_ms": "60000"})
    u = cloud.user()
    inst = cloud.create(u, card_count=16)
    wait(lambda: all(len(cloud.workloads(n)) == 1 for n in ("a-01", "a-02")), what="both nodes pulling")
    a.proc.kill()
    a.proc.wait()
    i = cloud.wait_state(u, inst["id"], "failed")
    assert "offline" in i["state_reason"], i
    assert cloud.held_cards(inst["id"]) == {}
    cloud.restart_fleet(a)
    cloud.wait_nodes_up(["a-01", "a-02"])
    cloud.wait_no_orphans()
    assert cloud.all_workloads() == {"a-01": [], "a-02": []}
    cloud.check_cards_consistent()


def test_daemon_killed_mid_provisioning_and_restarted(cloud):
    """SIGKILL while one instance is provisioning and another was just
    created: after the restart both run, each node holds exactly the
    workload placed before the crash, and billing starts once."""
    cloud.fleet(4, prefix="n-", sim={"sim_pull_ms": "1500"})
    u = cloud.user()
    d = cloud.d
    x = cloud.create(u, card_count=16)
    wait(lambda: cloud.get(u, x["id"])["state"] == "provisioning", what="x provisioning")
    wait(lambda: all(w and w[0]["phase"] == "pulling" for w in (cloud.workloads("n-01"), cloud.workloads("n-02"))),
         what="x pulling on both nodes")
    y = cloud.create(u, card_count=8)
    d.terminate(signal.SIGKILL)
    assert d.wait() == -signal.SIGKILL
    placed = sorted(d.sql("SELECT instance_id, rank, node_id, workload_id FROM instance_nodes"))
    assert len(placed) == 3
    d.start()
    for inst in (x, y):
        cloud.wait_state(u, inst["id"], "running")
        cloud.check_running(u, inst["id"])
    assert sorted(d.sql("SELECT instance_id, rank, node_id, workload_id FROM instance_nodes")) == placed
    for name in ("n-01", "n-02", "n-03"):
        assert len(cloud.workloads(name)) == 1, name
    assert cloud.workloads("n-04") == []
    for inst in (x, y):
        assert d.sql("SELECT count(*), sum(ended_at IS NULL) FROM running_intervals WHERE instance_id = ?",
                     (inst["id"],)) == [(1, 1)]
    cloud.wait_no_orphans()
    cloud.check_cards_consistent()


def test_daemon_killed_while_stopping(cloud):
    """A stop that was accepted survives a crash: billing ended at the
    request, and after the restart the workloads go and the cards are free."""
    slow = cloud.fleet(1, prefix="n-")
    u = cloud.user()
    d = cloud.d
    inst = cloud.create(u, card_count=8)
    cloud.wait_state(u, inst["id"], "running")
    t_stop = d.advance_clock(120)
    pause(slow.proc)  # the DELETE cannot get through
    try:
        assert cloud.action(u, inst["id"], "stop")["state"] == "stopping"
        d.terminate(signal.SIGKILL)
        d.wait()
    finally:
        slow.proc.send_signal(signal.SIGCONT)
    d.advance_clock(60)
    d.start()
    cloud.wait_state(u, inst["id"], "stopped")
    assert cloud.workloads("n-01") == []
    assert d.sql("SELECT ended_at FROM running_intervals WHERE instance_id = ?", (inst["id"],)) == [(t_stop,)]
    cloud.check_cards_consistent()


def test_cards_stay_held_until_the_old_workload_is_gone(cloud_one_attempt):
    """A stopped instance's cards go to someone else only once its agent has
    removed the old workload, not when the removal was asked for. Its command
    ignores SIGTERM, so the sim removes it only when it kills it, 2 s later:
    the instance stays stopping until then, and an instance placed on the
    same cards the moment it is stopped runs at its first and only attempt
    (the agent would refuse a PUT on cards still held, and with
    provision_max_attempts 1 that failure would be final)."""
    cloud = cloud_one_attempt
    cloud.fleet(1, prefix="n-")
    a, b = cloud.user(), cloud.user()
    inst = cloud.create(a, card_count=8, command=["sh", "-c", "trap '' TERM; while :; do sleep 1; done"])
    cloud.wait_state(a, inst["id"], "running")
    [(wid,)] = cloud.d.sql("SELECT workload_id FROM instance_nodes WHERE instance_id = ?", (inst["id"],))
    record = os.path.join(cloud.node_fleet("n-01").state_dir, "nodes", "n-01", "workloads", f"{wid}.json")
    assert os.path.exists(record)
    assert cloud.action(a, inst["id"], "stop")["state"] == "stopping"
    cloud.wait_state(a, inst["id"], "stopped")
    assert not os.path.exists(record)  # removed, tombstone and all, before the cards were let go
    other = cloud.create(b, card_count=8)
    cloud.wait_state(b, other["id"], "running")
    events = cloud.events(b, other["id"])
    assert not [e for e in events if e["state"] == "failed" or "attempt" in e["reason"]], events
    cloud.check_cards_consistent()


def test_a_removal_that_outlasts_provision_timeout_s_ends_the_instance_anyway(cloud_no_patience):
    """A workload the agent keeps removing (a runtime that fails it) must not
    keep its instance stopping for ever: past provision_timeout_s the stop
    ends, saying why in the log. Here the removal takes the sim's 2 s to
    kill a command that ignores SIGTERM, and the clock moves past the
    timeout at once."""
    cloud = cloud_no_patience
    cloud.fleet(1, prefix="n-")
    u = cloud.user()
    inst = cloud.create(u, card_count=8, command=["sh", "-c", "trap '' TERM; while :; do sleep 1; done"])
    cloud.wait_state(u, inst["id"], "running")
    assert cloud.action(u, inst["id"], "stop")["state"] == "stopping"
    cloud.d.advance_clock(5)
    cloud.wait_state(u, inst["id"], "stopped")
    assert f"instance {inst['id']}: node n-01 still removing workload" in cloud.d.stderr_text()
    cloud.check_cards_consistent()


def test_a_card_held_by_a_forgotten_workload_is_freed_not_a_failed_attempt(cloud_no_sweep):
    """A node can come back holding a workload no instance owns (its
    instance was lost with the node) before a sweep deletes it. An instance
    placed on those cards is refused by the agent, which names the holder:
    the reconciler deletes it and puts the instance again, which runs at
    its first and only attempt."""
    cloud = cloud_no_sweep
    cloud.fleet(1, prefix="n-")
    u = cloud.user()
    stray = "wl_forgotten00000000001"
    r = cloud.agent("n-01", "PUT", f"/v1/workloads/{stray}", json={"image": "busybox", "gpus": list(range(8))})
    assert r.status_code == 201, r.text
    inst = cloud.create(u, card_count=8)
    cloud.wait_state(u, inst["id"], "running")
    events = cloud.events(u, inst["id"])
    assert not [e for e in events if e["state"] == "failed" or "attempt" in e["reason"]], events
    assert stray not in [w["id"] for w in cloud.workloads("n-01")]
    assert f"card held by workload {stray}, which no instance owns" in cloud.d.stderr_text()
    cloud.check_cards_consistent()


def test_orphaned_workloads_are_removed(cloud):
    """A workload that an agent runs but no instance owns (left by a lost
    request, a restored database, or anyone else) is deleted by the sweep;
    owned workloads are left alone."""
    cloud.fleet(2, prefix="n-")
    u = cloud.user()
    inst = cloud.create(u, card_count=4)
    cloud.wait_state(u, inst["id"], "running")
    r = cloud.agent("n-01", "PUT", "/v1/workloads/wl_stray000000000000001", json={"image": "busybox", "gpus": [6]})
    assert r.status_code == 201, r.text
    r = cloud.agent("n-02", "PUT", "/v1/workloads/wl_stray000000000000002", json={"image": "busybox", "gpus": [0]})
    assert r.status_code == 201, r.text
    cloud.wait_no_orphans()
    assert [w["id"] for w in cloud.workloads("n-02")] == []
    assert len(cloud.workloads("n-01")) == 1
    assert cloud.get(u, inst["id"])["state"] == "running"
    cloud.check_running(u, inst["id"])
    assert "orphaned workload wl_stray000000000000001" in cloud.d.stderr_text()


def test_sweep_through_a_narrow_window_sees_every_node(cloud_narrow):
    """With agent_max_parallel 2, a pass makes each list and delete only when
    a slot frees: every node is still listed, every orphan deleted, the
    owned workloads left alone, and a workload that exits on the last node
    still ends its run."""
    cloud = cloud_narrow
    cloud.fleet(5, prefix="n-", sim={"sim_exit_ms": "1500"})
    cloud.add_image("example/exit-after:1")
    u = cloud.user()
    kept = [cloud.create(u, card_count=8) for _ in range(4)]
    for inst in kept:
        cloud.wait_state(u, inst["id"], "running")
    job = cloud.create(u, card_count=8, image="example/exit-after:1")
    cloud.wait_state(u, job["id"], "running")
    for k in range(1, 6):
        r = cloud.agent(f"n-0{k}", "PUT", f"/v1/workloads/wl_stray00000000000000{k}", json={"image": "busybox"})
        assert r.status_code == 201, r.text
    cloud.wait_no_orphans()
    for k in range(1, 6):
        assert f"orphaned workload wl_stray00000000000000{k}" in cloud.d.stderr_text()
    i = cloud.wait_state(u, job["id"], ("stopped", "failed", "succeeded"))
    assert i["state"] == "succeeded" and "exited" in i["state_reason"], i
    for inst in kept:
        cloud.check_running(u, inst["id"])
    wait(lambda: sum(len(w) for w in cloud.all_workloads().values()) == 4, what="the job's workload to be deleted")
    cloud.wait_no_orphans()
    cloud.check_cards_consistent()


def test_workload_that_exits_ends_the_run(cloud):
    """A running workload that exits on its own ends the instance's run and
    its billing, and frees the cards: a job (restart_policy never) that
    exited with status 0 has succeeded, and is settled (desired stopped)."""
    cloud.fleet(1, prefix="n-", sim={"sim_exit_ms": "400"})
    cloud.add_image("example/exit-after:1")
    u = cloud.user()
    inst = cloud.create(u, card_count=8, image="example/exit-after:1")
    cloud.wait_state(u, inst["id"], "running")
    i = cloud.wait_state(u, inst["id"], ("stopped", "failed", "succeeded"))
    assert i["state"] == "succeeded" and "exited" in i["state_reason"], i
    assert i["desired_state"] == "stopped" and i["exit_code"] == 0, i
    assert cloud.held_cards(inst["id"]) == {}
    assert cloud.d.sql("SELECT count(*) FROM running_intervals WHERE instance_id = ? AND ended_at IS NOT NULL",
                       (inst["id"],)) == [(1,)]
    cloud.wait_no_orphans()
    assert cloud.workloads("n-01") == []


def test_job_that_ends_before_every_rank_runs_is_over_not_retried(cloud):
    """A rank whose job ends while another rank still pulls: the job ran, so
    the instance is over (succeeded here, its status was 0; not retried on
    other cards, which would run it a second time), and nothing is billed,
    since the instance was never seen running on all its nodes."""
    cloud.fleet(1, prefix="fast-", sim={"sim_pull_ms": "0"})
    cloud.fleet(1, prefix="slow-", sim={"sim_pull_ms": "4000"})
    cloud.add_image("example/exit-after-100:1")
    u = cloud.user()
    inst = cloud.create(u, card_count=16, image="example/exit-after-100:1")
    i = cloud.wait_state(u, inst["id"], ("stopped", "failed", "succeeded"))
    assert i["state"] == "succeeded" and i["exit_code"] == 0 and i["desired_state"] == "stopped", i
    assert "fast-01: workload exited before every node was seen running" in i["state_reason"], i
    assert cloud.d.sql("SELECT count(*) FROM running_intervals") == [(0,)]
    assert cloud.d.sql("SELECT attempts FROM instances WHERE id = ?", (inst["id"],)) == [(0,)]
    assert cloud.held_cards(inst["id"]) == {}
    cloud.wait_no_orphans()
    assert [e["state"] for e in cloud.events(u, inst["id"])].count("pending") == 1


def test_stop_and_terminate_while_provisioning(cloud):
    """Changing one's mind mid-pull removes the workloads and frees the
    cards; nothing was billed."""
    cloud.fleet(2, prefix="n-", sim={"sim_pull_ms": "60000"})
    u = cloud.user()
    x = cloud.create(u, card_count=8)
    y = cloud.create(u, card_count=8)
    wait(lambda: all(len(cloud.workloads(n)) == 1 for n in ("n-01", "n-02")), what="both pulling")
    # The agents hold a PUT's answer a moment in case the workload starts
    # at once (Gpurent-Wait-Ms); the state follows the answer.
    wait(lambda: cloud.get(u, x["id"])["state"] == "provisioning", what="x provisioning")
    cloud.action(u, x["id"], "stop")
    cloud.action(u, y["id"], "terminate")
    cloud.wait_state(u, x["id"], "stopped")
    cloud.wait_state(u, y["id"], "terminated")
    assert cloud.all_workloads() == {"n-01": [], "n-02": []}
    assert cloud.d.sql("SELECT count(*) FROM running_intervals") == [(0,)]
    assert cloud.d.sql("SELECT count(*) FROM node_cards WHERE instance_id IS NOT NULL") == [(0,)]
    states = [e["state"] for e in cloud.events(u, y["id"])]
    assert states[-2:] == ["stopping", "terminated"], states
    cloud.check_cards_consistent()


def test_node_lost_while_running(cloud):
    """An agent that dies under a running instance: the instance is lost,
    billing ends at the node's last good heartbeat, the cards are released;
    when the node returns its stale workload is removed and the instance
    can be started again."""
    a = cloud.fleet(1, prefix="a-")
    u = cloud.user()
    d = cloud.d
    inst = cloud.create(u, card_count=8)
    cloud.wait_state(u, inst["id"], "running")
    (started,) = d.sql("SELECT started_at FROM running_intervals WHERE instance_id = ?", (inst["id"],))[0]
    t_seen = d.advance_clock(300)
    wait(lambda: d.sql("SELECT last_seen_at FROM nodes JOIN node_liveness ON node_id = id WHERE name = 'a-01'")
         == [(t_seen,)], what="a heartbeat")
    a.proc.kill()
    a.proc.wait()
    d.advance_clock(45)
    i = cloud.wait_state(u, inst["id"], "lost")
    assert "a-01" in i["state_reason"], i
    assert d.sql("SELECT started_at, ended_at FROM running_intervals WHERE instance_id = ?",
                 (inst["id"],)) == [(started, t_seen)]
    assert cloud.held_cards(inst["id"]) == {} and i["nodes"] == []
    cloud.restart_fleet(a)
    cloud.wait_nodes_up(["a-01"])
    cloud.wait_no_orphans()
    assert cloud.workloads("a-01") == []
    cloud.action(u, inst["id"], "start")
    cloud.wait_state(u, inst["id"], "running")
    cloud.check_running(u, inst["id"])
    cloud.check_cards_consistent()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_agent_restarted_under_running_instance(cloud_patient, sig):
    """An agent stopped (or killed) and started again on the same state
    directory and port while its node runs an instance, before the node is
    judged offline: the agent reloads its workload record, the instance keeps
    running and billing without a break, and the node runs exactly the one
    workload it had: nothing put again under another id, nothing orphaned."""
    cloud = cloud_patient
    d = cloud.d
    a = cloud.fleet(2, prefix="n-")
    u = cloud.user()
    inst = cloud.create(u, card_count=8)
    iid = inst["id"]
    cloud.wait_state(u, iid, "running")
    cloud.check_running(u, iid)
    [(node, wl_id)] = d.sql("SELECT n.name, p.workload_id FROM instance_nodes p JOIN nodes n ON n.id = p.node_id"
                            " WHERE p.instance_id = ?", (iid,))
    other = "n-02" if node == "n-01" else "n-01"
    assert [(w["id"], w["phase"]) for w in cloud.workloads(node)] == [(wl_id, "running")]
    intervals = d.sql("SELECT started_at, ended_at FROM running_intervals WHERE instance_id = ?", (iid,))
    assert len(intervals) == 1 and intervals[0][1] is None, intervals
    events_before = cloud.events(u, iid)

    if sig == signal.SIGTERM:
        a.stop()
    else:
        a.proc.kill()
        a.proc.wait()
    cloud.restart_fleet(a)

    # A heartbeat of the restarted agent: the node answered at a later time
    # on the testing clock than anything before the restart.
    t = d.advance_clock(1)
    wait(lambda: d.sql("SELECT last_seen_at, health FROM nodes JOIN node_liveness ON node_id = id"
                       " WHERE name = ?", (node,)) == [(t, "up")],
         what=f"a heartbeat from the restarted {node}")
    # A sweep of the restarted agent: a stray workload put on its other node
    # now is deleted only by a sweep that listed that node, and the same
    # sweep listed the instance's node too.
    r = cloud.agent(other, "PUT", "/v1/workloads/wl_probe00000000000001", json={"image": "busybox", "gpus": [0]})
    assert r.status_code == 201, r.text
    cloud.wait_no_orphans()
    assert "orphaned workload wl_probe00000000000001" in d.stderr_text()

    # Exactly the workload it had, still running, and nothing anywhere else.
    assert [(w["id"], w["phase"]) for w in cloud.workloads(node)] == [(wl_id, "running")]
    assert cloud.workloads(other) == []
    assert d.sql("SELECT workload_id FROM instance_nodes WHERE instance_id = ?", (iid,)) == [(wl_id,)]
    i = cloud.get(u, iid)
    assert i["state"] == "running" and [(p["node_name"], p["cards"]) for p in i["nodes"]] == [(node, list(range(8)))], i
    cloud.check_running(u, iid)
    cloud.check_cards_consistent()
    # No event (lost, a new attempt) and no break in billing.
    assert cloud.events(u, iid) == events_before
    assert d.sql("SELECT started_at, ended_at FROM running_intervals WHERE instance_id = ?", (iid,)) == intervals
