"""apps_util.py: the marketplace's test cloud (issue 17): a real gpurentd
with gateways enabled (gateway_secret_file), a sim fleet whose nodes
publish ports, real `gpurent-gateway` processes, and replicas that run
`gpurent-agent sim-model-server` as the app's command.

Market(new_daemon, tmp_path, options=None)
  fleet(nodes=1, cards=8)       a sim fleet publishing host ports
  publish(user, **fields)       POST /v1/apps (201) with a sim model server
  gateway(**flags) -> Gateway   a gateway signed with the daemon's secret,
                                its usage journal in a --state-dir of its own
  calls(app_id) -> [rows]       the app_calls settled so far
  signed(method, path, body)    a request signed as a gateway would
Gateway.call(slug, path, key, json=..., stream=False, headers=None)
Gateway.kill() / start()      SIGKILL it; start it again (same port, same state dir)
"""
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import subprocess
import time

import requests

from agent_util import AGENT, poll
from ports import free_port, free_range  # noqa: F401  (free_port: also for the apps tests)
from harness import GPURENTD
from instances_util import FAST_CLOUD, Cloud
from money_util import ledger_breaches, ledger_verify

GATEWAY = os.environ.get("GPURENT_GATEWAY") or os.path.join(os.path.dirname(GPURENTD), "gpurent-gateway")
DEADLINE = 60


class Gateway:
    def __init__(self, market, gateway_id="gw-test", sync_ms=150, report_ms=150, cold_start_s=60, extra=(),
                 control_url=None):
        self.market = market
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = os.path.join(market.tmp, f"gateway-{gateway_id}-{self.port}.log")
        self.state_dir = os.path.join(market.tmp, f"gateway-{gateway_id}-{self.port}.state")
        self.args = [GATEWAY, "--listen", f"127.0.0.1:{self.port}", "--control-url", control_url or market.d.base_url,
                     "--secret-file", market.secret_file, "--gateway-id", gateway_id, "--sync-ms", str(sync_ms),
                     "--report-ms", str(report_ms), "--cold-start-timeout-s", str(cold_start_s),
                     "--state-dir", self.state_dir, *extra]
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

        def ready():
            assert self.proc.poll() is None, self.text()
            try:
                return requests.get(self.url + "/healthz", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False
        poll(ready, DEADLINE, "the gateway to load its first copy")

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def kill(self):
        """SIGKILL: no last report, nothing flushed; only what is on disk survives."""
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        text = self.text()
        assert "Sanitizer" not in text and "runtime error:" not in text, text[-4000:]
        self.proc = None

    def call(self, slug, path, key, json=None, stream=False, headers=None, timeout=90):
        h = {"Authorization": f"Bearer {key}", **(headers or {})}
        return requests.post(f"{self.url}/apps/{slug}{path}", json=json, headers=h, stream=stream, timeout=timeout)


class Market(Cloud):
    def __init__(self, new_daemon, tmp_path, options=None):
        self.secret_file = str(tmp_path / "gateway.secret")
        self.secret = secrets.token_hex(32)
        with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(self.secret + "\n")
        super().__init__(new_daemon, tmp_path, options={
            "gateway_secret_file": self.secret_file, "app_scale_interval_ms": "150",
            "app_scale_down_window_s": "30", "app_platform_fee_ppm": "100000", **(options or {})})
        self.gateways = []

    def fleet(self, nodes=1, cards=8, **kw):
        first, last = free_range(nodes * 50)
        return super().fleet(nodes, cards=cards, sim={"publish_port_range": f"{first}-{last}",
                                                      "sim_publish_ports_per_node": "50"}, **kw)

    def model_command(self, port, token_ms=5):
        return [AGENT, "sim-model-server", "--port", str(port), "--token-ms", str(token_ms), "--first-token-ms", "10"]

    def publish(self, user, expect=201, **fields):
        port = fields.pop("model_port", None) or free_port()
        body = {"slug": f"app-{secrets.token_hex(4)}", "name": "Echo", "description": "an echo model",
                "image": "rocm/pytorch:2.3-rocm6.2", "gpu_type": "MI450", "port": port,
                "command": self.model_command(port), "cards_per_replica": 1, "min_replicas": 0,
                "max_replicas": 2, "concurrency_target": 2, "idle_seconds": 60,
                "price_per_request": "0.01", "price_per_1k_input_tokens": "0.002",
                "price_per_1k_output_tokens": "0.004", **fields}
        r = self.d.post("/v1/apps", key=user.key, json=body)
        assert r.status_code == expect, r.text
        return r.json()

    def gateway(self, **kw):
        g = Gateway(self, **kw)
        self.gateways.append(g)
        return g

    def running_app(self, token_ms, **fields):
        """On a fleet of one node, an app with one running replica whose
        model server sends a token every token_ms, and a consumer, made
        before any gateway so that a gateway started next knows their key:
        (app, consumer)."""
        self.fleet(1)
        pub, con = self.user(), self.user()
        port = free_port()
        app = self.publish(pub, min_replicas=1, max_replicas=1, model_port=port,
                           command=self.model_command(port, token_ms=token_ms), **fields)
        poll(lambda: self.d.sql("SELECT count(*) FROM instances WHERE app_id = ? AND state = 'running'",
                                [app["id"]])[0][0], DEADLINE, "a running replica")
        return app, con

    def calls(self, app_id):
        return self.d.sql("SELECT id, status, input_tokens, output_tokens, charge, earning, fee, unpaid, completed,"
                          " cold_start, consumer_id FROM app_calls WHERE app_id = ? ORDER BY rowid", [app_id])

    def wait_calls(self, app_id, n):
        return poll(lambda: (lambda rows: rows if len(rows) >= n else None)(self.calls(app_id)), DEADLINE,
                    f"{n} settled calls of {app_id}")

    def live_replicas(self, app_id):
        return self.d.sql("SELECT id, state FROM instances WHERE app_id = ? AND desired = 'running'", [app_id])

    def signed(self, method, path, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        ts, nonce = str(int(time.time())), secrets.token_hex(16)
        canon = "\n".join([method, path, ts, nonce, hashlib.sha256(data).hexdigest()])
        sig = hmac.new(self.secret.encode(), canon.encode(), hashlib.sha256).hexdigest()
        return requests.request(method, self.d.base_url + path, data=data or None, timeout=30, headers={
            "X-Gpurent-Timestamp": ts, "X-Gpurent-Nonce": nonce, "X-Gpurent-Signature": sig,
            "Content-Type": "application/json"})

    def close(self):
        """Gateways first, then the fleets (Cloud.close): a fleet left running
        would go on checking its replicas' health for ever."""
        for g in self.gateways:
            g.stop()
        super().close()


def assert_ledger_ok(m):
    """`gpurentd ledger verify` and the Python auditor (money_util) agree the books hold."""
    rc, out = ledger_verify(m.d.db_path)
    assert rc == 0, out
    con = sqlite3.connect(f"file:{m.d.db_path}?mode=ro", uri=True)
    try:
        assert ledger_breaches(con) == []
    finally:
        con.close()
