"""test_admin_audit.py: admin money actions say who did them. Every admin
grant, top-up, invite code, price change, limit change and billing run
writes exactly one admin_actions row, in its own transaction, naming the
acting admin's account and API key, the action, its target, amount, detail
and reason; refused requests, replayed grants, repeated payments and the
payment webhook write none. GET /v1/admin/audit lists the rows newest first,
pages them with limit and cursor, filters by action, target and admin,
refuses non-admins and bad queries; a bad reason is a 400 that writes
nothing; `gpurentd report admin-actions` shows the same rows."""
import json

import pytest

from harness import assert_error, unique_email
from money_util import MICRO, cluster_fixture, iso, verify_ledgers, webhook_headers  # noqa: F401
from ops_util import report
from test_money_validation import refused

SECRET = "whsec-audit"
FUTURE = 2_000_000_000
audited = cluster_fixture({}, {"payment_webhook_secret": SECRET})


class Admin:
    """An admin's key, with the account id and key id the rows must name."""

    def __init__(self, c, key):
        self.key = key
        r = c.d.get("/v1/me", key=key)
        assert r.status_code == 200, r.text
        self.id = r.json()["id"]
        self.key_id = "key_" + key[4:24]  # gpk_<key id's random part>_<secret>


@pytest.fixture(scope="module")
def admins(audited):
    return Admin(audited, audited.d.admin_key), Admin(audited, audited.d.cli_create_user(unique_email("ops"), admin=True))


def last_id(c):
    return c.d.sql("SELECT coalesce(max(id), 0) FROM admin_actions")[0][0]


def new_rows(c, since):
    cols = ("id", "at", "admin_user_id", "api_key_id", "action", "target", "amount", "detail", "reason")
    return [dict(zip(cols, r)) for r in c.d.sql(f"SELECT {', '.join(cols)} FROM admin_actions WHERE id > ? ORDER BY id",
                                                (since,))]


def one_row(c, since, admin, action, target, amount, reason):
    rows = new_rows(c, since)
    assert len(rows) == 1, rows
    row = rows[0]
    assert (row["admin_user_id"], row["api_key_id"], row["action"], row["target"], row["amount"], row["reason"]) == \
        (admin.id, admin.key_id, action, target, amount, reason), row
    assert row["at"] == c.d.now()
    row["detail"] = json.loads(row["detail"])
    return row


def as_admin(c, admin, method, path, **kw):
    return c.d.request(method, path, key=admin.key, **kw)


# ---------------------------------------------------------------- each action writes one row

def test_each_admin_money_action_writes_one_row(audited, admins):
    c, (root, ops) = audited, admins
    u = c.cli_user()

    since = last_id(c)
    r = as_admin(c, root, "POST", f"/v1/admin/users/{u.id}/grants",
                 json={"amount": "20.00", "expires_at": iso(FUTURE), "reason": "outage on 2027-01-14"})
    assert r.status_code == 201, r.text
    row = one_row(c, since, root, "grant", u.id, 20 * MICRO, "outage on 2027-01-14")
    assert row["detail"] == {"grant_id": r.json()["grant_id"], "user_id": u.id, "amount": "20.00",
                             "expires_at": iso(FUTURE), "currency": "CNY"}
    # The reason is also what the user's statement says.
    assert [t["reason"] for t in c.transactions(u, kind="grant")] == ["outage on 2027-01-14"]

    since = last_id(c)
    r = as_admin(c, ops, "POST", f"/v1/admin/users/{u.id}/topups",
                 json={"amount": "100.00", "payment_id": "pay-audit-1", "reason": "bank transfer 778"})
    assert r.status_code == 201, r.text
    row = one_row(c, since, ops, "topup", u.id, 100 * MICRO, "bank transfer 778")
    assert row["detail"] == {"topup_id": r.json()["topup_id"], "payment_id": "pay-audit-1", "amount": "100.00",
                             "currency": "CNY"}

    since = last_id(c)
    r = as_admin(c, root, "POST", "/v1/admin/invite-codes",
                 json={"code": "audit-27", "amount": "15.00", "max_uses": 10, "reason": "spring campaign"})
    assert r.status_code == 201, r.text
    row = one_row(c, since, root, "invite_code", "AUDIT-27", 15 * MICRO, "spring campaign")
    assert row["detail"] == {"code": "AUDIT-27", "amount": "15.00", "expires_at": None, "max_uses": 10,
                             "credit_days": None, "max_uses_per_day": None, "currency": "CNY"}

    since = last_id(c)
    r = as_admin(c, ops, "PUT", "/v1/admin/prices/MI300X", json={"price_per_card_hour": "2.40", "reason": "Q2 list"})
    assert r.status_code == 200, r.text
    row = one_row(c, since, ops, "price", "MI300X", 2_400_000, "Q2 list")
    # effective_at defaulted to now: the row keeps the effective value.
    assert row["detail"] == {"gpu_type": "MI300X", "price_per_card_hour": "2.40", "effective_at": iso(c.d.now()),
                             "currency": "CNY"}

    since = last_id(c)
    r = as_admin(c, root, "PUT", f"/v1/admin/users/{u.id}/limits", json={"max_cards": 32})
    assert r.status_code == 200, r.text
    assert r.json() == {"user_id": u.id, "max_cards": 32, "max_volumes": 10, "max_volume_gb": 20000}
    row = one_row(c, since, root, "limits", u.id, None, "")
    assert row["detail"] == {"max_cards": 32}

    since = last_id(c)
    r = as_admin(c, ops, "POST", "/v1/admin/billing/run", json={"reason": "month end"})
    assert r.status_code == 200, r.text
    row = one_row(c, since, ops, "billing_run", None, None, "month end")
    assert row["detail"] == {}


