#!/usr/bin/env python3
"""bench/heartbeat.py: one gpurentd heartbeating a simulated fleet.

For each fleet size it starts a fresh gpurentd (its own temporary database,
the system clock) and one `gpurent-agent sim-fleet` process serving that many
simulated nodes on loopback, registered through the admin API as the fleet
command does it. Once every node is `ready` it measures, for a fixed time:

  beats/s    good heartbeats per second, from the daemon's per-pass debug
             line ("heartbeat: pass over N nodes: M answered, ..."), over
             whole periods (first to last pass end in the window)
  passes     heartbeat passes completed, the mean time between them, and
             their longest polling and recording times
  CPU        the daemon's utime+stime from /proc/PID/stat over the window,
             in cores (1.00 = one core busy all the time)
  RSS        the daemon's resident memory at the end (VmRSS) and its peak
             (VmHWM), from /proc/PID/status

The sim-fleet runs on the same machine and its CPU is reported too: on a
small machine it competes with the daemon for cores.

    python3 bench/heartbeat.py --nodes 1000 10000 --period-ms 5000 --seconds 60

Nothing here is a test: it prints a JSON line per fleet size on stderr and
a Markdown row for `make bench` (bench/table.py) on stdout.
"""
import argparse
import datetime
import json
import os
import re
import sys
import time

from common import Cloud, cpu_seconds, memory_kb

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PASS_LINE = re.compile(r"^<7>(\S+)Z debug: heartbeat: pass over (\d+) nodes: (\d+) answered, polling (\d+) ms, "
                       r"recording (\d+) ms$", re.M)


def stamp(text):
    """Seconds since the epoch of a log line's UTC time, e.g. 2026-11-29T19:21:07.414."""
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def run(args, n):
    daemon_options = {"heartbeat_interval_ms": args.period_ms, "log_level": "debug",
                      "agent_max_parallel": args.parallel}
    fleet_options = {"threads": args.agent_threads, "max_connections": 4096}
    with Cloud(args.gpurentd, args.agent, n, daemon_options, fleet_options, args.register_timeout, args.keep) as c:
        derr = c.daemon_log
        derr.seek(0, os.SEEK_END)
        log_start = derr.tell()
        c0, f0, t0 = cpu_seconds(c.daemon.pid), cpu_seconds(c.fleet.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, f1, t1 = cpu_seconds(c.daemon.pid), cpu_seconds(c.fleet.pid), time.monotonic()
        mem = memory_kb(c.daemon.pid)
        derr.seek(log_start)
        passes = [(int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)), stamp(m.group(1)))
                  for m in PASS_LINE.finditer(derr.read())]
        wall = t1 - t0
        answered = sum(p[1] for p in passes)
        # The rate over whole periods: from the end of the first pass in the
        # window to the end of the last, the beats of every pass after the first.
        span = passes[-1][4] - passes[0][4] if len(passes) > 1 else 0
        rate = sum(p[1] for p in passes[1:]) / span if span > 0 else None
        return {
            "nodes": n, "period_ms": args.period_ms, "window_s": round(wall, 1),
            "register_s": round(c.registered_s, 1), "until_all_ready_s": round(c.ready_s - c.registered_s, 1),
            "fleet": c.fleet_summary,
            "passes": len(passes), "beats": answered, "beats_per_s": round(rate, 1) if rate else None,
            "period_s_mean": round(span / (len(passes) - 1), 2) if span > 0 else None,
            "expected_beats_per_s": round(n / (args.period_ms / 1000), 1),
            "missed": sum(p[0] - p[1] for p in passes),
            "poll_ms_max": max((p[2] for p in passes), default=None),
            "record_ms_max": max((p[3] for p in passes), default=None),
            "daemon_cpu_cores": round((c1 - c0) / wall, 3), "fleet_cpu_cores": round((f1 - f0) / wall, 3),
            "daemon_rss_mb": round(mem["VmRSS"] / 1024, 1), "daemon_peak_rss_mb": round(mem["VmHWM"] / 1024, 1),
        }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--period-ms", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=60, help="measurement window per fleet size")
    ap.add_argument("--parallel", type=int, default=256, help="gpurentd's agent_max_parallel")
    ap.add_argument("--agent-threads", type=int, default=8, help="sim-fleet HTTP threads")
    ap.add_argument("--register-timeout", type=float, default=600)
    ap.add_argument("--gpurentd", default=os.environ.get("GPURENTD") or os.path.join(REPO, "build", "gpurentd"))
    ap.add_argument("--agent", default=os.environ.get("GPURENT_AGENT") or os.path.join(REPO, "build", "gpurent-agent"))
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (database, logs)")
    args = ap.parse_args()
    print(f"# {os.cpu_count()} CPUs; gpurentd {args.gpurentd}", file=sys.stderr)
    for n in args.nodes:
        load0 = os.getloadavg()[0]
        r = run(args, n)
        print(json.dumps(r), file=sys.stderr, flush=True)
        # The row `make bench` puts in BENCHMARKS.md (bench/table.py): the
        # reference is the rate the period asks for.
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
        cmd = f"python3 bench/heartbeat.py --nodes {n} --seconds {args.seconds:g}"
        rate = r["beats_per_s"] or 0
        print(f"| heartbeats, {n:,} nodes every {args.period_ms / 1000:g} s | {rate:,.0f} beats/s, {r['missed']} missed;"
              f" daemon {r['daemon_cpu_cores']} cores, RSS {r['daemon_rss_mb']} MiB (peak {r['daemon_peak_rss_mb']})"
              f" | {r['expected_beats_per_s']:,.0f} beats/s asked for by the period | {rate / r['expected_beats_per_s']:.2f}"
              f" | {load0:.2f}–{os.getloadavg()[0]:.2f} | `{cmd}` | {date} |", flush=True)


if __name__ == "__main__":
    main()
