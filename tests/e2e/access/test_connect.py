"""Instances take the account's SSH keys, and say how to connect: the keys
an instance names (or all the account's) are snapshotted at create, at
every start and at every change of the account's keys into the workload
spec's `ssh` (contract 1 of issue 11), a change sent to running instances
at once; nodes
get a public_host and the SSH server their facts report (contract 2); each
rank of a running instance shows host, port, user, host key fingerprint, a
command and a known_hosts line, and GET /v1/instances/{id}/ssh-config is an
OpenSSH config the real `ssh -G` reads back."""
import subprocess

import pytest

from agent_util import poll
from harness import assert_error
from instances_util import DEADLINE, cloud  # noqa: F401  (fixture)
from inventory_util import register
from ssh_util import SshFakeAgent, add_key, fingerprint, keygen

SSH_FIELDS = {"host", "port", "user", "host_key", "host_key_fingerprint", "command", "known_hosts"}


@pytest.fixture
def host_key(tmp_path):
    line, path = keygen(tmp_path / "hostkey", comment="root@node7")
    return " ".join(line.split(" ")[:2]), fingerprint(path)[1]


@pytest.fixture
def fake(host_key):
    agents = []

    def make(port=2222, ssh=True, name="node7"):
        a = SshFakeAgent({"port": port, "host_key": host_key[0], "fingerprint": host_key[1]} if ssh else None,
                         name=name)
        agents.append(a)
        return a
    yield make
    for a in agents:
        a.close()


def register_fake(cloud, agent, name="node7", public_host="node7.example.com"):
    body = {"name": name, "agent_url": agent.url, "gpu_model": "MI450", "card_count": 8, "fabric": "fabric-a",
            "region": "local"}
    if public_host is not None:
        body["public_host"] = public_host
    r = cloud.admin("POST", "/v1/admin/nodes", json=body)
    assert r.status_code == 201, r.text
    node = r.json()["node"]
    cloud.wait_nodes_up([name])
    return node


def admin_node(cloud, node_id):
    r = cloud.admin("GET", f"/v1/admin/nodes/{node_id}")
    assert r.status_code == 200, r.text
    return r.json()


def key_only(line):
    return " ".join(line.split(" ")[:2])


def test_nodes_show_public_host_and_the_ssh_their_facts_report(cloud, fake, host_key):
    a = fake()
    node = register_fake(cloud, a)
    assert node["public_host"] == "node7.example.com"
    shown = poll(lambda: (lambda n: n if n["ssh"] else None)(admin_node(cloud, node["id"])), DEADLINE,
                 "the node's ssh from its facts")
    assert shown["ssh"] == {"port": 2222, "host_key": host_key[0], "fingerprint": host_key[1]}
    listed = [n for n in cloud.admin("GET", "/v1/admin/nodes").json()["data"] if n["id"] == node["id"]]
    assert listed[0]["ssh"] == shown["ssh"] and listed[0]["public_host"] == "node7.example.com"
    # The SSH server goes off: the node shows none.
    del a.facts["ssh"]
    poll(lambda: admin_node(cloud, node["id"])["ssh"] is None, DEADLINE, "ssh to go")


def test_public_host_defaults_to_the_agent_host_and_is_checked(cloud, fake):
    node = register_fake(cloud, fake(ssh=False), name="plain", public_host=None)
    assert node["public_host"] == "127.0.0.1" and node["ssh"] is None
    for bad in ("", "-x", "a b", "user@host", "[::1]", "h:22/x", "é.example", "x" * 254):
        body = {"name": "bad", "agent_url": "http://127.0.0.1:1", "gpu_model": "MI450", "card_count": 8,
                "public_host": bad}
        r = cloud.admin("POST", "/v1/admin/nodes", json=body)
        assert_error(r, 400, "invalid_field", "public_host")
    body = {"name": "bad", "agent_url": "http://127.0.0.1:1", "gpu_model": "MI450", "card_count": 8,
            "public_host": 7}
    assert_error(cloud.admin("POST", "/v1/admin/nodes", json=body), 400, "invalid_field", "public_host")


def test_facts_with_a_bad_ssh_member_are_malformed(cloud, fake, host_key):
    a = fake()
    node = register_fake(cloud, a)
    a.facts["ssh"] = {"port": 2222, "host_key": host_key[0], "fingerprint": "SHA256:not-it"}
    got = poll(lambda: (lambda n: n if "ssh.fingerprint" in n["state_reason"] else None)(
        admin_node(cloud, node["id"])), DEADLINE, "the bad fingerprint to be reported")
    assert got["missed_heartbeats"] >= 1, got


