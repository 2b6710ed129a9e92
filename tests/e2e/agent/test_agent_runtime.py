"""test_agent_runtime.py: the real runtime (podman and docker) end to end,
against stand-in executables put first on PATH: `podman`/`docker` record
their argv and answer like the real tools (a container is a state file),
and `mount`/`umount` record theirs (a container's output, for `logs`, is
a file next to its state) and edit a stand-in mountinfo file that
the agent reads through its mountinfo_file option. So the agent's real
mount-point check runs, and can fail: a mount stand-in that exits 0 without
mounting must stop the workload before `run`. The exact pull, mount (with a
volume's {size_gb}), run, inspect, stop, rm and umount command lines are
asserted, and a container's exit is reported with its status at the finish
time the tool prints, in either tool's spelling of it."""
import hashlib
import json
import os
import stat
import textwrap
import time

import shutil
import socket
import subprocess
import sys
import urllib.request

import pytest

from agent_util import Agent, poll
from ports import free_port, free_range

SEP = "\x1f"

TOOL = textwrap.dedent(r"""
    #!/bin/sh
    # Stand-in podman/docker: records argv, answers like the real tool.
    tool=$(basename "$0")
    last=""; for a in "$@"; do last="$a"; done
    # `logs` is polled at every check: recorded apart, so the other
    # tests' call sequences stay as they were; prints CONTAINER.out, and
    # CONTAINER.err on stderr, as the real tool replays each stream: the
    # lines dated from the whole second --since names on (and any line
    # without a date, which the agent skips).
    if [ "$1" = logs ]; then
        { printf '%s' "$tool"; for a in "$@"; do printf '\037%s' "$a"; done; printf '\n'; } >> "$STANDIN_LOG.logs"
        from="$4"
        since() { python3 -c '
    import calendar, sys, time
    since = int(sys.argv[1])
    for line in open(sys.argv[2], errors="replace"):
        try:
            t = calendar.timegm(time.strptime(line[:19], "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            t = since
        if t >= since:
            sys.stdout.write(line)
    ' "$from" "$1"; }
        [ -f "$STANDIN_STATE/$last.err" ] && since "$STANDIN_STATE/$last.err" >&2
        [ -f "$STANDIN_STATE/$last.out" ] && since "$STANDIN_STATE/$last.out"
        exit 0
    fi
    { printf '%s' "$tool"; for a in "$@"; do printf '\037%s' "$a"; done; printf '\n'; } >> "$STANDIN_LOG"
    last=""; for a in "$@"; do last="$a"; done
    # FinishedAt as each tool prints it: podman in Go's default time format,
    # docker in RFC 3339; the zero time while a container has not finished.
    zero_time() { [ "$tool" = docker ] && echo "0001-01-01T00:00:00Z" || echo "0001-01-01 00:00:00 +0000 UTC"; }
    now_time() { [ "$tool" = docker ] && date -u +%Y-%m-%dT%H:%M:%S.%NZ || date -u "+%Y-%m-%d %H:%M:%S.%N +0000 UTC"; }
    case "$1" in
    pull)
        case "$2" in
        *fail-pull*) echo "Error: initializing source docker://$2: reading manifest: manifest unknown" >&2; exit 125 ;;
        *slow-pull*) exec sleep 60 ;;
        esac
        echo "Writing manifest to image destination"; exit 0 ;;
    container)
        # The main pid, when a test made the container's process (CONTAINER.pid).
        case "$4" in *Pid*)
            if [ -f "$STANDIN_STATE/$last.pid" ]; then cat "$STANDIN_STATE/$last.pid"; exit 0; fi
            echo "Error: no such container $last" >&2; exit 125 ;;
        esac
        if [ -f "$STANDIN_STATE/$last" ]; then cat "$STANDIN_STATE/$last"; exit 0; fi
        echo "Error: no such container $last" >&2; exit 125 ;;
    run)
        prev=""; name=""; envf=""
        for a in "$@"; do [ "$prev" = "--name" ] && name="$a"; [ "$prev" = "--env-file" ] && envf="$a"; prev="$a"; done
        # The env file is gone once run returns: keep what it held, and its mode.
        if [ -n "$envf" ]; then cp "$envf" "$STANDIN_STATE/$name.envfile"; stat -c %a "$envf" > "$STANDIN_STATE/$name.envmode"; fi
        case "$last" in *fail-start*)
            echo "Error: crun: open /dev/kfd: No such device: OCI runtime error" >&2; exit 126 ;;
        esac
        echo "running 0 $(zero_time)" > "$STANDIN_STATE/$name"
        # A run that made its container but has not returned yet.
        case "$last" in *slow-run*) exec sleep 60 ;; esac
        echo "4f1d9c2b7a3e"; exit 0 ;;
    stop)
        [ -f "$STANDIN_STATE/$last" ] || { echo "Error: no such container $last" >&2; exit 125; }
        echo "exited 143 $(now_time)" > "$STANDIN_STATE/$last"; echo "$last" ;;
    rm)
        rm -f "$STANDIN_STATE/$last"; echo "$last" ;;
    *)
        echo "stand-in: unexpected command $1" >&2; exit 2 ;;
    esac
""").lstrip()

MOUNT = textwrap.dedent(r"""
    #!/bin/sh
    # Stand-in mount: records argv; "mounts" by adding the target to the stand-in mountinfo.
    { printf 'mount'; for a in "$@"; do printf '\037%s' "$a"; done; printf '\n'; } >> "$STANDIN_LOG"
    target=""; for a in "$@"; do target="$a"; done
    case "$*" in *fail-mount*) echo "mount.nfs4: Connection refused" >&2; exit 32 ;; esac
    [ -f "$STANDIN_STATE/mount-noop" ] && exit 0
    printf '990 28 0:99 / %s rw,relatime - nfs4 server:/x rw\n' "$target" >> "$STANDIN_MOUNTINFO"
""").lstrip()

UMOUNT = textwrap.dedent(r"""
    #!/bin/sh
    # Stand-in umount: records argv; drops the target (its last argument,
    # after any options) from the stand-in mountinfo.
    { printf 'umount'; for a in "$@"; do printf '\037%s' "$a"; done; printf '\n'; } >> "$STANDIN_LOG"
    for target; do :; done
    grep -v " $target " "$STANDIN_MOUNTINFO" > "$STANDIN_MOUNTINFO.new"
    mv "$STANDIN_MOUNTINFO.new" "$STANDIN_MOUNTINFO"
""").lstrip()

