#!/usr/bin/env python3
"""bench/instances.py: how fast gpurentd rents cards, from request to running.

For each fleet size it starts a fresh gpurentd (its own temporary database,
the system clock) and one `gpurent-agent sim-fleet` process serving that many
simulated 8-card MI450 nodes on loopback with every sim delay at zero, so the
time measured is the control plane's (HTTP, placement, the reconciler's calls
to the agents) and not a simulated image pull. Then:

  burst   --clients processes send --burst creates as fast as they can over
          keep-alive connections, spread over --users users.
            creates/s        201 replies per second of the burst's wall time
                             (each create claims its cards in one transaction)
            create p50/p99   the POST's own latency
            running p50/p99  from sending the POST to the instance showing
                             state `running`, queueing included
  paced   one client, one create at a time, waiting for `running` before the
          next (--paced samples): the uncontended request-to-running time.

With --live L, L instances are created (the same way) and running before the
burst, so the burst measures creates with that many already live, and the
daemon's CPU per create (from the burst's first POST until every burst
instance runs, so the reconciler's work for it is counted). With --reference
the burst is wrk (bench/create.lua, --clients connections, --seconds long),
a client far cheaper than these Python ones, so the figure is the daemon's;
then bench/claims (the same claim in-process, no HTTP, no agents) runs on
the same fleet size, live count and thread count, and a Markdown row for
`make bench` gives both figures and their ratio.

With --idle S it sends no creates after the live ones: for S seconds it
reads the daemon's and the fleet's CPU once a second, which shows what a
fleet of that size costs with nothing asked of it (heartbeat passes, the
reconciler's sweeps, billing), and when it comes. With --reference and
--background S it first measures that upkeep for S seconds (30: one sweep
period, six heartbeat passes), then also gives the burst's CPU per create
less the upkeep's share of the burst's time: a burst of a few seconds
catches a sweep of every node's workloads or not by chance, which moved
the daemon's CPU per create at 10 000 nodes by 0.3 ms between runs.

`running` is seen by polling the instance_events table read-only every
--poll-ms, so running times carry up to that much (plus a query) of error.
The clients, the poller and the sim-fleet run on the same machine as the
daemon and compete with it for cores; daemon and fleet CPU are reported.

    python3 bench/instances.py --nodes 100 10000

Nothing here is a test: it prints one JSON line per fleet size for
BENCHMARKS.md.
"""
import argparse
import datetime
import http.client
import json
import multiprocessing as mp
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.request

from common import Cloud, bytes_written, cpu_seconds, cpu_seconds_by_thread, machine_busy_seconds, memory_kb, wait_for

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
IMAGE = "rocm/pytorch:2.3-rocm6.2"


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def ms(v):
    return None if v is None else round(v * 1000, 1)


class Api:
    """A keep-alive JSON client."""

    def __init__(self, port, key=None):
        self.port, self.key = port, key
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def call(self, method, path, body=None, key=None):
        headers = {"Content-Type": "application/json"}
        auth = self.key if key is None else key
        if auth:
            headers["Authorization"] = f"Bearer {auth}"
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                return r.status, json.loads(r.read() or b"null")
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                if attempt:
                    raise


def burst_worker(port, keys, count, cards, start, out):
    api = Api(port)
    rows = []
    start.wait()
    for i in range(count):
        key = keys[i % len(keys)]
        t0 = time.monotonic()
        status, body = api.call("POST", "/v1/instances", {"gpu_type": "MI450", "card_count": cards, "image": IMAGE},
                                key=key)
        t1 = time.monotonic()
        rows.append((body.get("id") if status == 201 else None, status, t0, t1,
                     None if status == 201 else body.get("error", {}).get("code")))
    out.put(rows)


