"""openapi_world.py: a daemon with a small sim fleet and a real object for
every path parameter of docs/openapi.json, and the requests that reach each
operation with the right credentials: shared by the tests that generate
requests from the document (tests/e2e/http/test_openapi_negative.py,
test_openapi_fuzz.py).

RAW                        the document as JSON
resolve(obj)               an object of RAW with its $refs followed
operations()               (METHOD, template, operation, parameters) of every
                           GET, POST, PUT, PATCH and DELETE
op_of(method, template)    (operation, parameters)
open_world(tmp)            context manager: a World (below) on a new daemon
                           under tmp, stopped on the way out
World                      c (instances_util.Cloud), d (its Daemon), admin (the
                           admin's key), owner and other (users with funds),
                           password_user, victim (for suspend/reinstate),
                           extra_key, ssh_key, volume, instance (running),
                           stopped, reservation, slug and app, node, image,
                           gpu_code, grant, topup, invite, month, now,
                           gateway_secret
path_values(w, template, method) -> {param: value}: the owner's real objects
fill(template, values)     the path with its parameters filled in
base_body(w, method, template)   a body that validates against the schema
base_query(w, method, template)  the query parameters an operation needs
credentials(w, method, template, path, data, key="owner") -> headers: the
                           bearer key (the admin's for /v1/admin/*) or the
                           gateway's or payment provider's signature
send(w, method, template, path, body=NOBODY, raw=None, params=None,
     key="owner", headers=None) -> requests.Response
"""
import contextlib
import copy
import hashlib
import hmac
import json
import re
import secrets
import time
import uuid

import requests

from harness import DEFAULT_PASSWORD, Daemon, stop_all, unique_email
from instances_util import Cloud
from money_util import iso
from openapi_check import SPEC_PATH

IMAGE = "rocm/pytorch:2.3-rocm6.2"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILbBhWGcV/wiZDYS5aJ2boLc2M1Dnq3rZcvNrrRWX43r me@laptop"
WEBHOOK_SECRET = "whsec-openapi-world"
MAX_BODY = 64 * 1024

with open(SPEC_PATH) as _f:
    RAW = json.load(_f)


def resolve(obj):
    """An object of the raw document with its $refs followed."""
    while isinstance(obj, dict) and "$ref" in obj:
        node = RAW
        for part in obj["$ref"].lstrip("#/").split("/"):
            node = node[part]
        obj = node
    return obj


def operations():
    for template, item in RAW["paths"].items():
        for method in ("get", "post", "put", "patch", "delete"):
            if method in item:
                params = [resolve(p) for p in item.get("parameters", []) + item[method].get("parameters", [])]
                yield method.upper(), template, item[method], params


def op_of(method, template):
    item = RAW["paths"][template]
    op = item[method.lower()]
    params = [resolve(p) for p in item.get("parameters", []) + op.get("parameters", [])]
    return op, params


class World:
    """A daemon with a small sim fleet and real objects for every path
    parameter; owner and other are users, admin is the admin's key."""

    def __init__(self, cloud):
        self.c = cloud
        self.d = cloud.d
        self.admin = cloud.d.admin_key


def topup(w, u, amount="1000.00"):
    r = w.d.request("POST", f"/v1/admin/users/{u.id}/topups", key=w.admin,
                    json={"amount": amount, "payment_id": f"pay-{uuid.uuid4().hex}"})
    assert r.status_code in (200, 201), r.text
    return r.json()


def ok(r, *want):
    assert r.status_code in want, f"setup: {r.request.method} {r.request.url}: {r.status_code} {r.text[:500]}"
    return r.json() if r.content else None


