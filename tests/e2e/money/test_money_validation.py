"""test_money_validation.py: every money endpoint refuses bad input and
writes nothing. Each request of the matrix (malformed JSON, wrong types,
missing and unknown fields, amounts with 7 decimals, signs, exponents,
spaces or overflow, oversize bodies, unknown or foreign ids, the wrong key)
is checked against a dump of the whole database taken before it; then the
endpoint's valid request succeeds, so the matrix was aimed at a working
path."""
import json

import pytest

from harness import assert_error
from money_util import cluster_fixture, iso, verify_ledgers, webhook_headers  # noqa: F401

SECRET = "whsec-validation"
MAX_BODY = 4096
checked = cluster_fixture({}, {"payment_webhook_secret": SECRET, "max_body_bytes": str(MAX_BODY)})

BAD_AMOUNTS = [
    "1.0000001", "0.0000001", "1.0000000", "-1", "-1.00", "-0", "+1", "+1.00", "1e3", "1E3", "1e-3", "1.5e1",
    " 1", "1 ", "1\n", "\t1", "1 000", "01", "00.5", "1.", ".5", ".", "", "1,000", "1_000", "0x10", "1.2.3",
    "\uff11", "\u0661", "NaN", "Infinity", "inf", "99999999999999999999", "9223372036854.775808",
    "9223372036855", "100000000000000000000.00",
]
NOT_STRINGS = [10, 10.5, -1, True, [], {}, ["1.00"], {"amount": "1.00"}]
FUTURE = 2_000_000_000
BAD_TIMES = ["tomorrow", "2027-01-01", "2027-01-01 00:00:00", "2027-01-01T00:00:00", "2027-13-01T00:00:00Z",
             "2027-01-01T00:00:00+08:00x", "", " ", iso(1_000_000_000), 2_000_000_000, True]


def generic_bodies(base):
    """(label, raw body bytes, status, code) every JSON endpoint refuses."""
    first = next(iter(base), "x")
    yield "malformed", b'{"' + first.encode() + b'": ', 400, "malformed_json"
    yield "trailing garbage", json.dumps(base).encode() + b" x", 400, "malformed_json"
    yield "array", json.dumps([base]).encode(), 400, "not_an_object"
    yield "string", b'"x"', 400, "not_an_object"
    yield "number", b"42", 400, "not_an_object"
    yield "null", b"null", 400, "not_an_object"
    yield "bad utf-8", b'{"' + first.encode() + b'": "\xff\xfe"}', 400, "invalid_encoding"
    dup = (json.dumps(base)[:-1] + f', "{first}": {json.dumps(base[first])}}}') if base else '{"x": 1, "x": 1}'
    yield "duplicate key", dup.encode(), 400, "duplicate_key"
    yield "too deep", b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "too_deep"
    yield "oversize", json.dumps({**base, "pad": "x" * MAX_BODY}).encode(), 413, "body_too_large"
    yield "unknown field", json.dumps({**base, "surprise": "1.00"}).encode(), 400, "unknown_field"


def field_bodies(base, required, amounts=(), times=(), strings=(), ints=()):
    """(label, body, status, code, field) for each field of base."""
    for f in required:
        yield f"missing {f}", {k: v for k, v in base.items() if k != f}, 400, "missing_field", f
        yield f"null {f}", {**base, f: None}, 400, "missing_field", f
    for f in amounts:
        for bad in BAD_AMOUNTS:
            yield f"{f}={bad!r}", {**base, f: bad}, 400, "invalid_field", f
        for bad in NOT_STRINGS:
            yield f"{f}={bad!r}", {**base, f: bad}, 400, "invalid_field", f
    for f in times:
        for bad in BAD_TIMES:
            yield f"{f}={bad!r}", {**base, f: bad}, 400, "invalid_field", f
    for f in strings:
        for bad in (1, True, [], {}):
            yield f"{f}={bad!r}", {**base, f: bad}, 400, "invalid_field", f
    for f in ints:
        for bad in ("3", 1.5, True, [], 0, -1):
            yield f"{f}={bad!r}", {**base, f: bad}, 400, "invalid_field", f


def refused(c, method, path, status, code, field=None, what="", **kw):
    """Sends one bad request and checks the error and that nothing changed."""
    before = c.d.dump()
    r = c.d.request(method, path, **kw)
    assert r.status_code == status, (what, r.status_code, r.text)
    err = r.json()["error"]
    assert err["code"] == code, (what, err)
    if field is not None:
        assert err["field"] == field, (what, err)
    after = c.d.dump()
    assert after == before, f"{what}: the database changed: " + str(
        {t: (before[t], after[t]) for t in before if before[t] != after[t]})[:2000]
    return err


def run_matrix(c, method, path, key, base, required=(), headers_for=None, **fields):
    """Every generic and per-field refusal for one endpoint."""
    def send(what, raw, status, code, field=None):
        h = {"Content-Type": "application/json", **(headers_for(raw) if headers_for else {})}
        refused(c, method, path, status, code, field, what, key=key, data=raw, headers=h)
    for what, raw, status, code in generic_bodies(base):
        send(what, raw, status, code)
    for what, body, status, code, field in field_bodies(base, required, **fields):
        send(what, json.dumps(body).encode(), status, code, field)