PODMAN_ZERO = "0001-01-01 00:00:00 +0000 UTC"

SRC = "nfs.example:/export/vol_x"
ROCM_SPEC = {
    "image": "rocm/pytorch:2.3-rocm6.2", "gpus": [2, 3], "stack": "ROCm",
    "volumes": [{"source": SRC, "target": "/shared"}],
    "env": {"MASTER_PORT": "29500", "GPURENT_NODE_RANK": "0", "NOTE": "two words"},
}


class Standins:
    def __init__(self, root):
        self.root = str(root)
        self.bin = os.path.join(self.root, "bin")
        self.state = os.path.join(self.root, "containers")
        self.log = os.path.join(self.root, "calls.log")
        self.mountinfo = os.path.join(self.root, "mountinfo")
        self.mount_root = os.path.join(self.root, "mounts")
        for d in (self.bin, self.state):
            os.makedirs(d, exist_ok=True)
        for name, text in (("podman", TOOL), ("docker", TOOL), ("mount", MOUNT), ("umount", UMOUNT)):
            path = os.path.join(self.bin, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, stat.S_IRWXU)
        open(self.log, "w").close()
        open(self.mountinfo, "w").close()
        # The host's groups and RDMA device nodes, as the agent reads them
        # (group_file, rdma_device_dir): fixed here, whatever the machine has.
        self.group_file = os.path.join(self.root, "group")
        with open(self.group_file, "w") as f:
            f.write("root:x:0:\nvideo:x:44:\nrender:x:109:\n")
        self.rdma_dir = os.path.join(self.root, "infiniband")
        os.makedirs(os.path.join(self.rdma_dir, "by-path"), exist_ok=True)
        for name in ("uverbs1", "rdma_cm", "uverbs0"):
            open(os.path.join(self.rdma_dir, name), "w").close()
        # The KFD topology (kfd_topology_dir): a CPU node, then eight GPU
        # nodes whose render minors are 128 + card (node 9 listed before 2
        # would be in a directory's order; ROCr numbers them as numbers).
        self.kfd_dir = os.path.join(self.root, "kfd")
        for node in range(9):
            os.makedirs(os.path.join(self.kfd_dir, str(node)))
            with open(os.path.join(self.kfd_dir, str(node), "properties"), "w") as f:
                f.write("gpu_id 0\n" if node == 0 else f"gpu_id {1000 + node}\ndrm_render_minor {127 + node}\n")
        self.env = {**os.environ, "PATH": self.bin + os.pathsep + os.environ.get("PATH", ""),
                    "STANDIN_LOG": self.log, "STANDIN_STATE": self.state, "STANDIN_MOUNTINFO": self.mountinfo}

    def calls(self, tool=None):
        with open(self.log) as f:
            out = [line.rstrip("\n").split(SEP) for line in f if line.strip()]
        return [c for c in out if tool is None or c[0] == tool]

    def host_dir(self, source):
        return os.path.join(self.mount_root, "v-" + hashlib.sha256(source.encode()).hexdigest()[:16])

    def container(self, wid):
        path = os.path.join(self.state, f"gpurent-{wid}")
        return open(path).read().strip() if os.path.exists(path) else None

    def env_file(self, wid):
        """What the env file given to run held, and its mode (octal text)."""
        base = os.path.join(self.state, f"gpurent-{wid}")
        with open(base + ".envfile") as f, open(base + ".envmode") as m:
            return f.read(), m.read().strip()

    def set_container(self, wid, text):
        path = os.path.join(self.state, f"gpurent-{wid}")
        if text is None:
            os.unlink(path)
        else:
            with open(path, "w") as f:
                f.write(text + "\n")


@pytest.fixture
def standins(tmp_path):
    return Standins(tmp_path / "standins")


@pytest.fixture
def real_agent(tmp_path, standins):
    made = []

    def make(runtime="podman", model="MI450", **options):
        opts = {"runtime": runtime, "inventory_model": model, "mount_root": standins.mount_root,
                "mountinfo_file": standins.mountinfo, "check_interval_s": "1", "retry_interval_s": "1",
                "stop_timeout_s": "7", "group_file": standins.group_file, "rdma_device_dir": standins.rdma_dir,
                "kfd_topology_dir": standins.kfd_dir, "container_millicpus_per_card": "500",
                "container_memory_mb_per_card": "1024", "container_pids_limit": "4096", "container_log_max_mb": "16",
                **options}
        a = Agent(tmp_path / f"agent{len(made)}", options=opts, env=standins.env)
        made.append(a)
        return a
    yield make
    for a in made:
        a.stop()


def limits(cards):
    """A container's limits under the fixture's options: per card half a CPU
    and 1 GiB, 4096 processes (a workload without cards counts one) and a
    log file of 16 MiB."""
    return ["--cpus", f"{cards * 500 // 1000}.{cards * 500 % 1000:03d}", "--memory", f"{cards * 1024}m",
            "--pids-limit", "4096", "--log-driver", "json-file", "--log-opt", "max-size=16m"]


def env_file(agent, wid):
    return os.path.join(agent.state_dir, "run", f"{wid}.env")


def image(runtime, short):
    """The image word of a short name as each runtime is given it."""
    return short if runtime == "docker" else "docker.io/" + short


def verbs(calls):
    return [c[1] if c[0] in ("podman", "docker") else c[0] for c in calls]


