"""GET /v1/instances/{id}/logs against a real daemon and a sim fleet: lines
appear as the container prints them, tail and since filter them, follow=true
streams new lines as they are written and ends when the workload does or
the API key that opened it is revoked, bad
query values are 400, another user's instance is 404, a stopped instance's output is
still read from the node it ran on (409 once that node no longer keeps it),
and the key property: a log read from a paused (SIGSTOPped) node is pending
on the logs proxy while other API requests still answer, because the
handler defers its request instead of waiting on the agent."""
import calendar
import re
import signal
import socket
import threading
import time

import requests

from agent_util import pause, poll
from harness import assert_error
from instances_util import DEADLINE, cloud, cloud_with  # noqa: F401  (fixtures)

IMAGE = "example/log-every-50:1"
# The paused node must not go offline under the test (its placement would
# go), and the read must stay pending long enough to be seen pending.
# Agents get 30 s to answer: the reads against a paused node must all be
# pending at once, however slowly a loaded machine starts them.
cloud_patient = cloud_with(heartbeat_interval_ms="500", heartbeat_miss_limit="100", agent_timeout_ms="30000")


def running(c, cards=8):
    fleet = c.fleet(cards // 8)
    c.add_image(IMAGE)
    u = c.user()
    inst = c.create(u, card_count=cards, image=IMAGE)
    c.wait_state(u, inst["id"], "running")
    return fleet, u, inst


def logs(c, u, inst_id, **params):
    return c.d.get(f"/v1/instances/{inst_id}/logs", key=u.key, params=params)


def texts(body):
    return [line["text"] for line in body["data"]]


def ticks_of(body):
    return [int(t.split()[1]) for t in texts(body) if t.startswith("tick ")]


def wait_tick(c, u, inst_id, k, **params):
    """Polls until the reply holds a tick numbered k or more."""
    def check():
        r = logs(c, u, inst_id, **params)
        assert r.status_code == 200, r.text
        return r.json() if any(n >= k for n in ticks_of(r.json())) else None
    return poll(check, DEADLINE, f"tick {k} or later in the logs")


def pending_reads(c):
    r = c.d.get("/metrics", key=c.d.admin_key)
    assert r.status_code == 200, r.text
    return int(re.search(r"^gpurent_logs_reads_pending (\d+)$", r.text, re.M).group(1))


# One streamed line of follow=true.
LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) (stdout|stderr) (.*)$")


def follow(c, u, inst_id, **params):
    r = requests.get(c.d.url(f"/v1/instances/{inst_id}/logs"), params=dict(params, follow="true"),
                     headers={"Authorization": f"Bearer {u.key}"}, stream=True, timeout=DEADLINE)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain"), r.headers
    # nginx (OPERATIONS.md's reverse proxy) buffers a reply unless told not
    # to, and a followed log came through it in lumps, late.
    assert r.headers.get("X-Accel-Buffering") == "no", r.headers
    return r


def epoch_s(rfc3339_ms):
    return calendar.timegm(time.strptime(rfc3339_ms[:19], "%Y-%m-%dT%H:%M:%S"))


def test_lines_tail_and_since(cloud):
    c = cloud
    _, u, inst = running(c)
    body = wait_tick(c, u, inst["id"], 3, tail=0)
    assert body["rank"] == 0 and body["done"] is False
    assert set(body) == {"data", "rank", "done"}
    first = body["data"][0]
    assert set(first) == {"time", "stream", "text"}
    assert first["text"].startswith("sim: container started, image " + IMAGE), first
    assert first["stream"] == "stdout"
    assert len(first["time"]) == 24 and first["time"].endswith("Z") and first["time"][19] == ".", first
    assert ticks_of(body)[:3] == [1, 2, 3], texts(body)

    r = logs(c, u, inst["id"], tail=2)
    assert r.status_code == 200, r.text
    two = texts(r.json())
    assert len(two) == 2 and all(t.startswith("tick ") for t in two), two
    # Ticks 1 to 3 were seen, so the last two lines are tick 2 and 3 or later.
    k = [int(t.split()[1]) for t in two]
    assert k[1] == k[0] + 1 and k[1] >= 3, two

    # The default tail is 100 lines.
    wait_tick(c, u, inst["id"], 120, tail=1)
    r = logs(c, u, inst["id"])
    assert r.status_code == 200 and len(r.json()["data"]) == 100, r.text

    # since: a time after the first line leaves it out; far ahead leaves all out.
    start_s = epoch_s(first["time"])
    later = start_s + 1
    wait_tick(c, u, inst["id"], 1, since=later, tail=0)
    for since in (later, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(later))):
        r = logs(c, u, inst["id"], since=since, tail=0)
        assert r.status_code == 200, r.text
        got = r.json()["data"]
        assert got and all(epoch_s(line["time"]) >= later for line in got), got[:3]
        assert not any(t.startswith("sim: container started") for t in texts(r.json()))
    r = logs(c, u, inst["id"], since=start_s + 100000)
    assert r.status_code == 200 and r.json()["data"] == [], r.text
    r = logs(c, u, inst["id"], since=0, tail=0, follow="false")
    assert r.status_code == 200 and texts(r.json())[0].startswith("sim: container started"), r.text


