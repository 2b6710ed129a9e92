"""test_apps_health.py: replicas are health-checked through their agent
(issue 17, migration 0027). An app's health_path defaults to /health and
can be changed; each replica's workload carries a health check of the
app's port and path; GET /v1/apps/{slug} shows each replica's health; the
gateways' signed copy lists only replicas their agent reports healthy. A
replica whose server turns unwell (sim-model-server --unwell-file: /health
503 and no longer listening) is dropped from the copy, an event on the app
says so, and every later call is served by the healthy replica (a call
sent to the unwell one could not succeed: nothing of it listens). In the
seconds before the copy drops it, a gateway whose call a replica fails
before answering a byte sends the call to another one instead of answering 502."""
import os

from agent_util import poll
from apps_util import DEADLINE, assert_ledger_ok, free_port

CHAT = "/v1/chat/completions"


def copy_replicas(m, app_id):
    """The app's replicas in the gateways' signed state, in its order."""
    r = m.signed("GET", "/internal/gateway/state")
    assert r.status_code == 200, r.text
    app = [a for a in r.json()["apps"] if a["id"] == app_id]
    return app[0]["replicas"] if app else []


def publish_two_that_can_turn_unwell(m, pub):
    """An app of two replicas whose servers turn unwell (turn_unwell):
    (model port, command, app)."""
    port = free_port()
    cmd = m.model_command(port) + ["--unwell-file", "unwell"]
    return port, cmd, m.publish(pub, model_port=port, command=cmd, min_replicas=2, max_replicas=2,
                                concurrency_target=100)


def turn_unwell(m, instance_id):
    """The replica's sim model server answers /health 503 and stops listening."""
    (wl, name), = m.d.sql("SELECT p.workload_id, n.name FROM instance_nodes p JOIN nodes n ON n.id = p.node_id"
                          " WHERE p.instance_id = ?", [instance_id])
    container = os.path.join(m.node_fleet(name).state_dir, "nodes", name, "containers", wl)
    with open(os.path.join(container, "unwell"), "w"):
        pass


def state_replicas(m, app_id):
    return sorted(x["instance_id"] for x in copy_replicas(m, app_id))


def test_health_path_default_and_patch(market):
    m = market
    pub = m.user()
    app = m.publish(pub)
    assert app["health_path"] == "/health"
    r = m.d.request("PATCH", f"/v1/apps/{app['slug']}", key=pub.key, json={"health_path": "/ready?deep=1"})
    assert r.status_code == 200, r.text
    assert m.d.get(f"/v1/apps/{app['slug']}", key=pub.key).json()["health_path"] == "/ready?deep=1"