def test_podman_rocm_command_lines(real_agent, standins):
    # Cards 2 and 3: their render nodes, and no other card's (never /dev/dri).
    a = real_agent()
    assert a.put("/v1/workloads/wl_rocm", json=ROCM_SPEC).status_code == 201
    a.wait_phase("wl_rocm", "running")
    hd = standins.host_dir(SRC)
    calls = standins.calls()
    # A short name is Docker Hub's, as docker and gpurentd read it: podman
    # is told so, or it would ask registries.conf (none on Debian/Ubuntu).
    assert calls[0] == ["podman", "pull", "docker.io/rocm/pytorch:2.3-rocm6.2"]
    # The default mount_command, run from PATH, target under mount_root.
    assert calls[1] == ["mount", "-t", "nfs4", "-o", "hard,noatime", SRC, hd]
    assert calls[2] == ["podman", "container", "inspect", "--format",
                        "{{.State.Status}} {{.State.ExitCode}} {{.State.FinishedAt}}", "gpurent-wl_rocm"]
    assert calls[3] == [
        "podman", "run", "--detach", "--name", "gpurent-wl_rocm", "--label", "gpurent.workload=wl_rocm",
        "--pull", "never", *limits(2), "--device", "/dev/kfd", "--device", "/dev/dri/renderD130",
        "--device", "/dev/dri/renderD131", "--group-add", "44", "--group-add", "109", "--shm-size", "64g",
        "--volume", f"{hd}:/shared", "--env-file", env_file(a, "wl_rocm"), "docker.io/rocm/pytorch:2.3-rocm6.2"]
    # The env travels in a 0600 file, sorted by name, removed after run.
    assert standins.env_file("wl_rocm") == ("GPURENT_NODE_RANK=0\nMASTER_PORT=29500\nNOTE=two words\n", "600")
    assert not os.path.exists(env_file(a, "wl_rocm"))
    assert standins.container("wl_rocm") == "running 0 " + PODMAN_ZERO
    # Running containers are inspected again every check_interval_s.
    poll(lambda: verbs(standins.calls()).count("container") >= 2, 10, "a state check")

    assert a.delete("/v1/workloads/wl_rocm").status_code == 200
    poll(lambda: standins.container("wl_rocm") is None, 15, "the container to be removed")
    poll(lambda: standins.calls("umount"), 10, "the unmount")
    tail = [c for c in standins.calls() if c[0] != "podman" or c[1] != "container"][3:]
    assert tail == [
        ["podman", "stop", "-t", "7", "gpurent-wl_rocm"],
        ["podman", "rm", "--force", "gpurent-wl_rocm"],
        ["umount", hd],
    ]
    poll(lambda: not os.path.exists(os.path.join(a.state_dir, "workloads", "wl_rocm.json")), 10, "record deletion")
    assert not os.path.exists(hd)  # the empty mount point is removed too


def test_docker_cuda_command_lines(real_agent, standins):
    a = real_agent(runtime="docker", model="H100-SXM")
    spec = {"image": "nvcr.io/nvidia/pytorch:24.05-py3", "gpus": [0, 5], "env": {"A": "1"}}
    r = a.put("/v1/workloads/wl_cuda", json=spec)
    assert r.status_code == 201, r.text
    a.wait_phase("wl_cuda", "running")
    assert ["docker", "pull", "nvcr.io/nvidia/pytorch:24.05-py3"] in standins.calls()
    run = [c for c in standins.calls() if c[:2] == ["docker", "run"]]
    assert run == [[
        "docker", "run", "--detach", "--name", "gpurent-wl_cuda", "--label", "gpurent.workload=wl_cuda",
        "--pull", "never", *limits(2), "--gpus", '"device=0,5"', "--shm-size", "64g",
        "--env-file", env_file(a, "wl_cuda"),
        "nvcr.io/nvidia/pytorch:24.05-py3"]]
    assert standins.env_file("wl_cuda") == ("A=1\n", "600")
    assert standins.calls("mount") == []  # no volumes, nothing mounted
    assert a.delete("/v1/workloads/wl_cuda").status_code == 200
    poll(lambda: ["docker", "rm", "--force", "gpurent-wl_cuda"] in standins.calls(), 15, "docker rm")
    assert ["docker", "stop", "-t", "7", "gpurent-wl_cuda"] in standins.calls()


def test_podman_cuda_uses_cdi_devices(real_agent, standins):
    a = real_agent(model="RTX4090", inventory_cards="4", run_args="--ipc=host --ulimit stack=67108864")
    assert a.put("/v1/workloads/wl_cdi", json={"image": "pytorch/pytorch:2.3", "gpus": [1, 3]}).status_code == 201
    a.wait_phase("wl_cdi", "running")
    run = [c for c in standins.calls() if c[:2] == ["podman", "run"]][0]
    # NVIDIA_VISIBLE_DEVICES=void: the image's "all" would have the toolkit's
    # legacy hook hand the container every card of the host.
    assert run[9:] == [*limits(2), "--device", "nvidia.com/gpu=1", "--device", "nvidia.com/gpu=3",
                       "--env", "NVIDIA_VISIBLE_DEVICES=void", "--ipc=host",
                       "--ulimit", "stack=67108864", "docker.io/pytorch/pytorch:2.3"]


def test_bind_mount_template(real_agent, standins):
    a = real_agent(mount_command="mount --bind {source} {target}", umount_command="umount --lazy {target}")
    spec = {"image": "busybox", "volumes": [{"source": "/srv/volumes/vol_9", "target": "/shared"}]}
    assert a.put("/v1/workloads/wl_bind", json=spec).status_code == 201
    a.wait_phase("wl_bind", "running")
    hd = standins.host_dir("/srv/volumes/vol_9")
    assert standins.calls("mount") == [["mount", "--bind", "/srv/volumes/vol_9", hd]]
    assert a.delete("/v1/workloads/wl_bind").status_code == 200
    poll(lambda: standins.calls("umount"), 15, "the unmount")
    assert standins.calls("umount") == [["umount", "--lazy", hd]]


def test_mount_command_receives_the_volume_size(real_agent, standins):
    """{size_gb} hands the volume's quota to the mount command; a volume
    whose spec has no size (an older control plane) is not mounted without
    its quota, and the workload says why."""
    a = real_agent(mount_command="mount -t tmpfs -o size={size_gb}G,mode=0755 {source} {target}")
    sized = {**ROCM_SPEC, "volumes": [{"source": SRC, "target": "/shared", "size_gb": 250}]}
    assert a.put("/v1/workloads/wl_quota", json=sized).status_code == 201
    a.wait_phase("wl_quota", "running")
    hd = standins.host_dir(SRC)
    assert standins.calls("mount") == [["mount", "-t", "tmpfs", "-o", "size=250G,mode=0755", SRC, hd]]
    run = [c for c in standins.calls() if c[:2] == ["podman", "run"]]
    assert len(run) == 1 and f"{hd}:/shared" in run[0]  # the size is the mount's business, not the container's

    other = "nfs.example:/export/vol_old"
    assert a.put("/v1/workloads/wl_nosize", json={"image": "busybox", "volumes": [
        {"source": other, "target": "/shared"}]}).status_code == 201
    body = a.wait_phase("wl_nosize", "failed")
    assert body["message"].startswith(f"mount {other}: mount_command uses {{size_gb}}"), body
    assert "no size_gb" in body["message"], body
    assert len(standins.calls("mount")) == 1  # nothing ran for it ...
    assert len([c for c in standins.calls() if c[:2] == ["podman", "run"]]) == 1  # ... and no container started