@contextlib.contextmanager
def open_world(tmp):
    made = []

    def new_daemon(**kw):
        d = Daemon(tmp / "daemon", **kw)
        made.append(d)
        return d

    gateway_secret = secrets.token_hex(32)
    secret_file = tmp / "gateway.secret"
    secret_file.write_text(gateway_secret + "\n")
    secret_file.chmod(0o600)
    cloud = Cloud(new_daemon, tmp, options={"gateway_secret_file": str(secret_file),
                                            "payment_webhook_secret": WEBHOOK_SECRET,
                                            "max_body_bytes": str(MAX_BODY)})
    try:
        cloud.fleet(1)
        cloud.fleet(1, model="H100-SXM", fabric="fabric-b")
        w = World(cloud)
        w.gateway_secret = gateway_secret
        d, a = w.d, w.admin
        w.owner, w.other = d.signup(), d.signup()
        for u in (w.owner, w.other):
            topup(w, u)
        w.password_user = d.signup()   # POST /v1/me/password's
        w.victim = d.signup()          # suspend / reinstate
        w.extra_key = d.create_key(w.owner.key, "neg")
        o = w.owner.key
        w.ssh_key = ok(d.request("POST", "/v1/ssh-keys", key=o, json={"name": "neg", "public_key": SSH_KEY}), 201)
        w.volume = ok(d.request("POST", "/v1/volumes", key=o, json={"name": "neg", "size_gb": 10}), 201)
        w.instance = ok(d.request("POST", "/v1/instances", key=o, json={
            "gpu_type": "MI450", "card_count": 1, "image": IMAGE, "name": "neg"}), 201)
        w.stopped = ok(d.request("POST", "/v1/instances", key=o, json={
            "gpu_type": "MI450", "card_count": 1, "image": IMAGE, "name": "neg-stopped"}), 201)
        cloud.wait_state(w.owner, w.instance["id"], "running")
        cloud.wait_state(w.owner, w.stopped["id"], "running")
        ok(d.request("POST", f"/v1/instances/{w.stopped['id']}/stop", key=o), 200)
        cloud.wait_state(w.owner, w.stopped["id"], "stopped")
        now = d.now()
        ok(d.request("PUT", "/v1/admin/prices/H100-SXM", key=a, json={"price_per_card_hour": "2.00",
                                                                      "effective_at": iso(now)}), 200)
        start = now - now % 3600 + 2 * 3600
        w.reservation = ok(d.request("POST", "/v1/reservations", key=o, json={
            "gpu_type": "H100-SXM", "cards": 8, "starts_at": iso(start), "ends_at": iso(start + 2 * 3600)}), 201)
        w.slug = f"neg-{secrets.token_hex(4)}"
        w.app = ok(d.request("POST", "/v1/apps", key=o, json={
            "slug": w.slug, "name": "Echo", "image": IMAGE, "gpu_type": "MI450", "port": 8000,
            "visibility": "private"}), 201)
        w.node = ok(d.request("GET", "/v1/admin/nodes", key=a, params={"gpu_model": "MI450"}), 200)["data"][0]
        w.image = ok(d.request("POST", "/v1/admin/images", key=a, json={"ref": "rocm/vllm:0.6-rocm6.2",
                                                                        "stack": "ROCm"}), 201)
        w.gpu_code = "NEG-X1"
        ok(d.request("PUT", f"/v1/admin/gpu-types/{w.gpu_code}", key=a, json={
            "vendor": "AMD", "memory_gb": 64, "memory_type": "HBM2e", "stack": "ROCm"}), 201)
        w.grant = ok(d.request("POST", f"/v1/admin/users/{w.owner.id}/grants", key=a, json={
            "amount": "5.00", "expires_at": iso(now + 30 * 86400), "reason": "neg"}), 201)
        w.topup = topup(w, w.owner, "10.00")
        w.invite = f"NEG{secrets.token_hex(3).upper()}"
        ok(d.request("POST", "/v1/admin/invite-codes", key=a, json={"code": w.invite, "amount": "5.00"}), 201)
        w.month = iso(now)[:7]
        w.now = now
        # A pass now settles the stopped instance's interval, which the
        # periodic pass would otherwise do during the cases, a change of
        # the database none of them made.
        ok(d.request("POST", "/v1/admin/billing/run", key=a, json={}), 200)
        yield w
    finally:
        cloud.close()
        stop_all(made)


# Path parameters: the owner's real object for each.
def path_values(w, template, method="GET"):
    owner_objects = {
        "/v1/api-keys/{id}": {"id": w.extra_key["id"]},
        "/v1/ssh-keys/{id}": {"id": w.ssh_key["id"]},
        "/v1/volumes/{id}": {"id": w.volume["id"]},
        # PATCH needs a stopped instance (a running one is 409 whatever the body)
        "/v1/instances/{id}": {"id": (w.stopped if method == "PATCH" else w.instance)["id"]},
        "/v1/reservations/{id}": {"id": w.reservation["id"]},
        "/v1/apps/{slug}": {"slug": w.slug},
        "/v1/statements/{month}": {"month": w.month},
        "/v1/admin/nodes/{id}": {"id": w.node["id"]},
        "/v1/admin/images/{id}": {"id": w.image["id"]},
        "/v1/admin/gpu-types/{code}": {"code": w.gpu_code},
        "/v1/admin/prices/{gpu_type}": {"gpu_type": "MI450"},
        "/v1/admin/storage-prices/{region}": {"region": "local"},
        "/v1/admin/invite-codes/{code}": {"code": w.invite},
        "/v1/admin/users/{id}/suspend": {"id": w.victim.id},
        "/v1/admin/users/{id}/reinstate": {"id": w.victim.id},
        "/v1/admin/users/{id}": {"id": w.owner.id},
        "/console/{dir}/{sub}/{file}": {"dir": "js", "sub": "pages", "file": "account.js"},
        "/console/{dir}/{file}": {"dir": "css", "file": "console.css"},
        "/console/{file}": {"file": "favicon.svg"},
    }
    values = {"grant_id": w.grant["grant_id"], "topup_id": w.topup["topup_id"]}
    for prefix, v in owner_objects.items():
        if template == prefix or template.startswith(prefix + "/"):
            values.update(v)
            break
    return values


