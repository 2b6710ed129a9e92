"""test_agent_cluster.py: the ranks of a multi-node instance reaching each
other, against a real sim fleet of two nodes and Debian's OpenSSH client.
Each node gets one workload whose spec carries the cluster (both ranks at
their facts' data_address and SSH port, an instance key pair made with
ssh-keygen: its public half in both specs' authorized_keys, its private
half as the identity). A shell on rank 0 sees GPURENT_HOSTFILE naming the
sim's hostfile, and `ssh -F "$HOME/.ssh/config" rank1` from it lands in
rank 1's workload, its host key checked against the written known_hosts.
The files are in the sim container directory, and go with the workload.
"""
import json
import os
import shutil
import subprocess
import uuid

import pytest

from agent_util import Agent, FakeControlPlane, Fleet, poll

pytestmark = pytest.mark.skipif(not shutil.which("ssh") or not shutil.which("ssh-keygen"),
                                reason="needs openssh-client")


def keygen(directory, name):
    path = os.path.join(str(directory), name)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path], check=True, timeout=30)
    with open(path + ".pub") as f:
        return path, " ".join(f.read().split()[:2])


@pytest.fixture
def fleet(tmp_path):
    cp = FakeControlPlane()
    f = Fleet(tmp_path / "fleet", cp.url, nodes=2)
    f.cp = cp
    yield f
    f.stop()
    cp.close()


def node_request(f, node, method, path, **kw):
    return f.request(node, f.cp.secrets[node], method, path, **kw)


