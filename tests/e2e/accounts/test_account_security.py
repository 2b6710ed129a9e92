"""Keys and passwords a careful user manages: keys made by logging in expire
(login_key_ttl_s) and say when, every key shows its last use (written at
most once a minute), all of an account's keys are revoked at once, and the
password changes only with the current one, ending the other login
sessions. Bad bodies change nothing."""
import datetime

from agent_util import poll
from harness import DEFAULT_PASSWORD, assert_error

DEADLINE = 30


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def login(d, acct, password=DEFAULT_PASSWORD):
    return d.post("/v1/login", json={"email": acct.email, "password": password})


def keys(d, key):
    r = d.get("/v1/api-keys", key=key)
    assert r.status_code == 200, r.text
    return {k["id"]: k for k in r.json()["data"]}


def test_login_keys_expire_and_say_when(new_daemon):
    d = new_daemon(options={"login_key_ttl_s": "3600"})
    acct = d.signup()
    r = login(d, acct)
    assert r.status_code == 200, r.text
    k = r.json()["api_key"]
    t0 = d.now()
    assert k["expires_at"] == iso(t0 + 3600), k
    assert keys(d, acct.key)[k["id"]]["expires_at"] == iso(t0 + 3600)
    assert d.get("/v1/me", key=k["token"]).status_code == 200
    d.set_clock(t0 + 3599)
    assert d.get("/v1/me", key=k["token"]).status_code == 200
    d.set_clock(t0 + 3600)
    err = assert_error(d.get("/v1/me", key=k["token"]), 401, "unauthorized")
    assert "expired" in err["message"], err
    # Keys made by sign-up or POST /v1/api-keys do not expire.
    assert d.get("/v1/me", key=acct.key).status_code == 200
    assert keys(d, acct.key)[acct.key_id]["expires_at"] is None


def test_keys_show_their_last_use_to_the_minute(daemon, user):
    r = daemon.post("/v1/api-keys", key=user.key, json={"name": "unused"})
    assert r.status_code == 201, r.text
    unused = r.json()
    t0 = daemon.now()

    def last_use(key_id, want):
        """Polls: a use is noted just after the reply of the request."""
        return poll(lambda: keys(daemon, user.key)[key_id]["last_used_at"] == want, DEADLINE,
                    f"{key_id}'s last use to read {want}")
    last_use(user.key_id, iso(t0))
    assert keys(daemon, user.key)[unused["id"]]["last_used_at"] is None
    daemon.set_clock(t0 + 30)
    assert daemon.get("/v1/me", key=user.key).status_code == 200
    assert daemon.sql("SELECT last_used_at FROM api_keys WHERE id = ?", (user.key_id,)) == [(t0,)]  # no write
    daemon.set_clock(t0 + 61)
    assert daemon.get("/v1/me", key=user.key).status_code == 200
    last_use(user.key_id, iso(t0 + 61))
    # A refused request does not count as a use.
    assert_error(daemon.post("/v1/api-keys", key=unused["token"], json={"name": 5}), 400, "invalid_field", "name")
    assert daemon.get("/v1/me", key=user.key).status_code == 200
    assert keys(daemon, user.key)[unused["id"]]["last_used_at"] is None
    assert daemon.get("/v1/me", key=unused["token"]).status_code == 200
    last_use(unused["id"], iso(t0 + 61))


def test_revoke_all_keys(daemon):
    acct = daemon.signup()
    others = [daemon.post("/v1/api-keys", key=acct.key, json={"name": f"k{i}"}).json() for i in range(3)]
    r = daemon.delete("/v1/api-keys", key=acct.key)
    assert r.status_code == 200 and r.json() == {"revoked": 3, "kept_current": True}, r.text
    for k in others:
        assert_error(daemon.get("/v1/me", key=k["token"]), 401, "unauthorized")
    assert daemon.get("/v1/me", key=acct.key).status_code == 200
    # Another account's keys are untouched.
    other = daemon.signup()
    r = daemon.delete("/v1/api-keys", key=acct.key, params={"keep_current": "false"})
    assert r.status_code == 200 and r.json() == {"revoked": 1, "kept_current": False}, r.text
    assert_error(daemon.get("/v1/me", key=acct.key), 401, "unauthorized")
    assert daemon.get("/v1/me", key=other.key).status_code == 200
    for params, field in (({"keep_current": "yes"}, "keep_current"), ({"keep_current": "1"}, "keep_current"),
                          ({"everything": "true"}, "everything")):
        assert_error(daemon.delete("/v1/api-keys", key=other.key, params=params), 400, "invalid_query", field)
    assert_error(daemon.delete("/v1/api-keys"), 401, "unauthorized")
    assert daemon.get("/v1/me", key=other.key).status_code == 200


