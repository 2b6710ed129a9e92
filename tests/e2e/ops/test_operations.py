"""test_operations.py: gpurentd as operators run it.

* systemd: READY=1 (once the port answers and the schema is migrated),
  WATCHDOG=1 pings, RELOADING=1/READY=1 around SIGHUP and STOPPING=1 on
  SIGTERM arrive in that order on a test NOTIFY_SOCKET; SIGHUP really changes
  the log level, the request limits and the login limits. The watchdog
  stops feeding (and says why) when the schema is not the binary's or the
  API takes no connections, and feeds again once that is undone.
* `gpurentd backup` copies the live database while the daemon keeps serving
  writers, and the copy opens and passes `gpurentd ledger verify`.
* GET /metrics is strict Prometheus text (parsed here, not by a library),
  admin-only on the API and keyless on metrics_listen, and its counters and
  gauges move with the actions that should move them.
* Every `gpurentd report` on a dataset built through the API gives the rows
  worked out here, in table, CSV and JSON, and reconciles with `ledger
  verify`'s totals; reports and sqlite3 readers run under write load.
  Utilisation measures each day against the capacity history (nodes added,
  removed, rejected, offline on the testing clock), to the card-second.
* TLS: the API over HTTPS with a throwaway CA, agents over HTTPS verified
  against agent_ca_file, and a node whose certificate the CA did not sign
  goes offline saying why.
"""
import json
import os
import random
import re
import signal
import shutil
import socket
import stat
import sqlite3
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from agent_util import Fleet, poll, run_agent
from harness import GPURENTD, Daemon, START_TIME, assert_error, migration_versions, run_gpurentd
from inventory_util import FakeAgent, facts_doc, node as get_node, register, wait_state
from money_util import IMAGE, MICRO, PRICE, SIM_ZERO, accrue, new_cluster, start_cluster, yuan  # noqa: F401 (a fixture)
from notify_util import NotifySocket, notify_fields as fields
from ops_util import (EnvDaemon, TlsDaemon, ledger_totals, make_ca, make_cert, micro, reconcile, parse_prometheus, report,
                      run_report, sample, total)

HOUR = 3600
DAY = 86400
DEADLINE = 60  # bound on polls; generous for sanitizer builds
REPORTS = ("daily-revenue", "usage", "utilisation", "credit-liability", "topups")
FAST_NODES = {"heartbeat_interval_ms": "100", "heartbeat_miss_limit": "2", "agent_connect_timeout_ms": "500",
              "agent_timeout_ms": "2000", "node_lost_after_s": "0"}


def latest_schema():
    versions = migration_versions()
    return max(versions), versions[max(versions)]


def schema_of(db):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute("SELECT version, name FROM schema_migrations ORDER BY version DESC LIMIT 1").fetchone()
    finally:
        con.close()


# ================================================================ systemd


def test_sd_notify_ready_watchdog_reload_stopping_in_order(tmp_path):
    ns = NotifySocket()
    period_s = 0.3
    d = EnvDaemon(tmp_path / "d", env={"NOTIFY_SOCKET": ns.addr, "WATCHDOG_USEC": str(int(period_s * 1e6))},
                  start=False)
    try:
        d.spawn()
        # The first message is READY=1: no ping or status comes before it.
        _, first = ns.next(DEADLINE)
        f = fields(first)
        assert f.get("READY") == "1", first
        assert f["STATUS"].startswith("serving on 127.0.0.1:"), first
        port = int(f["STATUS"].rsplit(":", 1)[1])
        # By then the port answers at once (no retry) and the schema is at the
        # newest migration.
        r = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert r.status_code == 200, r.text
        assert schema_of(d.db_path) == latest_schema()
        assert f"listening on http://127.0.0.1:{port} " in d.stderr_text()
        d.wait_for_log(r"watchdog: feeding systemd every 150ms after checking the database, the API and the loops")

        # Pings keep coming, half the period apart: none of the next four was
        # sent before the queue was emptied, so however late this process
        # reads them, the fourth comes at least three half-periods later.
        ns.drain()
        t0 = time.monotonic()
        pings = [ns.next(DEADLINE) for _ in range(4)]
        assert [m for _, m in ns.messages[1:]] == ["WATCHDOG=1"] * (len(ns.messages) - 1)
        assert pings[-1][0] - t0 >= 3 * period_s / 2 * 0.8, (t0, pings)

        # SIGHUP: RELOADING=1 then READY=1, pings may interleave; pings go on.
        n = len(ns.messages)
        d.terminate(signal.SIGHUP)
        ns.wait_for(lambda m: m.startswith("READY=1"), DEADLINE, "READY=1 after SIGHUP")
        assert [m for _, m in ns.messages[n:] if m != "WATCHDOG=1"] == ["RELOADING=1", "READY=1"]
        d.wait_for_log(r"reload: applied log_level=info ")
        n = len(ns.messages)
        ns.wait_for(lambda m: m == "WATCHDOG=1", DEADLINE, "a ping after the reload")
        ns.wait_for(lambda m: m == "WATCHDOG=1", DEADLINE, "a second ping after the reload")
        assert all(m == "WATCHDOG=1" for _, m in ns.messages[n:])

        # SIGTERM: STOPPING=1, exit 0, and nothing but pings after STOPPING.
        n = len(ns.messages)
        assert d.stop() == 0
        ns.drain()
        after = [m for _, m in ns.messages[n:]]
        assert "STOPPING=1" in after, after
        assert [m for m in after if m != "WATCHDOG=1"] == ["STOPPING=1"], after
        assert "gpurentd stopped" in d.stderr_text()
    finally:
        d.kill()
        ns.close()


def test_no_watchdog_pings_without_watchdog_usec(tmp_path):
    ns = NotifySocket()
    d = EnvDaemon(tmp_path / "d", env={"NOTIFY_SOCKET": ns.addr}, start=False)
    try:
        d.start()
        _, first = ns.next(DEADLINE)
        assert fields(first)["READY"] == "1"
        # The daemon serves a few requests; still only READY=1 was sent.
        for _ in range(3):
            assert d.get("/healthz").status_code == 200
        assert d.stop() == 0
        ns.drain()
        assert [m for _, m in ns.messages] == [first, "STOPPING=1"], ns.messages
        assert "watchdog:" not in d.stderr_text()
    finally:
        d.kill()
        ns.close()


NOT_FEEDING = "watchdog: not feeding systemd's watchdog: "


def _assert_watchdog_starved(d, ns, problem):
    """The watchdog logs problem at every check and sends no WATCHDOG=1 in
    between: ordered by the watchdog thread's own log lines, not by time. The
    thread pings or logs, one after the other, so once a line is in the log
    every ping sent before it is queued on the socket."""
    line = NOT_FEEDING + problem

    def errors():
        return d.stderr_text().count(line)
    n0 = errors()
    poll(lambda: errors() > n0, DEADLINE, f"the watchdog to log {line!r}")
    ns.drain()
    mark = len(ns.messages)
    n1 = errors()
    poll(lambda: errors() >= n1 + 2, DEADLINE, "two more failed checks")
    ns.drain()
    fed = [m for _, m in ns.messages[mark:] if m == "WATCHDOG=1"]
    assert not fed, f"WATCHDOG=1 sent between failed checks: {ns.messages[mark:]}"
    assert re.search(r"^<3>\S+ error: " + re.escape(line) + "$", d.stderr_text(), re.M), d.stderr_text()[-2000:]


def _watchdog_daemon(tmp_path, **kw):
    ns = NotifySocket()
    d = EnvDaemon(tmp_path / "d", env={"NOTIFY_SOCKET": ns.addr, "WATCHDOG_USEC": "300000"}, start=False, **kw)
    d.start()
    _, first = ns.next(DEADLINE)
    assert fields(first)["READY"] == "1"
    ns.wait_for(lambda m: m == "WATCHDOG=1", DEADLINE, "a first ping while healthy")
    return d, ns


def test_watchdog_stops_feeding_when_the_schema_is_not_this_binarys(tmp_path):
    """A newer gpurentd migrated the database under the running one (an
    upgrade done out of order): the old binary must not pass for healthy."""
    d, ns = _watchdog_daemon(tmp_path)
    try:
        con = sqlite3.connect(d.db_path, timeout=30)
        try:
            with con:
                con.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                            (9999, "9999_from_a_newer_gpurentd", START_TIME))
            _assert_watchdog_starved(d, ns, "the database does not answer or is not migrated")
            assert_error(d.get("/readyz"), 503, "unavailable")
            # Undone: the pings come back.
            with con:
                con.execute("DELETE FROM schema_migrations WHERE version = 9999")
        finally:
            con.close()
        ns.drain()
        ns.wait_for(lambda m: m == "WATCHDOG=1", DEADLINE, "pings once the schema is right again")
        assert d.get("/readyz").status_code == 200
        assert d.stop() == 0
    finally:
        d.kill()
        ns.close()


