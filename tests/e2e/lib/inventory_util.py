"""inventory_util.py: helpers for the inventory end-to-end tests.

Module-level
------------
free_port() -> int            a free TCP port below the ephemeral range (ports.py)
                              (for agents that must come back on the same URL)
register(d, name, url, model="MI450", cards=8, fabric="fabric-a",
         region="local", labels=None) -> (node dict, secret)
                              POST /v1/admin/nodes as the admin, asserting 201
node(d, node_id) -> dict      GET /v1/admin/nodes/{id} as the admin (200)
nodes(d, **query) -> [dict]   every page of GET /v1/admin/nodes
gpu_type(d, code) -> dict     the type's entry in the public GET /v1/gpu-types
counts(d, code) -> (total, free, in_use)
set_state(d, node_id, state, reason=None) -> Response
wait_node(d, node_id, pred, timeout=20, what="") -> dict
                              polls GET /v1/admin/nodes/{id} until pred(node)
wait_state(d, node_id, state, timeout=20) -> dict
wait_beat(d, node_ids, timeout=20) -> int
                              moves the testing clock forward and waits until
                              every node's last_seen_at shows the new time, so
                              a test can tell a heartbeat happened without
                              sleeping; returns the new time
iso(t) -> str                 epoch seconds as the API writes them
facts_doc(name, model, cards, ...) -> dict
                              a facts document as docs/AGENT_PROTOCOL.md gives it

FakeAgent(mode="facts", *, model="MI450", cards=8)
    A node agent written in Python (http.server) that can misbehave.
    Attributes: url (its base URL), requests (list of (method, path,
    headers) received), secret (when set, GET /v1/facts signatures are
    checked against it and a bad one gets 401).
    mode (settable at any time):
      facts     a correct facts document (self.facts, editable)
      hang      reads the request and never answers (until close())
      http500   500 with a JSON error body
      garbage   200 with bytes that are not JSON
      huge      200 with a 10 MB body (a valid JSON document, so only its
                size can be what refuses it)
      drip      200 headers, then one byte of body every 50 ms, forever
      close     closes the connection without answering
      redirect  302 to another host
      body      200 with self.body (bytes) as it is
    close() releases any hung handlers and stops the server.
"""
import datetime
import hashlib
import hmac
import http.server
import json
import socket
import threading
import time

from agent_util import poll
from ports import free_port  # noqa: F401  (for the inventory tests)

HUGE_BYTES = 10 * 1024 * 1024


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def register(d, name, url, model="MI450", cards=8, fabric="fabric-a", region="local", labels=None):
    body = {"name": name, "agent_url": url, "gpu_model": model, "card_count": cards, "fabric": fabric,
            "region": region}
    if labels is not None:
        body["labels"] = labels
    r = d.post("/v1/admin/nodes", key=d.admin_key, json=body)
    assert r.status_code == 201, r.text
    out = r.json()
    return out["node"], out["secret"]


def node(d, node_id):
    r = d.get(f"/v1/admin/nodes/{node_id}", key=d.admin_key)
    assert r.status_code == 200, r.text
    return r.json()


def nodes(d, **query):
    out, cursor = [], None
    while True:
        params = dict(query)
        if cursor:
            params["cursor"] = cursor
        r = d.get("/v1/admin/nodes", key=d.admin_key, params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        out += body["data"]
        cursor = body["next_cursor"]
        if cursor is None:
            return out


def gpu_type(d, code):
    r = d.get("/v1/gpu-types")
    assert r.status_code == 200, r.text
    found = [t for t in r.json()["data"] if t["code"] == code]
    assert len(found) == 1, r.json()
    return found[0]


def counts(d, code):
    t = gpu_type(d, code)
    return t["cards_total"], t["cards_free"], t["cards_in_use"]


def set_state(d, node_id, state, reason=None):
    body = {"state": state}
    if reason is not None:
        body["reason"] = reason
    return d.post(f"/v1/admin/nodes/{node_id}/state", key=d.admin_key, json=body)


def wait_node(d, node_id, pred, timeout=20, what=""):
    last = {}

    def check():
        last["node"] = node(d, node_id)
        return last["node"] if pred(last["node"]) else None
    try:
        return poll(check, timeout, what or f"node {node_id}")
    except AssertionError as e:
        raise AssertionError(f"{e}\nlast seen: {json.dumps(last.get('node'), indent=1)}") from None


def wait_state(d, node_id, state, timeout=20):
    return wait_node(d, node_id, lambda n: n["state"] == state, timeout, f"node {node_id} to be {state}")


def wait_beat(d, node_ids, timeout=20):
    t = d.advance_clock(60)
    for node_id in node_ids:
        wait_node(d, node_id, lambda n: n["last_seen_at"] == iso(t), timeout,
                  f"a heartbeat of {node_id} after the clock moved to {iso(t)}")
    return t


def facts_doc(name, model="MI450", cards=8, memory_gb=192, failed=(), vendor="AMD", stack="ROCm"):
    return {
        "node": name, "agent_version": "0.1.0", "runtime": "sim", "vendor": vendor, "stack": stack,
        "driver_version": "6.8.5", "stack_version": "6.2.0",
        "cards": [{"index": i, "model": model, "name": f"AMD Instinct {model}", "memory_gb": memory_gb,
                   "healthy": i not in failed, "health_reason": "ECC" if i in failed else ""}
                  for i in range(cards)],
        "workloads": 0,
    }


def _signature_ok(secret, method, path, headers):
    ts = headers.get("X-Gpurent-Timestamp", "")
    nonce = headers.get("X-Gpurent-Nonce", "")
    sig = headers.get("X-Gpurent-Signature", "")
    canonical = "\n".join([method, path, ts, nonce, hashlib.sha256(b"").hexdigest()])
    want = hmac.new(secret.encode(), canonical.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, sig) and abs(int(ts or 0) - time.time()) < 300


class FakeAgent:
    def __init__(self, mode="facts", *, model="MI450", cards=8, name="fake"):
        self.mode = mode
        self.facts = facts_doc(name, model, cards)
        self.body = b""
        self.secret = None
        self.requests = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, body, ctype="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                with outer.lock:
                    outer.requests.append(("GET", self.path, dict(self.headers)))
                mode = outer.mode
                try:
                    if mode == "hang":
                        outer.release.wait(120)
                        self.close_connection = True
                    elif mode == "http500":
                        self._send(500, b'{"error":{"code":"internal","message":"boom","field":null}}')
                    elif mode == "garbage":
                        self._send(200, b"\x00\xffthis is not json {{{ \x80\x81" * 50, "text/plain")
                    elif mode == "huge":
                        doc = json.dumps(outer.facts).encode()
                        pad = HUGE_BYTES - len(doc)
                        self._send(200, doc[:-1] + b" " * pad + b"}")
                    elif mode == "drip":
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", "100000")
                        self.end_headers()
                        self.wfile.write(b"{")
                        while not outer.release.wait(0.05):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                    elif mode == "close":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                    elif mode == "redirect":
                        self.send_response(302)
                        self.send_header("Location", "http://127.0.0.1:1/v1/facts")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                    elif mode == "body":
                        self._send(200, outer.body)
                    else:
                        if outer.secret and not _signature_ok(outer.secret, "GET", self.path, self.headers):
                            self._send(401, b'{"error":{"code":"bad_signature","message":"no","field":null}}')
                        else:
                            self._send(200, json.dumps(outer.facts).encode())
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # the daemon hanging up on a misbehaving reply is expected

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self):
        with self.lock:
            return len(self.requests)

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
