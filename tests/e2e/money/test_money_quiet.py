"""test_money_quiet.py: money stays exact when nodes go quiet, clocks step
back, jobs exit early and one user's billing breaks. Each test runs the real
gpurentd with a real sim-fleet; a node goes quiet when its fleet process is
paused (SIGSTOP), so its agent accepts connections and answers nothing, as a
hung host does. The daemon runs on the testing clock except where a test
needs the agents' real time to meet it (exits).

Each test is a regression for one way the ledger broke (issue 9): a quiet
node's time billed past its last heartbeat and the ledger failing its own
check once the node was declared offline; a backward clock step doing the
same at a stop; one user's failing billing stopping billing for everyone;
an exited job billed until the next sweep; a node's last good reply
recorded as later than it came, when the clock moved while its heartbeat
pass still waited on a slower node. And the unreachable stage: a blip
keeps the job and bills only confirmed time, a silence past
node_lost_after_s loses the instance without double billing."""
import json
import os
import re
import sqlite3

from agent_util import poll
from harness import START_TIME
from inventory_util import FakeAgent, register, wait_state
from money_util import MICRO, PRICE, accrue, micro, new_cluster, quiet  # noqa: F401 (a fixture)

T0 = START_TIME
DEADLINE = 60  # bound on polls, generous for sanitizer builds
# A paused agent costs a heartbeat its whole timeout: keep it short.
QUIET = {"agent_timeout_ms": "400", "agent_connect_timeout_ms": "300", "heartbeat_interval_ms": "100"}


def charged(c, user):
    """What the user finally paid for usage: charges less refunds, from the ledger."""
    rows = c.d.sql(
        "SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t"
        " ON t.id = p.transaction_id JOIN ledger_accounts a ON a.id = p.account_id"
        " WHERE t.kind IN ('usage', 'refund') AND t.user_id = ? AND a.kind IN ('cash', 'grant')", (user.id,))
    return rows[0][0]


def refunds(c, user):
    return c.d.sql("SELECT t.interval_id, p.account_id, p.amount FROM ledger_transactions t"
                   " JOIN ledger_postings p ON p.transaction_id = t.id WHERE t.kind = 'refund' AND t.user_id = ?"
                   " ORDER BY p.id", (user.id,))


def node_row(c):
    """(missed_beats, last_seen_at, state) of the cluster's one node."""
    return c.d.sql("SELECT l.missed_beats, l.last_seen_at, s.state FROM node_liveness l JOIN node_states s"
                   " ON s.node_id = l.node_id")[0]


def beat_at(c, t):
    """Waits for a good heartbeat recorded at clock time t."""
    poll(lambda: node_row(c)[0] == 0 and node_row(c)[1] == t, DEADLINE, f"a heartbeat at {t}")


def renter(c):
    """A user with 100.00 of cash running 8 x MI450 from the clock's value."""
    u = c.signup()
    c.topup(u, 100 * MICRO)
    return u, c.launch(u)


def sql_write(c, query, params=()):
    """Writes to the live database beside the daemon, as an operator's
    sqlite3 would (WAL: the daemon's readers and writers carry on)."""
    con = sqlite3.connect(c.d.db_path, timeout=10)
    try:
        with con:
            con.execute(query, params)
    finally:
        con.close()


def agent_workloads(c):
    """The workload ids the cluster's one node's agent holds, asked directly."""
    f = c.fleets[0]
    (name,) = f.parse()
    with open(os.path.join(f.state_dir, "nodes", name, "registration.json")) as fh:
        secret = json.load(fh)["secret"]
    r = f.request(name, secret, "GET", "/v1/workloads")
    assert r.status_code == 200, r.text
    return [w["id"] for w in r.json()["workloads"]]


def held(c, iid):
    return c.d.sql("SELECT count(*) FROM node_cards WHERE instance_id = ?", (iid,))[0][0]


def workload_ids(c, iid):
    return [r[0] for r in c.d.sql("SELECT workload_id FROM instance_nodes WHERE instance_id = ? ORDER BY rank",
                                  (iid,))]


