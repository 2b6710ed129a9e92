"""test_instances_gang.py: multi-node instances that rendezvous (issue 12),
the control plane's side, against a real gpurentd and sim fleets: each
node's data-plane address (the agent's facts, the admin's data_host, which
wins, and PATCH /v1/admin/nodes/{id} with its validation), the environment,
hostfile and cluster member every rank of a 32-node instance gets, ssh from
rank 0 to rank 31 by its hostfile name with the instance's own key pair
(never shown by the API), gang failure (a rank that cannot start, a node
lost: every rank removed), the rendezvous timeout under the testing clock,
and a node-local volume source refused for more than one node."""
import json
import os
import re
import subprocess

import pytest

from agent_util import poll
from harness import assert_error
from instances_util import DEADLINE, Cloud, cloud, cloud_with, wait  # noqa: F401  (fixtures)

SSH_SIM = {"ssh_listen": "127.0.0.1:0"}

cloud_one_attempt = cloud_with(provision_max_attempts="1")
# The sweep runs once, at start: a workload put straight to an agent stays
# there (as an orphan would until the next sweep) and holds its card.
cloud_no_sweep = cloud_with(provision_max_attempts="1", reconcile_sweep_ms="3600000")


def node_ids(cloud):
    return {name: node_id for node_id, name in cloud.d.sql("SELECT id, name FROM nodes")}


def patch_node(cloud, node_id, body, key=None):
    return cloud.d.request("PATCH", f"/v1/admin/nodes/{node_id}", key=key or cloud.d.admin_key, json=body)


def specs(cloud, inst_id):
    """{rank: the spec its agent holds}, from the agents' durable records."""
    rows = cloud.d.sql("SELECT p.rank, n.name, p.workload_id FROM instance_nodes p JOIN nodes n ON n.id = p.node_id"
                       " WHERE p.instance_id = ? ORDER BY p.rank", (inst_id,))
    return {rank: cloud.record(name, wl)["spec"] for rank, name, wl in rows}


def all_empty(cloud):
    return all(wls == [] for wls in cloud.all_workloads().values())


def test_data_host_at_registration_and_patch(cloud):
    """data_host is validated at registration and by PATCH, shown with what
    the agent reports and the address that results; the admin's value wins,
    "" hands back to the agent's (or the public host); bad requests change
    nothing."""
    cloud.fleet(1, prefix="v-")
    (node_id,) = node_ids(cloud).values()
    r = cloud.admin("GET", f"/v1/admin/nodes/{node_id}")
    assert r.status_code == 200, r.text
    before = r.json()
    assert before["data_host"] is None
    reported = before["reported_data_address"]
    # The sim reports 127.0.0.1 (agents of issue 12); with no report the
    # public host, which for a sim node is its agent URL's host, 127.0.0.1.
    assert reported in (None, "127.0.0.1"), before
    assert before["data_address"] == "127.0.0.1", before

    for body, field, code in [
        ({"data_host": 5}, "data_host", "invalid_field"),
        ({"data_host": None}, "public_host", "missing_field"),  # null is absent
        ({"data_host": "10.0.0.1:22"}, "data_host", "invalid_field"),
        ({"data_host": "a b"}, "data_host", "invalid_field"),
        ({"data_host": "-x.example"}, "data_host", "invalid_field"),
        ({"data_host": "1.2.3.999"}, "data_host", "invalid_field"),
        ({"data_host": "a" * 254}, "data_host", "invalid_field"),
        ({"public_host": "a b"}, "public_host", "invalid_field"),
        ({"public_host": 7}, "public_host", "invalid_field"),
        ({"nope": "x"}, "nope", "unknown_field"),
        ({}, "public_host", "missing_field"),
    ]:
        assert_error(patch_node(cloud, node_id, body), 400, code, field)
    assert_error(patch_node(cloud, "node_00000000000000000000", {"data_host": "10.0.0.9"}), 404, "not_found")
    assert_error(patch_node(cloud, "nonsense", {"data_host": "10.0.0.9"}), 404, "not_found")
    u = cloud.user()
    assert_error(patch_node(cloud, node_id, {"data_host": "10.0.0.9"}, key=u.key), 403, "forbidden")
    r = cloud.admin("GET", f"/v1/admin/nodes/{node_id}")
    assert (r.json()["data_host"], r.json()["public_host"]) == (None, before["public_host"])

    r = patch_node(cloud, node_id, {"data_host": "10.9.8.7"})
    assert r.status_code == 200, r.text
    assert (r.json()["data_host"], r.json()["data_address"]) == ("10.9.8.7", "10.9.8.7"), r.json()
    assert "cards" in r.json()  # the node's detail, as GET answers
    r = patch_node(cloud, node_id, {"data_host": "ib0.gpu-7.example", "public_host": "gpu-7.example"})
    assert r.status_code == 200, r.text
    n = r.json()
    assert (n["data_host"], n["data_address"], n["public_host"]) == \
        ("ib0.gpu-7.example", "ib0.gpu-7.example", "gpu-7.example"), n
    # "" forgets the admin's: the agent's report, else the public host.
    r = patch_node(cloud, node_id, {"data_host": ""})
    n = r.json()
    assert n["data_host"] is None and n["data_address"] == (n["reported_data_address"] or "gpu-7.example"), n
    r = patch_node(cloud, node_id, {"public_host": ""})
    assert r.json()["public_host"] == "127.0.0.1", r.json()  # the agent URL's host

    # Registration takes data_host, with the same rules.
    base = {"agent_url": "http://127.0.0.1:1/nodes/x", "gpu_model": "MI450", "card_count": 8}
    r = cloud.admin("POST", "/v1/admin/nodes", json={**base, "name": "dh-bad", "data_host": "x y"})
    assert_error(r, 400, "invalid_field", "data_host")
    r = cloud.admin("POST", "/v1/admin/nodes", json={**base, "name": "dh-bad", "data_host": 12})
    assert_error(r, 400, "invalid_field", "data_host")
    assert cloud.d.sql("SELECT count(*) FROM nodes WHERE name = 'dh-bad'") == [(0,)]
    r = cloud.admin("POST", "/v1/admin/nodes", json={**base, "name": "dh-ok", "data_host": "fd00::7"})
    assert r.status_code == 201, r.text
    assert (r.json()["node"]["data_host"], r.json()["node"]["data_address"]) == ("fd00::7", "fd00::7")
    assert r.json()["node"]["reported_data_address"] is None


