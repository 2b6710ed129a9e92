"""test_inventory.py: the GPU inventory end to end, with the real gpurentd and
real gpurent-agent processes in sim mode (single nodes and sim-fleets), plus
a misbehaving agent written in Python (inventory_util.FakeAgent).

What is shown: registering nodes (the secret is shown once and stored);
GET /v1/gpu-types counting exactly the cards of the nodes in service; a
killed agent's node going offline and its cards leaving the free pool, and
coming back when it returns; cordon, drain, maintenance and ready; failed
cards; facts that disagree with what the admin declared; removing nodes with
and without work; listing with filters and pages; validation of the admin
bodies and queries (a refusal changes nothing); admin routes refused to
users; and agents that hang, fail, send garbage or 10 MB, which must neither
block nor crash the daemon.

Heartbeats run every 100 ms here, and every wait polls with a deadline. To
tell that a heartbeat happened without sleeping, a test moves the testing
clock and waits for last_seen_at to show the new time (wait_beat).
"""
import json
import re
import time

import pytest
import requests

from agent_util import Agent, Fleet, poll
from harness import assert_error, route_table
from inventory_util import (FakeAgent, counts, facts_doc, free_port, gpu_type, iso, node, nodes, register,
                            set_state, wait_beat, wait_node, wait_state)

FAST = {"heartbeat_interval_ms": "100", "heartbeat_miss_limit": "2", "agent_connect_timeout_ms": "300",
        "agent_timeout_ms": "1000", "node_lost_after_s": "0"}
IMAGE = "rocm/pytorch:2.3-rocm6.2"
NODE_ID = re.compile(r"^node_[0-9a-z]{20}$")
SECRET = re.compile(r"^[0-9a-f]{64}$")
CATALOG = {"MI450", "MI300X", "MI250", "H100-SXM", "RTX4090"}


@pytest.fixture
def procs(tmp_path):
    """Starts agents, fleets and fake agents for a test and stops them after it."""
    class Procs:
        def __init__(self):
            self.fleets, self.agents, self.fakes = [], [], []

        def fleet(self, d, name, **kw):
            f = Fleet(tmp_path / name, d.base_url, admin_key=d.admin_key, **kw)
            self.fleets.append(f)
            return f

        def agent(self, name, **kw):
            a = Agent(tmp_path / name, **kw)
            self.agents.append(a)
            return a

        def fake(self, mode="facts", **kw):
            fa = FakeAgent(mode, **kw)
            self.fakes.append(fa)
            return fa

    p = Procs()
    yield p
    errors = []
    for f in p.fleets:
        if f.proc and f.proc.poll() is None:
            try:
                f.stop()
            except AssertionError as e:
                errors.append(str(e))
    for a in p.agents:
        try:
            a.stop()
        except AssertionError as e:
            errors.append(str(e))
    for fa in p.fakes:
        fa.close()
    assert not errors, "\n".join(errors)


def kill(fleet):
    fleet.proc.kill()
    fleet.proc.wait(timeout=30)


def ids_of(fleet):
    return [n["id"] for n in fleet.nodes.values()]


def wait_all(d, node_ids, state, timeout=20):
    return [wait_state(d, i, state, timeout) for i in node_ids]


def user_with_funds(d):
    u = d.signup()
    r = d.post(f"/v1/admin/users/{u.id}/topups", key=d.admin_key,
               json={"amount": "1000.00", "payment_id": f"pay-{u.id}"})
    assert r.status_code == 201, r.text
    return u


def live_nodes(d):
    return d.sql("SELECT count(*) FROM nodes WHERE removed_at IS NULL")[0][0]


# ---------------------------------------------------------------- registration and counts


def test_register_shows_the_secret_once_and_stores_it(new_daemon):
    d = new_daemon()
    labels = {"rack": "r12", "Owner": "ops-team"}
    r = d.post("/v1/admin/nodes", key=d.admin_key,
               json={"name": "gpu-01.dc1", "agent_url": "http://127.0.0.1:1/nodes/gpu-01", "gpu_model": "MI450",
                     "card_count": 8, "fabric": "ib-east", "region": "cn-north", "labels": labels})
    assert r.status_code == 201, r.text
    body = r.json()
    assert set(body) == {"node", "secret"}
    secret, n = body["secret"], body["node"]
    assert SECRET.match(secret), secret
    assert NODE_ID.match(n["id"]), n
    assert {k: n[k] for k in ("name", "agent_url", "gpu_model", "card_count", "fabric", "region", "labels")} == {
        "name": "gpu-01.dc1", "agent_url": "http://127.0.0.1:1/nodes/gpu-01", "gpu_model": "MI450", "card_count": 8,
        "fabric": "ib-east", "region": "cn-north", "labels": labels}
    # Never reached: pending, no cards counted yet.
    assert n["state"] == "pending" and n["health"] == "unknown" and n["admin_state"] == "active", n
    assert (n["cards_total"], n["cards_free"], n["cards_in_use"]) == (0, 0, 0)
    assert "secret" not in n
    # Stored, so the heartbeat loop can sign with it ...
    assert d.sql("SELECT name, secret, gpu_model, card_count, labels FROM nodes WHERE id = ?", (n["id"],)) == [
        ("gpu-01.dc1", secret, "MI450", 8, json.dumps(labels, sort_keys=True, separators=(",", ":")))]
    # ... but never shown again.
    for path in (f"/v1/admin/nodes/{n['id']}", "/v1/admin/nodes"):
        r = d.get(path, key=d.admin_key)
        assert r.status_code == 200, r.text
        assert secret not in r.text and '"secret"' not in r.text
    # Each node has its own secret; defaults for fabric and region.
    r = d.post("/v1/admin/nodes", key=d.admin_key,
               json={"name": "gpu-02", "agent_url": "http://127.0.0.1:1", "gpu_model": "MI300X", "card_count": 4})
    assert r.status_code == 201, r.text
    assert r.json()["secret"] != secret
    assert (r.json()["node"]["fabric"], r.json()["node"]["region"], r.json()["node"]["labels"]) == (
        "default", "default", {})
    assert live_nodes(d) == 2


def test_registration_polls_the_new_node_at_once(new_daemon, procs):
    # A period far longer than the test: only the wake a registration sends
    # can bring the node up. The node registered first never answers; the
    # poll at the second registration asks it too, and a node polled that
    # early may simply not have its secret yet, so that failure is not
    # counted (with heartbeat_miss_limit=1 it would make the node offline).
    d = new_daemon(options={"heartbeat_interval_ms": "600000", "heartbeat_miss_limit": "1", "log_level": "debug"})
    # The start-up's full pass (which counts failures) is over before the
    # first registration, however slowly a loaded machine gets to it.
    d.wait_for_log(r"heartbeat: pass over 0 nodes: ")
    silent, _ = register(d, "silent", f"http://127.0.0.1:{free_port()}")
    fa = procs.fake("facts", name="prompt")
    n, secret = register(d, "prompt", fa.url)
    fa.secret = secret
    up = wait_state(d, n["id"], "ready", 10)
    assert (up["cards_total"], up["cards_free"]) == (8, 8)
    s = node(d, silent["id"])
    assert (s["state"], s["missed_heartbeats"]) == ("pending", 0), s