def test_mount_that_does_not_mount_stops_the_workload(real_agent, standins):
    open(os.path.join(standins.state, "mount-noop"), "w").close()
    a = real_agent()
    assert a.put("/v1/workloads/wl_nomount", json=ROCM_SPEC).status_code == 201
    body = a.wait_phase("wl_nomount", "failed")
    assert "not a mount point" in body["message"]
    assert standins.calls("mount")  # the command ran and exited 0 ...
    assert not [c for c in standins.calls() if c[:2] == ["podman", "run"]]  # ... but no container started


def test_failures_carry_the_tools_message(real_agent, standins):
    a = real_agent()
    cases = {
        "wl_fp": ({"image": "registry.example/fail-pull:1"}, "manifest unknown"),
        "wl_fm": ({"image": "busybox", "volumes": [{"source": "nfs:/fail-mount", "target": "/shared"}]},
                  "Connection refused"),
        "wl_fs": ({"image": "registry.example/fail-start:1"}, "/dev/kfd"),
    }
    for wid, (spec, _) in cases.items():
        assert a.put(f"/v1/workloads/{wid}", json=spec).status_code == 201
    for wid, (_, words) in cases.items():
        body = a.wait_phase(wid, "failed")
        assert words in body["message"], body
        # No container ran: an exit second, and no status.
        assert body["exit_code"] is None, body
        assert body["created_at"] <= body["exited_at"] <= a.get("/v1/workloads").json()["now"], body
    assert "exit status 125" in a.get("/v1/workloads/wl_fp").json()["message"]


def test_container_exit_and_disappearance_are_noticed(real_agent, standins):
    a = real_agent()
    for wid in ("wl_ex", "wl_gone"):
        assert a.put(f"/v1/workloads/{wid}", json={"image": "busybox"}).status_code == 201
        a.wait_phase(wid, "running")
    standins.set_container("wl_ex", "exited 3")
    standins.set_container("wl_gone", None)
    assert "status 3" in a.wait_phase("wl_ex", "exited")["message"]
    assert "gone" in a.wait_phase("wl_gone", "failed")["message"]


def go_time(t, offset_min):
    """t as podman prints a time: Go's default format, with a zone name."""
    sign, (hh, mm) = "+" if offset_min >= 0 else "-", divmod(abs(offset_min), 60)
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t + offset_min * 60))
    return f"{local}.123456789 {sign}{hh:02d}{mm:02d} XYZT"


def rfc3339(t, offset_min):
    """t as docker prints a time: RFC 3339 with nanoseconds."""
    sign, (hh, mm) = "+" if offset_min >= 0 else "-", divmod(abs(offset_min), 60)
    local = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t + offset_min * 60))
    return f"{local}.987654321" + ("Z" if offset_min == 0 else f"{sign}{hh:02d}:{mm:02d}")


@pytest.mark.parametrize("runtime,spell,offset_min", [
    ("podman", go_time, 60), ("podman", go_time, -300), ("docker", rfc3339, 0), ("docker", rfc3339, -270),
])
def test_an_exit_is_reported_at_the_runtimes_finish_time(real_agent, standins, runtime, spell, offset_min):
    a = real_agent(runtime=runtime)
    assert a.put("/v1/workloads/wl_fin", json={"image": "busybox"}).status_code == 201
    ended = a.wait_phase("wl_fin", "running")["created_at"]
    # Noticed two seconds or more after it ended, so a time taken from the
    # notice could not pass for the runtime's.
    poll(lambda: time.time() >= ended + 2, 10, "two seconds to pass")
    standins.set_container("wl_fin", f"exited 3 {spell(ended, offset_min)}")
    body = a.wait_phase("wl_fin", "exited")
    assert body["message"] == "the container exited with status 3"
    assert (body["exit_code"], body["exited_at"]) == (3, ended)
    assert body["updated_at"] >= ended + 2  # when the agent noticed
    with open(os.path.join(a.state_dir, "workloads", "wl_fin.json")) as f:
        rec = json.load(f)
    assert (rec["exit_code"], rec["exited_at"]) == (3, ended)


def test_an_exit_without_a_usable_finish_time_is_placed_when_noticed(real_agent, standins):
    a = real_agent()
    ids = ("wl_notime", "wl_future", "wl_never", "wl_gone")
    for i, wid in enumerate(ids):
        assert a.put(f"/v1/workloads/{wid}", json={"image": "busybox", "gpus": [i]}).status_code == 201
        a.wait_phase(wid, "running")
    before = int(time.time())
    standins.set_container("wl_notime", "exited 5")
    standins.set_container("wl_future", "exited 2 2100-01-01T00:00:00Z")  # never past the notice
    standins.set_container("wl_never", "exited 1 " + PODMAN_ZERO)
    standins.set_container("wl_gone", None)
    got = {wid: a.wait_phase(wid, {"exited", "failed"}) for wid in ids}
    now = a.get("/v1/workloads").json()["now"]
    after = int(time.time())
    assert [(got[w]["phase"], got[w]["exit_code"]) for w in ids] == [
        ("exited", 5), ("exited", 2), ("exited", 1), ("failed", None)]
    assert "gone" in got["wl_gone"]["message"]
    for body in got.values():
        assert before - 1 <= body["exited_at"] <= min(now, after + 1), body


def test_restart_keeps_containers_and_does_not_rerun_them(real_agent, standins):
    a = real_agent()
    assert a.put("/v1/workloads/wl_keep", json=ROCM_SPEC).status_code == 201
    a.wait_phase("wl_keep", "running")
    a.stop()  # SIGTERM: the container must keep running
    assert standins.container("wl_keep") == "running 0 " + PODMAN_ZERO
    assert not [c for c in standins.calls() if c[1:2] in (["stop"], ["rm"]) or c[0] == "umount"]
    runs = len([c for c in standins.calls() if c[:2] == ["podman", "run"]])
    mounts = len(standins.calls("mount"))
    a.start()
    # Re-checked at once, found running, left alone.
    poll(lambda: len([c for c in standins.calls() if c[:2] == ["podman", "container"]]) >= 2, 10, "re-check")
    assert a.get("/v1/workloads/wl_keep").json()["phase"] == "running"
    assert len([c for c in standins.calls() if c[:2] == ["podman", "run"]]) == runs
    assert len(standins.calls("mount")) == mounts


