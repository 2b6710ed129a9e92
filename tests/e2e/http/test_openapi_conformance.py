"""test_openapi_conformance.py: the API answers what docs/openapi.json says,
as a third-party validator (schemathesis and the like) would check it.

One daemon with a small sim fleet (MI450 for on-demand instances, H100-SXM
for reservations), the gateway and payment webhook secrets set, and a walk
through the API a user and an admin would take, with the usual wrong turns
(no key, another user's id, bad bodies, an unknown method, an oversize
body). Every answer goes through openapi_check.Spec.check: the operation is
documented, its status is documented (or `default`), its Content-Type is
one the document lists and its JSON body validates against the schema.
GETs are repeated as HEAD and every path is asked OPTIONS, as validators do.

At the end, most of the document's operations must have been exercised;
the ones that were not are listed in NOT_WALKED with the reason.
"""
import hashlib
import hmac
import json
import secrets
import time
import uuid

import pytest
import requests

from harness import DEFAULT_PASSWORD, unique_email
from instances_util import Cloud
from money_util import iso
from openapi_check import Spec

IMAGE = "rocm/pytorch:2.3-rocm6.2"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILbBhWGcV/wiZDYS5aJ2boLc2M1Dnq3rZcvNrrRWX43r me@laptop"
WEBHOOK_SECRET = "whsec-openapi-conformance"
MAX_BODY = 64 * 1024

# Operations the walk does not call, and why. Anything else left out fails
# the test, so a new operation gets walked (or a line here).
# Empty today: the WebSocket terminal is walked too, as a validator calls it
# (a plain GET, not an upgrade: 400); its 101 protocol switch is
# tests/e2e/access/test_terminal.py's.
NOT_WALKED = set()


@pytest.fixture
def cloud(new_daemon, tmp_path):
    secret_file = tmp_path / "gateway.secret"
    gateway_secret = secrets.token_hex(32)
    secret_file.write_text(gateway_secret + "\n")
    secret_file.chmod(0o600)
    c = Cloud(new_daemon, tmp_path, options={"gateway_secret_file": str(secret_file),
                                             "payment_webhook_secret": WEBHOOK_SECRET,
                                             "max_body_bytes": str(MAX_BODY)})
    c.gateway_secret = gateway_secret
    yield c
    c.close()