def test_unreachable_node_goes_offline_with_a_reason(new_daemon):
    d = new_daemon(options=FAST)
    n, _ = register(d, "nowhere", f"http://127.0.0.1:{free_port()}")
    off = wait_state(d, n["id"], "offline")
    assert off["health"] == "offline" and off["missed_heartbeats"] >= 2, off
    assert off["state_reason"].startswith("agent unreachable:"), off
    assert off["last_seen_at"] is None
    assert counts(d, "MI450") == (0, 0, 0)


def test_gpu_types_is_public_and_counts_exactly_the_cards(new_daemon, procs):
    d = new_daemon(options=FAST)
    before = {t["code"]: t for t in d.get("/v1/gpu-types").json()["data"]}
    assert set(before) == CATALOG
    assert all((t["cards_total"], t["cards_free"], t["cards_in_use"]) == (0, 0, 0) for t in before.values())

    a = procs.fleet(d, "mi450", nodes=3, model="MI450", cards=8)
    b = procs.fleet(d, "mi300x", nodes=2, model="MI300X", cards=4)
    assert [n["status"] for n in list(a.nodes.values()) + list(b.nodes.values())] == ["registered"] * 5
    wait_all(d, ids_of(a) + ids_of(b), "ready")

    r = d.get("/v1/gpu-types")  # no key: the console shows it before login
    assert r.status_code == 200, r.text
    types = {t["code"]: t for t in r.json()["data"]}
    assert set(types) == CATALOG
    got = {c: (t["cards_total"], t["cards_free"], t["cards_in_use"]) for c, t in types.items()}
    assert got == {"MI450": (24, 24, 0), "MI300X": (8, 8, 0), "MI250": (0, 0, 0), "H100-SXM": (0, 0, 0),
                   "RTX4090": (0, 0, 0)}
    mi450 = types["MI450"]
    assert (mi450["vendor"], mi450["memory_gb"], mi450["memory_type"], mi450["stack"]) == ("AMD", 192, "HBM3e", "ROCm")
    assert types["H100-SXM"]["reservation_required"] is True
    # The same numbers as the nodes' own.
    for n in nodes(d):
        assert (n["cards_total"], n["cards_free"], n["cards_in_use"]) == (n["card_count"],) * 2 + (0,), n
        assert n["driver_version"] == "6.8.5" and n["stack_version"] == "6.2.0", n
    detail = node(d, ids_of(b)[0])
    assert [(c["index"], c["model"], c["memory_gb"], c["healthy"], c["in_use"]) for c in detail["cards"]] == [
        (i, "MI300X", 96, True, False) for i in range(4)]
    # Any key or none sees the same; a query is refused.
    assert d.get("/v1/gpu-types", key=d.signup().key).json()["data"] == r.json()["data"]
    assert_error(d.get("/v1/gpu-types", params={"code": "MI450"}), 400, "invalid_query", "code")
    # Editing a type's description keeps its counts: they come from the cards.
    r = d.request("PUT", "/v1/admin/gpu-types/MI450", key=d.admin_key,
                  json={"vendor": "AMD", "memory_gb": 192, "memory_type": "HBM3e", "stack": "ROCm",
                        "description": "MI450, now with a longer description"})
    assert r.status_code == 200, r.text
    assert (r.json()["cards_total"], r.json()["cards_free"]) == (24, 24)
    assert gpu_type(d, "MI450")["description"] == "MI450, now with a longer description"


# ---------------------------------------------------------------- heartbeats


def test_killed_fleet_goes_offline_and_returns(new_daemon, procs):
    d = new_daemon(options=FAST)
    port = free_port()
    a = procs.fleet(d, "a", nodes=2, model="MI450", extra=("--listen", f"127.0.0.1:{port}"))
    other = procs.fleet(d, "other", nodes=1, model="MI450", extra=("--name-prefix", "other-"))
    wait_all(d, ids_of(a) + ids_of(other), "ready")
    assert counts(d, "MI450") == (24, 24, 0)

    kill(a)
    for n in wait_all(d, ids_of(a), "offline"):
        assert n["health"] == "offline" and n["missed_heartbeats"] >= 2, n
        assert n["state_reason"].startswith("agent unreachable:"), n
        assert (n["cards_total"], n["cards_free"]) == (8, 0), n
    # Its cards left the free count, not the total; the other node beats on.
    assert counts(d, "MI450") == (24, 8, 0)
    t = wait_beat(d, ids_of(other))
    assert node(d, ids_of(other)[0])["state"] == "ready"
    assert all(node(d, i)["last_seen_at"] != iso(t) for i in ids_of(a))
    assert {n["id"] for n in nodes(d, state="offline")} == set(ids_of(a))

    # Same command, same state directory: the fleet keeps its secrets and
    # the nodes come back.
    a.start()
    assert [n["status"] for n in a.nodes.values()] == ["kept", "kept"]
    for n in wait_all(d, ids_of(a), "ready"):
        assert n["state_reason"] == "" and n["missed_heartbeats"] == 0, n
        assert (n["cards_total"], n["cards_free"]) == (8, 8), n
    assert counts(d, "MI450") == (24, 24, 0)
    wait_beat(d, ids_of(a) + ids_of(other))


def test_admin_reason_survives_an_outage(new_daemon, procs):
    d = new_daemon(options=FAST)
    port = free_port()
    a = procs.fleet(d, "a", nodes=1, model="MI450", extra=("--listen", f"127.0.0.1:{port}"))
    [target] = ids_of(a)
    wait_all(d, [target], "ready")
    r = set_state(d, target, "cordoned", reason="firmware update on Tuesday")
    assert r.status_code == 200, r.text
    assert (r.json()["state_reason"], r.json()["admin_reason"]) == ("firmware update on Tuesday",) * 2

    # Offline: the heartbeats' reason shows, the admin's is kept beside it.
    kill(a)
    [off] = wait_all(d, [target], "offline")
    assert off["state_reason"].startswith("agent unreachable:"), off
    assert (off["admin_state"], off["admin_reason"]) == ("cordoned", "firmware update on Tuesday"), off

    # Back: cordoned again, and still saying why.
    a.start()
    [back] = wait_all(d, [target], "cordoned")
    assert (back["state_reason"], back["admin_reason"]) == ("firmware update on Tuesday",) * 2, back
    r = set_state(d, target, "ready")
    assert (r.json()["state"], r.json()["state_reason"], r.json()["admin_reason"]) == ("ready", "", "")


def one_agent(d, procs, name, model):
    """Registers node name (model, 8 cards) and starts a real agent with
    those cards for it on a free port: (the node, the agent)."""
    port = free_port()
    n, secret = register(d, name, f"http://127.0.0.1:{port}", model=model, cards=8)
    return n, procs.agent(name, secret=secret, node=name,
                          options={"listen": f"127.0.0.1:{port}", "inventory_model": model, "inventory_cards": "8"})


def test_single_agent_killed_and_restarted(new_daemon, procs, tmp_path):
    d = new_daemon(options=FAST)
    n, ag = one_agent(d, procs, "solo", "MI300X")
    wait_state(d, n["id"], "ready")
    assert counts(d, "MI300X") == (8, 8, 0)
    ag.kill()
    off = wait_state(d, n["id"], "offline")
    assert off["state_reason"].startswith("agent unreachable:"), off
    assert counts(d, "MI300X") == (8, 0, 0)
    ag.start()
    wait_state(d, n["id"], "ready")
    assert counts(d, "MI300X") == (8, 8, 0)