@pytest.fixture(scope="module")
def people(checked):
    return {"alice": checked.signup(), "bob": checked.signup()}


def test_redeem_refuses_bad_input(checked, people):
    c, u = checked, checked.cli_user()  # verified and no trial yet: it may redeem
    path = "/v1/invite-codes/redeem"
    run_matrix(c, "POST", path, u.key, {"code": "AMD6GW"}, required=["code"], strings=["code"])
    for bad in ("", " ", "AMD 6GW", "AMD6GW\n", "A" * 33, "\u00c4MD6GW", "AMD6GW;", "NO-SUCH-CODE"):
        refused(c, "POST", path, 400, "invalid_invite_code" if len(bad) <= 32 else "invalid_field", "code",
                repr(bad), key=u.key, json={"code": bad})
    refused(c, "POST", path, 401, "unauthorized", None, "no key", json={"code": "AMD6GW"})
    r = c.d.post(path, key=u.key, json={"code": "amd6gw"})
    assert r.status_code == 201, r.text


def test_invite_code_creation_refuses_bad_input(checked, people):
    c = checked
    path = "/v1/admin/invite-codes"
    base = {"code": "SPRING-27", "amount": "5.00", "expires_at": iso(FUTURE), "max_uses": 3, "credit_days": 7}
    run_matrix(c, "POST", path, c.d.admin_key, base, required=["code", "amount"], amounts=["amount"],
               times=["expires_at"], strings=["code"], ints=["max_uses", "credit_days"])
    for what, body, field in [
        ("zero amount", {**base, "amount": "0"}, "amount"),
        ("zero amount with decimals", {**base, "amount": "0.000000"}, "amount"),
        ("past expiry", {**base, "expires_at": iso(c.d.now() - 1)}, "expires_at"),
        ("expiry now", {**base, "expires_at": iso(c.d.now())}, "expires_at"),
        ("too many uses", {**base, "max_uses": 100_000_001}, "max_uses"),
        ("too many days", {**base, "credit_days": 3651}, "credit_days"),
        ("empty code", {**base, "code": ""}, "code"),
        ("code with a space", {**base, "code": "SPRING 27"}, "code"),
        ("code too long", {**base, "code": "C" * 33}, "code"),
    ]:
        refused(c, "POST", path, 400, "invalid_field", field, what, key=c.d.admin_key, json=body)
    refused(c, "POST", path, 409, "name_taken", "code", "existing code", key=c.d.admin_key,
            json={**base, "code": "amd6gw"})
    refused(c, "POST", path, 403, "forbidden", None, "user key", key=people["alice"].key, json=base)
    refused(c, "POST", path, 401, "unauthorized", None, "no key", json=base)
    r = c.admin("POST", path, json=base)
    assert r.status_code == 201, r.text
    assert r.json()["code"] == "SPRING-27"


def test_admin_grants_refuse_bad_input(checked, people):
    c, bob = checked, people["bob"]
    path = f"/v1/admin/users/{bob.id}/grants"
    base = {"amount": "2.00", "expires_at": iso(FUTURE), "reason": "goodwill"}
    run_matrix(c, "POST", path, c.d.admin_key, base, required=["amount"], amounts=["amount"],
               times=["expires_at"], strings=["reason"])
    for what, body, field in [
        ("zero", {**base, "amount": "0.00"}, "amount"),
        ("past expiry", {**base, "expires_at": iso(c.d.now() - 60)}, "expires_at"),
        ("reason too long", {**base, "reason": "r" * 201}, "reason"),
    ]:
        refused(c, "POST", path, 400, "invalid_field", field, what, key=c.d.admin_key, json=body)
    for other in ("usr_00000000000000000000", "usr_short", "key_00000000000000000000", "nobody"):
        refused(c, "POST", f"/v1/admin/users/{other}/grants", 404, "not_found", None, other, key=c.d.admin_key,
                json=base)
    refused(c, "POST", path, 403, "forbidden", None, "the user himself", key=bob.key, json=base)
    r = c.admin("POST", path, json=base)
    assert r.status_code == 201, r.text


def test_admin_topups_refuse_bad_input(checked, people):
    c, bob = checked, people["bob"]
    path = f"/v1/admin/users/{bob.id}/topups"
    base = {"amount": "5.00", "payment_id": "pay-validation-1"}
    run_matrix(c, "POST", path, c.d.admin_key, base, required=["amount", "payment_id"], amounts=["amount"],
               strings=["payment_id"])
    for what, body, field in [
        ("zero", {**base, "amount": "0"}, "amount"),
        ("empty payment id", {**base, "payment_id": ""}, "payment_id"),
        ("payment id too long", {**base, "payment_id": "p" * 129}, "payment_id"),
        ("payment id with a space", {**base, "payment_id": "pay 1"}, "payment_id"),
        ("payment id with a tab", {**base, "payment_id": "pay\t1"}, "payment_id"),
        ("payment id not ASCII", {**base, "payment_id": "pay-\u00e9"}, "payment_id"),
    ]:
        refused(c, "POST", path, 400, "invalid_field", field, what, key=c.d.admin_key, json=body)
    refused(c, "POST", "/v1/admin/users/usr_00000000000000000000/topups", 404, "not_found", None, "nobody",
            key=c.d.admin_key, json=base)
    refused(c, "POST", path, 403, "forbidden", None, "the user himself", key=bob.key, json=base)
    r = c.admin("POST", path, json=base)
    assert r.status_code == 201, r.text