def test_bad_queries_and_others_instances(cloud):
    c = cloud
    _, u, inst = running(c)
    bad = [
        ({"rank": 1}, "rank"), ({"rank": -1}, "rank"), ({"rank": "x"}, "rank"), ({"rank": ""}, "rank"),
        ({"rank": 99999999999}, "rank"),
        ({"tail": 1001}, "tail"), ({"tail": -1}, "tail"), ({"tail": "ten"}, "tail"), ({"tail": "1.5"}, "tail"),
        ({"since": "yesterday"}, "since"), ({"since": "2026-13-01T00:00:00Z"}, "since"), ({"since": "-5"}, "since"),
        ({"since": "2026-11-29T18:22:00+08:00"}, "since"),
        ({"follow": "yes"}, "follow"), ({"follow": "1"}, "follow"), ({"follow": "true", "tail": 5000}, "tail"),
        ({"colour": "blue"}, "colour"),
    ]
    for params, field in bad:
        assert_error(logs(c, u, inst["id"], **params), 400, "invalid_query", field)

    other = c.user()
    assert_error(logs(c, other, inst["id"]), 404, "not_found")
    assert_error(logs(c, u, "ins_00000000000000000000"), 404, "not_found")
    assert_error(logs(c, u, "not-an-id"), 404, "not_found")
    assert_error(c.d.get(f"/v1/instances/{inst['id']}/logs"), 401, "unauthorized")
    assert_error(c.d.post(f"/v1/instances/{inst['id']}/logs", key=u.key, json={}), 405, "method_not_allowed")


def test_two_ranks_and_stopped_instance(cloud):
    c = cloud
    _, u, inst = running(c, cards=16)
    wait_tick(c, u, inst["id"], 2, rank=1)
    r = logs(c, u, inst["id"], rank=1, tail=1)
    assert r.status_code == 200 and r.json()["rank"] == 1, r.text
    assert_error(logs(c, u, inst["id"], rank=2), 400, "invalid_query", "rank")

    c.action(u, inst["id"], "stop")
    c.wait_state(u, inst["id"], "stopped")
    # Each rank's output outlives the run: the node it ran on keeps it.
    for rank in (0, 1):
        r = logs(c, u, inst["id"], rank=rank, tail=1000)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["done"] is True and body["rank"] == rank and ticks_of(body)[:1] == [1], body


def removed_from_its_node(c, inst_id):
    """Waits until the workload of the ended instance's rank 0 is gone from
    its node (the daemon removes it after recording the end); its node's name."""
    ((node, wl),) = c.d.sql("SELECT n.name, p.workload_id FROM instance_past_ranks p JOIN nodes n"
                            " ON n.id = p.node_id WHERE p.instance_id = ? AND p.rank = 0", (inst_id,))
    poll(lambda: all(w["id"] != wl for ws in c.all_workloads().values() for w in ws), DEADLINE,
         f"the workload of {inst_id} removed from {node}")
    return node


def test_a_jobs_output_is_read_after_it_ends_until_the_node_lets_it_go(cloud):
    """A job that succeeded, and one that failed, are read after their end
    (each rank's node keeps a removed workload's output, ended_log_keep_s);
    a node that keeps none (0) answers 409 with the reason, as does a rank
    of a run that never reached a node."""
    c = cloud
    c.fleet(1)
    c.add_image("example/job:1")
    u = c.user()
    ok = c.create(u, card_count=8, image="example/job:1", command=["sh", "-c", "echo 训练 done; exit 0"])
    c.wait_state(u, ok["id"], "succeeded")
    removed_from_its_node(c, ok["id"])
    body = logs(c, u, ok["id"]).json()
    assert body["done"] is True and "训练 done" in texts(body), body
    followed = requests.get(c.d.url(f"/v1/instances/{ok['id']}/logs"), params={"follow": "true"},
                            headers={"Authorization": f"Bearer {u.key}"}, timeout=DEADLINE)
    assert followed.status_code == 200 and "训练 done" in followed.text, followed.text
    # With the first node busy, the second job runs on a node that keeps
    # nothing, which joins only now: placement may pick either of two free
    # nodes.
    c.add_image(IMAGE)
    c.wait_state(u, c.create(u, card_count=8, image=IMAGE)["id"], "running")
    keepless = c.fleet(1, sim={"ended_log_keep_s": "0"})
    bad = c.create(u, card_count=8, image="example/job:1", command=["sh", "-c", "echo oops; exit 3"])
    c.wait_state(u, bad["id"], "failed")
    assert removed_from_its_node(c, bad["id"]) in keepless.nodes
    err = assert_error(logs(c, u, bad["id"]), 409, "invalid_state", "rank")
    assert err["state"] == "failed" and "no longer kept" in err["message"], err
    # The first job's output is still there.
    assert "训练 done" in texts(logs(c, u, ok["id"]).json())