# ---------------------------------------------------------------- admin states


def test_cordon_drain_maintenance_and_ready(new_daemon, procs):
    d = new_daemon(options=FAST)
    f = procs.fleet(d, "f", nodes=2, model="MI450")
    target, other = ids_of(f)
    wait_all(d, ids_of(f), "ready")
    assert counts(d, "MI450") == (16, 16, 0)

    for state in ("cordoned", "draining", "maintenance"):
        r = set_state(d, target, state, reason=f"{state} for the test")
        assert r.status_code == 200, r.text
        n = r.json()
        assert (n["state"], n["admin_state"], n["state_reason"]) == (state, state, f"{state} for the test"), n
        assert (n["cards_total"], n["cards_free"], n["cards_in_use"]) == (8, 0, 0), n
        assert len(n["cards"]) == 8
        assert counts(d, "MI450") == (16, 8, 0)
        assert [x["id"] for x in nodes(d, state=state)] == [target]
        # Heartbeats keep coming and do not undo what the admin set.
        wait_beat(d, [target])
        assert node(d, target)["state"] == state
        assert node(d, other)["state"] == "ready"

    r = set_state(d, target, "ready")
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["admin_state"], r.json()["state_reason"]) == ("ready", "active", "")
    assert counts(d, "MI450") == (16, 16, 0)

    # Refusals change nothing.
    before = d.dump()
    for body, code, field in [({"state": "offline"}, "invalid_field", "state"),
                              ({"state": "rejected"}, "invalid_field", "state"),
                              ({"state": "pending"}, "invalid_field", "state"),
                              ({"state": "READY"}, "invalid_field", "state"),
                              ({"state": ""}, "invalid_field", "state"),
                              ({"state": 1}, "invalid_field", "state"),
                              ({}, "missing_field", "state"),
                              ({"state": "cordoned", "why": "x"}, "unknown_field", "why"),
                              ({"state": "cordoned", "reason": "x" * 201}, "invalid_field", "reason")]:
        assert_error(d.post(f"/v1/admin/nodes/{target}/state", key=d.admin_key, json=body), 400, code, field)
    assert_error(d.post(f"/v1/admin/nodes/{target}/state", key=d.admin_key, data=b"{", headers={
        "Content-Type": "application/json"}), 400, "malformed_json")
    for bad in ("node_00000000000000000000", "nope", "ins_00000000000000000000"):
        assert_error(set_state(d, bad, "cordoned"), 404, "not_found")
    assert d.dump() == before


def test_cordoned_and_draining_nodes_take_no_new_work(new_daemon, procs):
    d = new_daemon(options=FAST)
    f = procs.fleet(d, "f", nodes=2, model="MI450")
    a, b = ids_of(f)
    wait_all(d, [a, b], "ready")
    u = user_with_funds(d)
    assert set_state(d, a, "cordoned").status_code == 200
    assert set_state(d, b, "draining").status_code == 200
    assert counts(d, "MI450") == (16, 0, 0)
    before = d.sql("SELECT count(*) FROM instances")
    r = d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 1, "image": IMAGE})
    assert_error(r, 409, "insufficient_capacity", "card_count")
    assert d.sql("SELECT count(*) FROM instances") == before
    # Back in service, the same request is placed, on the node made ready.
    assert set_state(d, b, "ready").status_code == 200
    r = d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 2, "image": IMAGE})
    assert r.status_code == 201, r.text
    assert [x["node_id"] for x in r.json()["nodes"]] == [b]
    assert counts(d, "MI450") == (16, 6, 2)
    nb = node(d, b)
    assert (nb["cards_free"], nb["cards_in_use"]) == (6, 2)
    assert sum(c["instance_id"] == r.json()["id"] for c in nb["cards"]) == 2


def test_failed_cards_leave_the_free_pool_and_the_node_stays_ready(new_daemon, procs):
    d = new_daemon(options=FAST)
    f = procs.fleet(d, "f", nodes=2, model="MI450", options={"inventory_failed_cards": "1,6"})
    for n in wait_all(d, ids_of(f), "ready"):
        assert (n["cards_total"], n["cards_free"], n["cards_in_use"]) == (8, 6, 0), n
        failed = [(c["index"], c["health_reason"]) for c in node(d, n["id"])["cards"] if not c["healthy"]]
        assert failed == [(1, "uncorrectable ECC errors (configured failure)"),
                          (6, "uncorrectable ECC errors (configured failure)")]
    assert counts(d, "MI450") == (16, 12, 0)

    # A card failing while the node serves: the node stays ready throughout.
    fa = procs.fake("facts", name="live")
    n, secret = register(d, "live", fa.url)
    fa.secret = secret
    wait_state(d, n["id"], "ready")
    assert counts(d, "MI450") == (24, 20, 0)
    fa.facts = facts_doc("live", failed={3})
    seen = []

    def card_3_failed():
        cur = node(d, n["id"])
        seen.append(cur["state"])
        return cur if not cur["cards"][3]["healthy"] else None
    cur = poll(card_3_failed, 20, "card 3 to be reported failed")
    assert set(seen) == {"ready"}, seen
    assert (cur["cards_total"], cur["cards_free"], cur["cards_in_use"]) == (8, 7, 0), cur
    assert cur["cards"][3]["health_reason"] == "ECC"
    assert counts(d, "MI450") == (24, 19, 0)
    # Repaired: back in the pool.
    fa.facts = facts_doc("live")
    wait_node(d, n["id"], lambda x: x["cards_free"] == 8 and x["state"] == "ready")
    assert counts(d, "MI450") == (24, 20, 0)


def heartbeat_replies(d):
    """{kind: count} of the heartbeat's good replies: judged, repeated (the
    same bytes), not_modified (304 for the recorded reply's ETag)."""
    text = d.get("/metrics", key=d.admin_key).text
    found = {k: int(v) for k, v in re.findall(r'^gpurent_heartbeat_replies_total\{kind="(\w+)"\} (\d+)$', text, re.M)}
    assert set(found) == {"judged", "repeated", "not_modified"}, text
    return found


def test_a_repeated_reply_only_moves_the_time_and_a_changed_one_is_judged(new_daemon, procs):
    """A beat that repeats the reply last recorded, byte for byte, is not
    parsed again: only last_seen_at moves. Any change, a failed card here,
    is judged and recorded at the next beat, and so is a node that comes
    back from offline with the very reply it had before."""
    d = new_daemon(options=FAST)
    fa = procs.fake("facts", name="steady")
    n, secret = register(d, "steady", fa.url)
    fa.secret = secret
    wait_state(d, n["id"], "ready")
    before = heartbeat_replies(d)
    wait_beat(d, [n["id"]])
    wait_beat(d, [n["id"]])
    after = heartbeat_replies(d)
    assert after["repeated"] >= before["repeated"] + 2 and after["judged"] == before["judged"], (before, after)
    assert node(d, n["id"])["cards_free"] == 8

    fa.facts = facts_doc("steady", failed={3})
    cur = wait_node(d, n["id"], lambda x: not x["cards"][3]["healthy"], 20, "card 3 to be reported failed")
    assert (cur["state"], cur["cards_free"]) == ("ready", 7), cur
    changed = heartbeat_replies(d)
    assert changed["judged"] > after["judged"], (after, changed)
    wait_beat(d, [n["id"]])
    again = heartbeat_replies(d)
    assert again["repeated"] > changed["repeated"] and not node(d, n["id"])["cards"][3]["healthy"], (changed, again)

    # Offline, then the same reply as before: brought back by the whole path.
    fa.mode = "http500"
    wait_state(d, n["id"], "offline", 30)
    fa.mode = "facts"
    back = wait_state(d, n["id"], "ready", 30)
    assert back["cards_free"] == 7 and back["missed_heartbeats"] == 0, back
    assert counts(d, "MI450") == (8, 7, 0)


