"""test_reconciler_attention.py: between its sweeps the reconciler reads
only the instances that need attention (issue 15), so a pass costs what is
changing, not how many instances are live, and nothing it must act on is
missed. The sweep is an hour away in every test here, so whatever happens
is the passes between sweeps' doing. Real gpurentd, real sim-fleet, the
counts from /metrics."""
import re
import time

from agent_util import poll
from money_util import new_cluster, quiet  # noqa: F401 (a fixture)

DEADLINE = 60  # bound on polls, generous for sanitizer builds
OPTIONS = {"reconcile_sweep_ms": "3600000", "reconcile_interval_ms": "100",
           # a paused agent costs a heartbeat its whole timeout: keep it short
           "agent_timeout_ms": "400", "agent_connect_timeout_ms": "300", "heartbeat_interval_ms": "100",
           "node_lost_after_s": "600"}


def reconciler_counts(c):
    """{(metric, kind): value} for the reconciler's pass counters."""
    r = c.d.get("/metrics", key=c.d.admin_key)
    assert r.status_code == 200, r.text
    found = {(m, k): int(v) for m, k, v in re.findall(
        r'^gpurent_reconciler_(passes|instances_read)_total\{kind="(\w+)"\} (\d+)$', r.text, re.M)}
    assert len(found) == 4, r.text
    return found


def attention_passes_go_by(c, n):
    """Waits for n more passes between sweeps; the counts before and after."""
    before = reconciler_counts(c)
    poll(lambda: reconciler_counts(c)[("passes", "attention")] >= before[("passes", "attention")] + n, DEADLINE,
         f"{n} reconciler passes")
    return before, reconciler_counts(c)


def test_running_instances_with_nothing_to_do_are_not_read_between_sweeps(new_cluster):
    c = new_cluster(nodes={"MI450": 2}, options=OPTIONS)
    u = c.signup()
    c.topup(u, 100 * 1_000_000)
    ids = [c.launch(u, cards=2) for _ in range(4)]
    before, after = attention_passes_go_by(c, 5)
    assert after[("instances_read", "attention")] == before[("instances_read", "attention")], (before, after)
    # The one sweep, at start-up, read whatever held cards then; none since.
    assert after[("passes", "sweep")] == before[("passes", "sweep")], (before, after)
    # A stop is attention: the instance is read and stopped, the others are not.
    c.stop(u, ids[0])
    for iid in ids[1:]:
        assert c.instance(u, iid)["state"] == "running"
    before, after = attention_passes_go_by(c, 5)
    assert after[("instances_read", "attention")] == before[("instances_read", "attention")], (before, after)


def test_a_node_that_stops_answering_moves_its_instances_between_sweeps(new_cluster):
    c = new_cluster(nodes={"MI450": 1}, options=OPTIONS)
    u = c.signup()
    c.topup(u, 100 * 1_000_000)
    iid = c.launch(u, cards=8)
    with quiet(c.fleets[0]):
        i = c.wait_state(u, iid, "unreachable", timeout=DEADLINE)
        assert "stopped answering" in i["state_reason"], i
    i = c.wait_state(u, iid, "running", timeout=DEADLINE)
    assert i["state_reason"] == "every node answers again and the workload kept running", i
    # Answering again, the node and its instance are left alone once more.
    before, after = attention_passes_go_by(c, 5)
    assert after[("instances_read", "attention")] == before[("instances_read", "attention")], (before, after)


def workload_calls(c):
    """{method: count} of the reconciler's workload calls to agents."""
    text = c.d.get("/metrics", key=c.d.admin_key).text
    found = {m: int(v) for m, v in re.findall(
        r'^gpurent_reconciler_workload_calls_total\{method="(\w+)"\} (\d+)$', text, re.M)}
    assert set(found) == {"PUT", "GET", "DELETE"}, text
    return found