class RunningWatcher:
    """Sees instances reach `running` through instance_events (read-only)."""

    def __init__(self, db):
        self.con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        self.seq = self.con.execute("SELECT coalesce(max(seq), 0) FROM instance_events").fetchone()[0]
        self.seen = {}

    def poll(self):
        now = time.monotonic()
        rows = self.con.execute("SELECT seq, instance_id, state FROM instance_events WHERE seq > ? ORDER BY seq",
                                (self.seq,)).fetchall()
        for seq, iid, state in rows:
            self.seq = seq
            if state == "running" and iid not in self.seen:
                self.seen[iid] = now
            if state == "failed":
                self.seen.setdefault(iid, None)
        return len(rows)


def verification_code(c, email):
    """The code the mailer logged for email (no smtp_url: the mail is logged)."""
    rx = re.compile(rf"verify {re.escape(email)} with code (evc_[0-9a-z]{{20}})")

    def found():
        c.daemon_log.seek(0)
        m = rx.findall(c.daemon_log.read())
        return m[-1] if m else None
    return wait_for(found, 30, f"the verification code for {email}", 0.05)


def send_burst(port, keys, count, args, watcher):
    """count creates from --clients processes at once; their rows."""
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    per = [count // args.clients + (1 if i < count % args.clients else 0) for i in range(args.clients)]
    workers = [ctx.Process(target=burst_worker, args=(port, keys[i::args.clients] or keys, per[i], args.cards,
                                                      start, out)) for i in range(args.clients)]
    for w in workers:
        w.start()
    start.set()
    rows, got = [], 0
    while got < len(workers):
        while not out.empty():
            rows += out.get()
            got += 1
        watcher.poll()
        time.sleep(args.poll_ms / 1000)
    for w in workers:
        w.join()
    return rows


def wrk_burst(port, keys, args, work):
    """POST /v1/instances from wrk (bench/create.lua) for --seconds: a client
    far cheaper than Python's, so the figure is the daemon's. Requests/s and
    latency p50/p99 in ms."""
    key_file = os.path.join(work, "keys.txt")
    with open(key_file, "w") as f:
        f.write("\n".join(keys) + "\n")
    out = subprocess.run(["wrk", "-t2", f"-c{args.clients}", f"-d{args.seconds}s", "--latency", "-s",
                          os.path.join(REPO, "bench", "create.lua"), f"http://127.0.0.1:{port}/v1/instances"],
                         capture_output=True, text=True, check=True, env={**os.environ, "BENCH_KEYS_FILE": key_file}).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"wrk saw {errors.group(1)} refused creates:\n{out}")

    def latency(p):
        v, unit = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)$", out, re.M).groups()
        return round(float(v) * {"us": 0.001, "ms": 1, "s": 1000}[unit], 2)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), latency(50), latency(99)


def claims_reference(args, n, burst):
    """bench/claims on the same fleet, live count and threads: claims/s."""
    cmd = [args.claims, "--nodes", str(n), "--live", str(args.live), "--claims", str(burst), "--cards",
           str(args.cards), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900).stdout
    m = re.search(r"([0-9.]+) claims/s.*checks ok", out)
    if not m:
        raise SystemExit(f"bench/claims failed: {out}")
    return float(m.group(1)), " ".join(os.path.relpath(a, REPO) if a == args.claims else a for a in cmd)


def counters(c):
    """From /metrics: the reconciler's calls to agents by method ("PUT",
    "GET", …), and the store's "transactions" and "commits" (group commit
    runs several transactions in one commit)."""
    req = urllib.request.Request(f"{c.url}/metrics", headers={"Authorization": f"Bearer {c.admin_key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    out = {m: int(v) for m, v in
           re.findall(r'^gpurent_reconciler_workload_calls_total\{method="(\w+)"\} (\d+)$', text, re.M)}
    for name in ("transactions", "commits"):
        out[name] = int(re.search(rf"^gpurent_store_{name}_total (\d+)$", text, re.M).group(1))
    return out


def background_cores(args, c):
    """--background: the daemon's and the fleet's CPU, in cores, over
    args.background seconds with nothing asked of them (a whole reconcile
    sweep period, 30 s by default, holds one sweep and six heartbeat passes),
    by daemon thread too; None without it."""
    if not args.background:
        return None
    threads0 = cpu_seconds_by_thread(c.daemon.pid)
    d0, f0, t0 = cpu_seconds(c.daemon.pid), cpu_seconds(c.fleet.pid), time.monotonic()
    time.sleep(args.background)
    d1, f1, t1 = cpu_seconds(c.daemon.pid), cpu_seconds(c.fleet.pid), time.monotonic()
    threads1 = cpu_seconds_by_thread(c.daemon.pid)
    by_thread = {k: round((v - threads0.get(k, 0)) / (t1 - t0), 3) for k, v in threads1.items()}
    return {"seconds": args.background, "daemon_cores": round((d1 - d0) / (t1 - t0), 3),
            "fleet_cores": round((f1 - f0) / (t1 - t0), 3),
            "daemon_cores_by_thread": {k: v for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1]) if v > 0}}


