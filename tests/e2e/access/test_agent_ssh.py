"""test_agent_ssh.py: the agent's SSH server end to end, with Debian's real
OpenSSH client against a standalone sim agent: a workload PUT with a spec
whose ssh member names a user and keys made by ssh-keygen, then commands
(output, stderr apart, exit codes, signals), a PTY, refusals (wrong user,
another key, a workload not running, a password, no spec ssh), failed login
attempts of every kind counted toward ssh_max_auth_tries as sshd counts
them (the real client with several keys still logging in), the host key
reported in facts, kept across a restart and pinned by StrictHostKeyChecking,
and `ssh -L` reaching a server inside the workload but not one outside it.
"""
import fcntl
import hashlib
import os
import pty
import re
import select
import shutil
import signal
import socket
import struct
import termios
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import pytest
from cryptography.hazmat.primitives import serialization

from agent_util import AGENT, Agent, FakeControlPlane, Fleet, assert_error, poll
from harness import kernel_buffer_max
from ports import free_port
from ssh_raw import MSG_GLOBAL_REQUEST, MSG_SERVICE_REQUEST, MSG_USERAUTH_FAILURE, RawSSH, ssh_string, userauth

pytestmark = pytest.mark.skipif(not shutil.which("ssh") or not shutil.which("ssh-keygen"),
                                reason="needs openssh-client")


def stop_client(proc):
    """Ends an ssh client the test started (only cleaning up: the tunnel's
    work is checked before). SIGTERM, then SIGKILL if it has not gone
    within 30 s, as seen now and then on a loaded machine."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def keygen(directory, name):
    path = os.path.join(str(directory), name)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path], check=True, timeout=30)
    with open(path + ".pub") as f:
        return path, " ".join(f.read().split()[:2])


def wl_id():
    return "wl_" + uuid.uuid4().hex[:20]


class Node:
    """A sim agent and what a client needs to reach its SSH server."""

    def __init__(self, directory, **options):
        self.dir = str(directory)
        self.agent = Agent(os.path.join(self.dir, "agent"), options=options)
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        self.pin()

    def facts(self):
        return self.agent.get("/v1/facts").json()["ssh"]

    def pin(self):
        f = self.facts()
        with open(self.known_hosts, "w") as out:
            out.write(f"[127.0.0.1]:{f['port']} {f['host_key']}\n")
        self.port = f["port"]

    def ssh_args(self, key, user, *command, extra=()):
        return ["ssh", "-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                "-p", str(self.port), *extra, f"{user}@127.0.0.1", *command]

    def ssh(self, key, user, *command, extra=(), timeout=30, input=None):
        return subprocess.run(self.ssh_args(key, user, *command, extra=extra), capture_output=True, text=True,
                              timeout=timeout, input=input, stdin=None if input is not None else subprocess.DEVNULL)

    def ssh_background(self, key, user, *command, stdout=subprocess.DEVNULL):
        """ssh running on its own: the Popen."""
        return subprocess.Popen(self.ssh_args(key, user, *command), stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=subprocess.DEVNULL)

    def run_workload(self, user, keys, volume=None, image="img", wait="running"):
        wid = wl_id()
        spec = {"image": image, "gpus": [], "ssh": {"user": user, "authorized_keys": keys}}
        if volume:
            spec["volumes"] = [{"source": volume, "target": "/shared"}]
        r = self.agent.put(f"/v1/workloads/{wid}", json=spec)
        assert r.status_code == 201, r.text
        if wait:
            self.agent.wait_phase(wid, [wait])
        return wid

    def stop(self):
        self.agent.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {"mine": keygen(d, "mine"), "other": keygen(d, "other")}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = Node(tmp_path_factory.mktemp("ssh"))
    yield n
    n.stop()


@pytest.fixture(scope="module")
def workload(node, keys, tmp_path_factory):
    vol = str(tmp_path_factory.mktemp("vol"))
    wid = node.run_workload("ins_abc-0", [keys["mine"][1]], volume=vol)
    return {"id": wid, "user": "ins_abc-0", "volume": vol}


def test_facts_report_port_host_key_and_fingerprint(node):
    f = node.facts()
    assert f["port"] > 0 and f["host_key"].startswith("ssh-ed25519 ")
    # The fingerprint is ssh-keygen's own.
    p = subprocess.run(["ssh-keygen", "-l", "-f", "-"], input=f["host_key"] + "\n", capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[1] == f["fingerprint"]
    key = os.path.join(node.agent.state_dir, "ssh_host_ed25519_key")
    assert os.stat(key).st_mode & 0o777 == 0o600


def test_command_output_stderr_and_exit_code(node, keys, workload):
    p = node.ssh(keys["mine"][0], workload["user"], "echo out; echo err >&2; exit 3")
    assert p.returncode == 3, p.stderr
    assert p.stdout == "out\n"
    assert "err\n" in p.stderr
    p = node.ssh(keys["mine"][0], workload["user"], "true")
    assert p.returncode == 0 and p.stdout == ""


def test_command_runs_in_the_sim_container(node, keys, workload):
    p = node.ssh(keys["mine"][0], workload["user"], 'pwd; echo "$GPURENT_WORKLOAD"; echo hi > shared/x; tty')
    lines = p.stdout.splitlines()
    assert lines[0] == os.path.join(node.agent.state_dir, "containers", workload["id"])
    assert lines[1] == workload["id"]
    assert lines[2] == "not a tty"
    assert p.returncode == 1  # tty's status without a terminal
    with open(os.path.join(workload["volume"], "x")) as f:
        assert f.read() == "hi\n"


def test_a_session_knows_its_connection_as_sshd_says_it(node, keys, workload):
    """SSH_CLIENT and SSH_CONNECTION, as sshd sets them, and TERM only with
    a terminal: scripts and editors' remote modes read them."""
    p = node.ssh(keys["mine"][0], workload["user"], 'echo "$SSH_CLIENT|$SSH_CONNECTION|${TERM-unset}"')
    assert p.returncode == 0, p.stderr
    client, connection, term = p.stdout.strip().split("|")
    addr, cport, sport = client.split()
    assert (addr, sport) == ("127.0.0.1", str(node.port)) and 0 < int(cport) < 65536, client
    assert connection.split() == [addr, cport, "127.0.0.1", str(node.port)], connection
    assert term == "unset"
    p = node.ssh(keys["mine"][0], workload["user"], 'echo "$TERM|$SSH_CONNECTION"', extra=["-tt"],
                 input="")
    assert p.stdout.replace("\r", "").strip().split("|")[1].split()[2:] == ["127.0.0.1", str(node.port)], p.stdout


def test_stdin_reaches_the_command(node, keys, workload):
    data = "line\n" * 20000
    p = node.ssh(keys["mine"][0], workload["user"], "wc -l", input=data)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "20000"


def test_one_connection_runs_more_commands_than_its_channel_limit(node, keys, workload):
    """A multiplexed client (ControlMaster, an IDE's remote) runs every
    command on one connection: finished channels are freed, so the limit of
    16 is on channels open at once (the 17th used to be refused)."""
    # The control socket in a short directory, named by its hash (%C): a
    # Unix socket's path has at most 107 bytes, and pytest's own
    # directories grow with each run.
    sockets = tempfile.mkdtemp(prefix="gpr-cm-")
    mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={sockets}/%C", "-o", "ControlPersist=60"]
    logins = node.agent.stderr_text().count("ssh login: ")
    try:
        for i in range(24):
            p = node.ssh(keys["mine"][0], workload["user"], f"echo run-{i}", extra=mux)
            assert p.returncode == 0 and p.stdout == f"run-{i}\n", (i, p.stderr)
        assert node.agent.stderr_text().count("ssh login: ") == logins + 1  # all on one connection
    finally:
        node.ssh(keys["mine"][0], workload["user"], extra=[*mux, "-O", "exit"])
        shutil.rmtree(sockets, ignore_errors=True)


