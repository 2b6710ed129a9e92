"""test_agent_health.py: a workload spec's health check (spec.health). Bad
shapes are refused with the field; a sim workload's server is checked with
HTTP GET on its own port: "starting" while nothing of the workload listens,
"healthy" once it answers 2xx, "unhealthy" when it answers 500, healthy
again when it recovers; each verdict comes with the check's time. The
server is a small Python script whose start and answers files steer."""
import os
import sys
import time

import pytest

from agent_util import Agent, assert_error, poll
from ports import free_port

SERVER = r'''
import http.server, os, sys, time
port, go, fail = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while not os.path.exists(go):
    time.sleep(0.05)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(500 if os.path.exists(fail) else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


GOOD = {"port": 8080, "path": "/health", "interval_s": 1}


@pytest.mark.parametrize("health,field", [
    ("yes", "health"),
    ([GOOD], "health"),
    ({**GOOD, "extra": 1}, "health.extra"),
    ({"path": "/health", "interval_s": 1}, "health.port"),
    ({**GOOD, "port": 0}, "health.port"),
    ({**GOOD, "port": 65536}, "health.port"),
    ({**GOOD, "port": "8080"}, "health.port"),
    ({**GOOD, "port": 80.5}, "health.port"),
    ({"port": 8080, "interval_s": 1}, "health.path"),
    ({**GOOD, "path": "health"}, "health.path"),
    ({**GOOD, "path": ""}, "health.path"),
    ({**GOOD, "path": "/a b"}, "health.path"),
    ({**GOOD, "path": "/a\r\nX: y"}, "health.path"),
    ({**GOOD, "path": "/" + "a" * 256}, "health.path"),
    ({**GOOD, "path": 5}, "health.path"),
    ({"port": 8080, "path": "/health"}, "health.interval_s"),
    ({**GOOD, "interval_s": 0}, "health.interval_s"),
    ({**GOOD, "interval_s": 3601}, "health.interval_s"),
    ({**GOOD, "interval_s": True}, "health.interval_s"),
])
def test_bad_health_shapes_are_refused(tmp_path, health, field):
    a = Agent(tmp_path / "a")
    r = a.put("/v1/workloads/wl_h", json={"image": "busybox", "health": health})
    err = assert_error(r, 400, "invalid_field")
    assert err["field"] == field, err
    assert a.get("/v1/workloads/wl_h").status_code == 404
    a.stop()


def test_a_spec_with_health_is_idempotent_and_a_different_one_conflicts(tmp_path):
    a = Agent(tmp_path / "a")
    spec = {"image": "busybox", "health": {**GOOD, "path": "/ready?x=1"}}
    assert a.put("/v1/workloads/wl_h", json=spec).status_code == 201
    assert a.put("/v1/workloads/wl_h", json=spec).status_code == 200
    other = {"image": "busybox", "health": {**GOOD, "interval_s": 2}}
    assert a.put("/v1/workloads/wl_h", json=other).status_code == 409
    # Without a health check a workload shows no health.
    assert a.put("/v1/workloads/wl_plain", json={"image": "busybox"}).status_code == 201
    assert "health" not in a.get("/v1/workloads/wl_plain").json()
    a.stop()


def test_starting_healthy_unhealthy_and_back(tmp_path):
    a = Agent(tmp_path / "a")
    port, go, fail = free_port(), tmp_path / "go", tmp_path / "fail"
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    spec = {"image": "busybox", "command": [sys.executable, str(script), str(port), str(go), str(fail)],
            "health": {"port": port, "path": "/health", "interval_s": 1}}
    before = int(time.time() * 1000)
    assert a.put("/v1/workloads/wl_srv", json=spec).status_code == 201
    a.wait_phase("wl_srv", "running")

    def health(want):
        def check():
            w = a.get("/v1/workloads/wl_srv").json()
            return w if w["health_checked_at_ms"] and w["health"] == want else None
        return check

    # Checked, but nothing listens yet: starting, with why.
    w = poll(health("starting"), 20, "a first check")
    assert w["health_checked_at_ms"] >= before and "listens on port" in w["health_message"], w
    go.write_text("")
    w = poll(health("healthy"), 20, "healthy once the server answers")
    assert w["health_message"] == "", w
    fail.write_text("")
    w = poll(health("unhealthy"), 20, "unhealthy on 500")
    assert "answered 500" in w["health_message"], w
    checked = w["health_checked_at_ms"]
    # It goes on being checked, and recovers.
    poll(lambda: a.get("/v1/workloads/wl_srv").json()["health_checked_at_ms"] > checked, 20, "a later check")
    os.unlink(fail)
    poll(health("healthy"), 20, "healthy again")
    assert a.delete("/v1/workloads/wl_srv").status_code == 200
    a.stop()


def test_a_server_answering_500_from_the_start_is_unhealthy_not_starting(tmp_path):
    a = Agent(tmp_path / "a")
    port, go, fail = free_port(), tmp_path / "go", tmp_path / "fail"
    go.write_text("")
    fail.write_text("")
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    spec = {"image": "busybox", "command": [sys.executable, str(script), str(port), str(go), str(fail)],
            "health": {"port": port, "path": "/", "interval_s": 1}}
    assert a.put("/v1/workloads/wl_bad", json=spec).status_code == 201
    w = poll(lambda: (lambda w: w if w.get("health") == "unhealthy" else None)(
        a.get("/v1/workloads/wl_bad").json()), 20, "unhealthy")
    assert w["phase"] == "running" and "answered 500" in w["health_message"], w
    assert a.delete("/v1/workloads/wl_bad").status_code == 200
    a.stop()