def test_an_env_file_left_by_a_run_cut_short_is_removed(real_agent, standins):
    # The agent dies while `run` has made the container but not returned:
    # the env file, secrets and all, is still on disk. The restarted agent
    # finds the container running and keeps it, and removes the file; so
    # does the workload's removal.
    a = real_agent()
    spec = {"image": "registry.example/slow-run:1", "env": {"HF_TOKEN": SECRET}, "secret_env": ["HF_TOKEN"]}
    assert a.put("/v1/workloads/wl_cut", json=spec).status_code == 201
    poll(lambda: standins.container("wl_cut"), 10, "the container to be made")
    assert os.path.exists(env_file(a, "wl_cut"))
    a.kill()
    a.start()
    a.wait_phase("wl_cut", "running")
    assert len([c for c in standins.calls() if c[:2] == ["podman", "run"]]) == 1  # kept, not run again
    assert not os.path.exists(env_file(a, "wl_cut"))
    # A file left behind some other way goes with the workload.
    with open(env_file(a, "wl_cut"), "w") as f:
        f.write(f"HF_TOKEN={SECRET}\n")
    assert a.delete("/v1/workloads/wl_cut").status_code == 200
    poll(lambda: standins.container("wl_cut") is None, 15, "the container to be removed")
    poll(lambda: not os.path.exists(env_file(a, "wl_cut")), 15, "the env file to be removed")


def test_shared_source_is_mounted_once_and_unmounted_last(real_agent, standins):
    a = real_agent()
    spec1 = {**ROCM_SPEC, "gpus": [0]}
    spec2 = {**ROCM_SPEC, "gpus": [1], "image": "rocm/pytorch:2.4"}
    assert a.put("/v1/workloads/wl_s1", json=spec1).status_code == 201
    a.wait_phase("wl_s1", "running")
    assert a.put("/v1/workloads/wl_s2", json=spec2).status_code == 201
    a.wait_phase("wl_s2", "running")
    assert len(standins.calls("mount")) == 1
    assert a.delete("/v1/workloads/wl_s1").status_code == 200
    poll(lambda: standins.container("wl_s1") is None, 15, "wl_s1 removed")
    poll(lambda: not os.path.exists(os.path.join(a.state_dir, "workloads", "wl_s1.json")), 10, "wl_s1 record gone")
    assert standins.calls("umount") == []  # wl_s2 still uses it
    assert a.delete("/v1/workloads/wl_s2").status_code == 200
    poll(lambda: standins.calls("umount"), 15, "the last unmount")
    assert standins.calls("umount") == [["umount", standins.host_dir(SRC)]]


def test_delete_interrupts_a_slow_pull(real_agent, standins):
    a = real_agent()
    assert a.put("/v1/workloads/wl_slow", json={"image": "registry.example/slow-pull:1"}).status_code == 201
    poll(lambda: ["podman", "pull", "registry.example/slow-pull:1"] in standins.calls(), 10, "the pull to start")
    assert a.delete("/v1/workloads/wl_slow").status_code == 200
    # Gone well before the stand-in's 60-second pull would end.
    poll(lambda: not os.path.exists(os.path.join(a.state_dir, "workloads", "wl_slow.json")), 15, "removal")
    assert not [c for c in standins.calls() if c[:2] == ["podman", "run"]]


def test_stop_during_a_pull_resumes_it_after_restart(real_agent, standins):
    a = real_agent()
    assert a.put("/v1/workloads/wl_resume", json={"image": "registry.example/slow-pull:1"}).status_code == 201
    poll(lambda: standins.calls("podman"), 10, "the pull to start")
    a.stop()  # interrupts the pull; the workload stays in pulling on disk
    assert a.options["runtime"] == "podman"
    a.start()
    assert a.get("/v1/workloads/wl_resume").json()["phase"] == "pulling"
    poll(lambda: standins.calls("podman").count(["podman", "pull", "registry.example/slow-pull:1"]) >= 2, 10,
         "the pull to resume")


def test_container_output_is_collected_into_the_log(real_agent, standins):
    a = real_agent()
    assert a.put("/v1/workloads/wl_out", json={"image": "busybox"}).status_code == 201
    a.wait_phase("wl_out", "running")
    now = time.time()
    stamp = lambda dt: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now + dt)) + ".250000000Z"
    out = os.path.join(standins.state, "gpurent-wl_out.out")
    with open(os.path.join(standins.state, "gpurent-wl_out.err"), "w") as f:
        f.write(f"{stamp(0)} warning: low memory\n{stamp(2)} Traceback\n")
    with open(out, "w") as f:
        f.write(f"{stamp(0)} epoch 1\n{stamp(0)} epoch 1 again\nnot a timestamped line\n{stamp(1)} epoch 2\n")

    def lines():
        body = a.get("/v1/workloads/wl_out/logs").json()
        return body["lines"] if len(body["lines"]) >= 5 else None
    want = [("stdout", "epoch 1"), ("stdout", "epoch 1 again"), ("stdout", "epoch 2"),
            ("stderr", "warning: low memory"), ("stderr", "Traceback")]
    got = poll(lines, 20, "the container's output in the log")
    assert sorted((l["stream"], l["text"]) for l in got) == sorted(want)
    epoch1 = [l for l in got if l["text"] == "epoch 1"][0]
    assert epoch1["t"] == int(now) * 1000 + 250 and epoch1["stream"] == "stdout"
    # Polled again (the tool prints all of it each time): nothing twice.
    polls = lambda: len(open(standins.log + ".logs").read().splitlines())
    seen = polls()
    poll(lambda: polls() >= seen + 2, 20, "two more polls of logs")
    again = a.get("/v1/workloads/wl_out/logs").json()["lines"]
    assert sorted((l["stream"], l["text"]) for l in again) == sorted(want)
    with open(standins.log + ".logs") as f:
        first = f.readline().rstrip("\n").split(SEP)
    assert first[:4] == ["podman", "logs", "--timestamps", "--since"]
    assert first[4].isdigit() and first[5] == "gpurent-wl_out" and len(first) == 6


SECRET = "tok-9f2e-never-shown"