def test_a_billing_run_without_a_body_still_runs_and_is_recorded(audited, admins):
    c, (root, _) = audited, admins
    for kw in ({}, {"json": {}}, {"data": b"", "headers": {"Content-Type": "application/json"}}):
        since = last_id(c)
        r = as_admin(c, root, "POST", "/v1/admin/billing/run", **kw)
        assert r.status_code == 200, (kw, r.text)
        one_row(c, since, root, "billing_run", None, None, "")


def test_reasons_up_to_their_limits_are_kept_whole(audited, admins):
    c, (root, _) = audited, admins
    u = c.cli_user()
    long = "é" * 499 + "!"  # 500 characters, 999 bytes
    since = last_id(c)
    assert as_admin(c, root, "PUT", f"/v1/admin/users/{u.id}/limits",
                    json={"max_cards": 8, "reason": long}).status_code == 200
    one_row(c, since, root, "limits", u.id, None, long)
    # A grant's reason is its statement line too: up to 200 characters, and
    # quotes and line breaks are text like any other.
    reason = 'promo, "quoted"\nline' + "x" * 180
    since = last_id(c)
    assert as_admin(c, root, "POST", f"/v1/admin/users/{u.id}/grants",
                    json={"amount": "1.00", "reason": reason}).status_code == 201
    one_row(c, since, root, "grant", u.id, MICRO, reason)


# ---------------------------------------------------------------- what writes no row

def test_refusals_replays_repeats_and_the_webhook_write_no_row(audited, admins):
    c, (root, _) = audited, admins
    u = c.cli_user()
    since = last_id(c)
    # Refused: over a limit, unknown user, unknown GPU type, taken code.
    for method, path, body, status in [
        ("POST", f"/v1/admin/users/{u.id}/grants", {"amount": "100000.01"}, 400),
        ("POST", f"/v1/admin/users/{u.id}/topups", {"amount": "1000000.01", "payment_id": "pay-audit-x"}, 400),
        ("POST", "/v1/admin/users/usr_00000000000000000000/topups", {"amount": "1.00", "payment_id": "p-x"}, 404),
        ("PUT", "/v1/admin/prices/NOPE", {"price_per_card_hour": "1.00"}, 404),
        ("PUT", "/v1/admin/users/usr_00000000000000000000/limits", {"max_cards": 1}, 404),
        ("POST", "/v1/admin/invite-codes", {"code": "AMD6GW", "amount": "1.00"}, 409),
    ]:
        assert as_admin(c, root, method, path, json=body).status_code == status, (path, body)
    assert new_rows(c, since) == []
    # A grant replayed by its Idempotency-Key is one grant and one row.
    h = {"Idempotency-Key": "audit-grant-1"}
    for _ in range(2):
        r = as_admin(c, root, "POST", f"/v1/admin/users/{u.id}/grants", json={"amount": "2.00"}, headers=h)
        assert r.status_code == 201, r.text
    one_row(c, since, root, "grant", u.id, 2 * MICRO, "")
    # A repeated payment adds nothing and records nothing.
    since = last_id(c)
    body = {"amount": "3.00", "payment_id": "pay-audit-rep"}
    assert as_admin(c, root, "POST", f"/v1/admin/users/{u.id}/topups", json=body).status_code == 201
    assert as_admin(c, root, "POST", f"/v1/admin/users/{u.id}/topups", json=body).status_code == 200
    one_row(c, since, root, "topup", u.id, 3 * MICRO, "")
    # The payment provider is not an admin.
    since = last_id(c)
    raw = json.dumps({"payment_id": "pay-audit-hook", "user_id": u.id, "amount": "4.00", "currency": "CNY"})
    assert c.d.post("/v1/payments/webhook", data=raw, headers=webhook_headers(SECRET, raw)).status_code == 201
    assert new_rows(c, since) == []