class Walk:
    """Calls the API and checks every answer against the document."""

    def __init__(self, cloud):
        self.c = cloud
        self.d = cloud.d
        self.spec = Spec(collect=True, strict_fields=True)
        self.admin = cloud.d.admin_key
        self.seen_paths = set()

    def call(self, method, path, key=None, expect=None, head=True, **kw):
        """One request, checked; expect (a status or a tuple of them) is
        what the walk needs to go on. A GET is repeated as HEAD when the
        document has HEAD for the path, and each concrete path gets one
        OPTIONS."""
        r = self.d.request(method, path, key=key, **kw)
        self.spec.check(r)
        if expect is not None:
            want = expect if isinstance(expect, tuple) else (expect,)
            # Noted rather than raised, so one run shows every surprise;
            # a step that needs the answer fails on its own right after.
            if r.status_code not in want:
                self.spec.problems.append(f"walk: {method} {path}: want {want}, got {r.status_code}: {r.text[:500]}")
        if method == "GET" and head and self.spec.match("HEAD", path):
            h = self.d.request("HEAD", path, key=key, params=kw.get("params"), headers=kw.get("headers"))
            self.spec.check(h)
            assert h.status_code == r.status_code, f"HEAD {path}: {h.status_code}, GET: {r.status_code}"
        bare = path.split("?")[0]
        if bare not in self.seen_paths and self.spec.match("OPTIONS", bare):
            self.seen_paths.add(bare)
            self.spec.check(self.d.request("OPTIONS", bare))
        return r

    def json(self, method, path, key=None, expect=200, **kw):
        return self.call(method, path, key=key, expect=expect, **kw).json()

    def undocumented_method(self, method, path, key=None):
        """A method the path does not have: 405 with the documented methods
        in Allow and the error body (the `default` answer's schema)."""
        assert self.spec.match(method, path) is None, (method, path)
        r = self.d.request(method, path, key=key)
        assert r.status_code == 405, r.text
        op = next(self.spec.match(m, path) for m in ("GET", "POST", "PUT", "DELETE", "PATCH")
                  if self.spec.match(m, path))
        # OPTIONS is answered on every path and left out of Allow, as the
        # document's OPTIONS operations say ("Allow: GET, HEAD").
        documented = {m.upper() for m in self.spec.doc["paths"][op[1]] if m in
                      ("get", "head", "post", "put", "patch", "delete")}
        allowed = {m.strip() for m in r.headers.get("Allow", "").split(",")}
        assert allowed == documented, f"{method} {path}: Allow {allowed}, documented {documented}"
        assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
        assert self.spec._validate({"$ref": "#/components/schemas/Error"}, r.json()) == []

    def undocumented_path(self, method, path, key=None):
        """A path the document does not have: 404 with the error body."""
        assert self.spec.match(method, path) is None, (method, path)
        r = self.d.request(method, path, key=key)
        assert r.status_code == 404, r.text
        assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
        assert self.spec._validate({"$ref": "#/components/schemas/Error"}, r.json()) == []

    def signed(self, method, path, body=None, secret=None):
        """A request signed like gpurent-gateway's (HMAC over five lines)."""
        data = b"" if body is None else json.dumps(body).encode()
        ts, nonce = str(int(time.time())), secrets.token_hex(16)
        canon = "\n".join([method, path, ts, nonce, hashlib.sha256(data).hexdigest()])
        sig = hmac.new((secret or self.c.gateway_secret).encode(), canon.encode(), hashlib.sha256).hexdigest()
        r = requests.request(method, self.d.url(path), data=data or None, timeout=30, headers={
            "X-Gpurent-Timestamp": ts, "X-Gpurent-Nonce": nonce, "X-Gpurent-Signature": sig,
            "Content-Type": "application/json"})
        self.spec.check(r)
        self.spec.check(self.d.request("OPTIONS", path))
        return r


# ------------------------------------------------------------ areas

def public(w):
    w.json("GET", "/healthz")
    w.json("GET", "/readyz")
    w.call("GET", "/v1/openapi.json", expect=200)
    r = w.call("GET", "/v1/gpu-types", expect=200)
    if r.headers.get("ETag"):
        w.call("GET", "/v1/gpu-types", headers={"If-None-Match": r.headers["ETag"]}, expect=304, head=False)
    w.call("GET", "/v1/gpu-types", params={"bogus": "1"}, expect=400)
    w.json("GET", "/v1/images")
    w.json("GET", "/v1/prices")
    w.json("GET", "/v1/storage-prices")
    w.json("GET", "/v1/estimate", params={"gpu_type": "MI450", "card_count": 8, "hours": 3})
    w.call("GET", "/v1/estimate", params={"gpu_type": "MI450", "card_count": "x"}, expect=400)
    w.json("GET", "/v1/apps")
    w.call("GET", "/", expect=302)
    w.call("GET", "/console", expect=200)
    w.call("GET", "/console/favicon.svg", expect=200)
    w.call("GET", "/console/css/console.css", expect=200)
    w.call("GET", "/console/js/pages/account.js", expect=200)
    w.call("GET", "/console/js/nope/none.js", expect=404)
    w.undocumented_path("GET", "/v1/nope")


