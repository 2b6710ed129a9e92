"""agent_util.py: start and drive a real gpurent-agent for end-to-end tests.

Every test talks to the real binary ($GPURENT_AGENT, default
build/gpurent-agent) over HTTP on a loopback port, with its own state
directory. Requests are signed here in Python with hmac/hashlib, written
from docs/AGENT_PROTOCOL.md rather than from the C code. Nothing sleeps to
wait for an outcome: waits poll with a deadline.

Module-level
------------
AGENT                         path of the binary under test
SIM_FAST                      sim delays small enough for tests
new_secret() -> str           64 lowercase hex digits
sign(secret, method, path, body=b"", ts=None, nonce=None) -> dict
                              the three X-Gpurent-* headers
assert_no_sanitizer_report(text, what)
assert_error(resp, status, code) -> dict   checks the error body shape
poll(fn, timeout=20, what="") -> value     calls fn until it returns truthy
pause(proc)                   SIGSTOP, returning once every thread is stopped
run_agent(*args, timeout=30) -> CompletedProcess   one-shot (-n, --help)

Agent(directory, *, options=None, secret=True, node="node-a", env=None,
      start=True, config=None, wrapper=())
    One `gpurent-agent` (serve) process, runtime sim and discovery config
    unless options say otherwise. directory holds state/, agent.secret
    (mode 0600; secret=False leaves it out, a string sets its value) and
    stderr-N.log for the N-th start. listen is 127.0.0.1:0: the port is
    read from the "listening on" log line, so tests never race for ports.
    options are given as -o; one whose value is None is left out (so a
    configuration file can set it). config is a path given as -c. wrapper
    is a command line put before the agent's (it must exec "$@").
  start(), stop(sig=SIGTERM) -> rc (asserts 0 and no sanitizer report),
  kill() (SIGKILL, no checks), restart(**options)
  request(method, path, json=None, data=None, secret=None, headers=None,
          sign=True, ts=None, nonce=None) -> requests.Response
  get/put/delete(path, **kw); wait_phase(id, phases, timeout=20) -> dict
  stderr_text(), wait_for_log(regex, timeout=10)
  signed_floor() -> int: the earliest request timestamp this run accepts,
      from its log


Fleet(directory, control_plane, *, nodes=3, model="MI450", extra=(),
      options=None, start=True)
    One `gpurent-agent sim-fleet` process; its stdout lines are parsed:
    lines (all), nodes {name: {"status", "id", "url"}}, base_url.
  request(node, secret, method, path, **kw) like Agent.request, under
  /nodes/NODE.

FakeControlPlane()
    A tiny gpurentd stand-in (http.server) for POST /v1/admin/nodes: 201
    with a fresh secret for a new name, 409 for a known one; fail_names
    get 500. calls: list of (headers, body) received; secrets: {name: secret}.
"""
import hashlib
import hmac
import http.server
import json
import os
import re
import secrets as pysecrets
import signal
import subprocess
import threading
import time

import requests

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
AGENT = os.path.abspath(os.environ.get("GPURENT_AGENT") or os.path.join(REPO, "build", "gpurent-agent"))

SIM_FAST = {"sim_pull_ms": "60", "sim_mount_ms": "60", "sim_start_ms": "60", "sim_exit_ms": "300",
            "ssh_listen": "127.0.0.1:0"}  # each node its own ephemeral SSH port: tests never collide

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "ThreadSanitizer", "UndefinedBehaviorSanitizer")


def new_secret():
    return pysecrets.token_hex(32)


def sign(secret, method, path, body=b"", ts=None, nonce=None):
    """The protocol's signature: HMAC-SHA256 over five lines."""
    if isinstance(body, str):
        body = body.encode()
    ts = str(int(time.time()) if ts is None else ts)
    nonce = nonce or os.urandom(16).hex()
    canonical = "\n".join([method, path, ts, nonce, hashlib.sha256(body or b"").hexdigest()])
    sig = hmac.new(secret.encode(), canonical.encode(), hashlib.sha256).hexdigest()
    return {"X-Gpurent-Timestamp": ts, "X-Gpurent-Nonce": nonce, "X-Gpurent-Signature": sig}


def assert_no_sanitizer_report(text, what):
    for marker in SANITIZER_MARKERS:
        assert marker not in text, f"{what}: sanitizer report:\n{text[-6000:]}"


ANY_FIELD = object()


def assert_error(resp, status, code, field=ANY_FIELD):
    """The agent's error reply: status, {"error": {code, message, field}}
    (and a card conflict's holder, AGENT_PROTOCOL.md), field checked when
    given; returns the error."""
    assert resp.status_code == status, f"want {status} {code}, got {resp.status_code}: {resp.text}"
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) - {"holder"} == {"code", "message", "field"}, err
    assert err["code"] == code and (field is ANY_FIELD or err["field"] == field), err
    assert err["message"], err
    return err


# The least any poll waits before it fails. A bound, not a measure: a poll
# returns as soon as its condition holds, and a machine loaded with other
# suites and sanitized builds on two cores once took more than 10 s to
# remove a sim workload (test_replayed_request_is_refused failed so).
PATIENCE = 60


