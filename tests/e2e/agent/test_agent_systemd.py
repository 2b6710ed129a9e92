"""test_agent_systemd.py: gpurent-agent under systemd, with a test socket as
NOTIFY_SOCKET: READY=1 once it serves; on SIGHUP RELOADING=1 (with
MONOTONIC_USEC, as Type=notify-reload expects) then READY=1, with the log
level and request limits read again from the same -c file and a broken file
changing nothing; STOPPING=1 on SIGTERM. With WATCHDOG_USEC (and
WATCHDOG_PID naming the agent) it pings WATCHDOG=1 only after its checks
pass: when its own API cannot be reached it says so and stops pinging, and
pings again once it can."""
import os
import re
import select
import signal
import socket
import time

import requests

from agent_util import Agent, assert_error, poll
from notify_util import NotifySocket, notify_fields

DEADLINE = 60  # bound on waits; generous for sanitizer builds
# Runs the agent as this shell's pid, so WATCHDOG_PID can name it.
AS_WATCHDOG_PID = ["/bin/sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$@"', "sh"]


def logged(a, path):
    return f" {path} " in a.stderr_text()


def request_then_flush(a, path):
    """GET path, then /healthz on the same keep-alive connection: the agent
    finishes (and logs) the first request before it reads the second."""
    with requests.Session() as s:
        assert s.get(a.base_url + path, timeout=10).status_code == 404
        assert s.get(a.base_url + "/healthz", timeout=10).status_code == 200


def hold_connection(a, log_regex):
    """Holds the agent's one connection (max_connections = 1) from another
    loopback address until log_regex is logged: if the watchdog's own
    request held the place when this one came, the agent closes this one,
    so it is opened again."""
    pattern = re.compile(log_regex)
    deadline = time.monotonic() + DEADLINE

    def connect():
        s = socket.socket()
        s.settimeout(10)
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", a.port))
        return s
    held = connect()
    while not pattern.search(a.stderr_text()):
        assert time.monotonic() < deadline, f"no log line {log_regex!r}:\n{a.stderr_text()[-2000:]}"
        readable, _, _ = select.select([held], [], [], 0.05)
        if readable and held.recv(1) == b"":
            held.close()
            held = connect()
    return held


def test_ready_reload_and_stopping(tmp_path):
    ns = NotifySocket()
    conf = tmp_path / "agent.conf"
    conf.write_text("log_level = info\n")
    a = Agent(tmp_path / "a", env={**os.environ, "NOTIFY_SOCKET": ns.addr}, config=conf,
              options={"log_level": None}, start=False)
    big = {"image": "busybox", "env": {"BIG": "x" * 3000}}

    def reload(expect):
        n = len(ns.messages)
        before_us = time.monotonic_ns() // 1000
        a.proc.send_signal(signal.SIGHUP)
        ns.wait_for(lambda m: m.startswith("READY=1"), DEADLINE, "READY=1 after SIGHUP")
        after_us = time.monotonic_ns() // 1000
        got = [m for _, m in ns.messages[n:]]
        assert len(got) == 2 and got[1] == "READY=1", got
        f = notify_fields(got[0])
        assert set(f) == {"RELOADING", "MONOTONIC_USEC"} and f["RELOADING"] == "1", got
        # CLOCK_MONOTONIC, the clock Python's monotonic reads on Linux.
        assert before_us <= int(f["MONOTONIC_USEC"]) <= after_us, (before_us, f, after_us)
        # The reload is logged before READY=1 is sent.
        assert expect in a.stderr_text().split("reload: ")[-1], a.stderr_text()[-2000:]

    try:
        a.start()
        _, first = ns.next(DEADLINE)
        f = notify_fields(first)
        assert f == {"READY": "1", "STATUS": "serving 1 node"}, first
        request_then_flush(a, "/marker-info")
        poll(lambda: logged(a, "/marker-info"), DEADLINE, "the access line of /marker-info (buffered, flushed within a second)")
        assert a.put("/v1/workloads/wl_big", json=big).status_code == 201

        # Quieter: the reload still says what it did, then info lines stop.
        conf.write_text("log_level = warn\n")
        reload("applied log_level=warn max_body_bytes=1048576 max_json_depth=8; other options apply at the next restart")
        request_then_flush(a, "/marker-warn")
        assert not logged(a, "/marker-warn")

        # Louder and a smaller body cap at once; an option that needs a
        # restart is named, and not applied.
        conf.write_text("log_level = debug\nmax_body_bytes = 2048\nworkers = 2\n")
        reload("applied log_level=debug max_body_bytes=2048 max_json_depth=8; "
               "changed but applied only at the next restart: workers")
        request_then_flush(a, "/marker-debug")
        poll(lambda: logged(a, "/marker-debug"), DEADLINE, "the access line of /marker-debug (buffered, flushed within a second)")
        assert not logged(a, "/marker-warn")
        assert_error(a.put("/v1/workloads/wl_big2", json=big), 413, "body_too_large")

        # A broken file changes nothing.
        conf.write_text("log_level = shouting\n")
        reload("configuration has errors")
        refused = [line for line in a.stderr_text().splitlines() if "reload: configuration has errors" in line]
        assert f"{conf}:1: log_level" in refused[-1], refused  # the reason, with file and line
        request_then_flush(a, "/marker-kept")
        poll(lambda: logged(a, "/marker-kept"), DEADLINE, "the access line of /marker-kept (buffered, flushed within a second)")
        assert_error(a.put("/v1/workloads/wl_big2", json=big), 413, "body_too_large")
        assert a.get("/v1/facts").status_code == 200

        # SIGTERM: STOPPING=1 and nothing after it.
        n = len(ns.messages)
        a.stop()
        ns.drain()
        assert [m for _, m in ns.messages[n:]] == ["STOPPING=1"]
        # No watchdog was asked for, so none ran.
        assert not any(m.startswith("WATCHDOG") for _, m in ns.messages)
        assert "watchdog:" not in a.stderr_text()
    finally:
        a.kill()
        ns.close()


def test_watchdog_pings_only_while_its_checks_pass(tmp_path):
    ns = NotifySocket()
    # One connection in all: a test connection held open keeps the
    # watchdog's own request out, as a wedged HTTP server would.
    a = Agent(tmp_path / "a", env={**os.environ, "NOTIFY_SOCKET": ns.addr, "WATCHDOG_USEC": "400000"},
              wrapper=AS_WATCHDOG_PID, options={"max_connections": "1"}, start=False)
    try:
        a.start()
        _, first = ns.next(DEADLINE)
        assert notify_fields(first)["READY"] == "1", first
        a.wait_for_log(r"watchdog: feeding systemd every 200ms after checking the API, the driver workers")
        for _ in range(3):
            ns.wait_for(lambda m: m == "WATCHDOG=1", DEADLINE, "a watchdog ping")
        assert all(m == "WATCHDOG=1" for _, m in ns.messages[1:]), ns.messages

        failing = "watchdog: not feeding systemd's watchdog"
        held = hold_connection(a, re.escape(failing) + r": the API does not answer http://127\.0\.0\.1:\d+/healthz")
        try:
            ns.drain()  # pings from before the check failed
            n = len(ns.messages)
            # A whole failing round later, still no ping.
            failures = a.stderr_text().count(failing)
            deadline = time.monotonic() + DEADLINE
            while a.stderr_text().count(failing) <= failures:
                assert time.monotonic() < deadline, "the watchdog did not check again"
                time.sleep(0.05)
            ns.drain()
            assert not any(m == "WATCHDOG=1" for _, m in ns.messages[n:]), ns.messages[n:]
            n = len(ns.messages)
        finally:
            held.close()
        # Reachable again: pings resume.
        ns.wait_for(lambda m: m == "WATCHDOG=1", DEADLINE, "a ping once the API answers again")
        assert all(m == "WATCHDOG=1" for _, m in ns.messages[n:])

        n = len(ns.messages)
        a.stop()
        ns.drain()
        after = [m for _, m in ns.messages[n:]]
        assert [m for m in after if m != "WATCHDOG=1"] == ["STOPPING=1"], after
    finally:
        a.kill()
        ns.close()


def test_no_watchdog_for_another_pid(tmp_path):
    # WATCHDOG_PID names another process (systemd set it for a parent).
    ns = NotifySocket()
    a = Agent(tmp_path / "a", env={**os.environ, "NOTIFY_SOCKET": ns.addr, "WATCHDOG_USEC": "400000",
                                   "WATCHDOG_PID": "1"}, start=False)
    try:
        a.start()
        _, first = ns.next(DEADLINE)
        assert notify_fields(first)["READY"] == "1"
        for _ in range(3):
            assert a.get("/v1/facts").status_code == 200
        a.stop()
        ns.drain()
        assert [m for _, m in ns.messages] == [first, "STOPPING=1"], ns.messages
        assert "watchdog:" not in a.stderr_text()
    finally:
        a.kill()
        ns.close()