def wrk_run(args, n, c, keys, watcher):
    """The --reference burst: wrk for --seconds, then until every instance it
    made runs; the daemon's CPU over that time per create."""
    live = watcher.con.execute("SELECT count(*) FROM instances").fetchone()[0]
    background = background_cores(args, c)
    calls0 = counters(c)
    threads0 = cpu_seconds_by_thread(c.daemon.pid)
    c0, f0 = cpu_seconds(c.daemon.pid), cpu_seconds(c.fleet.pid)
    m0, t0 = machine_busy_seconds(), time.monotonic()
    rps, p50, p99 = wrk_burst(c.port, keys, args, c.work)
    m1, t1 = machine_busy_seconds(), time.monotonic()
    total = watcher.con.execute("SELECT count(*) FROM instances").fetchone()[0]
    wait_for(lambda: (watcher.poll() or True) and len(watcher.seen) >= total, 600, "every created instance to run",
             args.poll_ms / 1000)
    c1, f1 = cpu_seconds(c.daemon.pid), cpu_seconds(c.fleet.pid)
    window = time.monotonic() - t0
    threads1 = cpu_seconds_by_thread(c.daemon.pid)
    calls1 = counters(c)
    created = total - live
    if background:
        # What the creates themselves cost: the window's CPU less what the
        # fleet's upkeep (heartbeats, sweeps) costs in as long with nothing asked.
        background["daemon_cpu_ms_per_create_less_background"] = round(
            (c1 - c0 - background["daemon_cores"] * window) * 1000 / created, 3)
        background["fleet_cpu_ms_per_create_less_background"] = round(
            (f1 - f0 - background["fleet_cores"] * window) * 1000 / created, 3)
    # The daemon's CPU per create by thread ("MHD-worker": libmicrohttpd's threads, which serve the API),
    # heartbeat passes over the whole fleet included.
    by_thread = {name: round((cpu - threads0.get(name, 0)) * 1000 / created, 3) for name, cpu in threads1.items()}
    per_create = {f"{m.lower()}s_per_create": round((calls1[m] - calls0[m]) / created, 2) for m in ("PUT", "GET")}
    for m in ("transactions", "commits"):
        per_create[f"{m}_per_create"] = round((calls1[m] - calls0[m]) / created, 2)
    return {"nodes": n, "live": live, "wrk": {"creates_per_s": round(rps, 1), "created": created,
                                              "create_ms_p50": p50, "create_ms_p99": p99,
                                              "daemon_cpu_ms_per_create": round((c1 - c0) * 1000 / created, 3),
                                              "daemon_cpu_ms_per_create_by_thread": {
                                                  k: v for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1])
                                                  if v > 0},
                                              # The sim fleet shares the cores here; on real hosts it does not.
                                              "fleet_cpu_ms_per_create": round((f1 - f0) * 1000 / created, 3),
                                              # Of the machine's cores, how many were busy while wrk ran.
                                              "machine_busy_cores": round((m1 - m0) / (t1 - t0), 2),
                                              **per_create, **({"background": background} if background else {})},
            "daemon_rss_mb": round(memory_kb(c.daemon.pid)["VmHWM"] / 1024, 1)}