def accounts(w):
    """Sign-up to login, the account's keys; returns (user, other user)."""
    email = unique_email("oa")
    body = w.json("POST", "/v1/signup", json={"email": email, "password": DEFAULT_PASSWORD}, expect=201)
    key = body["api_key"]["token"]
    w.call("POST", "/v1/signup", json={"email": email, "password": DEFAULT_PASSWORD}, expect=409)
    w.call("POST", "/v1/signup", json={"email": "not-an-address", "password": DEFAULT_PASSWORD}, expect=400)
    w.call("POST", "/v1/signup", data=b"{", headers={"Content-Type": "application/json"}, expect=400)
    w.call("POST", "/v1/signup", json=[1], expect=400)
    w.call("POST", "/v1/signup", json={"email": email, "password": DEFAULT_PASSWORD, "x": 1}, expect=400)
    w.json("POST", "/v1/verify-email/resend", key=key, expect=202)
    w.call("POST", "/v1/verify-email", json={"token": "evc_" + "0" * 20}, expect=(400, 404))
    w.json("POST", "/v1/verify-email", json={"token": w.d.verification_code(email)})
    w.call("POST", "/v1/verify-email/resend", key=key, expect=(409, 429))
    # A forgotten password: the same 202 for an account's address and for
    # nobody's; a code that does not work is 400 (the mail, and so the
    # 200, is tests/e2e/accounts/test_password_reset.py's).
    w.json("POST", "/v1/password-reset", json={"email": email}, expect=202)
    w.json("POST", "/v1/password-reset", json={"email": unique_email("nobody")}, expect=202)
    w.call("POST", "/v1/password-reset", json={"email": "not-an-address"}, expect=400)
    w.call("POST", "/v1/password-reset/confirm", json={"email": email, "code": "prc_" + "0" * 20,
                                                       "new_password": "a brand new passphrase"}, expect=400)
    w.json("POST", "/v1/login", json={"email": email, "password": DEFAULT_PASSWORD, "key_name": "laptop"})
    w.call("POST", "/v1/login", json={"email": email, "password": "wrong password!"}, expect=401)
    w.json("GET", "/v1/me", key=key)
    w.call("GET", "/v1/me", expect=401)
    w.call("GET", "/v1/me", key="gpk_" + "0" * 20 + "_" + "0" * 64, expect=401)
    w.json("POST", "/v1/me/password", key=key,
           json={"current_password": DEFAULT_PASSWORD, "new_password": "a brand new passphrase"})
    w.call("POST", "/v1/me/password", key=key, json={"current_password": "nope nope nope", "new_password":
                                                     "another new passphrase"}, expect=(400, 401, 403))
    made = w.json("POST", "/v1/api-keys", key=key, json={"name": "ci"}, expect=201)
    w.json("GET", "/v1/api-keys", key=key)
    w.json("GET", f"/v1/api-keys/{made['id']}", key=key)
    w.json("DELETE", f"/v1/api-keys/{made['id']}", key=key)
    w.call("GET", f"/v1/api-keys/{made['id']}", key=key, expect=(200, 404))
    w.call("GET", "/v1/api-keys/key_nosuchkeyatall00000", key=key, expect=404)
    w.json("POST", "/v1/api-keys", key=key, json={}, expect=201)
    w.json("DELETE", "/v1/api-keys", key=key)
    w.call("DELETE", "/v1/api-keys", key=key, params={"keep_current": "maybe"}, expect=400)
    w.call("POST", "/v1/api-keys", key=key, data=b"{" + b" " * (MAX_BODY + 10) + b"}",
           headers={"Content-Type": "application/json"}, expect=413)
    w.undocumented_method("PUT", "/v1/me", key=key)
    w.undocumented_method("DELETE", "/v1/balance", key=key)
    user = w.d.signup()
    other = w.d.signup()
    for u in (user, other):
        w.json("POST", f"/v1/admin/users/{u.id}/topups", key=w.admin,
               json={"amount": "1000.00", "payment_id": f"pay-{uuid.uuid4().hex}"}, expect=(200, 201))
    w.call("POST", "/v1/invite-codes/redeem", key=user.key, json={"code": "NOSUCHCODE"}, expect=(400, 404, 409))
    return user, other


def ssh_keys(w, u, other):
    k = w.json("POST", "/v1/ssh-keys", key=u.key, json={"name": "laptop", "public_key": SSH_KEY}, expect=201)
    w.call("POST", "/v1/ssh-keys", key=u.key, json={"name": "laptop", "public_key": SSH_KEY}, expect=409)
    w.call("POST", "/v1/ssh-keys", key=u.key, json={"name": "bad", "public_key": "ssh-rsa nope"}, expect=400)
    w.json("GET", "/v1/ssh-keys", key=u.key)
    w.json("GET", f"/v1/ssh-keys/{k['id']}", key=u.key)
    w.call("GET", f"/v1/ssh-keys/{k['id']}", key=other.key, expect=404)
    return k


