"""ssh_util.py: what the access tests share: keys made with the real
ssh-keygen and its own fingerprints, and a fake node agent that reports an
SSH server in its facts and keeps every workload spec put to it.

keygen(dir, kind="ed25519", bits=None, comment="t@test") -> (pub line, path)
fingerprint(path) -> (bits, "SHA256:…") as `ssh-keygen -l -f` prints them
add_key(d, acct, line, name="k") -> the created key (asserts 201)
SshFakeAgent(ssh={"port", "host_key", "fingerprint"} or None)
    .url, .facts (mutable), .puts [(workload id, spec)], .close()
"""
import http.server
import json
import os
import subprocess
import threading
import time

from inventory_util import facts_doc


def keygen(directory, kind="ed25519", bits=None, comment="t@test"):
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    n = len(os.listdir(directory))
    path = os.path.join(directory, f"key{n}")
    args = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", comment, "-f", path]
    if bits:
        args += ["-b", str(bits)]
    subprocess.run(args, check=True, capture_output=True, timeout=60)
    with open(path + ".pub") as f:
        return f.read().strip(), path + ".pub"


def fingerprint(path):
    out = subprocess.run(["ssh-keygen", "-l", "-f", path], check=True, capture_output=True, text=True,
                         timeout=60).stdout.split()
    return int(out[0]), out[1]


def add_key(d, acct, line, name="k"):
    r = d.post("/v1/ssh-keys", key=acct.key, json={"name": name, "public_key": line})
    assert r.status_code == 201, r.text
    return r.json()


class SshFakeAgent:
    """A node agent that runs every workload put to it at once, and whose
    facts carry `ssh` (contract 2 of issue 11) when given."""

    def __init__(self, ssh=None, name="fake-ssh"):
        self.facts = facts_doc(name)
        if ssh is not None:
            self.facts["ssh"] = ssh
        self.workloads = {}
        self.now = None  # the clock its workload list reports: the real one when None
        self.puts = []
        self.key_puts = []  # (workload id, authorized_keys) of each PUT .../ssh-keys
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, doc=None):
                body = b"" if doc is None else json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _wl(self, wl_id):
                return {"id": wl_id, "phase": "running", "message": "", **outer.workloads[wl_id]}

            def do_GET(self):
                with outer.lock:
                    if self.path == "/v1/facts":
                        return self._send(200, outer.facts)
                    if self.path == "/v1/workloads":
                        return self._send(200, {"workloads": [self._wl(i) for i in outer.workloads],
                                                "now": int(time.time()) if outer.now is None else outer.now})
                    wl_id = self.path.rsplit("/", 1)[-1]
                    if wl_id in outer.workloads:
                        return self._send(200, self._wl(wl_id))
                    return self._send(404, {"error": {"code": "not_found", "message": "no", "field": None}})

            def do_PUT(self):
                spec = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path.endswith("/ssh-keys"):  # a change of the account's keys
                    wl_id = self.path.rsplit("/", 2)[-2]
                    with outer.lock:
                        outer.key_puts.append((wl_id, spec["authorized_keys"]))
                        if wl_id not in outer.workloads:
                            return self._send(404, {"error": {"code": "not_found", "message": "no", "field": None}})
                    return self._send(200, {"id": wl_id, "keys": len(spec["authorized_keys"]),
                                            "ssh_keys_digest": ""})
                wl_id = self.path.rsplit("/", 1)[-1]
                with outer.lock:
                    outer.puts.append((wl_id, spec))
                    outer.workloads[wl_id] = {"image": spec["image"], "gpus": spec["gpus"]}
                    return self._send(201, self._wl(wl_id))

            def do_DELETE(self):
                wl_id = self.path.rsplit("/", 1)[-1]
                with outer.lock:
                    outer.workloads.pop(wl_id, None)
                return self._send(204)

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def specs(self):
        with self.lock:
            return list(self.puts)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