def test_an_agent_s_unchanged_facts_come_as_304_and_a_change_is_judged(new_daemon, procs):
    """A real agent tags its facts with an ETag. The heartbeat sends back the
    one of the reply it recorded, and while the facts hold the agent answers
    304 without them: the node stays ready and its last-seen time moves, and
    nothing is judged. Facts that changed (the agent restarted with another
    data address) come whole, are judged and recorded, and 304s follow."""
    d = new_daemon(options=FAST)
    n, a = one_agent(d, procs, "tagged", "MI450")
    wait_state(d, n["id"], "ready")
    wait_beat(d, [n["id"]])
    before = heartbeat_replies(d)
    wait_beat(d, [n["id"]])
    wait_beat(d, [n["id"]])
    after = heartbeat_replies(d)
    assert after["not_modified"] >= before["not_modified"] + 2, (before, after)
    assert (after["judged"], after["repeated"]) == (before["judged"], before["repeated"]), (before, after)
    assert (node(d, n["id"])["state"], node(d, n["id"])["cards_free"]) == ("ready", 8)

    a.restart(data_address="10.7.7.7")
    cur = wait_node(d, n["id"], lambda x: x["reported_data_address"] == "10.7.7.7", 30, "the new facts recorded")
    assert (cur["state"], cur["cards_free"], cur["missed_heartbeats"]) == ("ready", 8, 0), cur
    changed = heartbeat_replies(d)
    assert changed["judged"] > after["judged"], (after, changed)
    wait_beat(d, [n["id"]])
    wait_beat(d, [n["id"]])
    again = heartbeat_replies(d)
    assert again["not_modified"] >= changed["not_modified"] + 2 and again["judged"] == changed["judged"], \
        (changed, again)


def heartbeat_connections(d):
    """Connections to agents the heartbeat's polls have opened."""
    text = d.get("/metrics", key=d.admin_key).text
    return int(re.search(r"^gpurent_heartbeat_agent_connections_total (\d+)$", text, re.M).group(1))


def test_the_heartbeat_keeps_its_connections_to_agents_between_passes(new_daemon, procs):
    """A fleet no larger than agent_max_parallel is polled over kept-alive
    connections: after the first pass, passes open no new ones (here two
    agent processes, four nodes, passes every 100 ms)."""
    d = new_daemon(options=FAST)
    a = procs.fleet(d, "a", nodes=3, model="MI450", cards=8)
    b = procs.fleet(d, "b", nodes=1, model="MI450", cards=8, extra=("--name-prefix", "other-"))
    wait_all(d, ids_of(a) + ids_of(b), "ready")
    opened = heartbeat_connections(d)
    before = sum(heartbeat_replies(d).values())
    poll(lambda: sum(heartbeat_replies(d).values()) >= before + 40, 30, "ten passes over the four nodes")
    assert heartbeat_connections(d) - opened <= 4, (opened, heartbeat_connections(d))
    assert 1 <= opened <= 8, opened  # the passes that brought the nodes up: a connection or two per agent


def test_facts_that_disagree_keep_the_node_out_of_service(new_daemon, procs):
    d = new_daemon(options=FAST)
    # Declared MI300X, the agent has MI450 cards.
    p1 = free_port()
    wrong_model, s1 = register(d, "wrong-model", f"http://127.0.0.1:{p1}", model="MI300X", cards=8)
    procs.agent("wrong-model", secret=s1, node="wrong-model",
                options={"listen": f"127.0.0.1:{p1}", "inventory_model": "MI450", "inventory_cards": "8"})
    # Declared 8 cards, the agent has 4.
    p2 = free_port()
    too_few, s2 = register(d, "too-few", f"http://127.0.0.1:{p2}", model="MI450", cards=8)
    few = procs.agent("too-few", secret=s2, node="too-few",
                      options={"listen": f"127.0.0.1:{p2}", "inventory_model": "MI450", "inventory_cards": "4"})
    # Two models on one node (no real agent does this: a fake one).
    fa = procs.fake("facts", name="mixed")
    fa.facts["cards"][5]["model"] = "MI300X"
    mixed, s3 = register(d, "mixed", fa.url)
    fa.secret = s3

    r1 = wait_state(d, wrong_model["id"], "rejected")
    assert r1["state_reason"] == "node reports MI450 cards but was registered as MI300X", r1
    r2 = wait_state(d, too_few["id"], "rejected")
    assert r2["state_reason"] == "node reports 4 cards but was registered with 8", r2
    r3 = wait_state(d, mixed["id"], "rejected")
    assert r3["state_reason"] == "node reports mixed GPU models (7 MI450, 1 MI300X)", r3
    for n in (r1, r2, r3):
        assert n["health"] == "rejected" and n["cards_free"] == 0, n
    assert counts(d, "MI450") == (0, 0, 0)
    assert counts(d, "MI300X") == (0, 0, 0)
    assert {n["id"] for n in nodes(d, state="rejected")} == {wrong_model["id"], too_few["id"], mixed["id"]}
    # An admin cannot wave it in: ready is what it wants, rejected what it is.
    r = set_state(d, too_few["id"], "ready")
    assert r.status_code == 200 and r.json()["state"] == "rejected", r.text

    # Fixed hardware (the agent now reports 8 cards): in service.
    few.restart(inventory_cards=8)
    back = wait_state(d, too_few["id"], "ready")
    assert back["state_reason"] == "" and (back["cards_total"], back["cards_free"]) == (8, 8), back
    assert counts(d, "MI450") == (8, 8, 0)
    # And a node in service that starts reporting the wrong thing leaves it.
    few.restart(inventory_cards=2)
    gone = wait_state(d, too_few["id"], "rejected")
    assert gone["state_reason"] == "node reports 2 cards but was registered with 8"
    assert counts(d, "MI450") == (0, 0, 0)
    # A rejected node that stops answering stays rejected, for its reason:
    # offline would count its cards as capacity the platform has.
    fa.mode = "http500"
    deadline = time.monotonic() + 30
    while node(d, mixed["id"])["missed_heartbeats"] < int(FAST["heartbeat_miss_limit"]) + 2:
        assert time.monotonic() < deadline, node(d, mixed["id"])
        time.sleep(0.05)
    still = node(d, mixed["id"])
    assert (still["state"], still["health"]) == ("rejected", "rejected"), still
    assert still["state_reason"] == "node reports mixed GPU models (7 MI450, 1 MI300X)", still
    assert counts(d, "MI450") == (0, 0, 0)


# ---------------------------------------------------------------- removal