def volumes(w, u, other):
    v = w.json("POST", "/v1/volumes", key=u.key, json={"name": "scratch", "size_gb": 10}, expect=201)
    w.call("POST", "/v1/volumes", key=u.key, json={"name": "scratch", "size_gb": -1}, expect=400)
    w.json("GET", "/v1/volumes", key=u.key)
    w.json("GET", f"/v1/volumes/{v['id']}", key=u.key)
    w.call("GET", f"/v1/volumes/{v['id']}", key=other.key, expect=404)
    w.call("DELETE", f"/v1/volumes/{v['id']}", key=u.key, expect=204)
    w.call("DELETE", f"/v1/volumes/{v['id']}", key=u.key, expect=404)


def instances(w, u, other, ssh_key):
    c = w.c
    inst = w.json("POST", "/v1/instances", key=u.key, expect=201, json={
        "gpu_type": "MI450", "card_count": 1, "image": IMAGE, "name": "oa-run", "ssh_key_ids": [ssh_key["id"]]})
    iid = inst["id"]
    w.call("POST", "/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 64, "image": IMAGE},
           expect=403)  # quota_exceeded
    w.call("POST", "/v1/instances", key=u.key, json={"gpu_type": "NOPE", "card_count": 1, "image": IMAGE},
           expect=(400, 422))
    w.call("POST", "/v1/instances", key=u.key, json={"gpu_type": "MI450"}, expect=400)
    w.call("POST", "/v1/instances", key=other.key, json={"gpu_type": "MI450", "card_count": 8, "image": IMAGE},
           expect=409)  # insufficient_capacity: u holds a card of the only node
    unverified = w.d.signup(verify=False)
    w.call("POST", "/v1/instances", key=unverified.key, json={"gpu_type": "MI450", "card_count": 1, "image": IMAGE},
           expect=403)
    w.json("GET", "/v1/instances", key=u.key)
    w.json("GET", "/v1/instances", key=u.key, params={"limit": 1})
    w.call("GET", "/v1/instances", key=u.key, params={"limit": "lots"}, expect=400)
    c.wait_state(u, iid, "running")
    w.json("GET", f"/v1/instances/{iid}", key=u.key)
    w.call("GET", f"/v1/instances/{iid}", key=other.key, expect=404)
    w.json("GET", f"/v1/instances/{iid}/events", key=u.key)
    w.call("GET", f"/v1/instances/{iid}/ssh-config", key=u.key, expect=200)
    w.call("GET", f"/v1/instances/{iid}/ssh-config", key=other.key, expect=404)
    w.json("GET", f"/v1/instances/{iid}/logs", key=u.key, params={"tail": 10})
    w.call("GET", f"/v1/instances/{iid}/logs", key=u.key, params={"tail": "x"}, expect=400)
    tok = w.json("POST", f"/v1/instances/{iid}/terminal-tokens", key=u.key, json={"rank": 0}, expect=201)
    # Not an upgrade request, as a validator sends it: 400 (or 401 if the
    # token is read first); either way the error shape.
    w.call("GET", f"/v1/instances/{iid}/terminal", params={"token": tok.get("token", "x")}, expect=(400, 401))
    w.call("POST", f"/v1/instances/{iid}/terminal-tokens", key=u.key, json={"rank": 7}, expect=(400, 404, 409))
    w.call("PATCH", f"/v1/instances/{iid}", key=u.key, json={"working_dir": "/shared"}, expect=(200, 409))
    w.call("PATCH", f"/v1/instances/{iid}", key=u.key, json={"nope": 1}, expect=400)
    w.json("POST", f"/v1/instances/{iid}/stop", key=u.key)
    c.wait_state(u, iid, "stopped")
    w.call("GET", f"/v1/instances/{iid}/logs", key=u.key, expect=(200, 409))
    w.call("POST", f"/v1/instances/{iid}/stop", key=u.key, expect=(200, 409))
    w.json("PATCH", f"/v1/instances/{iid}", key=u.key, json={"command": ["python3", "train.py"],
                                                             "env": [{"name": "HF_HOME", "value": "/shared/hf"}]})
    w.json("POST", f"/v1/instances/{iid}/start", key=u.key)
    w.call("POST", f"/v1/instances/{iid}/start", key=other.key, expect=404)
    c.wait_state(u, iid, "running")
    w.json("DELETE", f"/v1/instances/{iid}", key=u.key)
    c.wait_state(u, iid, "terminated")
    w.call("POST", f"/v1/instances/{iid}/start", key=u.key, expect=409)
    w.call("GET", f"/v1/instances/{iid}/ssh-config", key=u.key, expect=409)
    w.call("DELETE", f"/v1/instances/{iid}", key=u.key, expect=(200, 409))
    w.call("POST", f"/v1/instances/{iid}/terminal-tokens", key=u.key, json={"rank": 0}, expect=409)
    return iid


