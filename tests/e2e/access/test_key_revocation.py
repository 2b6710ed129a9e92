"""test_key_revocation.py: a change of an account's SSH keys reaches its
running instances at once, with the real OpenSSH client against sim nodes:
a key deleted stops logging in and the session it opened ends, a key added
logs in without a restart, a suspended account's sessions end and its
logins are refused, and a node that holds other keys than the account's
(a send it missed) is given them again by the reconciler's sweep."""
import hashlib
import re
import shutil
import subprocess

import pytest

from agent_util import poll
from instances_util import DEADLINE, cloud, cloud_with  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(not shutil.which("ssh") or not shutil.which("ssh-keygen"),
                                reason="needs openssh-client")

SSH_SIM = {"ssh_listen": "127.0.0.1:0", "log_level": "info"}  # info: the logins, waited on


def keygen(tmp, name):
    path = tmp / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True,
                   timeout=30)
    return path, (tmp / f"{name}.pub").read_text().strip()


def digest(lines):
    """The agent's ssh_keys_digest (AGENT_PROTOCOL.md) of these key lines."""
    return hashlib.sha256("".join(" ".join(line.split()[:2]) + "\n" for line in lines).encode()).hexdigest()


class Rank:
    """Rank 0 of a running instance, reached with the real ssh client."""

    def __init__(self, cloud, acct, inst_id, tmp):
        def ready():
            body = cloud.get(acct, inst_id)
            return body["nodes"][0] if body["state"] == "running" and body["nodes"][0].get("ssh") else None
        node = poll(ready, DEADLINE, f"{inst_id}'s connect details")
        self.cloud, self.ssh_details, self.node_name = cloud, node["ssh"], node["node_name"]
        self.known_hosts = tmp / f"known_hosts-{inst_id}"
        self.known_hosts.write_text(self.ssh_details["known_hosts"] + "\n")
        self.wl_id = cloud.d.sql("SELECT workload_id FROM instance_nodes WHERE instance_id = ?", [inst_id])[0][0]

    def argv(self, key, *command, extra=()):
        s = self.ssh_details
        return ["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR", *extra, "-p", str(s["port"]),
                f"{s['user']}@{s['host']}", *command]

    def run(self, key, command="echo in"):
        return subprocess.run(self.argv(key, command), capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)

    def hold(self, key):
        """A logged-in connection with no channel (-N), which only the server
        ends; returned once the agent logged it in."""
        line = f"ssh login: node {self.node_name} workload {self.wl_id} user {self.ssh_details['user']} key"
        fleet = self.cloud.node_fleet(self.node_name)
        before = fleet.stderr_text().count(line)
        p = subprocess.Popen(self.argv(key, extra=["-N"]), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        poll(lambda: fleet.stderr_text().count(line) > before or p.poll() is not None, DEADLINE, "the held login")
        assert p.poll() is None, "the held login ended at once"
        return p

    def digest(self):
        return rank_digest(self.cloud, self.node_name, self.wl_id)


def rank_digest(cloud, node_name, wl_id):
    """The ssh_keys_digest a rank's agent reports for its workload."""
    wl = [w for w in cloud.workloads(node_name) if w["id"] == wl_id]
    return wl[0]["ssh_keys_digest"] if wl else None


def sweeps(cloud):
    r = cloud.d.get("/metrics", key=cloud.d.admin_key)
    assert r.status_code == 200, r.text
    return int(re.search(r'^gpurent_reconciler_passes_total\{kind="sweep"\} (\d+)$', r.text, re.M).group(1))


def account_keys(cloud, acct):
    """The account's key lines in the order instances hold them (the list's:
    oldest first, then by id)."""
    r = cloud.d.get("/v1/ssh-keys", key=acct.key)
    assert r.status_code == 200, r.text
    return [k["public_key"] for k in r.json()["data"]]


def add_key(cloud, acct, name, pub):
    r = cloud.d.post("/v1/ssh-keys", key=acct.key, json={"name": name, "public_key": pub})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def end(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)


# A reconciler that sweeps once an hour: what reaches a running instance
# within a test's wait can only be the send on change.
pushed_cloud = cloud_with(reconcile_sweep_ms="3600000")


def test_a_deleted_key_stops_at_once_and_an_added_one_logs_in(pushed_cloud, tmp_path):
    cloud = pushed_cloud
    cloud.fleet(1, sim=SSH_SIM)
    acct = cloud.user()
    old_key, old_pub = keygen(tmp_path, "old")
    new_key, new_pub = keygen(tmp_path, "new")
    old_id = add_key(cloud, acct, "old", old_pub)
    inst = cloud.create(acct, card_count=1)
    rank = Rank(cloud, acct, inst["id"], tmp_path)
    held = []
    try:
        assert rank.run(old_key).stdout == "in\n"
        assert rank.run(new_key).returncode == 255
        held.append(rank.hold(old_key))

        # Added: the running instance takes it, no restart.
        add_key(cloud, acct, "new", new_pub)
        poll(lambda: rank.digest() == digest(account_keys(cloud, acct)), DEADLINE, "the added key to reach the node")
        got = rank.run(new_key)
        assert (got.returncode, got.stdout) == (0, "in\n"), got
        held.append(rank.hold(new_key))

        # Deleted: the session it opened ends, and it logs in no more; the
        # other key's session goes on.
        assert cloud.d.delete(f"/v1/ssh-keys/{old_id}", key=acct.key).status_code == 204
        assert held[0].wait(timeout=DEADLINE) == 255
        assert rank.digest() == digest([new_pub])
        refused = rank.run(old_key)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
        assert held[1].poll() is None
        assert rank.run(new_key).stdout == "in\n"
        # Still running, never restarted: one start, one run.
        assert cloud.get(acct, inst["id"])["state"] == "running"
        starts = cloud.d.sql("SELECT count(*) FROM instance_events WHERE instance_id = ? AND state = 'provisioning'",
                             [inst["id"]])[0][0]
        assert starts == 1
    finally:
        end(held)


def test_a_suspended_accounts_sessions_end_and_its_logins_are_refused(cloud, tmp_path):
    cloud.fleet(1, sim=SSH_SIM)
    acct = cloud.user()
    key, pub = keygen(tmp_path, "k")
    add_key(cloud, acct, "k", pub)
    inst = cloud.create(acct, card_count=1)
    rank = Rank(cloud, acct, inst["id"], tmp_path)
    held = []
    try:
        held.append(rank.hold(key))
        r = cloud.admin("POST", f"/v1/admin/users/{acct.id}/suspend", json={"reason": "leaked key abuse"})
        assert r.status_code == 200 and r.json()["instances_stopped"] == 1, r.text
        assert held[0].wait(timeout=DEADLINE) == 255
        refused = rank.run(key)
        assert refused.returncode == 255, refused
        # The account can no longer read it: the database says it stopped.
        poll(lambda: cloud.d.sql("SELECT state FROM instances WHERE id = ?", [inst["id"]])[0][0] == "stopped",
             DEADLINE, "the instance to stop")
    finally:
        end(held)


def test_the_sweep_gives_a_node_that_missed_a_change_the_accounts_keys(cloud, tmp_path):
    """A node that holds other keys than the account's (here put there behind
    gpurentd's back, as a node that was down when a key was deleted would
    still hold the old set) gets the account's keys at the next sweep, and
    the key it should not have held stops logging in."""
    cloud.fleet(1, sim=SSH_SIM)
    acct = cloud.user()
    key, pub = keygen(tmp_path, "mine")
    stray_key, stray_pub = keygen(tmp_path, "stray")
    add_key(cloud, acct, "mine", pub)
    inst = cloud.create(acct, card_count=1)
    rank = Rank(cloud, acct, inst["id"], tmp_path)
    held = []
    try:
        stray_line = " ".join(stray_pub.split()[:2])
        r = cloud.agent(rank.node_name, "PUT", f"/v1/workloads/{rank.wl_id}/ssh-keys",
                        json={"authorized_keys": [stray_line]})
        assert r.status_code == 200, r.text
        held.append(rank.hold(stray_key))
        assert held[0].wait(timeout=DEADLINE) == 255
        poll(lambda: rank.digest() == digest([pub]), DEADLINE, "the sweep to restore the account's keys")
        assert rank.run(stray_key).returncode == 255
        assert rank.run(key).stdout == "in\n"
    finally:
        end(held)


def test_every_rank_of_a_gang_gets_the_change_and_keeps_its_own_key(cloud, tmp_path):
    """A two-node instance: a deleted key reaches both ranks, each still
    holding the instance's own key its ranks log in to each other with, and
    the sweeps that follow find nothing to send again."""
    cloud.fleet(2, sim=SSH_SIM)
    acct = cloud.user()
    _, pub_a = keygen(tmp_path, "a")
    _, pub_b = keygen(tmp_path, "b")
    a_id = add_key(cloud, acct, "a", pub_a)
    add_key(cloud, acct, "b", pub_b)
    inst = cloud.create(acct, card_count=16)
    cloud.wait_state(acct, inst["id"], "running")
    internal = cloud.d.sql("SELECT internal_pubkey FROM instances WHERE id = ?", [inst["id"]])[0][0]
    ranks = cloud.d.sql("SELECT n.name, p.workload_id FROM instance_nodes p JOIN nodes n ON n.id = p.node_id"
                        " WHERE p.instance_id = ? ORDER BY p.rank", [inst["id"]])
    assert len(ranks) == 2
    for name, wl in ranks:
        assert rank_digest(cloud, name, wl) == digest(account_keys(cloud, acct) + [internal])
    assert cloud.d.delete(f"/v1/ssh-keys/{a_id}", key=acct.key).status_code == 204
    want = digest([pub_b, internal])
    for name, wl in ranks:
        poll(lambda: rank_digest(cloud, name, wl) == want, DEADLINE, f"rank on {name} to drop the key")
    # Two sweeps later nothing was found to differ: each compares what it
    # sent with what it should hold, the instance key included. (A sweep
    # that read the nodes while the change was on its way may have sent it
    # once more: only the log after the sweep under way now counts.)
    seen = sweeps(cloud)
    poll(lambda: sweeps(cloud) >= seen + 1, DEADLINE, "the sweep under way to end")
    seen, logged = sweeps(cloud), len(cloud.d.stderr_text())
    poll(lambda: sweeps(cloud) >= seen + 2, DEADLINE, "two sweeps")
    assert "holds other SSH keys" not in cloud.d.stderr_text()[logged:]