def test_removing_a_node_with_work_is_refused_and_an_idle_one_works(new_daemon, procs):
    d = new_daemon(options=FAST)
    f = procs.fleet(d, "f", nodes=2, model="MI450")
    wait_all(d, ids_of(f), "ready")
    u = user_with_funds(d)
    r = d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 8, "image": IMAGE})
    assert r.status_code == 201, r.text
    inst = r.json()
    busy = inst["nodes"][0]["node_id"]
    idle = next(i for i in ids_of(f) if i != busy)
    assert node(d, busy)["cards_in_use"] == 8
    assert counts(d, "MI450") == (16, 8, 8)

    # Busy: refused, even draining, and the node and its cards stay as they
    # were (the instance itself moves on meanwhile, so only they are compared).
    assert set_state(d, busy, "draining").status_code == 200
    inventory = lambda: {t: rows for t, rows in d.dump().items() if t in ("nodes", "node_cards")}  # noqa: E731
    before = inventory()
    err = assert_error(d.delete(f"/v1/admin/nodes/{busy}", key=d.admin_key), 409, "conflict")
    assert "8 cards in use" in err["message"], err
    assert inventory() == before
    assert node(d, busy)["state"] == "draining"

    # Idle: removed, gone from every view, its cards from the catalog.
    r = d.delete(f"/v1/admin/nodes/{idle}", key=d.admin_key)
    assert r.status_code == 204, r.text
    assert r.content == b""
    assert_error(d.get(f"/v1/admin/nodes/{idle}", key=d.admin_key), 404, "not_found")
    assert_error(d.delete(f"/v1/admin/nodes/{idle}", key=d.admin_key), 404, "not_found")
    assert_error(set_state(d, idle, "ready"), 404, "not_found")
    assert idle not in {n["id"] for n in nodes(d)}
    assert counts(d, "MI450") == (8, 0, 8)

    # The drained node empties when its instance ends; then it can go.
    r = d.delete(f"/v1/instances/{inst['id']}", key=u.key)
    assert r.status_code == 200, r.text
    wait_node(d, busy, lambda n: n["cards_in_use"] == 0, 30, "the instance's cards to be released")
    r = d.delete(f"/v1/admin/nodes/{busy}", key=d.admin_key)
    assert r.status_code == 204, r.text
    assert nodes(d) == []
    assert counts(d, "MI450") == (0, 0, 0)
    # The name is free again.
    name = next(iter(f.nodes))
    n, _ = register(d, name, "http://127.0.0.1:1")
    assert n["id"] not in ids_of(f) and n["name"] == name


# ---------------------------------------------------------------- listing


def test_list_filters_pages_and_bad_queries(new_daemon, procs):
    d = new_daemon(options=FAST)
    a = procs.fleet(d, "a", nodes=3, model="MI450")
    d.advance_clock(10)
    b = procs.fleet(d, "b", nodes=2, model="MI300X", cards=4, extra=("--fabric", "fabric-b"))
    d.advance_clock(10)
    dead = [register(d, f"dead-{i}", f"http://127.0.0.1:{free_port()}", model="MI300X", cards=4,
                     fabric="fabric-b")[0]["id"] for i in range(2)]
    wait_all(d, ids_of(a) + ids_of(b), "ready")
    wait_all(d, dead, "offline")
    cordoned = ids_of(a)[1]
    assert set_state(d, cordoned, "cordoned").status_code == 200

    everything = nodes(d, limit=200)
    assert len(everything) == 7
    assert [(n["created_at"], n["id"]) for n in everything] == sorted((n["created_at"], n["id"]) for n in everything)
    assert {n["id"] for n in everything} == set(ids_of(a) + ids_of(b) + dead)

    # Pages of 2 walk the same list, each node once; the last has no cursor.
    pages, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        r = d.get("/v1/admin/nodes", key=d.admin_key, params=params)
        assert r.status_code == 200, r.text
        pages.append([n["id"] for n in r.json()["data"]])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
        assert isinstance(cursor, str) and cursor
    assert [len(p) for p in pages] == [2, 2, 2, 1]
    assert sum(pages, []) == [n["id"] for n in everything]
    # Default page size covers them all.
    r = d.get("/v1/admin/nodes", key=d.admin_key)
    assert [n["id"] for n in r.json()["data"]] == [n["id"] for n in everything] and r.json()["next_cursor"] is None

    def ids(**q):
        return {n["id"] for n in nodes(d, **q)}
    assert ids(state="ready") == set(ids_of(a) + ids_of(b)) - {cordoned}
    assert ids(state="cordoned") == {cordoned}
    assert ids(state="offline") == set(dead)
    assert ids(state="pending") == set() and ids(state="rejected") == set() and ids(state="draining") == set()
    assert ids(gpu_model="MI300X") == set(ids_of(b) + dead)
    assert ids(gpu_model="MI450") == set(ids_of(a))
    assert ids(gpu_model="H100-SXM") == set() and ids(gpu_model="NOPE") == set()
    assert ids(fabric="fabric-b") == set(ids_of(b) + dead)
    assert ids(fabric="fabric-a") == set(ids_of(a))
    assert ids(fabric="fabric-b", state="ready") == set(ids_of(b))
    assert ids(gpu_model="MI450", fabric="fabric-a", state="ready") == set(ids_of(a)) - {cordoned}
    assert ids(gpu_model="MI450", fabric="fabric-b") == set()
    # Filters and pages together.
    assert len(nodes(d, state="ready", limit=1)) == 4
    # Cards free in the list, per node.
    by_id = {n["id"]: n for n in everything}
    assert by_id[cordoned]["cards_free"] == 0 and by_id[ids_of(a)[0]]["cards_free"] == 8
    assert all(by_id[i]["cards_free"] == 4 for i in ids_of(b))

    before = d.dump()
    for params, field in [({"state": "bogus"}, "state"), ({"state": "READY"}, "state"), ({"state": ""}, "state"),
                          ({"limit": "0"}, "limit"), ({"limit": "201"}, "limit"), ({"limit": "-1"}, "limit"),
                          ({"limit": "abc"}, "limit"), ({"limit": "1.5"}, "limit"), ({"limit": ""}, "limit"),
                          ({"limit": "99999999999999999999"}, "limit"), ({"cursor": "garbage"}, "cursor"),
                          ({"cursor": "x" * 300}, "cursor"), ({"model": "MI450"}, "model"), ({"foo": "1"}, "foo")]:
        assert_error(d.get("/v1/admin/nodes", key=d.admin_key, params=params), 400, "invalid_query", field)
    assert d.dump() == before


# ---------------------------------------------------------------- validation


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    """A daemon whose heartbeats do not change the database between two
    dumps: one node, answered by a fake agent, already in service."""
    from harness import Daemon, stop_all
    d = Daemon(tmp_path_factory.mktemp("quiet"), options={"heartbeat_interval_ms": "600000"})
    fa = FakeAgent("facts", name="taken")
    n, secret = register(d, "taken", fa.url)
    fa.secret = secret
    wait_state(d, n["id"], "ready")
    yield d
    fa.close()
    stop_all([d])


NODE_OK = {"name": "fresh", "agent_url": "http://10.0.0.7:9090", "gpu_model": "MI450", "card_count": 8,
           "fabric": "fabric-a", "region": "local", "labels": {"rack": "r1"}}