ROUTES = [
    ("grant", "POST", "/v1/admin/users/{u}/grants", {"amount": "1.00"}, 200),
    ("topup", "POST", "/v1/admin/users/{u}/topups", {"amount": "1.00", "payment_id": "pay-bad-reason"}, 500),
    ("invite_code", "POST", "/v1/admin/invite-codes", {"code": "BAD-REASON", "amount": "1.00"}, 500),
    ("price", "PUT", "/v1/admin/prices/MI450", {"price_per_card_hour": "1.20", "effective_at": iso(FUTURE)}, 500),
    ("limits", "PUT", "/v1/admin/users/{u}/limits", {"max_cards": 4}, 500),
    ("billing_run", "POST", "/v1/admin/billing/run", {}, 500),
]


@pytest.mark.parametrize("action, method, path, body, longest", ROUTES, ids=[r[0] for r in ROUTES])
def test_a_bad_reason_is_refused_and_writes_nothing(audited, action, method, path, body, longest):
    c = audited
    u = c.cli_user()
    path = path.format(u=u.id)
    for what, reason in [("number", 5), ("true", True), ("list", ["why"]), ("object", {"why": 1}), ("empty", ""),
                         ("too long", "r" * (longest + 1)),
                         ("too many characters", "é" * (longest + 1))]:
        refused(c, method, path, 400, "invalid_field", "reason", f"{action} reason {what}", key=c.d.admin_key,
                json={**body, "reason": reason})
    # The same request with a good reason is accepted.
    r = c.admin(method, path, json={**body, "reason": "r" * longest})
    assert r.status_code in (200, 201), r.text


# ---------------------------------------------------------------- the audit API

def all_pages(c, key, **params):
    out, cursor, pages = [], None, 0
    while True:
        q = dict(params)
        if cursor:
            q["cursor"] = cursor
        r = c.d.get("/v1/admin/audit", key=key, params=q)
        assert r.status_code == 200, r.text
        out += r.json()["data"]
        cursor = r.json()["next_cursor"]
        pages += 1
        if not cursor:
            return out, pages


