"""test_access_flow.py: what a renter does once an instance runs, end to end
with the real OpenSSH client: a key on the account, the connect details and
ssh-config from the API, a command in every rank of a 16-card instance, a
file copied into /shared through rank 0 and read back through rank 1 and,
after a stop and a start on other nodes, through the new rank 0; keys of
another user, deleted keys, wrong names and passwords refused; host keys
pinned from the API."""
import hashlib
import os
import subprocess

import pytest

from agent_util import poll
from instances_util import DEADLINE, Cloud

SSH_SIM = {"ssh_listen": "127.0.0.1:0"}


def keygen(tmp, name):
    path = tmp / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    return path, (tmp / f"{name}.pub").read_text().strip()


def ssh_base(key, known_hosts):
    return ["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR"]


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


class Renter:
    def __init__(self, cloud, tmp, name):
        self.cloud, self.tmp = cloud, tmp
        self.acct = cloud.user()
        self.key, self.pub = keygen(tmp, name)
        r = cloud.d.post("/v1/ssh-keys", key=self.acct.key, json={"name": name, "public_key": self.pub})
        assert r.status_code == 201, r.text
        self.key_id = r.json()["id"]

    def ranks(self, inst_id):
        def ready():
            body = self.cloud.get(self.acct, inst_id)
            nodes = body["nodes"]
            return nodes if body["state"] == "running" and all(n.get("ssh") for n in nodes) else None
        return poll(ready, DEADLINE, f"{inst_id}'s connect details")

    def known_hosts(self, ranks, name="known_hosts"):
        path = self.tmp / name
        path.write_text("".join(r["ssh"]["known_hosts"] + "\n" for r in ranks))
        return path

    def ssh(self, rank, command, key=None, user=None, extra=(), known_hosts=None):
        s = rank["ssh"]
        argv = ssh_base(key or self.key, known_hosts or self.tmp / "known_hosts") + list(extra)
        argv += ["-p", str(s["port"]), f"{user or s['user']}@{s['host']}", command]
        return run(argv)

    def sftp(self, rank, batch, known_hosts=None):
        s = rank["ssh"]
        script = self.tmp / "batch"
        script.write_text(batch)
        argv = ["sftp", "-F", "/dev/null", "-i", str(self.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts or self.tmp / 'known_hosts'}",
                "-P", str(s["port"]), "-b", str(script), f"{s['user']}@{s['host']}"]
        return run(argv)


@pytest.fixture
def shared_cloud(new_daemon, tmp_path):
    """A cloud whose volumes are directories of this machine that every sim
    node sees, as a network file system would make them (so the operator
    says so: volume_source_shared)."""
    c = Cloud(new_daemon, tmp_path, {"volume_source_template": str(tmp_path / "volumes" / "{volume_id}"),
                                     "volume_source_shared": "true"})
    yield c
    c.close()


def set_node_state(cloud, names, state):
    ids = {name: node_id for node_id, name in cloud.d.sql("SELECT id, name FROM nodes")}
    for name in names:
        r = cloud.admin("POST", f"/v1/admin/nodes/{ids[name]}/state", json={"state": state, "reason": "test"})
        assert r.status_code == 200, r.text