def money(w, u):
    w.json("GET", "/v1/balance", key=u.key)
    w.json("GET", "/v1/transactions", key=u.key)
    w.json("GET", "/v1/transactions", key=u.key, params={"limit": 2})
    w.json("GET", "/v1/usage", key=u.key)
    w.call("GET", "/v1/usage", key=u.key, params={"group_by": "nope"}, expect=400)
    month = iso(w.d.now())[:7]
    w.json("GET", f"/v1/statements/{month}", key=u.key)
    w.call("GET", f"/v1/statements/{month}", key=u.key, params={"format": "csv"}, expect=200)
    w.call("GET", "/v1/statements/2027-13", key=u.key, expect=404)
    w.call("GET", "/v1/statements/1999-01", key=u.key, expect=(200, 404))


def reservations(w, u, other):
    now = w.d.now()
    start = now - now % 3600 + 2 * 3600
    w.json("GET", "/v1/reservations/availability", key=u.key,
           params={"gpu_type": "H100-SXM", "from": iso(start), "to": iso(start + 3 * 3600)})
    w.call("GET", "/v1/reservations/availability", key=u.key, params={"gpu_type": "H100-SXM"}, expect=400)
    r = w.json("POST", "/v1/reservations", key=u.key, expect=201, json={
        "gpu_type": "H100-SXM", "cards": 8, "starts_at": iso(start), "ends_at": iso(start + 2 * 3600)})
    w.call("POST", "/v1/reservations", key=other.key, expect=(409, 422), json={
        "gpu_type": "H100-SXM", "cards": 8, "starts_at": iso(start), "ends_at": iso(start + 2 * 3600)})
    w.call("POST", "/v1/reservations", key=u.key, expect=400, json={
        "gpu_type": "H100-SXM", "cards": 8, "starts_at": iso(start), "ends_at": iso(start)})
    w.json("GET", "/v1/reservations", key=u.key)
    w.json("GET", f"/v1/reservations/{r['id']}", key=u.key)
    w.call("GET", f"/v1/reservations/{r['id']}", key=other.key, expect=404)
    # Launching on it before it starts: 409 invalid_state, the reservation's state.
    w.call("POST", "/v1/instances", key=u.key, expect=409, json={
        "gpu_type": "H100-SXM", "card_count": 8, "image": IMAGE, "reservation_id": r["id"]})
    w.json("DELETE", f"/v1/reservations/{r['id']}", key=u.key)
    w.call("DELETE", f"/v1/reservations/{r['id']}", key=u.key, expect=(200, 409))


