"""test_agent_sim_command.py: the sim runtime runs a spec's `command` for
real. Its stdout and stderr are the workload's log, line by line; its exit
status and second are the workload's; its env is the spec's with HOME, PATH
and GPURENT_WORKLOAD; working_dir under /shared is the volume's directory;
DELETE kills its whole process group; an agent that dies takes the process
with it, and the agent started again reports the workload exited with an
unknown status. A secret_env value is never in the agent's log."""
import os
import time

from agent_util import Agent, poll

SECRET = "pw-7c1d-never-logged"


def log_texts(a, wid):
    r = a.get(f"/v1/workloads/{wid}/logs?tail=500")
    assert r.status_code == 200, r.text
    return [(line["stream"], line["text"]) for line in r.json()["lines"]]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_the_command_runs_logs_and_exits_with_its_status(tmp_path):
    a = Agent(tmp_path / "a")
    vol = tmp_path / "vol"
    spec = {"image": "busybox", "volumes": [{"source": str(vol), "target": "/shared"}],
            "env": {"WHO": "sim", "TOKEN": SECRET}, "secret_env": ["TOKEN"], "working_dir": "/shared/run",
            "command": ["sh", "-c", 'echo "hi $WHO"; echo "home=$HOME"; pwd; echo warn >&2;'
                        ' [ -n "$TOKEN" ] && echo "token-len=${#TOKEN}"; printf partial; exit 7']}
    started = int(time.time())
    assert a.put("/v1/workloads/wl_job", json=spec).status_code == 201
    w = a.wait_phase("wl_job", "exited")
    assert w["exit_code"] == 7 and w["message"] == "the command exited with status 7"
    assert started <= w["exited_at"] <= int(time.time())
    lines = log_texts(a, "wl_job")
    assert ("stdout", "hi sim") in lines and ("stderr", "warn") in lines and ("stdout", "partial") in lines
    assert ("stdout", f"token-len={len(SECRET)}") in lines
    assert ("stdout", str(vol / "run")) in lines  # /shared/run is the volume's directory
    home = [t for s, t in lines if t.startswith("home=")][0]
    assert home.endswith("/containers/wl_job"), home
    assert w["env"]["TOKEN"] == "***"
    assert SECRET not in a.get("/v1/workloads").text
    assert SECRET not in a.stderr_text()
    assert a.delete("/v1/workloads/wl_job").status_code == 200
    a.stop()
    assert SECRET not in a.stderr_text()


def test_delete_kills_the_process_group_and_a_restart_reports_an_unknown_exit(tmp_path):
    a = Agent(tmp_path / "a")
    pidfile = tmp_path / "pids"
    spec = {"image": "busybox",
            "command": ["sh", "-c", f'sleep 300 & echo $! > {pidfile}.child; echo $$ > {pidfile}; wait']}
    assert a.put("/v1/workloads/wl_long", json=spec).status_code == 201
    a.wait_phase("wl_long", "running")
    poll(lambda: os.path.exists(f"{pidfile}.child") and os.path.getsize(f"{pidfile}.child") > 0, 20, "the pids")
    main, child = int(open(pidfile).read()), int(open(f"{pidfile}.child").read())
    assert alive(main) and alive(child)
    assert a.delete("/v1/workloads/wl_long").status_code == 200
    poll(lambda: a.get("/v1/workloads/wl_long").status_code == 404, 20, "the removal")
    poll(lambda: not alive(main) and not alive(child), 10, "the process group to be gone")

    # A workload whose process the agent before this one started.
    os.unlink(pidfile)
    assert a.put("/v1/workloads/wl_orphan", json=spec).status_code == 201
    a.wait_phase("wl_orphan", "running")
    poll(lambda: os.path.exists(pidfile) and os.path.getsize(pidfile) > 0, 20, "the pid")
    main = int(open(pidfile).read())
    a.kill()
    poll(lambda: not alive(main), 10, "the process to die with its agent")
    a.start()
    w = a.wait_phase("wl_orphan", "exited")
    assert w["exit_code"] is None and "unknown" in w["message"], w
    a.stop()


def test_delete_answers_removed_only_once_the_workload_is_gone(tmp_path):
    """A DELETE says 202 "removing" while the workload's removal goes on (here
    a command that ignores SIGTERM, killed 2 s later), with Retry-After; its
    cards stay held meanwhile, and a PUT on one of them is refused with
    Retry-After too, since it frees up without anyone asking. Asked again
    once it is gone, the DELETE says 200 "removed", and the card is free.
    With Gpurent-Wait-Ms a DELETE answers 200 only when the workload is
    gone: its record is already off the disk."""
    a = Agent(tmp_path / "a")
    spec = {"image": "busybox", "gpus": [0], "command": ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]}
    assert a.put("/v1/workloads/wl_stubborn", json=spec).status_code == 201
    a.wait_phase("wl_stubborn", "running")
    r = a.delete("/v1/workloads/wl_stubborn", headers={"Gpurent-Wait-Ms": "0"})
    assert (r.status_code, r.json(), r.headers.get("Retry-After")) == \
        (202, {"id": "wl_stubborn", "phase": "removing"}, "1"), r.text
    r = a.put("/v1/workloads/wl_next", json={"image": "busybox", "gpus": [0]})
    assert (r.status_code, r.headers.get("Retry-After")) == (409, "1"), r.text
    assert "being removed" in r.json()["error"]["message"]
    # A card the removal does not hold is not refused.
    assert a.put("/v1/workloads/wl_beside", json={"image": "busybox", "gpus": [1]}).status_code == 201
    r = a.delete("/v1/workloads/wl_stubborn")  # asked again while it answers 202
    assert (r.status_code, r.json()) == (200, {"id": "wl_stubborn", "phase": "removed"}), r.text
    assert not os.path.exists(os.path.join(a.state_dir, "workloads", "wl_stubborn.json"))
    assert a.put("/v1/workloads/wl_next", json={"image": "busybox", "gpus": [0]}).status_code == 201

    # A plain workload is gone within moments: the DELETE that starts its
    # removal waits for it and says so, its record already off the disk.
    r = a.request("DELETE", "/v1/workloads/wl_beside", headers={"Gpurent-Wait-Ms": "1000"})
    assert (r.status_code, r.json()["phase"]) == (200, "removed"), r.text
    assert not os.path.exists(os.path.join(a.state_dir, "workloads", "wl_beside.json"))
    a.stop()
