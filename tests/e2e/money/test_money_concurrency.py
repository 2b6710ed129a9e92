"""test_money_concurrency.py: money under concurrent requests. One user
redeeming one code 100 times at once gets one grant; a code with a use limit
is never over-redeemed; many instance creates and starts at once cannot spend
the same funds twice (each needs funds for a minimum run of itself and of
everything the user already runs)."""
import threading
from concurrent.futures import ThreadPoolExecutor

import requests

from harness import assert_error
from money_util import MICRO, accrue, new_cluster, verify_ledgers  # noqa: F401


def at_once(n, fn):
    """Runs fn(i) for i in range(n) on n threads released together."""
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        return fn(i)
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(run, range(n)))


def test_100_concurrent_redemptions_give_one_grant(new_cluster):
    c = new_cluster(nodes={})
    u = c.cli_user()  # verified, and no trial yet
    sessions = [requests.Session() for _ in range(100)]
    rs = at_once(100, lambda i: c.d.post("/v1/invite-codes/redeem", key=u.key, json={"code": "amd6gw"},
                                         session=sessions[i]))
    codes = sorted(r.status_code for r in rs)
    assert codes == [201] + [409] * 99, codes
    for r in rs:
        if r.status_code == 409:
            assert_error(r, 409, "conflict", "code")
    [ok] = [r.json() for r in rs if r.status_code == 201]
    assert (ok["code"], ok["amount"]) == ("AMD6GW", "10.00")
    assert c.d.sql("SELECT count(*) FROM credit_grants WHERE user_id = ? AND source = 'invite:AMD6GW'",
                   (u.id,)) == [(1,)]
    assert c.d.sql("SELECT count(*) FROM invite_redemptions WHERE user_id = ?", (u.id,)) == [(1,)]
    b = c.balance(u)
    assert (b["credit"], len(b["grants"])) == (10 * MICRO, 1)
    # Signed up with the code: redeeming it again is refused too.
    v = c.signup(invite_code="AMD6GW")
    assert_error(c.d.post("/v1/invite-codes/redeem", key=v.key, json={"code": "AMD6GW"}), 409, "conflict", "code")
    assert c.balance(v)["credit"] == 10 * MICRO


def test_a_code_with_a_use_limit_is_never_over_redeemed(new_cluster):
    c = new_cluster(nodes={})
    r = c.admin("POST", "/v1/admin/invite-codes", json={"code": "five-only", "amount": "3.00", "max_uses": 5})
    assert r.status_code == 201, r.text
    users = [c.cli_user() for _ in range(40)]  # verified, no trial yet
    rs = at_once(40, lambda i: c.d.post("/v1/invite-codes/redeem", key=users[i].key, json={"code": "FIVE-ONLY"}))
    codes = sorted(r.status_code for r in rs)
    assert codes == [201] * 5 + [400] * 35, codes
    for r in rs:
        if r.status_code == 400:
            assert_error(r, 400, "invalid_invite_code", "code")
    assert c.d.sql("SELECT uses FROM invite_codes WHERE code = 'FIVE-ONLY'") == [(5,)]
    assert c.d.sql("SELECT count(*), sum(amount) FROM credit_grants WHERE source = 'invite:FIVE-ONLY'") == \
        [(5, 15 * MICRO)]
    # Sign-up with a used-up code creates nothing.
    before = c.d.row_counts()["users"]
    r = c.d.post("/v1/signup", json={"email": "late@example.test", "password": "correct horse battery",
                                    "invite_code": "five-only"})
    assert_error(r, 400, "invalid_invite_code", "invite_code")
    assert c.d.row_counts()["users"] == before


