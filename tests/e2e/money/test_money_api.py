"""test_money_api.py: the money API end to end: top-ups idempotent by payment
id (admin and signed webhook; a bad, stale or missing signature is 401 and
writes nothing), and what users read about their money (balance,
transactions with filters and pagination, usage by instance and by GPU type,
the monthly statement as JSON and as CSV) agreeing with the ledger's rows."""
import csv
import io
import json
import time

import pytest

from harness import assert_error
from money_util import (MICRO, PRICE, accrue, cluster_fixture, iso, micro, new_cluster,  # noqa: F401
                        verify_ledgers, webhook_headers, yuan)

SECRET = "whsec-test-0123456789abcdef"
api_cluster = cluster_fixture({"MI450": 2, "MI300X": 1}, {"payment_webhook_secret": SECRET})


def assert_bad_signature(r, what=""):
    """A refused webhook: 401 bad_signature (not a bearer-token challenge)."""
    assert r.status_code == 401, (what, r.text)
    assert r.json() == {"error": {"code": "bad_signature", "field": None, "message": r.json()["error"]["message"]}}


def webhook(c, body, secret=SECRET, ts=None, headers=None):
    raw = json.dumps(body) if not isinstance(body, (bytes, str)) else body
    h = webhook_headers(secret, raw, ts) if headers is None else headers
    return c.d.post("/v1/payments/webhook", data=raw, headers=h)


def test_admin_topups_are_idempotent_by_payment_id(api_cluster):
    c = api_cluster
    u, v = c.signup(), c.signup()
    body = {"amount": "25.50", "payment_id": "pay-admin-0001"}
    r1 = c.admin("POST", f"/v1/admin/users/{u.id}/topups", json=body)
    assert r1.status_code == 201, r1.text
    assert (r1.json()["amount"], r1.json()["duplicate"], r1.json()["currency"]) == ("25.50", False, "CNY")
    r2 = c.admin("POST", f"/v1/admin/users/{u.id}/topups", json=body)
    assert r2.status_code == 200, r2.text
    assert r2.json()["duplicate"] is True and r2.json()["topup_id"] == r1.json()["topup_id"]
    assert c.balance(u)["cash"] == 25_500_000
    before = c.d.dump()
    # The same payment for another amount or another user is a conflict.
    assert_error(c.admin("POST", f"/v1/admin/users/{u.id}/topups", json={**body, "amount": "25.51"}), 409,
                 "conflict", "payment_id")
    assert_error(c.admin("POST", f"/v1/admin/users/{v.id}/topups", json=body), 409, "conflict", "payment_id")
    # Users cannot top themselves up; unknown users are 404.
    assert_error(c.d.post(f"/v1/admin/users/{u.id}/topups", key=u.key, json=body), 403, "forbidden")
    assert_error(c.admin("POST", "/v1/admin/users/usr_00000000000000000000/topups",
                         json={"amount": "1.00", "payment_id": "pay-x"}), 404, "not_found")
    assert c.d.dump() == before
    assert len(c.transactions(u, kind="topup")) == 1
    assert c.d.sql("SELECT count(*) FROM topups WHERE payment_id = 'pay-admin-0001'") == [(1,)]


