#!/usr/bin/env python3
"""bench/read_cpu.py: the daemon's CPU per cached read, for comparing builds.

reads.py gives requests a second against nginx, which on a 2-core machine
shared with wrk move with whatever else the machine does. This gives what
one request costs the daemon: for each build named, in turn and --rounds
times, a fresh gpurentd and sim fleet of --nodes (bench/common.py), then
wrk (-t2 -c64) on GET /v1/gpu-types for --seconds, twice, with the daemon's
user and system CPU read from /proc before and after each. With
--read instance it reads, with the admin's key, an instance it launched
(GET /v1/instances/{id}), the authenticated read of reads.py.

    python3 bench/read_cpu.py --build /work/base/build --build build --rounds 3
    python3 bench/read_cpu.py --build /work/base/build --build build --read instance
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Cloud, wait_for  # noqa: E402
from reads import call  # noqa: E402


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(build, args):
    options = {"password_iterations": 1000, "log_level": "warn", "max_connections_per_client": 1000,
               "heartbeat_interval_ms": 5000, "volume_source_shared": "true"}
    fleet = {"sim_pull_ms": 0, "sim_mount_ms": 0, "sim_start_ms": 0}
    with Cloud(os.path.join(build, "gpurentd"), os.path.join(build, "gpurent-agent"), args.nodes, options, fleet,
               prefix="gpurent-bench-cpu-") as c:
        path = "/v1/gpu-types"
        if args.read == "instance":
            me = json.loads(call(c.port, "GET", "/v1/me", c.admin_key)[1])
            me = me.get("user", me)
            call(c.port, "POST", f"/v1/admin/users/{me['id']}/topups", c.admin_key,
                 {"amount": "1000.00", "payment_id": "bench-read-cpu"})
            status, body = call(c.port, "POST", "/v1/instances", c.admin_key,
                                {"gpu_type": "MI450", "card_count": 1, "image": "rocm/pytorch:2.3-rocm6.2"})
            if status != 201:
                raise SystemExit(f"cannot launch the instance to read: {status} {body[:300]}")
            path = f"/v1/instances/{json.loads(body)['id']}"
            wait_for(lambda: json.loads(call(c.port, "GET", path, c.admin_key)[1])["state"] == "running", 60,
                     "the instance to run")
        out = []
        for _ in range(2):
            before = cpu_seconds(c.daemon.pid)
            text = subprocess.run(["wrk", "-t2", "-c64", f"-d{args.seconds}s", "-H",
                                   f"Authorization: Bearer {c.admin_key}", f"{c.url}{path}"],
                                  capture_output=True, text=True, check=True).stdout
            used = cpu_seconds(c.daemon.pid) - before
            done = int(re.search(r"(\d+) requests in", text).group(1))
            out.append(f"{done / args.seconds:,.0f} req/s {used / done * 1e6:.2f} µs of CPU each")
        return "; ".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", action="append", required=True, help="a build directory (repeat to compare)")
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--read", choices=("gpu-types", "instance"), default="gpu-types")
    args = p.parse_args()
    for _ in range(args.rounds):
        for build in args.build:
            print(f"{build}: {measure(build, args)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