def test_paused_node_holds_no_http_thread(cloud_patient):
    c = cloud_patient
    fleet, u, inst = running(c)
    wait_tick(c, u, inst["id"], 1)
    reply = {}

    def read():
        reply["r"] = logs(c, u, inst["id"], tail=5)

    pause(fleet.proc)
    try:
        t = threading.Thread(target=read)
        t.start()
        # More reads than the pool has threads, all pending on the node.
        extra = [threading.Thread(target=lambda: logs(c, u, inst["id"])) for _ in range(8)]
        for e in extra:
            e.start()
        poll(lambda: pending_reads(c) == 9, DEADLINE, "the nine reads to be pending on the proxy")
        # Every pool thread is free: other requests answer while they wait.
        for _ in range(3):
            r = c.d.get("/v1/gpu-types", key=u.key)
            assert r.status_code == 200, r.text
            r = c.d.get("/v1/instances", key=u.key)
            assert r.status_code == 200, r.text
        assert t.is_alive() and "r" not in reply, "the read from a paused node came back before the node answered"
    finally:
        fleet.proc.send_signal(signal.SIGCONT)
    t.join(DEADLINE)
    for e in extra:
        e.join(DEADLINE)
    assert not t.is_alive()
    r = reply["r"]
    if r.status_code == 200:
        assert len(r.json()["data"]) <= 5 and r.json()["rank"] == 0, r.text
    else:
        err = assert_error(r, 503, "unavailable")
        assert "no answer from node" in err["message"], err
    poll(lambda: pending_reads(c) == 0, DEADLINE, "no read pending")


def test_shutdown_answers_pending_reads(cloud_patient):
    c = cloud_patient
    fleet, u, inst = running(c)
    wait_tick(c, u, inst["id"], 1)
    reply = {}

    def read():
        reply["r"] = logs(c, u, inst["id"])

    # A follow whose stream has sent what there was: its connection is
    # suspended, waiting for the paused node.
    stream = follow(c, u, inst["id"], tail=1)
    lines = stream.iter_lines(decode_unicode=True)
    assert LINE.match(next(lines))
    pause(fleet.proc)
    try:
        t = threading.Thread(target=read)
        t.start()
        poll(lambda: pending_reads(c) == 1, DEADLINE, "the read to be pending on the proxy")
        # A clean stop (exit 0, no sanitizer report) answers both first: the
        # HTTP server cannot stop with a suspended connection.
        c.d.stop()
        t.join(DEADLINE)
        rest = list(lines)
    finally:
        fleet.proc.send_signal(signal.SIGCONT)
    err = assert_error(reply["r"], 503, "unavailable")
    assert "shutting down" in err["message"], err
    assert rest and rest[-1] == "gpurent: the control plane is shutting down", rest[-3:]


def test_head_of_a_follow_is_its_headers_alone(cloud):
    """HEAD of a follow starts no stream: its headers, no chunked framing and
    not one byte after them (not even the empty last chunk, which a client
    keeping the connection would read as the start of its next reply); the
    connection then closes, as a reply with no length ends that way."""
    c = cloud
    _, u, inst = running(c)
    with socket.create_connection(("127.0.0.1", c.d.port), timeout=DEADLINE) as s:
        s.sendall((f"HEAD /v1/instances/{inst['id']}/logs?follow=true HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Bearer {u.key}\r\n\r\n").encode())
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    head, _, after = got.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    assert lines[0] == "HTTP/1.1 200 OK", got
    assert fields["content-type"] == "text/plain; charset=utf-8", got
    assert fields["x-accel-buffering"] == "no", got
    assert "transfer-encoding" not in fields and "content-length" not in fields, got
    assert after == b"", got