def test_a_renter_gets_in_copies_files_and_comes_back(shared_cloud, tmp_path):
    cloud = shared_cloud
    cloud.fleet(2, prefix="a-", sim=SSH_SIM)
    cloud.fleet(2, prefix="b-", sim=SSH_SIM)
    me = Renter(cloud, tmp_path, "me")
    inst = cloud.create(me.acct, card_count=16)
    ranks = me.ranks(inst["id"])
    assert [r["rank"] for r in ranks] == [0, 1]
    me.known_hosts(ranks)
    for r in ranks:
        s = r["ssh"]
        assert s["user"] == f"{inst['id']}-{r['rank']}"
        assert s["command"] == f"ssh -p {s['port']} {s['user']}@{s['host']}"
        assert s["host_key_fingerprint"].startswith("SHA256:")
        out = me.ssh(r, "echo out-$((40 + 2)); echo err >&2; exit 7")
        assert (out.returncode, out.stdout, out.stderr) == (7, "out-42\n", "err\n"), out
    tty = me.ssh(ranks[0], "tty", extra=["-tt"])
    assert tty.returncode == 0 and "/dev/pts/" in tty.stdout, tty

    # A file into /shared through rank 0, read back through rank 1.
    data = os.urandom(3 * 1024 * 1024 + 17)
    (tmp_path / "dataset.bin").write_bytes(data)
    put = me.sftp(ranks[0], f"put {tmp_path / 'dataset.bin'} /shared/dataset.bin\n")
    assert put.returncode == 0, put
    got = me.sftp(ranks[1], f"get /shared/dataset.bin {tmp_path / 'back.bin'}\n")
    assert got.returncode == 0, got
    assert hashlib.sha256((tmp_path / "back.bin").read_bytes()).digest() == hashlib.sha256(data).digest()
    escape = me.sftp(ranks[1], f"get /shared/../../../etc/hostname {tmp_path / 'escaped'}\n")
    assert not (tmp_path / "escaped").exists() or (tmp_path / "escaped").read_bytes() != \
        open("/etc/hostname", "rb").read(), escape

    # The ssh-config block works as it is.
    r = cloud.d.get(f"/v1/instances/{inst['id']}/ssh-config", key=me.acct.key)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain"), r.text
    (tmp_path / "config").write_text(r.text)
    via = run(["ssh", "-F", str(tmp_path / "config"), "-i", str(me.key), "-o", "IdentitiesOnly=yes",
               "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", f"UserKnownHostsFile={tmp_path / 'known_hosts'}", f"{inst['id']}-1", "echo via-config"])
    assert via.returncode == 0 and via.stdout == "via-config\n", via

    # Refusals: another user's key, a wrong user name, a password.
    other = Renter(cloud, tmp_path, "other")
    assert me.ssh(ranks[0], "true", key=other.key).returncode == 255
    assert me.ssh(ranks[0], "true", user=f"{inst['id']}-9").returncode == 255
    pw = me.ssh(ranks[0], "true", extra=["-o", "PreferredAuthentications=password,keyboard-interactive"])
    assert pw.returncode == 255, pw

    # Stop, move to the other fleet, start: the file is still there, and a
    # key deleted from the account no longer opens the new nodes.
    second_key, second_pub = keygen(tmp_path, "second")
    r = cloud.d.post("/v1/ssh-keys", key=me.acct.key, json={"name": "second", "public_key": second_pub})
    assert r.status_code == 201, r.text
    cloud.action(me.acct, inst["id"], "stop")
    cloud.wait_state(me.acct, inst["id"], "stopped")
    assert cloud.d.delete(f"/v1/ssh-keys/{me.key_id}", key=me.acct.key).status_code in (200, 204)
    old_nodes = [r["node_name"] for r in ranks]
    set_node_state(cloud, old_nodes, "cordoned")
    cloud.action(me.acct, inst["id"], "start")
    moved = me.ranks(inst["id"])
    assert not {r["node_name"] for r in moved} & set(old_nodes), moved
    me.known_hosts(moved, "known_hosts")
    assert me.ssh(moved[0], "true").returncode == 255            # the deleted key
    me.key = second_key
    got = me.sftp(moved[0], f"get /shared/dataset.bin {tmp_path / 'again.bin'}\n")
    assert got.returncode == 0, got
    assert (tmp_path / "again.bin").read_bytes() == data

    # A node whose host key is not the one pinned is refused.
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(moved[1]["ssh"]["known_hosts"].replace(f"[{moved[1]['ssh']['host']}]:{moved[1]['ssh']['port']}",
                                                            f"[{moved[0]['ssh']['host']}]:{moved[0]['ssh']['port']}")
                     + "\n")
    bad = me.ssh(moved[0], "true", known_hosts=wrong)
    assert bad.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in bad.stderr, bad