def poll(fn, timeout=20, what=""):
    timeout = max(timeout, PATIENCE)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or fn}; last value {last!r}")


def pause(proc, timeout=20):
    """SIGSTOPs proc and returns once every thread of it has stopped. kill()
    returns before a multi-threaded process is stopped: the thread the
    signal woke stops the others when it next runs, and until then another
    thread may still answer a request sent at once (a paused node that
    answered a log read flaked test_shutdown_answers_pending_reads)."""
    proc.send_signal(signal.SIGSTOP)

    def stopped():
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                with open(f"/proc/{proc.pid}/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:  # the thread ended meanwhile
                continue
            if state not in ("T", "t"):
                return False
        return True
    poll(stopped, timeout, f"every thread of process {proc.pid} stopped")


def run_agent(*args, timeout=30, env=None):
    p = subprocess.run([AGENT, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert_no_sanitizer_report(p.stderr, f"gpurent-agent {' '.join(args)}")
    return p


def _wait_listening(proc, path, timeout=20):
    pattern = re.compile(r"listening on https?://([0-9.]+|\[[0-9a-f:]+\]):(\d+)")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            m = pattern.search(f.read())
        if m:
            return int(m.group(2))
        if proc.poll() is not None:
            with open(path, errors="replace") as f:
                raise AssertionError(f"gpurent-agent exited with {proc.returncode} during start-up:\n{f.read()}")
        time.sleep(0.02)
    raise AssertionError(f"gpurent-agent did not report its port within {timeout}s")


class _Signed:
    """HTTP helpers shared by Agent and Fleet."""
    base_url = None

    def _request(self, secret, method, path, json_body=None, data=None, headers=None, sign_it=True,
                 ts=None, nonce=None, timeout=10):
        if json_body is not None:
            data = json.dumps(json_body).encode()
        if isinstance(data, str):
            data = data.encode()
        data = data or b""
        h = dict(headers or {})
        if sign_it:
            h.update(sign(secret, method, path, data, ts=ts, nonce=nonce))
        if data:
            h.setdefault("Content-Type", "application/json")
        return requests.request(method, self.base_url + path, data=data, headers=h, timeout=timeout)




class Agent(_Signed):
    def __init__(self, directory, *, options=None, secret=True, node="node-a", env=None, start=True, config=None,
                 wrapper=()):
        self.dir = str(directory)
        os.makedirs(self.dir, exist_ok=True)
        self.state_dir = os.path.join(self.dir, "state")
        self.secret_path = os.path.join(self.dir, "agent.secret")
        self.node = node
        self.secret = secret if isinstance(secret, str) else (new_secret() if secret else None)
        if self.secret:
            self.write_secret(self.secret)
        self.options = {
            "runtime": "sim", "discovery": "config", "listen": "127.0.0.1:0", "state_dir": self.state_dir,
            "secret_file": self.secret_path, "node_name": node, "log_level": "info", **SIM_FAST,
        }
        self.options.update(options or {})
        self.env = env
        self.config = config
        self.wrapper = list(wrapper)
        self.proc = None
        self.starts = 0
        self.port = None
        if start:
            self.start()

    def write_secret(self, value):
        tmp = self.secret_path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.secret_path)
        self.secret = value

    @property
    def stderr_path(self):
        return os.path.join(self.dir, f"stderr-{self.starts}.log")

    def start(self):
        self.starts += 1
        args = [*self.wrapper, AGENT]
        if self.config:
            args += ["-c", str(self.config)]
        for k, v in self.options.items():
            if v is not None:
                args += ["-o", f"{k}={v}"]
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=self.env)
        self.port = _wait_listening(self.proc, self.stderr_path)
        self.base_url = f"http://127.0.0.1:{self.port}"

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if not self.proc:
            return None
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        text = self.stderr_text()
        assert_no_sanitizer_report(text, "gpurent-agent")
        assert rc == 0, f"gpurent-agent exited {rc}:\n{text[-4000:]}"
        self.proc = None
        return rc

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def restart(self, **options):
        self.stop()
        self.options.update({k: str(v) for k, v in options.items()})
        self.start()

    def stderr_text(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def wait_for_log(self, regex, timeout=10):
        pattern = re.compile(regex)
        return poll(lambda: pattern.search(self.stderr_text()), timeout, f"log line {regex!r}")

    def signed_floor(self):
        m = re.search(r"signed requests dated before (\d+) are refused", self.stderr_text())
        assert m, self.stderr_text()[-2000:]
        return int(m.group(1))

    def request(self, method, path, json=None, data=None, secret=None, headers=None, sign=True, ts=None,
                nonce=None, timeout=10):
        return self._request(secret or self.secret or "0" * 64, method, path, json, data, headers, sign, ts,
                             nonce, timeout)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def put(self, path, json=None, **kw):
        return self.request("PUT", path, json=json, **kw)

    def delete(self, path, **kw):
        """DELETE. A call signed here is sent again while the agent answers
        202 (the removal still going on), so that it returns the answer once
        the workload is gone; one with headers of the caller's is sent once."""
        if not kw.get("sign", True) or kw.get("headers"):
            return self.request("DELETE", path, **kw)

        def gone():
            r = self.request("DELETE", path, **kw)
            return r if r.status_code != 202 else None
        return poll(gone, 20, f"DELETE {path} to find it removed")

    def wait_phase(self, wl_id, phases, timeout=20):
        phases = {phases} if isinstance(phases, str) else set(phases)

        def check():
            r = self.get(f"/v1/workloads/{wl_id}")
            assert r.status_code == 200, r.text
            body = r.json()
            return body if body["phase"] in phases else None
        return poll(check, timeout, f"workload {wl_id} to reach {sorted(phases)}")


class Fleet(_Signed):
    def __init__(self, directory, control_plane, *, nodes=3, model="MI450", cards=8, extra=(), options=None,
                 start=True, admin_key="gpk_test_admin_key"):
        self.dir = str(directory)
        os.makedirs(self.dir, exist_ok=True)
        self.state_dir = os.path.join(self.dir, "fleet")
        self.args = [AGENT, "sim-fleet", "--control-plane", control_plane, "--admin-key", admin_key,
                     "--model", model, "--nodes", str(nodes), "--cards", str(cards), "--fabric", "fabric-a",
                     "--region", "local", "--listen", "127.0.0.1:0", "--state-dir", self.state_dir,
                     "--log-level", "info", *extra]
        for k, v in {**SIM_FAST, **(options or {})}.items():
            self.args += ["-o", f"{k}={v}"]
        self.n = nodes
        self.proc = None
        self.starts = 0
        if start:
            self.start()

    @property
    def stdout_path(self):
        return os.path.join(self.dir, f"fleet-stdout-{self.starts}.log")

    @property
    def stderr_path(self):
        return os.path.join(self.dir, f"fleet-stderr-{self.starts}.log")

    def stdout_text(self):
        with open(self.stdout_path, errors="replace") as f:
            return f.read()

    def stderr_text(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def start(self, expect_ready=True):
        self.starts += 1
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=err)
        if not expect_ready:
            return

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"sim-fleet exited {self.proc.returncode}:\n{self.stdout_text()}\n"
                                     f"{self.stderr_text()[-4000:]}")
            return "fleet ready:" in self.stdout_text()
        poll(ready, 60, "the fleet's 'fleet ready' line")
        self.parse()

    def parse(self):
        self.lines = self.stdout_text().splitlines()
        m = re.search(r"on (https?://\S+)/nodes/NAME", self.lines[0])
        assert m, self.lines
        self.base_url = m.group(1)
        self.nodes = {}
        for line in self.lines:
            m = re.match(r"node (\S+) (registered|kept|FAILED)(?: id=(\S+))? url=(\S+?):?(?: |$)", line)
            if m:
                self.nodes[m.group(1)] = {"status": m.group(2), "id": m.group(3), "url": m.group(4)}
        return self.nodes

    def stop(self, sig=signal.SIGTERM, timeout=30):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        text = self.stderr_text()
        assert_no_sanitizer_report(text, "gpurent-agent sim-fleet")
        assert rc == 0, f"sim-fleet exited {rc}:\n{text[-4000:]}"
        return rc

    def request(self, node, secret, method, path, json=None, data=None, headers=None, sign=True, ts=None,
                nonce=None, timeout=10):
        return self._request(secret, method, f"/nodes/{node}{path}", json, data, headers, sign, ts, nonce, timeout)


class FakeControlPlane:
    """Answers POST /v1/admin/nodes like gpurentd's admin API."""

    def __init__(self, admin_key="gpk_test_admin_key"):
        self.admin_key = admin_key
        self.calls = []
        self.secrets = {}
        self.ids = {}
        self.fail_names = set()
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                with outer.lock:
                    outer.calls.append((dict(self.headers), raw))
                if self.path != "/v1/admin/nodes":
                    return self._reply(404, {"error": {"code": "not_found", "message": "no route", "field": None}})
                if self.headers.get("Authorization") != f"Bearer {outer.admin_key}":
                    return self._reply(401, {"error": {"code": "unauthorized", "message": "bad key", "field": None}})
                body = json.loads(raw)
                name = body["name"]
                with outer.lock:
                    if name in outer.fail_names:
                        return self._reply(500, {"error": {"code": "internal", "message": "injected failure",
                                                           "field": None}})
                    if name in outer.secrets:
                        return self._reply(409, {"error": {"code": "conflict", "message": "name taken",
                                                           "field": "name"}})
                    secret = new_secret()
                    node_id = "node_" + pysecrets.token_hex(10)
                    outer.secrets[name] = secret
                    outer.ids[name] = node_id
                node = {"id": node_id, "name": name, "agent_url": body["agent_url"], "state": "ready"}
                return self._reply(201, {"node": node, "secret": secret})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self):
        with self.lock:
            return [json.loads(raw) for _, raw in self.calls]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