def test_the_audit_api_pages_newest_first_and_filters(audited, admins):
    c, (root, ops) = audited, admins
    u, v = c.cli_user(), c.cli_user()
    since = last_id(c)
    for n in range(1, 6):
        assert as_admin(c, root if n % 2 else ops, "PUT", f"/v1/admin/users/{u.id}/limits",
                        json={"max_cards": n, "reason": f"step {n}"}).status_code == 200
    assert as_admin(c, ops, "POST", f"/v1/admin/users/{v.id}/grants",
                    json={"amount": "7.25", "reason": "for v"}).status_code == 201
    everything, _ = all_pages(c, root.key, limit=200)
    ids = [a["id"] for a in everything]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    assert len(everything) == last_id(c) == c.d.sql("SELECT count(*) FROM admin_actions")[0][0]
    newest = everything[0]
    assert newest == {"id": last_id(c), "at": iso(c.d.now()), "admin_user_id": ops.id, "api_key_id": ops.key_id,
                      "action": "grant", "target": v.id, "amount": "7.25", "currency": "CNY", "reason": "for v",
                      "detail": newest["detail"]}
    assert newest["detail"]["amount"] == "7.25" and newest["detail"]["grant_id"].startswith("grt_")
    # Pages of two give the same rows in the same order.
    paged, pages = all_pages(c, root.key, limit=2)
    assert paged == everything and pages == (len(everything) + 1) // 2
    # Filters, alone and together, and paged.
    mine, _ = all_pages(c, root.key, target=u.id, limit=2)
    assert [a["reason"] for a in mine] == [f"step {n}" for n in range(5, 0, -1)]
    assert all(a["amount"] is None and a["action"] == "limits" for a in mine)
    by_ops, _ = all_pages(c, root.key, admin=ops.id, target=u.id)
    assert [a["detail"]["max_cards"] for a in by_ops] == [4, 2]
    grants, _ = all_pages(c, root.key, action="grant")
    assert grants and all(a["action"] == "grant" for a in grants) and grants[0]["id"] == newest["id"]
    assert [a["id"] for a in grants] == [a["id"] for a in everything if a["action"] == "grant"]
    runs, _ = all_pages(c, ops.key, action="billing_run", admin=root.id)
    assert all(a["target"] is None and a["amount"] is None and a["admin_user_id"] == root.id for a in runs)
    assert all_pages(c, root.key, target="nobody-at-all")[0] == []
    assert [a["id"] for a in all_pages(c, root.key, target=u.id, action="grant")[0]] == []
    assert new_rows(c, since)[-1]["id"] == newest["id"]


@pytest.mark.parametrize("params, field", [
    ({"action": "refund"}, "action"),
    ({"action": ""}, "action"),
    ({"target": ""}, "target"),
    ({"target": "t" * 64}, "target"),
    ({"admin": "nobody"}, "admin"),
    ({"admin": "key_00000000000000000000"}, "admin"),
    ({"limit": "0"}, "limit"),
    ({"limit": "201"}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"cursor": "not-a-cursor"}, "cursor"),
    ({"user_id": "usr_00000000000000000000"}, "user_id"),
])
def test_the_audit_api_refuses_bad_queries(audited, params, field):
    assert_error(audited.admin("GET", "/v1/admin/audit", params=params), 400, "invalid_query", field)


def test_the_audit_api_is_for_admins_only(audited):
    c = audited
    u = c.signup()
    assert_error(c.d.get("/v1/admin/audit", key=u.key), 403, "forbidden")
    assert_error(c.d.get("/v1/admin/audit"), 401, "unauthorized")


# ---------------------------------------------------------------- the billing team's view

def test_the_report_view_shows_the_rows(audited, admins):
    c, (root, _) = audited, admins
    u = c.cli_user()
    assert as_admin(c, root, "POST", f"/v1/admin/users/{u.id}/topups",
                    json={"amount": "12.34", "payment_id": "pay-audit-report", "reason": "for the report"}
                    ).status_code == 201
    rows = report(c.d.db_path, "admin-actions", "json")
    api, _ = all_pages(c, root.key, limit=200)
    assert [r["action_id"] for r in rows] == sorted(a["id"] for a in api)
    by_id = {a["id"]: a for a in api}
    for r in rows:
        a = by_id[r["action_id"]]
        assert (r["action"], r["target"], r["amount"], r["admin_user_id"], r["api_key_id"], r["reason"]) == \
            (a["action"], a["target"], a["amount"], a["admin_user_id"], a["api_key_id"], a["reason"]), r
        assert json.loads(r["detail"]) == a["detail"]
        assert r["day"] == a["at"][:10] and r["at"] == a["at"].replace("T", " ").rstrip("Z")
    last = rows[-1]
    assert (last["action"], last["amount"], last["reason"], last["admin_email"]) == \
        ("topup", "12.34", "for the report", "admin@localhost")
    assert [r["action_id"] for r in report(c.d.db_path, "admin-actions", "json", "--from", last["day"])] == \
        [r["action_id"] for r in rows]
    assert report(c.d.db_path, "admin-actions", "json", "--to", last["day"]) == []
    # (Reasons here hold line breaks, which CSV quotes and a table cannot
    # show; the columns, as CSV and the table print them:)
    header, table = report(c.d.db_path, "admin-actions", "csv", "--to", "2000-01-01")
    assert header == ["day", "at", "action_id", "action", "target", "amount", "admin_user_id", "admin_email",
                      "api_key_id", "reason", "detail"] and table == []
