"""test_agent_fleet.py: `gpurent-agent sim-fleet` end to end: one process
serves many simulated nodes under /nodes/{name}, each with its own secret,
registered with a fake control plane (a small http.server standing in for
gpurentd's POST /v1/admin/nodes); a re-run keeps the saved secrets when the
control plane answers 409; a node without a secret refuses every call;
each node counts its own workload exits."""
import json
import os
import re

import pytest
import requests

from agent_util import FakeControlPlane, Fleet, assert_error, new_secret, poll, run_agent, sign


@pytest.fixture
def cp():
    c = FakeControlPlane()
    yield c
    c.close()


def test_fleet_registers_every_node(tmp_path, cp):
    f = Fleet(tmp_path, cp.url, nodes=4, model="MI450", extra=("--memory-gb", "192"))
    try:
        names = [f"sim-mi450-0{i}" for i in range(1, 5)]
        assert list(f.nodes) == names
        bodies = cp.bodies()
        assert [b["name"] for b in bodies] == names
        for b in bodies:
            assert b == {"name": b["name"], "agent_url": f"{f.base_url}/nodes/{b['name']}", "gpu_model": "MI450",
                         "card_count": 8, "fabric": "fabric-a", "region": "local", "labels": {}}
        for headers, _ in cp.calls:
            assert headers["Authorization"] == "Bearer gpk_test_admin_key"
            assert headers["Content-Type"] == "application/json"
        for name in names:
            assert f.nodes[name] == {"status": "registered", "id": cp.ids[name],
                                     "url": f"{f.base_url}/nodes/{name}"}
        assert "fleet ready: 4 nodes (4 registered, 0 kept, 0 failed)" in f.stdout_text()
        # Secrets are saved, private.
        for name in names:
            path = os.path.join(f.state_dir, "nodes", name, "registration.json")
            assert os.stat(path).st_mode & 0o777 == 0o600
            with open(path) as fh:
                assert json.load(fh) == {"id": cp.ids[name], "secret": cp.secrets[name]}
        # The admin key is not printed.
        assert "gpk_test_admin_key" not in f.stdout_text() + f.stderr_text()
    finally:
        f.stop()


def test_each_node_has_its_own_secret_and_workloads(tmp_path, cp):
    f = Fleet(tmp_path, cp.url, nodes=3, model="MI300X", cards=4)
    try:
        a, b, c = "sim-mi300x-01", "sim-mi300x-02", "sim-mi300x-03"
        for name in (a, b, c):
            r = f.request(name, cp.secrets[name], "GET", "/v1/facts")
            assert r.status_code == 200, r.text
            facts = r.json()
            assert facts["node"] == name
            assert [(x["model"], x["memory_gb"]) for x in facts["cards"]] == [("MI300X", 96)] * 4
        # Another node's secret does not open this one.
        assert_error(f.request(a, cp.secrets[b], "GET", "/v1/facts"), 401, "bad_signature")
        # Unknown nodes are refused like bad signatures.
        assert_error(f.request("sim-mi300x-99", cp.secrets[a], "GET", "/v1/facts"), 401, "bad_signature")
        # Unsigned is refused under a prefix too; health stays at the root, unsigned.
        assert_error(f.request(a, cp.secrets[a], "GET", "/v1/facts", sign=False), 401, "bad_signature")
        h = requests.get(f.base_url + "/healthz", timeout=5)
        assert h.status_code == 200 and h.json()["nodes"] == 3
        # A signature for /nodes/A/... replayed to /nodes/B/... fails (the path is signed).
        hd = sign(cp.secrets[a], "GET", f"/nodes/{a}/v1/facts")
        assert requests.get(f"{f.base_url}/nodes/{a}/v1/facts", headers=hd, timeout=5).status_code == 200
        assert requests.get(f"{f.base_url}/nodes/{b}/v1/facts", headers=hd, timeout=5).status_code == 401

        # Workloads are per node, and phases progress under a prefix.
        r = f.request(a, cp.secrets[a], "PUT", "/v1/workloads/wl_a", json={"image": "busybox", "gpus": [0, 1]})
        assert r.status_code == 201, r.text
        r = f.request(b, cp.secrets[b], "PUT", "/v1/workloads/wl_a", json={"image": "other", "gpus": [0]})
        assert r.status_code == 201, r.text  # the same id on another node is another workload
        assert_error(f.request(a, cp.secrets[a], "PUT", "/v1/workloads/wl_a", json={"image": "other", "gpus": [0]}),
                     409, "conflict")
        poll(lambda: f.request(a, cp.secrets[a], "GET", "/v1/workloads/wl_a").json()["phase"] == "running", 20,
             "running on node A")
        listed = f.request(c, cp.secrets[c], "GET", "/v1/workloads").json()
        assert set(listed) == {"workloads", "now"} and listed["workloads"] == []
        assert [w["id"] for w in f.request(a, cp.secrets[a], "GET", "/v1/workloads").json()["workloads"]] == ["wl_a"]
        assert os.path.exists(os.path.join(f.state_dir, "nodes", a, "workloads", "wl_a.json"))
    finally:
        f.stop()


