#!/usr/bin/env python3
"""bench/gateway.py: what gpurent-gateway adds to a call (issue 17).

Starts a fresh gpurentd (its own temporary database, the system clock, the
marketplace on) with one sim-fleet node publishing ports, publishes an app
with one replica (`gpurent-agent sim-model-server`, every delay 0, so the
replica answers at once), starts a gpurent-gateway, and then in one run,
side by side, sends the same non-streamed POST /v1/chat/completions
  direct    to the replica's published address (host port on the node,
            relayed by the sim agent to the process),
  process   to the model server's own port (no relay; the sim only),
  gateway   through the gateway (/apps/{slug}/v1/chat/completions, the key
            checked, limits and funds, least-outstanding choice, the usage
            record written and reported),
from --clients processes over keep-alive connections, --requests each,
after --warmup requests each. It prints one JSON line per path: requests
per second over the wall time, and latency p50/p99/max in milliseconds;
then the gateway's added p50/p99, and how many calls gpurentd settled.

    python3 bench/gateway.py --clients 4 --requests 2000

The clients run on the same machine as the gateway, the replica, the
fleet and gpurentd and compete with them for cores. Not a test."""
import argparse
import http.client
import json
import multiprocessing as mp
import os
import secrets
import socket
import sqlite3
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Cloud, wait_for  # noqa: E402

BODY = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "the quick brown fox jumps"}]})



def listening_address(port):
    """The IPv4 address a socket listening on port is bound to: each sim
    replica binds the app's port on a loopback address of its own (from its
    workload id), not on 127.0.0.1."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                return ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    raise SystemExit(f"nothing listens on port {port}")

def client(args):
    url, path, headers, warmup, n = args
    u = urllib.parse.urlsplit(url)
    con = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    con.connect()
    con.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        con.request("POST", path, body=BODY, headers=headers)
        r = con.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"{url}{path}: {r.status}")
        if i >= warmup:
            lat.append(time.perf_counter() - t0)
    con.close()
    return lat


def run(name, url, path, headers, clients, warmup, n):
    with mp.Pool(clients) as pool:
        t0 = time.perf_counter()
        parts = pool.map(client, [(url, path, headers, warmup, n)] * clients)
        wall = time.perf_counter() - t0
    lat = sorted(x for p in parts for x in p)
    pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 3)  # noqa: E731
    # The warm-up is inside the wall time; rps counts it too.
    out = {"path": name, "clients": clients, "requests": len(lat), "rps": round(clients * (warmup + n) / wall, 1),
           "p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": round(lat[-1] * 1000, 3)}
    print(json.dumps(out), flush=True)
    return out


def api(cloud, method, path, body=None, key=None):
    u = urllib.parse.urlsplit(cloud.url)
    con = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    con.request(method, path, body=json.dumps(body) if body is not None else None,
                headers={"Authorization": f"Bearer {key or cloud.admin_key}", "Content-Type": "application/json"})
    r = con.getresponse()
    data = r.read()
    con.close()
    return r.status, json.loads(data) if data else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    gpurentd, agent, gateway = (os.path.join(build, p) for p in ("gpurentd", "gpurent-agent", "gpurent-gateway"))
    secret_dir = os.path.abspath(os.path.join(build, "bench-gateway"))
    os.makedirs(secret_dir, exist_ok=True)
    secret_file = os.path.join(secret_dir, "gateway.secret")
    with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    port = 21000 + os.getpid() % 1000
    with Cloud(gpurentd, agent, 1, {"gateway_secret_file": secret_file, "app_scale_interval_ms": "200",
                                    "heartbeat_interval_ms": "500", "reconcile_interval_ms": "200"},
               {"publish_port_range": f"{port + 1}-{port + 40}", "sim_publish_ports_per_node": "40", "sim_pull_ms": "0", "sim_mount_ms": "0",
                "sim_start_ms": "0"}) as cloud:
        _, me = api(cloud, "GET", "/v1/me")
        api(cloud, "POST", f"/v1/admin/users/{me['id']}/topups", {"amount": "100000.00", "payment_id": "bench"})
        st, app = api(cloud, "POST", "/v1/apps", {
            "slug": "bench-echo", "name": "bench", "image": "rocm/pytorch:2.3-rocm6.2", "gpu_type": "MI450",
            "port": port, "command": [agent, "sim-model-server", "--port", str(port), "--token-ms", "0",
                                      "--first-token-ms", "0"],
            "min_replicas": 1, "max_replicas": 1, "price_per_request": "0.000001"})
        assert st == 201, app
        con = sqlite3.connect(f"file:{cloud.db}?mode=ro", uri=True, timeout=30)
        row = wait_for(lambda: con.execute(
            "SELECT json_extract(r.ports, '$[0].host') FROM instances i JOIN instance_nodes r ON r.instance_id = i.id"
            " WHERE i.app_id = ? AND i.state = 'running'", [app["id"]]).fetchone(), 60, "the replica to run")
        direct = f"http://127.0.0.1:{row[0]}"
        gw_port = port + 100
        # A fresh journal: one left by an earlier run names that run's database.
        state_dir = os.path.join(secret_dir, "state")
        __import__("shutil").rmtree(state_dir, ignore_errors=True)
        gw = __import__("subprocess").Popen(
            [gateway, "--listen", f"127.0.0.1:{gw_port}", "--control-url", cloud.url, "--secret-file", secret_file,
             "--gateway-id", "bench", "--log-level", "warn", "--state-dir", state_dir], stdin=__import__("subprocess").DEVNULL)
        try:
            gw_url = f"http://127.0.0.1:{gw_port}"
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {cloud.admin_key}"}

            def answers(url, path):
                try:
                    host, p = url.rsplit("/", 1)[1].rsplit(":", 1)
                    c = http.client.HTTPConnection(host, int(p), timeout=5)
                    c.request("POST", path, body=BODY, headers=headers)
                    return c.getresponse().status == 200
                except OSError:
                    return False
            wait_for(lambda: answers(direct, "/v1/chat/completions"), 60, "the replica to answer")
            wait_for(lambda: answers(gw_url, "/apps/bench-echo/v1/chat/completions"), 60, "the gateway to answer")
            # The sim's relay (the node's published port) in front of the
            # process, and the process itself on its port, for comparison.
            d = run("direct", direct, "/v1/chat/completions", headers, a.clients, a.warmup, a.requests)
            pr = run("process", f"http://{listening_address(port)}:{port}", "/v1/chat/completions", headers,
                     a.clients, a.warmup,
                a.requests)
            g = run("gateway", gw_url, "/apps/bench-echo/v1/chat/completions", headers, a.clients, a.warmup,
                    a.requests)
            total = a.clients * (a.warmup + a.requests) + 1  # and the readiness call
            settled = wait_for(lambda: (lambda n: n if n >= total else None)(
                con.execute("SELECT count(*) FROM app_calls").fetchone()[0]), 120, "every call to be settled")
            print(json.dumps({"added_p50_ms_vs_direct": round(g["p50_ms"] - d["p50_ms"], 3),
                              "added_p99_ms_vs_direct": round(g["p99_ms"] - d["p99_ms"], 3),
                              "added_p50_ms_vs_process": round(g["p50_ms"] - pr["p50_ms"], 3),
                              "added_p99_ms_vs_process": round(g["p99_ms"] - pr["p99_ms"], 3),
                              "calls_settled": settled}))
        finally:
            gw.terminate()
            gw.wait(timeout=60)
            con.close()


if __name__ == "__main__":
    main()