def test_refused_requests_close_their_channel_on_a_shared_connection(node, keys, workload):
    """A subsystem the server refuses closes its channel, as sshd does: over
    one multiplexed connection each refused request returns at once (it
    used to wait for ever), and more of them than the connection's 16
    channels leave room for the next command."""
    sockets = tempfile.mkdtemp(prefix="gpr-cm-")
    mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={sockets}/%C", "-o", "ControlPersist=60"]
    try:
        assert node.ssh(keys["mine"][0], workload["user"], "true", extra=mux).returncode == 0
        for _ in range(20):
            p = node.ssh(keys["mine"][0], workload["user"], "nosuch", extra=[*mux, "-s"])
            assert p.returncode != 0, p.stdout
        p = node.ssh(keys["mine"][0], workload["user"], "echo still", extra=mux)
        assert p.returncode == 0 and p.stdout == "still\n", p.stderr
    finally:
        node.ssh(keys["mine"][0], workload["user"], extra=[*mux, "-O", "exit"])
        shutil.rmtree(sockets, ignore_errors=True)


def test_killed_command_reports_its_signal(node, keys, workload):
    p = node.ssh(keys["mine"][0], workload["user"], "kill -TERM $$")
    # OpenSSH exits 255 when the remote end sent exit-signal.
    assert p.returncode == 255, p.stderr
    node.agent.wait_for_log(r"ended by signal TERM")
    # A signal beyond RFC 4254's list goes by its own name in the RFC's
    # name@domain form, not as KILL (a SIGBUS from a GPU mapping is no OOM).
    p = node.ssh(keys["mine"][0], workload["user"], "kill -BUS $$")
    assert p.returncode == 255, p.stderr
    node.agent.wait_for_log(r"ended by signal BUS@gpurent")


def test_tty_gets_a_pty(node, keys, workload):
    p = node.ssh(keys["mine"][0], workload["user"], "tty; stty size", extra=["-tt"])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.replace("\r", "").splitlines()
    assert lines[0].startswith("/dev/pts/")


def test_interactive_shell_with_pty(node, keys, workload):
    p = node.ssh(keys["mine"][0], workload["user"], extra=["-tt"], input="echo shell-$((6*7))\nexit 5\n")
    assert p.returncode == 5, p.stderr
    assert "shell-42" in p.stdout


def test_wrong_user_other_key_and_password_are_refused(node, keys, workload):
    p = node.ssh(keys["mine"][0], "nobody", "true")
    assert p.returncode == 255 and "Permission denied" in p.stderr
    p = node.ssh(keys["other"][0], workload["user"], "true")
    assert p.returncode == 255 and "Permission denied" in p.stderr
    p = node.ssh(keys["mine"][0], workload["user"], "true",
                 extra=["-o", "PreferredAuthentications=password,keyboard-interactive"])
    assert p.returncode == 255
    assert "publickey" in p.stderr  # the only method offered
    text = node.agent.stderr_text()
    assert "ssh refused: node node-a user nobody" in text
    assert "the key is not one of the workload's" in text


def server_kexinit(port):
    """The name-lists of the server's KEXINIT, read off the wire: kex, host
    key, ciphers both ways, MACs both ways, compression both ways."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"SSH-2.0-probe\r\n")
        f = s.makefile("rb")
        # The version line names the agent, not libssh's version.
        assert f.readline() == b"SSH-2.0-gpurent-agent\r\n"
        length, padding = struct.unpack(">IB", f.read(5))
        payload = f.read(length - 1)[:length - 1 - padding]
    assert payload[0] == 20  # SSH_MSG_KEXINIT
    at, lists = 17, []
    for _ in range(8):
        n = struct.unpack(">I", payload[at:at + 4])[0]
        lists.append(payload[at + 4:at + 4 + n].decode().split(","))
        at += 4 + n
    return lists


def test_algorithm_lists_hold_no_empty_name_and_weak_keys_are_refused(node, keys, tmp_path):
    """libssh 0.10's default cipher list ends with a comma (an empty name,
    which RFC 4251 5 forbids), and it verified DSA, SHA-1 RSA and 1024-bit
    RSA logins, which OpenSSH's sshd refuses; a short RSA key was even told
    it would do, and the client then hung until the login timeout."""
    lists = server_kexinit(node.port)
    for names in lists:
        assert "" not in names, names
    # What ssh-audit asks of a server: no NIST-curve key exchange nor a
    # group the client sizes, only encrypt-then-MAC MACs, and the strict
    # key exchange that closes Terrapin (CVE-2023-48795).
    kex, _, _, _, mac_cs, mac_sc = lists[:6]
    assert not [k for k in kex if k.startswith("ecdh-sha2-nistp") or "group-exchange" in k or k.endswith("-sha1")], kex
    assert "curve25519-sha256" in kex and "kex-strict-s-v00@openssh.com" in kex, kex
    assert mac_cs == mac_sc and all(m.endswith("-etm@openssh.com") for m in mac_cs), mac_cs
    kinds = {"dsa": ("dsa", "1024"), "rsa1024": ("rsa", "1024"), "rsa2048": ("rsa", "2048")}
    made = {}
    for name, (kind, bits) in kinds.items():
        path = str(tmp_path / name)
        if subprocess.run(["ssh-keygen", "-q", "-t", kind, "-b", bits, "-N", "", "-C", "", "-f", path],
                          capture_output=True, timeout=60).returncode != 0:
            continue  # an OpenSSH without DSA
        with open(path + ".pub") as f:
            made[name] = (path, " ".join(f.read().split()[:2]))
    user = "ins_weak-0"
    wid = node.run_workload(user, [k[1] for k in made.values()])
    try:
        p = node.ssh(made["rsa2048"][0], user, "echo in")
        assert p.returncode == 0 and p.stdout == "in\n", p.stderr
        p = node.ssh(made["rsa2048"][0], user, "echo in", extra=["-o", "PubkeyAcceptedAlgorithms=ssh-rsa"])
        assert p.returncode == 255 and "Permission denied (publickey)" in p.stderr, p.stderr
        p = node.ssh(made["rsa1024"][0], user, "echo in")
        assert p.returncode == 255 and "Permission denied (publickey)" in p.stderr, p.stderr
        poll(lambda: "the RSA key is shorter than 2048 bits" in node.agent.stderr_text(), 10, "the refusal logged")
        if "dsa" in made:
            p = node.ssh(made["dsa"][0], user, "echo in", extra=["-o", "PubkeyAcceptedAlgorithms=+ssh-dss"])
            assert p.returncode == 255 and "Permission denied (publickey)" in p.stderr, p.stderr
            poll(lambda: "the key's type is not taken" in node.agent.stderr_text(), 10, "the refusal logged")
    finally:
        assert node.agent.delete(f"/v1/workloads/{wid}").status_code == 200


def tcp_timer(local_port, remote_port):
    """The kernel's timer on the agent's end of a loopback connection, from
    /proc/net/tcp: (kind, centiseconds left); kind 2 is the keepalive
    timer, 0 none."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == local_port and \
                        int(cols[2].rsplit(":", 1)[1], 16) == remote_port:
                    kind, left = cols[5].split(":")
                    return int(kind, 16), int(left, 16)
    return None