def test_password_change_needs_the_current_one_and_ends_other_logins(daemon):
    acct = daemon.signup()
    session = login(daemon, acct).json()["api_key"]
    script = daemon.post("/v1/api-keys", key=acct.key, json={"name": "script"}).json()
    new = "a brand new passphrase"
    before = daemon.dump()
    bad = [
        ({"current_password": "not the password", "new_password": new}, 403, "forbidden", "current_password"),
        ({"current_password": DEFAULT_PASSWORD, "new_password": "short"}, 400, "invalid_field", "new_password"),
        ({"current_password": DEFAULT_PASSWORD}, 400, "missing_field", "new_password"),
        ({"new_password": new}, 400, "missing_field", "current_password"),
        ({"current_password": DEFAULT_PASSWORD, "new_password": 1234567890123}, 400, "invalid_field", "new_password"),
        ({"current_password": DEFAULT_PASSWORD, "new_password": new, "otp": "1"}, 400, "unknown_field", "otp"),
    ]
    for body, status, code, field in bad:
        assert_error(daemon.post("/v1/me/password", key=acct.key, json=body), status, code, field)
    assert_error(daemon.post("/v1/me/password", key=acct.key, data=b"{nope",
                             headers={"Content-Type": "application/json"}), 400, "malformed_json")
    assert daemon.dump() == before
    assert login(daemon, acct).status_code == 200

    r = daemon.post("/v1/me/password", key=acct.key, json={"current_password": DEFAULT_PASSWORD, "new_password": new})
    assert r.status_code == 200, r.text
    assert r.json()["changed"] is True and r.json()["login_keys_revoked"] >= 1
    assert_error(login(daemon, acct), 401, "invalid_credentials")
    assert login(daemon, acct, new).status_code == 200
    assert_error(daemon.get("/v1/me", key=session["token"]), 401, "unauthorized")  # another login's session
    assert daemon.get("/v1/me", key=script["token"]).status_code == 200            # a named key stays
    assert daemon.get("/v1/me", key=acct.key).status_code == 200                   # so does the caller


def test_wrong_current_passwords_lock_the_change_as_failed_logins_do(new_daemon):
    """An API key is not a way to guess the account's password: after
    login_max_failures wrong current passwords the change is refused (429,
    Retry-After) even with the right one until login_lockout_s has passed,
    and nothing changes meanwhile. Other accounts are not locked by it."""
    d = new_daemon(options={"login_max_failures": 3, "login_lockout_s": 600})
    acct, other = d.signup(), d.signup()
    new = "a brand new passphrase"
    for _ in range(3):
        assert_error(d.post("/v1/me/password", key=acct.key, json={"current_password": "a guess at it",
                                                                   "new_password": new}),
                     403, "forbidden", "current_password")
    before = d.dump()
    for current in ("a guess at it", DEFAULT_PASSWORD):
        r = d.post("/v1/me/password", key=acct.key, json={"current_password": current, "new_password": new})
        assert_error(r, 429, "too_many_requests")
        assert r.headers["Retry-After"] == "600"
    assert d.dump() == before
    r = d.post("/v1/me/password", key=other.key, json={"current_password": DEFAULT_PASSWORD, "new_password": new})
    assert r.status_code == 200, r.text
    d.advance_clock(600)
    r = d.post("/v1/me/password", key=acct.key, json={"current_password": DEFAULT_PASSWORD, "new_password": new})
    assert r.status_code == 200, r.text
    assert login(d, acct, new).status_code == 200