def test_unwell_replica_loses_its_calls_to_the_healthy_one(market):
    m = market
    m.fleet(2)
    pub, con = m.user(), m.user()
    port, cmd, app = publish_two_that_can_turn_unwell(m, pub)
    slug, app_id = app["slug"], app["id"]
    gw = m.gateway()

    def two_healthy():
        reps = [x for x in m.d.get(f"/v1/apps/{slug}", key=pub.key).json()["replicas"] if x["state"] == "running"]
        ids = [x["instance_id"] for x in reps]
        return reps if len(reps) == 2 and all(x["health"] == "healthy" for x in reps) and \
            state_replicas(m, app_id) == sorted(ids) else None
    reps = poll(two_healthy, DEADLINE, "two healthy replicas in the gateway copy")
    # Each replica's workload carries the app's health check.
    for rep in reps:
        (wl, name), = m.d.sql("SELECT p.workload_id, n.name FROM instance_nodes p JOIN nodes n ON n.id = p.node_id"
                              " WHERE p.instance_id = ?", [rep["instance_id"]])
        spec = m.record(name, wl)["spec"]
        assert spec["health"] == {"port": port, "path": "/health", "interval_s": 2}, spec
        assert spec["command"] == cmd

    for _ in range(4):
        r = gw.call(slug, CHAT, con.key, json={"messages": [{"role": "user", "content": "before"}]})
        assert r.status_code == 200, r.text

    bad, good = reps[0]["instance_id"], reps[1]["instance_id"]
    turn_unwell(m, bad)

    poll(lambda: state_replicas(m, app_id) == [good], DEADLINE, "the unwell replica to leave the gateway copy")
    got = m.d.get(f"/v1/apps/{slug}", key=pub.key).json()
    health = {x["instance_id"]: x["health"] for x in got["replicas"]}
    assert health[bad] == "unhealthy" and health[good] == "healthy", got["replicas"]
    ev = [e for e in got["events"] if e["kind"] == "replica_unhealthy"]
    assert ev and bad in ev[-1]["detail"] and "/health" in ev[-1]["detail"], got["events"]
    # The instance itself still runs: health is not a failure of the workload.
    assert m.d.sql("SELECT state FROM instances WHERE id = ?", [bad]) == [("running",)]

    # After the gateway's next sync, every call goes to the healthy replica.
    def gateway_synced():
        r = gw.call(slug, CHAT, con.key, json={"messages": [{"role": "user", "content": "probe"}]})
        return r.status_code == 200
    poll(gateway_synced, DEADLINE, "a call served after the sync")
    for i in range(10):
        r = gw.call(slug, CHAT, con.key, json={"messages": [{"role": "user", "content": f"after {i}"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == f"after {i}"


def test_refused_connection_goes_to_another_replica(market):
    """The gateway's copy still lists a replica whose server stopped
    listening (its next sync is ten minutes away): every call is still answered,
    by the other replica, and each is charged once."""
    import requests
    m = market
    m.fleet(2)
    pub, con = m.user(), m.user()
    _, _, app = publish_two_that_can_turn_unwell(m, pub)
    slug, app_id = app["slug"], app["id"]

    reps = poll(lambda: (lambda reps: reps if len(reps) == 2 else None)(copy_replicas(m, app_id)), DEADLINE,
                "two healthy replicas in the gateway copy")
    gw = m.gateway(sync_ms=600_000)
    # With no call outstanding the gateway takes the first replica its copy
    # lists: that one stops listening, so the first call is failed unanswered.
    bad, good = reps[0], reps[1]
    turn_unwell(m, bad["instance_id"])

    def refused():
        try:
            requests.get(bad["url"] + "/health", timeout=5)
            return False
        except requests.ConnectionError:
            return True
    poll(refused, DEADLINE, "the unwell replica to stop listening")

    for i in range(6):
        r = gw.call(slug, CHAT, con.key, json={"messages": [{"role": "user", "content": f"call {i}"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == f"call {i}"
    # The published port's relay accepts and closes: nothing answered.
    assert f"replica {bad['instance_id']} of app {app_id} failed a call unanswered" in gw.text()
    assert f"it goes to replica {good['instance_id']}" in gw.text()
    calls = m.wait_calls(app_id, 6)
    assert len(calls) == 6 and all(c[1] == 200 and c[8] == 1 for c in calls), calls
    assert_ledger_ok(m)


def test_replicas_on_one_node_each_answer_their_own_calls(market):
    """Two replicas of one app on one sim node both listen on the app's
    port (the sim shares the host's network; each binds a loopback address
    of its own). A call through a replica's published port, and its health
    check, must reach that replica's process and no other: were it the
    other's, a scale-down removing that one would cut a call the gateway
    counted on the one kept, and one replica's health would be the
    other's."""
    import requests
    m = market
    m.fleet(1)
    pub = m.user()
    port = free_port()
    app = m.publish(pub, model_port=port, min_replicas=2, max_replicas=2, concurrency_target=100)
    slug, app_id = app["slug"], app["id"]

    reps = poll(lambda: (lambda reps: reps if len(reps) == 2 else None)(copy_replicas(m, app_id)), DEADLINE,
                "two healthy replicas in the gateway copy")
    nodes = {n for (n,) in m.d.sql("SELECT DISTINCT node_id FROM instance_nodes p JOIN instances i"
                                   " ON i.id = p.instance_id WHERE i.app_id = ?", [app_id])}
    assert len(nodes) == 1, nodes
    for rep in reps:
        (wl,), = m.d.sql("SELECT workload_id FROM instance_nodes WHERE instance_id = ?", [rep["instance_id"]])
        for i in range(12):
            r = requests.post(rep["url"] + CHAT, json={"messages": [{"role": "user", "content": f"hello {i}"}]},
                              timeout=30)
            assert r.status_code == 200, r.text
            assert r.headers.get("X-Sim-Workload") == wl, (rep, r.headers)