def test_reported_data_address_is_judged_and_stored(cloud):
    """The heartbeat stores the data_address an agent's facts report when it
    changes; one that is no address makes the facts malformed (a failed
    heartbeat, the reason naming it); none falls back to the public host."""
    from ssh_util import SshFakeAgent
    a = SshFakeAgent(None, name="fk")
    try:
        r = cloud.admin("POST", "/v1/admin/nodes", json={"name": "fk", "agent_url": a.url, "gpu_model": "MI450",
                                                         "card_count": 8, "public_host": "fk.example"})
        assert r.status_code == 201, r.text
        node_id = r.json()["node"]["id"]
        cloud.wait_nodes_up(["fk"])

        def node():
            return cloud.admin("GET", f"/v1/admin/nodes/{node_id}").json()
        n = node()
        assert (n["reported_data_address"], n["data_address"]) == (None, "fk.example"), n
        a.facts["data_address"] = "10.20.30.40"
        wait(lambda: node()["reported_data_address"] == "10.20.30.40", what="the reported address")
        assert node()["data_address"] == "10.20.30.40"
        a.facts["data_address"] = "not an address!"
        n = wait(lambda: (lambda n: n if n["state"] == "offline" else None)(node()), what="malformed facts")
        assert "data_address" in n["state_reason"], n
        assert n["reported_data_address"] == "10.20.30.40", n  # a refused report changes nothing
        a.facts["data_address"] = None
        wait(lambda: (lambda n: n["state"] == "ready" and n["reported_data_address"] is None)(node()),
             what="the node back, reporting none")
        assert node()["data_address"] == "fk.example"
    finally:
        a.close()


def test_rendezvous_timeout_field(cloud):
    """rendezvous_timeout_s: 30..3600, an integer, default the option (600);
    shown on the instance."""
    cloud.fleet(3, prefix="r-")
    u = cloud.user()
    for bad in ("60", 29, 3601, 0, -5, 60.5, True, [60], {"s": 60}):
        r = cloud.d.post("/v1/instances", key=u.key,
                         json={"gpu_type": "MI450", "image": "rocm/pytorch:2.3-rocm6.2", "card_count": 16,
                               "rendezvous_timeout_s": bad})
        assert_error(r, 400, "invalid_field", "rendezvous_timeout_s")
    assert cloud.d.sql("SELECT count(*) FROM instances") == [(0,)]
    assert cloud.create(u, card_count=8)["rendezvous_timeout_s"] == 600
    assert cloud.create(u, card_count=8, rendezvous_timeout_s=None)["rendezvous_timeout_s"] == 600
    inst = cloud.create(u, card_count=8, rendezvous_timeout_s=30)
    assert inst["rendezvous_timeout_s"] == 30
    assert cloud.get(u, inst["id"])["rendezvous_timeout_s"] == 30


