"""test_agent_api.py: gpurent-agent's signed API end to end, on the real
binary in sim mode: signatures (unsigned, wrong, stale, replayed,
malformed), facts, idempotent PUT and DELETE, spec validation, phases, the
sim's injected failures, exits (the second and status reported, the
list's now, facts' workload_exits), durability across restarts and
crashes, and the command line."""
import hashlib
import json
import os
import signal
import subprocess
import re
import threading
import time
import uuid

import pytest
import requests

from agent_util import REPO, Agent, assert_error, new_secret, poll, run_agent, sign
from ports import cut_off_while_trickling

SPEC = {
    "image": "rocm/pytorch:2.3-rocm6.2",
    "gpus": [0, 1],
    "stack": "ROCm",
    "volumes": [{"source": "nfs.example:/export/vol_x", "target": "/shared"}],
    "env": {"GPURENT_NODE_RANK": "0", "MASTER_PORT": "29500"},
}


def wl_id():
    return "wl_" + uuid.uuid4().hex[:20]


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    a = Agent(tmp_path_factory.mktemp("agent"), options={"inventory_failed_cards": "7"})
    yield a
    a.stop()


@pytest.fixture
def new_agent(tmp_path):
    made = []

    def make(**kw):
        a = Agent(tmp_path / f"a{len(made)}", **kw)
        made.append(a)
        return a
    yield make
    for a in made:
        a.stop()


def free_gpus(agent, n):
    """Cards no workload on the module's agent holds yet (each test takes its own)."""
    used = set()
    for w in agent.get("/v1/workloads").json()["workloads"]:
        used.update(w["gpus"])
    free = [g for g in range(7) if g not in used]  # card 7 is configured as failed
    if len(free) < n:
        for w in agent.get("/v1/workloads").json()["workloads"]:
            assert agent.delete(f"/v1/workloads/{w['id']}").status_code == 200
        poll(lambda: not agent.get("/v1/workloads").json()["workloads"], 10, "an empty node")
        free = list(range(7))
    return free[:n]


# ---------------------------------------------------------------- signatures

def test_healthz_needs_no_signature(agent):
    r = agent.get("/healthz", sign=False)
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
    assert r.json()["runtime"] == "sim"


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/facts"), ("GET", "/v1/workloads"), ("GET", "/v1/workloads/wl_x"),
    ("PUT", "/v1/workloads/wl_x"), ("DELETE", "/v1/workloads/wl_x"),
])
def test_every_route_but_healthz_refuses_unsigned(agent, method, path):
    r = agent.request(method, path, json=SPEC if method == "PUT" else None, sign=False)
    err = assert_error(r, 401, "bad_signature")
    assert "missing" in err["message"]
    assert r.headers.get("WWW-Authenticate")
    # And nothing was created by the unsigned PUT.
    assert agent.get("/v1/workloads/wl_x").status_code == 404


def test_wrong_secret_is_refused(agent):
    assert_error(agent.get("/v1/facts", secret=new_secret()), 401, "bad_signature")


def test_signature_covers_method_path_and_body(agent):
    secret = agent.secret
    wid = wl_id()
    body = json.dumps({**SPEC, "gpus": []}).encode()
    # Signed for another path.
    h = sign(secret, "GET", "/v1/facts")
    assert_error(agent.get("/v1/workloads", headers=h, sign=False), 401, "bad_signature")
    # Signed for another method.
    h = sign(secret, "GET", f"/v1/workloads/{wid}")
    assert_error(agent.delete(f"/v1/workloads/{wid}", headers=h, sign=False), 401, "bad_signature")
    # Body changed after signing: the image swapped.
    h = sign(secret, "PUT", f"/v1/workloads/{wid}", body)
    tampered = body.replace(b"rocm/pytorch", b"evil/miner00")
    assert_error(agent.put(f"/v1/workloads/{wid}", data=tampered, headers=h, sign=False), 401, "bad_signature")
    assert agent.get(f"/v1/workloads/{wid}").status_code == 404
    # The untouched request works.
    h = sign(secret, "PUT", f"/v1/workloads/{wid}", body)
    assert agent.put(f"/v1/workloads/{wid}", data=body, headers=h, sign=False).status_code == 201
    assert agent.delete(f"/v1/workloads/{wid}").status_code == 200


@pytest.mark.parametrize("offset,ok", [(-301, False), (301, False), (-3600 * 24, False), (290, True)])
def test_stale_timestamps_are_refused(agent, offset, ok):
    r = agent.get("/v1/facts", ts=int(time.time()) + offset)
    if ok:
        assert r.status_code == 200, r.text
    else:
        err = assert_error(r, 401, "bad_signature")
        assert "timestamp" in err["message"]


def test_past_timestamps_are_accepted_back_to_the_agent_start(agent):
    # Within the skew, a timestamp in the past is fine as long as it is not
    # from before this run started (test_agent_restart.py says why).
    floor = agent.signed_floor()
    now = int(time.time())
    assert now - 300 < floor <= now, (floor, now)
    assert agent.get("/v1/facts", ts=floor).status_code == 200
    err = assert_error(agent.get("/v1/facts", ts=floor - 1), 401, "bad_signature")
    assert "before this agent's start" in err["message"]