def test_webhook_topups_are_signed_and_idempotent(api_cluster):
    c = api_cluster
    u = c.signup()
    body = {"payment_id": "pay-hook-0001", "user_id": u.id, "amount": "100.00", "currency": "CNY"}
    r = webhook(c, body)
    assert r.status_code == 201, r.text
    assert r.json()["duplicate"] is False
    r = webhook(c, body)  # the provider retries
    assert r.status_code == 200 and r.json()["duplicate"] is True, r.text
    # The admin reporting the same payment is the same payment.
    r = c.admin("POST", f"/v1/admin/users/{u.id}/topups", json={"amount": "100.00", "payment_id": "pay-hook-0001"})
    assert r.status_code == 200 and r.json()["duplicate"] is True, r.text
    assert c.balance(u)["cash"] == 100 * MICRO
    assert c.d.sql("SELECT source FROM topups WHERE payment_id = 'pay-hook-0001'") == [("webhook",)]

    before = c.d.dump()
    fresh = {**body, "payment_id": "pay-hook-0002"}
    raw = json.dumps(fresh)
    now = int(time.time())
    good = webhook_headers(SECRET, raw)
    bad = [
        ("wrong secret", webhook_headers("not-the-secret", raw)),
        ("stale", webhook_headers(SECRET, raw, ts=now - 301)),
        ("from the future", webhook_headers(SECRET, raw, ts=now + 301)),
        ("testing clock time", webhook_headers(SECRET, raw, ts=c.d.now())),
        ("no signature", {k: v for k, v in good.items() if k != "X-Gpurent-Webhook-Signature"}),
        ("no timestamp", {k: v for k, v in good.items() if k != "X-Gpurent-Webhook-Timestamp"}),
        ("no headers", {"Content-Type": "application/json"}),
        ("signature of another body", {**good, "X-Gpurent-Webhook-Signature": webhook_headers(
            SECRET, json.dumps(body), ts=good["X-Gpurent-Webhook-Timestamp"])["X-Gpurent-Webhook-Signature"]}),
        ("timestamp not signed", {**good, "X-Gpurent-Webhook-Timestamp": str(now - 1)}),
        ("truncated signature", {**good, "X-Gpurent-Webhook-Signature": good["X-Gpurent-Webhook-Signature"][:63]}),
        ("signature with junk", {**good, "X-Gpurent-Webhook-Signature": good["X-Gpurent-Webhook-Signature"] + "0"}),
        ("signed decimal timestamp", webhook_headers(SECRET, raw, ts=f"{now}.0")),
        ("signed negative timestamp", webhook_headers(SECRET, raw, ts=f"-{now}")),
    ]
    for what, headers in bad:
        assert_bad_signature(c.d.post("/v1/payments/webhook", data=raw, headers=headers), what)
    # An API key is no substitute for the signature.
    assert_bad_signature(c.d.post("/v1/payments/webhook", data=raw, headers={"Content-Type": "application/json"},
                                  key=c.d.admin_key))
    # Signed, but wrong inside: refused, nothing written.
    for what, b, status, code, field in [
        ("other currency", {**fresh, "currency": "USD"}, 400, "invalid_field", "currency"),
        ("unknown user", {**fresh, "user_id": "usr_00000000000000000000"}, 404, "not_found", None),
        ("not a user id", {**fresh, "user_id": "bob"}, 404, "not_found", None),
        ("amount as a number", {**fresh, "amount": 100}, 400, "invalid_field", "amount"),
        ("negative amount", {**fresh, "amount": "-100.00"}, 400, "invalid_field", "amount"),
        ("zero amount", {**fresh, "amount": "0.00"}, 400, "invalid_field", "amount"),
        ("7 decimals", {**fresh, "amount": "1.0000001"}, 400, "invalid_field", "amount"),
        ("missing amount", {k: v for k, v in fresh.items() if k != "amount"}, 400, "missing_field", "amount"),
        ("unknown field", {**fresh, "bonus": "1.00"}, 400, "unknown_field", "bonus"),
        ("same payment, other amount", {**body, "amount": "100.01"}, 409, "conflict", "payment_id"),
        ("empty payment id", {**fresh, "payment_id": ""}, 400, "invalid_field", "payment_id"),
        ("payment id with a space", {**fresh, "payment_id": "pay 1"}, 400, "invalid_field", "payment_id"),
    ]:
        assert_error(webhook(c, b), status, code, field)
    assert_error(webhook(c, '{"payment_id": '), 400, "malformed_json")
    assert c.d.dump() == before
    r = c.d.post("/v1/payments/webhook", data=raw, headers=good)
    assert r.status_code == 201, r.text
    assert c.balance(u)["cash"] == 200 * MICRO


def test_webhook_is_off_without_a_secret(new_cluster):
    c = new_cluster(nodes={})
    u = c.signup()
    body = json.dumps({"payment_id": "p1", "user_id": u.id, "amount": "1.00", "currency": "CNY"})
    for secret in ("", "anything"):
        assert_bad_signature(c.d.post("/v1/payments/webhook", data=body, headers=webhook_headers(secret, body)))
    assert c.d.sql("SELECT count(*) FROM topups") == [(0,)]