def test_follow_streams_new_lines_until_the_workload_ends(cloud):
    c = cloud
    _, u, inst = running(c)
    first = wait_tick(c, u, inst["id"], 2, tail=1)
    start_k = ticks_of(first)[-1]
    # More follows than the pool has threads: each holds a suspended
    # connection, not a thread, so other requests still answer.
    streams = [follow(c, u, inst["id"], tail=2) for _ in range(10)]
    for _ in range(3):
        assert c.d.get("/v1/gpu-types", key=u.key).status_code == 200
        assert c.d.get("/v1/instances", key=u.key).status_code == 200
    lines = streams[0].iter_lines(decode_unicode=True)
    got = []
    for line in lines:
        m = LINE.match(line)
        assert m, line
        got.append(m.group(3))
        ks = [int(t.split()[1]) for t in got if t.startswith("tick ")]
        if ks and ks[-1] >= start_k + 5:
            break
    ks = [int(t.split()[1]) for t in got if t.startswith("tick ")]
    # tail=2 first, then every line as it comes, none lost or repeated.
    assert ks == list(range(ks[0], ks[0] + len(ks))), got
    assert ks[0] >= start_k - 1, got
    for s in streams[1:]:
        s.close()
    # Stopping the instance ends the workload, and the stream ends.
    c.action(u, inst["id"], "stop")
    rest = list(lines)
    assert rest, "the stream ended without the workload's last lines"
    # The last ticks come from where the node keeps the stopped workload's
    # output, following on from the cursor: none lost or repeated.
    rest_ks = [int(m.group(3).split()[1]) for m in map(LINE.match, rest) if m and m.group(3).startswith("tick ")]
    assert rest_ks and rest_ks == list(range(ks[-1] + 1, ks[-1] + 1 + len(rest_ks))), rest[-5:]
    streams[0].close()
    c.wait_state(u, inst["id"], "stopped")
    # Followed after the end: what was kept, and the stream ends.
    ended = requests.get(c.d.url(f"/v1/instances/{inst['id']}/logs"), params={"follow": "true", "tail": "3"},
                         headers={"Authorization": f"Bearer {u.key}"}, timeout=DEADLINE)
    assert ended.status_code == 200 and len(ended.text.splitlines()) == 3, ended.text


def test_a_follow_ends_with_the_key_that_opened_it(cloud):
    """A followed log outlived the revocation of the key that opened it. Now
    it ends, with a last line saying why, as its key is revoked; a follow
    through another key of the same user goes on."""
    c = cloud
    _, u, inst = running(c)
    r = c.d.post("/v1/api-keys", key=u.key, json={"name": "leaked"})
    assert r.status_code == 201, r.text
    leaked = r.json()
    wait_tick(c, u, inst["id"], 1, tail=1)  # every line from here is a tick
    doomed = follow(c, type("K", (), {"key": leaked["token"]}), inst["id"], tail=1)
    kept = follow(c, u, inst["id"], tail=1)
    doomed_lines, kept_lines = doomed.iter_lines(decode_unicode=True), kept.iter_lines(decode_unicode=True)
    assert LINE.match(next(doomed_lines))
    r = c.d.delete(f"/v1/api-keys/{leaked['id']}", key=u.key)
    assert r.status_code == 200, r.text
    rest, deadline = [], time.monotonic() + DEADLINE
    for line in doomed_lines:  # until the stream ends, as it must
        rest.append(line)
        assert time.monotonic() < deadline, f"the follow goes on after its key was revoked: {rest[-3:]}"
    assert rest and rest[-1] == "gpurent: the API key that opened this follow is revoked or expired", rest[-3:]
    doomed.close()
    seen = [m.group(3) for m in map(LINE.match, (next(kept_lines) for _ in range(3))) if m]
    assert len(seen) == 3 and all(t.startswith("tick ") for t in seen), seen
    kept.close()


def test_one_user_cannot_take_every_follow(cloud):
    """The daemon followed 64 logs at once, everyone's together, and one
    account opening that many left nobody else a follow ("too many logs are
    followed"). A user may now follow 16 at once: the seventeenth is 429
    with Retry-After, another user still follows, and a stream that ends
    gives its place back."""
    c = cloud
    _, u, inst = running(c)
    c.fleet(1)
    v = c.user()
    other = c.create(v, card_count=8, image=IMAGE)
    c.wait_state(v, other["id"], "running")
    mine = [follow(c, u, inst["id"], tail=1) for _ in range(16)]

    def one_more():
        return requests.get(c.d.url(f"/v1/instances/{inst['id']}/logs"), params={"follow": "true", "tail": 1},
                            headers={"Authorization": f"Bearer {u.key}"}, stream=True, timeout=DEADLINE)
    r = one_more()
    assert r.status_code == 429, r.status_code  # a stream would never end: its headers tell
    assert_error(r, 429, "too_many_requests")
    assert r.headers["Retry-After"] == "5", r.headers
    theirs = follow(c, v, other["id"], tail=1)
    assert LINE.match(next(theirs.iter_lines(decode_unicode=True))), "the other user's follow streams"
    mine.pop().close()

    def again():
        r = one_more()
        if r.status_code == 429:
            r.close()
            return None
        assert r.status_code == 200, r.text
        return r
    mine.append(poll(again, DEADLINE, "a follow again once one ended"))
    for r in mine + [theirs]:
        r.close()