def test_watchdog_stops_feeding_while_the_api_takes_no_connections(tmp_path):
    """Clients holding every connection the API allows (from other loopback
    addresses, so the per-address rules do not spare the watchdog's own
    /healthz): the API does not answer, so systemd must be left to restart
    the daemon."""
    d, ns = _watchdog_daemon(tmp_path, options={"max_connections": "4", "connection_timeout_s": "600",
                                                "header_timeout_s": "600"})
    held = []
    try:
        # A connection counts once the daemon has answered on it (kept
        # alive afterwards). One opened while the watchdog's own request
        # held a place is closed at once: open another.
        deadline = time.monotonic() + DEADLINE
        while len(held) < 4:
            assert time.monotonic() < deadline, "could not hold four connections"
            s = socket.socket()
            s.settimeout(10)
            s.bind((f"127.0.0.{2 + len(held)}", 0))
            try:
                s.connect(("127.0.0.1", d.port))
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                reply = s.recv(65536)
            except OSError:  # refused with the request unread: a reset
                reply = b""
            if reply.startswith(b"HTTP/1.1 200"):
                held.append(s)
            else:
                s.close()
        _assert_watchdog_starved(d, ns, "the API does not answer /healthz")
    finally:
        for s in held:
            s.close()
    try:
        ns.drain()
        ns.wait_for(lambda m: m == "WATCHDOG=1", DEADLINE, "pings once the connections are free")
        assert d.stop() == 0
    finally:
        d.kill()
        ns.close()


def _logged_path(d, path):
    return f" {path} " in d.stderr_text()


def _request_then_flush(d, path):
    """GET path, then /healthz on the same keep-alive connection: the server
    finishes (and logs) the first request before it reads the second."""
    with requests.Session() as s:
        r = s.get(d.url(path), timeout=10)
        assert r.status_code == 404, r.text
        assert s.get(d.url("/healthz"), timeout=10).status_code == 200
    return r


def test_a_second_daemon_on_the_same_database_is_refused(new_daemon, tmp_path):
    """Two daemons on one database would each reconcile the same instances
    against the agents and bill the same users: the second refuses to start,
    and the first goes on serving; once it has stopped, another may start."""
    first = new_daemon()
    second = subprocess.run([*first.command()[:1], "serve", "--listen", "127.0.0.1:0", "--db", first.db_path],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert second.returncode != 0, second
    assert f"another gpurentd serve is using {first.db_path}" in second.stderr, second.stderr
    assert first.get("/readyz").status_code == 200
    first.restart()
    assert first.get("/readyz").status_code == 200


def test_sighup_reloads_log_level_and_limits(new_daemon):
    d = new_daemon(config="log_level = info\n")
    big = {"email": "big@example.test", "password": "x" * 3000}

    def write(text):
        with open(d.config_path, "w") as f:
            f.write(text)

    def reload(expect):
        before = d.stderr_text().count("reload: ")
        d.terminate(signal.SIGHUP)
        poll(lambda: d.stderr_text().count("reload: ") > before, DEADLINE, "the reload log line")
        assert expect in d.stderr_text().split("reload: ")[-1], d.stderr_text()[-2000:]

    _request_then_flush(d, "/v1/ops-marker-info")
    poll(lambda: _logged_path(d, "/v1/ops-marker-info"), DEADLINE, "the access line of /v1/ops-marker-info (buffered, flushed within a second)")
    assert d.post("/v1/signup", json=big).status_code != 413

    # Quieter: the reload still says what it did, then info lines stop.
    write("log_level = warn\n")
    reload("applied log_level=warn cors_origins='' max_body_bytes=1048576 max_json_depth=16")
    _request_then_flush(d, "/v1/ops-marker-warn")
    assert not _logged_path(d, "/v1/ops-marker-warn")

    # Louder, and a smaller body limit: both at once. (gpurentd writes nothing
    # at debug level itself; the level shows in the info lines coming back.)
    write("log_level = debug\nmax_body_bytes = 2048\n")
    reload("applied log_level=debug cors_origins='' max_body_bytes=2048 max_json_depth=16")
    _request_then_flush(d, "/v1/ops-marker-debug")
    poll(lambda: _logged_path(d, "/v1/ops-marker-debug"), DEADLINE, "the access line of /v1/ops-marker-debug (buffered, flushed within a second)")
    assert not _logged_path(d, "/v1/ops-marker-warn")  # never logged later either
    assert_error(d.post("/v1/signup", json=big), 413, "body_too_large")

    # A broken file changes nothing.
    write("log_level = shouting\n")
    reload("configuration has errors")
    _request_then_flush(d, "/v1/ops-marker-kept")
    poll(lambda: _logged_path(d, "/v1/ops-marker-kept"), DEADLINE, "the access line of /v1/ops-marker-kept (buffered, flushed within a second)")
    assert_error(d.post("/v1/signup", json=big), 413, "body_too_large")
    assert d.get("/readyz").status_code == 200


def test_sighup_reloads_login_limits(new_daemon):
    """login_max_failures and login_lockout_s apply from the first failed
    login after SIGHUP, per account and per client (4 x the account limit)."""
    d = new_daemon(config="login_max_failures = 5\nlogin_lockout_s = 900\n")
    emails = [d.signup().email for _ in range(7)]

    def fail(email):
        return d.login(email, "wrong password entirely")

    # Under the start-up limit of 5, three failures lock nothing.
    for _ in range(3):
        assert_error(fail(emails[0]), 401, "invalid_credentials")

    with open(d.config_path, "w") as f:
        f.write("login_max_failures = 2\nlogin_lockout_s = 120\n")
    before = d.stderr_text().count("reload: ")
    d.terminate(signal.SIGHUP)
    poll(lambda: d.stderr_text().count("reload: ") > before, DEADLINE, "the reload log line")
    line = d.stderr_text().split("reload: ")[-1].split("\n")[0]
    assert "login_max_failures=2 (per client 8) login_lockout_s=120 signup_rate_per_address=" in line, line

    # emails[0] already has three failures in its window: the lower limit
    # locks it at its next failure.
    assert_error(fail(emails[0]), 401, "invalid_credentials")
    r = fail(emails[0])
    assert_error(r, 429, "too_many_requests")
    assert r.headers["Retry-After"] == "120", r.headers  # the new lockout (the clock stands still)
    # A fresh account is locked after two failures, not five.
    assert_error(fail(emails[1]), 401, "invalid_credentials")
    assert_error(fail(emails[1]), 401, "invalid_credentials")
    assert_error(fail(emails[1]), 429, "too_many_requests")
    # Per client: 4 x 2 = 8 failures from this address lock it for every
    # account. So far 6 failures counted (the locked attempts count none).
    assert_error(fail(emails[2]), 401, "invalid_credentials")
    assert_error(fail(emails[3]), 401, "invalid_credentials")
    r = fail(emails[4])
    assert_error(r, 429, "too_many_requests")
    assert r.headers["Retry-After"] == "120", r.headers
    # Even the right password waits now.
    assert_error(d.login(emails[5], "correct horse battery"), 429, "too_many_requests")


# ================================================================ backup


def _grow(d, nodes):
    """Makes the database span many SQLite pages, quickly: nodes with the
    largest labels and agent URL the API takes, registered and removed again
    (a removed node's row stays, and nothing polls it)."""
    labels = {f"k{i:02d}": "x" * 50 for i in range(32)}

    def one(i):
        n, _ = register(d, f"bulk-{i:04d}", "http://127.0.0.1:9/" + "p" * 400, labels=labels)
        r = d.delete(f"/v1/admin/nodes/{n['id']}", key=d.admin_key)
        assert r.status_code in (200, 204), r.text
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(one, range(nodes)))


def _row_count(db, table):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        con.close()


def test_backup_refuses_the_databases_own_files(daemon, tmp_path):
    """A copy renamed over the live database (or its WAL, shared memory or
    the daemon's lock) would replace it under the running daemon: refused,
    however the path is spelled, and nothing changes."""
    db = daemon.db_path
    here = os.path.dirname(db)
    before = daemon.dump()
    for dest in (db, db + "-wal", db + "-shm", db + ".serve-lock",
                 os.path.join(here, ".", os.path.basename(db)), os.path.relpath(db)):
        p = run_gpurentd("backup", dest, "--db", db)
        assert p.returncode == 2 and "give another file for the copy" in p.stderr, (dest, p.stderr)
    assert daemon.dump() == before and daemon.get("/readyz").status_code == 200
    p = run_gpurentd("backup", str(tmp_path / "copy.db"), "--db", db)
    assert p.returncode == 0, p.stderr


