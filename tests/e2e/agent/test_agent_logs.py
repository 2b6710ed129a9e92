"""test_agent_logs.py: GET /v1/workloads/{id}/logs on a real sim agent: the
sim's start line, its "tick K" lines for a log-every-N image and its exit
line; tail, since, and following by cursor until done; the query covered
by the signature (a request signed without it, or with other values, is
refused); bad values 400; unknown workloads 404; the log kept across an
agent restart, and removed with the workload."""
import os
import time

from agent_util import Agent, assert_error, poll


def logs(agent, wid, **query):
    # Signed in the canonical order the agent rebuilds: tail, since, after.
    q = "&".join(f"{k}={query[k]}" for k in ("tail", "since", "after") if k in query)
    return agent.get(f"/v1/workloads/{wid}/logs" + (f"?{q}" if q else ""))


def texts(body):
    return [line["text"] for line in body["lines"]]


def test_sim_lines_follow_and_done(tmp_path):
    a = Agent(tmp_path)
    try:
        r = a.put("/v1/workloads/wl_1", json={"image": "test/log-every-50-exit-after-1500"})
        assert r.status_code == 201, r.text
        first = poll(lambda: (lambda b: b if b["lines"] else None)(logs(a, "wl_1").json()), 20, "the start line")
        assert first["lines"][0]["text"] == "sim: container started, image test/log-every-50-exit-after-1500"
        assert first["lines"][0]["stream"] == "stdout"
        assert abs(first["lines"][0]["t"] / 1000 - time.time()) < 3600
        # Follow by cursor: every tick arrives once, in order, then done.
        seen, cursor = texts(first), first["cursor"]
        def more():
            nonlocal cursor
            r = logs(a, "wl_1", after=cursor)
            assert r.status_code == 200, r.text
            body = r.json()
            seen.extend(texts(body))
            cursor = body["cursor"]
            return body["done"]
        poll(more, 30, "the workload's log to be done")
        ticks = [t for t in seen if t.startswith("tick ")]
        assert ticks == [f"tick {k}" for k in range(1, len(ticks) + 1)]
        assert len(ticks) >= 2
        assert seen[-1] == "sim: container exited with status 0"
        # Nothing after done.
        r = logs(a, "wl_1", after=cursor).json()
        assert r["lines"] == [] and r["done"] and r["cursor"] == cursor

        # tail and since
        r = logs(a, "wl_1", tail=2).json()
        assert texts(r) == seen[-2:] and r["done"]
        r = logs(a, "wl_1", since=int(time.time()) + 3600).json()
        assert r["lines"] == []
        r = logs(a, "wl_1", since=0).json()
        assert texts(r) == seen

        # Kept across a restart.
        a.restart()
        assert texts(logs(a, "wl_1").json()) == seen

        # Removed with the workload.
        log_file = os.path.join(a.state_dir, "logs", "wl_1.log")
        assert os.path.exists(log_file)
        assert a.delete("/v1/workloads/wl_1").status_code == 200
        poll(lambda: not os.path.exists(log_file), 20, "the log file to go")
        assert_error(logs(a, "wl_1"), 404, "not_found")
    finally:
        a.stop()


def test_bad_queries_and_signature(tmp_path):
    a = Agent(tmp_path)
    try:
        assert a.put("/v1/workloads/wl_2", json={"image": "busybox"}).status_code == 201
        assert_error(logs(a, "wl_none"), 404, "not_found")
        for q in ({"tail": "-1"}, {"tail": "1001"}, {"tail": "x"}, {"since": "-5"}, {"since": "abc"},
                  {"after": "zz"}, {"after": "1"}, {"tail": "5", "after": "1-0"}):
            r = logs(a, "wl_2", **q)
            assert r.status_code == 400, (q, r.text)
        r = a.get("/v1/workloads/wl_2/logs?bogus=1")
        assert r.status_code == 400, r.text
        r = a.get("/v1/workloads/wl_2/logs?tail=%2B1")
        assert r.status_code == 400, r.text
        # The query is signed: the same signature with another query fails.
        from agent_util import sign
        import requests
        h = sign(a.secret, "GET", "/v1/workloads/wl_2/logs?tail=1")
        r = requests.get(a.base_url + "/v1/workloads/wl_2/logs?tail=2", headers=h, timeout=10)
        assert_error(r, 401, "bad_signature")
        h = sign(a.secret, "GET", "/v1/workloads/wl_2/logs")
        r = requests.get(a.base_url + "/v1/workloads/wl_2/logs?tail=2", headers=h, timeout=10)
        assert_error(r, 401, "bad_signature")
        # Other routes still take no query at all.
        r = a.get("/v1/workloads/wl_2?tail=1")
        assert r.status_code == 400, r.text
    finally:
        a.stop()
