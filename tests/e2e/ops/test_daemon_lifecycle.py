"""gpurentd as an operator runs it: restarts keep every account and key, old
databases are migrated at start-up and newer ones refused, SIGTERM and SIGINT
drain in-flight requests (a create waiting for its commit among them) and
exit 0, a create waiting for its commit holds no HTTP thread, the
configuration file and flags, each subcommand's --help, and `admin
create-user`."""
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess

import pytest

from harness import (DEFAULT_PASSWORD, REPO, TOKEN, api_key_hash, assert_error, migration_versions,
                     route_table, run_gpurentd, unique_email)
from agent_util import AGENT
from instances_util import cloud, cloud_with  # noqa: F401  (fixture)

BODY_ONE_CARD = {"gpu_type": "MI450", "card_count": 1, "image": "rocm/pytorch:2.3-rocm6.2"}


def schema(db):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return sorted(con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))
    finally:
        con.close()


def applied(db):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return dict(con.execute("SELECT version, name FROM schema_migrations ORDER BY version"))
    finally:
        con.close()


# ---------------------------------------------------------------- restart

def test_restart_keeps_every_account_and_key(new_daemon):
    d = new_daemon()
    admin_key = d.admin_key
    assert admin_key
    alice, bob = d.signup(), d.signup(invite_code="AMD6GW")
    laptop = d.create_key(alice.key, "laptop")
    gone = d.create_key(alice.key, "gone")
    assert d.delete(f"/v1/api-keys/{gone['id']}", key=alice.key).status_code == 200
    operator = d.cli_create_user(unique_email("operator"), admin=True)
    before = d.dump()
    me_before = {k: d.get("/v1/me", key=k).json() for k in (alice.key, bob.key, laptop["token"], operator, admin_key)}

    d.restart()

    after = d.dump()
    for table in ("users", "api_keys", "schema_migrations"):
        assert after[table] == before[table], table
    # The bootstrap admin is made (and its key printed) on an empty database only.
    assert "gpk_" not in d.stdout_text()
    for key, me in me_before.items():
        r = d.get("/v1/me", key=key)
        assert r.status_code == 200 and r.json() == me
    assert_error(d.get("/v1/me", key=gone["token"]), 401, "unauthorized")
    listed = d.get("/v1/api-keys", key=alice.key).json()["data"]
    # All made in the same (testing-clock) second: listed by id.
    assert [k["id"] for k in listed] == sorted([alice.key_id, laptop["id"], gone["id"]])
    assert [k["id"] for k in listed if k["revoked_at"]] == [gone["id"]]
    assert d.login(bob.email, bob.password).status_code == 200
    assert_error(d.post("/v1/signup", json={"email": alice.email, "password": DEFAULT_PASSWORD}), 409,
                 "email_taken", "email")


def test_clean_stop_closes_the_database(new_daemon):
    d = new_daemon()
    d.signup()
    d.stop()
    assert "gpurentd stopped" in d.stderr_text()
    # Every connection was closed: SQLite checkpointed and removed the WAL.
    wal = d.db_path + "-wal"
    assert not os.path.exists(wal) or os.path.getsize(wal) == 0
    assert sqlite3.connect(d.db_path).execute("PRAGMA integrity_check").fetchone() == ("ok",)


# ---------------------------------------------------------------- migrations

def pbkdf2(password, iterations=1000, salt=b"0123456789abcdef"):
    derived = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations, 32)
    return f"pbkdf2-sha256${iterations}${salt.hex()}${derived.hex()}"


def test_migrate_to_each_version_in_turn(tmp_path):
    versions = migration_versions()
    stepwise, direct = tmp_path / "stepwise.db", tmp_path / "direct.db"
    for v in sorted(versions):
        p = run_gpurentd("migrate", "--db", stepwise, "--to", v)
        assert p.returncode == 0, p.stderr
        assert f"schema version {v} " in p.stdout
        assert applied(stepwise) == {n: versions[n] for n in versions if n <= v}
    p = run_gpurentd("migrate", "--db", direct)
    assert p.returncode == 0, p.stderr
    assert f"schema version {max(versions)} " in p.stdout
    assert schema(stepwise) == schema(direct)
    # Migrating an up-to-date database again changes nothing.
    before = schema(direct), applied(direct)
    assert run_gpurentd("migrate", "--db", direct).returncode == 0
    assert (schema(direct), applied(direct)) == before


