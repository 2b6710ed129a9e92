"""harness.py: start and drive a real gpurentd for end-to-end tests.

Every test talks to the real binary ($GPURENTD, default build/gpurentd) over
HTTP on a loopback port, with its own directory, database and testing clock.
Nothing here sleeps to wait for an outcome: waits poll with a deadline.

Module-level
------------
GPURENTD                      path of the binary under test
REPO                          the repository root (for routes.c, migrations/)
START_TIME                    the testing clock's first value (epoch seconds)
run_gpurentd(*args, input=None, timeout=60) -> subprocess.CompletedProcess
                              runs a one-shot subcommand (migrate, admin …,
                              -n); asserts its stderr has no sanitizer report
assert_no_sanitizer_report(text, what)
assert_error(resp, status, code, field=None) -> dict
                              checks an error reply: status, JSON body exactly
                              {"error":{"code","message","field"}}, X-Request-Id,
                              WWW-Authenticate on 401; returns the error object
route_table() -> [(method, pattern, auth)]
                              the daemon's route table, read from routes.c
migration_versions() -> {version: name}
                              every migrations/NNNN_name.sql in the tree
api_key_hash(token) -> bytes  what api_keys.secret_hash holds for a token
Account                       dataclass: id, email, password, key, key_id
unique_email(prefix)          a fresh address, so tests sharing a daemon never collide
stop_all(daemons)             stops each (asserting a clean exit), killing any that fail

Daemon(directory, *, options=None, config=None, args=(), clock=START_TIME,
       start=True, listen="127.0.0.1:0")
    One `gpurentd serve` process. directory is created if needed and holds
    gpurent.db, clock (the testing clock file), gpurentd.conf (when config
    text is given; passed with -c) and stdout-N.log / stderr-N.log for the
    N-th start. options are extra `-o key=value` overrides, applied over
    FAST_OPTIONS (password_iterations=1000, no sign-up or reset rate limits). clock=None runs on the system
    clock. listen defaults to port 0: the daemon binds a free port and the
    harness reads it from the "listening on" log line, so there is no race
    for ports between tests.

  attributes  dir, db_path, clock_path, config_path, port, base_url,
              admin_key (bootstrap admin's token, kept across restarts),
              proc (subprocess.Popen), starts (number of starts)
  lifecycle   start() waits for the listen line and /readyz (raises with the
              logs if the process exits first)
              stop(sig=SIGTERM, timeout=60) -> returncode; asserts exit 0 and
              no sanitizer report in stderr
              restart() stop() then start() on the same database
              terminate(sig) / wait(timeout) -> returncode, no assertions:
              for tests that check exit codes and logs themselves
  clock       now(), set_clock(t), advance_clock(seconds); the file is
              written whole to a temporary name and renamed over the old one,
              so the daemon never reads a partial value
  HTTP        url(path); request(method, path, key=None, json=NOJSON,
              data=None, headers=None, params=None, session=None) ->
              requests.Response (a new connection per call unless a
              requests.Session is given); get/post/delete(path, **kw).
              Raw data (bytes or str) goes as Content-Type: application/json,
              as the API wants, unless headers name another type (or None,
              to send none)
  accounts    signup(email=None, password=None, verify=True, **fields) -> Account
              (asserts 201; verify: reads the code from the "E-MAIL NOT SENT"
              log line of a daemon without smtp_url and verifies the address,
              so the account has its trial credit and may launch);
              verification_code(email) -> the last code logged for email;
              verify_email(email) -> the 200 body; login(email, password, **fields) -> Response;
              create_key(key, name=None) -> dict (the 201 body);
              cli_create_user(email, admin=False, password=None) -> token
  database    sql(query, params=()) -> list of tuples (read-only sqlite3
              URI connection, so the test never writes); tables();
              row_counts() -> {table: rows}; dump() -> {table: sorted rows},
              for "bad input changed nothing" assertions
  logs        stdout_text(), stderr_text() (this start's),
              wait_for_log(regex, timeout=10) -> re.Match
"""
import dataclasses
import hashlib
import itertools
import os
import re
import signal
import sqlite3
import subprocess
import time
import uuid