def test_backup_refuses_what_is_not_a_regular_file(daemon, tmp_path):
    """The copy is renamed over FILE, which would put it in the place of a
    FIFO, a socket or a device (as root, `backup /dev/full` replaced the
    device node and said it had backed up), or of a symbolic link rather
    than the file it names: each is refused with one line, exit status 2,
    and left as it was. (A FIFO stands for devices here: a test must not
    risk /dev/null.)"""
    db = daemon.db_path
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    elsewhere = tmp_path / "elsewhere.db"
    elsewhere.write_bytes(b"kept")
    link = tmp_path / "link.db"
    link.symlink_to(elsewhere)
    folder = tmp_path / "folder"
    folder.mkdir()
    for dest, says in ((fifo, "not a regular file"), (link, "symbolic link"), (folder, "a directory")):
        p = run_gpurentd("backup", str(dest), "--db", db)
        assert p.returncode == 2 and says in p.stderr and p.stderr.count("\n") == 1, (dest, p.stderr)
        assert p.stdout == "", p.stdout
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.islink(link) and elsewhere.read_bytes() == b"kept"
    assert os.listdir(folder) == [] and not [f for f in os.listdir(tmp_path) if f.endswith(".partial")]
    # An existing regular file is replaced, as before.
    p = run_gpurentd("backup", str(elsewhere), "--db", db)
    assert p.returncode == 0 and elsewhere.read_bytes().startswith(b"SQLite format 3\0"), p.stderr


def test_commands_fail_when_their_output_is_lost(daemon):
    """A report sent to a full disk, or an admin's key shown once that never
    reached its file, is a failure: exit status 1 and why, not 0."""
    with open("/dev/full", "w") as full:
        for args in (("report", "usage"), ("ledger", "verify"),
                     ("admin", "create-user", "--email", "lost-key@example.test")):
            p = subprocess.run([GPURENTD, *args, "--db", daemon.db_path], stdout=full, stderr=subprocess.PIPE,
                               text=True, timeout=60)
            assert p.returncode == 1 and "cannot write standard output" in p.stderr, (args, p.stderr)
    # The key nobody saw does not stay valid.
    assert "so it was revoked" in p.stderr, p.stderr
    rows = daemon.sql("SELECT k.revoked_at IS NOT NULL FROM api_keys k JOIN users u ON u.id = k.user_id"
                      " WHERE u.email = 'lost-key@example.test'")
    assert rows == [(1,)], rows


def test_serve_refuses_a_database_it_cannot_write(tmp_path):
    """SQLite opens a file it may not write read-only without a word, and
    every write would then fail one request at a time: the daemon refuses
    to start instead, saying why. (As root, it runs as nobody: root may
    write any file.)"""
    where = tempfile.mkdtemp(prefix="gpr-ro-", dir="/tmp")  # a path nobody may walk to
    try:
        db = os.path.join(where, "gpurent.db")
        assert run_gpurentd("migrate", "--db", db).returncode == 0
        os.chmod(db, 0o444)
        os.chmod(where, 0o777)  # its lock and WAL may be made beside it; the database itself is read-only
        as_other = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []
        p = subprocess.run([*as_other, GPURENTD, "serve", "--listen", "127.0.0.1:0", "--db", db],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert p.returncode != 0, p.stderr
        assert f"database {db} is read-only to this process" in p.stderr, p.stderr
        assert "listening on" not in p.stderr
    finally:
        os.chmod(where, 0o755)
        shutil.rmtree(where, ignore_errors=True)


def test_backup_while_serving_writers(new_daemon, tmp_path):
    d = new_daemon(options={"max_connections_per_client": "100"})
    _grow(d, 800)
    users = [d.signup() for _ in range(3)]
    for i, u in enumerate(users):
        r = d.post(f"/v1/admin/users/{u.id}/topups", key=d.admin_key,
                   json={"amount": "12.34", "payment_id": f"pay-backup-{i}"})
        assert r.status_code == 201, r.text
    pages = d.sql("PRAGMA page_count")[0][0]
    # Copied 256 pages at a time, a database this size never finished backing
    # up while writers kept committing: every commit restarted the copy.
    assert pages > 768, f"the database should span several backup steps, has {pages} pages"

    stop = threading.Event()
    errors, spans = [], []  # spans: (start, end) of each writer request
    lock = threading.Lock()

    def writer(n):
        """Signs up users as fast as the daemon takes them: each one a write
        transaction of a dozen rows (user, key, credit grant, ledger)."""
        with requests.Session() as s:
            while not stop.is_set():
                t = time.monotonic()
                try:
                    r = d.post("/v1/signup", json={"email": f"bk{n}-{os.urandom(6).hex()}@example.test",
                                                   "password": "correct horse battery"}, session=s)
                    ok = r.status_code == 201
                except requests.RequestException as e:
                    ok, r = False, e
                with lock:
                    spans.append((t, time.monotonic()))
                    if not ok:
                        errors.append(getattr(r, "text", repr(r)))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    backups, windows = [], []
    try:
        poll(lambda: len(spans) >= 4, DEADLINE, "writers to get going")
        users_before = _row_count(d.db_path, "users")
        for i in range(3):
            path = str(tmp_path / f"backup-{i}.db")
            t0 = time.monotonic()
            try:
                p = run_gpurentd("backup", path, "--db", d.db_path, timeout=60)
            except subprocess.TimeoutExpired:
                raise AssertionError("gpurentd backup did not finish within 60 s while writers kept committing")
            windows.append((t0, time.monotonic()))
            assert p.returncode == 0, p.stderr
            assert p.stdout == f"backed up {d.db_path} to {path}\n", p.stdout
            backups.append(path)
        poll(lambda: len(spans) >= 8, DEADLINE, "writers to carry on after the backups")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    users_after = _row_count(d.db_path, "users")
    assert not errors, errors[:5]
    # Writers were served while a backup ran.
    overlapping = [s for s in spans for w in windows if s[0] < w[1] and s[1] > w[0]]
    assert overlapping, (spans[:5], windows)

    for path in backups:
        assert not os.path.exists(path + ".partial")
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)
            assert con.execute("SELECT version, name FROM schema_migrations ORDER BY version DESC LIMIT 1"
                               ).fetchone() == latest_schema()
            n_users = con.execute("SELECT count(*) FROM users").fetchone()[0]
            assert users_before <= n_users <= users_after
            assert con.execute("SELECT count(*) FROM nodes WHERE name LIKE 'bulk-%'").fetchone()[0] == 800
            # One snapshot: every user arrived whole, with its key, and with
            # its credit once verified (the harness's users) or else its
            # verification code and mail (the writers', never verified).
            assert con.execute("SELECT count(*) FROM users u WHERE NOT EXISTS"
                               " (SELECT 1 FROM api_keys k WHERE k.user_id = u.id)").fetchone()[0] == 0
            assert con.execute("SELECT count(*) FROM users u WHERE u.role <> 'admin' AND u.email_verified_at IS NOT NULL"
                               " AND NOT EXISTS (SELECT 1 FROM credit_grants g WHERE g.user_id = u.id)").fetchone()[0] == 0
            assert con.execute("SELECT count(*) FROM users u WHERE u.email_verified_at IS NULL AND (NOT EXISTS"
                               " (SELECT 1 FROM email_verifications v WHERE v.user_id = u.id) OR NOT EXISTS"
                               " (SELECT 1 FROM outbox m WHERE m.user_id = u.id))").fetchone()[0] == 0
            n_verified = con.execute("SELECT count(*) FROM users WHERE role <> 'admin'"
                                     " AND email_verified_at IS NOT NULL").fetchone()[0]
        finally:
            con.close()
        assert not os.path.exists(path + "-wal")
        totals = ledger_totals(path)
        assert totals["topups"] == 3 * 12_340_000
        assert totals["credits_granted"] == n_verified * 10 * MICRO  # the sign-up credit of each verified user
        assert totals["revenue"] == 0


# ================================================================ /metrics