def idle_run(args, n, c):
    """--idle: the daemon's and the fleet's CPU in each second of args.idle
    with no request made."""
    per_second = []
    threads0 = cpu_seconds_by_thread(c.daemon.pid)
    w0 = bytes_written(c.daemon.pid)
    d0, f0 = cpu_seconds(c.daemon.pid), cpu_seconds(c.fleet.pid)
    for _ in range(args.idle):
        time.sleep(1)
        d1, f1 = cpu_seconds(c.daemon.pid), cpu_seconds(c.fleet.pid)
        per_second.append([round(d1 - d0, 2), round(f1 - f0, 2)])
        d0, f0 = d1, f1
    threads1 = cpu_seconds_by_thread(c.daemon.pid)
    written = bytes_written(c.daemon.pid) - w0
    by_thread = {name: round((cpu - threads0.get(name, 0)) / args.idle, 3) for name, cpu in threads1.items()}
    return {"nodes": n, "live": args.live, "idle": {
        "seconds": args.idle, "daemon_cores": round(sum(d for d, _ in per_second) / args.idle, 3),
        "fleet_cores": round(sum(f for _, f in per_second) / args.idle, 3),
        "daemon_peak_cores": max(d for d, _ in per_second),
        # What the daemon wrote (the database's WAL and checkpoints) per second.
        "daemon_written_kib_per_s": round(written / 1024 / args.idle, 1),
        # The daemon's cores by thread ("MHD-worker": libmicrohttpd's threads).
        "daemon_cores_by_thread": {k: v for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1]) if v > 0},
        # [daemon, fleet] CPU seconds used in each second, in order.
        "per_second": per_second}}


def markdown_row(args, n, result, load):
    b = result["wrk"]
    ref, ref_cmd = claims_reference(args, n, b["created"])
    ratio = b["creates_per_s"] / ref
    cmd = (f"python3 bench/instances.py --nodes {n} --live {args.live} --seconds {args.seconds} --reference"
           + (f" --clients {args.clients}" if args.clients != 8 else "")
           + (f" --background {args.background}" if args.background else ""))
    bg = b.get("background")
    less = (f"; less the fleet's upkeep, {bg['daemon_cpu_ms_per_create_less_background']:.2f} ms and"
            f" {bg['fleet_cpu_ms_per_create_less_background']:.2f} ms, the upkeep being"
            f" {bg['daemon_cores']:.3f} and {bg['fleet_cores']:.3f} cores with nothing asked" if bg else "")
    return (f"| `POST /v1/instances` through HTTP (wrk -c{args.clients}), {n} nodes, {result['live']} live |"
            f" {b['creates_per_s']:,.0f} creates/s (p50 {b['create_ms_p50']} ms, p99 {b['create_ms_p99']} ms),"
            f" daemon CPU {b['daemon_cpu_ms_per_create']:.2f} ms per create until running (the sim fleet's"
            f" {b['fleet_cpu_ms_per_create']:.2f} ms{less}; {b['machine_busy_cores']:.1f} of {os.cpu_count()} cores busy) |"
            f" {ref:,.0f} claims/s in-process (`{ref_cmd}`) | {ratio:.2f} | {load} | `{cmd}` |"
            f" {datetime.datetime.now():%Y-%m-%d %H:%M} |")