def test_node_declared_offline_is_billed_to_its_last_heartbeat(new_cluster):
    """Regression: the quiet node's instance was charged up to now by a
    billing run, then closed at the last heartbeat when the node went
    offline, and the difference was never given back (`ledger verify`:
    settled interval billed other than its tariff)."""
    c = new_cluster(nodes={"MI450": 1}, options={**QUIET, "node_lost_after_s": "0"})
    u, iid = renter(c)
    c.d.set_clock(T0 + 1800)
    beat_at(c, T0 + 1800)
    with quiet(c.fleets[0]):
        c.d.set_clock(T0 + 3600)
        c.billing()  # whether or not a beat was missed yet, nothing past 1800 may stick
        c.wait_state(u, iid, "lost", timeout=DEADLINE)
        c.billing()
        assert [r[:4] for r in c.intervals(iid)] == [(T0, T0 + 1800, accrue(PRICE["MI450"], 8, 1800), 1)]
        assert charged(c, u) == accrue(PRICE["MI450"], 8, 1800)
        assert held(c, iid) == 0
        c.verify()


def test_quiet_node_is_billed_again_once_it_answers(new_cluster):
    """A node that misses beats (but not enough to be unreachable) is billed
    only to its last good heartbeat, by billing runs and in the balance;
    when it answers again the whole interval is known to have run."""
    c = new_cluster(nodes={"MI450": 1}, options={**QUIET, "heartbeat_miss_limit": "100"})
    u, iid = renter(c)
    c.d.set_clock(T0 + 1800)
    beat_at(c, T0 + 1800)
    with quiet(c.fleets[0]):
        c.d.set_clock(T0 + 3600)
        poll(lambda: node_row(c)[0] >= 1, DEADLINE, "a missed heartbeat")
        c.billing()
        assert charged(c, u) == accrue(PRICE["MI450"], 8, 1800)
        assert c.balance(u)["unbilled"] == 0
        assert c.instance(u, iid)["state"] == "running"
    beat_at(c, T0 + 3600)
    c.billing()
    assert charged(c, u) == accrue(PRICE["MI450"], 8, 3600)
    assert [r[:2] for r in c.intervals(iid)] == [(T0, None)]
    c.stop(u, iid)
    c.billing()
    assert charged(c, u) == accrue(PRICE["MI450"], 8, 3600)


def replies_unrecorded(c):
    """Good facts replies the heartbeat has taken in but not yet written:
    the replies /metrics counts as they arrive, less those of the passes
    whose end (after their write) the debug log shows."""
    metrics = c.d.get("/metrics", key=c.d.admin_key).text
    taken = sum(int(n) for n in re.findall(r"^gpurent_heartbeat_replies_total\{kind=\"\w+\"\} (\d+)$", metrics, re.M))
    written = sum(int(n) for n in re.findall(r"heartbeat: pass over \d+ nodes(?: \(new\))?: (\d+) answered",
                                             c.d.stderr_text()))
    return taken - written


def test_beat_taken_before_the_clock_moved_is_recorded_at_its_pass(new_cluster):
    """Regression: a heartbeat pass writes its replies only once its slowest
    node answers or times out, and recorded every good reply as seen at
    that moment. A node that answered, fell silent while the pass still
    waited on another one, and the clock moved on meanwhile, was recorded
    as last seen after it went silent, and its instance billed for that
    silence for good (the interval closed there). Here another node holds
    the pass (a fake agent that answers nothing until released) while the
    clock moves and the node running the instance dies. Billing in that
    moment charges up to now, as for any node that has missed no beat
    yet; the close at the last good beat gives the rest back."""
    c = new_cluster(nodes={"MI450": 1}, options={**QUIET, "agent_timeout_ms": "60000", "node_lost_after_s": "600",
                                                 "log_level": "debug"})
    u, iid = renter(c)
    slow = FakeAgent(model="H100-SXM", name="slow")
    try:
        n, slow.secret = register(c.d, "slow", slow.url, model="H100-SXM")
        wait_state(c.d, n["id"], "ready", DEADLINE)
        [(node_id,)] = c.d.sql("SELECT id FROM nodes WHERE gpu_model = 'MI450'")

        def row():
            return c.d.sql("SELECT missed_beats, last_seen_at FROM node_liveness WHERE node_id = ?", (node_id,))[0]
        c.d.set_clock(T0 + 600)
        poll(lambda: row() == (0, T0 + 600), DEADLINE, "a heartbeat at T0 + 600")

        # The next pass asks both nodes and waits on the slow one; the
        # instance's node answers it at T0 + 600.
        def facts_asked():
            with slow.lock:
                return sum(path.endswith("/v1/facts") for _, path, _ in slow.requests)
        slow.mode = "hang"
        asked = facts_asked()
        poll(lambda: facts_asked() > asked, DEADLINE, "a pass waiting on the slow node")
        poll(lambda: replies_unrecorded(c) == 1, DEADLINE, "the instance's node to answer that pass")
        c.d.set_clock(T0 + 900)
        f = c.fleets[0]
        port = f.base_url.rsplit(":", 1)[1]  # the node is registered at it
        f.proc.kill()
        f.proc.wait(timeout=30)
        # No miss is written before the pass ends: billing takes the node
        # for running, up to now, until the close gives the silence back.
        c.billing()
        assert charged(c, u) == accrue(PRICE["MI450"], 8, 900)
        slow.mode = "facts"
        slow.release.set()
        c.wait_state(u, iid, "unreachable", timeout=DEADLINE)
        assert row()[1] == T0 + 600
        assert c.intervals(iid) == [(T0, T0 + 600, accrue(PRICE["MI450"], 8, 600), 0, "node unreachable")]
        assert sum(a for _, acct, a in refunds(c, u) if acct != "revenue") == accrue(PRICE["MI450"], 8, 300)
        c.billing()
        assert charged(c, u) == accrue(PRICE["MI450"], 8, 600)
        # Back on its port with the job still there: billed again from then.
        f.args[f.args.index("--listen") + 1] = f"127.0.0.1:{port}"
        f.start()
        c.wait_state(u, iid, "running", timeout=DEADLINE)
        assert [r[:2] for r in c.intervals(iid)] == [(T0, T0 + 600), (T0 + 900, None)]
        c.stop(u, iid)
        c.billing()
        assert charged(c, u) == accrue(PRICE["MI450"], 8, 600)
    finally:
        slow.close()