def test_a_database_made_with_0032_as_first_released_upgrades(tmp_path):
    """0032 gained an index after 3cbba49 released it, and 0040 dropped
    that index: databases made by 3cbba49's 0032 failed their upgrade at
    0040 and were left at 39, which neither binary would run."""
    versions = migration_versions()
    db = tmp_path / "old.db"
    assert run_gpurentd("migrate", "--db", db, "--to", 31).returncode == 0
    con = sqlite3.connect(db)
    with con:  # 0032 as 3cbba49 had it
        con.executescript(
            "CREATE INDEX instances_attention ON instances (created_at, id)"
            " WHERE state IN ('pending', 'provisioning', 'stopping', 'unreachable')"
            " OR (state = 'stopped' AND desired = 'terminated')"
            " OR (state = 'running' AND (desired <> 'running' OR app_id IS NOT NULL"
            " OR max_runtime_minutes IS NOT NULL));"
            "CREATE INDEX nodes_not_answering ON nodes (id) WHERE health <> 'up' OR unreachable_since IS NOT NULL;"
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (32, '0032_reconciler_attention', 0);")
    con.close()
    p = run_gpurentd("migrate", "--db", db)
    assert p.returncode == 0, p.stderr
    assert max(applied(db)) == max(versions)


def test_an_upgrade_that_fails_part_way_applies_nothing(tmp_path):
    """All migrations due go in one transaction: one that fails leaves the
    database at the version it had, which the release before still runs,
    and says so; once the cause is gone the upgrade goes through."""
    db = tmp_path / "stuck.db"
    assert run_gpurentd("migrate", "--db", db, "--to", 40).returncode == 0
    con = sqlite3.connect(db)
    with con:  # what 0043 adds, there already: 0043 fails, after 0041 and 0042 applied
        con.execute("ALTER TABLE idempotency_keys ADD COLUMN location TEXT NOT NULL DEFAULT ''")
    con.close()
    before = schema(db)
    p = run_gpurentd("migrate", "--db", db)
    assert p.returncode != 0
    assert "0043" in p.stderr and "nothing was applied: the database is still at version 40" in p.stderr, p.stderr
    assert max(applied(db)) == 40 and schema(db) == before
    con = sqlite3.connect(db)
    with con:
        con.execute("ALTER TABLE idempotency_keys DROP COLUMN location")
    con.close()
    assert run_gpurentd("migrate", "--db", db).returncode == 0
    assert max(applied(db)) == max(migration_versions())


def test_migration_11_backfills_capacity_history(tmp_path):
    """0011 gives each node in service (not removed, up or offline) one open
    interval from its registration with its card rows; other nodes none."""
    db = tmp_path / "capacity.db"
    assert run_gpurentd("migrate", "--db", db, "--to", 10).returncode == 0
    # (name, gpu model, health, card rows, created_at, removed_at)
    nodes = [("up", "MI450", "up", 8, 1000, None), ("offline", "MI300X", "offline", 4, 2000, None),
             ("rejected", "MI450", "rejected", 8, 3000, None), ("removed", "MI450", "up", 8, 4000, 5000),
             ("pending", "MI450", "unknown", 0, 6000, None), ("cardless", "MI450", "up", 0, 7000, None)]
    con = sqlite3.connect(db)
    with con:
        for name, model, health, cards, created, removed in nodes:
            node_id = f"node_{name:a<20}"
            con.execute("INSERT INTO nodes (id, name, agent_url, secret, gpu_model, card_count, fabric, region,"
                        " health, created_at, updated_at, removed_at) VALUES (?, ?, 'http://127.0.0.1:1', ?, ?, 8,"
                        " 'fabric-a', 'local', ?, ?, ?, ?)", (node_id, name, "0" * 64, model, health, created,
                                                             created, removed))
            con.executemany("INSERT INTO node_cards (node_id, idx, model, memory_gb, healthy) VALUES (?, ?, ?, 192, 1)",
                            [(node_id, i, model) for i in range(cards)])
    con.close()
    p = run_gpurentd("migrate", "--db", db)
    assert p.returncode == 0, p.stderr
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        got = con.execute("SELECT node_id, gpu_model, cards, from_at, to_at FROM node_capacity ORDER BY node_id")
        assert got.fetchall() == [(f"node_{'offline':a<20}", "MI300X", 4, 2000, None),
                                  (f"node_{'up':a<20}", "MI450", 8, 1000, None)]
        cols = [r[1] for r in con.execute("PRAGMA table_info(report_utilisation)")]
        assert cols == ["day", "gpu_type", "card_seconds_sold", "card_seconds_available", "utilisation",
                        "card_hours_sold", "card_hours_available"]
    finally:
        con.close()


def test_old_database_is_migrated_at_start(new_daemon):
    versions = migration_versions()
    d = new_daemon(start=False)
    p = run_gpurentd("migrate", "--db", d.db_path, "--to", 1)
    assert p.returncode == 0, p.stderr
    assert applied(d.db_path) == {1: versions[1]}

    # Rows as release 1 wrote them: an admin and a user with a password, a
    # working key and a revoked one.
    key_admin = "gpk_" + "a" * 20 + "_" + "1" * 64
    key_user = "gpk_" + "b" * 20 + "_" + "2" * 64
    key_revoked = "gpk_" + "c" * 20 + "_" + "3" * 64
    con = sqlite3.connect(d.db_path)
    with con:
        con.execute("INSERT INTO users (id, email, password_hash, role, status, invite_code, created_at) VALUES "
                    "('usr_aaaaaaaaaaaaaaaaaaaa', 'old-admin@example.test', '', 'admin', 'active', '', 1700000000),"
                    "('usr_bbbbbbbbbbbbbbbbbbbb', 'old-user@example.test', ?, 'user', 'active', 'AMD6GW', 1700000001)",
                    (pbkdf2("old password 1"),))
        con.executemany("INSERT INTO api_keys (id, user_id, name, secret_hash, created_at, revoked_at) "
                        "VALUES (?, ?, ?, ?, ?, ?)", [
                            ("key_" + "a" * 20, "usr_aaaaaaaaaaaaaaaaaaaa", "ops", api_key_hash(key_admin),
                             1700000000, None),
                            ("key_" + "b" * 20, "usr_bbbbbbbbbbbbbbbbbbbb", "laptop", api_key_hash(key_user),
                             1700000001, None),
                            ("key_" + "c" * 20, "usr_bbbbbbbbbbbbbbbbbbbb", "old", api_key_hash(key_revoked),
                             1700000001, 1700000002)])
    con.close()
    # Compared by release 1's columns: later migrations may add others.
    release1 = {"users": "id, email, password_hash, role, status, invite_code, created_at",
                "api_keys": "id, user_id, name, secret_hash, created_at, revoked_at"}
    old_rows = {t: sorted(sqlite3.connect(d.db_path).execute(f"SELECT {c} FROM {t}").fetchall())
                for t, c in release1.items()}

    d.start()

    assert applied(d.db_path) == versions
    for v, name in versions.items():
        if v > 1:
            assert f"applied migration {name}" in d.stderr_text()
    assert d.get("/readyz").json()["schema_version"] == max(versions)
    now_rows = {t: sorted(d.sql(f"SELECT {c} FROM {t}")) for t, c in release1.items()}
    assert now_rows == old_rows
    # An admin existed, so no bootstrap admin was made.
    assert d.admin_key is None and "gpk_" not in d.stdout_text()
    me = d.get("/v1/me", key=key_user)
    assert me.status_code == 200 and me.json()["email"] == "old-user@example.test"
    assert me.json()["invite_code"] == "AMD6GW"
    assert d.get("/v1/me", key=key_admin).json()["role"] == "admin"
    assert_error(d.get("/v1/me", key=key_revoked), 401, "unauthorized")
    assert d.login("old-user@example.test", "old password 1").status_code == 200


def test_newer_database_is_refused(tmp_path):
    latest = max(migration_versions())
    db = tmp_path / "future.db"
    assert run_gpurentd("migrate", "--db", db).returncode == 0
    con = sqlite3.connect(db)
    with con:
        con.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)",
                    (latest + 1, f"{latest + 1:04d}_from_the_future"))
    con.close()
    before = schema(db), applied(db)

    commands = [
        ["serve", "--listen", "127.0.0.1:0", "--db", db, "-o", "password_iterations=1000"],
        ["migrate", "--db", db],
        ["admin", "create-user", "--db", db, "--email", unique_email()],
    ]
    for args in commands:
        p = run_gpurentd(*args, timeout=60)
        assert p.returncode != 0, (args, p.stdout, p.stderr)
        assert f"schema version {latest + 1}" in p.stderr and "newer" in p.stderr, p.stderr
        assert "listening" not in p.stderr
        assert "gpk_" not in p.stdout
    assert (schema(db), applied(db)) == before
    assert sqlite3.connect(db).execute("SELECT count(*) FROM users").fetchone() == (0,)


