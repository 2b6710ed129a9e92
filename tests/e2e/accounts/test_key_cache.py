"""test_key_cache.py: the daemon caches API keys per HTTP thread (issue 15);
every way a key stops working must take effect with the very next request,
on every thread: revoking it, revoke-all, a password change (other login
keys), suspending its owner, and its expiry. Each check asks more times
than the daemon has HTTP threads, each on a new connection, after warming
every thread's cache with the key. A change written by another process
(an operator's sqlite3 shell) shows within about a second."""
import sqlite3

import requests

from agent_util import poll

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


def test_a_key_revoked_by_another_process_stops_within_about_a_second(daemon):
    """Another process's write moves the database's auth_generation row
    (migration 0042's triggers), which the daemon reads at least once a
    second; the daemon's own hooks never see that commit."""
    u = daemon.signup()
    other = daemon.create_key(u.key, name="second")
    assert me(daemon, other["token"]) == {200}
    con = sqlite3.connect(daemon.db_path, timeout=10)
    try:
        with con:
            con.execute("UPDATE api_keys SET revoked_at = created_at WHERE id = ?", (other["id"],))
    finally:
        con.close()
    poll(lambda: me(daemon, other["token"]) == {401}, 10, "the key revoked by another process to stop")
    assert me(daemon, u.key) == {200}


def test_a_key_s_use_and_new_keys_change_no_cached_answer(daemon):
    """Noting a key's last use, a new key and a new account move nothing
    the cache holds, so they leave the auth_generation row alone; a
    revocation moves it once."""
    def gen():
        return daemon.sql("SELECT gen FROM auth_generation")[0][0]
    u = daemon.signup()
    before = gen()
    daemon.create_key(u.key, name="third")
    daemon.signup()
    assert me(daemon, u.key) == {200}
    assert gen() == before
    key = daemon.create_key(u.key, name="fourth")
    assert daemon.delete(f"/v1/api-keys/{key['id']}", key=u.key).status_code in (200, 204)
    assert gen() == before + 1