@pytest.fixture
def local_cloud(new_daemon, tmp_path):
    """Volumes that are directories of this machine, which the operator
    says every node shares (volume_source_shared), as the sim fleet's do."""
    c = Cloud(new_daemon, tmp_path, {"volume_source_template": str(tmp_path / "volumes" / "{volume_id}"),
                                     "volume_source_shared": "false"})
    yield c
    c.close()


def test_local_volume_source_refused_for_multi_node(local_cloud):
    """A volume source that is a node-local directory: an instance of more
    than one node is refused at create (409 conflict, field volume_id, with
    nothing claimed) and at start, unless volume_source_shared; single-node
    instances take it."""
    cloud = local_cloud
    d = cloud.d
    cloud.fleet(2, prefix="l-")
    u = cloud.user()
    r = d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "image": "rocm/pytorch:2.3-rocm6.2",
                                                 "card_count": 16})
    assert_error(r, 409, "conflict", "volume_id")
    assert "local to each node" in r.json()["error"]["message"], r.text
    assert d.sql("SELECT count(*) FROM instances") == [(0,)]
    assert d.sql("SELECT count(*) FROM node_cards WHERE instance_id IS NOT NULL") == [(0,)]
    one = cloud.create(u, card_count=8)
    cloud.wait_state(u, one["id"], "running")
    cloud.action(u, one["id"], "terminate")
    cloud.wait_state(u, one["id"], "terminated")

    # The operator declares the directory shared: taken. Then not any more:
    # the stopped instance cannot start.
    d.options["volume_source_shared"] = "true"
    d.restart()
    inst = cloud.create(u, card_count=16)
    cloud.wait_state(u, inst["id"], "running")
    cloud.action(u, inst["id"], "stop")
    cloud.wait_state(u, inst["id"], "stopped")
    d.options["volume_source_shared"] = "false"
    d.restart()
    r = d.post(f"/v1/instances/{inst['id']}/start", key=u.key)
    assert_error(r, 409, "conflict", "volume_id")
    i = cloud.get(u, inst["id"])
    assert (i["state"], i["desired_state"], i["nodes"]) == ("stopped", "stopped", []), i
    assert d.sql("SELECT count(*) FROM node_cards WHERE instance_id IS NOT NULL") == [(0,)]


def _ssh_base(key, known_hosts):
    return ["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR"]