def run(args, n):
    daemon_options = {"agent_max_parallel": args.parallel, "reconcile_interval_ms": args.reconcile_ms,
                      "heartbeat_interval_ms": args.heartbeat_ms, "default_max_cards": 100000,
                      "password_iterations": 1000, "threads": args.threads, "max_connections_per_client": 1000,
                      "log_level": "info", "volume_source_shared": "true",  # the sim nodes share this machine
                      "signup_rate_per_address": 0, "signup_rate_per_subnet": 0,
                      # Each bench user gets 99 999 000.00 of cash (its trial credit on top stays under max_balance), so that funds never stop a claim.
                      "max_topup": "100000000.00", "max_balance": "100000000.00"}
    fleet_options = {"threads": args.agent_threads, "max_connections": 4096, "sim_pull_ms": 0, "sim_mount_ms": 0,
                     "sim_start_ms": 0, "workers": args.agent_workers}
    with Cloud(args.gpurentd, args.agent, n, daemon_options, fleet_options, args.register_timeout, args.keep,
               prefix="gpurent-bench-inst-") as c:
        port, db, daemon, fleet = c.port, c.db, c.daemon, c.fleet
        admin = Api(port, c.admin_key)
        keys = []
        # As many users as bench/claims has (8 instances each), so that each
        # create's funds and quota checks see what the reference's do.
        users = args.users or max(16, (args.live + args.burst) // 8)
        for u in range(users):
            status, body = admin.call("POST", "/v1/signup", {"email": f"bench{u}@example.test",
                                                             "password": "correct horse battery"}, key="")
            assert status == 201, body
            uid, keys_u = body["user"]["id"], body["api_key"]["token"]
            status, body = admin.call("POST", "/v1/verify-email",
                                      {"token": verification_code(c, f"bench{u}@example.test")}, key="")
            assert status == 200, body
            status, body = admin.call("POST", f"/v1/admin/users/{uid}/topups",
                                      {"amount": "99999000.00", "payment_id": f"bench-{u}"})
            assert status in (200, 201), body
            keys.append(keys_u)

        watcher = RunningWatcher(db)
        free = n * 8
        burst = min(args.burst, free // args.cards - args.paced - args.live)
        if args.live:
            rows = send_burst(port, keys, args.live, args, watcher)
            live = {r[0] for r in rows if r[1] == 201}
            assert len(live) == args.live, sorted({r[4] for r in rows} - {None})
            wait_for(lambda: (watcher.poll() or True) and live <= set(watcher.seen), 900,
                     "every live instance to run", args.poll_ms / 1000)
        if args.idle:
            return idle_run(args, n, c)
        if args.reference:
            return wrk_run(args, n, c, keys, watcher)
        # ---- burst
        c0, f0 = cpu_seconds(daemon.pid), cpu_seconds(fleet.pid)
        t_start = time.monotonic()
        rows = send_burst(port, keys, burst, args, watcher)
        t_sent = max(r[3] for r in rows)
        created = [r for r in rows if r[1] == 201]
        wanted = {r[0] for r in created}
        wait_for(lambda: (watcher.poll() or True) and wanted <= set(watcher.seen), 600,
                 "every burst instance to run", args.poll_ms / 1000)
        t_all = time.monotonic()
        c1, f1 = cpu_seconds(daemon.pid), cpu_seconds(fleet.pid)
        failed = [i for i in wanted if watcher.seen[i] is None]
        first = min(r[2] for r in rows)
        burst_wall = t_sent - first
        to_running = [watcher.seen[r[0]] - r[2] for r in created if watcher.seen[r[0]] is not None]
        result = {
            "nodes": n, "cards_per_instance": args.cards, "fleet_ready_s": round(c.ready_s, 1), "live": args.live,
            "burst": {
                "requests": len(rows), "created": len(created), "clients": args.clients,
                "refused": sorted({r[4] for r in rows if r[1] != 201} - {None}),
                "creates_per_s": round(len(created) / burst_wall, 1),
                "create_ms_p50": ms(pct([r[3] - r[2] for r in created], 50)),
                "create_ms_p99": ms(pct([r[3] - r[2] for r in created], 99)),
                "running_ms_p50": ms(pct(to_running, 50)), "running_ms_p99": ms(pct(to_running, 99)),
                "all_running_s": round(t_all - first, 2), "failed": len(failed),
                "daemon_cpu_cores": round((c1 - c0) / (t_all - t_start), 2),
                "daemon_cpu_ms_per_create": round((c1 - c0) * 1000 / max(1, len(created)), 3),
                "fleet_cpu_cores": round((f1 - f0) / (t_all - t_start), 2),
            },
        }
        # ---- paced
        api = Api(port, keys[0])
        lat, create_lat = [], []
        for i in range(args.paced):
            t0 = time.monotonic()
            status, body = api.call("POST", "/v1/instances", {"gpu_type": "MI450", "card_count": args.cards,
                                                              "image": IMAGE})
            t1 = time.monotonic()
            if status != 201:
                result["paced_error"] = body
                break
            iid = body["id"]
            deadline = time.monotonic() + 60
            while iid not in watcher.seen and time.monotonic() < deadline:
                watcher.poll()
                time.sleep(args.poll_ms / 1000)
            if watcher.seen.get(iid):
                lat.append(watcher.seen[iid] - t0)
                create_lat.append(t1 - t0)
        result["paced"] = {"samples": len(lat), "create_ms_p50": ms(pct(create_lat, 50)),
                           "create_ms_p99": ms(pct(create_lat, 99)), "running_ms_p50": ms(pct(lat, 50)),
                           "running_ms_p99": ms(pct(lat, 99)), "running_ms_max": ms(max(lat) if lat else None)}
        result["daemon_rss_mb"] = round(memory_kb(daemon.pid)["VmHWM"] / 1024, 1)
        return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 10000])
    ap.add_argument("--cards", type=int, default=1, help="cards per instance (1-8: one node each)")
    ap.add_argument("--burst", type=int, default=2000, help="creates in the burst (capped by the fleet's room)")
    ap.add_argument("--clients", type=int, default=8, help="client processes in the burst")
    ap.add_argument("--users", type=int, default=0, help="users (default: 16, or 8 instances each with --live)")
    ap.add_argument("--paced", type=int, default=200, help="one-at-a-time samples after the burst")
    ap.add_argument("--live", type=int, default=0, help="instances created and running before the burst")
    ap.add_argument("--seconds", type=int, default=3, help="how long wrk creates with --reference")
    ap.add_argument("--reference", action="store_true",
                    help="also run bench/claims with the same fleet and print a Markdown row with the ratio")
    ap.add_argument("--idle", type=int, default=0, metavar="SECONDS",
                    help="after the live instances, only watch the daemon's and fleet's CPU for SECONDS")
    ap.add_argument("--background", type=int, default=0, metavar="SECONDS",
                    help="with --reference: first measure the daemon's and fleet's CPU for SECONDS with nothing asked,"
                         " and also give the burst's CPU per create less that upkeep")
    ap.add_argument("--claims", default=os.path.join(REPO, "build", "bench", "claims"))
    ap.add_argument("--poll-ms", type=float, default=2, help="how often `running` is looked for")
    ap.add_argument("--reconcile-ms", type=int, default=2000, help="gpurentd's reconcile_interval_ms")
    ap.add_argument("--heartbeat-ms", type=int, default=5000, help="gpurentd's heartbeat_interval_ms")
    ap.add_argument("--threads", type=int, default=4, help="gpurentd's HTTP threads")
    ap.add_argument("--parallel", type=int, default=256, help="gpurentd's agent_max_parallel")
    ap.add_argument("--agent-threads", type=int, default=8, help="sim-fleet HTTP threads")
    ap.add_argument("--agent-workers", type=int, default=4, help="sim-fleet driver threads")
    ap.add_argument("--register-timeout", type=float, default=900)
    ap.add_argument("--gpurentd", default=os.environ.get("GPURENTD") or os.path.join(REPO, "build", "gpurentd"))
    ap.add_argument("--agent", default=os.environ.get("GPURENT_AGENT") or os.path.join(REPO, "build", "gpurent-agent"))
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (database, logs)")
    args = ap.parse_args()
    print(f"# {os.cpu_count()} CPUs; gpurentd {args.gpurentd}", file=sys.stderr)
    for n in args.nodes:
        load0 = os.getloadavg()[0]
        result = run(args, n)
        print(json.dumps(result), file=sys.stderr if args.reference and not args.idle else sys.stdout, flush=True)
        if args.reference and not args.idle:
            print(markdown_row(args, n, result, f"{load0:.2f}–{os.getloadavg()[0]:.2f}"), flush=True)


if __name__ == "__main__":
    main()