def apps(w, u, other):
    slug = f"oa-{secrets.token_hex(4)}"
    base = {"slug": slug, "name": "Echo", "image": IMAGE, "gpu_type": "MI450", "port": 8000,
            "price_per_1k_output_tokens": "0.004",
            "env": [{"name": "MODEL", "value": "x"}, {"name": "TOKEN", "value": "s3cret", "secret": True}]}
    w.json("POST", "/v1/apps", key=u.key, json=base, expect=201)
    w.call("POST", "/v1/apps", key=other.key, json=base, expect=409)
    w.call("POST", "/v1/apps", key=u.key, json={**base, "port": "80"}, expect=400)
    w.json("GET", "/v1/apps")
    w.json("GET", "/v1/apps", key=u.key, params={"mine": 1})
    w.json("GET", f"/v1/apps/{slug}", key=u.key)
    w.json("GET", f"/v1/apps/{slug}", key=other.key)
    w.json("PATCH", f"/v1/apps/{slug}", key=u.key, json={"max_replicas": 2, "visibility": "private"})
    w.call("PATCH", f"/v1/apps/{slug}", key=other.key, json={"max_replicas": 3}, expect=404)
    w.json("GET", f"/v1/apps/{slug}/stats", key=u.key)
    w.call("GET", f"/v1/apps/{slug}/stats", key=other.key, expect=404)
    state = w.signed("GET", "/internal/gateway/state")
    assert state.status_code == 200, state.text
    head = w.signed("HEAD", "/internal/gateway/state")
    assert head.status_code == 200, head.text
    bad = w.signed("GET", "/internal/gateway/state", secret="0" * 64)
    assert bad.status_code == 401, bad.text
    rep = w.signed("POST", "/internal/gateway/reports", {"gateway_id": "gw-oa", "demand": [], "usage": []})
    assert rep.status_code == 200, rep.text
    rep = w.signed("POST", "/internal/gateway/reports", {"gateway_id": "gw-oa"})
    assert rep.status_code == 400, rep.text
    w.call("DELETE", f"/v1/apps/{slug}", key=u.key, expect=204)
    w.call("GET", f"/v1/apps/{slug}", key=u.key, expect=404)


