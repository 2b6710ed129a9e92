"""test_agent_logs.py: GET /v1/workloads/{id}/logs on a real sim agent: the
sim's start line, its "tick K" lines for a log-every-N image and its exit
line; tail, since, and following by cursor until done; the query covered
by the signature (a request signed without it, or with other values, is
refused); bad values 400; unknown workloads 404; the log kept across an
agent restart, and kept for a while after the workload is removed (as
ended_log_keep_s and ended_logs_max say); the last lines of an ended
workload in its JSON, bounded in count and size."""
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

        # Kept when the workload is removed, read whole and done.
        log_file = os.path.join(a.state_dir, "logs", "wl_1.log")
        assert os.path.exists(log_file)
        assert a.delete("/v1/workloads/wl_1").status_code == 200
        poll(lambda: not os.path.exists(log_file), 20, "the log file to move")
        assert os.path.exists(os.path.join(a.state_dir, "logs", "ended", "wl_1.log"))
        kept = logs(a, "wl_1").json()
        assert texts(kept) == seen and kept["done"] is True, kept
        assert texts(logs(a, "wl_1", tail=1).json()) == seen[-1:]
        a.restart()
        assert texts(logs(a, "wl_1").json()) == seen
        assert_error(logs(a, "wl_never"), 404, "not_found")
    finally:
        a.stop()


def test_removed_workloads_output_is_kept_only_as_configured(tmp_path):
    """ended_logs_max keeps the newest removed workloads' output, also once
    the agent starts again with a lower one, and ended_log_keep_s 0 keeps
    none."""
    def run_and_remove(a, wid):
        assert a.put(f"/v1/workloads/{wid}", json={"image": "test/exit-after-10"}).status_code == 201
        a.wait_phase(wid, "exited")
        assert a.delete(f"/v1/workloads/{wid}").status_code == 200
        poll(lambda: logs(a, wid).status_code != 200 or logs(a, wid).json()["done"], 20, f"{wid} removed")
        poll(lambda: a.get(f"/v1/workloads/{wid}").status_code == 404, 20, f"{wid} gone")

    a = Agent(tmp_path / "max", options={"ended_logs_max": "2"})
    try:
        for wid in ("wl_a", "wl_b", "wl_c"):
            run_and_remove(a, wid)
            time.sleep(0.01)  # ctimes apart: the newest are kept
        assert_error(logs(a, "wl_a"), 404, "not_found")
        assert [logs(a, w).json()["done"] for w in ("wl_b", "wl_c")] == [True, True]
        # Started again with a lower limit, the agent sweeps what it no longer keeps.
        a.restart(ended_logs_max=1)
        assert_error(logs(a, "wl_b"), 404, "not_found")
        assert logs(a, "wl_c").json()["done"] is True
    finally:
        a.stop()
    a = Agent(tmp_path / "none", options={"ended_log_keep_s": "0"})
    try:
        run_and_remove(a, "wl_a")
        assert_error(logs(a, "wl_a"), 404, "not_found")
        assert not os.listdir(os.path.join(a.state_dir, "logs")), "nothing left of its output"
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


def test_ended_workload_shows_its_last_lines(tmp_path):
    """An exited workload's JSON (one and the list) carries the last 10 lines
    of its log, the exit line last, each at most 200 bytes; a running one
    has none. The sim's exit-code-N makes it exit with N."""
    a = Agent(tmp_path)
    try:
        long_line = "x" * 300
        r = a.put("/v1/workloads/wl_end", json={"image": "t/log-every-20-exit-after-600-exit-code-7:1", "gpus": [0]})
        assert r.status_code == 201, r.text
        running = poll(lambda: (lambda b: b if b["phase"] == "running" else None)(a.get("/v1/workloads/wl_end").json()),
                       20, "running")
        assert "last_lines" not in running
        body = a.wait_phase("wl_end", "exited")
        assert body["exit_code"] == 7 and body["message"] == "the container exited with status 7", body
        lines = body["last_lines"]
        assert len(lines) == 10 and lines[-1] == "sim: container exited with status 7", lines
        ticks = [int(t.split()[1]) for t in lines[:-1]]
        assert all(t.startswith("tick ") for t in lines[:-1]) and ticks == list(range(ticks[0], ticks[0] + 9)), lines
        [listed] = [w for w in a.get("/v1/workloads").json()["workloads"] if w["id"] == "wl_end"]
        assert listed["last_lines"] == lines
        # Lines are cut to 200 bytes: a log line written straight to the file.
        path = os.path.join(a.state_dir, "logs", "wl_end.log")
        with open(path, "a") as f:
            f.write(f"{int(time.time() * 1000)} e {long_line}\n")
        lines = a.get("/v1/workloads/wl_end").json()["last_lines"]
        assert lines[-1] == "x" * 200 and len(lines) == 10, lines
        assert a.delete("/v1/workloads/wl_end").status_code == 200
    finally:
        a.stop()


def test_a_long_line_of_wide_characters_is_cut_between_characters(tmp_path):
    """A line longer than the agent keeps in one piece is cut into several,
    and each cut falls between characters: Chinese text 18 000 bytes long
    came back with '?' for the two halves of each character a cut split."""
    a = Agent(tmp_path)
    try:
        text = "文件" * 3000 + "é"
        spec = {"image": "busybox", "command": ["python3", "-c", "print('\\u6587\\u4ef6' * 3000 + '\\xe9')"]}
        assert a.put("/v1/workloads/wl_wide", json=spec).status_code == 201

        def whole():
            got = [t for t in texts(logs(a, "wl_wide", tail=1000).json()) if not t.startswith("sim: ")]
            return got if len("".join(got)) >= len(text) else None
        pieces = poll(whole, 20, "the line in the log")
        assert len(pieces) > 1, [len(p) for p in pieces]
        assert "".join(pieces) == text, [p[:4] + "…" + p[-4:] for p in pieces]
    finally:
        a.stop()