def test_replayed_request_is_refused(agent):
    h = sign(agent.secret, "GET", "/v1/facts")
    assert agent.get("/v1/facts", headers=h, sign=False).status_code == 200
    err = assert_error(agent.get("/v1/facts", headers=h, sign=False), 401, "bad_signature")
    assert "already used" in err["message"]
    # A replayed PUT creates nothing either; a replayed DELETE does not delete a newer workload.
    wid = wl_id()
    body = json.dumps({"image": "busybox"}).encode()
    put = sign(agent.secret, "PUT", f"/v1/workloads/{wid}", body)
    assert agent.put(f"/v1/workloads/{wid}", data=body, headers=put, sign=False).status_code == 201
    dele = sign(agent.secret, "DELETE", f"/v1/workloads/{wid}")
    assert agent.delete(f"/v1/workloads/{wid}", headers=dele, sign=False).status_code in (200, 202)
    poll(lambda: agent.get(f"/v1/workloads/{wid}").status_code == 404, 10, "removal")
    assert_error(agent.put(f"/v1/workloads/{wid}", data=body, headers=put, sign=False), 401, "bad_signature")
    assert agent.get(f"/v1/workloads/{wid}").status_code == 404
    r = agent.put(f"/v1/workloads/{wid}", json={"image": "busybox"})
    assert r.status_code == 201 and r.headers["Location"] == f"/v1/workloads/{wid}", (r.text, r.headers)
    assert_error(agent.delete(f"/v1/workloads/{wid}", headers=dele, sign=False), 401, "bad_signature")
    assert agent.get(f"/v1/workloads/{wid}").status_code == 200
    assert agent.delete(f"/v1/workloads/{wid}").status_code == 200


@pytest.mark.parametrize("mutate", [
    lambda h: h.update({"X-Gpurent-Signature": h["X-Gpurent-Signature"].upper()}),
    lambda h: h.update({"X-Gpurent-Nonce": h["X-Gpurent-Nonce"][:30]}),
    lambda h: h.update({"X-Gpurent-Timestamp": "+" + h["X-Gpurent-Timestamp"]}),
    lambda h: h.update({"X-Gpurent-Timestamp": "0" + h["X-Gpurent-Timestamp"]}),
    lambda h: h.pop("X-Gpurent-Nonce"),
])
def test_malformed_signing_headers_are_refused(agent, mutate):
    h = sign(agent.secret, "GET", "/v1/facts")
    mutate(h)
    assert_error(agent.get("/v1/facts", headers=h, sign=False), 401, "bad_signature")


def test_query_strings_are_refused(agent):
    # The signature would not cover what the agent reads; the protocol has no queries.
    r = agent.get("/v1/workloads?limit=1")
    assert_error(r, 400, "invalid_query")


def test_node_without_secret_refuses_until_the_file_appears(new_agent):
    a = new_agent(secret=False)
    secret = new_secret()
    err = assert_error(a.get("/v1/facts", secret=secret), 401, "bad_signature")
    assert "no secret" in err["message"]
    a.write_secret(secret)
    poll(lambda: a.get("/v1/facts").status_code == 200, 10, "the agent to pick up its secret file")


def test_secret_file_readable_by_others_is_not_used(new_agent):
    a = new_agent()
    os.chmod(a.secret_path, 0o644)
    a.restart()
    assert_error(a.get("/v1/facts"), 401, "bad_signature")
    assert "chmod 600" in a.stderr_text()
    os.chmod(a.secret_path, 0o600)
    a.proc.send_signal(signal.SIGHUP)
    poll(lambda: a.get("/v1/facts").status_code == 200, 10, "SIGHUP to re-read the secret")


def test_sighup_rotates_the_secret(new_agent):
    a = new_agent()
    old = a.secret
    a.write_secret(new_secret())
    assert a.get("/v1/facts", secret=old).status_code == 200  # not re-read yet
    a.proc.send_signal(signal.SIGHUP)
    poll(lambda: a.get("/v1/facts", secret=old).status_code == 401, 10, "the old secret to stop working")
    assert a.get("/v1/facts").status_code == 200


# ---------------------------------------------------------------- facts

def test_facts(agent):
    r = agent.get("/v1/facts")
    assert r.status_code == 200, r.text
    f = r.json()
    assert set(f) == {"node", "agent_version", "runtime", "vendor", "stack", "driver_version", "stack_version",
                      "cards", "workload_exits", "ssh", "publish_ports", "data_address"}
    assert set(f["ssh"]) == {"port", "host_key", "fingerprint"}  # tests/e2e/access/test_agent_ssh.py says more
    assert f["publish_ports"] == {"first": 30000, "last": 30999}  # the default publish_port_range
    assert isinstance(f["workload_exits"], int) and f["workload_exits"] >= 0
    assert f["node"] == "node-a"
    assert f["runtime"] == "sim"
    assert (f["vendor"], f["stack"]) == ("AMD", "ROCm")
    assert [c["index"] for c in f["cards"]] == list(range(8))
    for c in f["cards"]:
        assert set(c) == {"index", "model", "name", "memory_gb", "healthy", "health_reason"}
        assert (c["model"], c["name"], c["memory_gb"]) == ("MI450", "AMD Instinct MI450", 192)
    assert [c["healthy"] for c in f["cards"]] == [True] * 7 + [False]
    assert f["cards"][7]["health_reason"]
    assert f["cards"][0]["health_reason"] == ""