def spoil(**changes):
    body = dict(NODE_OK)
    for k, v in changes.items():
        if v is DROP:
            body.pop(k)
        else:
            body[k] = v
    return body


DROP = object()

NODE_BAD = [
    # label, body (dict) or raw bytes, status, code, field
    ("malformed", b'{"name": "x", ', 400, "malformed_json", None),
    ("not an object", b'["fresh"]', 400, "not_an_object", None),
    ("bad utf-8", b'{"name": "\xff\xfe", "agent_url": "http://x", "gpu_model": "MI450", "card_count": 8}', 400,
     "invalid_encoding", None),
    ("duplicate key", b'{"name": "a", "name": "b", "agent_url": "http://x", "gpu_model": "MI450", "card_count": 8}',
     400, "duplicate_key", "name"),
    ("too deep", spoil(labels={"a": [[[[[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]]]]}), 400, "too_deep", None),
    ("no name", spoil(name=DROP), 400, "missing_field", "name"),
    ("no agent_url", spoil(agent_url=DROP), 400, "missing_field", "agent_url"),
    ("no gpu_model", spoil(gpu_model=DROP), 400, "missing_field", "gpu_model"),
    ("no card_count", spoil(card_count=DROP), 400, "missing_field", "card_count"),
    ("null name", spoil(name=None), 400, "missing_field", "name"),
    ("unknown field", spoil(secret="0" * 64), 400, "unknown_field", "secret"),
    ("unknown id", spoil(id="node_00000000000000000000"), 400, "unknown_field", "id"),
    ("name number", spoil(name=5), 400, "invalid_field", "name"),
    ("url array", spoil(agent_url=["http://x"]), 400, "invalid_field", "agent_url"),
    ("model object", spoil(gpu_model={}), 400, "invalid_field", "gpu_model"),
    ("cards string", spoil(card_count="8"), 400, "invalid_field", "card_count"),
    ("cards float", spoil(card_count=8.0), 400, "invalid_field", "card_count"),
    ("cards bool", spoil(card_count=True), 400, "invalid_field", "card_count"),
    ("fabric number", spoil(fabric=1), 400, "invalid_field", "fabric"),
    ("region bool", spoil(region=False), 400, "invalid_field", "region"),
    ("labels array", spoil(labels=["a"]), 400, "invalid_field", "labels"),
    ("name upper", spoil(name="Fresh"), 400, "invalid_field", "name"),
    ("name space", spoil(name="fr esh"), 400, "invalid_field", "name"),
    ("name empty", spoil(name=""), 400, "invalid_field", "name"),
    ("name leading dash", spoil(name="-fresh"), 400, "invalid_field", "name"),
    ("name slash", spoil(name="a/b"), 400, "invalid_field", "name"),
    ("name too long", spoil(name="a" * 64), 400, "invalid_field", "name"),
    ("url ftp", spoil(agent_url="ftp://10.0.0.7"), 400, "invalid_field", "agent_url"),
    ("url no host", spoil(agent_url="http://"), 400, "invalid_field", "agent_url"),
    ("url empty host", spoil(agent_url="http:///nodes/a"), 400, "invalid_field", "agent_url"),
    ("url space", spoil(agent_url="http://10.0.0.7/a b"), 400, "invalid_field", "agent_url"),
    ("url query", spoil(agent_url="http://10.0.0.7/?x=1"), 400, "invalid_field", "agent_url"),
    ("url fragment", spoil(agent_url="http://10.0.0.7/#x"), 400, "invalid_field", "agent_url"),
    ("url not a url", spoil(agent_url="10.0.0.7:9090"), 400, "invalid_field", "agent_url"),
    ("url too long", spoil(agent_url="http://h/" + "a" * 600), 400, "invalid_field", "agent_url"),
    ("cards zero", spoil(card_count=0), 400, "invalid_field", "card_count"),
    ("cards 65", spoil(card_count=65), 400, "invalid_field", "card_count"),
    ("cards negative", spoil(card_count=-8), 400, "invalid_field", "card_count"),
    ("cards huge", spoil(card_count=2 ** 62), 400, "invalid_field", "card_count"),
    ("model unknown", spoil(gpu_model="B200"), 400, "invalid_field", "gpu_model"),
    ("model lower case", spoil(gpu_model="mi450"), 400, "invalid_field", "gpu_model"),
    ("model too long", spoil(gpu_model="M" * 33), 400, "invalid_field", "gpu_model"),
    ("fabric space", spoil(fabric="fabric a"), 400, "invalid_field", "fabric"),
    ("fabric empty", spoil(fabric=""), 400, "invalid_field", "fabric"),
    ("region non-ascii", spoil(region="上海"), 400, "invalid_field", "region"),
    ("label value number", spoil(labels={"rack": 1}), 400, "invalid_field", "labels"),
    ("label key space", spoil(labels={"a b": "x"}), 400, "invalid_field", "labels"),
    ("label value long", spoil(labels={"rack": "x" * 256}), 400, "invalid_field", "labels"),
    ("33 labels", spoil(labels={f"k{i}": "v" for i in range(33)}), 400, "invalid_field", "labels"),
    ("labels too big", spoil(labels={f"key-{i}": "v" * 200 for i in range(20)}), 400, "invalid_field", "labels"),
    ("duplicate name", spoil(name="taken"), 409, "conflict", "name"),
]


@pytest.mark.parametrize("label, body, status, code, field", NODE_BAD, ids=[c[0] for c in NODE_BAD])
def test_bad_node_registrations_change_nothing(quiet, label, body, status, code, field):
    d = quiet
    before = d.dump()
    data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    r = d.post("/v1/admin/nodes", key=d.admin_key, data=data, headers={"Content-Type": "application/json"})
    assert_error(r, status, code, field)
    assert d.dump() == before


def test_oversize_bodies_are_refused(quiet):
    d = quiet
    before = d.dump()
    big = json.dumps(spoil(labels={"pad": "x" * 255}, region="r" * 63)).encode()
    big = big[:-1] + b", " + b'"' + b"p" * (1100 * 1024) + b'": 1}'
    r = d.post("/v1/admin/nodes", key=d.admin_key, data=big, headers={"Content-Type": "application/json"})
    assert_error(r, 413, "body_too_large")
    r = d.request("PUT", "/v1/admin/gpu-types/BIG", key=d.admin_key, data=big,
                  headers={"Content-Type": "application/json"})
    assert_error(r, 413, "body_too_large")
    assert d.dump() == before


def test_the_valid_node_body_is_accepted(quiet):
    # Guards the table above: each bad body is this one spoiled.
    d = quiet
    r = d.post("/v1/admin/nodes", key=d.admin_key, json=spoil(name="guard"))
    assert r.status_code == 201, r.text
    assert d.delete(f"/v1/admin/nodes/{r.json()['node']['id']}", key=d.admin_key).status_code == 204


TYPE_OK = {"vendor": "AMD", "memory_gb": 288, "memory_type": "HBM3e", "stack": "ROCm",
           "reservation_required": False, "features": ["FP8", "FP4"], "description": "AMD Instinct MI355X"}


def spoil_type(**changes):
    body = dict(TYPE_OK)
    for k, v in changes.items():
        if v is DROP:
            body.pop(k)
        else:
            body[k] = v
    return body


TYPE_BAD = [
    ("malformed", "MI355X", b'{"vendor": ', 400, "malformed_json", None),
    ("not an object", "MI355X", b"42", 400, "not_an_object", None),
    ("duplicate key", "MI355X", b'{"vendor": "AMD", "vendor": "NVIDIA"}', 400, "duplicate_key", "vendor"),
    ("code lower case", "mi355x", TYPE_OK, 400, "invalid_field", "code"),
    ("code underscore", "MI_355", TYPE_OK, 400, "invalid_field", "code"),
    ("code too long", "M" * 33, TYPE_OK, 400, "invalid_field", "code"),
    ("no vendor", "MI355X", spoil_type(vendor=DROP), 400, "missing_field", "vendor"),
    ("no memory_gb", "MI355X", spoil_type(memory_gb=DROP), 400, "missing_field", "memory_gb"),
    ("no memory_type", "MI355X", spoil_type(memory_type=DROP), 400, "missing_field", "memory_type"),
    ("no stack", "MI355X", spoil_type(stack=DROP), 400, "missing_field", "stack"),
    ("unknown field", "MI355X", spoil_type(cards_total=8), 400, "unknown_field", "cards_total"),
    ("price is not here", "MI355X", spoil_type(price_per_card_hour="1.20"), 400, "unknown_field",
     "price_per_card_hour"),
    ("vendor intel", "MI355X", spoil_type(vendor="Intel"), 400, "invalid_field", "vendor"),
    ("vendor lower", "MI355X", spoil_type(vendor="amd"), 400, "invalid_field", "vendor"),
    ("vendor number", "MI355X", spoil_type(vendor=1), 400, "invalid_field", "vendor"),
    ("stack opencl", "MI355X", spoil_type(stack="OpenCL"), 400, "invalid_field", "stack"),
    ("memory zero", "MI355X", spoil_type(memory_gb=0), 400, "invalid_field", "memory_gb"),
    ("memory too big", "MI355X", spoil_type(memory_gb=4097), 400, "invalid_field", "memory_gb"),
    ("memory string", "MI355X", spoil_type(memory_gb="288"), 400, "invalid_field", "memory_gb"),
    ("memory float", "MI355X", spoil_type(memory_gb=288.5), 400, "invalid_field", "memory_gb"),
    ("memory type empty", "MI355X", spoil_type(memory_type=""), 400, "invalid_field", "memory_type"),
    ("memory type long", "MI355X", spoil_type(memory_type="H" * 33), 400, "invalid_field", "memory_type"),
    ("reservation string", "MI355X", spoil_type(reservation_required="yes"), 400, "invalid_field",
     "reservation_required"),
    ("features string", "MI355X", spoil_type(features="FP8"), 400, "invalid_field", "features"),
    ("feature number", "MI355X", spoil_type(features=[8]), 400, "invalid_field", "features"),
    ("feature long", "MI355X", spoil_type(features=["F" * 33]), 400, "invalid_field", "features"),
    ("17 features", "MI355X", spoil_type(features=[f"f{i}" for i in range(17)]), 400, "invalid_field", "features"),
    ("description long", "MI355X", spoil_type(description="d" * 513), 400, "invalid_field", "description"),
    ("description number", "MI355X", spoil_type(description=5), 400, "invalid_field", "description"),
    # A bad change to an existing type leaves it as it was.
    ("existing, bad vendor", "MI450", spoil_type(vendor="ARM"), 400, "invalid_field", "vendor"),
]


@pytest.mark.parametrize("label, code, body, status, err, field", TYPE_BAD, ids=[c[0] for c in TYPE_BAD])
def test_bad_gpu_type_puts_change_nothing(quiet, label, code, body, status, err, field):
    d = quiet
    before = d.dump()
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = d.request("PUT", f"/v1/admin/gpu-types/{code}", key=d.admin_key, data=data,
                  headers={"Content-Type": "application/json"})
    assert_error(r, status, err, field)
    assert d.dump() == before


def test_gpu_type_put_and_delete(quiet):
    d = quiet
    r = d.request("PUT", "/v1/admin/gpu-types/MI355X", key=d.admin_key, json=TYPE_OK)
    assert r.status_code == 201, r.text
    t = r.json()
    assert {k: t[k] for k in TYPE_OK} == TYPE_OK
    assert (t["cards_total"], t["cards_free"], t["cards_in_use"]) == (0, 0, 0)
    assert gpu_type(d, "MI355X") == t
    # PUT again replaces: 200.
    r = d.request("PUT", "/v1/admin/gpu-types/MI355X", key=d.admin_key,
                  json={"vendor": "AMD", "memory_gb": 256, "memory_type": "HBM3e", "stack": "ROCm"})
    assert r.status_code == 200, r.text
    assert (r.json()["memory_gb"], r.json()["features"], r.json()["description"],
            r.json()["reservation_required"]) == (256, [], "", False)
    # Nodes can now be registered with it; a type with nodes cannot be deleted.
    n, _ = register(d, "mi355x-01", "http://127.0.0.1:1", model="MI355X")
    assert_error(d.delete("/v1/admin/gpu-types/MI355X", key=d.admin_key), 409, "conflict")
    assert_error(d.delete("/v1/admin/gpu-types/MI450", key=d.admin_key), 409, "conflict")
    assert_error(d.delete("/v1/admin/gpu-types/NOPE", key=d.admin_key), 404, "not_found")
    # Removed nodes still name it (history), so it stays.
    assert d.delete(f"/v1/admin/nodes/{n['id']}", key=d.admin_key).status_code == 204
    assert_error(d.delete("/v1/admin/gpu-types/MI355X", key=d.admin_key), 409, "conflict")
    r = d.request("PUT", "/v1/admin/gpu-types/GONE-1", key=d.admin_key, json=TYPE_OK)
    assert r.status_code == 201, r.text
    r = d.delete("/v1/admin/gpu-types/GONE-1", key=d.admin_key)
    assert r.status_code == 204, r.text
    assert "GONE-1" not in {x["code"] for x in d.get("/v1/gpu-types").json()["data"]}
    assert_error(d.delete("/v1/admin/gpu-types/GONE-1", key=d.admin_key), 404, "not_found")
    # A priced type stays too: its prices are what billed usage was priced by.
    assert d.request("PUT", "/v1/admin/gpu-types/PRICED-1", key=d.admin_key, json=TYPE_OK).status_code == 201
    r = d.request("PUT", "/v1/admin/prices/PRICED-1", key=d.admin_key,
                  json={"price_per_card_hour": "1.00", "effective_at": "2099-01-01T00:00:00Z"})
    assert r.status_code == 200, r.text
    assert_error(d.delete("/v1/admin/gpu-types/PRICED-1", key=d.admin_key), 409, "conflict")


def test_user_keys_are_refused_on_every_admin_route(quiet):
    d = quiet
    user = d.signup()
    admin_routes = [(m, p) for m, p, auth in route_table() if auth == "AUTH_ADMIN"]
    assert {("POST", "/v1/admin/nodes"), ("GET", "/v1/admin/nodes"), ("GET", "/v1/admin/nodes/{id}"),
            ("POST", "/v1/admin/nodes/{id}/state"), ("DELETE", "/v1/admin/nodes/{id}"),
            ("PUT", "/v1/admin/gpu-types/{code}"), ("DELETE", "/v1/admin/gpu-types/{code}")} <= set(admin_routes)
    taken = nodes(d)[0]["id"]
    before = d.dump()
    for method, pattern in admin_routes:
        path = re.sub(r"\{(\w+)\}", lambda m: {"id": taken, "code": "MI450"}.get(m.group(1), "x"), pattern)
        body = {"state": "cordoned"} if path.endswith("/state") else {}
        assert_error(d.request(method, path, key=user.key, json=body), 403, "forbidden")
        assert_error(d.request(method, path, json=body), 401, "unauthorized")
        assert_error(d.request(method, path, key="gpk_" + "0" * 20 + "_" + "0" * 64, json=body), 401, "unauthorized")
    # What it tried did not happen.
    assert d.dump() == before
    assert node(d, taken)["state"] == "ready"


# ---------------------------------------------------------------- hostile agents


HOSTILE = {
    "hang": r"^agent unreachable: .*(timed out|Timeout)",
    "http500": r"^agent answered HTTP 500$",
    "garbage": r"^agent sent invalid JSON",
    "huge": r"^agent unreachable: .*(Maximum file size exceeded|larger than)",
    "drip": r"^agent unreachable: .*(timed out|Timeout)",
    "close": r"^agent unreachable: ",
    "redirect": r"^agent answered HTTP 302$",
}

MALFORMED_FACTS = [
    ({"cards": "eight"}, "no cards array"),
    ([1, 2, 3], "not a JSON object"),
    ({"cards": [{"index": 0}]}, "each card needs"),
    ({"cards": [{"index": 99, "model": "MI450", "memory_gb": 192, "healthy": True}]}, "card indexes"),
    ({"cards": [{"index": 0, "model": "MI450", "memory_gb": 192, "healthy": True}] * 2}, "card indexes"),
    ({"cards": [{"index": i, "model": "MI450", "memory_gb": 1, "healthy": True} for i in range(65)]},
     "more than 64 cards"),
    ({"cards": [{"index": 0, "model": "MI450", "memory_gb": -1, "healthy": True}]}, "memory_gb out of range"),
    ({"cards": [], "driver_version": 6}, "versions must be strings"),
    ({"cards": [{"index": 0, "model": "M" * 40, "memory_gb": 1, "healthy": True}]}, "card model longer"),
]


def test_hostile_agents_cannot_block_or_crash_the_daemon(new_daemon, procs):
    d = new_daemon(options=FAST)
    good = procs.fleet(d, "good", nodes=2, model="MI450")
    wait_all(d, ids_of(good), "ready")
    hostile = {}
    for mode in HOSTILE:
        fa = procs.fake(mode)
        hostile[mode] = (register(d, mode, fa.url)[0]["id"], fa)
    for i, (doc, _) in enumerate(MALFORMED_FACTS):
        fa = procs.fake("body")
        fa.body = json.dumps(doc).encode()
        hostile[f"malformed-{i}"] = (register(d, f"malformed-{i}", fa.url)[0]["id"], fa)

    # While they misbehave, the API answers at once ...
    worst = 0.0
    for _ in range(30):
        t0 = time.monotonic()
        r = requests.get(d.url("/healthz"), timeout=5)
        worst = max(worst, time.monotonic() - t0)
        assert r.status_code == 200
        assert d.get("/v1/gpu-types").status_code == 200
        time.sleep(0.03)  # spread the probes over several heartbeat passes
    assert worst < 0.9, f"/healthz took {worst:.3f}s while agents misbehaved"
    # ... and the good nodes keep beating, more than once.
    wait_beat(d, ids_of(good))
    wait_beat(d, ids_of(good))

    for mode, pattern in HOSTILE.items():
        node_id, fa = hostile[mode]
        n = wait_state(d, node_id, "offline", 30)
        assert re.search(pattern, n["state_reason"]), (mode, n["state_reason"])
        assert fa.count() >= 2, mode  # it was asked, and asked again
    for i, (_, words) in enumerate(MALFORMED_FACTS):
        n = wait_state(d, hostile[f"malformed-{i}"][0], "offline", 30)
        assert n["state_reason"].startswith("agent sent malformed facts: ") and words in n["state_reason"], n
    # None of them was ever put in service, and the good ones still are.
    assert counts(d, "MI450") == (16, 16, 0)
    assert {n["id"] for n in nodes(d, state="ready")} == set(ids_of(good))
    assert d.proc.poll() is None
    # The signed requests they got carry the protocol's headers.
    _, _, headers = hostile["http500"][1].requests[0]
    assert {"X-Gpurent-Timestamp", "X-Gpurent-Nonce", "X-Gpurent-Signature"} <= set(headers)


def test_node_in_service_that_turns_hostile_goes_offline_and_recovers(new_daemon, procs):
    d = new_daemon(options=FAST)
    fa = procs.fake("facts", name="turncoat")
    n, secret = register(d, "turncoat", fa.url)
    fa.secret = secret  # the fake checks the daemon's signatures
    wait_state(d, n["id"], "ready")
    assert counts(d, "MI450") == (8, 8, 0)
    for mode, pattern in HOSTILE.items():
        fa.mode = mode
        off = wait_state(d, n["id"], "offline", 30)
        assert re.search(pattern, off["state_reason"]), (mode, off["state_reason"])
        assert (off["cards_total"], off["cards_free"]) == (8, 0)
        assert counts(d, "MI450") == (8, 0, 0)
        fa.mode = "facts"
        back = wait_state(d, n["id"], "ready", 30)
        assert back["state_reason"] == "" and back["missed_heartbeats"] == 0
        assert counts(d, "MI450") == (8, 8, 0)
    # A wrong secret on the daemon's side would be refused: the fake agent
    # answered 401 to nothing, so every signature it saw was right.
    fa.secret = "0" * 64
    off = wait_state(d, n["id"], "offline", 30)
    assert off["state_reason"] == "agent answered HTTP 401"


def test_text_from_an_agent_cannot_hide_a_node(new_daemon, procs):
    # Agent strings are stored in fixed-size fields; one cut inside a
    # multi-byte character would leave text the API cannot serialise, and
    # the node would vanish from the list.
    d = new_daemon(options=FAST)
    fa = procs.fake("facts", name="utf8")
    doc = facts_doc("utf8")
    doc["driver_version"] = "d" * 62 + "é" * 10
    doc["stack_version"] = "版本" * 40
    doc["cards"][2].update(healthy=False, health_reason="温度过高" * 40)
    fa.facts = doc  # before the node exists: its first facts are these
    n, secret = register(d, "utf8", fa.url)
    fa.secret = secret
    ready = wait_state(d, n["id"], "ready")
    assert ready["driver_version"] == "d" * 62, ready
    assert ready["stack_version"] == ("版本" * 40).encode()[:63].decode("utf-8", "ignore")
    assert ready["cards"][2]["health_reason"].startswith("温度过高") and not ready["cards"][2]["healthy"]
    assert [x["id"] for x in nodes(d)] == [n["id"]]
    # A model name that does not fit is refused as malformed, not cut short.
    doc = facts_doc("utf8")
    doc["cards"][0]["model"] = "Ｍ" * 20
    fa.facts = doc
    off = wait_state(d, n["id"], "offline")
    assert off["state_reason"] == "agent sent malformed facts: card model longer than 32 bytes"
    assert [x["id"] for x in nodes(d)] == [n["id"]]