def test_webhook_refuses_bad_input(checked, people):
    c, bob = checked, people["bob"]
    path = "/v1/payments/webhook"
    base = {"payment_id": "pay-hook-v1", "user_id": bob.id, "amount": "5.00", "currency": "CNY"}
    run_matrix(c, "POST", path, None, base, required=list(base), amounts=["amount"],
               strings=["payment_id", "user_id", "currency"], headers_for=lambda raw: webhook_headers(SECRET, raw))
    for what, body, status, code, field in [
        ("other currency", {**base, "currency": "cny"}, 400, "invalid_field", "currency"),
        ("zero", {**base, "amount": "0"}, 400, "invalid_field", "amount"),
        ("another prefix", {**base, "user_id": "key_00000000000000000000"}, 404, "not_found", None),
        ("nobody", {**base, "user_id": "usr_00000000000000000000"}, 404, "not_found", None),
    ]:
        raw = json.dumps(body)
        refused(c, "POST", path, status, code, field, what, data=raw, headers=webhook_headers(SECRET, raw))
    raw = json.dumps(base)
    refused(c, "POST", path, 401, "bad_signature", None, "unsigned", data=raw)
    r = c.d.post(path, data=raw, headers=webhook_headers(SECRET, raw))
    assert r.status_code == 201, r.text


def test_price_changes_refuse_bad_input(checked, people):
    c = checked
    path = "/v1/admin/prices/MI450"
    base = {"price_per_card_hour": "1.25", "effective_at": iso(FUTURE)}
    run_matrix(c, "PUT", path, c.d.admin_key, base, required=["price_per_card_hour"],
               amounts=["price_per_card_hour"], times=["effective_at"])
    refused(c, "PUT", path, 400, "invalid_field", "effective_at", "past", key=c.d.admin_key,
            json={**base, "effective_at": iso(c.d.now() - 1)})
    refused(c, "PUT", "/v1/admin/prices/NOPE", 404, "not_found", None, "unknown type", key=c.d.admin_key, json=base)
    refused(c, "PUT", path, 403, "forbidden", None, "user key", key=people["alice"].key, json=base)
    r = c.admin("PUT", path, json=base)
    assert r.status_code == 200, r.text


def test_billing_run_refuses_bad_input(checked, people):
    c = checked
    path = "/v1/admin/billing/run"
    run_matrix(c, "POST", path, c.d.admin_key, {})
    refused(c, "POST", path, 403, "forbidden", None, "user key", key=people["alice"].key, json={})
    assert c.billing()["users_billed"] == 0


@pytest.mark.parametrize("path,params,field", [
    ("/v1/balance", {"x": "1"}, "x"),
    ("/v1/transactions", {"kind": "refunds"}, "kind"),
    ("/v1/transactions", {"limit": "0"}, "limit"),
    ("/v1/transactions", {"limit": "201"}, "limit"),
    ("/v1/transactions", {"limit": "1e1"}, "limit"),
    ("/v1/transactions", {"from": "yesterday"}, "from"),
    ("/v1/transactions", {"to": "2027-01-01"}, "to"),
    ("/v1/transactions", {"cursor": "not-a-cursor"}, "cursor"),
    ("/v1/transactions", {"user_id": "usr_00000000000000000000"}, "user_id"),
    ("/v1/usage", {"group_by": "node"}, "group_by"),
    ("/v1/usage", {"from": "2027-02-01T00:00:00Z", "to": "2027-01-01T00:00:00Z"}, "to"),
    ("/v1/usage", {"from": "1e9"}, "from"),
    ("/v1/usage", {"user_id": "usr_00000000000000000000"}, "user_id"),
    ("/v1/statements/2027-01", {"format": "pdf"}, "format"),
    ("/v1/statements/2027-01", {"user_id": "usr_00000000000000000000"}, "user_id"),
    ("/v1/prices", {"currency": "USD"}, "currency"),
])
def test_money_queries_refuse_bad_parameters(checked, people, path, params, field):
    err = refused(checked, "GET", path, 400, "invalid_query", None, f"{path} {params}", key=people["alice"].key,
                  params=params)
    assert err["field"] == field, err


def test_money_reads_need_a_key(checked):
    for path in ("/v1/balance", "/v1/transactions", "/v1/usage", "/v1/statements/2027-01"):
        assert_error(checked.d.get(path), 401, "unauthorized")