def test_a_client_that_vanishes_is_found_by_tcp_keepalive(node):
    """A client gone without a FIN (laptop shut, NAT flow forgotten) left
    its connection, its shell and its slot of the workload's sixteen for
    ever: the agent's end had no keepalive. It now probes after a minute
    of silence, as sshd's TCPKeepAlive does (sooner than the kernel's two
    hours)."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"SSH-2.0-probe\r\n")
        assert s.makefile("rb").readline().startswith(b"SSH-2.0-")
        # Kind 1 (retransmit) while its greeting waits for our ACK, then 2,
        # the keepalive timer; without keepalive 0, no timer at all.
        def keepalive_timer():
            timer = tcp_timer(node.port, s.getsockname()[1])
            return timer if timer and timer[0] == 2 else None
        timer = poll(keepalive_timer, 10, "the keepalive timer on the agent's end")
    assert 0 < timer[1] <= 60 * 100, timer  # a minute, not the kernel's two hours


def test_workload_not_running_or_without_ssh_is_refused(node, keys):
    wid = node.run_workload("ins_slow-0", [keys["mine"][1]], image="fail-start", wait="failed")
    p = node.ssh(keys["mine"][0], "ins_slow-0", "true")
    assert p.returncode == 255 and "Permission denied" in p.stderr
    poll(lambda: "the workload is not running" in node.agent.stderr_text(), 10, "the refusal logged")
    assert node.agent.delete(f"/v1/workloads/{wid}").status_code == 200
    # A spec without ssh (an older control plane): nobody logs in.
    wid = wl_id()
    assert node.agent.put(f"/v1/workloads/{wid}", json={"image": "img", "gpus": []}).status_code == 201
    node.agent.wait_phase(wid, ["running"])
    p = node.ssh(keys["mine"][0], "ins_abc-0x", "true")
    assert p.returncode == 255


def test_removed_workload_refuses_and_loses_its_container(node, keys):
    wid = node.run_workload("ins_gone-0", [keys["mine"][1]])
    assert node.ssh(keys["mine"][0], "ins_gone-0", "true").returncode == 0
    cdir = os.path.join(node.agent.state_dir, "containers", wid)
    assert os.path.isdir(cdir)
    assert node.agent.delete(f"/v1/workloads/{wid}").status_code == 200
    poll(lambda: node.agent.get(f"/v1/workloads/{wid}").status_code == 404, 20, "the workload removed")
    # The container goes with it, once its processes have ended.
    poll(lambda: not os.path.exists(cdir), 20, "the container directory removed")
    p = node.ssh(keys["mine"][0], "ins_gone-0", "true")
    assert p.returncode == 255 and "Permission denied" in p.stderr


def test_bad_ssh_specs_are_refused(node, keys):
    for ssh, field in [({"user": "Bad User", "authorized_keys": []}, "ssh.user"),
                       ({"user": "u", "authorized_keys": ["ssh-ed25519 AAAA"]}, "ssh.authorized_keys[0]"),
                       ({"user": "u", "authorized_keys": [keys["mine"][1] + " comment"]}, "ssh.authorized_keys[0]"),
                       ({"user": "u", "authorized_keys": [], "extra": 1}, "ssh.extra"),
                       ({"user": "u"}, "ssh.authorized_keys"),
                       ("u", "ssh")]:
        r = node.agent.put(f"/v1/workloads/{wl_id()}", json={"image": "img", "gpus": [], "ssh": ssh})
        err = assert_error(r, 400, r.json()["error"]["code"])
        assert err["field"] == field, r.text


def test_other_keys_on_re_put_replace_the_keys(node, keys):
    """A PUT of the same workload with other keys (the account's keys changed
    while gpurentd's first PUT was in flight) replaces its keys rather than
    being a conflict that would fail the attempt."""
    wid = node.run_workload("ins_same-0", [keys["mine"][1]])
    r = node.agent.put(f"/v1/workloads/{wid}", json={"image": "img", "gpus": [], "ssh": {
        "user": "ins_same-0", "authorized_keys": [keys["other"][1]]}})
    assert r.status_code == 200, r.text
    assert r.json()["ssh_keys_digest"] == keys_digest([keys["other"][1]])
    assert node.ssh(keys["other"][0], "ins_same-0", "true").returncode == 0
    assert node.ssh(keys["mine"][0], "ins_same-0", "true").returncode == 255
    # Anything else differing is still a conflict.
    r = node.agent.put(f"/v1/workloads/{wid}", json={"image": "img2", "gpus": [], "ssh": {
        "user": "ins_same-0", "authorized_keys": [keys["other"][1]]}})
    assert r.status_code == 409, r.text
    # A login name is one workload's on a node (else the second could never
    # be logged in to): another workload with it is refused.
    r = node.agent.put(f"/v1/workloads/{wl_id()}", json={"image": "img", "gpus": [], "ssh": {
        "user": "ins_same-0", "authorized_keys": [keys["other"][1]]}})
    assert r.status_code == 409 and "ssh user ins_same-0" in r.json()["error"]["message"], r.text
    assert node.agent.delete(f"/v1/workloads/{wid}").status_code in (200, 202)


def keys_digest(lines):
    """ssh_keys_digest as AGENT_PROTOCOL.md defines it."""
    return hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()


def test_replaced_keys_refuse_the_removed_one_and_end_its_sessions(tmp_path, keys):
    """PUT .../ssh-keys: from the answer on, a removed key no longer logs in,
    a connection logged in with it is closed, one logged in with a key that
    stays is not, and an added key logs in, all while the workload runs; the
    list's digest says which keys it holds, and a restart keeps them."""
    n = Node(tmp_path / "rk", ssh_listen=f"127.0.0.1:{free_port()}")
    held_mine = held_other = None
    try:
        d = tmp_path / "k"
        d.mkdir()
        third = keygen(d, "third")
        mine, other = keys["mine"], keys["other"]
        wid = n.run_workload("ins_keys-0", [mine[1], other[1]])
        listed = n.agent.get("/v1/workloads").json()["workloads"]
        assert [w["ssh_keys_digest"] for w in listed if w["id"] == wid] == [keys_digest([mine[1], other[1]])]
        assert n.ssh(third[0], "ins_keys-0", "true").returncode == 255
        held_mine = subprocess.Popen(n.ssh_args(mine[0], "ins_keys-0", extra=["-N"]), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        held_other = subprocess.Popen(n.ssh_args(other[0], "ins_keys-0", extra=["-N"]), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        poll(lambda: len(re.findall(r"ssh login: node \S+ workload \S+ user ins_keys-0", n.agent.stderr_text())) == 2,
             20, "both logins")
        r = n.agent.put(f"/v1/workloads/{wid}/ssh-keys", json={"authorized_keys": [other[1], third[1]]})
        assert r.status_code == 200, r.text
        assert r.json() == {"id": wid, "keys": 2, "ssh_keys_digest": keys_digest([other[1], third[1]])}
        assert n.agent.get(f"/v1/workloads/{wid}").json()["ssh_keys_digest"] == keys_digest([other[1], third[1]])
        p = n.ssh(mine[0], "ins_keys-0", "true")
        assert p.returncode == 255 and "Permission denied" in p.stderr
        assert n.ssh(third[0], "ins_keys-0", "echo", "in").stdout == "in\n"
        assert held_mine.wait(timeout=60) == 255
        n.agent.wait_for_log(r"user ins_keys-0 from \S+: key SHA256:\S+ was removed from the workload's keys, closed")
        assert held_other.poll() is None  # its key stays: its connection too
        # Kept on disk: a restart holds the new keys.
        n.agent.restart()
        n.agent.wait_phase(wid, ["running"])
        assert n.ssh(mine[0], "ins_keys-0", "true").returncode == 255
        assert n.ssh(third[0], "ins_keys-0", "true").returncode == 0
        # No keys at all: nobody logs in.
        assert n.agent.put(f"/v1/workloads/{wid}/ssh-keys", json={"authorized_keys": []}).status_code == 200
        assert n.ssh(third[0], "ins_keys-0", "true").returncode == 255
    finally:
        for held in (held_mine, held_other):
            if held and held.poll() is None:
                held.kill()
                held.wait(timeout=30)
        n.stop()


def test_bad_key_replacements_are_refused(node, keys):
    wid = node.run_workload("ins_badk-0", [keys["mine"][1]], wait=None)
    path = f"/v1/workloads/{wid}/ssh-keys"
    assert_error(node.agent.put(path, json={"authorized_keys": ["ssh-ed25519 AAAA"]}), 400, "invalid_field",
                 "authorized_keys[0]")
    assert_error(node.agent.put(path, json={"authorized_keys": [keys["other"][1] + " c"]}), 400, "invalid_field",
                 "authorized_keys[0]")
    assert_error(node.agent.put(path, json={"authorized_keys": [keys["other"][1]] * 65}), 400, "invalid_field",
                 "authorized_keys")
    assert_error(node.agent.put(path, json={}), 400, "missing_field", "authorized_keys")
    assert_error(node.agent.put(path, json={"authorized_keys": [], "user": "x"}), 400, "unknown_field", "user")
    # Refused: the keys it had still log in.
    node.agent.wait_phase(wid, ["running"])
    assert node.ssh(keys["mine"][0], "ins_badk-0", "true").returncode == 0
    assert_error(node.agent.put(f"/v1/workloads/{wl_id()}/ssh-keys", json={"authorized_keys": []}), 404, "not_found")
    # A workload put without ssh has no login to give keys to.
    bare = wl_id()
    assert node.agent.put(f"/v1/workloads/{bare}", json={"image": "img", "gpus": []}).status_code == 201
    assert_error(node.agent.put(f"/v1/workloads/{bare}/ssh-keys", json={"authorized_keys": []}), 409, "conflict")
    # One being deleted is gone for this call as for GET.
    assert node.agent.delete(f"/v1/workloads/{wid}").status_code in (200, 202)
    assert_error(node.agent.put(path, json={"authorized_keys": []}), 404, "not_found")
    assert node.agent.delete(f"/v1/workloads/{bare}").status_code in (200, 202)


def test_forward_reaches_a_server_inside_the_workload_only(node, keys, workload, tmp_path):
    inside = free_port()
    serve = f"{sys.executable} -m http.server --bind 127.0.0.1 {inside}"
    p = node.ssh(keys["mine"][0], workload["user"],
                 f"echo inside > index.html; nohup {serve} >/dev/null 2>&1 </dev/null & echo started")
    assert p.returncode == 0 and "started" in p.stdout, p.stderr
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    (outside_dir / "index.html").write_text("outside\n")
    outside = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(outside)],
                              cwd=outside_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tunnel = None
    try:
        def listening(port):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False
        poll(lambda: listening(inside) and listening(outside), 20, "both HTTP servers")
        local_in, local_out = free_port(), free_port()
        tunnel = subprocess.Popen(
            ["ssh", "-F", "/dev/null", "-i", keys["mine"][0], "-o", "IdentitiesOnly=yes",
             "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={node.known_hosts}",
             "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes", "-N", "-p", str(node.port),
             "-L", f"127.0.0.1:{local_in}:localhost:{inside}", "-L", f"127.0.0.1:{local_out}:localhost:{outside}",
             f"{workload['user']}@127.0.0.1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        poll(lambda: listening(local_in), 20, "the tunnel")
        body = urllib.request.urlopen(f"http://127.0.0.1:{local_in}/index.html", timeout=10).read()
        assert body == b"inside\n"
        with pytest.raises(Exception):
            urllib.request.urlopen(f"http://127.0.0.1:{local_out}/index.html", timeout=10).read()
        poll(lambda: "no process of the workload listens on that port" in node.agent.stderr_text(), 10,
             "the refused forward logged")
    finally:
        if tunnel:
            stop_client(tunnel)
        server.terminate()
        server.wait(timeout=30)
        node.ssh(keys["mine"][0], workload["user"], f"pkill -f 'http.server --bind 127.0.0.1 {inside}' || true")


@pytest.mark.skipif(not socket.has_ipv6, reason="needs IPv6")
def test_forward_to_the_ipv6_loopback_by_address(node, keys, workload):
    """A server inside the workload bound to ::1 alone was reached as
    localhost but refused as [::1] ("only localhost inside the workload"),
    though ::1 is that same loopback. ssh -W opens the same direct-tcpip
    channel as -L, carrying stdin and stdout."""
    inside = free_port()
    serve = f"{sys.executable} -m http.server --bind ::1 {inside}"
    p = node.ssh(keys["mine"][0], workload["user"],
                 f"echo inside6 > index.html; nohup {serve} >/dev/null 2>&1 </dev/null & echo started")
    assert p.returncode == 0 and "started" in p.stdout, p.stderr
    try:
        def listening():
            try:
                socket.create_connection(("::1", inside), timeout=1).close()
                return True
            except OSError:
                return False
        poll(listening, 20, "the HTTP server on ::1")
        for host in ("[::1]", "localhost"):
            p = node.ssh(keys["mine"][0], workload["user"], extra=["-W", f"{host}:{inside}"],
                         input="GET /index.html HTTP/1.0\r\n\r\n")
            assert p.returncode == 0 and p.stdout.endswith("inside6\n"), (host, p.stdout[-200:], p.stderr)
    finally:
        node.ssh(keys["mine"][0], workload["user"], f"pkill -f 'http.server --bind ::1 {inside}' || true")


def test_host_key_kept_across_restart_and_a_changed_one_fails(tmp_path, keys):
    n = Node(tmp_path / "n", ssh_listen=f"127.0.0.1:{free_port()}")
    try:
        before = n.facts()
        n.agent.restart()
        after = n.facts()
        assert after["host_key"] == before["host_key"] and after["port"] == before["port"]
        wid = n.run_workload("ins_keep-0", [keys["mine"][1]])
        assert n.ssh(keys["mine"][0], "ins_keep-0", "true").returncode == 0
        # A new host key (the file removed): the pinned one no longer matches.
        n.agent.stop()
        os.unlink(os.path.join(n.agent.state_dir, "ssh_host_ed25519_key"))
        n.agent.start()
        assert n.facts()["host_key"] != before["host_key"]
        n.agent.wait_phase(wid, ["running"])
        p = n.ssh(keys["mine"][0], "ins_keep-0", "true")
        assert p.returncode == 255
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in p.stderr or "Host key verification failed" in p.stderr
    finally:
        n.stop()


def test_ssh_off_reports_null(tmp_path):
    a = Agent(tmp_path / "off", options={"ssh_listen": ""})
    try:
        assert a.get("/v1/facts").json()["ssh"] is None
    finally:
        a.stop()


def test_failed_logins_are_rate_limited(tmp_path, keys):
    n = Node(tmp_path / "rl", ssh_login_rate="2")
    try:
        n.run_workload("ins_rl-0", [keys["mine"][1]])
        for _ in range(2):
            assert n.ssh(keys["other"][0], "ins_rl-0", "true").returncode == 255
        # Over the rate: even the right key is turned away for the minute.
        p = n.ssh(keys["mine"][0], "ins_rl-0", "true")
        assert p.returncode == 255
        assert "failed logins in a minute" in n.agent.stderr_text()
    finally:
        n.stop()


def test_keys_signed_without_a_probe_count_toward_the_tries(tmp_path, keys):
    # openssh-client signs at once with a key whose public half it cannot
    # read without the private one (a PEM key with no .pub beside it), so
    # each of these tries is a signed refusal, not a probe: they count
    # toward ssh_max_auth_tries as probes do.
    pem = []
    for i in range(2):
        path = str(tmp_path / f"pem{i}")
        subprocess.run(["ssh-keygen", "-q", "-m", "PEM", "-t", "ecdsa", "-N", "", "-C", "", "-f", path],
                       check=True, timeout=30)
        os.unlink(path + ".pub")
        pem.append(path)
    n = Node(tmp_path / "signed", ssh_max_auth_tries="2")
    try:
        n.run_workload("ins_signed-0", [keys["mine"][1]])
        # Two keys: one signed refusal, then the right one.
        p = n.ssh(pem[0], "ins_signed-0", "echo in", extra=["-v", "-i", keys["mine"][0]])
        assert p.returncode == 0 and p.stdout == "in\n", p.stderr
        assert f"Trying private key: {pem[0]}" in p.stderr  # signed, not offered first
        # Three: the right key comes after two signed refusals, past the limit.
        p = n.ssh(pem[0], "ins_signed-0", "echo in", extra=["-v", "-i", pem[1], "-i", keys["mine"][0]])
        assert p.returncode == 255 and p.stdout == "", p.stderr
        assert f"Trying private key: {pem[1]}" in p.stderr
        assert "user ins_signed-0 from 127.0.0.1:" in n.agent.stderr_text()
        assert "too many authentication failures (2, ssh_max_auth_tries)" in n.agent.stderr_text()
        assert "Too many authentication failures" in p.stderr
    finally:
        n.stop()


def ed25519_blob(key_path):
    """The public key blob of an ed25519 key file."""
    with open(key_path, "rb") as f:
        key = serialization.load_ssh_private_key(f.read(), None)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return ssh_string("ssh-ed25519") + ssh_string(raw)


def tries_until_cut_off(port, request, count=64, timeout=10):
    """count copies of a login request sent at once on a new connection:
    how many the server answered with a failure, and the description of
    the DISCONNECT it closed with ("" without one, None if it had not
    closed within timeout seconds of silence)."""
    c = RawSSH("127.0.0.1", port)
    try:
        c.service()
        c.sock.sendall(b"".join(c.packet(request) for _ in range(count)))
        c.sock.settimeout(timeout)
        types, why = c.until_closed()
        return types.count(MSG_USERAUTH_FAILURE), why
    finally:
        c.sock.close()


def test_every_failed_login_attempt_counts_toward_the_tries(tmp_path, keys):
    """Only keys counted toward ssh_max_auth_tries: a client could try
    "none", passwords, keyboard-interactive or another method, or send
    login requests that libssh drops without an answer (a key type it
    cannot read, a bad signature), for as long as the login timeout let
    it. Every failed attempt counts now, as in OpenSSH's sshd (but for a
    first "none"): at the limit the server says "Too many authentication
    failures" and closes, without answering the attempt that reached it."""
    user = "ins_tries-0"
    n = Node(tmp_path / "tries", ssh_max_auth_tries="3", ssh_auth_timeout_s="120")
    try:
        n.run_workload(user, [keys["mine"][1]])
        blob = ed25519_blob(keys["mine"][0])
        signed = userauth(user, "publickey", b"\1" + ssh_string("ssh-ed25519") + ssh_string(blob))
        cases = [  # what, the request, how many are answered (a failure each) before the close
            ("none", userauth(user, "none"), 3),
            ("password", userauth(user, "password", b"\0" + ssh_string("hunter2")), 2),
            ("keyboard-interactive", userauth(user, "keyboard-interactive", ssh_string("") + ssh_string("")), 2),
            ("hostbased", userauth(user, "hostbased", ssh_string("ssh-ed25519") + ssh_string(blob)), 2),
            ("a key type libssh cannot read",
             userauth(user, "publickey", b"\0" + ssh_string("ssh-foo") + ssh_string(ssh_string("ssh-foo"))), 0),
            ("a bad signature by the right key", signed + ssh_string(ssh_string("ssh-ed25519") + bytes(64)), 0),
        ]
        for what, request, answered in cases:
            failures, why = tries_until_cut_off(n.port, request)
            assert why == "Too many authentication failures", (what, why)
            assert failures == answered, (what, failures)
        # Dropped requests sent ahead of a good login count before it is looked at.
        c = RawSSH("127.0.0.1", n.port)
        c.service()
        bad = signed + ssh_string(ssh_string("ssh-ed25519") + bytes(64))
        c.sock.sendall(b"".join(c.packet(bad) for _ in range(64)))
        assert not c.login(user, keys["mine"][0])
        c.sock.close()
        text = n.agent.stderr_text()
        assert re.search(rf"ssh refused: node node-a user {user} from 127\.0\.0\.1:\d+: too many authentication "
                         r"failures \(3, ssh_max_auth_tries\)", text), text[-2000:]
        # None of it keeps the right key out.
        p = n.ssh(keys["mine"][0], user, "echo in")
        assert p.returncode == 0 and p.stdout == "in\n", p.stderr
    finally:
        n.stop()


def test_a_connection_cut_off_for_its_tries_counts_against_its_address(tmp_path, keys):
    """Each connection closed at ssh_max_auth_tries is a failed login of its
    address: past ssh_login_rate of them even the right key is turned away
    for the minute."""
    user = "ins_cut-0"
    n = Node(tmp_path / "cut", ssh_max_auth_tries="2", ssh_login_rate="2", ssh_auth_timeout_s="120")
    try:
        n.run_workload(user, [keys["mine"][1]])
        for _ in range(2):
            _, why = tries_until_cut_off(n.port, userauth(user, "password", b"\0" + ssh_string("x")))
            assert why == "Too many authentication failures", why
        p = n.ssh(keys["mine"][0], user, "true")
        assert p.returncode == 255
        n.agent.wait_for_log(r"more than 2 failed logins in a minute")
    finally:
        n.stop()


def test_openssh_with_several_keys_logs_in_while_the_right_one_is_within_the_tries(tmp_path, keys):
    """The real client sends "none" first (free) and then each key of its
    identity files or its agent in turn: with ssh_max_auth_tries 3 the
    right key still logs in third, and fourth it is not reached, the
    client told why."""
    user = "ins_many-0"
    wrong = [keygen(tmp_path, f"wrong{i}")[0] for i in range(3)]
    mine = keys["mine"][0]
    n = Node(tmp_path / "many", ssh_max_auth_tries="3")
    agent = None
    try:
        n.run_workload(user, [keys["mine"][1]])

        def more(*paths):  # identity files after the first, tried in this order
            return [a for path in paths for a in ("-i", path)]
        p = n.ssh(wrong[0], user, "echo in", extra=more(wrong[1], mine))
        assert p.returncode == 0 and p.stdout == "in\n", p.stderr
        p = n.ssh(wrong[0], user, "echo in", extra=more(wrong[1], wrong[2], mine))
        assert p.returncode == 255 and "Too many authentication failures" in p.stderr, p.stderr
        # The same keys in an agent, tried in the order they were added.
        sock = str(tmp_path / "agent.sock")
        agent = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        env = dict(os.environ, SSH_AUTH_SOCK=sock)
        poll(lambda: os.path.exists(sock), 10, "the ssh-agent's socket")

        def through_agent(*paths):
            subprocess.run(["ssh-add", "-D"], env=env, capture_output=True, timeout=30)
            for path in paths:
                subprocess.run(["ssh-add", path], env=env, check=True, capture_output=True, timeout=30)
            # An IdentityFile that does not exist keeps ~/.ssh's keys out.
            args = ["ssh", "-F", "/dev/null", "-o", "IdentitiesOnly=no", "-o", f"IdentityFile={tmp_path}/absent",
                    "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={n.known_hosts}",
                    "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", str(n.port), f"{user}@127.0.0.1",
                    "echo in"]
            return subprocess.run(args, env=env, capture_output=True, text=True, timeout=30,
                                  stdin=subprocess.DEVNULL)
        p = through_agent(*wrong[:2], mine)
        assert p.returncode == 0 and p.stdout == "in\n", p.stderr
        p = through_agent(*wrong, mine)
        assert p.returncode == 255 and "Too many authentication failures" in p.stderr, p.stderr
    finally:
        if agent:
            agent.terminate()
            agent.wait(timeout=30)
        n.stop()


def test_each_fleet_node_has_its_own_listener_and_host_key(tmp_path, keys):
    cp = FakeControlPlane()
    f = Fleet(tmp_path, cp.url, nodes=3, model="MI450")
    try:
        names = list(f.nodes)
        facts = {n: f.request(n, cp.secrets[n], "GET", "/v1/facts").json()["ssh"] for n in names}
        assert len({x["port"] for x in facts.values()}) == 3
        assert len({x["host_key"] for x in facts.values()}) == 3
        for n in names:
            assert os.path.exists(os.path.join(f.state_dir, "nodes", n, "ssh_host_ed25519_key"))
        # A login on the second node reaches that node's workload only.
        second = names[1]
        wid = wl_id()
        spec = {"image": "img", "gpus": [0], "ssh": {"user": "ins_fleet-1", "authorized_keys": [keys["mine"][1]]}}
        assert f.request(second, cp.secrets[second], "PUT", f"/v1/workloads/{wid}", json=spec).status_code == 201
        poll(lambda: f.request(second, cp.secrets[second], "GET", f"/v1/workloads/{wid}").json()["phase"]
             == "running", 20, "the workload running")
        kh = tmp_path / "known_hosts"
        kh.write_text("".join(f"[127.0.0.1]:{x['port']} {x['host_key']}\n" for x in facts.values()))

        def ssh(node):
            return subprocess.run(
                ["ssh", "-F", "/dev/null", "-i", keys["mine"][0], "-o", "IdentitiesOnly=yes",
                 "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={kh}", "-o", "BatchMode=yes",
                 "-p", str(facts[node]["port"]), "ins_fleet-1@127.0.0.1", "echo $GPURENT_WORKLOAD"],
                capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        p = ssh(second)
        assert p.returncode == 0 and p.stdout.strip() == wid, p.stderr
        assert ssh(names[0]).returncode == 255
    finally:
        f.stop()
        cp.close()


def has_sftp_server():
    p = subprocess.run([AGENT, "sftp-server", "--help"], capture_output=True, text=True, timeout=30)
    return "unknown command" not in p.stderr


@pytest.mark.skipif(not shutil.which("sftp"), reason="needs openssh-client's sftp")
def test_sftp_subsystem_puts_files_into_the_volume(node, keys, workload, tmp_path):
    if not has_sftp_server():
        pytest.skip("gpurent-agent sftp-server is not built into this agent yet")
    local = tmp_path / "data.txt"
    local.write_text("dataset\n")
    batch = tmp_path / "batch"
    batch.write_text(f"put {local} /shared/data.txt\nls /shared\n")
    p = subprocess.run(["sftp", "-F", "/dev/null", "-i", keys["mine"][0], "-o", "IdentitiesOnly=yes",
                        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={node.known_hosts}",
                        "-o", "BatchMode=yes", "-P", str(node.port), "-b", str(batch),
                        f"{workload['user']}@127.0.0.1"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(os.path.join(workload["volume"], "data.txt")) as f:
        assert f.read() == "dataset\n"
    node.agent.wait_for_log(r"ssh: node node-a workload \S+ user ins_abc-0 from \S+: sftp")


def test_sftp_without_a_shared_volume_is_refused(node, keys):
    node.run_workload("ins_novol-0", [keys["mine"][1]])
    p = subprocess.run(["ssh", "-F", "/dev/null", "-i", keys["mine"][0], "-o", "IdentitiesOnly=yes",
                        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={node.known_hosts}",
                        "-o", "BatchMode=yes", "-p", str(node.port), "-s", "ins_novol-0@127.0.0.1", "sftp"],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert p.returncode != 0
    node.agent.wait_for_log(r"cannot start sftp: the workload mounts no volume at /shared")


def test_session_limit_and_idle_timeout(tmp_path, keys):
    n = Node(tmp_path / "lim", ssh_max_sessions="1", ssh_idle_timeout_s="2")
    held = None
    try:
        n.run_workload("ins_lim-0", [keys["mine"][1]])
        held = n.ssh_background(keys["mine"][0], "ins_lim-0", "sleep 600")
        n.agent.wait_for_log(r"user ins_lim-0 from \S+: command")
        # The node's one connection is taken: the next is turned away.
        assert n.ssh(keys["mine"][0], "ins_lim-0", "true").returncode == 255
        assert "connections already (ssh_max_sessions)" in n.agent.stderr_text()
        # The silent one is closed after ssh_idle_timeout_s, its command hung up.
        assert held.wait(timeout=60) == 255
        n.agent.wait_for_log(r"idle for 2 s, closed")
        assert n.ssh(keys["mine"][0], "ins_lim-0", "echo again").stdout == "again\n"
    finally:
        if held and held.poll() is None:
            held.kill()
            held.wait(timeout=30)
        n.stop()


def test_silent_connections_from_one_address_cannot_lock_renters_out(tmp_path, keys):
    """Connections that never log in are capped per address
    (ssh_max_startups_per_client): 64 silent ones from one address took
    every one of a node's ssh_max_sessions until they timed out."""
    n = Node(tmp_path / "startups", ssh_max_startups_per_client="3")
    silent = []
    try:
        n.run_workload("ins_st-0", [keys["mine"][1]])
        for _ in range(6):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", n.port))
            silent.append(s)
        n.agent.wait_for_log(r"from 127\.0\.0\.2:\d+: 3 connections not logged in yet")
        # The others are closed at once; three wait for their login timeout.
        closed = 0
        for s in silent:
            s.settimeout(10)
            try:
                data = s.recv(4096)
                while data and not data.endswith(b"\n"):
                    data += s.recv(4096)
                s.settimeout(0.5)
                if s.recv(1) == b"":
                    closed += 1
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed == 3, closed
        # Another address logs in.
        p = n.ssh(keys["mine"][0], "ins_st-0", "echo in")
        assert p.returncode == 0 and p.stdout == "in\n", p.stderr
    finally:
        for s in silent:
            s.close()
        n.stop()


def test_one_workload_cannot_take_every_connection_of_its_node(tmp_path, keys):
    """Logged-in connections are capped per workload
    (ssh_max_sessions_per_workload), so one renter holding idle logins
    leaves the node's other slots to the others on it."""
    n = Node(tmp_path / "share", ssh_max_sessions_per_workload="2")
    held = []
    try:
        n.run_workload("ins_greedy-0", [keys["mine"][1]])
        n.run_workload("ins_other-0", [keys["other"][1]])
        for i in range(2):
            held.append(n.ssh_background(keys["mine"][0], "ins_greedy-0", "sleep 600"))
            poll(lambda: n.agent.stderr_text().count("user ins_greedy-0 from") >= i + 1, 30, "the login")
        assert n.ssh(keys["mine"][0], "ins_greedy-0", "true").returncode == 255
        n.agent.wait_for_log(r"workload \S+ user ins_greedy-0 from \S+: 2 connections to it already"
                             r" \(ssh_max_sessions_per_workload\)")
        p = n.ssh(keys["other"][0], "ins_other-0", "echo mine")
        assert p.returncode == 0 and p.stdout == "mine\n", p.stderr
    finally:
        for h in held:
            h.kill()
            h.wait(timeout=30)
        n.stop()


def test_a_login_ends_when_its_workload_stops_running(tmp_path, keys):
    """A logged-in connection does not outlive its workload: deleted (the
    instance stopped), its idle connection is closed and the slot freed."""
    n = Node(tmp_path / "ends")
    held = None
    try:
        wid = n.run_workload("ins_ends-0", [keys["mine"][1]])
        # -N: a login with no channel open, which nothing else would end.
        held = subprocess.Popen(n.ssh_args(keys["mine"][0], "ins_ends-0", extra=["-N"]), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        n.agent.wait_for_log(r"ssh login: node \S+ workload \S+ user ins_ends-0")
        assert n.agent.delete(f"/v1/workloads/{wid}").status_code == 200
        assert held.wait(timeout=60) == 255
        n.agent.wait_for_log(r"user ins_ends-0 from \S+: the workload no longer runs, closed")
    finally:
        if held and held.poll() is None:
            held.kill()
            held.wait(timeout=30)
        n.stop()


def test_silent_connections_from_many_addresses_cannot_lock_renters_out(tmp_path, keys):
    """Connections not logged in yet are capped per node too
    (ssh_max_startups), not only per address; at the cap the oldest is cut
    off for the newcomer, so silent ones from several addresses hold no
    door shut: a renter still logs in, while they are held."""
    n = Node(tmp_path / "crowd", ssh_max_startups="3")
    silent = []
    try:
        n.run_workload("ins_crowd-0", [keys["mine"][1]])
        for i in range(4):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i}", 0))
            s.connect(("127.0.0.1", n.port))
            silent.append(s)
        n.agent.wait_for_log(r"3 connections not logged in yet \(ssh_max_startups\): cut off the oldest,"
                             r" from 127\.0\.0\.2, for one from 127\.0\.0\.5")
        # The one cut off is closed at once (after the server's banner).
        silent[0].settimeout(60)
        got = b""
        try:
            while chunk := silent[0].recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
        assert got.startswith(b"SSH-2.0-") or got == b"", got
        # A renter logs in while the other three are still held.
        p = n.ssh(keys["mine"][0], "ins_crowd-0", "echo in")
        assert p.returncode == 0 and p.stdout == "in\n", p.stderr
    finally:
        for s in silent:
            s.close()
        n.stop()


def test_silent_connections_cannot_fill_a_busy_node(tmp_path, keys):
    """A node whose logged-in connections and silent ones together reach
    ssh_max_sessions turned the next renter away, while the silent ones
    held their slots until their login timeout: with 64 slots, 33 logins
    and 31 silent connections (under ssh_max_startups) kept every other
    renter out. The oldest silent connection is now cut off for the
    newcomer at that cap too."""
    n = Node(tmp_path / "busy", ssh_max_sessions="4", ssh_max_startups="3", ssh_auth_timeout_s="120")
    held, silent = [], []
    try:
        n.run_workload("ins_busy-0", [keys["mine"][1]])
        for i in range(2):
            held.append(n.ssh_background(keys["mine"][0], "ins_busy-0", "sleep 600"))
            poll(lambda: n.agent.stderr_text().count("user ins_busy-0 from 127.0.0.1:") >= i + 1, 30, "the login")
        for i in range(2):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i}", 0))
            s.connect(("127.0.0.1", n.port))
            s.settimeout(30)
            assert s.recv(4096).startswith(b"SSH-2.0-")  # accepted and counted
            silent.append(s)
        p = n.ssh(keys["mine"][0], "ins_busy-0", "echo in")
        assert p.returncode == 0 and p.stdout == "in\n", (p.stderr, n.agent.stderr_text()[-2000:])
        n.agent.wait_for_log(r"4 connections \(ssh_max_sessions\): cut off the oldest not logged in,"
                             r" from 127\.0\.0\.2, for one from 127\.0\.0\.1")
    finally:
        for s in silent:
            s.close()
        for h in held:
            h.kill()
            h.wait(timeout=30)
        n.stop()


def flood_until_stalled(sock, burst):
    """Sends what burst() makes until the peer takes no more for 5 s (True)
    or, on a connection it keeps reading, until it took twice what the
    kernel may buffer and 8 MiB more or two minutes passed (False)."""
    limit, deadline = 2 * kernel_buffer_max() + (8 << 20), time.monotonic() + 120
    sent = 0
    sock.settimeout(5)
    try:
        while sent < limit and time.monotonic() < deadline:
            data = burst()
            sock.sendall(data)
            sent += len(data)
    except socket.timeout:
        return True
    return False


def test_a_client_that_reads_none_of_its_answers_is_read_no_more(tmp_path, keys):
    """libssh answers a service request (as it does a login request or an
    unknown message) whether or not the client reads the answer, and keeps
    what the kernel cannot take in memory: a client that sent such requests
    and read nothing, without logging in, grew the agent by what it
    uploaded (250 MB in 20 s, with logins by "none", which now end the
    connection at ssh_max_auth_tries). Its bytes are now read only while it
    takes what it is sent, so the flood stops in the kernel's buffers."""
    n = Node(tmp_path / "unread")
    try:
        n.run_workload("ins_unread-0", [keys["mine"][1]])
        c = RawSSH("127.0.0.1", n.port, rcvbuf=4096)
        c.service()
        request = bytes([MSG_SERVICE_REQUEST]) + ssh_string("ssh-userauth")
        stalled = flood_until_stalled(c.sock, lambda: b"".join(c.packet(request) for _ in range(500)))
        c.sock.close()
        assert stalled, "the agent read on a client that reads nothing"
        p = n.ssh(keys["mine"][0], "ins_unread-0", "echo in")
        assert p.returncode == 0 and p.stdout == "in\n", p.stderr
    finally:
        n.stop()


def test_a_logged_in_client_with_output_pending_that_reads_nothing_is_read_no_more(tmp_path, keys):
    """In a blocking libssh session each channel write waited for libssh's
    buffer to reach the kernel and read and answered the client's requests
    meanwhile: a logged-in client running `yes` with a large window, reading
    nothing and sending keepalive requests, was read on and its answers
    kept. The session is non-blocking now, so it stalls as any other
    client that reads nothing."""
    n = Node(tmp_path / "pending")
    try:
        n.run_workload("ins_pending-0", [keys["mine"][1]])
        c = RawSSH("127.0.0.1", n.port, rcvbuf=4096)
        c.service()
        assert c.login("ins_pending-0", keys["mine"][0])
        c.exec("yes", window=0xFFFFFFFF)
        n.agent.wait_for_log(r"user ins_pending-0 from \S+: command")
        keepalive = bytes([MSG_GLOBAL_REQUEST]) + ssh_string("keepalive@openssh.com") + b"\1"
        stalled = flood_until_stalled(c.sock, lambda: b"".join(c.packet(keepalive) for _ in range(500)))
        c.sock.close()
        assert stalled, "the agent read on a logged-in client that reads nothing"
    finally:
        n.stop()


def test_a_packet_that_cannot_be_read_ends_the_connection(tmp_path, keys):
    """A packet libssh cannot take (here bytes that decrypt to a length out
    of bounds) left the session in its error state but connected, and the
    agent read on: everything the client sent after it piled up unread in
    libssh's buffer until the login timeout, and for ever on a connection
    that had logged in. Such a connection is now closed."""
    n = Node(tmp_path / "garbage", ssh_auth_timeout_s="120")
    try:
        c = RawSSH("127.0.0.1", n.port)
        c.service()
        junk, sent, limit = os.urandom(1 << 16), 0, 2 * kernel_buffer_max() + (8 << 20)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            while sent < limit:
                c.sock.sendall(junk)
                sent += len(junk)
        c.sock.close()
        n.agent.wait_for_log(r"from 127\.0\.0\.1:\d+: protocol error, closed: ")
    finally:
        n.stop()


def test_a_client_that_stops_reading_does_not_hold_up_the_agents_stop(tmp_path, keys):
    """A connection thread blocked writing to a client whose window is full
    waited out libssh's timeout (ssh_auth_timeout_s, here 60 s) before the
    agent could stop; stopping cuts its socket, so SIGTERM ends the agent
    well within that."""
    n = Node(tmp_path / "stall", ssh_auth_timeout_s="60")
    client = None
    try:
        n.run_workload("ins_stall-0", [keys["mine"][1]])
        client = n.ssh_background(keys["mine"][0], "ins_stall-0", "yes", stdout=subprocess.PIPE)
        n.agent.wait_for_log(r"user ins_stall-0 from \S+: command")
        client.stdout.read(1 << 20)  # it runs and writes
        client.send_signal(signal.SIGSTOP)  # and now nobody reads: the window fills
        n.agent.stop(timeout=30)  # within half of libssh's 60 s
    finally:
        if client:
            client.send_signal(signal.SIGCONT)
            client.kill()
            client.wait(timeout=30)
        n.agent.kill()


def test_a_reader_that_pauses_past_the_session_timeout_gets_every_byte(tmp_path, keys):
    """A client that stops reading (a pager, Ctrl-S, a paused download)
    longer than libssh's session timeout (ssh_auth_timeout_s, here 2 s):
    the agent waited that long for the window, then dropped what it had
    read from the command (16 KiB), and ssh exited 0 with the copy short.
    Now output waits for the window, however long."""
    n = Node(tmp_path / "pause", ssh_auth_timeout_s="2")
    vol = tmp_path / "vol"
    vol.mkdir()
    data = os.urandom(6 << 20)
    (vol / "big.bin").write_bytes(data)
    client = None
    try:
        n.run_workload("ins_pause-0", [keys["mine"][1]], volume=str(vol))
        client = n.ssh_background(keys["mine"][0], "ins_pause-0", "cat shared/big.bin", stdout=subprocess.PIPE)
        got = client.stdout.read(1 << 20)
        client.send_signal(signal.SIGSTOP)  # nobody reads for twice the timeout
        time.sleep(4)
        client.send_signal(signal.SIGCONT)
        got += client.stdout.read()
        assert client.wait(timeout=60) == 0
        assert len(got) == len(data) and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    finally:
        if client and client.poll() is None:
            client.kill()
            client.wait(timeout=30)
        n.stop()


def test_an_upload_into_a_command_that_waits_arrives_whole(node, keys, workload):
    """8 MiB into a command that reads nothing for a while: past the 1 MiB
    the agent holds, libssh keeps the rest and the client's window closes;
    the agent now takes it from libssh as the command reads (it waited for
    a packet the client would never send, and the upload hung)."""
    data = os.urandom(8 << 20)
    p = subprocess.run(node.ssh_args(keys["mine"][0], workload["user"], "sleep 2; wc -c"), input=data,
                       capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == str(len(data)).encode(), p.stderr


def test_a_stalled_channel_does_not_stall_the_others_on_its_connection(node, keys, workload, tmp_path):
    """Channels are independent (RFC 4254 5): with one multiplexed
    session's reader stopped and its window full, another command on the
    same connection runs at once, not after the agent's session timeout."""
    sockets = tempfile.mkdtemp(prefix="m", dir="/tmp")
    mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={sockets}/%C", "-o", "ControlPersist=60"]
    slow = None
    try:
        assert node.ssh(keys["mine"][0], workload["user"], "true", extra=mux).returncode == 0
        slow = subprocess.Popen(node.ssh_args(keys["mine"][0], workload["user"], "yes", extra=mux),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        slow.stdout.read(1 << 20)
        slow.send_signal(signal.SIGSTOP)
        p = node.ssh(keys["mine"][0], workload["user"], "echo quick", extra=mux, timeout=20)
        assert p.returncode == 0 and p.stdout == "quick\n", p.stderr
    finally:
        if slow:
            slow.send_signal(signal.SIGCONT)
            slow.kill()
            slow.wait(timeout=30)
        node.ssh(keys["mine"][0], workload["user"], extra=[*mux, "-O", "exit"])
        shutil.rmtree(sockets, ignore_errors=True)


def test_a_channel_closed_while_its_output_waits_ends(tmp_path, keys):
    """A multiplexed session's client is killed while the command's output
    waits for a window that will not open: the master closes that channel
    alone, and the agent drops what waited, hangs up the command and ends
    the session (it used to wait for the window for ever, the channel's
    slot and the command's pipe held)."""
    n = Node(tmp_path / "close")
    sockets = tempfile.mkdtemp(prefix="m", dir="/tmp")
    mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={sockets}/%C", "-o", "ControlPersist=60"]
    client = None
    try:
        n.run_workload("ins_close-0", [keys["mine"][1]])
        assert n.ssh(keys["mine"][0], "ins_close-0", "true", extra=mux).returncode == 0
        client = subprocess.Popen(n.ssh_args(keys["mine"][0], "ins_close-0", "yes", extra=mux),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        client.stdout.read(1 << 20)
        client.send_signal(signal.SIGSTOP)  # the window fills
        n.agent.wait_for_log(r"user ins_close-0 from \S+: command", timeout=30)
        client.kill()  # the master closes the channel; the connection stays
        client.wait(timeout=30)
        n.agent.wait_for_log(r"workload \S+ user ins_close-0 from \S+: ended by signal HUP", timeout=30)
        assert n.ssh(keys["mine"][0], "ins_close-0", "echo still", extra=mux).stdout == "still\n"
    finally:
        if client and client.poll() is None:
            client.kill()
            client.wait(timeout=30)
        n.ssh(keys["mine"][0], "ins_close-0", extra=[*mux, "-O", "exit"])
        shutil.rmtree(sockets, ignore_errors=True)
        n.stop()


def sleep_in_foreground(seconds):
    """Whether a `sleep SECONDS` runs (the sim runtime's shells are host
    processes) as the foreground process group of its terminal."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() != b"sleep\0" + seconds.encode() + b"\0":
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[2] == fields[5]:  # pgrp == tpgid
            return True
    return False


def test_pty_window_changes_and_ctrl_c(node, keys, workload):
    """A real terminal in front of ssh: the remote PTY takes the window size
    and its changes, and ^C interrupts the remote command, not the session."""
    master, slave = pty.openpty()

    def set_size(rows, cols):
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    set_size(30, 100)
    proc = subprocess.Popen(
        ["ssh", "-F", "/dev/null", "-i", keys["mine"][0], "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={node.known_hosts}", "-o", "BatchMode=yes", "-tt", "-p", str(node.port),
         f"{workload['user']}@127.0.0.1"],
        stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = bytearray()

    def wait_for(text, timeout=20):
        def check():
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    seen.extend(os.read(master, 65536))
                except OSError:
                    pass
            return text.encode() in seen
        poll(check, timeout, f"{text!r} on the terminal")
    try:
        os.write(master, b"stty size; echo mark-$((1+1))\n")
        wait_for("30 100")
        wait_for("mark-2")
        slave_again = os.open(os.readlink(f"/proc/{proc.pid}/fd/0"), os.O_RDWR | os.O_NOCTTY)
        fcntl.ioctl(slave_again, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        os.close(slave_again)
        os.kill(proc.pid, signal.SIGWINCH)
        os.write(master, b"stty size\n")
        wait_for("40 120")
        os.write(master, b"sleep 613\n")
        # The line's echo comes before the shell has made sleep the terminal's
        # foreground group; a ^C in between would go to the shell instead.
        poll(lambda: sleep_in_foreground("613"), 20, "sleep 613 in the terminal's foreground")
        os.write(master, b"\x03")  # the remote terminal's interrupt: sleep dies, the shell stays
        wait_for("^C")
        os.write(master, b"echo after-$((2+2))\n")
        wait_for("after-4")
        os.write(master, b"exit 7\n")
        assert proc.wait(timeout=30) == 7
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        os.close(master)


STANDIN_PODMAN = """#!/bin/sh
# Stand-in podman for SSH: records argv; exec runs the shell it was given on
# the host (where the real one would enter the container); inspect reports a
# running container whose main pid is in $STANDIN_DIR/pid.
{ printf '%s' podman; for a in "$@"; do printf '\\037%s' "$a"; done; printf '\\n'; } >> "$STANDIN_DIR/log"
case "$1" in
pull|stop|rm) exit 0 ;;
run) echo 0123abcd; exit 0 ;;
container)
    case "$4" in
    *Pid*) cat "$STANDIN_DIR/pid"; exit 0 ;;
    *) echo "running 0 0001-01-01T00:00:00Z"; exit 0 ;;
    esac ;;
exec)
    shift
    while [ $# -gt 0 ]; do
        case "$1" in -i|-t) shift ;; -e) export "$2"; shift 2 ;; *) break ;; esac
    done
    shift  # the container name
    exec "$@" ;;
esac
exit 0
"""


@pytest.mark.skipif(not shutil.which("unshare") or not shutil.which("ip"), reason="needs unshare and ip")
def test_podman_exec_and_forward_into_the_container_network(tmp_path, keys):
    standin = tmp_path / "bin"
    standin.mkdir()
    (standin / "podman").write_text(STANDIN_PODMAN)
    os.chmod(standin / "podman", 0o755)
    env = dict(os.environ, STANDIN_DIR=str(standin), PATH=f"{standin}:{os.environ['PATH']}")
    # The "container": a network namespace of its own with a server in it.
    port = free_port()
    server_dir = tmp_path / "www"
    server_dir.mkdir()
    (server_dir / "index.html").write_text("in the container\n")
    container = subprocess.Popen(
        ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {sys.executable} -m http.server --bind 127.0.0.1 "
         f"{port}"], cwd=server_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30).returncode != 0:
        container.kill()
        container.wait(timeout=30)
        pytest.skip("no network namespaces here")
    (standin / "pid").write_text(f"{container.pid}\n")
    outside = free_port()
    host_server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(outside)],
                                   cwd=server_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    n = None
    tunnel = None
    try:
        def in_netns_listening():
            with open(f"/proc/{container.pid}/net/tcp") as f:
                return any(line.split()[1].endswith(f":{port:04X}") and line.split()[3] == "0A"
                           for line in f.readlines()[1:])
        poll(in_netns_listening, 20, "the server in the container's network")
        n = Node.__new__(Node)
        n.dir = str(tmp_path)
        n.agent = Agent(tmp_path / "agent", options={"runtime": "podman", "command_timeout_s": "10"}, env=env)
        n.known_hosts = str(tmp_path / "known_hosts")
        n.pin()
        name = "gpurent-" + n.run_workload("ins_oci-0", [keys["mine"][1]])

        def calls():
            with open(standin / "log") as f:
                return [line.rstrip("\n").split("\x1f") for line in f]
        p = n.ssh(keys["mine"][0], "ins_oci-0", "echo via-$((3*3)); exit 4")
        assert p.returncode == 4 and p.stdout == "via-9\n", p.stderr
        [execs] = [c for c in calls() if c[:2] == ["podman", "exec"]]
        client = f"SSH_CLIENT=127.0.0.1 {execs[4].split()[1]} {n.port}"
        assert execs == ["podman", "exec", "-i", "-e", client, "-e",
                         f"SSH_CONNECTION=127.0.0.1 {execs[4].split()[1]} 127.0.0.1 {n.port}",
                         name, "/bin/sh", "-c", "echo via-$((3*3)); exit 4"], execs
        local_in, local_out = free_port(), free_port()
        tunnel = subprocess.Popen(
            ["ssh", "-F", "/dev/null", "-i", keys["mine"][0], "-o", "IdentitiesOnly=yes",
             "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={n.known_hosts}",
             "-o", "BatchMode=yes", "-N", "-p", str(n.port),
             "-L", f"127.0.0.1:{local_in}:localhost:{port}", "-L", f"127.0.0.1:{local_out}:localhost:{outside}",
             "ins_oci-0@127.0.0.1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def tunnel_up():
            try:
                socket.create_connection(("127.0.0.1", local_in), timeout=1).close()
                return True
            except OSError:
                return False
        poll(tunnel_up, 20, "the tunnel")
        body = urllib.request.urlopen(f"http://127.0.0.1:{local_in}/index.html", timeout=10).read()
        assert body == b"in the container\n"
        assert ["podman", "container", "inspect", "--format", "{{.State.Pid}}", name] in calls()
        # The host's server on another port is not the container's: refused.
        with pytest.raises(Exception):
            urllib.request.urlopen(f"http://127.0.0.1:{local_out}/index.html", timeout=10).read()
        n.agent.wait_for_log("no process of the workload listens on that port")
    finally:
        if tunnel:
            stop_client(tunnel)
        if n:
            n.stop()
        for proc in (container, host_server):
            proc.terminate()
            proc.wait(timeout=30)
