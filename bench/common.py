"""bench/common.py: what the Python benchmarks share: a control plane with a
simulated fleet started and stopped around a measurement, and readings of a
process's CPU time and memory from /proc. Not a test."""
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User plus system CPU seconds of pid so far (fields 14 and 15 of stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def cpu_seconds_by_thread(pid):
    """{thread name: user plus system CPU seconds so far} of pid's threads,
    those of one name summed (gpurentd names its loops' threads)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[name] = out.get(name, 0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def bytes_written(pid):
    """Bytes pid has handed to write(2) and its kin so far (wchar of
    /proc/PID/io): for the daemon, nearly all of it the database's WAL and
    checkpoints."""
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def machine_busy_seconds():
    """CPU seconds every core of the machine has spent busy so far (all of
    /proc/stat's cpu line but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def memory_kb(pid):
    """{"VmRSS": now, "VmHWM": peak} resident memory of pid, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def wait_for(pred, timeout, what, every=0.2):
    """pred()'s first true value, polling every `every` seconds; exits the
    benchmark if it has none after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


class Cloud:
    """gpurentd on a free loopback port with a database in a new temporary
    directory, and one `gpurent-agent sim-fleet` of `nodes` 8-card MI450
    nodes registered with it through the admin API, as newcomers and tests
    start them. Use as a context manager: on entry both run and every node is
    ready with its cards recorded; on exit both get SIGTERM and the directory
    is removed unless keep.

    Attributes once entered: work (the directory), db, url, port, admin_key,
    daemon and fleet (Popen), daemon_log (gpurentd's stderr, open for
    reading), registered_s (fleet start to "fleet ready") and ready_s (fleet
    start to every node ready)."""

    def __init__(self, gpurentd, agent, nodes, daemon_options, fleet_options, register_timeout=600, keep=False,
                 prefix="gpurent-bench-"):
        self.gpurentd, self.agent, self.nodes = gpurentd, agent, nodes
        self.daemon_options, self.fleet_options = daemon_options, fleet_options
        self.register_timeout, self.keep = register_timeout, keep
        self.work = tempfile.mkdtemp(prefix=f"{prefix}{nodes}-")
        self.db = os.path.join(self.work, "gpurent.db")
        self.daemon = self.fleet = self.fleet_dir = None

    def _open(self, name):
        return open(os.path.join(self.work, name), "w+")

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self):
        self.daemon_log, dout = self._open("gpurentd.log"), self._open("gpurentd.out")
        # A free loopback port chosen here and /readyz polled, so the daemon
        # may run at any log_level (no log line is waited for).
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [self.gpurentd, "serve", "--listen", f"127.0.0.1:{self.port}", "--db", self.db]
        for k, v in self.daemon_options.items():
            cmd += ["-o", f"{k}={v}"]
        self.daemon = subprocess.Popen(cmd, stdout=dout, stderr=self.daemon_log, stdin=subprocess.DEVNULL)

        def ready():
            if self.daemon.poll() is not None:
                raise SystemExit(f"gpurentd exited {self.daemon.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError):
                return False
        wait_for(ready, 30, "gpurentd to be ready", 0.05)
        wait_for(lambda: dout.seek(0) == 0 and dout.read().strip(), 10, "the admin key on stdout", 0.05)
        dout.seek(0)
        self.admin_key = dout.read().split()[-1]  # printed once, alone on the last line
        key_file = os.path.join(self.work, "admin.key")
        with open(key_file, "w") as f:
            f.write(self.admin_key + "\n")

        fout = self._open("fleet.out")
        # The sim fleet stands in for `nodes` hosts, each of which keeps its
        # workload records on a disk of its own (a file created, fsynced and
        # renamed per change: state.c). Here they would share one disk and
        # the two cores with the daemon being measured, and the kernel's
        # inode allocation for those files cost the fleet more CPU than the
        # daemon used. So the fleet's state goes to tmpfs where the machine
        # has one; the daemon's database stays on disk in self.work.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.fleet_dir = tempfile.mkdtemp(prefix="gpurent-bench-fleet-", dir=shm) if shm \
            else os.path.join(self.work, "fleet")
        cmd = [self.agent, "sim-fleet", "--control-plane", self.url, "--admin-key-file", key_file,
               "--model", "MI450", "--nodes", str(self.nodes), "--cards", "8", "--fabric", "bench",
               "--region", "local", "--listen", "127.0.0.1:0", "--state-dir", self.fleet_dir,
               "-o", "ssh_listen="]  # benchmarks measure the control plane, not SSH
        for k, v in self.fleet_options.items():
            cmd += ["-o", f"{k}={v}"]
        t0 = time.monotonic()
        self.fleet = subprocess.Popen(cmd, stdout=fout, stderr=self._open("fleet.log"), stdin=subprocess.DEVNULL)

        def fleet_ready():
            if self.fleet.poll() is not None:
                raise SystemExit(f"sim-fleet exited {self.fleet.returncode}")
            fout.seek(0)
            return "fleet ready:" in fout.read()
        wait_for(fleet_ready, self.register_timeout, "the fleet to register")
        self.registered_s = time.monotonic() - t0
        fout.seek(0)
        self.fleet_summary = [line for line in fout.read().splitlines() if line.startswith("fleet ready:")][0]

        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            wait_for(lambda: con.execute("SELECT count(*) FROM node_states WHERE state = 'ready'").fetchone()[0]
                     == self.nodes and con.execute("SELECT count(*) FROM node_cards").fetchone()[0]
                     == 8 * self.nodes, self.register_timeout, f"{self.nodes} nodes to be ready")
        finally:
            con.close()
        self.ready_s = time.monotonic() - t0

    def __exit__(self, *exc):
        for p in (self.fleet, self.daemon):
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if self.keep:
            print(f"kept {self.work} (the fleet's state: {self.fleet_dir})", file=sys.stderr)
        else:
            shutil.rmtree(self.work, ignore_errors=True)
            if self.fleet_dir:
                shutil.rmtree(self.fleet_dir, ignore_errors=True)
        return False