def test_command_working_dir_and_secret_env(real_agent, standins):
    """command goes after the image, working_dir is --workdir, and a
    secret_env value is in the env file only: never on the command line,
    in GET /v1/workloads (shown "***"), or the agent's log."""
    a = real_agent()
    spec = {"image": "registry.example.com:5000/team/train:1", "env": {"HF_TOKEN": SECRET, "MODE": "fast"},
            "secret_env": ["HF_TOKEN"], "command": ["python3", "train.py", "--lr", "3e-4"],
            "working_dir": "/shared/proj"}
    r = a.put("/v1/workloads/wl_cmd", json=spec)
    assert r.status_code == 201, r.text
    assert SECRET not in r.text
    a.wait_phase("wl_cmd", "running")
    run = [c for c in standins.calls() if c[:2] == ["podman", "run"]]
    assert run == [[
        "podman", "run", "--detach", "--name", "gpurent-wl_cmd", "--label", "gpurent.workload=wl_cmd",
        "--pull", "never", *limits(1), "--env-file", env_file(a, "wl_cmd"), "--workdir", "/shared/proj",
        "registry.example.com:5000/team/train:1", "python3", "train.py", "--lr", "3e-4"]]
    assert standins.env_file("wl_cmd") == (f"HF_TOKEN={SECRET}\nMODE=fast\n", "600")
    assert not os.path.exists(env_file(a, "wl_cmd"))
    one = a.get("/v1/workloads/wl_cmd").json()
    assert one["env"] == {"HF_TOKEN": "***", "MODE": "fast"}
    assert one["command"] == spec["command"] and one["working_dir"] == "/shared/proj"
    assert SECRET not in a.get("/v1/workloads").text
    # The same PUT again is the same workload; a different secret is not.
    assert a.put("/v1/workloads/wl_cmd", json=spec).status_code == 200
    assert a.put("/v1/workloads/wl_cmd", json={**spec, "env": {"HF_TOKEN": "other", "MODE": "fast"}}).status_code == 409
    # A run that fails says why without the secret, and leaves no env file.
    bad = {**spec, "image": "registry.example/fail-start:1", "command": None}
    assert a.put("/v1/workloads/wl_bad", json=bad).status_code == 201
    body = a.wait_phase("wl_bad", "failed")
    assert "/dev/kfd" in body["message"] and SECRET not in str(body)
    assert not os.path.exists(env_file(a, "wl_bad"))
    assert SECRET not in a.stderr_text()
    # Bad members are refused naming them.
    for extra, field in (({"command": []}, "command"), ({"command": "sh"}, "command"), ({"command": [1]}, "command"),
                         ({"working_dir": "rel"}, "working_dir"), ({"working_dir": "/a/../b"}, "working_dir"),
                         ({"secret_env": ["NOPE"]}, "secret_env"), ({"secret_env": "HF_TOKEN"}, "secret_env")):
        r = a.put("/v1/workloads/wl_x", json={**spec, **extra})
        assert r.status_code == 400 and r.json()["error"]["field"] == field, (extra, r.text)


# ---------------------------------------------------------------- multi-node

@pytest.fixture(scope="module")
def rank_key(tmp_path_factory):
    """An ed25519 key pair made by ssh-keygen: the instance's identity, and
    its public half as every rank's host key (any valid key will do)."""
    if not shutil.which("ssh-keygen"):
        pytest.skip("needs ssh-keygen")
    path = os.path.join(str(tmp_path_factory.mktemp("rankkey")), "id")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path], check=True, timeout=30)
    with open(path) as f:
        private = f.read()
    with open(path + ".pub") as f:
        public = " ".join(f.read().split()[:2])
    return private, public


def cluster_spec(key, rank=1, addresses=("10.0.0.5", "fd00::6", "gpu-9.example"), **extra):
    private, public = key
    hosts = [{"name": f"rank{i}", "address": addr, "ssh_port": 2222, "user": f"ins_m-{i}", "slots": 2,
              "host_key": public} for i, addr in enumerate(addresses)]
    # No env: how the spec's env reaches podman (words or a file) is not
    # what these tests are about.
    return {"image": "rocm/pytorch:2.3-rocm6.2", "gpus": [0, 1], "stack": "ROCm",
            "ports": [{"container": 8888, "host": 30007}],
            "cluster": {"rank": rank, "hosts": hosts, "identity": private}, **extra}