def test_short_blip_keeps_the_job_and_bills_only_confirmed_time(new_cluster):
    """Past heartbeat_miss_limit the node is unreachable and so is the
    instance: billing stops at the last good heartbeat, the cards and the
    workload stay. The node answers within node_lost_after_s with the job
    still running: the instance runs on, billed from when it is seen
    running again; the silent gap is never billed."""
    c = new_cluster(nodes={"MI450": 1}, options={**QUIET, "node_lost_after_s": "600"})
    u, iid = renter(c)
    workloads = workload_ids(c, iid)
    c.d.set_clock(T0 + 600)
    beat_at(c, T0 + 600)
    with quiet(c.fleets[0]):
        c.d.set_clock(T0 + 900)
        i = c.wait_state(u, iid, "unreachable", timeout=DEADLINE)
        assert "not billed until it answers again" in i["state_reason"], i
        assert node_row(c)[2] == "unreachable"
        # The admins' node list finds it by that state, and only it.
        for state, want in (("unreachable", 1), ("ready", 0)):
            r = c.d.get("/v1/admin/nodes", key=c.d.admin_key, params={"state": state})
            assert r.status_code == 200, r.text
            assert [n["state"] for n in r.json()["data"]] == [state] * want, r.text
        assert c.intervals(iid) == [(T0, T0 + 600, 0, 0, "node unreachable")]
        assert held(c, iid) == 8
        c.billing()
        assert charged(c, u) == accrue(PRICE["MI450"], 8, 600)
        # Nothing new lands on an unreachable node.
        other = c.signup()
        c.topup(other, 100 * MICRO)
        r = c.create(other, cards=1)
        assert r.status_code == 409 and r.json()["error"]["code"] == "insufficient_capacity", r.text
        c.d.set_clock(T0 + 1200)
    i = c.wait_state(u, iid, "running", timeout=DEADLINE)
    assert i["state_reason"] == "every node answers again and the workload kept running", i
    assert workload_ids(c, iid) == workloads == agent_workloads(c)  # the same job, not a new one
    assert [r[:2] for r in c.intervals(iid)] == [(T0, T0 + 600), (T0 + 1200, None)]
    states = [e["state"] for e in c.events(u, iid)]
    assert states[-2:] == ["unreachable", "running"], states
    c.d.set_clock(T0 + 1800)
    c.stop(u, iid)
    c.billing()
    assert charged(c, u) == 2 * accrue(PRICE["MI450"], 8, 600)
    assert refunds(c, u) == []