def test_concurrent_creates_cannot_spend_the_same_funds_twice(new_cluster):
    # An hour's minimum run: 10.00 covers one 8 x MI450 instance (9.60), not two.
    c = new_cluster(nodes={"MI450": 4}, options={"min_run_minutes": "60"})
    u = c.signup()
    rs = at_once(24, lambda i: c.create(u, "MI450", 8))
    ok = [r for r in rs if r.status_code == 201]
    assert len(ok) == 1, sorted(r.status_code for r in rs)
    for r in rs:
        if r.status_code != 201:
            err = assert_error(r, 402, "insufficient_funds")
            assert "19.20" in err["message"], err  # this one and the one already holding cards
    assert c.d.sql("SELECT count(*) FROM instances WHERE user_id = ?", (u.id,)) == [(1,)]
    iid = ok[0].json()["id"]
    c.wait_state(u, iid, "running")
    # Smaller ones do not fit beside it either: 0.40 is left after an hour.
    t0 = c.d.now()
    c.d.set_clock(t0 + 3600)
    c.billing()
    assert c.balance(u)["available"] == 400_000
    rs = at_once(8, lambda i: c.create(u, "MI450", 1))
    assert all(r.status_code == 402 for r in rs), [r.text for r in rs]
    c.stop(u, iid)


def test_concurrent_starts_cannot_spend_the_same_funds_twice(new_cluster):
    c = new_cluster(nodes={"MI450": 4}, options={"min_run_minutes": "60"})
    u = c.signup()
    a = c.launch(u, "MI450", 8)
    c.stop(u, a)
    b = c.launch(u, "MI450", 8)
    c.stop(u, b)
    # Both stopped, 10.00 left: one of them may start, once.
    rs = at_once(20, lambda i: c.start(u, a if i % 2 else b))
    ok = [r for r in rs if r.status_code == 200]
    assert len(ok) == 1, sorted(r.status_code for r in rs)
    started = ok[0].json()["id"]
    other = b if started == a else a
    for r in rs:
        if r.status_code != 200:
            assert r.status_code in (402, 409), r.text
            assert_error(r, r.status_code, "insufficient_funds" if r.status_code == 402 else "invalid_state")
    assert any(r.status_code == 402 for r in rs)
    c.wait_state(u, started, "running")
    assert c.instance(u, other)["state"] == "stopped"
    # Creating and starting at once: still nothing more.
    rs = at_once(12, lambda i: c.create(u, "MI450", 8) if i % 2 else c.start(u, other))
    assert all(r.status_code in (402, 409) for r in rs), [r.text for r in rs]
    assert c.d.sql("SELECT count(*) FROM instances WHERE user_id = ?", (u.id,)) == [(2,)]
    # It runs until the funds do: 10.00 at 9.60/h is 3 750 s.
    t0 = c.intervals(started)[-1][0]
    c.d.set_clock(t0 + 4000)
    c.billing()
    assert c.spent(u) == accrue(1_200_000, 8, 3750) == 10 * MICRO
    assert c.balance(u)["available"] == 0
    c.wait_state(u, started, "stopped")


def test_admin_grants_honour_idempotency_keys(new_cluster):
    c = new_cluster(nodes={})
    u = c.signup()
    path = f"/v1/admin/users/{u.id}/grants"
    body = {"amount": "3.00", "reason": "outage credit"}
    h = {"Idempotency-Key": "grant-outage-7"}
    first = c.admin("POST", path, json=body, headers=h)
    assert first.status_code == 201, first.text
    again = c.admin("POST", path, json=body, headers=h)
    assert again.status_code == 201 and again.json() == first.json(), again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.headers["Location"] == first.headers["Location"] == f"{path}/{first.json()['grant_id']}"
    assert_error(c.admin("POST", path, json={**body, "amount": "4.00"}, headers=h), 422, "idempotency_key_reused",
                 "Idempotency-Key")
    # Retries racing each other: still one grant.
    h2 = {"Idempotency-Key": "grant-outage-8"}
    rs = at_once(20, lambda i: c.admin("POST", path, json=body, headers=h2))
    assert {r.status_code for r in rs} == {201}, [r.text for r in rs]
    assert len({r.json()["grant_id"] for r in rs}) == 1
    assert c.d.sql("SELECT count(*) FROM credit_grants WHERE user_id = ? AND source = 'admin'", (u.id,)) == [(2,)]
    assert c.balance(u)["credit"] == 16 * MICRO
    # Without a key, each request is its own grant.
    for _ in range(2):
        assert c.admin("POST", path, json=body).status_code == 201
    assert c.balance(u)["credit"] == 22 * MICRO
