"""test_ops_logs.py: what gpurentd writes to standard error, as operators
and journald read it (docs/OPERATIONS.md, Logs and TLS).

* Loud warnings where credentials would cross a network in clear text: at
  start-up for plain HTTP on a non-loopback address without trusted_proxies,
  and when an admin registers a node at a plain http:// URL off this machine.
* Every line starts with a syslog priority prefix (<N>), and a value that
  reaches a log line with a newline in it does not split the line.
"""
import re
import signal
import socket

import pytest

from harness import Daemon, stop_all
from ports import exchange
from inventory_util import register
from ops_util import TlsDaemon, make_ca, make_cert

CLEAR_TEXT = "would cross the network in clear text"
LINE = re.compile(r"<([0-7])>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (error|warn|info|debug): ")
PRIORITY = {"error": "3", "warn": "4", "info": "6", "debug": "7"}


def _stopped_log(d):
    """The whole stderr of this start, once the daemon has stopped: a line
    that is not there then was never written."""
    stop_all([d])
    return d.stderr_text()


# ================================================================ clear text


def test_plain_http_on_a_network_address_warns_at_start_up(tmp_path):
    d = Daemon(tmp_path / "all", listen="0.0.0.0:0")
    try:
        m = d.wait_for_log(r"^<4>\S+ warn: serving plain HTTP on 0\.0\.0\.0:(\d+), which is not a loopback "
                           r"address, and no trusted_proxies are set: passwords and API keys .*" + CLEAR_TEXT +
                           r"; set tls_cert and tls_key, or listen on 127\.0\.0\.1 behind a TLS reverse proxy")
        assert int(m.group(1)) == d.port
        assert d.get("/readyz").status_code == 200  # a warning, not a refusal
    finally:
        stop_all([d])


@pytest.mark.parametrize("listen, options", [
    ("127.0.0.1:0", {}),                                   # loopback: only this machine
    ("0.0.0.0:0", {"trusted_proxies": "127.0.0.1"}),       # the operator named a TLS proxy in front
])
def test_no_clear_text_warning_on_loopback_or_behind_a_proxy(tmp_path, listen, options):
    d = Daemon(tmp_path / "d", listen=listen, options=options)
    assert CLEAR_TEXT not in _stopped_log(d)


def test_no_clear_text_warning_over_tls(tmp_path):
    ca = make_ca(tmp_path / "pki", "ca")
    key, cert = make_cert(tmp_path / "pki", "server", ca)
    d = TlsDaemon(tmp_path / "d", ca=ca[1], cert=cert, key=key, listen="0.0.0.0:0")
    assert CLEAR_TEXT not in _stopped_log(d)


def test_registering_a_node_at_plain_http_off_this_machine_warns(new_daemon):
    d = new_daemon(options={"heartbeat_interval_ms": "600000"})  # nothing polls the made-up addresses
    quiet = [("quiet-v4", "http://127.0.0.1:9/"), ("quiet-v4b", "http://127.8.9.10:9"),
             ("quiet-v6", "http://[::1]:9/x"), ("quiet-name", "http://localhost:9"),
             ("quiet-tls", "https://10.0.0.7:8443/")]
    for name, url in quiet:
        register(d, name, url)
    loud = [("loud-v4", "http://10.0.0.7:9000/"), ("loud-v6", "http://[fd00::7]:9000"),
            ("loud-name", "http://gpu-node-01.example:9000"), ("loud-userinfo", "http://127.0.0.1@10.0.0.8/")]
    ids = {}
    for name, url in loud:
        n, _ = register(d, name, url)  # still registered: a warning, not a refusal
        ids[name] = n["id"]
    log = _stopped_log(d)
    for name, url in loud:
        want = (f"<4>", f" warn: nodes: {ids[name]} ({name}) registered at plain {url}, not on loopback: "
                f"workload specs and their environments {CLEAR_TEXT}; serve the agent over TLS")
        assert any(line.startswith(want[0]) and want[1] in line for line in log.splitlines()), (name, log[-3000:])
    for name, _ in quiet:
        assert f"({name}) registered at plain" not in log, name
    assert log.count(CLEAR_TEXT) == len(loud)


# ================================================================ line format