# ---------------------------------------------------------------- signals

def read_interim(sock):
    data = b""
    while not data.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data


def post_headers(d, path, key, body, method="POST"):
    """Sends a POST's (or another method's) headers with Expect:
    100-continue and waits for the 100: the daemon has them, and the request
    is in flight. Returns the socket and the body to send."""
    body = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    sock.sendall((f"{method} {path} HTTP/1.1\r\nHost: gpurent\r\nAuthorization: Bearer {key}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                  f"Expect: 100-continue\r\n\r\n").encode())
    assert read_interim(sock).startswith(b"HTTP/1.1 100 ")
    return sock, body


def read_reply(sock):
    """The status and JSON of the reply on sock, which it closes."""
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    reply = json.loads(resp.read())
    sock.close()
    return resp.status, reply


def post_across_signal(d, sig, path, key, body):
    """Signals the daemon while a POST is in flight, then sends its body.
    Returns the reply's status and JSON, after asserting a clean exit."""
    sock, body = post_headers(d, path, key, body)
    d.terminate(sig)
    d.wait_for_log(rf"received {sig.name}: draining")
    assert d.running, "exited with a request in flight"
    sock.sendall(body)
    reply = read_reply(sock)
    assert d.wait(60) == 0
    log = d.stderr_text()
    assert "gpurentd stopped" in log and "still in flight" not in log
    return reply


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_finishes_the_request_in_flight(new_daemon, sig):
    d = new_daemon(options={"drain_timeout_s": 60})
    u = d.signup()
    status, created = post_across_signal(d, sig, "/v1/api-keys", u.key, {"name": "in flight"})
    assert status == 201, created
    assert d.sql("SELECT name FROM api_keys WHERE id = ?", (created["id"],)) == [("in flight",)]


def test_a_drain_takes_no_new_connection(new_daemon):
    """While the drain waits for the request in flight, a new connection is
    closed at once with no answer (a balancer sends it elsewhere), and the
    request in flight is still answered."""
    d = new_daemon(options={"drain_timeout_s": 60})
    u = d.signup()
    sock, body = post_headers(d, "/v1/api-keys", u.key, {"name": "in flight"})
    d.terminate(signal.SIGTERM)
    # At least the request held open; the sign-up's last request may still
    # be finishing as the signal lands.
    d.wait_for_log(r"http: taking no new connections; [1-9]\d* requests in flight")
    late = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    late.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        got = late.recv(4096)
    except ConnectionResetError:
        got = b""
    late.close()
    assert got == b"", got
    sock.sendall(body)
    status, created = read_reply(sock)
    assert status == 201, created
    assert d.wait(60) == 0
    assert "still in flight" not in d.stderr_text()


def test_signal_answers_a_create_waiting_for_its_commit(cloud):
    """A create waits for its commit with its connection suspended (the
    committer thread leads the batch): the drain answers it before the
    server stops, and the instance it reports stands."""
    cloud.fleet(1, prefix="drain-")
    u = cloud.user()
    status, created = post_across_signal(cloud.d, signal.SIGTERM, "/v1/instances", u.key, BODY_ONE_CARD)
    assert status == 201, created
    assert cloud.d.sql("SELECT user_id, card_count FROM instances WHERE id = ?", (created["id"],)) == \
        [(u.id, 1)]


cloud_one_thread = cloud_with(threads="1")


def answered_while_locked(c, method, path, key, body):
    """Sends a write while another process holds the database's write lock,
    checks that a read on another connection is answered meanwhile (the one
    HTTP thread is free), then lets the write commit. Returns its reply."""
    lock = sqlite3.connect(c.d.db_path, isolation_level=None, timeout=30)
    lock.execute("BEGIN IMMEDIATE")
    try:
        sock, body = post_headers(c.d, path, key, body, method)
        sock.sendall(body)
        r = c.d.get("/v1/gpu-types", timeout=10)
        assert r.status_code == 200, r.text
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    return read_reply(sock)


def test_a_create_waiting_for_its_commit_holds_no_thread(cloud_one_thread):
    """With one HTTP thread, a create whose commit cannot happen yet (another
    process holds the database's write lock) leaves that thread free: a read
    on another connection is answered meanwhile, and the create is answered
    once the lock goes."""
    c = cloud_one_thread
    c.fleet(1, prefix="wait-")
    u = c.user()
    status, created = answered_while_locked(c, "POST", "/v1/instances", u.key, BODY_ONE_CARD)
    assert status == 201, created
    assert c.d.sql("SELECT user_id FROM instances WHERE id = ?", (created["id"],)) == [(u.id,)]


def test_instance_changes_waiting_for_their_commit_hold_no_thread(cloud_one_thread):
    """Stop, PATCH, start and terminate wait for their commit as a create
    does: each is answered with the instance as its transaction left it."""
    c = cloud_one_thread
    c.fleet(1, prefix="change-")
    u = c.user()
    inst = c.create(u, card_count=1)["id"]
    c.wait_state(u, inst, "running")
    path = f"/v1/instances/{inst}"
    status, reply = answered_while_locked(c, "POST", f"{path}/stop", u.key, {})
    assert status == 200 and reply["state"] in ("stopping", "stopped"), reply
    c.wait_state(u, inst, "stopped")
    status, reply = answered_while_locked(c, "PATCH", path, u.key, {"working_dir": "/shared/run"})
    assert status == 200 and reply["working_dir"] == "/shared/run", reply
    status, reply = answered_while_locked(c, "POST", f"{path}/start", u.key, {})
    assert status == 200 and reply["state"] not in ("stopped", "terminated"), reply
    status, reply = answered_while_locked(c, "DELETE", path, u.key, {})
    assert status == 200 and reply["desired_state"] == "terminated", reply
    # A refusal comes the same way: the instance is already on its way out.
    status, reply = answered_while_locked(c, "PATCH", path, u.key, {"working_dir": "/tmp"})
    assert status == 409, reply
    assert c.d.sql("SELECT working_dir, desired FROM instances WHERE id = ?", (inst,)) == \
        [("/shared/run", "terminated")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_on_an_idle_daemon_exits_0(new_daemon, sig):
    d = new_daemon()
    # A keep-alive connection left open must not hold up the exit.
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read()
    assert d.stop(sig, timeout=30) == 0
    conn.close()
    log = d.stderr_text()
    assert log.index(f"received {sig.name}") < log.index("gpurentd stopped")


def test_sighup_reloads_the_configuration(new_daemon):
    d = new_daemon(config="cors_origins = http://one.test\n")

    def allowed(origin):
        return d.get("/healthz", headers={"Origin": origin}).headers.get("Access-Control-Allow-Origin")

    assert allowed("http://one.test") == "http://one.test" and allowed("http://two.test") is None
    with open(d.config_path, "w") as f:
        f.write("cors_origins = http://two.test\n")
    d.terminate(signal.SIGHUP)
    d.wait_for_log(r"reload: applied")
    assert allowed("http://two.test") == "http://two.test" and allowed("http://one.test") is None
    # A broken file is reported and the running configuration kept.
    with open(d.config_path, "w") as f:
        f.write("cors_origins = http://three.test\nthreads = 0\n")
    d.terminate(signal.SIGHUP)
    d.wait_for_log(r"keeping the running one")
    assert f"{d.config_path}:2:" in d.stderr_text()
    assert allowed("http://two.test") == "http://two.test" and allowed("http://three.test") is None


def test_sighup_keeps_the_running_configuration_when_a_key_is_set_twice(new_daemon):
    d = new_daemon(config="cors_origins = http://one.test\n")

    def allowed(origin):
        return d.get("/healthz", headers={"Origin": origin}).headers.get("Access-Control-Allow-Origin")

    with open(d.config_path, "w") as f:
        f.write("cors_origins = http://two.test\n# appended later\ncors_origins = http://three.test\n")
    d.terminate(signal.SIGHUP)
    m = d.wait_for_log(r"reload: configuration has errors \((.*)\); keeping the running one")
    assert m.group(1) == f"{d.config_path}:3: 'cors_origins' is set twice (first on line 1); keep one of the two lines", \
        m.group(0)
    assert allowed("http://one.test") == "http://one.test"
    assert allowed("http://two.test") is None and allowed("http://three.test") is None


# ---------------------------------------------------------------- configuration

GOOD_CONFIG = """# a comment
; another comment

listen = 127.0.0.1:0
database = {db}
log_level = debug
threads = 2
max_body_bytes = 4096
cors_origins = http://console.test http://other.test
login_max_failures = 7
"""


def test_check_mode_prints_configuration_ok(tmp_path):
    conf = tmp_path / "gpurentd.conf"
    db = tmp_path / "never.db"
    conf.write_text(GOOD_CONFIG.format(db=db))
    for args in (["-n", "-c", conf], ["serve", "-n", "-c", conf], ["--check", "--config", conf], ["-n"]):
        p = run_gpurentd(*args)
        assert p.returncode == 0, (args, p.stderr)
        assert p.stdout == "configuration OK\n", args
    assert not db.exists(), "-n must not open the database"


def test_shipped_configuration_is_valid():
    p = run_gpurentd("-n", "-c", os.path.join(REPO, "conf", "gpurentd.conf"))
    assert p.returncode == 0 and p.stdout == "configuration OK\n", p.stderr


@pytest.mark.parametrize("line, why", [
    ("no_such_option = 1", "no_such_option"),
    ("threads = 0", "threads"),
    ("threads = 100000", "threads"),
    ("threads = four", "threads"),
    ("threads = 4x", "threads"),
    ("max_body_bytes = 1e6", "max_body_bytes"),
    ("listen = localhost", "listen"),
    ("listen = 127.0.0.1:65536", "listen"),
    ("log_level = loud", "log_level"),
    ("database =", "database"),
    ("bootstrap_admin_email = admin", "bootstrap_admin_email"),
    ("just some words", ""),
    ("[server]", "section"),
    # Written twice (the template has log_level on line 2): the last one won
    # without a word, and -n called the file OK.
    ("log_level = debug", "'log_level' is set twice (first on line 2)"),
])
def test_bad_configuration_names_file_and_line(tmp_path, line, why):
    conf = tmp_path / "bad.conf"
    conf.write_text(f"# line 1\nlog_level = info\n\n{line}\nthreads = 2\n")
    for args in (["-n", "-c", conf],
                 ["serve", "-c", conf, "--listen", "127.0.0.1:0", "--db", tmp_path / "x.db"]):
        p = run_gpurentd(*args, timeout=60)
        assert p.returncode != 0, (args, p.stdout)
        assert f"{conf}:4:" in p.stderr, p.stderr
        assert why in p.stderr.split(f"{conf}:4:", 1)[1], p.stderr
        assert "configuration OK" not in p.stdout and "listening" not in p.stderr
    assert not (tmp_path / "x.db").exists()


def test_first_bad_line_is_the_one_reported(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text("threads = 2\nfirst_unknown = 1\nthreads = 0\nsecond_unknown = 2\n")
    p = run_gpurentd("-n", "-c", conf)
    assert p.returncode != 0
    assert f"{conf}:2:" in p.stderr and "first_unknown" in p.stderr, p.stderr
    assert "second_unknown" not in p.stderr and "threads" not in p.stderr, p.stderr


def test_missing_configuration_file(tmp_path):
    p = run_gpurentd("-n", "-c", tmp_path / "absent.conf")
    assert p.returncode != 0 and str(tmp_path / "absent.conf") in p.stderr


@pytest.mark.parametrize("args, why", [
    (["-o", "threads=0"], "threads"),
    (["-o", "no_such_option=1"], "no_such_option"),
    (["-o", "threads"], "KEY=VALUE"),
    (["--listen", "nowhere"], "listen"),
    (["--log-level", "loud"], "log_level"),
    (["--no-such-flag"], "no-such-flag"),
    (["stray-argument"], "stray-argument"),
])
def test_bad_flags_fail(args, why):
    p = run_gpurentd("serve", "-n", *args)
    assert p.returncode != 0 and why in p.stderr, p.stderr
    assert "configuration OK" not in p.stdout


def test_flags_override_the_file(new_daemon, tmp_path):
    # The file names a port someone else holds and another database: if the
    # flags did not win, the daemon could not start or would write there.
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    file_db = tmp_path / "from-file.db"
    d = new_daemon(directory=tmp_path / "d", config=(
        f"listen = 127.0.0.1:{taken}\n"
        f"database = {file_db}\n"
        "cors_origins = http://file.test\n"
        "login_max_failures = 1\n"
        "login_lockout_s = 77\n"
        "password_iterations = 5000\n"), options={"cors_origins": "http://flag.test"})
    try:
        assert d.port != taken
        assert os.path.exists(d.db_path) and not file_db.exists()
        h = d.get("/healthz", headers={"Origin": "http://flag.test"}).headers
        assert h.get("Access-Control-Allow-Origin") == "http://flag.test"
        assert "Access-Control-Allow-Origin" not in d.get("/healthz", headers={"Origin": "http://file.test"}).headers
        # What the flags do not override comes from the file: one failure
        # locks for 77 s; password_iterations=1000 (a flag) beats the file's 5000.
        u = d.signup()
        assert d.sql("SELECT password_hash FROM users WHERE id = ?", (u.id,))[0][0].startswith("pbkdf2-sha256$1000$")
        assert_error(d.login(u.email, "wrong password"), 401, "invalid_credentials")
        r = d.login(u.email, u.password)
        assert_error(r, 429, "too_many_requests")
        assert r.headers["Retry-After"] == "77"
    finally:
        holder.close()


# ---------------------------------------------------------------- command line

def config_option_names():
    with open(os.path.join(REPO, "src", "gpurentd", "cmd", "config.c")) as f:
        names = re.findall(r"^\s*OPT_\w+\((\w+),", f.read(), re.M)
    assert names
    return names


@pytest.mark.parametrize("args, mentions", [
    (["--help"], ["-c", "--listen", "--db", "--clock-file", "-n"]),
    (["-h"], ["--listen"]),
    (["serve", "--help"], ["-c", "--listen", "--db", "-o"]),
    (["migrate", "--help"], ["migrate", "--db", "--to"]),
    (["admin", "--help"], ["create-user"]),
    (["admin", "create-user", "--help"], ["create-user", "--email", "--admin", "--db"]),
    (["help"], ["serve", "migrate", "admin"]),
])
def test_help(args, mentions):
    p = run_gpurentd(*args)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: gpurentd"), p.stdout
    for word in mentions:
        assert word in p.stdout, (word, p.stdout)


@pytest.mark.parametrize("args, named, hint", [
    (["--no-such-option"], "--no-such-option", "Try 'gpurentd serve --help'."),
    (["serve", "--listne", "127.0.0.1:1"], "--listne", "Try 'gpurentd serve --help'."),
    (["report", "usage", "--frm", "2027-01-01"], "--frm", "Try 'gpurentd report --help'."),
    (["serve", "stray"], "stray", "Try 'gpurentd serve --help'."),
])
def test_a_misspelt_option_is_named_with_a_pointer_to_help(args, named, hint):
    """The whole usage text after an unknown option buried the one line that
    said what was wrong: now the option is named, then where help is."""
    p = run_gpurentd(*args)
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert "usage:" not in p.stderr and named in p.stderr.splitlines()[0], p.stderr
    assert p.stderr.rstrip("\n").lower().endswith(hint.lower()), p.stderr


def test_the_agent_names_a_misspelt_option_with_a_pointer_to_help():
    for args, hint in ((["--no-such-option"], "Try 'gpurent-agent serve --help'."),
                       (["sim-fleet", "--nodez", "2"], "Try 'gpurent-agent sim-fleet --help'.")):
        p = subprocess.run([AGENT, *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stdout == "", (args, p.stdout, p.stderr)
        assert p.stderr.splitlines() == [p.stderr.splitlines()[0], hint] and "unrecognized option" in p.stderr, p.stderr


def test_help_config_lists_every_option():
    p = run_gpurentd("--help-config")
    assert p.returncode == 0, p.stderr
    listed = re.findall(r"^\s+(\w+)\s", p.stdout, re.M)
    assert listed == config_option_names()


@pytest.mark.parametrize("args", [["frobnicate"], ["admin"], ["admin", "delete-everything"],
                                  ["migrate", "--to", "0"], ["migrate", "--to", "x"], ["migrate", "extra"]])
def test_bad_subcommands_fail_with_usage(args, tmp_path):
    p = run_gpurentd(*args, "--db", tmp_path / "x.db") if args[0] == "migrate" else run_gpurentd(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr
    assert not (tmp_path / "x.db").exists()


def test_admin_create_user_prints_a_working_key(new_daemon):
    d = new_daemon()
    email = unique_email("Ops").replace("ops", "Ops")
    p = run_gpurentd("admin", "create-user", "--db", d.db_path, "--email", email)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    token = lines[-1]
    assert TOKEN.fullmatch(token), p.stdout
    assert token not in "\n".join(lines[:-1])
    # The key works on the daemon already running on that database.
    me = d.get("/v1/me", key=token)
    assert me.status_code == 200, me.text
    assert me.json()["email"] == email.lower() and me.json()["role"] == "user"
    for method, pattern, auth in route_table():
        if auth == "AUTH_ADMIN" and method == "GET" and "{" not in pattern:
            assert_error(d.get(pattern, key=token), 403, "forbidden")

    admin = d.cli_create_user(unique_email("root"), admin=True)
    assert d.get("/v1/me", key=admin).json()["role"] == "admin"
    for method, pattern, auth in route_table():
        if auth == "AUTH_ADMIN" and method == "GET" and "{" not in pattern:
            r = d.get(pattern, key=admin)
            assert r.status_code not in (401, 403), (pattern, r.text)


def test_admin_create_user_refuses_a_taken_email(new_daemon):
    d = new_daemon()
    u = d.signup()
    before = d.dump()
    p = run_gpurentd("admin", "create-user", "--db", d.db_path, "--email", u.email.upper())
    assert p.returncode == 1 and "already exists" in p.stderr
    assert "gpk_" not in p.stdout
    p = run_gpurentd("admin", "create-user", "--db", d.db_path, "--email", "not-an-email")
    assert p.returncode == 2 and "email" in p.stderr
    p = run_gpurentd("admin", "create-user", "--db", d.db_path)
    assert p.returncode == 2 and "--email" in p.stderr
    # A stray argument is named, not taken for a missing --email.
    p = run_gpurentd("admin", "create-user", "--db", d.db_path, "--email", "new@example.test", "extra")
    assert p.returncode == 2 and "unexpected argument 'extra'" in p.stderr, p.stderr
    assert d.dump() == before


def test_ledger_verify_names_a_schema_it_does_not_read(tmp_path):
    """A backup from before an upgrade: the checks read this binary's
    schema, so verify says which schema the file has and what to do,
    rather than fail on a missing column."""
    db = str(tmp_path / "old.db")
    assert run_gpurentd("migrate", "--db", db, "--to", "20").returncode == 0
    p = run_gpurentd("ledger", "verify", "--db", db)
    assert p.returncode == 1 and "is at schema 20" in p.stderr and "migrate a copy first" in p.stderr, p.stderr
    assert run_gpurentd("migrate", "--db", db).returncode == 0
    p = run_gpurentd("ledger", "verify", "--db", db)
    assert p.returncode == 0 and "ledger OK" in p.stdout, (p.stdout, p.stderr)


def test_admin_create_user_with_password_and_no_database_yet(tmp_path, new_daemon):
    conf = tmp_path / "fast.conf"
    conf.write_text("password_iterations = 1000\n")
    d = new_daemon(start=False)
    email = unique_email("first")
    p = run_gpurentd("admin", "create-user", "-c", conf, "--db", d.db_path, "--email", email, "--admin",
                     "--password-stdin", input="an operator password\n")
    assert p.returncode == 0, p.stderr
    token = p.stdout.splitlines()[-1]
    assert applied(d.db_path) == migration_versions()
    d.start()
    # An admin exists, so there is no bootstrap admin; the new one logs in.
    assert d.admin_key is None
    assert d.get("/v1/me", key=token).json()["role"] == "admin"
    r = d.login(email, "an operator password")
    assert r.status_code == 200 and r.json()["user"]["role"] == "admin"
    p = run_gpurentd("admin", "create-user", "-c", conf, "--db", d.db_path, "--email", unique_email(),
                     "--password-stdin", input="short\n")
    assert p.returncode == 2 and "password" in p.stderr


def test_version():
    p = run_gpurentd("--version")
    assert p.returncode == 0 and re.fullmatch(r"gpurentd \d+\.\d+\.\d+\n", p.stdout), p.stdout


def test_drain_gives_up_on_a_stuck_request(new_daemon):
    d = new_daemon(options={"drain_timeout_s": 1})
    sock = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    sock.sendall(b"POST /v1/signup HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\nExpect: 100-continue\r\n\r\n")
    assert read_interim(sock).startswith(b"HTTP/1.1 100 ")
    # The body never comes: the drain waits drain_timeout_s, then exits 0.
    assert d.stop(timeout=30) == 0
    assert "1 requests still in flight after 1000 ms" in d.stderr_text()
    sock.close()