def test_silence_past_node_lost_after_s_loses_the_instance_once(new_cluster):
    """A node silent for longer than node_lost_after_s is offline: the
    instance is lost, its cards freed, billed to the last good heartbeat
    and not a second more; when the node returns its workload is deleted,
    and starting the instance again bills only the new run."""
    c = new_cluster(nodes={"MI450": 1}, options={**QUIET, "node_lost_after_s": "600"})
    u, iid = renter(c)
    c.d.set_clock(T0 + 300)
    beat_at(c, T0 + 300)
    with quiet(c.fleets[0]):
        c.d.set_clock(T0 + 600)
        c.wait_state(u, iid, "unreachable", timeout=DEADLINE)
        c.d.set_clock(T0 + 300 + 600)  # the last good beat is node_lost_after_s old
        i = c.wait_state(u, iid, "lost", timeout=DEADLINE)
        assert "did not answer for 600s" in i["state_reason"], i
        assert node_row(c)[2] == "offline"
        assert held(c, iid) == 0
    poll(lambda: node_row(c)[2] == "ready", DEADLINE, "the node to answer again")
    poll(lambda: agent_workloads(c) == [], DEADLINE, "the lost instance's workload to be deleted")
    c.billing()
    assert charged(c, u) == accrue(PRICE["MI450"], 8, 300)
    assert c.start(u, iid).status_code == 200
    c.wait_state(u, iid, "running")
    c.d.set_clock(T0 + 1500)
    c.stop(u, iid)
    c.billing()
    assert charged(c, u) == accrue(PRICE["MI450"], 8, 300) + accrue(PRICE["MI450"], 8, 600)


def test_clock_stepped_back_refunds_to_where_the_money_came_from(new_cluster):
    """Regression: a billing run charges two hours, the clock steps back an
    hour, and the user stops: the interval ends an hour in, and the hour
    charged past it comes back as a refund naming the interval, to the
    accounts that paid, the last drawn first (cash, then the trial credit)."""
    c = new_cluster(nodes={"MI450": 1})
    u = c.signup()  # 10.00 of trial credit
    c.topup(u, 20 * MICRO)
    iid = c.launch(u)
    c.d.set_clock(T0 + 7200)
    c.billing()
    two_hours = accrue(PRICE["MI450"], 8, 7200)  # 19.20: 10.00 credit, 9.20 cash
    assert charged(c, u) == two_hours
    c.d.set_clock(T0 + 3600)
    c.stop(u, iid)
    c.billing()
    one_hour = accrue(PRICE["MI450"], 8, 3600)
    assert charged(c, u) == one_hour
    (interval_id,) = c.d.sql("SELECT id FROM running_intervals WHERE instance_id = ?", (iid,))[0]
    back = refunds(c, u)
    assert [(iv, acct.split(":")[0], amount) for iv, acct, amount in back] == [
        (interval_id, "cash", 9_200_000), (interval_id, "grant", 400_000), (interval_id, "revenue", -9_600_000)]
    b = c.balance(u)
    assert b["cash"] == 20 * MICRO and b["credit"] == 10 * MICRO - one_hour
    (statement,) = c.transactions(u, kind="refund")  # the user's statement shows it
    assert (statement["kind"], statement["instance_id"]) == ("refund", iid), statement
    # The usage the user reads is what they were finally charged.
    r = c.d.get("/v1/usage", key=u.key, params={"from": "2000-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"})
    assert r.status_code == 200, r.text
    ((row,),) = [[x for x in r.json()["data"] if x["instance_id"] == iid]]
    assert micro(row["cost"]) == one_hour and micro(row["paid_by_cash"]) == 0, row
    c.verify()


def test_one_users_failing_billing_leaves_everyone_else_billed(new_cluster):
    """Regression: one user's posting failed (here, a price row written
    before prices had bounds, whose cost overflows), the whole batch rolled
    back and nobody was billed, a trial user ran for free and the admin's
    billing run answered 503. Now that user is skipped, logged once,
    counted, and shown in /readyz when it repeats; everyone else is billed
    and stopped when their funds run out."""
    c = new_cluster(nodes={"MI450": 1, "MI300X": 1})
    a = c.signup()
    c.topup(a, 100 * MICRO)
    b = c.signup()  # a trial user: 10.00
    ia = c.launch(a, gpu="MI300X")
    ib = c.launch(b)
    sql_write(c, "INSERT INTO prices (gpu_model, effective_at, card_hour, created_at) VALUES (?, ?, ?, ?)",
                  ("MI300X", T0 + 1, 2**63 - 1, T0))
    c.d.set_clock(T0 + 3600)
    r = c.billing()
    assert r["users_failed"] == 1, r
    assert charged(c, b) == accrue(PRICE["MI450"], 8, 3600)
    assert charged(c, a) == 0
    c.d.set_clock(T0 + 7200)
    r = c.billing()
    assert r["users_failed"] == 1, r
    # 8 x 1.20 an hour: the 10.00 of credit covers exactly 3 750 s.
    c.wait_state(b, ib, "stopped")
    assert charged(c, b) == 10 * MICRO == accrue(PRICE["MI450"], 8, 3750)
    assert [r[:2] for r in c.intervals(ib)] == [(T0, T0 + 3750)]
    log = c.d.stderr_text()
    assert log.count(f"billing: cannot bill user {a.id}") == 1, log
    ready = c.d.get("/readyz").json()
    assert ready["status"] == "ready" and ready["checks"]["billing"] == {
        "status": "failing", "users_failing": 1, "users_failing_repeatedly": 1}, ready
    metrics = c.d.get("/metrics", key=c.d.admin_key).text
    assert "gpurent_billing_users_failing 1\n" in metrics
    assert "gpurent_billing_user_failures_total 2\n" in metrics
    sql_write(c, "DELETE FROM prices WHERE gpu_model = 'MI300X' AND effective_at = ?", (T0 + 1,))
    r = c.billing()
    assert r["users_failed"] == 0, r
    assert charged(c, a) == accrue(PRICE["MI300X"], 8, 7200)
    assert f"billing: user {a.id} is billed again after 2 failed passes" in c.d.stderr_text()
    assert c.d.get("/readyz").json()["checks"]["billing"]["status"] == "ok"
    c.stop(a, ia)