def test_each_node_counts_its_own_exits(tmp_path, cp):
    f = Fleet(tmp_path, cp.url, nodes=3)
    try:
        a, b, c = "sim-mi450-01", "sim-mi450-02", "sim-mi450-03"

        def exits(name):
            return f.request(name, cp.secrets[name], "GET", "/v1/facts").json()["workload_exits"]

        def ended(name, wid, phase):
            r = f.request(name, cp.secrets[name], "GET", f"/v1/workloads/{wid}")
            return r.json()["phase"] == phase
        assert [exits(n) for n in (a, b, c)] == [0, 0, 0]
        assert f.request(a, cp.secrets[a], "PUT", "/v1/workloads/wl_x",
                         json={"image": "registry/fail-pull:1"}).status_code == 201
        poll(lambda: ended(a, "wl_x", "failed"), 20, "the failure on node A")
        assert [exits(n) for n in (a, b, c)] == [1, 0, 0]
        for wid in ("wl_x", "wl_y"):
            assert f.request(b, cp.secrets[b], "PUT", f"/v1/workloads/{wid}",
                             json={"image": "registry/exit-after-100:1"}).status_code == 201
            poll(lambda: ended(b, wid, "exited"), 20, f"{wid} to exit on node B")
        assert [exits(n) for n in (a, b, c)] == [1, 2, 0]
    finally:
        f.stop()


def test_rerun_keeps_saved_secrets_and_workloads(tmp_path, cp):
    f = Fleet(tmp_path, cp.url, nodes=2)
    name = "sim-mi450-01"
    first = dict(cp.secrets)
    assert f.request(name, first[name], "PUT", "/v1/workloads/wl_k", json={"image": "busybox"}).status_code == 201
    poll(lambda: f.request(name, first[name], "GET", "/v1/workloads/wl_k").json()["phase"] == "running", 20,
         "running")
    f.stop()
    # The control plane knows these names now: it answers 409.
    f.start()
    assert {n["status"] for n in f.nodes.values()} == {"kept"}
    assert f.nodes[name]["id"] == cp.ids[name]
    assert "fleet ready: 2 nodes (0 registered, 2 kept, 0 failed)" in f.stdout_text()
    assert cp.secrets == first
    r = f.request(name, first[name], "GET", "/v1/workloads/wl_k")
    assert r.status_code == 200 and r.json()["phase"] == "running"
    f.stop()


def test_node_without_secret_is_refused(tmp_path, cp):
    cp.fail_names.add("sim-mi450-02")
    f = Fleet(tmp_path, cp.url, nodes=3)
    try:
        assert f.nodes["sim-mi450-02"]["status"] == "FAILED"
        assert re.search(r"node sim-mi450-02 FAILED url=\S+: HTTP 500 internal: injected failure", f.stdout_text())
        assert "(1 registered" not in f.stdout_text()
        assert "2 registered, 0 kept, 1 failed" in f.stdout_text()
        err = assert_error(f.request("sim-mi450-02", new_secret(), "GET", "/v1/facts"), 401, "bad_signature")
        assert "no secret" in err["message"]
        assert f.request("sim-mi450-03", cp.secrets["sim-mi450-03"], "GET", "/v1/facts").status_code == 200
    finally:
        f.stop()