def test_rank0_reaches_rank1_by_its_hostfile_name(fleet, tmp_path):
    names = sorted(fleet.nodes)
    facts = [node_request(fleet, n, "GET", "/v1/facts").json() for n in names]
    assert [x["data_address"] for x in facts] == ["127.0.0.1", "127.0.0.1"]
    user_key, user_pub = keygen(tmp_path, "user")
    inst_key, inst_pub = keygen(tmp_path, "instance")
    with open(inst_key) as f:
        identity = f.read()
    tag = uuid.uuid4().hex[:8]
    wids = [f"wl_{tag}-{i}" for i in range(2)]
    hosts = [{"name": f"rank{i}", "address": facts[i]["data_address"], "ssh_port": facts[i]["ssh"]["port"],
              "user": f"ins_{tag}-{i}", "slots": 1, "host_key": facts[i]["ssh"]["host_key"]} for i in range(2)]
    for i, n in enumerate(names):
        spec = {"image": "img", "gpus": [0],
                "env": {"GPURENT_HOSTFILE": "/etc/gpurent/hostfile", "GPURENT_NODE_RANK": str(i)},
                "ssh": {"user": hosts[i]["user"], "authorized_keys": [user_pub, inst_pub]},
                "cluster": {"rank": i, "hosts": hosts, "identity": identity}}
        r = node_request(fleet, n, "PUT", f"/v1/workloads/{wids[i]}", json=spec)
        assert r.status_code == 201, r.text
    for i, n in enumerate(names):
        poll(lambda: node_request(fleet, n, "GET", f"/v1/workloads/{wids[i]}").json()["phase"] == "running", 20,
             f"workload {wids[i]} to run")
        # The identity is in no reply.
        for path in ("/v1/workloads", f"/v1/workloads/{wids[i]}"):
            assert "PRIVATE KEY" not in node_request(fleet, n, "GET", path).text

    # The files, in rank 0's sim container directory.
    cdir = os.path.join(fleet.state_dir, "nodes", names[0], "containers", wids[0])
    with open(os.path.join(cdir, "etc", "gpurent", "hostfile")) as f:
        assert f.read() == "rank0 slots=1\nrank1 slots=1\n"
    with open(os.path.join(cdir, "etc", "gpurent", "hostfile.mpi")) as f:
        assert f.read() == "rank0:1\nrank1:1\n"
    ssh_dir = os.path.join(cdir, ".ssh")
    with open(os.path.join(ssh_dir, "known_hosts")) as f:
        assert f.read() == "".join(f"[127.0.0.1]:{h['ssh_port']} {h['host_key']}\n" for h in hosts)
    with open(os.path.join(ssh_dir, "config")) as f:
        config = f.read()
    # Absolute paths in the sim: OpenSSH expands ~ to the passwd home.
    assert (f"Host rank1\n    HostName 127.0.0.1\n    Port {hosts[1]['ssh_port']}\n    User {hosts[1]['user']}\n"
            f"    IdentityFile {ssh_dir}/id_ed25519\n    IdentitiesOnly yes\n    StrictHostKeyChecking yes\n"
            f"    UserKnownHostsFile {ssh_dir}/known_hosts\n") in config
    assert os.stat(os.path.join(ssh_dir, "id_ed25519")).st_mode & 0o777 == 0o600
    assert os.stat(ssh_dir).st_mode & 0o777 == 0o700

    # Into rank 0 as the renter, then on to rank 1 with the instance key.
    known = os.path.join(str(tmp_path), "known_hosts")
    with open(known, "w") as f:
        f.write(f"[127.0.0.1]:{hosts[0]['ssh_port']} {hosts[0]['host_key']}\n")
    inner = ('echo "hostfile=$GPURENT_HOSTFILE"; cat "$GPURENT_HOSTFILE"; '
             'ssh -F "$HOME/.ssh/config" -o BatchMode=yes -o ConnectTimeout=10 rank1 '
             '\'echo "on $GPURENT_WORKLOAD rank $GPURENT_NODE_RANK"\'')
    p = subprocess.run(["ssh", "-F", "/dev/null", "-i", user_key, "-o", "IdentitiesOnly=yes",
                        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
                        "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", str(hosts[0]["ssh_port"]),
                        f"{hosts[0]['user']}@127.0.0.1", inner],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines() == [f"hostfile={cdir}/etc/gpurent/hostfile", "rank0 slots=1", "rank1 slots=1",
                                     f"on {wids[1]} rank 1"], p.stdout + p.stderr

    # Rank 1's host key is checked: with another key in known_hosts the
    # same command is refused.
    other_pub = keygen(tmp_path, "other")[1]
    with open(os.path.join(ssh_dir, "known_hosts"), "w") as f:
        f.write(f"[127.0.0.1]:{hosts[1]['ssh_port']} {other_pub}\n")
    p = subprocess.run(["ssh", "-F", "/dev/null", "-i", user_key, "-o", "IdentitiesOnly=yes",
                        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
                        "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", str(hosts[0]["ssh_port"]),
                        f"{hosts[0]['user']}@127.0.0.1", inner],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode != 0
    assert "on " + wids[1] not in p.stdout
    assert "PRIVATE KEY" not in fleet.stderr_text()

    # The files go with the workload.
    for i, n in enumerate(names):
        assert node_request(fleet, n, "DELETE", f"/v1/workloads/{wids[i]}").status_code in (200, 202)
    poll(lambda: not os.path.exists(cdir), 20, "rank 0's container directory to go")


def test_a_256_rank_cluster_fits_and_257_do_not(tmp_path):
    inst_key, inst_pub = keygen(tmp_path, "instance")
    with open(inst_key) as f:
        identity = f.read()
    a = Agent(tmp_path / "agent")
    try:
        def spec(n):
            hosts = [{"name": f"rank{i}", "address": f"10.0.{i // 250}.{i % 250 + 1}", "ssh_port": 2222,
                      "user": f"ins_0123456789abcdefghij-{i}", "slots": 8, "host_key": inst_pub} for i in range(n)]
            return {"image": "img", "gpus": [0],
                    "ssh": {"user": "ins_0123456789abcdefghij-3", "authorized_keys": [inst_pub]},
                    "cluster": {"rank": 3, "hosts": hosts, "identity": identity}}
        big = spec(256)
        assert len(json.dumps(big)) < 65536 * 2  # well inside max_body_bytes (256 KiB)
        r = a.put("/v1/workloads/wl_big", json=big)
        assert r.status_code == 201, r.text
        a.wait_phase("wl_big", "running")
        cdir = os.path.join(a.state_dir, "containers", "wl_big")
        with open(os.path.join(cdir, "etc", "gpurent", "hostfile")) as f:
            lines = f.read().splitlines()
        assert lines[0] == "rank0 slots=8" and lines[255] == "rank255 slots=8" and len(lines) == 256
        r = a.put("/v1/workloads/wl_bigger", json=spec(257))
        assert r.status_code == 400 and r.json()["error"]["field"] == "cluster.hosts", r.text
        # A restarted agent reads the record back, identity and all.
        a.restart()
        assert a.put("/v1/workloads/wl_big", json=big).status_code == 200
    finally:
        a.stop()