@pytest.fixture(scope="module")
def metrics_cluster(tmp_path_factory):
    # connection_timeout_s: the HTTP layer now and then notices a client that
    # hung up mid-request only when the connection times out.
    c = start_cluster(tmp_path_factory.mktemp("metrics"), nodes={"MI450": 2},
                      options={"metrics_listen": "127.0.0.1:0", "connection_timeout_s": "2", "node_lost_after_s": "0"})
    m = c.d.wait_for_log(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")
    c.metrics_url = f"http://127.0.0.1:{m.group(1)}/metrics"
    yield c
    errors = []
    try:
        c.d.stop()
    except AssertionError as e:
        errors.append(str(e))
        c.d.kill()
    for f in c.fleets:
        if f.proc.poll() is None:
            f.stop()
    assert not errors, errors


def scrape(c, url=None):
    if url:
        r = requests.get(url, timeout=10)
    else:
        r = c.d.get("/metrics", key=c.d.admin_key)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8", r.headers
    # Prometheus's own linter (Debian's prometheus package) finds nothing.
    lint = subprocess.run(["promtool", "check", "metrics"], input=r.text, capture_output=True, text=True, timeout=60)
    assert (lint.returncode, lint.stdout, lint.stderr) == (0, "", ""), lint
    return parse_prometheus(r.text)


def test_metrics_access(metrics_cluster):
    c = metrics_cluster
    user = c.signup()
    assert_error(c.d.get("/metrics"), 401, "unauthorized")
    assert_error(c.d.get("/metrics", key="gpk_" + "0" * 20 + "_" + "0" * 64), 401, "unauthorized")
    assert_error(c.d.get("/metrics", key=user.key), 403, "forbidden")
    api = scrape(c)
    # The private listener needs no key, serves nothing else, and shows the
    # same families.
    plain = scrape(c, c.metrics_url)
    assert set(plain) == set(api)
    base = c.metrics_url.rsplit("/", 1)[0]
    assert requests.get(base + "/v1/me", headers={"Authorization": f"Bearer {user.key}"}, timeout=10).status_code \
        == 404
    assert requests.get(base + "/healthz", timeout=10).status_code == 404
    want = {
        "gpurent_http_requests_total": "counter", "gpurent_http_request_duration_seconds": "histogram",
        "gpurent_nodes": "gauge", "gpurent_cards": "gauge", "gpurent_instances": "gauge",
        "gpurent_revenue_micro_total": "counter", "gpurent_credits_granted_micro_total": "counter",
        "gpurent_credits_spent_micro_total": "counter", "gpurent_credits_expired_micro_total": "counter",
        "gpurent_topups_micro_total": "counter", "gpurent_billing_passes_total": "counter",
        "gpurent_billing_pass_duration_seconds": "gauge", "gpurent_agent_call_errors_total": "counter",
        "gpurent_store_commits_total": "counter", "gpurent_store_transactions_total": "counter",
        "gpurent_store_writers_waiting": "gauge", "gpurent_logs_reads_pending": "gauge",
        "gpurent_store_disk_full": "gauge", "gpurent_cards_capacity": "gauge", "gpurent_build_info": "gauge",
        "process_cpu_seconds_total": "counter", "process_resident_memory_bytes": "gauge",
        "process_virtual_memory_bytes": "gauge", "process_open_fds": "gauge", "process_max_fds": "gauge",
        "process_start_time_seconds": "gauge",
        "gpurent_signups_total": "counter", "gpurent_signups_refused_total": "counter",
        "gpurent_mail_sent_total": "counter",
    }
    for name, kind in want.items():
        assert name in api and api[name].type == kind, (name, api.get(name))
        assert api[name].help, name
    assert sample(api, "gpurent_testing_clock") == 1
    # The real clock's second the process started (not the testing clock's).
    assert time.time() - 600 < sample(api, "process_start_time_seconds") <= time.time()
    # Start-up wrote (migrations, the bootstrap key); batches hold one or more.
    assert sample(api, "gpurent_store_transactions_total") >= sample(api, "gpurent_store_commits_total") >= 1
    assert sample(api, "gpurent_store_writers_waiting") >= 0


def test_metrics_parser_is_strict():
    good = ("# HELP a_total A counter.\n# TYPE a_total counter\na_total{x=\"1\"} 3\n"
            "# TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.3\nh_count 2\n")
    assert sample(parse_prometheus(good), "h_count") == 2
    bad = [
        "a 1\n",                                                          # no TYPE
        "# TYPE a counter\na -1\n",                                        # negative counter
        "# TYPE a counter\na{x=\"1\"} 1\na{x=\"1\"} 2\n",                  # duplicate series
        "# TYPE a gauge\na{1x=\"1\"} 1\n",                                 # bad label name
        "# TYPE a gauge\na{x=\"\\q\"} 1\n",                                # bad escape
        "# TYPE a gauge\na one\n",                                         # bad value
        "# TYPE a gauge\na 1",                                             # no final newline
        "# TYPE a gauge\n# TYPE b gauge\na 1\nb 1\na{y=\"2\"} 1\n",        # family split in two groups
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",  # not cumulative
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",  # no +Inf
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n",  # +Inf != count
        "# TYPE a gauge\n\na 1\n",                                         # empty line
        "# TYPE a gauge\na 1\n# TYPE a gauge\n",                           # TYPE twice / after samples
    ]
    for text in bad:
        with pytest.raises(AssertionError):
            parse_prometheus(text)


def test_metrics_http_counters_move_by_route_and_status(metrics_cluster):
    c = metrics_cluster
    user = c.signup()
    before = scrape(c)

    def count(fams, route, status, method="GET"):
        return sample(fams, "gpurent_http_requests_total", method=method, route=route, status=str(status)) or 0

    def hist(fams, route, status, method="GET"):
        labels = {"method": method, "route": route, "status": str(status)}
        return (sample(fams, "gpurent_http_request_duration_seconds_count", **labels) or 0,
                sample(fams, "gpurent_http_request_duration_seconds_sum", **labels) or 0)

    for _ in range(3):
        assert c.d.get("/v1/me", key=user.key).status_code == 200
    for _ in range(2):
        assert c.d.get("/v1/me").status_code == 401
    assert c.d.get(f"/v1/instances/inst_{'0' * 20}", key=user.key).status_code == 404
    assert c.d.get("/v1/no-such-route").status_code == 404
    # A path no route has is counted under route="unmatched" with method
    # "any" (arbitrary paths and methods must not make new series; an empty
    # value would be no label at all to Prometheus).
    want = {("/v1/me", 200, "GET"): 3, ("/v1/me", 401, "GET"): 2, ("/v1/instances/{id}", 404, "GET"): 1,
            ("unmatched", 404, "any"): 1}

    last = {}

    def moved():
        now = scrape(c)
        last["deltas"] = {k: count(now, *k) - count(before, *k) for k in want}
        return now if last["deltas"] == want else None
    try:
        now = poll(moved, DEADLINE, "the request counters to move")
    except AssertionError as e:
        raise AssertionError(f"{e}: deltas {last['deltas']}, want {want}") from None
    # The latency histogram is by route and status too: the 200s and the
    # 401s of /v1/me are apart.
    for (route, status, method), n in want.items():
        n0, s0 = hist(before, route, status, method)
        n1, s1 = hist(now, route, status, method)
        assert n1 - n0 == n and s1 >= s0, (route, status, method, n0, n1)
        inf = sample(now, "gpurent_http_request_duration_seconds_bucket", method=method, route=route,
                     status=str(status), le="+Inf")
        assert inf == n1, (route, status, method)
    # Every (route, status) histogram counts exactly the requests its counter
    # counts, and there is no histogram series without a counter.
    counters = {(l["method"], l["route"], l["status"]): v
                for n, l, v in now["gpurent_http_requests_total"].samples}
    hists = {(l["method"], l["route"], l["status"]): v
             for n, l, v in now["gpurent_http_request_duration_seconds"].samples
             if n == "gpurent_http_request_duration_seconds_count"}
    assert counters == hists
    for n, l, _ in now["gpurent_http_request_duration_seconds"].samples:
        assert set(l) - {"le"} == {"method", "route", "status"}, (n, l)


def test_metrics_count_requests_the_client_abandoned(metrics_cluster):
    """A client that hangs up mid-body gets no reply: the request still
    counts, under status="0" (docs/OPERATIONS.md), and never under the next
    status the route answers."""
    c = metrics_cluster
    labels = {"method": "any", "route": "unmatched"}

    def hist_count(fams):
        return total(fams, "gpurent_http_request_duration_seconds_count", **labels)
    before = scrape(c)
    hist0 = hist_count(before)
    with socket.create_connection(("127.0.0.1", c.d.port), timeout=10) as s:
        s.sendall(b"POST /v1/signup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"email\":")
    poll(lambda: hist_count(scrape(c)) == hist0 + 1, DEADLINE, "the abandoned request to be counted")
    assert c.d.get("/v1/no-such-route").status_code == 404

    def settled():
        f = scrape(c)
        return f if hist_count(f) == hist0 + 2 else None
    now = poll(settled, DEADLINE, "the 404 to be counted")

    def count(fams, status):
        return sample(fams, "gpurent_http_requests_total", status=status, **labels) or 0
    assert count(now, "0") - count(before, "0") == 1
    assert count(now, "404") - count(before, "404") == 1
    assert total(now, "gpurent_http_requests_total", **labels) == hist_count(now)

    def hist(fams, status):
        return sample(fams, "gpurent_http_request_duration_seconds_count", status=status, **labels) or 0
    assert hist(now, "0") - hist(before, "0") == 1
    assert hist(now, "404") - hist(before, "404") == 1


def test_cards_of_the_reserved_pool_are_reserved_not_unavailable(new_cluster):
    """Healthy, idle cards of a type rented through reservations only are a
    part of their own, not counted as unavailable: an alert on unavailable
    cards must not fire for a healthy reservation fleet."""
    c = new_cluster(nodes={"H100-SXM": 1})
    g = "H100-SXM"
    [t] = [t for t in c.d.get("/v1/gpu-types").json()["data"] if t["code"] == g]
    assert t["cards_reservable"] == 8, t
    m = scrape(c)
    assert [sample(m, "gpurent_cards", gpu_type=g, status=s) for s in ("free", "reserved", "in_use", "unavailable")] \
        == [0, 8, 0, 0]
    assert sample(m, "gpurent_cards_capacity", gpu_type=g) == 8


def test_metrics_inventory_money_and_billing(metrics_cluster):
    c = metrics_cluster
    g = "MI450"
    m = poll(lambda: (lambda f: f if sample(f, "gpurent_nodes", state="ready", gpu_type=g) == 2 else None)(scrape(c)),
             DEADLINE, "two ready nodes in /metrics")
    assert total(m, "gpurent_nodes") == 2
    assert [sample(m, "gpurent_cards", gpu_type=g, status=s) for s in ("free", "in_use", "unavailable")] == [16, 0, 0]
    assert sample(m, "gpurent_cards_capacity", gpu_type=g) == 16
    assert total(m, "gpurent_instances", gpu_type=g, state="running") == 0

    before = m
    u = c.signup()  # 10.00 of trial credit
    t0 = c.d.now()
    iid = c.launch(u, g, 8)

    def launched():
        f = scrape(c)
        ok = (sample(f, "gpurent_instances", state="running", gpu_type=g) == 1
              and [sample(f, "gpurent_cards", gpu_type=g, status=s) for s in ("free", "in_use", "unavailable")]
              == [8, 8, 0] and sample(f, "gpurent_cards_capacity", gpu_type=g) == 16)
        return f if ok else None
    poll(launched, DEADLINE, "the instance and its cards in /metrics")

    c.d.set_clock(t0 + 1800)
    c.billing()  # half an hour of 8 x 1.20 = 4.80, all from credit
    c.topup(u, 5 * MICRO, "pay-metrics-1")
    after = scrape(c)

    def delta(name):
        return sample(after, name) - sample(before, name)
    assert delta("gpurent_credits_granted_micro_total") == 10 * MICRO
    assert delta("gpurent_revenue_micro_total") == accrue(PRICE[g], 8, 1800) == 4_800_000
    assert delta("gpurent_credits_spent_micro_total") == 4_800_000
    assert delta("gpurent_credits_expired_micro_total") == 0
    assert delta("gpurent_topups_micro_total") == 5 * MICRO
    # An admin run waits for a pass that started after it was asked for, so
    # it may take the loop through one more pass (billing.c says why).
    assert delta("gpurent_billing_passes_total") in (1, 2)
    assert sample(after, "gpurent_billing_pass_duration_seconds") >= 0
    assert sample(after, "gpurent_billing_pass_seconds_total") >= sample(before, "gpurent_billing_pass_seconds_total")
    # The money counters agree with the ledger.
    totals = ledger_totals(c.d.db_path)
    assert sample(after, "gpurent_revenue_micro_total") == totals["revenue"]
    assert sample(after, "gpurent_credits_spent_micro_total") == totals["credits_spent"]
    assert sample(after, "gpurent_topups_micro_total") == totals["topups"]

    c.stop(u, iid)
    stopped = scrape(c)
    assert sample(stopped, "gpurent_instances", state="stopped", gpu_type=g) == 1
    assert total(stopped, "gpurent_instances", state="running") == 0
    assert [sample(stopped, "gpurent_cards", gpu_type=g, status=s) for s in ("free", "in_use")] == [16, 0]


def test_metrics_credit_granted_by_invite_and_admin_and_expired(new_daemon):
    """gpurent_credits_granted_micro_total moves with invite-code and admin
    grants, gpurent_credits_expired_micro_total when a grant's remainder is
    voided at expiry; both agree with the ledger."""
    d = new_daemon(options={"billing_interval_ms": "3600000"})  # passes only when asked

    def money():
        r = d.get("/metrics", key=d.admin_key)
        assert r.status_code == 200, r.text
        f = parse_prometheus(r.text)
        return {k: sample(f, f"gpurent_{k}_micro_total") for k in ("credits_granted", "credits_expired")}

    def delta(a, b):
        return {k: b[k] - a[k] for k in a}
    m0 = money()
    r = d.post("/v1/admin/invite-codes", key=d.admin_key, json={"code": "OPS-METRICS", "amount": "3.50"})
    assert r.status_code == 201, r.text
    u = d.signup(invite_code="OPS-METRICS")  # the invite's credit instead of the trial's
    m1 = money()
    assert delta(m0, m1) == {"credits_granted": 3_500_000, "credits_expired": 0}

    expires = d.now() + HOUR
    r = d.post(f"/v1/admin/users/{u.id}/grants", key=d.admin_key,
               json={"amount": "2.25", "expires_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))})
    assert r.status_code == 201, r.text
    m2 = money()
    assert delta(m1, m2) == {"credits_granted": 2_250_000, "credits_expired": 0}

    # Not yet expired: a pass voids nothing.
    assert d.post("/v1/admin/billing/run", key=d.admin_key, json={}).status_code == 200
    assert money() == m2
    d.set_clock(expires)
    assert d.post("/v1/admin/billing/run", key=d.admin_key, json={}).status_code == 200
    m3 = money()
    assert delta(m2, m3) == {"credits_granted": 0, "credits_expired": 2_250_000}
    totals = ledger_totals(d.db_path)
    assert (totals["credits_granted"], totals["credits_expired"]) == (m3["credits_granted"], m3["credits_expired"])


def test_metrics_agent_errors_after_an_agent_dies(metrics_cluster):
    """Last in the module: it kills the fleet."""
    c = metrics_cluster
    before = scrape(c)
    assert sample(before, "gpurent_nodes", state="ready", gpu_type="MI450") == 2
    errors0 = sample(before, "gpurent_agent_call_errors_total")
    f = c.fleets[0]
    f.proc.kill()
    f.proc.wait(timeout=30)

    def offline():
        m = scrape(c)
        ok = sample(m, "gpurent_nodes", state="offline", gpu_type="MI450") == 2 \
            and sample(m, "gpurent_agent_call_errors_total") >= errors0 + 2
        return m if ok else None
    m = poll(offline, DEADLINE, "both nodes offline and agent errors counted")
    assert sample(m, "gpurent_nodes", state="ready", gpu_type="MI450") is None
    assert sample(m, "gpurent_cards", gpu_type="MI450", status="free") == 0
    # The plain listener agrees.
    plain = scrape(c, c.metrics_url)
    assert sample(plain, "gpurent_agent_call_errors_total") >= sample(m, "gpurent_agent_call_errors_total")


# ================================================================ reports

T0 = START_TIME + 14 * HOUR  # 2027-01-15T22:00:00Z: the runs cross midnight
INVITE = "OPS-REPORTS"
PAYMENT = 'pay-ops,"reports"-1'  # CSV must quote it


class Money(int):
    """An expected *_micro column: shown as an amount in every format."""


def _cell(v):
    """An expected value as the table and CSV formats show it."""
    if v is None:
        return ""
    if isinstance(v, Money):
        return yuan(int(v))
    return str(v)


def _json_value(v):
    if isinstance(v, Money):
        return yuan(int(v))
    return v


def hours4(secs):
    """Card-seconds as card-hours with four places, rounded half up, as the
    view computes them."""
    h4 = (secs * 10000 + 1800) // 3600  # ten-thousandths of an hour
    return f"{h4 // 10000}.{h4 % 10000:04d}"


def check_report(db, name, columns, rows, *args):
    """The report gives exactly rows (dicts keyed by columns, in order) in
    all three formats."""
    for fmt in ("table", "csv"):
        header, got = report(db, name, fmt, *args)
        assert header == list(columns), (name, fmt, header)
        want = [[_cell(r[c]) for c in columns] for r in rows]
        assert got == want, f"{name} as {fmt}:\n got {got}\nwant {want}"
    got = report(db, name, "json", *args)
    want = [{c: _json_value(r[c]) for c in columns} for r in rows]
    assert got == want, f"{name} as json:\n got {got}\nwant {want}"
    for row, want_row in zip(got, rows):  # JSON types: integers stay integers, amounts are strings
        for c, v in row.items():
            w = want_row[c]
            assert type(v) is (str if isinstance(w, Money) else type(w)), (name, c, v)
    return got


def test_reports_on_a_known_dataset(tmp_path):
    c = start_cluster(tmp_path, nodes={"MI450": 2, "MI300X": 1}, clock=T0, options={"signup_credit_days": "30"})
    try:
        _known_dataset(c)
    finally:
        c.close()


def _known_dataset(c):
    d, db = c.d, c.d.db_path
    r = d.post("/v1/admin/invite-codes", key=d.admin_key, json={"code": INVITE, "amount": "50.00"})
    assert r.status_code == 201, r.text
    a = c.signup(invite_code=INVITE)      # 50.00 of credit that never expires, no trial credit
    b = c.cli_user()                       # no credit: pays cash
    top = c.topup(b, 100 * MICRO, PAYMENT)
    trial = c.signup()                     # 10.00 of trial credit, expiring in 30 days, never used
    ia = c.launch(a, "MI450", 8)           # 8 x 1.20 an hour
    ib = c.launch(b, "MI300X", 4)          # 4 x 2.20 an hour
    d.set_clock(T0 + HOUR)                 # 23:00 on the 15th
    c.billing()
    d.set_clock(T0 + 3 * HOUR)             # 01:00 on the 16th
    c.billing()
    d.set_clock(T0 + 3 * HOUR + 20 * 60)   # 01:20: b stops after 12 000 s
    c.stop(b, ib)
    d.set_clock(T0 + 4 * HOUR)             # 02:00: a has run 4 hours
    c.billing()

    pa, pb = PRICE["MI450"], PRICE["MI300X"]
    a1, a2, a3 = accrue(pa, 8, HOUR), accrue(pa, 8, 3 * HOUR) - accrue(pa, 8, HOUR), \
        accrue(pa, 8, 4 * HOUR) - accrue(pa, 8, 3 * HOUR)
    b1, b2, b3 = accrue(pb, 4, HOUR), accrue(pb, 4, 3 * HOUR) - accrue(pb, 4, HOUR), \
        accrue(pb, 4, 12000) - accrue(pb, 4, 3 * HOUR)
    assert (a1, a2, a3, b1, b2, b3) == (9_600_000, 19_200_000, 9_600_000, 8_800_000, 17_600_000, 2_933_333)
    d15, d16 = "2027-01-15", "2027-01-16"

    # Revenue is dated by the billing pass that posted it.
    cols = ("day", "gpu_type", "revenue", "paid_by_credit", "paid_by_cash", "transactions")
    rows = [
        dict(zip(cols, (d15, "MI300X", Money(b1), Money(0), Money(b1), 1))),
        dict(zip(cols, (d15, "MI450", Money(a1), Money(a1), Money(0), 1))),
        dict(zip(cols, (d16, "MI300X", Money(b2 + b3), Money(0), Money(b2 + b3), 2))),
        dict(zip(cols, (d16, "MI450", Money(a2 + a3), Money(a2 + a3), Money(0), 2))),
    ]
    check_report(db, "daily-revenue", cols, rows)
    check_report(db, "daily-revenue", cols, rows[2:], "--from", d16)
    check_report(db, "daily-revenue", cols, rows[:2], "--to", d16)
    check_report(db, "daily-revenue", cols, [], "--from", "2027-01-17", "--to", "2027-02-01")

    # Card-seconds are split at midnight; money is dated by its pass.
    cols = ("day", "user_id", "email", "instance_id", "gpu_type", "card_seconds", "cost", "paid_by_credit",
            "paid_by_cash")
    rows = []
    for day in (d15, d16):
        day_rows = [
            dict(zip(cols, (day, a.id, a.email, ia, "MI450", 8 * 2 * HOUR,
                            Money(a1 if day == d15 else a2 + a3), Money(a1 if day == d15 else a2 + a3), Money(0)))),
            dict(zip(cols, (day, b.id, b.email, ib, "MI300X", 4 * (2 * HOUR if day == d15 else HOUR + 20 * 60),
                            Money(b1 if day == d15 else b2 + b3), Money(0), Money(b1 if day == d15 else b2 + b3)))),
        ]
        rows += sorted(day_rows, key=lambda r: (r["user_id"], r["instance_id"]))
    check_report(db, "usage", cols, rows)
    check_report(db, "usage", cols, rows[2:], "--from", d16, "--to", "2027-01-17")

    # Sold over available. The fleet (16 MI450 and 8 MI300X cards) came up
    # at T0, 22:00 on the 15th: that day offers 2 hours of each card, the
    # 16th (still offered) the whole day. Card-hours: sold rounded half up to
    # four places, available exact.
    cols = ("day", "gpu_type", "card_seconds_sold", "card_seconds_available", "utilisation", "card_hours_sold",
            "card_hours_available")
    sold = {(d15, "MI300X"): 4 * 2 * HOUR, (d15, "MI450"): 8 * 2 * HOUR,
            (d16, "MI300X"): 4 * (HOUR + 1200), (d16, "MI450"): 8 * 2 * HOUR}

    def utilisation_rows(available):
        rows = []
        for day in (d15, d16):
            for gpu in ("MI300X", "MI450"):
                avail, secs = available[(day, gpu)], sold[(day, gpu)]
                ratio = f"{round(secs / avail, 4):g}" if avail else None
                rows.append(dict(zip(cols, (day, gpu, secs, avail, ratio, hours4(secs), avail // HOUR))))
        return rows
    available = {(d15, "MI300X"): 8 * 2 * HOUR, (d15, "MI450"): 16 * 2 * HOUR,
                 (d16, "MI300X"): 8 * DAY, (d16, "MI450"): 16 * DAY}
    rows = utilisation_rows(available)
    assert [r["utilisation"] for r in rows] == ["0.5", "0.5", "0.0278", "0.0417"]
    assert [r["card_hours_sold"] for r in rows] == ["8.0000", "16.0000", "5.3333", "16.0000"]
    check_report(db, "utilisation", cols, rows)

    # The MI300X node is removed at 02:00 on the 16th: that day now offers
    # its cards for 2 hours, the 15th is as it was (before migration 0011
    # both days lost them; before 0010 the type's rows vanished).
    [(mi300x,)] = d.sql("SELECT id FROM nodes WHERE gpu_model = 'MI300X' AND removed_at IS NULL")
    r = d.delete(f"/v1/admin/nodes/{mi300x}", key=d.admin_key)
    assert r.status_code in (200, 204), r.text
    assert d.sql("SELECT cards, from_at, to_at FROM node_capacity WHERE node_id = ?", (mi300x,)) == \
        [(8, T0, T0 + 4 * HOUR)]
    rows = utilisation_rows({**available, (d16, "MI300X"): 8 * 2 * HOUR})
    assert [(r["card_seconds_available"], r["utilisation"]) for r in rows if r["gpu_type"] == "MI300X"] == \
        [(57600, "0.5"), (57600, "0.3333")]
    check_report(db, "utilisation", cols, rows)

    # Credit left: the trial grant (expires day 30) first, the invite's (never) last.
    trial_grant = d.sql("SELECT id FROM credit_grants WHERE user_id = ?", (trial.id,))
    invite_grant = d.sql("SELECT id FROM credit_grants WHERE user_id = ?", (a.id,))
    assert len(trial_grant) == 1 and len(invite_grant) == 1
    expires = T0 + 30 * DAY
    cols = ("day", "user_id", "email", "grant_id", "source", "granted", "remaining", "expires_at")
    rows = [
        dict(zip(cols, ("2027-02-14", trial.id, trial.email, trial_grant[0][0], "signup", Money(10 * MICRO),
                        Money(10 * MICRO), "2027-02-14 22:00:00"))),
        dict(zip(cols, (None, a.id, a.email, invite_grant[0][0], f"invite:{INVITE}", Money(50 * MICRO),
                        Money(50 * MICRO - a1 - a2 - a3), None))),
    ]
    assert expires == 1_802_642_400  # 2027-02-14T22:00:00Z
    check_report(db, "credit-liability", cols, rows)
    check_report(db, "credit-liability", cols, rows[:1], "--from", "2027-02-01", "--to", "2027-03-01")

    cols = ("day", "user_id", "email", "topup_id", "payment_id", "source", "amount")
    [(source,)] = d.sql("SELECT source FROM topups WHERE id = ?", (top["topup_id"],))
    rows = [dict(zip(cols, (d15, b.id, b.email, top["topup_id"], PAYMENT, source, Money(100 * MICRO))))]
    check_report(db, "topups", cols, rows)

    t = reconcile(db)
    assert t == {"revenue": a1 + a2 + a3 + b1 + b2 + b3, "credits_granted": 60 * MICRO,
                 "credits_spent": a1 + a2 + a3, "credits_expired": 0,
                 "credit_outstanding": 60 * MICRO - a1 - a2 - a3, "topups": 100 * MICRO,
                 "cash_held": 100 * MICRO - b1 - b2 - b3, "refunds": 0, "credits_refunded": 0}


D1 = START_TIME + 16 * HOUR + 14 * DAY  # 2027-01-30T00:00:00Z, a midnight


def test_utilisation_follows_the_fleet_day_by_day(tmp_path):
    c = start_cluster(tmp_path, nodes={"MI450": 2}, clock=D1)
    try:
        _fleet_history(c, tmp_path)
    finally:
        c.close()


def _fleet_history(c, tmp_path):
    """Day 1: two nodes of 8 cards all day. Day 2: a third node comes up at
    12:00 and one of the first two is removed at 18:00:45. Day 3: two nodes
    again. Each day's available card-seconds are the node_capacity intervals'
    overlap with it, exactly; sold still reconciles with the ledger."""
    d, db = c.d, c.d.db_path
    assert D1 % DAY == 0
    first = sorted(n for (n,) in d.sql("SELECT id FROM nodes"))
    assert d.sql("SELECT node_id, gpu_model, cards, from_at, to_at FROM node_capacity ORDER BY node_id") == \
        [(n, "MI450", 8, D1, None) for n in first]
    u = c.cli_user()
    c.topup(u, 100 * MICRO)

    def run(cards, start, end):
        d.set_clock(start)
        iid = c.launch(u, "MI450", cards)
        d.set_clock(end)
        c.stop(u, iid)
        c.billing()
        c.wait_idle()

    run(1, D1 + 10 * HOUR, D1 + 11 * HOUR)           # day 1: 1 card-hour

    d.set_clock(D1 + DAY + 12 * HOUR)                 # day 2, 12:00: a third node
    late = Fleet(tmp_path / "fleet-late", d.base_url, nodes=1, model="MI450", admin_key=d.admin_key,
                 options=SIM_ZERO, extra=("--name-prefix", "late-"), start=False)
    c.fleets.append(late)
    late.start()
    [third] = [n["id"] for n in late.nodes.values()]
    wait_state(d, third, "ready")
    run(8, D1 + DAY + 13 * HOUR, D1 + DAY + 14 * HOUR)  # day 2: 8 card-hours

    removed_at = D1 + DAY + 18 * HOUR + 45            # 18:00:45: not a whole hour
    d.set_clock(removed_at)
    gone = first[1]
    r = d.delete(f"/v1/admin/nodes/{gone}", key=d.admin_key)
    assert r.status_code in (200, 204), r.text
    run(2, D1 + 2 * DAY + 9 * HOUR, D1 + 2 * DAY + 10 * HOUR)  # day 3: 2 card-hours

    assert sorted(d.sql("SELECT node_id, cards, from_at, to_at FROM node_capacity")) == sorted([
        (first[0], 8, D1, None), (gone, 8, D1, removed_at), (third, 8, D1 + DAY + 12 * HOUR, None)])

    days = [time.strftime("%Y-%m-%d", time.gmtime(D1 + i * DAY)) for i in range(3)]
    sold = [1 * HOUR, 8 * HOUR, 2 * HOUR]
    available = [
        16 * DAY,                                                      # both first nodes all day
        8 * DAY + 8 * (18 * HOUR + 45) + 8 * 12 * HOUR,                # one all day, one to 18:00:45, one from 12:00
        16 * DAY,                                                      # the first and the third (still offered)
    ]
    assert available[1] == 1_555_560  # 432.1 card-hours: not whole, so a decimal string
    cols = ("day", "gpu_type", "card_seconds_sold", "card_seconds_available", "utilisation", "card_hours_sold",
            "card_hours_available")
    rows = [dict(zip(cols, (day, "MI450", s, a, f"{round(s / a, 4):g}", hours4(s),
                            a // HOUR if a % HOUR == 0 else hours4(a))))
            for day, s, a in zip(days, sold, available)]
    assert [r["card_hours_available"] for r in rows] == [384, "432.1000", 384]
    assert [r["utilisation"] for r in rows] == ["0.0026", "0.0185", "0.0052"]
    check_report(db, "utilisation", cols, rows)
    check_report(db, "utilisation", cols, rows[1:2], "--from", days[1], "--to", days[2])
    t = reconcile(db)
    assert t["revenue"] == accrue(PRICE["MI450"], 1, HOUR) + accrue(PRICE["MI450"], 8, HOUR) + \
        accrue(PRICE["MI450"], 2, HOUR)


def test_capacity_history_follows_a_nodes_health(tmp_path):
    """An interval closes when the node is rejected and reopens when its
    facts are accepted again; going offline and back changes nothing (an
    offline node is still in the fleet); removal closes it. Every change is
    dated by the daemon's (testing) clock."""
    agent = FakeAgent(model="MI450", cards=8, name="cap")
    d = EnvDaemon(tmp_path / "d", options=FAST_NODES, clock=D1)
    try:
        n, _ = register(d, "cap", agent.url)

        def history():
            return d.sql("SELECT gpu_model, cards, from_at, to_at FROM node_capacity WHERE node_id = ?"
                         " ORDER BY from_at", (n["id"],))
        wait_state(d, n["id"], "ready")
        assert history() == [("MI450", 8, D1, None)]
        d.set_clock(D1 + 100)
        agent.facts = facts_doc("cap", cards=7)      # not the declared 8: rejected
        wait_state(d, n["id"], "rejected")
        assert history() == [("MI450", 8, D1, D1 + 100)]
        d.set_clock(D1 + 200)
        agent.facts = facts_doc("cap", cards=8)
        wait_state(d, n["id"], "ready")
        d.set_clock(D1 + 300)
        agent.mode = "http500"
        wait_state(d, n["id"], "offline")
        d.set_clock(D1 + 400)
        agent.mode = "facts"
        wait_state(d, n["id"], "ready")
        assert history() == [("MI450", 8, D1, D1 + 100), ("MI450", 8, D1 + 200, None)]
        d.set_clock(D1 + 500)
        r = d.delete(f"/v1/admin/nodes/{n['id']}", key=d.admin_key)
        assert r.status_code in (200, 204), r.text
        assert history() == [("MI450", 8, D1, D1 + 100), ("MI450", 8, D1 + 200, D1 + 500)]
        d.stop()
    finally:
        if d.proc and d.proc.poll() is None:
            d.kill()
        agent.close()


@pytest.mark.parametrize("args, code, says", [
    (("no-such-report",), 2, "no report named 'no-such-report'"),
    (("usage", "--from", "2027-1-5"), 2, "--from and --to take days"),
    (("usage", "--from", "2027-02-30"), 2, "--from and --to take days of the calendar"),
    (("usage", "--to", "2027-13-01"), 2, "--from and --to take days of the calendar"),
    (("usage", "--from", "2027-03-01", "--to", "2027-02-01"), 2, "--from 2027-03-01 is after --to 2027-02-01"),
    (("usage", "--format", "xml"), 2, "--format takes table, csv or json"),
    ((), 2, "usage: gpurentd report"),
])
def test_report_refuses_bad_arguments(daemon, args, code, says):
    p = run_gpurentd("report", *args, "--db", daemon.db_path)
    assert p.returncode == code, (p.stdout, p.stderr)
    assert says in p.stderr and p.stdout == ""


def test_reports_and_sqlite_readers_under_write_load(tmp_path):
    c = start_cluster(tmp_path, nodes={"MI450": 2})
    try:
        _under_load(c)
    finally:
        c.close()


def _under_load(c):
    d, db = c.d, c.d.db_path
    payers = [c.signup() for _ in range(2)]
    for i, u in enumerate(payers):
        c.topup(u, 1000 * MICRO, f"pay-load-{i}")
    errors = []
    lock = threading.Lock()
    writers_done = threading.Event()

    def fail(what):
        with lock:
            errors.append(what)

    def expect(r, *codes):
        if r.status_code not in codes:
            fail(f"{r.request.method} {r.request.path_url}: {r.status_code} {r.text[:300]}")
            return False
        return True

    def accounts(rng):
        with requests.Session() as s:
            for i in range(25):
                r = d.post("/v1/signup", session=s, json={"email": f"load-{os.urandom(6).hex()}@example.test",
                                                         "password": "correct horse battery"})
                if not expect(r, 201):
                    continue
                body = r.json()
                r = d.post(f"/v1/admin/users/{body['user']['id']}/topups", key=d.admin_key, session=s,
                           json={"amount": yuan(rng.randrange(1, 5000) * 10_000),
                                 "payment_id": f"pay-load-{i}-{rng.random()}"})
                expect(r, 201)
                expect(d.get("/v1/balance", key=body["api_key"]["token"], session=s), 200)

    instances_done = threading.Event()
    clock_lock = threading.Lock()

    def instances(rng):
        """Keeps two or three instances running, replacing one at a time: at
        least 8 in all, and on until each reader has read once meanwhile
        (the reports under ASan can take longer than 8 launches)."""
        held = []
        with requests.Session() as s:
            def running(u, iid):
                r = d.get(f"/v1/instances/{iid}", key=u.key, session=s)
                return expect(r, 200) and r.json()["state"] == "running"
            try:
                launches = 0
                while launches < 8 or (min(reads.values()) < 1 and launches < 300):
                    launches += 1
                    u = rng.choice(payers)
                    with clock_lock:  # provisioning times out on the testing clock: hold it still
                        r = d.post("/v1/instances", key=u.key, session=s,
                                   json={"gpu_type": "MI450", "card_count": rng.choice((1, 2)), "image": IMAGE})
                        if not expect(r, 201):
                            continue
                        iid = r.json()["id"]
                        poll(lambda: running(u, iid), DEADLINE, f"instance {iid} to run")
                    held.append((u, iid))
                    if len(held) > 2:
                        u, iid = held.pop(0)
                        expect(d.delete(f"/v1/instances/{iid}", key=u.key, session=s), 200)
                for u, iid in held:
                    expect(d.delete(f"/v1/instances/{iid}", key=u.key, session=s), 200)
            finally:
                instances_done.set()

    def billing(rng):
        """Moves the clock and bills, until the instances are done."""
        passes = 0
        with requests.Session() as s:
            while not instances_done.is_set() or passes < 8:
                with clock_lock:
                    d.advance_clock(rng.randrange(60, 900))
                expect(d.post("/v1/admin/billing/run", key=d.admin_key, json={}, session=s), 200)
                passes += 1

    def run_writer(fn, seed):
        try:
            fn(random.Random(seed))
        except Exception as e:  # noqa: BLE001 - reported as the test's failure
            fail(f"{fn.__name__}: {e!r}")

    reads = {"report": 0, "sqlite": 0}

    def report_reader():
        try:
            while not writers_done.is_set() or reads["report"] < 2:
                for name in REPORTS:
                    json.loads(run_report(db, name, "json"))
                run_report(db, "usage", "csv")
                reads["report"] += 1
        except Exception as e:  # noqa: BLE001
            fail(f"report reader: {e!r}")

    def sqlite_reader():
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10, isolation_level=None)
        try:
            while not writers_done.is_set() or reads["sqlite"] < 2:
                con.execute("BEGIN")
                # One snapshot: the books balance in it, whatever is committing.
                assert con.execute("SELECT coalesce(sum(balance), 0) FROM ledger_accounts").fetchone() == (0,)
                assert con.execute("SELECT coalesce(sum(amount), 0) FROM ledger_postings").fetchone() == (0,)
                for view in ("report_daily_revenue", "report_usage", "report_utilisation",
                             "report_credit_liability", "report_topups"):
                    con.execute(f"SELECT * FROM {view}").fetchall()
                con.execute("SELECT count(*), sum(amount) FROM topups").fetchone()
                con.execute("SELECT state, count(*) FROM instances GROUP BY state").fetchall()
                con.execute("COMMIT")
                reads["sqlite"] += 1
        except Exception as e:  # noqa: BLE001
            fail(f"sqlite reader: {e!r}")
        finally:
            con.close()

    writers = [threading.Thread(target=run_writer, args=(fn, seed))
               for seed, fn in enumerate((accounts, instances, billing))]
    readers = [threading.Thread(target=report_reader), threading.Thread(target=sqlite_reader)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(timeout=300)
    reads_during = dict(reads)
    writers_done.set()
    for t in readers:
        t.join(timeout=300)
    assert not errors, errors[:10]
    assert reads_during["report"] >= 1 and reads_during["sqlite"] >= 1, reads_during

    # Afterwards the books are whole and every report agrees with them.
    c.wait_idle(timeout=DEADLINE)
    c.billing()
    t = reconcile(db)
    assert t["revenue"] > 0 and t["topups"] > 2000 * MICRO
    assert d.sql("SELECT count(*) FROM topups")[0][0] == 2 + 25


# ================================================================ TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two throwaway CAs; the API's and the agents' certificates are signed
    by the first."""
    directory = tmp_path_factory.mktemp("pki")
    ca1, ca2 = make_ca(directory, "ca1"), make_ca(directory, "ca2")
    return {"dir": directory, "ca": ca1, "other_ca": ca2, "server": make_cert(directory, "server", ca1),
            "agent": make_cert(directory, "agent", ca1)}


def test_api_over_https(pki, tmp_path):
    ns = NotifySocket()
    key, cert = pki["server"]
    d = TlsDaemon(tmp_path / "d", ca=pki["ca"][1], cert=cert, key=key,
                  env={"NOTIFY_SOCKET": ns.addr, "WATCHDOG_USEC": "300000"})
    try:
        assert d.base_url == f"https://127.0.0.1:{d.port}"
        acct = d.signup()  # a password and a key cross only TLS
        r = d.get("/v1/me", key=acct.key)
        assert r.status_code == 200 and r.json()["email"] == acct.email, r.text
        r = d.get("/metrics", key=d.admin_key)
        assert r.status_code == 200, r.text
        parse_prometheus(r.text)
        # Plain HTTP to the HTTPS port gets no answer.
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{d.port}/readyz", timeout=10)
        # A client that trusts another CA refuses the server.
        with pytest.raises(requests.exceptions.SSLError):
            d.get("/readyz", verify=pki["other_ca"][1])
        # The watchdog's own health check reaches the API over HTTPS.
        _, first = ns.next(DEADLINE)
        assert fields(first)["READY"] == "1"
        ns.wait_for(lambda m: m == "WATCHDOG=1", DEADLINE, "a ping")
        ns.wait_for(lambda m: m == "WATCHDOG=1", DEADLINE, "a second ping")
        assert "watchdog: not feeding" not in d.stderr_text()
        assert d.stop() == 0
    finally:
        d.kill()
        ns.close()


def test_check_mode_reads_the_tls_pair(pki, tmp_path):
    """-n finds a certificate and key the server could not start with, for
    gpurentd and the agent alike, and names the file."""
    key, cert = pki["server"]
    other_key, _ = pki["agent"]
    locked = tmp_path / "locked.key"
    p = subprocess.run(["openssl", "pkey", "-in", key, "-aes256", "-passout", "pass:secret", "-out", locked],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [((cert, key), None),
             ((tmp_path / "absent.pem", key), "absent.pem"),
             ((garbage, key), "not a PEM certificate"),
             ((cert, garbage), "not a PEM private key"),
             ((cert, locked), "passphrase"),
             ((cert, other_key), "is not the key of")]
    for (c, k), why in cases:
        for run in (lambda *a: run_gpurentd("-n", *a), lambda *a: run_agent("-n", *a)):
            p = run("-o", f"tls_cert={c}", "-o", f"tls_key={k}")
            if why is None:
                assert p.returncode == 0 and "configuration OK" in p.stdout, p.stderr
            else:
                assert p.returncode != 0 and why in p.stderr and "configuration OK" not in p.stdout, (c, k, p.stderr)


def test_a_start_refused_for_a_taken_port_makes_no_admin(tmp_path):
    """The first admin is made once the daemon holds its address: a start
    that cannot bind prints no key and leaves no admin behind, so the next
    start makes it and prints its key."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    d = Daemon(tmp_path / "d", listen=f"127.0.0.1:{holder.getsockname()[1]}", start=False)
    try:
        d.spawn()
        assert d.wait() != 0
        assert "gpk_" not in d.stdout_text(), d.stdout_text()
        assert d.sql("SELECT count(*) FROM users") == [(0,)]
        d.listen = "127.0.0.1:0"
        d.start()
        assert d.admin_key and d.get("/v1/me", key=d.admin_key).json()["role"] == "admin"
        d.stop()
    finally:
        holder.close()
        d.kill()


def test_agents_over_https_are_verified_against_agent_ca_file(pki, new_daemon, tmp_path):
    key, cert = pki["agent"]
    tls = {"tls_cert": cert, "tls_key": key}
    good = new_daemon(options={**FAST_NODES, "agent_ca_file": pki["ca"][1], "billing_interval_ms": "3600000"})
    bad = new_daemon(options={**FAST_NODES, "agent_ca_file": pki["other_ca"][1]})
    fleets = []
    try:
        fleets.append(Fleet(tmp_path / "good", good.base_url, nodes=1, admin_key=good.admin_key, options=tls,
                            extra=("--name-prefix", "tls-good-")))
        fleets.append(Fleet(tmp_path / "bad", bad.base_url, nodes=1, admin_key=bad.admin_key, options=tls,
                            extra=("--name-prefix", "tls-bad-")))
        [(_, ok)] = fleets[0].nodes.items()
        [(_, ko)] = fleets[1].nodes.items()
        assert ok["url"].startswith("https://127.0.0.1:") and ko["url"].startswith("https://127.0.0.1:"), \
            fleets[0].lines
        # The agent speaks TLS only.
        with pytest.raises(requests.ConnectionError):
            requests.get(ok["url"].replace("https://", "http://") + "/v1/facts", timeout=10)

        n = wait_state(good, ok["id"], "ready", DEADLINE)
        assert n["agent_url"] == ok["url"] and n["cards_total"] == 8 and n["missed_heartbeats"] == 0, n
        # Signed calls that change things work over TLS too: an instance runs.
        u = good.signup()
        r = good.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 1, "image": IMAGE})
        assert r.status_code == 201, r.text
        iid = r.json()["id"]
        poll(lambda: good.get(f"/v1/instances/{iid}", key=u.key).json()["state"] == "running", DEADLINE,
             "the instance on the https node to run")

        # A certificate the configured CA did not sign: offline, and why.
        n = wait_state(bad, ko["id"], "offline", DEADLINE)
        assert "certificate" in n["state_reason"].lower(), n
        m = parse_prometheus(bad.get("/metrics", key=bad.admin_key).text)
        assert sample(m, "gpurent_agent_call_errors_total") >= 2
        assert sample(m, "gpurent_nodes", state="offline", gpu_type="MI450") == 1
        assert get_node(good, ok["id"])["state"] == "ready"
    finally:
        errors = []
        for f in fleets:
            try:
                f.stop()
            except AssertionError as e:
                errors.append(str(e))
        assert not errors, errors