def test_facts_data_address(new_agent):
    # Set: reported as it is.
    a = new_agent(options={"data_address": "10.9.8.7"})
    assert a.get("/v1/facts").json()["data_address"] == "10.9.8.7"
    a.restart(data_address="fd00::7")
    assert a.get("/v1/facts").json()["data_address"] == "fd00::7"
    a.restart(data_address="gpu-7.fabric.example")
    assert a.get("/v1/facts").json()["data_address"] == "gpu-7.fabric.example"
    # Unset, the sim's nodes are on this machine.
    a.restart(data_address="")
    assert a.get("/v1/facts").json()["data_address"] == "127.0.0.1"
    a.stop()
    # A real runtime finds this machine's first non-loopback IPv4 address,
    # or null when it has none (a sandbox with loopback only).
    b = new_agent(options={"runtime": "podman", "runtime_path": "/bin/false"})
    got = b.get("/v1/facts").json()["data_address"]
    if got is not None:
        parts = got.split(".")
        assert len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts), got
        assert parts[0] != "127", got
    # hostname -I lists the machine's addresses but loopback's.
    if os.path.exists("/bin/hostname") or os.path.exists("/usr/bin/hostname"):
        ips = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
        v4 = [ip for ip in ips if ip.count(".") == 3 and not ip.startswith("127.")]
        assert (got is None) == (not v4), (got, ips)
        assert got is None or got in v4, (got, ips)


@pytest.mark.parametrize("option", ["data_address=10.0.0.256", "data_address=a b", "data_address=[::1]",
                                    "shm_size=0", "shm_size=64gb", "shm_size=", "rdma_device_dir=dev/ib",
                                    "rdma_device_dir=", "group_file=etc/group"])
def test_bad_multi_node_options_stop_the_agent(option):
    p = run_agent("-n", "-o", option)
    assert p.returncode != 0 and option.split("=")[0] in p.stderr, p.stderr


def test_facts_do_not_move_with_placements(new_agent):
    # The control plane skips judging a beat whose bytes repeat the last
    # one; placing and removing workloads must not change them.
    a = new_agent()
    before = a.get("/v1/facts").content
    assert a.put("/v1/workloads/wl_1", json={"image": "busybox", "gpus": [0]}).status_code == 201
    assert a.put("/v1/workloads/wl_2", json={"image": "busybox", "gpus": [1]}).status_code == 201
    poll(lambda: a.get("/v1/workloads/wl_2").json()["phase"] == "running", 20, "wl_2 running")
    assert a.get("/v1/facts").content == before
    assert a.delete("/v1/workloads/wl_1").status_code == 200
    poll(lambda: a.get("/v1/workloads/wl_1").status_code == 404, 10, "wl_1 removed")
    assert a.get("/v1/facts").content == before


def test_facts_carry_an_etag_and_a_304_confirms_them(new_agent):
    # The heartbeat sends back the ETag of the reply it recorded: while the
    # facts are those the agent answers 304 without a body; once they change
    # (here an exit), the new reply with a new ETag.
    a = new_agent()
    r = a.get("/v1/facts")
    etag = r.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag), etag
    for inm in (etag, "W/" + etag, f'"other", {etag}', "*"):
        again = a.get("/v1/facts", headers={"If-None-Match": inm})
        assert (again.status_code, again.content, again.headers["ETag"]) == (304, b"", etag), inm
        assert again.headers["Content-Length"] == str(len(r.content)), again.headers  # the 200's (RFC 9110 8.6)
    other = a.get("/v1/facts", headers={"If-None-Match": '"other"'})
    assert (other.status_code, other.content, other.headers["ETag"]) == (200, r.content, etag)
    assert a.put("/v1/workloads/wl_x", json={"image": "registry/exit-after-100:1", "gpus": [0]}).status_code == 201
    a.wait_phase("wl_x", "exited")
    moved = a.get("/v1/facts", headers={"If-None-Match": etag})
    assert (moved.status_code, moved.json()["workload_exits"]) == (200, 1), moved.text
    assert moved.headers["ETag"] not in (etag, "")
    assert a.get("/v1/facts", headers={"If-None-Match": moved.headers["ETag"]}).status_code == 304
    # It names the bytes (their SHA-256), so the same facts after a restart
    # carry the same one; an unsigned ask gets nothing.
    for reply in (r, moved):
        assert reply.headers["ETag"] == '"%s"' % hashlib.sha256(reply.content).hexdigest()[:32]
    assert a.get("/v1/facts", headers={"If-None-Match": etag}, sign=False).status_code == 401


# ---------------------------------------------------------------- workloads

def test_put_may_wait_for_the_workload_to_run(new_agent):
    # The sim's phases take 60 ms each here: within a second the workload
    # runs, and the answer to the PUT says so.
    a = new_agent()
    r = a.put("/v1/workloads/wl_wait", json={"image": "busybox", "gpus": [0]}, headers={"Gpurent-Wait-Ms": "1000"})
    assert r.status_code == 201, r.text
    assert r.json()["phase"] == "running", r.json()
    assert r.headers["Location"].endswith("/v1/workloads/wl_wait")
    # A pull longer than the wait answers as it is when the wait ends.
    b = new_agent(options={"sim_pull_ms": "60000"})
    r = b.put("/v1/workloads/wl_slow", json={"image": "busybox", "gpus": [0]}, headers={"Gpurent-Wait-Ms": "100"})
    assert (r.status_code, r.json()["phase"]) == (201, "pulling"), r.text
    # Without the header, or with one that is not a number of milliseconds,
    # the answer does not wait.
    for i, value in enumerate([None, "soon", "-5", "1e3", ""]):
        headers = {"Gpurent-Wait-Ms": value} if value is not None else {}
        r = a.put(f"/v1/workloads/wl_now_{i}", json={"image": "busybox", "gpus": [i + 1]}, headers=headers)
        assert (r.status_code, r.json()["phase"]) == (201, "pulling"), (value, r.text)


