"""test_agent_restart.py: a signed request is accepted once, across agent
restarts too. The nonce cache lives in memory, so a request captured before
a restart (or a crash) is refused after it for being dated before the new
run started; one dated ahead of the agent's clock is put on disk
(state_dir/replay-mark) before it is accepted, and the next run refuses
everything dated up to it. An unreadable mark refuses everything the
previous run could have accepted."""
import json
import os
import time

import pytest

from agent_util import Agent, assert_error, poll, sign

BEFORE_START = "before this agent's start"


def send(a, method, path, headers, body=b""):
    return a.request(method, path, data=body, headers=headers, sign=False)


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_requests_from_before_a_restart_are_refused_after_it(tmp_path, how):
    a = Agent(tmp_path / "a")
    wid = "wl_replayed"
    body = json.dumps({"image": "busybox"}).encode()
    put = sign(a.secret, "PUT", f"/v1/workloads/{wid}", body)
    delete = sign(a.secret, "DELETE", f"/v1/workloads/{wid}")
    facts = sign(a.secret, "GET", "/v1/facts")
    assert send(a, "PUT", f"/v1/workloads/{wid}", put, body).status_code == 201
    assert send(a, "GET", "/v1/facts", facts).status_code == 200
    assert send(a, "DELETE", f"/v1/workloads/{wid}", delete).status_code in (200, 202)
    poll(lambda: a.get(f"/v1/workloads/{wid}").status_code == 404, 20, "the removal")
    # Before the restart the nonce cache refuses them.
    assert "already used" in assert_error(send(a, "GET", "/v1/facts", facts), 401, "bad_signature")["message"]

    if how == "crash":
        a.kill()
        a.start()
    else:
        a.restart()
    # Authentic and within max_clock_skew_s, their nonces forgotten: refused
    # only because they predate this run.
    for method, path, h, b in [("PUT", f"/v1/workloads/{wid}", put, body), ("GET", "/v1/facts", facts, b""),
                               ("DELETE", f"/v1/workloads/{wid}", delete, b"")]:
        err = assert_error(send(a, method, path, h, b), 401, "bad_signature")
        assert BEFORE_START in err["message"], err
    assert a.get(f"/v1/workloads/{wid}").status_code == 404
    assert f"signature: refused PUT /v1/workloads/{wid}" in a.stderr_text()
    # Newly signed requests are fine.
    assert a.put(f"/v1/workloads/{wid}", json={"image": "busybox"}).status_code == 201
    assert a.get("/v1/facts").status_code == 200
    a.stop()


def test_a_request_dated_ahead_holds_the_floor_after_a_restart(tmp_path):
    a = Agent(tmp_path / "a")
    ahead = int(time.time()) + 120  # a control plane whose clock runs two minutes fast
    h = sign(a.secret, "GET", "/v1/facts", ts=ahead)
    assert send(a, "GET", "/v1/facts", h).status_code == 200
    with open(os.path.join(a.state_dir, "replay-mark")) as f:
        assert f.read() == f"{ahead}\n"
    # Dated in the past: nothing to record.
    assert a.get("/v1/facts").status_code == 200
    with open(os.path.join(a.state_dir, "replay-mark")) as f:
        assert f.read() == f"{ahead}\n"

    a.kill()
    a.start()
    assert a.signed_floor() == ahead + 1
    assert "the previous run accepted a request dated" in a.stderr_text()
    assert BEFORE_START in assert_error(send(a, "GET", "/v1/facts", h), 401, "bad_signature")["message"]
    # The fast control plane carries on; one on this clock is refused until
    # the clock passes the mark: the price of never accepting a replay.
    assert a.get("/v1/facts", ts=ahead + 1).status_code == 200
    assert_error(a.get("/v1/facts"), 401, "bad_signature")
    a.stop()


def test_an_unreadable_mark_refuses_what_the_previous_run_could_have_accepted(tmp_path):
    a = Agent(tmp_path / "a", options={"max_clock_skew_s": "60"})
    a.stop()
    with open(os.path.join(a.state_dir, "replay-mark"), "w") as f:
        f.write("not a number\n")
    a.start()
    started = int(time.time())
    assert "cannot read" in a.stderr_text()
    floor = a.signed_floor()
    assert floor > started + 50, (floor, started)
    assert_error(a.get("/v1/facts"), 401, "bad_signature")
    # Within max_clock_skew_s of any time after the start second.
    assert a.get("/v1/facts", ts=floor).status_code == 200
    a.stop()