def _raw_get(d, path):
    """GET path written as is on the socket (no client library would send
    these); returns the status."""
    data = exchange(d.port, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return int(data.split(b" ", 2)[1])


def test_every_line_has_a_priority_prefix_and_values_cannot_split_lines(new_daemon, tmp_path):
    d = new_daemon(config="log_level = debug\n")
    # The request path is the value from outside that reaches a log line (the
    # access log) unchecked: libmicrohttpd decodes %0a into a newline. Names,
    # emails and agent URLs with control characters are refused before any
    # log line names them.
    forged = "<3>2027-01-01T00:00:00.000Z error: forged"
    paths = {
        "lf": "/v1/ops-log-lf%0a" + forged.replace(" ", "%20"),
        "crlf": "/v1/ops-log-crlf%0d%0a" + forged.replace(" ", "%20"),
        "esc": "/v1/ops-log-esc%1b[2J%1b[31mred%7f%08",
    }
    for path in paths.values():
        assert _raw_get(d, path) == 404
    # A raw newline inside the request line is malformed: libmicrohttpd's
    # own message about it goes through the logger too.
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(b"GET /v1/ops-log-raw\n" + forged.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(4096)
    # Warnings and errors from the daemon itself: a node at a plain URL off
    # this machine, and a reload.
    register(d, "ops-log-node", "http://10.0.0.9:9/")
    with open(d.config_path, "w") as f:
        f.write("log_level = debug\nlogin_max_failures = 3\n")
    d.terminate(signal.SIGHUP)
    d.wait_for_log(r"reload: applied log_level=debug ")
    log = _stopped_log(d)

    assert log.endswith("\n"), log[-200:]
    lines = log[:-1].split("\n")
    for line in lines:
        m = LINE.match(line)
        assert m, f"a stderr line without its priority prefix: {line!r}"
        assert m.group(1) == PRIORITY[m.group(2)], line
        assert "\r" not in line and "\x1b" not in line and "\x7f" not in line, repr(line)
        assert "\x00" not in line, repr(line)
    assert {m.group(2) for m in map(LINE.match, lines)} >= {"info", "warn"}
    # No line was forged, and each request is one line, its path intact
    # up to the neutralised characters.
    assert not [line for line in lines if "forged" in line and not LINE.match(line).group(0).startswith("<6>")
                and "libmicrohttpd" not in line]
    for name, path in paths.items():
        hits = [line for line in lines if f"/v1/ops-log-{name}" in line]
        assert len(hits) == 1, (name, hits)
        assert " 404 " in hits[0] and re.search(r" req_[0-9a-z]{20} 127\.0\.0\.1$", hits[0]), hits[0]
    lf = next(line for line in lines if "/v1/ops-log-lf" in line)
    assert "/v1/ops-log-lf " + forged + " 404 " in lf, lf
    crlf = next(line for line in lines if "/v1/ops-log-crlf" in line)
    assert "/v1/ops-log-crlf  " + forged + " 404 " in crlf, crlf
    esc = next(line for line in lines if "/v1/ops-log-esc" in line)
    assert "/v1/ops-log-esc\\x1b[2J\\x1b[31mred\\x7f\\x08 404 " in esc, esc


def test_a_refused_reload_logs_with_priority_prefixes(new_daemon):
    d = new_daemon(config="log_level = info\n")
    with open(d.config_path, "w") as f:
        f.write("log_level = shouting\n")
    d.terminate(signal.SIGHUP)
    m = d.wait_for_log(r"reload: configuration has errors \((.*)\); keeping the running one")
    assert d.config_path + ":1:" in m.group(1) and "log_level" in m.group(1), m.group(0)
    for line in _stopped_log(d).splitlines():
        assert LINE.match(line), f"a stderr line without its priority prefix: {line!r}"


# ================================================================ routine polls


def test_routine_polls_that_succeed_log_at_debug_and_every_other_request_at_info(new_daemon):
    """Health checks, readiness probes and metrics scrapes come on a
    schedule, and a gateway calls twice a second: at info they would be most
    of the journal. Their successes are logged at debug; their failures, and
    every other request, at info."""
    d = new_daemon(config="log_level = info\n")
    admin = {"Authorization": f"Bearer {d.admin_key}"}
    assert d.get("/healthz").status_code == 200
    assert d.get("/readyz").status_code == 200
    assert d.get("/metrics", headers=admin).status_code == 200
    assert d.get("/metrics").status_code == 401  # a failed scrape is news
    assert d.get("/v1/gpu-types").status_code == 200
    log = _stopped_log(d)
    access = [line for line in log.splitlines() if " http: GET " in line]
    assert not [line for line in access if re.search(r" GET /(healthz|readyz) ", line)], access
    metrics = [line for line in access if " GET /metrics " in line]
    assert len(metrics) == 1 and metrics[0].startswith("<6>") and " 401 " in metrics[0], metrics
    assert [line for line in access if " GET /v1/gpu-types 200 " in line and line.startswith("<6>")], access

    d = new_daemon(config="log_level = debug\n")
    assert d.get("/healthz").status_code == 200
    log = _stopped_log(d)
    assert [line for line in log.splitlines() if line.startswith("<7>") and " http: GET /healthz 200 " in line], \
        log[-3000:]