def mode(path):
    return os.stat(path).st_mode & 0o777


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_multi_node_command_line_and_cluster_files(real_agent, standins, rank_key, runtime):
    a = real_agent(runtime=runtime, shm_size="128g")
    spec = cluster_spec(rank_key)
    r = a.put("/v1/workloads/wl_mn", json=spec)
    assert r.status_code == 201, r.text
    a.wait_phase("wl_mn", "running")
    cdir = os.path.join(a.state_dir, "cluster", "wl_mn")
    run = [c for c in standins.calls() if c[:2] == [runtime, "run"]]
    # A large /dev/shm (shm_size), host networking (so no -p: the ports are
    # the host's), every RDMA node sorted (not the by-path directory), pinned
    # memory, /etc/hosts entries for the ranks with an IP, the files read-only.
    assert run == [[
        runtime, "run", "--detach", "--name", "gpurent-wl_mn", "--label", "gpurent.workload=wl_mn",
        "--pull", "never", *limits(2), "--device", "/dev/kfd", "--device", "/dev/dri/renderD128",
        "--device", "/dev/dri/renderD129", "--group-add", "44", "--group-add", "109", "--shm-size", "128g",
        "--network", "host",
        "--device", f"{standins.rdma_dir}/rdma_cm", "--device", f"{standins.rdma_dir}/uverbs0",
        "--device", f"{standins.rdma_dir}/uverbs1",
        "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1",
        "--add-host", "rank0:10.0.0.5", "--add-host", "rank1:fd00::6",
        "--volume", f"{cdir}/hostfile:/etc/gpurent/hostfile:ro,Z",
        "--volume", f"{cdir}/hostfile.mpi:/etc/gpurent/hostfile.mpi:ro,Z",
        "--volume", f"{cdir}/ssh:/root/.ssh:ro,Z",
        image(runtime, "rocm/pytorch:2.3-rocm6.2")]]
    # The private key is on no command line.
    assert rank_key[0].split("\n")[1] not in open(standins.log).read()

    # The files, made before the run, in a 0700 directory of the workload.
    assert mode(cdir) == 0o700 and mode(os.path.join(a.state_dir, "cluster")) == 0o700
    with open(os.path.join(cdir, "hostfile")) as f:
        assert f.read() == "rank0 slots=2\nrank1 slots=2\nrank2 slots=2\n"
    with open(os.path.join(cdir, "hostfile.mpi")) as f:
        assert f.read() == "rank0:2\nrank1:2\nrank2:2\n"
    pub = rank_key[1]
    with open(os.path.join(cdir, "ssh", "known_hosts")) as f:
        assert f.read() == f"[10.0.0.5]:2222 {pub}\n[fd00::6]:2222 {pub}\n[gpu-9.example]:2222 {pub}\n"
    with open(os.path.join(cdir, "ssh", "config")) as f:
        config = f.read()
    for i, addr in enumerate(("10.0.0.5", "fd00::6", "gpu-9.example")):
        assert (f"Host rank{i}\n    HostName {addr}\n    Port 2222\n    User ins_m-{i}\n"
                "    IdentityFile ~/.ssh/id_ed25519\n    IdentitiesOnly yes\n    StrictHostKeyChecking yes\n"
                "    UserKnownHostsFile ~/.ssh/known_hosts\n") in config
    with open(os.path.join(cdir, "ssh", "id_ed25519")) as f:
        assert f.read() == rank_key[0]
    assert mode(os.path.join(cdir, "ssh")) == 0o700
    assert mode(os.path.join(cdir, "ssh", "id_ed25519")) == 0o600
    assert mode(os.path.join(cdir, "ssh", "config")) == 0o600
    # ssh-keygen reads the key back: it is a working OpenSSH private key.
    p = subprocess.run(["ssh-keygen", "-y", "-f", os.path.join(cdir, "ssh", "id_ed25519")], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.split()[:2] == pub.split(), p.stderr

    # The identity is in the record (0600, so a restart can write the files
    # again) and in no reply.
    record = os.path.join(a.state_dir, "workloads", "wl_mn.json")
    assert mode(record) == 0o600 and mode(os.path.dirname(record)) == 0o700
    with open(record) as f:
        assert json.load(f)["spec"]["cluster"] == spec["cluster"]
    for path in ("/v1/workloads", "/v1/workloads/wl_mn"):
        text = a.get(path).text
        assert "PRIVATE KEY" not in text and "identity" not in text
    assert "PRIVATE KEY" not in a.stderr_text()
    # The same PUT again is the same workload; another identity is not.
    assert a.put("/v1/workloads/wl_mn", json=spec).status_code == 200
    other = dict(spec, cluster=dict(spec["cluster"], rank=2))
    assert a.put("/v1/workloads/wl_mn", json=other).status_code == 409

    # The files go with the workload.
    assert a.delete("/v1/workloads/wl_mn").status_code == 200
    poll(lambda: not os.path.exists(record), 15, "the workload's removal")
    assert not os.path.exists(cdir)


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_single_node_gets_none_of_the_multi_node_additions(real_agent, standins, runtime):
    a = real_agent(runtime=runtime)
    spec = {"image": "rocm/pytorch:2.3-rocm6.2", "gpus": [0, 1], "stack": "ROCm",
            "ports": [{"container": 8888, "host": 30007}]}
    assert a.put("/v1/workloads/wl_one", json=spec).status_code == 201
    a.wait_phase("wl_one", "running")
    run = [c for c in standins.calls() if c[:2] == [runtime, "run"]]
    # The ROCm groups (every ROCm container has them), a /dev/shm its cards'
    # collectives fit in (NCCL/RCCL fail in the runtimes' 64 MB), the
    # published port, and nothing of host networking, RDMA, memlock or
    # cluster files.
    assert run == [[
        runtime, "run", "--detach", "--name", "gpurent-wl_one", "--label", "gpurent.workload=wl_one",
        "--pull", "never", *limits(2), "--device", "/dev/kfd", "--device", "/dev/dri/renderD128",
        "--device", "/dev/dri/renderD129", "--group-add", "44", "--group-add", "109", "--shm-size", "64g",
        "-p", "30007:8888/tcp", image(runtime, "rocm/pytorch:2.3-rocm6.2")]]
    assert not os.path.exists(os.path.join(a.state_dir, "cluster"))
    # A container without cards keeps the runtime's own /dev/shm.
    assert a.put("/v1/workloads/wl_none", json={"image": "busybox", "gpus": []}).status_code == 201
    a.wait_phase("wl_none", "running")
    run = [c for c in standins.calls() if c[:2] == [runtime, "run"]][-1]
    assert "gpurent-wl_none" in run and "--shm-size" not in run, run


def test_one_host_cluster_gets_files_but_no_flags(real_agent, standins, rank_key):
    a = real_agent()
    spec = cluster_spec(rank_key, rank=0, addresses=("10.0.0.5",))
    assert a.put("/v1/workloads/wl_1h", json=spec).status_code == 201
    a.wait_phase("wl_1h", "running")
    run = [c for c in standins.calls() if c[:2] == ["podman", "run"]][0]
    for word in ("--network", "--cap-add", "--ulimit", "--add-host"):
        assert word not in run
    assert run[run.index("--shm-size") + 1] == "64g"  # as every container with cards
    assert "30007:8888/tcp" in run
    cdir = os.path.join(a.state_dir, "cluster", "wl_1h")
    assert run[-2] == f"{cdir}/ssh:/root/.ssh:ro,Z"


def test_group_and_rdma_lookups_that_find_nothing(real_agent, standins, rank_key):
    # No such groups, no RDMA directory: no --group-add, no RDMA --device,
    # and the multi-node container still starts.
    empty = os.path.join(standins.root, "group-empty")
    open(empty, "w").close()
    a = real_agent(group_file=empty, rdma_device_dir=os.path.join(standins.root, "none"))
    assert a.put("/v1/workloads/wl_bare", json=cluster_spec(rank_key)).status_code == 201
    a.wait_phase("wl_bare", "running")
    run = [c for c in standins.calls() if c[:2] == ["podman", "run"]][0]
    assert "--group-add" not in run
    assert run[run.index("--network"):run.index("--cap-add")] == ["--network", "host"]
    assert run[run.index("--shm-size") + 1] == "64g"  # the default


@pytest.mark.parametrize("run_args, shm", [
    ("--ipc=host", False), ("--ipc none", False), ("--ipc=container:other", False),
    ("--ipc=host --ipc=private", True), ("--ipc shareable", True), ("--ulimit stack=67108864", True)])
def test_no_shm_size_when_run_args_choose_the_ipc_namespace(real_agent, standins, rank_key, run_args, shm):
    # podman refuses --shm-size beside an IPC namespace not the container's
    # own ("cannot set shmsize when running in the host IPC Namespace") and
    # would start no rank; there /dev/shm is the host's or another's anyway.
    a = real_agent(run_args=run_args)
    assert a.put("/v1/workloads/wl_ipc", json=cluster_spec(rank_key)).status_code == 201
    a.wait_phase("wl_ipc", "running")
    run = [c for c in standins.calls() if c[:2] == ["podman", "run"]][0]
    assert ("--shm-size" in run) == shm, run
    assert run[-1 - len(run_args.split()):-1] == run_args.split()


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_a_multi_node_ranks_published_ports_are_relayed_into_its_container(real_agent, standins, rank_key,
                                                                           tmp_path):
    # A multi-node rank has the host's network, where -p means nothing: the
    # agent listens on the published host port itself and relays to the
    # container port, to a socket of the container's own processes only.
    www = tmp_path / "www"
    www.mkdir()
    (www / "index.html").write_text("in the container\n")
    inside, outside = free_port(), free_port()
    # The "container": a web server in a pid namespace of its own, on the
    # host's network; and a server of the host's on the other port.
    box = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                            str(inside)], cwd=www, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    host = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(outside)], cwd=www,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child = poll(lambda: subprocess.run(["pgrep", "-P", str(box.pid)], capture_output=True,
                                            text=True).stdout.split(), 20, "the container's process")
        with open(os.path.join(standins.state, "gpurent-wl_pub.pid"), "w") as f:
            f.write(child[0] + "\n")
        first, last = free_range(2)
        a = real_agent(publish_port_range=f"{first}-{last}")
        spec = cluster_spec(rank_key, ports=[{"container": inside, "host": first},
                                             {"container": outside, "host": first + 1}])
        assert a.put("/v1/workloads/wl_pub", json=spec).status_code == 201
        a.wait_phase("wl_pub", "running")
        run = [c for c in standins.calls() if c[:2] == ["podman", "run"]][0]
        assert "--network" in run and "-p" not in run

        def served():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{first}/index.html", timeout=5).read()
            except OSError:
                return None
        assert poll(served, 20, "the published port") == b"in the container\n"
        assert ["podman", "container", "inspect", "--format", "{{.State.Pid}}", "gpurent-wl_pub"] in standins.calls()
        # The host's own server is no process of the container: closed unanswered.
        with socket.create_connection(("127.0.0.1", first + 1), timeout=10) as c:
            c.settimeout(10)
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            try:
                assert c.recv(100) == b""
            except ConnectionResetError:
                pass  # closed with the request unread
    finally:
        for p in (box, host):
            p.kill()
            p.wait(timeout=30)