def test_a_delete_ends_a_put_s_wait(new_agent):
    # The PUT's handler sleeps without the node's lock while it waits, and a
    # DELETE may take the workload away meanwhile: the PUT still answers the
    # workload as it was accepted, and the node goes on (under ASan in CI,
    # a touch of the freed workload would fail here).
    a = new_agent(options={"sim_pull_ms": "60000"})
    landed = 0
    for attempt in range(5):
        wid = f"wl_held_{attempt}"
        answers = []
        put = threading.Thread(target=lambda: answers.append(
            a.put(f"/v1/workloads/{wid}", json={"image": "busybox", "gpus": [0]},
                  headers={"Gpurent-Wait-Ms": "1000"})))
        put.start()
        poll(lambda: a.get(f"/v1/workloads/{wid}").status_code == 200, 10, f"{wid} accepted")
        # Accepted and not yet answered: the PUT waits. (Read before the
        # DELETE: that ends the wait at once, so after it the PUT may be gone.)
        landed += put.is_alive()
        r = a.delete(f"/v1/workloads/{wid}")
        assert (r.status_code, r.json()["phase"]) == (200, "removed"), r.text
        put.join(30)
        assert not put.is_alive()
        assert (answers[0].status_code, answers[0].json()["id"], answers[0].json()["phase"]) == \
            (201, wid, "pulling"), answers[0].text
        poll(lambda: a.get(f"/v1/workloads/{wid}").status_code == 404, 10, f"{wid} removed")
        if landed:
            break
    assert landed, "no DELETE came while its PUT waited"
    # The card is free again and the node takes a new workload on it.
    r = a.put("/v1/workloads/wl_after", json={"image": "busybox", "gpus": [0]})
    assert r.status_code == 201, r.text

def test_put_is_idempotent(agent):
    wid = wl_id()
    spec = {**SPEC, "gpus": free_gpus(agent, 2)}
    r = agent.put(f"/v1/workloads/{wid}", json=spec)
    assert r.status_code == 201, r.text
    first = r.json()
    assert set(first) == {"id", "phase", "message", "image", "gpus", "created_at", "updated_at", "exited_at",
                          "exit_code", "command", "working_dir", "env"}
    assert first["id"] == wid
    assert first["phase"] == "pulling"
    assert first["exited_at"] is None and first["exit_code"] is None
    assert first["gpus"] == spec["gpus"]
    # The same spec again, env keys in another order: 200 and nothing changes.
    again = {**spec, "env": dict(reversed(list(spec["env"].items())))}
    r = agent.put(f"/v1/workloads/{wid}", json=again)
    assert r.status_code == 200, r.text
    assert r.json()["created_at"] == first["created_at"]
    listed = [w for w in agent.get("/v1/workloads").json()["workloads"] if w["id"] == wid]
    assert len(listed) == 1
    # Another spec under the same id: 409, and the workload keeps its spec.
    for other in ({**spec, "image": "rocm/pytorch:2.4"}, {**spec, "gpus": list(reversed(spec["gpus"]))},
                  {**spec, "env": {}}, {k: v for k, v in spec.items() if k != "volumes"}):
        assert_error(agent.put(f"/v1/workloads/{wid}", json=other), 409, "conflict")
    assert agent.get(f"/v1/workloads/{wid}").json()["image"] == spec["image"]
    assert agent.delete(f"/v1/workloads/{wid}").status_code == 200


def test_delete_is_idempotent(agent):
    wid = wl_id()
    assert agent.put(f"/v1/workloads/{wid}", json={"image": "busybox"}).status_code == 201
    for _ in range(2):
        r = agent.delete(f"/v1/workloads/{wid}")
        assert r.status_code == 200
        assert r.json() == {"id": wid, "phase": "removed"}
    assert_error(agent.get(f"/v1/workloads/{wid}"), 404, "not_found")
    assert wid not in [w["id"] for w in agent.get("/v1/workloads").json()["workloads"]]
    # Never existed: also 200.
    r = agent.delete("/v1/workloads/wl_never_was")
    assert r.status_code == 200
    assert r.json() == {"id": "wl_never_was", "phase": "removed"}
    # The record is gone from disk once removal is done.
    path = os.path.join(agent.state_dir, "workloads", f"{wid}.json")
    poll(lambda: not os.path.exists(path), 10, "the record to be deleted")
    # And the id can be used again.
    assert agent.put(f"/v1/workloads/{wid}", json={"image": "busybox"}).status_code == 201
    assert agent.delete(f"/v1/workloads/{wid}").status_code == 200


