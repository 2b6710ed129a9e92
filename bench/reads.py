#!/usr/bin/env python3
"""bench/reads.py: gpurentd's hot reads against nginx serving the very same
bytes, on loopback, in one run (issue 15).

For each fleet size it starts a fresh gpurentd and sim-fleet (bench/common.py),
launches one instance with the admin's key, fetches the replies of
GET /v1/gpu-types and GET /v1/instances/{id}, and has nginx serve those bytes
from files on another loopback port. Then wrk (-t2 -c64, --seconds each) runs
three interleaved rounds per request: gpurentd, nginx, gpurentd, nginx ...
The bearer key goes to both (nginx ignores it). It prints one Markdown table
row per figure (figure | gpurentd | nginx | ratio | load average | command |
date) for BENCHMARKS.md; bench/table.py puts them there.

    python3 bench/reads.py --nodes 100 1000 --seconds 10
"""
import argparse
import datetime
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from common import Cloud, wait_for

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port, method, path, key, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


class Nginx:
    """nginx on a free loopback port serving files under root, as JSON."""

    def __init__(self, files):
        self.dir = tempfile.mkdtemp(prefix="gpurent-bench-nginx-")
        os.chmod(self.dir, 0o755)  # nginx's workers drop root's rights
        self.port = free_port()
        for path, data in files.items():
            full = os.path.join(self.dir, "www", path.lstrip("/"))
            os.makedirs(os.path.dirname(full), mode=0o755, exist_ok=True)
            with open(full, "wb") as f:
                f.write(data)
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""daemon off; worker_processes 2; pid {self.dir}/nginx.pid; error_log {self.dir}/error.log;
events {{ worker_connections 1024; }}
http {{ access_log off; default_type application/json; keepalive_requests 1000000;
  client_body_temp_path {self.dir}/tmp; proxy_temp_path {self.dir}/tmp; fastcgi_temp_path {self.dir}/tmp;
  uwsgi_temp_path {self.dir}/tmp; scgi_temp_path {self.dir}/tmp;
  server {{ listen 127.0.0.1:{self.port}; root {self.dir}/www; location / {{ try_files $uri =404; }} }} }}
""")
        self.proc = subprocess.Popen(["nginx", "-c", conf, "-p", self.dir], stderr=subprocess.DEVNULL)
        wait_for(lambda: self._up(), 10, "nginx to listen", 0.001)  # bench/startup.py times this

    def _up(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            return True
        except OSError:
            return False

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def wrk(port, path, key, seconds):
    out = subprocess.run(["wrk", "-t2", "-c64", f"-d{seconds}s", "--latency", "-H", f"Authorization: Bearer {key}",
                          f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"wrk saw {errors.group(1)} error replies on {path}:\n{out}")
    return rps


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def figure(name, daemon_port, nginx_port, path, key, seconds, command):
    ours, ref, loads = [], [], []
    for _ in range(3):  # interleaved, so both see the same machine
        loads.append(loadavg())
        ours.append(wrk(daemon_port, path, key, seconds))
        ref.append(wrk(nginx_port, path, key, seconds))
    loads.append(loadavg())
    best, best_ref = max(ours), max(ref)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    print(f"| {name} | {best:,.0f} req/s (rounds {', '.join(f'{v:,.0f}' for v in ours)}) | {best_ref:,.0f} req/s "
          f"| {best / best_ref:.2f} | {min(loads)}–{max(loads)} | `{command}` | {date} |", flush=True)


def run(args, n):
    daemon_options = {"password_iterations": 1000, "log_level": args.log_level, "max_connections_per_client": 1000,
                      "heartbeat_interval_ms": 5000, "volume_source_shared": "true"}
    fleet_options = {"sim_pull_ms": 0, "sim_mount_ms": 0, "sim_start_ms": 0}
    with Cloud(args.gpurentd, args.agent, n, daemon_options, fleet_options, keep=False,
               prefix="gpurent-bench-http-") as c:
        key = c.admin_key
        me = json.loads(call(c.port, "GET", "/v1/me", key)[1])
        me = me.get("user", me)
        status, body = call(c.port, "POST", f"/v1/admin/users/{me['id']}/topups", key,
                            {"amount": "1000.00", "payment_id": "bench-reads"})
        assert status in (200, 201), body
        status, body = call(c.port, "POST", "/v1/instances", key,
                            {"gpu_type": "MI450", "card_count": 1, "image": "rocm/pytorch:2.3-rocm6.2"})
        if status != 201:
            raise SystemExit(f"cannot launch the instance the read is measured on: {status} {body[:300]}")
        inst = json.loads(body)["id"]
        wait_for(lambda: json.loads(call(c.port, "GET", f"/v1/instances/{inst}", key)[1])["state"] == "running",
                 60, "the instance to run")
        files = {}
        for path in ("/v1/gpu-types", f"/v1/instances/{inst}"):
            status, data = call(c.port, "GET", path, key)
            assert status == 200, data
            files[path] = data
        ng = Nginx(files)
        try:
            cmd = f"python3 bench/reads.py --nodes {n} --seconds {args.seconds}"
            figure(f"`GET /v1/gpu-types`, {n} nodes", c.port, ng.port, "/v1/gpu-types", key, args.seconds, cmd)
            if n == args.nodes[0]:
                figure("`GET /v1/instances/{id}`, bearer key", c.port, ng.port, f"/v1/instances/{inst}", key,
                       args.seconds, cmd)
        finally:
            ng.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--log-level", default="warn", help="any level: the harness polls /readyz")
    p.add_argument("--gpurentd", default=os.path.join(REPO, "build", "gpurentd"))
    p.add_argument("--agent", default=os.path.join(REPO, "build", "gpurent-agent"))
    args = p.parse_args()
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            raise SystemExit(f"{tool} is missing: scripts/deps.sh bench")
    os.environ["PATH"] += ":/usr/sbin"
    for n in args.nodes:
        run(args, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