import requests

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GPURENTD = os.path.abspath(os.environ.get("GPURENTD") or os.path.join(REPO, "build", "gpurentd"))
START_TIME = 1_800_000_000  # 2027-01-15T08:00:00Z
# Tests make many accounts from 127.0.0.1: the sign-up and password reset
# rate limits are off unless a test sets them (tests/e2e/accounts/
# test_signup.py and test_password_reset.py do).
FAST_OPTIONS = {"password_iterations": "1000", "signup_rate_per_address": "0", "signup_rate_per_subnet": "0",
                "password_reset_rate_per_email": "0", "password_reset_rate_per_address": "0",
                # the repository's web console, not an installed one
                "console_dir": os.path.join(REPO, "console")}
DEFAULT_PASSWORD = "correct horse battery"
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer", "ERROR: ThreadSanitizer")
REQUEST_ID = re.compile(r"^req_[0-9a-z]{20}$")
TOKEN = re.compile(r"^gpk_[0-9a-z]{20}_[0-9a-f]{64}$")
NOJSON = object()  # request(json=NOJSON) sends no JSON body (json=None sends "null")


def _env():
    env = dict(os.environ)
    # Sanitized builds must fail loudly; plain builds ignore these.
    env.setdefault("ASAN_OPTIONS", "halt_on_error=1:detect_leaks=1:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
    return env


def assert_no_sanitizer_report(text, what):
    for marker in SANITIZER_MARKERS:
        assert marker not in text, f"{what}: sanitizer report ({marker!r}):\n{text[-6000:]}"


def run_gpurentd(*args, input=None, timeout=60):
    """Runs the binary with args; returns the CompletedProcess (text mode)."""
    p = subprocess.run([GPURENTD, *map(str, args)], input=input, capture_output=True, text=True,
                       timeout=timeout, env=_env())
    assert_no_sanitizer_report(p.stderr, f"gpurentd {' '.join(map(str, args))}")
    return p


def assert_error(resp, status, code, field=None):
    """Asserts resp is the API's error reply and returns its error object."""
    assert resp.status_code == status, f"want {status} {code}, got {resp.status_code}: {resp.text[:500]}"
    assert REQUEST_ID.match(resp.headers.get("X-Request-Id", "")), resp.headers
    assert resp.headers.get("Content-Type", "").startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert {"code", "message", "field"} <= set(err), err
    assert err["code"] == code, err
    assert err["field"] == field, err
    assert isinstance(err["message"], str) and err["message"], err
    if status == 401:
        assert resp.headers.get("WWW-Authenticate", "").startswith("Bearer"), resp.headers
    return err


_ROUTE = re.compile(r'\{\s*"([A-Z]+)"\s*,\s*"([^"]+)"\s*,\s*\w+\s*,\s*(AUTH_\w+)\s*(?:,\s*\w+\s*)?\}')


def route_table():
    """The daemon's routes as (method, pattern, auth) from routes.c."""
    with open(os.path.join(REPO, "src", "gpurentd", "http", "routes.c")) as f:
        routes = _ROUTE.findall(f.read())
    assert routes, "no routes found in src/gpurentd/http/routes.c: has its format changed?"
    return routes


def migration_versions():
    out = {}
    for name in os.listdir(os.path.join(REPO, "migrations")):
        m = re.match(r"^(\d{4})_(.+)\.sql$", name)
        if m:
            out[int(m.group(1))] = name[:-4]
    assert out, "no migrations/NNNN_name.sql files"
    return out


def api_key_hash(token):
    """SHA-256 of the token's secret part, as the daemon stores it."""
    return hashlib.sha256(token.rsplit("_", 1)[1].encode()).digest()


def stop_all(daemons):
    """Stops every daemon (SIGTERM, clean exit asserted), even when one fails."""
    errors = []
    for d in daemons:
        try:
            d.stop()
        except AssertionError as e:
            errors.append(str(e))
            d.kill()
    assert not errors, "\n\n".join(errors)


def unique_email(prefix="user"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}@example.test"


@dataclasses.dataclass
class Account:
    id: str        # usr_…
    email: str     # as stored (lowercase)
    password: str  # the password it signed up with
    key: str       # token of its sign-up API key
    key_id: str    # key_… of that key


class Daemon:
    def __init__(self, directory, *, options=None, config=None, args=(), clock=START_TIME, start=True,
                 listen="127.0.0.1:0"):
        self.dir = str(directory)
        os.makedirs(self.dir, exist_ok=True)
        self.db_path = os.path.join(self.dir, "gpurent.db")
        self.clock_path = os.path.join(self.dir, "clock") if clock is not None else None
        self.config_path = None
        if config is not None:
            self.config_path = os.path.join(self.dir, "gpurentd.conf")
            with open(self.config_path, "w") as f:
                f.write(config)
        self.options = {**FAST_OPTIONS, **(options or {})}
        self.extra_args = list(args)
        self.listen = listen
        self.proc = None
        self.port = None
        self.base_url = None
        self.admin_key = None
        self.starts = 0
        self._tmp_names = itertools.count()
        if clock is not None:
            self.set_clock(clock)
        if start:
            self.start()

    # ------------------------------------------------------------ lifecycle

    def command(self):
        cmd = [GPURENTD, "serve", "--listen", self.listen, "--db", self.db_path]
        if self.config_path:
            cmd += ["-c", self.config_path]
        if self.clock_path:
            cmd += ["--clock-file", self.clock_path]
        for k, v in self.options.items():
            cmd += ["-o", f"{k}={v}"]
        return cmd + self.extra_args

    def _log_path(self, kind):
        return os.path.join(self.dir, f"{kind}-{self.starts}.log")

    def spawn(self):
        """Starts the process without waiting for it to serve."""
        assert self.proc is None, "already running"
        self.starts += 1
        with open(self._log_path("stdout"), "wb") as out, open(self._log_path("stderr"), "wb") as err:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=_env())

    def start(self, timeout=60):
        self.spawn()
        m = self.wait_for_log(r"listening on https?://\S+:(\d+) ", timeout=timeout)
        self.port = int(m.group(1))
        host = "127.0.0.1" if self.listen.startswith("127.") or self.listen.startswith("0.") else "[::1]"
        self.base_url = f"http://{host}:{self.port}"
        # The bootstrap admin's key is the last line of stdout, printed once
        # before the daemon listens, on an empty database only.
        lines = self.stdout_text().splitlines()
        if lines and lines[-1].startswith("gpk_"):
            assert TOKEN.match(lines[-1]), lines[-1]
            self.admin_key = lines[-1]
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = requests.get(self.url("/readyz"), timeout=5)
                if r.status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            self._check_alive()
            assert time.monotonic() < deadline, f"/readyz not ready after {timeout}s\n{self.stderr_text()[-4000:]}"
            time.sleep(0.02)

    def _check_alive(self):
        if self.proc.poll() is not None:
            rc = self.proc.returncode
            self.proc = None
            raise AssertionError(f"gpurentd exited with {rc} while starting:\n{self.stderr_text()[-4000:]}")

    def terminate(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait(self, timeout=60):
        """Waits for the process to exit and returns its exit code."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            raise AssertionError(f"gpurentd did not exit within {timeout}s:\n{self.stderr_text()[-4000:]}")
        self.proc = None
        return rc

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signals the daemon, asserts a clean exit (0, no sanitizer report)."""
        if self.proc is None:
            return None
        self.terminate(sig)
        rc = self.wait(timeout)
        log = self.stderr_text()
        assert_no_sanitizer_report(log, "gpurentd serve")
        assert rc == 0, f"gpurentd exited with {rc} after {sig!r}:\n{log[-4000:]}"
        return rc

    def kill(self):
        """Stops without checks (fixture clean-up after a failed test)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self, timeout=60):
        self.stop()
        return self.start(timeout=timeout)

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    # ------------------------------------------------------------ clock

    def now(self):
        with open(self.clock_path) as f:
            return int(f.read())

    def set_clock(self, t):
        tmp = f"{self.clock_path}.tmp{next(self._tmp_names)}"
        with open(tmp, "w") as f:
            f.write(f"{int(t)}\n")
        os.rename(tmp, self.clock_path)

    def advance_clock(self, seconds):
        self.set_clock(self.now() + seconds)
        return self.now()

    # ------------------------------------------------------------ HTTP

    def url(self, path):
        return self.base_url + path

    def request(self, method, path, key=None, json=NOJSON, data=None, headers=None, params=None, session=None,
                timeout=30):
        h = dict(headers or {})
        if key is not None:
            h["Authorization"] = f"Bearer {key}"
        if isinstance(data, (bytes, str)) and not any(k.lower() == "content-type" for k in h):
            h["Content-Type"] = "application/json"
        kw = {"headers": h, "data": data, "params": params, "timeout": timeout, "allow_redirects": False}
        if json is not NOJSON:
            kw["json"] = json
        return (session or requests).request(method, self.url(path), **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, **kw):
        return self.request("POST", path, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)

    # ------------------------------------------------------------ accounts

    def signup(self, email=None, password=None, verify=True, **fields):
        email = email or unique_email()
        password = password or DEFAULT_PASSWORD
        r = self.post("/v1/signup", json={"email": email, "password": password, **fields})
        assert r.status_code == 201, r.text
        body = r.json()
        if verify:
            self.verify_email(email)
        return Account(id=body["user"]["id"], email=body["user"]["email"], password=password,
                       key=body["api_key"]["token"], key_id=body["api_key"]["id"])

    def verification_code(self, email, timeout=10):
        """The newest verification code the mailer logged for email (as typed)."""
        rx = rf"E-MAIL NOT SENT \(no smtp_url\): verify {re.escape(email)} with code (evc_[0-9a-z]{{20}})"
        self.wait_for_log(rx, timeout=timeout)
        return re.findall(rx, self.stderr_text())[-1]

    def verify_email(self, email):
        r = self.post("/v1/verify-email", json={"token": self.verification_code(email)})
        assert r.status_code == 200, r.text
        return r.json()

    def login(self, email, password, **fields):
        return self.post("/v1/login", json={"email": email, "password": password, **fields})

    def create_key(self, key, name=None):
        r = self.post("/v1/api-keys", key=key, json={} if name is None else {"name": name})
        assert r.status_code == 201, r.text
        return r.json()

    def cli_create_user(self, email, admin=False, password=None):
        args = ["admin", "create-user", "--db", self.db_path, "--email", email]
        if admin:
            args.append("--admin")
        if password is not None:
            args.append("--password-stdin")
        p = run_gpurentd(*args, input=(password + "\n") if password is not None else None)
        assert p.returncode == 0, p.stderr
        token = p.stdout.splitlines()[-1]
        assert TOKEN.match(token), p.stdout
        return token

    # ------------------------------------------------------------ database

    def _connect(self):
        return sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10)

    def sql(self, query, params=()):
        con = self._connect()
        try:
            return con.execute(query, params).fetchall()
        finally:
            con.close()

    def tables(self):
        return [r[0] for r in self.sql(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]

    def row_counts(self):
        con = self._connect()
        try:
            names = [r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
            return {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in names}
        finally:
            con.close()

    # Columns written on their own schedule, whatever a test's requests do, so
    # "this request changed nothing" compares without them: the heartbeat's
    # missed beats (a node that stays unreachable counts one more every poll)
    # and the digest of the last facts reply it judged (which changes whenever
    # a workload on the node moves on, e.g. pulling to running), and a key's
    # last use, noted just after a successful request's reply (so it may land
    # after the dump a test takes next).
    BACKGROUND_COLUMNS = {"node_liveness": ("missed_beats", "facts_digest"),
                          "api_keys": ("last_used_at",)}

    def dump(self):
        """Every row of every table, read in one transaction, with the
        columns written in the background (BACKGROUND_COLUMNS) blanked."""
        con = self._connect()
        try:
            con.execute("BEGIN")
            names = [r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
            out = {}
            for t in names:
                cur = con.execute(f'SELECT * FROM "{t}"')
                cols = [c[0] for c in cur.description]
                blank = [cols.index(c) for c in self.BACKGROUND_COLUMNS.get(t, ())]
                rows = [tuple(None if i in blank else v for i, v in enumerate(r)) for r in cur.fetchall()]
                out[t] = sorted(rows, key=repr)
            return out
        finally:
            con.close()

    # ------------------------------------------------------------ logs

    def _read(self, kind):
        try:
            with open(self._log_path(kind), "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def stdout_text(self):
        return self._read("stdout")

    def stderr_text(self):
        return self._read("stderr")

    def wait_for_log(self, pattern, timeout=10):
        """Polls this start's stderr until pattern matches; returns the match."""
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.stderr_text())
            if m:
                return m
            if self.proc is not None and self.proc.poll() is not None:
                m = rx.search(self.stderr_text())
                if m:
                    return m
                raise AssertionError(f"gpurentd exited ({self.proc.returncode}) before logging "
                                     f"/{pattern}/:\n{self.stderr_text()[-4000:]}")
            assert time.monotonic() < deadline, f"no /{pattern}/ in the log after {timeout}s:\n" \
                                                f"{self.stderr_text()[-4000:]}"
            time.sleep(0.01)


def kernel_buffer_max():
    """The most bytes the kernel may hold for one loopback connection, both
    ends' buffers together (tcp_rmem and tcp_wmem's maxima)."""
    total = 0
    for name in ("tcp_rmem", "tcp_wmem"):
        with open(f"/proc/sys/net/ipv4/{name}") as f:
            total += int(f.read().split()[2])
    return total