def test_balance_transactions_usage_and_statements_agree_with_the_ledger(api_cluster):
    c = api_cluster
    u = c.signup()
    t0 = c.d.now()
    c.topup(u, 5 * MICRO, payment_id=f"pay-{u.id}")
    g = c.grant(u, 1 * MICRO, expires_at=t0 + 7200, reason='promo, "quoted"\nline')
    a = c.launch(u, "MI450", 8)
    c.d.set_clock(t0 + 1800)
    c.billing()
    c.d.set_clock(t0 + 2700)
    c.stop(u, a)
    b = c.launch(u, "MI300X", 2)
    c.d.set_clock(t0 + 2700 + 600)
    c.billing()
    c.d.set_clock(t0 + 7300)  # the grant expired (it was used up by then: no expiry posting)
    c.stop(u, b)
    c.billing()
    h = c.grant(u, 2 * MICRO, expires_at=t0 + 7400)
    c.d.set_clock(t0 + 7500)
    c.billing()  # 2.00 voided

    cost_a = accrue(PRICE["MI450"], 8, 2700)
    cost_b = accrue(PRICE["MI300X"], 2, 4600)
    assert c.spent(u) == cost_a + cost_b
    total_funds = 10 * MICRO + 5 * MICRO + 1 * MICRO + 2 * MICRO
    left = total_funds - cost_a - cost_b - 2 * MICRO
    bal = c.balance(u)
    assert bal["available"] == left == bal["cash"] + bal["credit"]
    assert bal["grants"][g]["remaining"] == 0 and bal["grants"][h]["expired"] is True

    # Transactions: every one, in order, sums to the balance; each is its postings.
    txns = c.transactions(u)
    assert [t["id"] for t in txns] == sorted(t["id"] for t in txns)
    assert sum(micro(t["amount"]) for t in txns) == bal["available"]
    for t in txns:
        assert micro(t["amount"]) == micro(t["credit"]) + micro(t["cash"])
        [(cash, credit)] = c.d.sql(
            "SELECT coalesce(sum(p.amount) FILTER (WHERE a.kind = 'cash'), 0),"
            " coalesce(sum(p.amount) FILTER (WHERE a.kind = 'grant'), 0) FROM ledger_postings p"
            " JOIN ledger_accounts a ON a.id = p.account_id WHERE p.transaction_id = ?", (t["id"],))
        assert (micro(t["cash"]), micro(t["credit"])) == (cash, credit), t
    kinds = [t["kind"] for t in txns]
    assert kinds.count("topup") == 1 and kinds.count("grant") == 3 and kinds.count("expiry") == 1
    [expiry] = [t for t in txns if t["kind"] == "expiry"]
    assert (expiry["at"], expiry["amount"]) == (iso(t0 + 7400), "-2.00")
    assert {t["instance_id"] for t in txns if t["kind"] == "usage"} == {a, b}
    assert all(t["instance_id"] is None for t in txns if t["kind"] != "usage")
    # Filters and pagination.
    for kind in ("usage", "grant", "expiry", "topup"):
        assert c.transactions(u, kind=kind) == [t for t in txns if t["kind"] == kind]
    window = c.transactions(u, **{"from": iso(t0 + 1800), "to": iso(t0 + 7300)})
    assert window == [t for t in txns if iso(t0 + 1800) <= t["at"] < iso(t0 + 7300)] and window
    pages, cursor = [], None
    while True:
        q = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        r = c.d.get("/v1/transactions", key=u.key, params=q)
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]) <= 2
        pages += r.json()["data"]
        cursor = r.json()["next_cursor"]
        if not cursor:
            break
    assert pages == txns
    # Another user's view holds none of it, even with this user's cursor.
    v = c.signup()
    r = c.d.get("/v1/transactions", key=v.key, params={"limit": 1})
    other_ids = {t["id"] for t in c.transactions(v)}
    assert not other_ids & {t["id"] for t in txns}
    r = c.d.get("/v1/transactions", key=u.key, params={"limit": 1})
    r = c.d.get("/v1/transactions", key=v.key, params={"cursor": r.json()["next_cursor"]})
    assert r.status_code == 200 and {t["id"] for t in r.json()["data"]} <= other_ids

    # Usage by instance and by GPU type.
    period = {"from": iso(t0), "to": iso(t0 + 8000)}
    r = c.d.get("/v1/usage", key=u.key, params=period)
    assert r.status_code == 200, r.text
    rows = {x["instance_id"]: x for x in r.json()["data"]}
    assert set(rows) == {a, b}
    assert rows[a]["card_hours"] == "6.00" and micro(rows[a]["cost"]) == cost_a
    assert rows[b]["card_hours"] == yuan(2 * 4600 * MICRO // 3600) and micro(rows[b]["cost"]) == cost_b
    for iid, row in rows.items():
        usage = [t for t in txns if t["instance_id"] == iid]
        assert micro(row["cost"]) == -sum(micro(t["amount"]) for t in usage)
        assert micro(row["paid_by_credit"]) == -sum(micro(t["credit"]) for t in usage)
        assert micro(row["paid_by_cash"]) == -sum(micro(t["cash"]) for t in usage)
    r = c.d.get("/v1/usage", key=u.key, params={**period, "group_by": "gpu_type"})
    by_type = {x["gpu_type"]: (x["card_hours"], micro(x["cost"])) for x in r.json()["data"]}
    assert by_type == {"MI450": ("6.00", cost_a), "MI300X": (rows[b]["card_hours"], cost_b)}
    # A window inside the run counts only its card-seconds.
    r = c.d.get("/v1/usage", key=u.key, params={"from": iso(t0 + 900), "to": iso(t0 + 1800)})
    assert {x["instance_id"]: x["card_hours"] for x in r.json()["data"]}[a] == "2.00"

    # The monthly statement, as JSON and as CSV.
    month = iso(t0)[:7]
    r = c.d.get(f"/v1/statements/{month}", key=u.key)
    assert r.status_code == 200, r.text
    st = r.json()
    assert (st["month"], st["currency"], st["opening_balance"]) == (month, "CNY", "0.00")
    assert micro(st["closing_balance"]) == bal["available"]
    assert [(x["id"], x["at"], x["kind"], x["reason"], x["amount"], x["credit"], x["cash"]) for x in
            st["transactions"]] == [(t["id"], t["at"], t["kind"], t["reason"], t["amount"], t["credit"], t["cash"])
                                    for t in txns]
    assert sum(micro(x["amount"]) for x in st["transactions"]) == micro(st["closing_balance"])
    assert {x["instance_id"]: micro(x["cost"]) for x in st["usage"]} == {a: cost_a, b: cost_b}
    r = c.d.get(f"/v1/statements/{month}", key=u.key, params={"format": "csv"})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/csv")
    assert f'filename="gpurent-{month}.csv"' in r.headers["Content-Disposition"]
    table = list(csv.reader(io.StringIO(r.text, newline="")))
    assert table[0] == ["id", "at", "kind", "reason", "instance_id", "amount", "credit", "cash", "currency"]
    assert table[1:] == [[str(t["id"]), t["at"], t["kind"], t["reason"], t["instance_id"] or "", t["amount"],
                          t["credit"], t["cash"], "CNY"] for t in txns]
    assert any("\n" in row[3] and '"' in row[3] for row in table[1:])  # the grant's reason survives quoting
    # The next month opens where this one closed and is empty.
    nxt = f"{month[:5]}{int(month[5:]) + 1:02d}" if month[5:] != "12" else f"{int(month[:4]) + 1}-01"
    st2 = c.d.get(f"/v1/statements/{nxt}", key=u.key).json()
    assert st2["opening_balance"] == st2["closing_balance"] == st["closing_balance"]
    assert st2["transactions"] == [] and st2["usage"] == []
    # What the ledger says the user holds.
    [(held,)] = c.d.sql("SELECT sum(balance) FROM ledger_accounts WHERE user_id = ?", (u.id,))
    assert held == bal["available"]


@pytest.mark.parametrize("month", ["2027-13", "2027-00", "2027-1x", "2027-+1", "2027-1 ", "27-01", "2027-01-01",
                                   "2027_01", "20x7-01", "１９７０-01", "1969-12"])
def test_statements_refuse_months_that_are_not_months(api_cluster, month):
    u = api_cluster.signup()
    assert_error(api_cluster.d.get(f"/v1/statements/{month}", key=u.key), 404, "not_found")