def fill(template, values):
    return re.sub(r"\{([^}]+)\}", lambda m: values[m.group(1)], template)


def base_body(w, method, template):
    """A body that validates against the operation's schema (and which the
    daemon would take, for most): what each case breaks one thing of."""
    now = w.d.now()
    start = now - now % 3600 + 5 * 3600
    bases = {
        ("POST", "/v1/signup"): {"email": unique_email("neg"), "password": DEFAULT_PASSWORD},
        ("POST", "/v1/login"): {"email": w.owner.email, "password": DEFAULT_PASSWORD, "key_name": "neg"},
        ("POST", "/v1/api-keys"): {"name": "neg"},
        ("POST", "/v1/me/password"): {"current_password": DEFAULT_PASSWORD, "new_password": "a brand new passphrase"},
        ("POST", "/v1/verify-email"): {"token": "evc_" + "0" * 20},
        # An address without an account: the same 202 as any, and a
        # confirm's 400 that counts no wrong try, so the case's 4xx
        # leaves the database as it was.
        ("POST", "/v1/password-reset"): {"email": unique_email("neg")},
        ("POST", "/v1/password-reset/confirm"): {"email": unique_email("neg"), "code": "prc_" + "0" * 20,
                                                 "new_password": "a brand new passphrase"},
        ("POST", "/v1/invite-codes/redeem"): {"code": w.invite},
        ("POST", "/v1/ssh-keys"): {"name": "neg2", "public_key": SSH_KEY.replace("me@laptop", "other")},
        ("POST", "/v1/volumes"): {"name": "neg2", "size_gb": 5, "region": "local"},
        ("POST", "/v1/instances"): {"gpu_type": "MI450", "card_count": 1, "image": IMAGE,
                                    "ssh_key_ids": [w.ssh_key["id"]], "ports": [8080], "command": ["sleep", "1"],
                                    "env": [{"name": "A", "value": "b"}], "working_dir": "/w",
                                    "restart_policy": "never", "max_runtime_minutes": 60,
                                    "rendezvous_timeout_s": 60, "name": "neg2"},
        ("PATCH", "/v1/instances/{id}"): {"command": ["python3", "x.py"], "env": [{"name": "A", "value": "b"}]},
        ("POST", "/v1/instances/{id}/terminal-tokens"): {"rank": 0},
        ("POST", "/v1/reservations"): {"gpu_type": "H100-SXM", "cards": 8, "starts_at": iso(start + 10 * 3600),
                                       "ends_at": iso(start + 12 * 3600)},
        ("POST", "/v1/apps"): {"slug": f"neg-{secrets.token_hex(4)}", "name": "Echo2", "image": IMAGE,
                               "gpu_type": "MI450", "port": 8000, "env": [{"name": "A", "value": "b"}],
                               "price_per_request": "0.01"},
        ("PATCH", "/v1/apps/{slug}"): {"max_replicas": 2, "env": [{"name": "A", "value": "b"}]},
        ("POST", "/v1/admin/nodes"): {"name": "neg-spare-01", "agent_url": "http://127.0.0.1:9",
                                      "gpu_model": "MI450", "card_count": 8, "labels": {"rack": "r1"}},
        ("PATCH", "/v1/admin/nodes/{id}"): {"data_host": "127.0.0.1"},
        ("POST", "/v1/admin/nodes/{id}/state"): {"state": "cordoned", "reason": "neg"},
        ("POST", "/v1/admin/images"): {"ref": "rocm/other:1.0", "stack": "ROCm"},
        ("PUT", "/v1/admin/gpu-types/{code}"): {"vendor": "AMD", "memory_gb": 128, "memory_type": "HBM3",
                                               "stack": "ROCm", "features": ["x"]},
        ("PUT", "/v1/admin/prices/{gpu_type}"): {"price_per_card_hour": "3.00", "effective_at": iso(now + 3600),
                                                 "reason": "neg"},
        ("PUT", "/v1/admin/storage-prices/{region}"): {"price_per_gb_month": "0.40",
                                                       "effective_at": iso(now + 3600), "reason": "neg"},
        ("PUT", "/v1/admin/users/{id}/limits"): {"max_cards": 32, "reason": "neg"},
        ("POST", "/v1/admin/users/{id}/grants"): {"amount": "1.00", "expires_at": iso(now + 86400), "reason": "neg"},
        ("POST", "/v1/admin/users/{id}/topups"): {"amount": "1.00", "payment_id": f"pay-{uuid.uuid4().hex}"},
        ("POST", "/v1/admin/users/{id}/suspend"): {"reason": "neg"},
        ("POST", "/v1/admin/users/{id}/reinstate"): {"reason": "neg"},
        ("POST", "/v1/admin/invite-codes"): {"code": f"NEW{secrets.token_hex(3).upper()}", "amount": "1.00",
                                             "max_uses": 5, "credit_days": 30},
        ("POST", "/v1/admin/billing/run"): {"reason": "neg"},
        ("POST", "/v1/payments/webhook"): {"payment_id": f"pay_{uuid.uuid4().hex}", "user_id": w.owner.id,
                                           "amount": "5.00", "currency": "CNY"},
        ("POST", "/internal/gateway/reports"): {
            "gateway_id": "gw-neg", "demand": [{"app_id": "x", "in_flight": 0, "queued": 0}],
            # a record the daemon would settle: the owner's call of its app
            "usage": [{"id": "neg-call-0001", "app_id": w.app["id"], "user_id": w.owner.id,
                       "key_id": w.owner.key_id, "at": now, "status": 200, "input_tokens": 1, "output_tokens": 1,
                       "duration_ms": 10, "cold_start": 0, "completed": 1,
                       "prices": {"request": 0, "input_1k": 0, "output_1k": 0, "second": 0}}]},
    }
    return copy.deepcopy(bases.get((method, template)))


