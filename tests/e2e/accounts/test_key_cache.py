"""test_key_cache.py: the daemon caches API keys per HTTP thread (issue 15);
every way a key stops working must take effect with the very next request,
on every thread: revoking it, revoke-all, a password change (other login
keys), suspending its owner, and its expiry. Each check asks more times
than the daemon has HTTP threads, each on a new connection, after warming
every thread's cache with the key."""
import requests

from harness import DEFAULT_PASSWORD
from money_util import from_iso

ASKS = 12


def me(d, token):
    """Status of GET /v1/me with token on ASKS fresh connections (one set)."""
    codes = set()
    for _ in range(ASKS):
        r = requests.get(d.url("/v1/me"), headers={"Authorization": f"Bearer {token}", "Connection": "close"},
                         timeout=10)
        codes.add(r.status_code)
    return codes


def test_revoked_key_stops_at_once(daemon):
    u = daemon.signup()
    other = daemon.create_key(u.key, name="second")
    assert me(daemon, other["token"]) == {200}  # every thread holds it now
    r = daemon.delete(f"/v1/api-keys/{other['id']}", key=u.key)
    assert r.status_code in (200, 204), r.text
    assert me(daemon, other["token"]) == {401}
    assert me(daemon, u.key) == {200}  # the caller's own key is untouched


def test_revoke_all_stops_every_key_at_once(daemon):
    u = daemon.signup()
    keys = [daemon.create_key(u.key)["token"] for _ in range(3)]
    for k in keys + [u.key]:
        assert me(daemon, k) == {200}
    r = daemon.delete("/v1/api-keys", key=u.key, params={"keep_current": "false"})
    assert r.status_code == 200, r.text
    for k in keys + [u.key]:
        assert me(daemon, k) == {401}


def test_password_change_stops_login_keys_at_once(daemon):
    u = daemon.signup()
    r = daemon.login(u.email, u.password)
    assert r.status_code in (200, 201), r.text
    login_key = r.json()["api_key"]["token"]
    assert me(daemon, login_key) == {200}
    r = daemon.post("/v1/me/password", key=u.key,
                    json={"current_password": u.password, "new_password": DEFAULT_PASSWORD + "-changed"})
    assert r.status_code == 200, r.text
    assert r.json()["login_keys_revoked"] >= 1
    assert me(daemon, login_key) == {401}


def test_suspension_stops_keys_at_once_and_reinstating_restores(daemon):
    u = daemon.signup()
    assert me(daemon, u.key) == {200}
    r = daemon.post(f"/v1/admin/users/{u.id}/suspend", key=daemon.admin_key, json={"reason": "cache test"})
    assert r.status_code == 200, r.text
    assert me(daemon, u.key) == {403}
    r = daemon.post(f"/v1/admin/users/{u.id}/reinstate", key=daemon.admin_key, json={"reason": "cache test over"})
    assert r.status_code == 200, r.text
    assert me(daemon, u.key) == {200}


def test_expired_key_stops_at_once(daemon):
    u = daemon.signup()
    r = daemon.login(u.email, u.password)
    assert r.status_code in (200, 201), r.text
    key = r.json()["api_key"]
    assert key["expires_at"], key
    assert me(daemon, key["token"]) == {200}
    daemon.set_clock(from_iso(key["expires_at"]))
    assert me(daemon, key["token"]) == {401}