def test_conflict_without_a_saved_secret_is_reported(tmp_path, cp):
    cp.secrets["sim-mi450-01"] = new_secret()  # registered by someone else, secret not ours
    f = Fleet(tmp_path, cp.url, nodes=1)
    try:
        assert f.nodes["sim-mi450-01"]["status"] == "FAILED"
        assert "no secret is saved" in f.stdout_text()
    finally:
        f.stop()


def test_unreachable_control_plane_stops_the_fleet(tmp_path, cp):
    url = cp.url
    cp.close()
    f = Fleet(tmp_path, url, nodes=2, start=False)
    f.start(expect_ready=False)
    rc = f.proc.wait(timeout=60)
    assert rc == 1
    assert "cannot be reached" in f.stderr_text()
    assert "node sim-mi450-01 FAILED" in f.stdout_text()


def test_wrong_admin_key_is_reported(tmp_path, cp):
    f = Fleet(tmp_path, cp.url, nodes=1, admin_key="gpk_wrong")
    try:
        assert f.nodes["sim-mi450-01"]["status"] == "FAILED"
        assert "HTTP 401 unauthorized" in f.stdout_text()
    finally:
        f.stop()


def test_admin_key_file_and_name_prefix(tmp_path, cp):
    key_file = tmp_path / "admin.key"
    key_file.write_text("gpk_test_admin_key\n")
    f = Fleet(tmp_path, cp.url, nodes=2, model="H100-SXM",
              extra=("--admin-key-file", str(key_file), "--name-prefix", "h100-"))
    try:
        assert list(f.nodes) == ["h100-01", "h100-02"]
        r = f.request("h100-02", cp.secrets["h100-02"], "GET", "/v1/facts")
        assert (r.json()["vendor"], r.json()["stack"]) == ("NVIDIA", "CUDA")
    finally:
        f.stop()


def test_fleet_command_line(tmp_path):
    p = run_agent("sim-fleet", "--help")
    assert p.returncode == 0 and "--control-plane" in p.stdout
    p = run_agent("sim-fleet", "--model", "MI450")
    assert p.returncode == 2 and "required" in p.stderr
    base = ["sim-fleet", "--control-plane", "http://127.0.0.1:1", "--admin-key", "k", "--model", "MI450",
            "--fabric", "f", "--region", "r", "--state-dir", str(tmp_path / "s")]
    p = run_agent(*base, "--nodes", "4", "-n")
    assert p.returncode == 0 and p.stdout == "configuration OK\n", p.stderr
    p = run_agent(*base, "--nodes", "0", "-n")
    assert p.returncode == 2
    p = run_agent(*base, "--nodes", "2", "--name-prefix", "Bad Prefix", "-n")
    assert p.returncode != 0
    p = run_agent(*base, "--nodes", "2", "--model", "MI355X", "-n")
    assert p.returncode != 0 and "inventory_memory_gb" in p.stderr


def test_many_nodes_in_one_process(tmp_path, cp):
    f = Fleet(tmp_path, cp.url, nodes=200, model="MI250")
    try:
        assert len(f.nodes) == 200 and {n["status"] for n in f.nodes.values()} == {"registered"}
        assert list(f.nodes)[-1] == "sim-mi250-200"
        # Spot-check a spread of nodes with their own secrets.
        for name in ("sim-mi250-001", "sim-mi250-077", "sim-mi250-200"):
            assert f.request(name, cp.secrets[name], "GET", "/v1/facts").json()["node"] == name
        # No thread per node.
        threads = len(os.listdir(f"/proc/{f.proc.pid}/task"))
        assert threads < 40, threads
    finally:
        f.stop()


def test_fleet_nodes_report_loopback_as_their_data_address(tmp_path, cp):
    # Simulated nodes all live on this machine: the other ranks reach them
    # at 127.0.0.1, unless data_address says otherwise.
    f = Fleet(tmp_path / "a", cp.url, nodes=2)
    try:
        for n in f.nodes:
            assert f.request(n, cp.secrets[n], "GET", "/v1/facts").json()["data_address"] == "127.0.0.1"
    finally:
        f.stop()
    other = FakeControlPlane()  # the same node names again: a fresh control plane
    f = Fleet(tmp_path / "b", other.url, nodes=1, options={"data_address": "10.1.2.3"})
    try:
        (n,) = f.nodes
        assert f.request(n, other.secrets[n], "GET", "/v1/facts").json()["data_address"] == "10.1.2.3"
    finally:
        f.stop()
        other.close()