def payments(w, u):
    body = json.dumps({"payment_id": f"pay_{uuid.uuid4().hex}", "user_id": u.id, "amount": "5.00",
                       "currency": "CNY"}).encode()
    ts = str(int(time.time()))
    sig = hmac.new(WEBHOOK_SECRET.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    h = {"X-Gpurent-Webhook-Timestamp": ts, "X-Gpurent-Webhook-Signature": sig, "Content-Type": "application/json"}
    w.call("POST", "/v1/payments/webhook", data=body, headers=h, expect=201)
    w.call("POST", "/v1/payments/webhook", data=body, headers=h, expect=200)
    w.call("POST", "/v1/payments/webhook", data=body, headers={**h, "X-Gpurent-Webhook-Signature": "0" * 64},
           expect=401)


def admin_nodes(w):
    a = w.admin
    listed = w.json("GET", "/v1/admin/nodes", key=a)
    node = listed["data"][0]
    nid = node["id"]
    w.json("GET", f"/v1/admin/nodes/{nid}", key=a)
    w.call("GET", "/v1/admin/nodes/node_nosuchnodeatall0000", key=a, expect=404)
    w.json("PATCH", f"/v1/admin/nodes/{nid}", key=a, json={"data_host": "127.0.0.1"})
    w.json("POST", f"/v1/admin/nodes/{nid}/state", key=a, json={"state": "cordoned", "reason": "openapi walk"})
    w.call("POST", f"/v1/admin/nodes/{nid}/state", key=a, json={"state": "sideways"}, expect=400)
    w.json("POST", f"/v1/admin/nodes/{nid}/state", key=a, json={"state": "ready"})
    extra = w.json("POST", "/v1/admin/nodes", key=a, expect=201, json={
        "name": "oa-spare-01", "agent_url": "http://127.0.0.1:9", "gpu_model": "MI450", "card_count": 8,
        "fabric": "fabric-z", "region": "local"})
    w.call("POST", "/v1/admin/nodes", key=a, expect=409, json={
        "name": "oa-spare-01", "agent_url": "http://127.0.0.1:9", "gpu_model": "MI450", "card_count": 8})
    w.call("DELETE", f"/v1/admin/nodes/{extra['node']['id']}", key=a, expect=(204, 409))
    w.call("GET", "/v1/admin/nodes", key=w.d.signup().key, expect=403)


def admin_catalog(w):
    a = w.admin
    w.call("PUT", "/v1/admin/gpu-types/OA-X1", key=a, expect=201, json={
        "vendor": "AMD", "memory_gb": 64, "memory_type": "HBM2e", "stack": "ROCm", "description": "walk"})
    w.call("PUT", "/v1/admin/gpu-types/OA-X1", key=a, expect=200, json={
        "vendor": "AMD", "memory_gb": 64, "memory_type": "HBM2e", "stack": "ROCm"})
    w.call("PUT", "/v1/admin/gpu-types/OA-X1", key=a, expect=400, json={"vendor": "AMD"})
    w.call("DELETE", "/v1/admin/gpu-types/OA-X1", key=a, expect=204)
    w.call("DELETE", "/v1/admin/gpu-types/OA-X1", key=a, expect=404)
    w.call("DELETE", "/v1/admin/gpu-types/MI450", key=a, expect=409)
    img = w.json("POST", "/v1/admin/images", key=a, json={"ref": "rocm/vllm:0.6-rocm6.2", "stack": "ROCm"},
                 expect=201)
    w.call("POST", "/v1/admin/images", key=a, json={"ref": "rocm/vllm:0.6-rocm6.2", "stack": "ROCm"}, expect=409)
    w.call("DELETE", f"/v1/admin/images/{img['id']}", key=a, expect=204)
    w.call("DELETE", f"/v1/admin/images/{img['id']}", key=a, expect=404)
    effective = iso(w.d.now())
    w.json("PUT", "/v1/admin/prices/H100-SXM", key=a, json={"price_per_card_hour": "2.00", "effective_at": effective})
    w.call("PUT", "/v1/admin/prices/NOPE", key=a, json={"price_per_card_hour": "2.00"}, expect=404)
    w.call("PUT", "/v1/admin/prices/MI450", key=a, json={"price_per_card_hour": "-1"}, expect=400)
    w.json("PUT", "/v1/admin/storage-prices/local", key=a,
           json={"price_per_gb_month": "0.30", "effective_at": effective, "reason": "walk"})


def admin_users(w, u):
    a = w.admin
    w.json("GET", "/v1/admin/users", key=a, params={"email": u.email})
    w.call("GET", "/v1/admin/users", key=a, expect=400)
    w.json("GET", "/v1/admin/signups", key=a)
    w.json("PUT", f"/v1/admin/users/{u.id}/limits", key=a, json={"max_cards": 64, "reason": "walk"})
    w.call("PUT", "/v1/admin/users/usr_nosuchuseratall00000/limits", key=a, json={"max_cards": 8}, expect=404)
    g = w.json("POST", f"/v1/admin/users/{u.id}/grants", key=a, expect=201, json={
        "amount": "20.00", "expires_at": iso(w.d.now() + 30 * 86400), "reason": "walk"})
    w.json("GET", f"/v1/admin/users/{u.id}/grants/{g['grant_id']}", key=a)
    w.call("GET", f"/v1/admin/users/{u.id}/grants/grt_nosuchgrantatall000", key=a, expect=(400, 404))
    w.call("POST", f"/v1/admin/users/{u.id}/grants", key=a, json={"amount": "1.00",
                                                                 "expires_at": iso(w.d.now() - 86400)},
           expect=(400, 422))
    pay = f"pay-{uuid.uuid4().hex}"
    t = w.json("POST", f"/v1/admin/users/{u.id}/topups", key=a, json={"amount": "10.00", "payment_id": pay},
               expect=201)
    w.call("POST", f"/v1/admin/users/{u.id}/topups", key=a, json={"amount": "10.00", "payment_id": pay}, expect=200)
    w.call("POST", f"/v1/admin/users/{u.id}/topups", key=a, json={"amount": "11.00", "payment_id": pay}, expect=409)
    w.json("GET", f"/v1/admin/users/{u.id}/topups/{t['topup_id']}", key=a)
    code = f"OA{secrets.token_hex(3).upper()}"
    w.json("POST", "/v1/admin/invite-codes", key=a, json={"code": code, "amount": "5.00", "max_uses": 10},
           expect=201)
    w.call("POST", "/v1/admin/invite-codes", key=a, json={"code": code, "amount": "5.00"}, expect=409)
    w.json("GET", "/v1/admin/invite-codes", key=a)
    w.json("GET", f"/v1/admin/invite-codes/{code}", key=a)
    w.call("GET", "/v1/admin/invite-codes/NOSUCHCODE9", key=a, expect=404)
    fresh = w.d.signup(verify=False)
    w.call("POST", "/v1/invite-codes/redeem", key=fresh.key, json={"code": code}, expect=(201, 403))
    # u had its trial at sign-up: one trial an account
    w.call("POST", "/v1/invite-codes/redeem", key=u.key, json={"code": code}, expect=409)
    victim = w.d.signup()
    w.json("POST", f"/v1/admin/users/{victim.id}/suspend", key=a, json={"reason": "walk"})
    w.call("POST", f"/v1/admin/users/{victim.id}/suspend", key=a, json={"reason": "walk"}, expect=(200, 409))
    w.call("GET", "/v1/me", key=victim.key, expect=403)
    w.json("POST", f"/v1/admin/users/{victim.id}/reinstate", key=a, json={"reason": "walk"})
    w.json("POST", "/v1/admin/billing/run", key=a, json={"reason": "walk"})
    w.json("GET", "/v1/admin/audit", key=a)
    w.call("GET", "/v1/admin/audit", key=a, params={"limit": 0}, expect=400)
    w.call("GET", "/metrics", key=a, expect=200)
    w.call("GET", "/metrics", key=u.key, expect=403)
    w.call("GET", "/metrics", expect=401)


def cleanup(w, u, ssh_key):
    w.call("DELETE", f"/v1/ssh-keys/{ssh_key['id']}", key=u.key, expect=204)
    w.call("DELETE", f"/v1/ssh-keys/{ssh_key['id']}", key=u.key, expect=404)
    w.call("DELETE", f"/v1/api-keys/{u.key_id}", key=u.key, expect=200)
    w.call("GET", "/v1/me", key=u.key, expect=401)


# ------------------------------------------------------------ the walk

def test_every_answer_matches_the_document(cloud):
    cloud.fleet(1)
    cloud.fleet(1, model="H100-SXM", fabric="fabric-b")
    w = Walk(cloud)
    try:
        public(w)
        user, other = accounts(w)
        key = ssh_keys(w, user, other)
        volumes(w, user, other)
        admin_catalog(w)
        instances(w, user, other, key)
        money(w, user)
        reservations(w, user, other)
        apps(w, user, other)
        payments(w, user)
        admin_nodes(w)
        admin_users(w, user)
        cleanup(w, user, key)
    finally:
        # What was found so far, even when a step of the walk failed.
        for p in w.spec.problems:
            print(f"\n{p}")
    assert not w.spec.problems, f"{len(w.spec.problems)} answers disagree with docs/openapi.json:\n\n" + \
        "\n\n".join(w.spec.problems)
    ops = w.spec.operations()
    missed = set(w.spec.not_exercised())
    print(f"\nexercised {len(ops) - len(missed)} of {len(ops)} documented operations")
    for method, template in sorted(missed):
        print(f"  not exercised: {method} {template}")
    assert NOT_WALKED <= ops, "NOT_WALKED names an operation the document no longer has"
    assert missed == NOT_WALKED, f"walked but listed: {sorted(NOT_WALKED - missed)}; " \
                                 f"neither walked nor listed: {sorted(missed - NOT_WALKED)}"
    statuses = sorted({s for seen in w.spec.exercised.values() for s in seen})
    print(f"statuses seen: {statuses}")
    assert {200, 201, 204, 400, 401, 403, 404, 409} <= set(statuses), statuses