def test_exited_job_is_billed_to_its_exit_second(new_cluster):
    """Regression: a job that exited after 3 s was billed until the next
    sweep noticed (26 s more). The agent reports the exit second, the
    heartbeat sees the node's count of exits change, and the reconciler
    ends the run there: with the sweep an hour away, the run still ends
    within seconds, billed to the exit second and never past it. Runs on
    the real clock, which the agents' exit times are on."""
    c = new_cluster(nodes={"MI450": 1}, clock=None, options={"reconcile_sweep_ms": "3600000"})
    r = c.admin("POST", "/v1/admin/images", json={"ref": "example/exit-after-3000:1", "stack": "ROCm"})
    assert r.status_code == 201, r.text
    u = c.signup()
    r = c.d.post("/v1/instances", key=u.key,
                 json={"gpu_type": "MI450", "card_count": 8, "image": "example/exit-after-3000:1"})
    assert r.status_code == 201, r.text
    iid = r.json()["id"]
    i = c.wait_state(u, iid, "succeeded", timeout=DEADLINE)
    assert "workload exited" in i["state_reason"], i
    ((start, end, _, _, reason),) = c.intervals(iid)
    assert reason.startswith("workload exited"), reason
    # The daemon saw it running at most a pass after the agent did; it ran 3 s there.
    assert 0 <= end - start <= 3, (start, end)
    c.billing()
    assert charged(c, u) == accrue(PRICE["MI450"], 8, end - start)
    assert held(c, iid) == 0


def test_a_node_whose_hardware_no_longer_matches_gets_the_grace_of_a_silent_one(new_cluster):
    """A node that comes back reporting 4 cards where 8 were registered (a
    card lost to a driver reload) is refused, not put in service. It
    answers, and its workloads may still run: its instances are unreachable
    (unbilled) and say why, and are lost only node_lost_after_s after its
    last accepted report, saying so, not that it "did not answer"."""
    c = new_cluster(nodes={"MI450": 1}, options={**QUIET, "node_lost_after_s": "600"})
    u, iid = renter(c)
    c.d.set_clock(T0 + 300)
    beat_at(c, T0 + 300)
    f = c.fleets[0]
    port = f.base_url.rsplit(":", 1)[1]  # the node is registered at it
    f.proc.kill()
    f.proc.wait()
    f.args[f.args.index("--cards") + 1] = "4"
    f.args[f.args.index("--listen") + 1] = f"127.0.0.1:{port}"
    f.start(expect_ready=False)
    try:
        poll(lambda: node_row(c)[2] == "rejected", DEADLINE, "the node to be refused")
        c.d.set_clock(T0 + 600)
        c.d.post("/v1/admin/billing/run", key=c.d.admin_key, json={})
        i = c.wait_state(u, iid, "unreachable", timeout=DEADLINE)
        assert held(c, iid) == 8 and c.intervals(iid)[0][:2] == (T0, T0 + 300)
        c.d.set_clock(T0 + 300 + 600)
        i = c.wait_state(u, iid, "lost", timeout=DEADLINE)
        assert "reported hardware that no longer matches its registration for 600s" in i["state_reason"], i
        c.billing()
        assert charged(c, u) == accrue(PRICE["MI450"], 8, 300)
    finally:
        f.stop()