def test_connect_details_keys_in_the_spec_and_ssh_config(cloud, fake, host_key, tmp_path):
    a = fake()
    node = register_fake(cloud, a)
    poll(lambda: admin_node(cloud, node["id"])["ssh"], DEADLINE, "ssh facts")
    u = cloud.user()
    k1 = add_key(cloud.d, u, keygen(tmp_path / "u")[0], "one")
    k2 = add_key(cloud.d, u, keygen(tmp_path / "u", "ecdsa", 256)[0], "two")
    add_key(cloud.d, u, keygen(tmp_path / "u", "rsa", 2048)[0], "not named")
    inst = cloud.create(u, card_count=2, ssh_key_ids=[k2["id"], k1["id"]])
    assert inst["ssh_key_ids"] == [k2["id"], k1["id"]]
    running = cloud.wait_state(u, inst["id"], "running")
    # The agent got the named keys, without comments, for login <id>-0.
    (wl_id, spec), = a.specs()
    # In the account's order (created_at, id), whatever order they were named in.
    named = sorted((k1, k2), key=lambda k: (k["created_at"], k["id"]))
    assert spec["ssh"] == {"user": f"{inst['id']}-0", "authorized_keys": [key_only(k["public_key"]) for k in named]}
    ssh = running["nodes"][0]["ssh"]
    assert set(ssh) == SSH_FIELDS, ssh
    user = f"{inst['id']}-0"
    assert ssh == {"host": "node7.example.com", "port": 2222, "user": user, "host_key": host_key[0],
                   "host_key_fingerprint": host_key[1], "command": f"ssh -p 2222 {user}@node7.example.com",
                   "known_hosts": f"[node7.example.com]:2222 {host_key[0]}"}
    listed = [i for i in cloud.d.get("/v1/instances", key=u.key).json()["data"] if i["id"] == inst["id"]]
    assert listed[0]["nodes"][0]["ssh"] == ssh
    # The known_hosts line is one ssh-keygen finds the host key in.
    kh = tmp_path / "known_hosts"
    kh.write_text(ssh["known_hosts"] + "\n")
    out = subprocess.run(["ssh-keygen", "-F", "[node7.example.com]:2222", "-f", str(kh)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and host_key[0] in out.stdout, out
    # The config block, read back by the real ssh client.
    r = cloud.d.get(f"/v1/instances/{inst['id']}/ssh-config", key=u.key)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain"), r.text
    assert f"Host {user}\n" in r.text and host_key[1] in r.text, r.text
    cfg = tmp_path / "config"
    cfg.write_text(r.text)
    got = subprocess.run(["ssh", "-G", "-F", str(cfg), user], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    resolved = dict(line.split(" ", 1) for line in got.stdout.splitlines() if " " in line)
    assert (resolved["hostname"], resolved["port"], resolved["user"]) == ("node7.example.com", "2222", user)


def test_keys_reach_the_running_instance_and_are_taken_again_at_start(cloud, fake, tmp_path):
    a = fake()
    node = register_fake(cloud, a)
    poll(lambda: admin_node(cloud, node["id"])["ssh"], DEADLINE, "ssh facts")
    u = cloud.user()
    keys = [add_key(cloud.d, u, keygen(tmp_path)[0], f"k{i}") for i in range(3)]
    inst = cloud.create(u, card_count=1)  # names none: every key of the account
    assert inst["ssh_key_ids"] is None
    cloud.wait_state(u, inst["id"], "running")
    first = a.specs()[-1][1]["ssh"]["authorized_keys"]
    assert sorted(first) == sorted(key_only(k["public_key"]) for k in keys)
    wl_id = a.specs()[-1][0]
    assert cloud.d.delete(f"/v1/ssh-keys/{keys[0]['id']}", key=u.key).status_code == 204
    # The running instance is sent the account's keys as they are now.
    kept = sorted(key_only(k["public_key"]) for k in keys[1:])
    poll(lambda: any(w == wl_id and sorted(sent) == kept for w, sent in list(a.key_puts)), DEADLINE,
         "the keys without the deleted one to be sent")
    assert cloud.get(u, inst["id"])["state"] == "running"
    cloud.action(u, inst["id"], "stop")
    cloud.wait_state(u, inst["id"], "stopped")
    later = add_key(cloud.d, u, keygen(tmp_path)[0], "later")
    cloud.action(u, inst["id"], "start")
    cloud.wait_state(u, inst["id"], "running")
    again = a.specs()[-1][1]["ssh"]["authorized_keys"]
    assert sorted(again) == sorted(key_only(k["public_key"]) for k in keys[1:] + [later])


def test_port_22_gives_plain_known_hosts(cloud, fake, host_key):
    a = fake(port=22)
    node = register_fake(cloud, a, public_host="10.0.0.7")
    poll(lambda: admin_node(cloud, node["id"])["ssh"], DEADLINE, "ssh facts")
    u = cloud.user()
    inst = cloud.create(u, card_count=1)
    ssh = cloud.wait_state(u, inst["id"], "running")["nodes"][0]["ssh"]
    assert ssh["command"] == f"ssh {inst['id']}-0@10.0.0.7"
    assert ssh["known_hosts"] == f"10.0.0.7 {host_key[0]}"


def test_a_node_without_ssh_shows_null_and_gets_no_ssh_spec(cloud, tmp_path):
    f = cloud.fleet(1, sim={"ssh_listen": ""})  # its SSH server off
    u = cloud.user()
    k = add_key(cloud.d, u, keygen(tmp_path)[0])
    inst = cloud.create(u, card_count=1, ssh_key_ids=[k["id"]])
    running = cloud.wait_state(u, inst["id"], "running")
    assert running["nodes"][0]["ssh"] is None
    name = running["nodes"][0]["node_name"]
    wl = [w for w in cloud.workloads(name)][0]
    assert "ssh" not in cloud.record(name, wl["id"])["spec"]
    r = cloud.d.get(f"/v1/instances/{inst['id']}/ssh-config", key=u.key)
    assert r.status_code == 200 and "reports no SSH server" in r.text and "\nHost " not in r.text, r.text
    assert f


def test_ssh_key_ids_are_checked(cloud, tmp_path):
    cloud.fleet(1)
    u, other = cloud.user(), cloud.user()
    mine = add_key(cloud.d, u, keygen(tmp_path)[0])
    theirs = add_key(cloud.d, other, keygen(tmp_path)[0])
    for ids, why in [([theirs["id"]], "no SSH key"), (["sshk_aaaaaaaaaaaaaaaaaaaa"], "no SSH key"),
                     (["nope"], "no SSH key"), ([mine["id"], mine["id"]], "twice"),
                     ([1], "array of SSH key ids"), ([None], "array of SSH key ids"),
                     (["x" * 40], "array of SSH key ids"), ([mine["id"]] * 65, "at most 64")]:
        r = cloud.d.post("/v1/instances", key=u.key,
                         json={"gpu_type": "MI450", "image": "rocm/pytorch:2.3-rocm6.2", "card_count": 1,
                               "ssh_key_ids": ids})
        err = assert_error(r, 400, "invalid_field", "ssh_key_ids")
        assert why in err["message"], (ids, err)
    for wrong in ("sshk_x", {"a": 1}, 3):
        r = cloud.d.post("/v1/instances", key=u.key,
                         json={"gpu_type": "MI450", "image": "rocm/pytorch:2.3-rocm6.2", "card_count": 1,
                               "ssh_key_ids": wrong})
        assert_error(r, 400, "invalid_field", "ssh_key_ids")
    assert cloud.d.get("/v1/instances", key=u.key).json()["data"] == []
    # An empty list names no key: the instance gets none.
    inst = cloud.create(u, card_count=1, ssh_key_ids=[])
    assert cloud.d.sql("SELECT ssh_keys, ssh_key_ids FROM instances WHERE id = ?", (inst["id"],)) == [("[]", "[]")]


def test_ssh_config_of_another_user_or_not_running(cloud, fake):
    a = fake()
    register_fake(cloud, a)
    u, other = cloud.user(), cloud.user()
    inst = cloud.create(u, card_count=1)
    cloud.wait_state(u, inst["id"], "running")
    assert_error(cloud.d.get(f"/v1/instances/{inst['id']}/ssh-config", key=other.key), 404, "not_found")
    assert_error(cloud.d.get("/v1/instances/ins_aaaaaaaaaaaaaaaaaaaa/ssh-config", key=u.key), 404, "not_found")
    assert_error(cloud.d.get("/v1/instances/nope/ssh-config", key=u.key), 404, "not_found")
    assert_error(cloud.d.get(f"/v1/instances/{inst['id']}/ssh-config"), 401, "unauthorized")
    cloud.action(u, inst["id"], "stop")
    cloud.wait_state(u, inst["id"], "stopped")
    err = assert_error(cloud.d.get(f"/v1/instances/{inst['id']}/ssh-config", key=u.key), 409, "invalid_state")
    assert err["state"] == "stopped", err
    assert all(p["ssh"] is None for p in cloud.get(u, inst["id"])["nodes"])