def test_a_rocm_card_without_a_render_node_is_not_started(real_agent, standins, tmp_path):
    # A topology that lacks the card: the workload fails saying why, rather
    # than run with every card's render node.
    a = real_agent(kfd_topology_dir=str(tmp_path / "no-kfd"))
    assert a.put("/v1/workloads/wl_nokfd", json=ROCM_SPEC).status_code == 201
    w = a.wait_phase("wl_nokfd", "failed")
    assert "cannot read the KFD topology" in w["message"], w
    assert not [c for c in standins.calls() if c[:2] == ["podman", "run"]]


def test_a_containers_limits_are_its_cards_share_of_the_host(real_agent, standins):
    # Unset, the share is the host's CPUs and memory times its cards over
    # the node's (MI450 inventory: 8 cards); 0 processes means no cap.
    a = real_agent(container_millicpus_per_card="0", container_memory_mb_per_card="0", container_pids_limit="0",
                   container_log_max_mb="0")
    assert a.put("/v1/workloads/wl_share", json={"image": "busybox", "gpus": [0, 1]}).status_code == 201
    a.wait_phase("wl_share", "running")
    run = [c for c in standins.calls() if c[:2] == ["podman", "run"]][0]
    cpus = os.sysconf("SC_NPROCESSORS_ONLN") * 1000 * 2 // 8
    mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024) * 2 // 8
    assert run[9:13] == ["--cpus", f"{cpus // 1000}.{cpus % 1000:03d}", "--memory", f"{mem}m"], run
    assert "--pids-limit" not in run and "--log-opt" not in run and "--log-driver" not in run


def test_cpus_per_card_past_the_hosts_cpus_are_capped_at_them(real_agent, standins):
    # docker refuses --cpus over the host's CPUs, so an 8-card container
    # under a per-card setting made for a bigger host would never start.
    a = real_agent(runtime="docker", container_millicpus_per_card="10000000")
    assert a.put("/v1/workloads/wl_many", json={"image": "busybox", "gpus": list(range(8))}).status_code == 201
    a.wait_phase("wl_many", "running")
    run = [c for c in standins.calls() if c[:2] == ["docker", "run"]][0]
    assert run[run.index("--cpus") + 1] == f"{os.sysconf('SC_NPROCESSORS_ONLN')}.000", run


def flood_then_wait(real_agent, standins, wid, out, err=()):
    """Runs wid, writes its output (lines (seconds from now, text) per
    stream, each dated at half past that second), then an "after the
    flood" line a second past the last, and waits for that line to be
    collected."""
    a = real_agent()
    assert a.put(f"/v1/workloads/{wid}", json={"image": "busybox"}).status_code == 201
    a.wait_phase(wid, "running")
    now = int(time.time())
    stamp = lambda dt: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now + dt)) + ".500000000Z"
    out = list(out)
    out.append((out[-1][0] + 1, "after the flood"))
    for stream, lines in (("out", out), ("err", err)):
        with open(os.path.join(standins.state, f"gpurent-{wid}.{stream}"), "w") as f:
            f.writelines(f"{stamp(dt)} {text}\n" for dt, text in lines)

    def after():
        body = a.get(f"/v1/workloads/{wid}/logs?tail=5").json()
        return any(l["text"] == "after the flood" for l in body["lines"]) or None
    poll(after, 30, "the line after the flood")


def test_a_second_of_output_over_the_poll_buffer_does_not_stop_the_log(real_agent, standins):
    # --since has whole seconds and a poll keeps 1 MiB a stream: a second
    # holding more used to be read again from its start at every poll, and
    # no later line was ever collected. Its excess is given up instead.
    flood_then_wait(real_agent, standins, "wl_flood",
                    ((0, f"flood line {i:05d} " + "x" * 80) for i in range(12000)))


def test_a_quiet_stream_does_not_hold_the_other_back(real_agent, standins):
    # Both streams are read from the older mark: stderr's one early line
    # kept every poll reading stdout from that second, which held more than
    # a poll keeps, so stdout's later lines never came.
    flood_then_wait(real_agent, standins, "wl_quiet",
                    ((second, f"line {second}-{i:05d} " + "x" * 80) for second in (1, 2, 3) for i in range(6000)),
                    err=[(0, "one early warning")])