def test_thirty_two_nodes_rendezvous(cloud, tmp_path):
    """A 256-card instance on 32 nodes: every rank's spec carries the
    documented environment (MASTER_ADDR is rank 0's data address, the
    admin's data_host winning over the facts), the cluster member lists every
    rank in order with its data address, SSH port, login, cards and host key,
    and the instance's own key, which no API reply shows; rank 0 reaches rank
    31 by its hostfile name with that key."""
    d = cloud.d
    cloud.fleet(32, prefix="g-", sim=SSH_SIM)
    ids = node_ids(cloud)
    # Rank 0 is the first node by name (one fabric): its admin data_host wins.
    r = patch_node(cloud, ids["g-01"], {"data_host": "127.0.0.2"})
    assert r.status_code == 200, r.text
    assert (r.json()["data_address"], r.json()["reported_data_address"]) == ("127.0.0.2", "127.0.0.1"), r.text
    u = cloud.user(max_cards=256)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me", "-f", str(tmp_path / "me")],
                   check=True)
    mine = (tmp_path / "me.pub").read_text().strip()
    r = d.post("/v1/ssh-keys", key=u.key, json={"name": "me", "public_key": mine})
    assert r.status_code == 201, r.text
    inst = cloud.create(u, card_count=256)
    iid = inst["id"]
    cloud.wait_state(u, iid, "running")
    inst = cloud.check_running(u, iid)
    nodes = inst["nodes"]
    assert [p["node_name"] for p in nodes] == [f"g-{k:02d}" for k in range(1, 33)]
    assert nodes[0]["data_address"] == "127.0.0.2"
    assert all(p["data_address"] == "127.0.0.1" for p in nodes[1:]), nodes

    pub, priv = d.sql("SELECT internal_pubkey, internal_key FROM instances WHERE id = ?", (iid,))[0]
    assert pub.startswith("ssh-ed25519 AAAA") and priv.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    blob = pub.split()[1]
    # OpenSSH reads the private key and derives the public one from it.
    (tmp_path / "internal").write_text(priv)
    os.chmod(tmp_path / "internal", 0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(tmp_path / "internal")], capture_output=True, text=True,
                             timeout=60)
    assert derived.returncode == 0 and derived.stdout.split()[:2] == pub.split()[:2], derived

    by_rank = specs(cloud, iid)
    assert sorted(by_rank) == list(range(32))
    hosts_want = [{"name": f"rank{p['rank']}", "address": p["data_address"], "ssh_port": p["ssh"]["port"],
                   "user": f"{iid}-{p['rank']}", "slots": 8, "host_key": p["ssh"]["host_key"]} for p in nodes]
    for rank, spec in by_rank.items():
        env = spec["env"]
        want = {"GPURENT_NODE_RANK": str(rank), "NODE_RANK": str(rank), "GPURENT_NODE_COUNT": "32", "NNODES": "32",
                "GPURENT_GPUS_PER_NODE": "8", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "256",
                "MASTER_ADDR": "127.0.0.2", "MASTER_PORT": "29500", "GPURENT_INSTANCE_ID": iid,
                "GPURENT_HOSTFILE": "/etc/gpurent/hostfile"}
        assert {k: env.get(k) for k in want} == want, (rank, env)
        cluster = spec["cluster"]
        assert cluster["rank"] == rank and cluster["hosts"] == hosts_want, (rank, cluster["hosts"][:2])
        assert cluster["identity"] == priv
        # The users' keys and the instance's own, this rank's login.
        assert spec["ssh"]["user"] == f"{iid}-{rank}"
        assert spec["ssh"]["authorized_keys"] == [" ".join(mine.split()[:2]), " ".join(pub.split()[:2])]

    # Neither key is in any reply, event or log line; the user's key list is
    # the user's.
    texts = [json.dumps(cloud.get(u, iid)), json.dumps(cloud.events(u, iid)), d.stderr_text(), d.stdout_text(),
             d.get("/v1/instances", key=u.key).text, d.get("/v1/ssh-keys", key=u.key).text,
             d.get(f"/v1/instances/{iid}/ssh-config", key=u.key).text,
             cloud.admin("GET", "/v1/admin/nodes", params={"limit": 200}).text]
    for t in texts:
        assert blob not in t and "PRIVATE KEY" not in t and priv.splitlines()[1] not in t
    assert [k["fingerprint"] for k in d.get("/v1/ssh-keys", key=u.key).json()["data"]] != []
    assert len(d.get("/v1/ssh-keys", key=u.key).json()["data"]) == 1

    # In rank 0 with the user's key; from there to rank 31 by its hostfile
    # name with the instance's key (the agent's ~/.ssh/config).
    known = tmp_path / "known_hosts"
    known.write_text(nodes[0]["ssh"]["known_hosts"] + "\n")
    s0 = nodes[0]["ssh"]
    base = _ssh_base(tmp_path / "me", known) + ["-p", str(s0["port"]), f"{s0['user']}@{s0['host']}"]
    out = subprocess.run(base + ["cat \"$GPURENT_HOSTFILE\"; echo MASTER=$MASTER_ADDR"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out
    assert out.stdout == "".join(f"rank{k} slots=8\n" for k in range(32)) + "MASTER=127.0.0.2\n", out
    out = subprocess.run(base + ["ssh -F $HOME/.ssh/config -o BatchMode=yes rank31 'echo $GPURENT_NODE_RANK $NODE_RANK"
                                 " $NNODES $GPURENT_NODE_COUNT $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $LOCAL_WORLD_SIZE"
                                 " $GPURENT_GPUS_PER_NODE $GPURENT_INSTANCE_ID'"],
                         capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout) == (0, f"31 31 32 32 127.0.0.2 29500 256 8 8 {iid}\n"), out
    # DeepSpeed's pdsh launcher: pdsh over ssh from rank 0 to the hosts of
    # the hostfile at once, as `deepspeed --launcher pdsh` runs it. Rank 0
    # itself is left out only because its admin data_host above, 127.0.0.2,
    # is an address no sim agent listens on. (The sim container's ssh reads
    # the host user's ~/.ssh, hence the -F to the container's $HOME; in an
    # image HOME and ~ agree.)
    out = subprocess.run(base + ["PDSH_RCMD_TYPE=ssh PDSH_SSH_ARGS_APPEND=\"-F $HOME/.ssh/config -o BatchMode=yes\""
                                 " pdsh -S -f 1024 -w $(tail -n +2 \"$GPURENT_HOSTFILE\" | cut -d' ' -f1 | paste -sd,)"
                                 " 'echo rank=$GPURENT_NODE_RANK of $GPURENT_NODE_COUNT'"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out
    assert sorted(out.stdout.splitlines()) == sorted(f"rank{k}: rank={k} of 32" for k in range(1, 32)), out

    cloud.action(u, iid, "terminate")
    cloud.wait_state(u, iid, "terminated")
    cloud.wait_no_orphans()


def test_internal_key_kept_across_starts_and_only_for_multi_node(cloud):
    """The instance's key pair is made at create for more than one node and
    kept when it starts again on other nodes (the new ranks get the same
    identity and the user's own key list is untouched); a single-node
    instance has none, and its spec no cluster member."""
    d = cloud.d
    cloud.fleet(5, prefix="k-", sim=SSH_SIM)
    u = cloud.user()
    single = cloud.create(u, card_count=8)
    cloud.wait_state(u, single["id"], "running")
    assert d.sql("SELECT internal_pubkey, internal_key FROM instances WHERE id = ?", (single["id"],)) == [(None, None)]
    (spec,) = specs(cloud, single["id"]).values()
    assert "cluster" not in spec and spec["env"]["NNODES"] == "1" and spec["env"]["LOCAL_WORLD_SIZE"] == "8", spec
    assert spec["ssh"]["authorized_keys"] == [], spec
    inst = cloud.create(u, card_count=16)
    iid = inst["id"]
    cloud.wait_state(u, iid, "running")
    key = d.sql("SELECT internal_pubkey, internal_key FROM instances WHERE id = ?", (iid,))[0]
    first = specs(cloud, iid)
    nodes_before = [p["node_name"] for p in cloud.get(u, iid)["nodes"]]
    cloud.action(u, iid, "stop")
    cloud.wait_state(u, iid, "stopped")
    # Its nodes set aside, so the start lands elsewhere.
    ids = node_ids(cloud)
    for name in nodes_before:
        r = cloud.admin("POST", f"/v1/admin/nodes/{ids[name]}/state", json={"state": "cordoned"})
        assert r.status_code == 200, r.text
    cloud.action(u, iid, "start")
    cloud.wait_state(u, iid, "running")
    nodes_after = [p["node_name"] for p in cloud.get(u, iid)["nodes"]]
    assert set(nodes_after).isdisjoint(nodes_before), (nodes_before, nodes_after)
    assert d.sql("SELECT internal_pubkey, internal_key FROM instances WHERE id = ?", (iid,))[0] == key
    again = specs(cloud, iid)
    for rank in (0, 1):
        assert again[rank]["cluster"]["identity"] == first[rank]["cluster"]["identity"] == key[1]
        assert again[rank]["ssh"]["authorized_keys"] == [" ".join(key[0].split()[:2])]
    # Another instance has another key.
    for name in nodes_before:
        r = cloud.admin("POST", f"/v1/admin/nodes/{ids[name]}/state", json={"state": "ready"})
        assert r.status_code == 200, r.text
    busy = cloud.create(u, card_count=16)
    other = d.sql("SELECT internal_pubkey FROM instances WHERE id = ?", (busy["id"],))[0][0]
    assert other and other != key[0]
    assert d.get("/v1/ssh-keys", key=u.key).json()["data"] == []


def reconciler_passes(cloud):
    r = cloud.d.get("/metrics", key=cloud.d.admin_key)
    assert r.status_code == 200, r.text
    return sum(int(v) for v in re.findall(r'^gpurent_reconciler_passes_total\{kind="\w+"\} (\d+)$', r.text, re.M))


def first_listings_done(cloud):
    """Waits until every node's first heartbeat has had its workloads
    listed: that listing deletes workloads no instance owns, so a workload
    put on an agent directly before it would be gone."""
    exits = "SELECT workload_exits FROM node_liveness JOIN nodes ON id = node_id WHERE removed_at IS NULL"
    wait(lambda: all(x >= 0 for (x,) in cloud.d.sql(exits)), what="a first heartbeat from every node")
    before = reconciler_passes(cloud)
    # The pass the heartbeat asked for may have begun already: one more after it.
    wait(lambda: reconciler_passes(cloud) >= before + 2, what="the reconciler to list the new nodes")


def test_a_rank_that_cannot_start_ends_the_whole_instance(cloud_no_sweep):
    """One node refuses its rank (it holds its max_workloads already, one the
    control plane does not know): the attempt fails for every rank, every
    rank the other agents accepted is removed, nothing is billed. (A card
    held by such a workload would not do: the control plane deletes it and
    puts the rank again.)"""
    cloud = cloud_no_sweep
    d = cloud.d
    cloud.fleet(3, prefix="s-")
    cloud.fleet(1, prefix="t-", sim={"max_workloads": "1"})
    first_listings_done(cloud)
    r = cloud.agent("t-01", "PUT", "/v1/workloads/wl_squatter000000000001", json={"image": "busybox", "gpus": []})
    assert r.status_code == 201, r.text
    u = cloud.user()
    inst = cloud.create(u, card_count=32)
    i = cloud.wait_state(u, inst["id"], "failed")
    assert "gave up after 1 attempts" in i["state_reason"] and "t-01" in i["state_reason"], i
    assert i["nodes"] == [] and cloud.held_cards(inst["id"]) == {}
    assert d.sql("SELECT count(*) FROM running_intervals WHERE instance_id = ?", (inst["id"],)) == [(0,)]

    def only_squatter():
        wls = cloud.all_workloads()
        return all(w == [] for n, w in wls.items() if n != "t-01") and \
            [w["id"] for w in wls["t-01"]] == ["wl_squatter000000000001"]
    wait(only_squatter, what="every accepted rank to be removed")
    cloud.check_cards_consistent()


def test_a_node_lost_ends_the_whole_instance(cloud):
    """A node of a running multi-node instance dies: the instance is lost and
    the other ranks are removed at once."""
    a = cloud.fleet(1, prefix="a-")
    b = cloud.fleet(1, prefix="b-")
    u = cloud.user()
    inst = cloud.create(u, card_count=16)
    cloud.wait_state(u, inst["id"], "running")
    b.proc.kill()
    b.proc.wait()
    i = cloud.wait_state(u, inst["id"], "lost")
    assert "b-01" in i["state_reason"] and i["nodes"] == [], i
    wait(lambda: cloud.workloads("a-01") == [], what="rank 0 to be removed")
    cloud.wait_no_orphans(fleets=[a])
    assert cloud.held_cards(inst["id"]) == {}


def test_rendezvous_timeout_fails_the_attempt(cloud_one_attempt):
    """Rank 0 runs, rank 1 is still pulling: once rendezvous_timeout_s has
    passed since rank 0 was first seen running, the attempt fails and every
    rank is removed; never billed."""
    cloud = cloud_one_attempt
    d = cloud.d
    cloud.fleet(1, prefix="a-")
    cloud.fleet(1, prefix="b-", sim={"sim_pull_ms": "3600000"})
    u = cloud.user()
    inst = cloud.create(u, card_count=16, rendezvous_timeout_s=30)
    iid = inst["id"]

    def rank0_running():
        ns = cloud.get(u, iid)["nodes"]
        return ns and ns[0]["phase"] == "running" and ns[1]["phase"] == "pulling"
    wait(rank0_running, what="rank 0 running, rank 1 pulling")
    t0 = d.now()
    wait(lambda: d.sql("SELECT rendezvous_since FROM instances WHERE id = ?", (iid,)) == [(t0,)],
         what="the rendezvous to start")
    d.advance_clock(30)
    # Not yet: 30 s is the bound, not past it. A fresh pass after the clock
    # moved (the next event written at the new time) would have failed it.
    i = cloud.get(u, iid)
    assert i["state"] == "provisioning", i
    d.advance_clock(1)
    i = cloud.wait_state(u, iid, "failed")
    assert "rendezvous_timeout_s" in i["state_reason"] and "only 1 of 2" in i["state_reason"], i
    assert i["nodes"] == [] and cloud.held_cards(iid) == {}
    assert d.sql("SELECT count(*) FROM running_intervals WHERE instance_id = ?", (iid,)) == [(0,)]
    cloud.wait_no_orphans()
    assert all_empty(cloud)
    events = cloud.events(u, iid)
    assert events[-1]["state"] == "failed" and events[-1]["reason"] == i["state_reason"], events