def test_record_is_on_disk_before_the_answer(agent):
    wid = wl_id()
    assert agent.put(f"/v1/workloads/{wid}", json={"image": "busybox", "env": {"K": "v"}}).status_code == 201
    path = os.path.join(agent.state_dir, "workloads", f"{wid}.json")
    with open(path) as f:
        rec = json.load(f)
    assert rec["id"] == wid
    assert rec["spec"]["env"] == {"K": "v"}
    assert rec["removing"] is False
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert agent.delete(f"/v1/workloads/{wid}").status_code == 200


def test_unknown_workload_is_404(agent):
    assert_error(agent.get("/v1/workloads/wl_nope"), 404, "not_found")


@pytest.mark.parametrize("body,field", [
    ({}, "image"),
    ({"image": "--privileged"}, "image"),
    ({"image": "busybox", "gpus": [8]}, "gpus"),          # no card 8 on this node
    ({"image": "busybox", "gpus": [0, 0]}, "gpus"),
    ({"image": "busybox", "stack": "CUDA"}, "stack"),      # an AMD node
    ({"image": "busybox", "volumes": [{"source": "a", "target": "/x:ro"}]}, "volumes[0].target"),
    ({"image": "busybox", "volumes": [{"source": "a", "target": "/x", "size_gb": 0}]}, "volumes[0].size_gb"),
    ({"image": "busybox", "volumes": [{"source": "a", "target": "/x", "size_gb": 1048577}]}, "volumes[0].size_gb"),
    ({"image": "busybox", "volumes": [{"source": "a", "target": "/x", "size_gb": "100"}]}, "volumes[0].size_gb"),
    ({"image": "busybox", "volumes": [{"source": "a", "target": "/x", "size_gb": None}]}, "volumes[0].size_gb"),
    ({"image": "busybox", "volumes": [{"source": "a", "target": "/x", "size_gb": 1.5}]}, "volumes[0].size_gb"),
    ({"image": "busybox", "env": {"HIP_VISIBLE_DEVICES": "3"}}, "env.HIP_VISIBLE_DEVICES"),
    ({"image": "busybox", "privileged": True}, "privileged"),
    ({"image": "busybox", "cluster": "rank0"}, "cluster"),
    ({"image": "busybox", "cluster": {"rank": 0, "hosts": []}}, "cluster.hosts"),
    ({"image": "busybox", "cluster": {"rank": 0, "hosts": [{"name": "Rank0"}]}}, "cluster.hosts[0].name"),
    ({"image": "busybox", "cluster": {"rank": 0, "hosts": [{"name": "rank0", "address": "10.0.0.256"}]}},
     "cluster.hosts[0].address"),
    ({"image": "busybox", "cluster": {"rank": 0, "hosts": [], "nodes": 2}}, "cluster.nodes"),
])
def test_bad_specs_are_refused_and_change_nothing(agent, body, field):
    wid = wl_id()
    r = agent.put(f"/v1/workloads/{wid}", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == field
    assert agent.get(f"/v1/workloads/{wid}").status_code == 404
    assert not os.path.exists(os.path.join(agent.state_dir, "workloads", f"{wid}.json"))


def test_bad_bodies_and_ids(agent):
    assert_error(agent.put("/v1/workloads/wl_x", data=b"{not json"), 400, "malformed_json")
    assert_error(agent.put("/v1/workloads/wl_x", data=b'{"image":"a","image":"b"}'), 400, "duplicate_key")
    assert_error(agent.put("/v1/workloads/WL_UPPER", json={"image": "busybox"}), 400, "invalid_field")
    # Over max_body_bytes (1 MiB by default): refused before it is parsed.
    big = {"image": "busybox", "env": {f"V{i}": "x" * 2000 for i in range(600)}}
    assert_error(agent.put("/v1/workloads/wl_big", json=big), 413, "body_too_large")


def test_cards_are_not_shared(agent):
    a_id, b_id = wl_id(), wl_id()
    g = free_gpus(agent, 2)
    assert agent.put(f"/v1/workloads/{a_id}", json={"image": "busybox", "gpus": g}).status_code == 201
    err = assert_error(agent.put(f"/v1/workloads/{b_id}", json={"image": "busybox", "gpus": [g[1]]}), 409, "conflict",
                       "gpus")
    assert a_id in err["message"] and err["holder"] == a_id  # named, for a control plane to tell whose it is
    assert agent.delete(f"/v1/workloads/{a_id}").status_code == 200
    poll(lambda: agent.put(f"/v1/workloads/{b_id}", json={"image": "busybox", "gpus": [g[1]]}).status_code == 201,
         10, "the card to be free after the delete")
    assert agent.delete(f"/v1/workloads/{b_id}").status_code == 200


def test_a_card_reported_failed_takes_no_new_workload(new_agent):
    """The control plane hears of a failed card only at its next heartbeat:
    until then it may still put a workload there, which the agent refuses
    (409, field gpus, no holder: nobody holds it), so that it is placed
    again. A workload it holds already is answered as it is, on any card."""
    a = new_agent()
    held = wl_id()
    spec = {"image": "busybox", "gpus": [2, 3]}
    assert a.put(f"/v1/workloads/{held}", json=spec).status_code == 201
    a.restart(inventory_failed_cards="3,5")
    r = a.put(f"/v1/workloads/{held}", json=spec)
    assert r.status_code == 200 and r.json()["id"] == held, r.text
    for gpus in ([5], [4, 5], [1, 5, 6]):
        err = assert_error(a.put(f"/v1/workloads/{wl_id()}", json={"image": "busybox", "gpus": gpus}), 409,
                           "conflict", "gpus")
        assert err["message"] == "card 5 is reported failed: uncorrectable ECC errors (configured failure)", err
        assert "holder" not in err, err
    assert [w["id"] for w in a.get("/v1/workloads").json()["workloads"]] == [held]
    assert a.put(f"/v1/workloads/{wl_id()}", json={"image": "busybox", "gpus": [4]}).status_code == 201


def test_phases_progress_in_order(new_agent):
    a = new_agent(options={"sim_pull_ms": "400", "sim_mount_ms": "400", "sim_start_ms": "400"})
    r = a.put("/v1/workloads/wl_p", json=SPEC)
    assert r.json()["phase"] == "pulling"
    seen = ["pulling"]

    def watch():
        body = a.get("/v1/workloads/wl_p").json()
        if body["phase"] != seen[-1]:
            seen.append(body["phase"])
        return body["phase"] == "running" and body
    body = poll(watch, 20, "running")
    assert seen == ["pulling", "mounting", "starting", "running"], seen
    assert body["message"] == ""
    assert body["updated_at"] >= body["created_at"]
    # The driver logged each step.
    for step in ("pulling -> mounting", "mounting -> starting", "starting -> running"):
        assert step in a.stderr_text()


@pytest.mark.parametrize("spec,phase,words", [
    ({"image": "registry/fail-pull:1"}, "failed", "fail-pull"),
    ({"image": "busybox", "volumes": [{"source": "nfs:/fail-mount", "target": "/shared"}]}, "failed", "fail-mount"),
    ({"image": "registry/fail-start:1"}, "failed", "fail-start"),
    ({"image": "registry/exit-after-200:1"}, "exited", "status 0"),
])
def test_injected_failures_end_with_a_message(agent, spec, phase, words):
    wid = wl_id()
    assert agent.put(f"/v1/workloads/{wid}", json=spec).status_code == 201
    body = agent.wait_phase(wid, {phase})
    assert words in body["message"]
    # Terminal phases stay put and still count until deleted.
    assert agent.get(f"/v1/workloads/{wid}").json()["phase"] == phase
    assert agent.delete(f"/v1/workloads/{wid}").status_code == 200


# ---------------------------------------------------------------- exits

def read_record(agent, wid):
    with open(os.path.join(agent.state_dir, "workloads", f"{wid}.json")) as f:
        return json.load(f)


def test_an_exit_is_reported_at_the_second_it_was_due(new_agent):
    a = new_agent()
    before = int(time.time())
    spec = {"image": "registry/exit-after-1500:1", "gpus": [0]}
    assert a.put("/v1/workloads/wl_due", json=spec).status_code == 201
    body = a.wait_phase("wl_due", "exited")
    after = int(time.time())
    assert body["message"] == "the container exited with status 0"
    assert body["exit_code"] == 0
    # 1.5 s after it entered running, an instant the record keeps to the
    # millisecond: the second that instant falls in, however late the
    # driver got to it.
    rec = read_record(a, "wl_due")
    assert body["exited_at"] == (rec["running_at_ms"] + 1500) // 1000
    assert (rec["exited_at"], rec["exit_code"], rec["phase"]) == (body["exited_at"], 0, "exited")
    assert before - 1 <= rec["running_at_ms"] // 1000 and body["exited_at"] <= after + 1
    # The list shows the same document and the agent's clock when it built
    # the reply; a PUT of the same spec answers the same document too.
    listed = a.get("/v1/workloads").json()
    assert set(listed) == {"workloads", "now"}
    assert listed["workloads"] == [body]
    assert isinstance(listed["now"], int) and body["exited_at"] <= listed["now"] <= int(time.time()) + 1
    r = a.put("/v1/workloads/wl_due", json=spec)
    assert r.status_code == 200 and r.json() == body


def test_workload_exits_counts_every_exit_and_failure(new_agent):
    a = new_agent()

    def exits():
        return a.get("/v1/facts").json()["workload_exits"]
    assert exits() == 0
    ends = [
        ("wl_e1", {"image": "registry/exit-after-200:1", "gpus": [0]}, "exited"),
        ("wl_f1", {"image": "registry/fail-pull:1", "gpus": [1]}, "failed"),
        ("wl_f2", {"image": "busybox", "gpus": [2], "volumes": [{"source": "nfs:/fail-mount", "target": "/s"}]},
         "failed"),
        ("wl_f3", {"image": "registry/fail-start:1", "gpus": [3]}, "failed"),
        ("wl_e2", {"image": "registry/exit-after-100:1", "gpus": [4]}, "exited"),
    ]
    for n, (wid, spec, phase) in enumerate(ends, 1):
        assert a.put(f"/v1/workloads/{wid}", json=spec).status_code == 201
        body = a.wait_phase(wid, phase)
        assert exits() == n, body
        # Only an exit of a container that ran has a status.
        assert body["exit_code"] == (0 if phase == "exited" else None), body
        assert body["created_at"] <= body["exited_at"] <= a.get("/v1/workloads").json()["now"], body
    # Running, asked for again, or deleted: none of these is an exit.
    assert a.put("/v1/workloads/wl_run", json={"image": "busybox", "gpus": [5]}).status_code == 201
    running = a.wait_phase("wl_run", "running")
    assert running["exited_at"] is None and running["exit_code"] is None
    assert a.put("/v1/workloads/wl_e1", json=ends[0][1]).status_code == 200
    assert a.delete("/v1/workloads/wl_e1").status_code == 200
    assert a.delete("/v1/workloads/wl_run").status_code == 200
    poll(lambda: not os.path.exists(os.path.join(a.state_dir, "workloads", "wl_run.json")), 10, "the removal")
    assert exits() == len(ends)


def test_a_restarted_agent_reports_exits_from_its_records(new_agent):
    a = new_agent()
    assert a.put("/v1/workloads/wl_done", json={"image": "registry/exit-after-200:1", "gpus": [0]}).status_code == 201
    assert a.put("/v1/workloads/wl_pull", json={"image": "registry/fail-pull:1", "gpus": [1]}).status_code == 201
    done = a.wait_phase("wl_done", "exited")
    pulled = a.wait_phase("wl_pull", "failed")
    assert (done["exit_code"], pulled["exit_code"]) == (0, None)
    assert pulled["exited_at"] is not None
    assert a.get("/v1/facts").json()["workload_exits"] == 2
    a.restart()
    assert a.get("/v1/workloads/wl_done").json() == done
    assert a.get("/v1/workloads/wl_pull").json() == pulled
    assert a.get("/v1/facts").json()["workload_exits"] == 0  # counted since this process started

    # A run that falls due while the agent is down ended at the second it
    # was due, not when the agent came back to notice.
    assert a.put("/v1/workloads/wl_late", json={"image": "registry/exit-after-3000:1", "gpus": [2]}).status_code == 201
    running_at = poll(lambda: read_record(a, "wl_late")["running_at_ms"], 20, "wl_late to run")
    a.stop()
    poll(lambda: time.time() * 1000 >= running_at + 3000 + 1200, 10, "the run to fall due")
    a.start()
    late = a.wait_phase("wl_late", "exited")
    assert (late["exited_at"], late["exit_code"]) == ((running_at + 3000) // 1000, 0)
    assert late["updated_at"] > late["exited_at"]  # noticed a second or more later
    assert a.get("/v1/facts").json()["workload_exits"] == 1


def test_workloads_survive_a_restart(new_agent):
    a = new_agent()
    assert a.put("/v1/workloads/wl_run", json={**SPEC, "gpus": [0]}).status_code == 201
    a.wait_phase("wl_run", "running")
    assert a.put("/v1/workloads/wl_bad", json={"image": "x/fail-pull"}).status_code == 201
    a.wait_phase("wl_bad", "failed")
    # A slow pull, so this one is mid-provisioning when the agent stops.
    a.restart(sim_pull_ms=60000)
    assert a.get("/v1/workloads/wl_run").json()["phase"] == "running"
    assert a.put("/v1/workloads/wl_mid", json={"image": "busybox", "gpus": [1]}).status_code == 201
    assert a.get("/v1/workloads/wl_mid").json()["phase"] == "pulling"
    assert a.delete("/v1/workloads/wl_gone").status_code == 200
    a.restart(sim_pull_ms=60)
    # Running comes back running, without going through the phases again.
    assert a.get("/v1/workloads/wl_run").json()["phase"] == "running"
    failed = a.get("/v1/workloads/wl_bad").json()
    assert failed["phase"] == "failed" and "fail-pull" in failed["message"]
    # Mid-provisioning resumes.
    a.wait_phase("wl_mid", "running")
    assert sorted(w["id"] for w in a.get("/v1/workloads").json()["workloads"]) == ["wl_bad", "wl_mid", "wl_run"]
    # Idempotency holds across the restart.
    assert a.put("/v1/workloads/wl_run", json={**SPEC, "gpus": [0]}).status_code == 200
    assert "resumed 3 workloads" in a.stderr_text()


def test_a_workload_killed_while_starting_resumes_from_pulling(new_agent):
    """Mounting and starting are not written to the record (two fsyncs each
    saved): it says pulling until running, and an agent killed while a
    workload starts resumes it from there, through every step again."""
    a = new_agent(options={"sim_start_ms": "60000"})
    assert a.put("/v1/workloads/wl_mid", json={"image": "busybox", "gpus": [0]}).status_code == 201
    a.wait_phase("wl_mid", "starting")
    assert read_record(a, "wl_mid")["phase"] == "pulling"
    a.kill()
    a.options["sim_start_ms"] = "60"
    a.start()
    assert a.get("/v1/workloads/wl_mid").json()["phase"] in ("pulling", "mounting", "starting", "running")
    a.wait_phase("wl_mid", "running")
    assert read_record(a, "wl_mid")["phase"] == "running"


def test_volume_size_is_kept_compared_and_survives_a_restart(new_agent):
    """A volume's size_gb is part of the spec: recorded, compared for
    idempotency (before and after a restart), and optional."""
    # The sim never runs mount_command, so a template asking for the size
    # does not stop a volume that has none.
    a = new_agent(options={"mount_command": "/usr/local/sbin/mount-volume {source} {target} {size_gb}"})
    vol = {"source": "nfs.example:/export/vol_q", "target": "/shared", "size_gb": 250}
    spec = {**SPEC, "gpus": [0], "volumes": [vol]}
    assert a.put("/v1/workloads/wl_sized", json=spec).status_code == 201
    with open(os.path.join(a.state_dir, "workloads", "wl_sized.json")) as f:
        assert json.load(f)["spec"]["volumes"] == [vol]
    assert a.put("/v1/workloads/wl_sized", json=spec).status_code == 200
    no_size = {k: v for k, v in vol.items() if k != "size_gb"}
    for other in ({**spec, "volumes": [{**vol, "size_gb": 251}]}, {**spec, "volumes": [no_size]}):
        assert_error(a.put("/v1/workloads/wl_sized", json=other), 409, "conflict")
    # A control plane that sends no size is still served.
    old = {**SPEC, "gpus": [1], "volumes": [no_size]}
    assert a.put("/v1/workloads/wl_unsized", json=old).status_code == 201
    a.wait_phase("wl_sized", "running")
    a.wait_phase("wl_unsized", "running")
    a.restart()
    assert a.put("/v1/workloads/wl_sized", json=spec).status_code == 200
    assert a.put("/v1/workloads/wl_unsized", json=old).status_code == 200
    assert_error(a.put("/v1/workloads/wl_unsized", json={**old, "volumes": [{**no_size, "size_gb": 250}]}), 409,
                 "conflict")


def test_workloads_survive_a_crash(new_agent):
    a = new_agent(options={"sim_pull_ms": "60000"})
    assert a.put("/v1/workloads/wl_c", json={"image": "busybox"}).status_code == 201
    assert a.put("/v1/workloads/wl_d", json={"image": "busybox"}).status_code == 201
    assert a.delete("/v1/workloads/wl_d").status_code == 200
    a.kill()  # SIGKILL: only what was on disk before each answer remains
    a.options["sim_pull_ms"] = "60"
    a.start()
    a.wait_phase("wl_c", "running")
    assert a.get("/v1/workloads/wl_d").status_code == 404


def test_second_agent_on_the_same_state_dir_is_refused(new_agent, tmp_path):
    a = new_agent()
    p = run_agent("-o", "runtime=sim", "-o", "discovery=config", "-o", "listen=127.0.0.1:0",
                  "-o", f"state_dir={a.state_dir}", "-o", f"secret_file={a.secret_path}")
    assert p.returncode == 1
    assert "another gpurent-agent" in p.stderr


# ---------------------------------------------------------------- command line

def test_check_mode_and_help(tmp_path):
    p = run_agent("-n", "-c", os.path.join(REPO, "conf", "gpurent-agent.conf"))
    assert p.returncode == 0 and p.stdout == "configuration OK\n", p.stderr
    p = run_agent("-n", "-o", "runtime=lxc")
    assert p.returncode != 0 and "runtime" in p.stderr
    conf = tmp_path / "bad.conf"
    conf.write_text("runtime = sim\nmount_command = mount {target}\n")
    p = run_agent("-n", "-c", str(conf))
    assert p.returncode != 0 and "bad.conf:2:" in p.stderr
    p = run_agent("--help")
    assert p.returncode == 0 and "sim-fleet" in p.stdout
    p = run_agent("--help-config")
    assert p.returncode == 0 and "mount_command" in p.stdout
    p = run_agent("--version")
    assert p.returncode == 0 and p.stdout.startswith("gpurent-agent ")
    p = run_agent("frobnicate")
    assert p.returncode == 2


def test_headers_trickled_a_byte_at_a_time_are_cut_off(new_agent):
    """libmicrohttpd's idle timeout restarts with every byte, so a client
    sending its headers a byte a second held a connection as long as it
    liked; header_timeout_s counts from the request's start."""
    a = new_agent(options={"header_timeout_s": "2"})
    assert cut_off_while_trickling(a.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X"), \
        "headers arriving at a byte a second were never cut off"
    # A prompt request is served as before.
    assert requests.get(f"{a.base_url}/healthz", timeout=10).status_code == 200


def test_the_control_planes_polls_log_at_debug_when_they_succeed(new_agent):
    """The heartbeat asks every node for its facts every few seconds and the
    reconciler's sweeps list its workloads: at info those would be nearly
    all of an agent's journal. Their successes log at debug; failures and
    every other call at info."""
    a = new_agent()
    assert a.get("/v1/facts").status_code == 200
    assert a.get("/v1/workloads").status_code == 200
    assert requests.get(a.base_url + "/healthz", timeout=10).status_code == 200
    assert a.get("/v1/facts", secret=new_secret()).status_code == 401  # a forged poll is news
    assert a.get(f"/v1/workloads/{wl_id()}").status_code == 404
    a.stop()
    access = [line for line in a.stderr_text().splitlines() if " http: " in line]
    assert not [line for line in access if re.search(r" GET /(v1/workloads|healthz) 200 ", line)], access
    facts = [line for line in access if " GET /v1/facts " in line]
    assert len(facts) == 1 and facts[0].startswith("<6>") and " 401 " in facts[0], facts
    assert [line for line in access if line.startswith("<6>") and " GET /v1/workloads/wl_" in line], access

    a = new_agent(options={"log_level": "debug"})
    assert a.get("/v1/facts").status_code == 200
    a.stop()
    assert [line for line in a.stderr_text().splitlines()
            if line.startswith("<7>") and " http: GET /v1/facts 200 " in line], a.stderr_text()[-3000:]