def base_query(w, method, template):
    return {
        "/v1/estimate": {"gpu_type": "MI450"},
        "/v1/reservations/availability": {"gpu_type": "H100-SXM", "from": iso(w.now + 7200),
                                          "to": iso(w.now + 4 * 3600)},
        "/v1/admin/users": {"email": w.owner.email},
        "/v1/instances/{id}/terminal": {"token": "trm_" + "0" * 64},
    }.get(template, {})


NOBODY = object()  # send(body=NOBODY) sends no body (body=None sends JSON null)


def credentials(w, method, template, path, data, key="owner"):
    """Headers that let the request through for the operation: the
    gateway's signature for /internal/*, the payment provider's for the
    webhook, else key as a bearer token ("owner" picks the key the
    operation wants: the admin's for /v1/admin/*; None sends none)."""
    if template.startswith("/internal/"):
        ts, nonce = str(int(time.time())), secrets.token_hex(16)
        canon = "\n".join([method, path, ts, nonce, hashlib.sha256(data or b"").hexdigest()])
        sig = hmac.new(w.gateway_secret.encode(), canon.encode(), hashlib.sha256).hexdigest()
        return {"X-Gpurent-Timestamp": ts, "X-Gpurent-Nonce": nonce, "X-Gpurent-Signature": sig}
    if template == "/v1/payments/webhook":
        ts = str(int(time.time()))
        sig = hmac.new(WEBHOOK_SECRET.encode(), ts.encode() + b"." + (data or b""), hashlib.sha256).hexdigest()
        return {"X-Gpurent-Webhook-Timestamp": ts, "X-Gpurent-Webhook-Signature": sig}
    item = RAW["paths"][template]
    # a method the path does not document has the security of one it does
    op = item.get(method.lower()) or next(item[m] for m in ("get", "post", "put", "patch", "delete") if m in item)
    security = op.get("security", RAW.get("security", []))
    if key == "owner":
        key = w.admin if template.startswith("/v1/admin/") else \
            (w.password_user.key if template == "/v1/me/password" else w.owner.key)
    return {"Authorization": f"Bearer {key}"} if security and key else {}


def send(w, method, template, path, body=NOBODY, raw=None, params=None, key="owner", headers=None):
    """One request with the right credentials for the operation; headers
    change or (with None) remove the JSON Content-Type a body goes with."""
    data = raw if raw is not None else (None if body is NOBODY else json.dumps(body).encode())
    headers = {**({"Content-Type": "application/json"} if data is not None else {}), **(headers or {}),
               **credentials(w, method, template, path, data, key)}
    return requests.request(method, w.d.url(path), data=data, params=params, headers=headers, timeout=30,
                            allow_redirects=False)