def launch_counting_calls(c, n):
    """A new user launches n 2-card instances, each waited for until it
    runs: the user, the ids, and the workload calls before and after."""
    u = c.signup()
    c.topup(u, 100 * 1_000_000)
    before = workload_calls(c)
    ids = [c.launch(u, cards=2) for _ in range(n)]
    return u, ids, before, workload_calls(c)


def test_workload_calls_are_counted_and_a_running_instance_costs_none(new_cluster):
    """Each instance is put once on its node; it is followed with GETs only
    until it runs, then costs no call between sweeps; a stop deletes it."""
    c = new_cluster(nodes={"MI450": 2}, options=OPTIONS)
    u, ids, start, running = launch_counting_calls(c, 4)
    assert running["PUT"] - start["PUT"] == 4 and running["DELETE"] == start["DELETE"], (start, running)
    attention_passes_go_by(c, 5)
    assert workload_calls(c) == running
    c.stop(u, ids[0])
    poll(lambda: workload_calls(c)["DELETE"] > running["DELETE"], DEADLINE, "the stopped workload's DELETE")


def test_a_workload_that_runs_within_the_put_s_wait_costs_no_get(new_cluster):
    """A PUT asks the agent to hold its answer until the workload runs
    (agent_put_wait_ms): a node that starts it within the wait says so in
    that answer, and the instance runs with no GET at all; the events still
    show it provisioning first. Asking for no wait, each create is followed
    with GETs until it runs, as before."""
    options = {**OPTIONS, "agent_timeout_ms": "5000", "agent_put_wait_ms": "1000"}
    c = new_cluster(nodes={"MI450": 2}, options=options)
    u, ids, start, running = launch_counting_calls(c, 4)
    assert (running["PUT"] - start["PUT"], running["GET"] - start["GET"]) == (4, 0), (start, running)
    for iid in ids:
        assert [e["state"] for e in c.events(u, iid)] == ["pending", "provisioning", "running"], c.events(u, iid)

    c = new_cluster(nodes={"MI450": 1}, options={**OPTIONS, "agent_put_wait_ms": "0"})
    _, _, start, running = launch_counting_calls(c, 1)
    assert running["PUT"] - start["PUT"] == 1 and running["GET"] > start["GET"], (start, running)


def metric(c, name):
    """The value of an unlabelled counter in /metrics."""
    text = c.d.get("/metrics", key=c.d.admin_key).text
    return int(re.search(rf"^{name} (\d+)$", text, re.M).group(1))


def connections_opened(c):
    """Connections to agents the reconciler's calls opened so far."""
    return metric(c, "gpurent_reconciler_agent_connections_total")


def test_the_reconcilers_calls_to_an_agent_reuse_its_connection(new_cluster):
    """A create's PUT (and GETs, when its answer did not say running), and
    the next creates' on the same node, go over one kept-alive connection (the reconciler's agent_multi), not one each; an agent that
    has since closed it (idle past its connection_timeout_s) costs a new
    connection, never a failed call."""
    c = new_cluster(nodes={"MI450": 1}, options=OPTIONS, fleet_options={"connection_timeout_s": "1"})
    u = c.signup()
    c.topup(u, 100 * 1_000_000)
    calls0, opened0 = workload_calls(c), connections_opened(c)
    errors0 = metric(c, "gpurent_agent_call_errors_total")
    ids = [c.launch(u, cards=2) for _ in range(3)]
    calls, opened = workload_calls(c), connections_opened(c)
    made = sum(calls[m] - calls0[m] for m in calls)
    assert made >= 3, (calls0, calls)  # a PUT each
    assert opened - opened0 < made, (made, opened0, opened)
    # Idle past the agent's timeout, the kept connection is closed by the
    # agent; the next calls notice and connect again.
    time.sleep(2.5)
    ids.append(c.launch(u, cards=2))
    assert connections_opened(c) > opened
    assert all(c.instance(u, iid)["state"] == "running" for iid in ids)
    assert metric(c, "gpurent_agent_call_errors_total") == errors0
