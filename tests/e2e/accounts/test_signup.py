"""Trial credit for people, not scripts (issue 13), through the real daemon
and a real local SMTP server (aiosmtpd): verification mail read from the
server, no credit and no launch before verifying, one trial per account,
normalised e-mail uniqueness, expired and used codes, sign-up rate limits
per address and subnet (applied on SIGHUP, counted in /metrics), invite
codes' per-day cap, the mailer's retries, admins' look-up, sign-up list
and suspension, and bad input on every new route and field."""
import os
import signal

import pytest

from agent_util import poll
from harness import DEFAULT_PASSWORD, assert_error, run_gpurentd, unique_email
from mail_util import VERIFICATION_CODE, Sink, free_port, mail_options, post_from, verification_code
from money_util import ledger_verify



def balance(d, key):
    r = d.get("/v1/balance", key=key)
    assert r.status_code == 200, r.text
    return r.json()


def grants(d, user_id):
    return d.sql("SELECT source, amount FROM credit_grants WHERE user_id = ? ORDER BY created_at", (user_id,))


def signup(d, email_addr, expect=201, source=None, **fields):
    r = d.post("/v1/signup", json={"email": email_addr, "password": DEFAULT_PASSWORD, **fields})
    assert r.status_code == expect, r.text
    return r


def check_ledger(d):
    rc, out = ledger_verify(d.db_path)
    assert rc == 0, out


# ---------------------------------------------------------------- verification and the trial

def test_mail_is_sent_and_credit_waits_for_verification(new_daemon, sink):
    d = new_daemon(options=mail_options(sink))
    typed = "Ada.Lovelace+gpu@Example.test"
    r = signup(d, typed)
    body = r.json()
    key, uid = body["api_key"]["token"], body["user"]["id"]
    assert body["user"]["email"] == typed.lower() and body["user"]["email_verified"] is False
    assert body["email_verification"] == {"status": "sent", "sent_to": typed, "expires_in_s": 86400}
    # No credit until the address is verified: not the trial, not a code.
    assert grants(d, uid) == []
    assert d.get("/v1/me", key=key).json()["email_verified"] is False
    assert_error(d.post("/v1/instances", key=key, json={"gpu_type": "MI450", "card_count": 1,
                                                         "image": "rocm/pytorch:2.3-rocm6.2"}),
                 403, "email_not_verified")
    assert_error(d.post("/v1/instances/ins_aaaaaaaaaaaaaaaaaaaa/start", key=key), 403, "email_not_verified")
    assert_error(d.post("/v1/invite-codes/redeem", key=key, json={"code": "AMD6GW"}), 403, "email_not_verified")
    # Nor a volume, which is billed from its creation.
    assert_error(d.post("/v1/volumes", key=key, json={"name": "data", "size_gb": 10}), 403, "email_not_verified")
    assert d.get("/v1/volumes", key=key).json()["data"] == []
    # Browsing still works.
    assert d.get("/v1/balance", key=key).status_code == 200
    assert d.get("/v1/instances", key=key).status_code == 200

    # The mail, as the SMTP server got it: to the address as typed, from
    # smtp_from, with the code and the public URL.
    rcpt, sender, msg = sink.mail_to(typed)[0]
    assert rcpt == [typed] and sender == "noreply@gpurent.test"
    assert msg["Subject"] == "Verify your gpurent e-mail address" and typed in str(msg["To"])
    text = msg.get_content()
    code = VERIFICATION_CODE.search(text).group(1)
    assert "https://api.gpurent.test/v1/verify-email" in text
    # Only the code's hash is stored, and the outbox forgets the text once sent.
    assert d.sql("SELECT count(*) FROM email_verifications WHERE token_hash = ?", (code,)) == [(0,)]
    poll(lambda: d.sql("SELECT body, sent_at IS NOT NULL FROM outbox WHERE user_id = ?", (uid,)) == [("", 1)],
         10, "the outbox row marked sent and blanked")

    r = d.post("/v1/verify-email", json={"token": code})
    assert r.status_code == 200, r.text
    v = r.json()
    assert v["user_id"] == uid and v["email_verified"] is True
    assert (v["credit"]["source"], v["credit"]["amount"]) == ("signup", "10.00")
    assert grants(d, uid) == [("signup", 10_000_000)]
    assert d.get("/v1/me", key=key).json()["email_verified"] is True
    # Single use.
    e = assert_error(d.post("/v1/verify-email", json={"token": code}), 400, "invalid_field", "token")
    assert "used" in e["message"]
    # One trial per account: the code redeemed later is refused.
    e = assert_error(d.post("/v1/invite-codes/redeem", key=key, json={"code": "AMD6GW"}), 409, "conflict", "code")
    assert "trial" in e["message"]
    assert grants(d, uid) == [("signup", 10_000_000)]
    check_ledger(d)


def test_invite_code_at_signup_is_the_trial_granted_at_verification(new_daemon, sink):
    d = new_daemon(options=mail_options(sink))
    addr = unique_email("invited")
    uid = signup(d, addr, invite_code="amd6gw").json()["user"]["id"]
    assert grants(d, uid) == []
    assert d.sql("SELECT uses FROM invite_codes WHERE code = 'AMD6GW'") == [(0,)]
    v = d.post("/v1/verify-email", json={"token": verification_code(sink, addr)}).json()
    assert (v["credit"]["source"], v["credit"]["amount"]) == ("invite:AMD6GW", "10.00")
    assert grants(d, uid) == [("invite:AMD6GW", 10_000_000)]
    # A second code later: refused, the account had its trial.
    key = d.login(addr, DEFAULT_PASSWORD).json()["api_key"]["token"]
    r = d.post("/v1/admin/invite-codes", key=d.admin_key, json={"code": "SECOND", "amount": "5.00"})
    assert r.status_code == 201, r.text
    assert_error(d.post("/v1/invite-codes/redeem", key=key, json={"code": "SECOND"}), 409, "conflict", "code")
    assert grants(d, uid) == [("invite:AMD6GW", 10_000_000)]
    check_ledger(d)


def test_admin_made_users_count_as_verified_and_may_redeem_once(new_daemon):
    d = new_daemon()
    addr = unique_email("cli")
    token = d.cli_create_user(addr)
    me = d.get("/v1/me", key=token).json()
    assert me["email_verified"] is True
    r = d.post("/v1/invite-codes/redeem", key=token, json={"code": "AMD6GW"})
    assert r.status_code == 201, r.text
    r = d.post("/v1/admin/invite-codes", key=d.admin_key, json={"code": "AGAIN", "amount": "5.00"})
    assert_error(d.post("/v1/invite-codes/redeem", key=token, json={"code": "AGAIN"}), 409, "conflict", "code")
    check_ledger(d)


def test_expired_code_and_resend(new_daemon, sink):
    d = new_daemon(options=mail_options(sink, email_verify_ttl_s="3600"))
    addr = unique_email("late")
    key = signup(d, addr).json()["api_key"]["token"]
    code = verification_code(sink, addr)
    d.advance_clock(3600)
    e = assert_error(d.post("/v1/verify-email", json={"token": code}), 400, "invalid_field", "token")
    assert "expired" in e["message"]
    assert d.get("/v1/me", key=key).json()["email_verified"] is False
    # A new code on request; a second request within a minute waits.
    r = d.post("/v1/verify-email/resend", key=key)
    assert r.status_code == 202, r.text
    r2 = d.post("/v1/verify-email/resend", key=key)
    assert_error(r2, 429, "too_many_requests")
    assert 1 <= int(r2.headers["Retry-After"]) <= 60
    fresh = verification_code(sink, addr, n=2)
    assert fresh != code
    assert d.post("/v1/verify-email", json={"token": fresh}).status_code == 200
    d.advance_clock(61)
    assert_error(d.post("/v1/verify-email/resend", key=key), 409, "conflict")
    # Unknown codes, well-formed or not.
    for bad in ("evc_aaaaaaaaaaaaaaaaaaaa", "not-a-code", "EVC_" + fresh[4:]):
        e = assert_error(d.post("/v1/verify-email", json={"token": bad}), 400, "invalid_field", "token")
        assert "no such verification code" in e["message"]
    check_ledger(d)


# ---------------------------------------------------------------- e-mail normalisation

def test_normalised_duplicates_are_refused(new_daemon):
    d = new_daemon()
    first = d.signup(email="jane.doe@gmail.com")
    for dup in ("JaneDoe@gmail.com", "j.a.n.e.d.o.e+trial@googlemail.com", "jane.doe@GoogleMail.com",
                "jane.doe+2@GMAIL.com", "Jane.Doe@gmail.com"):
        e = assert_error(d.post("/v1/signup", json={"email": dup, "password": DEFAULT_PASSWORD}), 409, "email_taken",
                         "email")
    # A domain with an empty label (the trailing dot of a DNS name reaches
    # the same mailbox) is no address to make an account with.
    before = d.dump()
    for bad in ("jane.doe@gmail.com.", "jane@.gmail.com", "jane@gmail..com"):
        assert_error(d.post("/v1/signup", json={"email": bad, "password": DEFAULT_PASSWORD}), 400, "invalid_field",
                     "email")
    assert d.dump() == before
    # Dots count elsewhere; +tags do not.
    d.signup(email="jane.doe@example.test")
    d.signup(email="janedoe@example.test")
    assert_error(d.post("/v1/signup", json={"email": "jane.doe+x@example.test", "password": DEFAULT_PASSWORD}),
                 409, "email_taken", "email")
    # Any spelling of the mailbox logs in to the one account.
    for spelling in ("JANEDOE+abc@gmail.com", "jane.doe@googlemail.com"):
        r = d.login(spelling, DEFAULT_PASSWORD)
        assert r.status_code == 200 and r.json()["user"]["id"] == first.id, r.text
    # Admins find it by any spelling too.
    r = d.get("/v1/admin/users", key=d.admin_key, params={"email": "j.anedoe+zz@gmail.com"})
    assert r.status_code == 200, r.text
    [u] = r.json()["data"]
    assert (u["id"], u["email_display"], u["email_verified"]) == (first.id, "jane.doe@gmail.com", True)


def test_normalisation_options(new_daemon):
    d = new_daemon(options={"email_strip_plus_tags": "0", "email_dotless_domains": "", "email_domain_aliases": ""})
    d.signup(email="a.b@gmail.com")
    d.signup(email="ab@gmail.com")
    d.signup(email="ab+x@gmail.com")
    d.signup(email="ab@googlemail.com")
    assert_error(d.post("/v1/signup", json={"email": "AB+X@gmail.com", "password": DEFAULT_PASSWORD}), 409,
                 "email_taken", "email")


@pytest.mark.parametrize("value", ["googlemail.com", "=gmail.com", "googlemail.com=", "a b=c", "x=y;z"])
def test_bad_domain_aliases_are_refused_at_load(value):
    p = run_gpurentd("-n", "-o", f"email_domain_aliases={value}")
    assert p.returncode != 0 and "email_domain_aliases" in p.stderr, p.stderr


# ---------------------------------------------------------------- farming: the rate limits

def metric(d, name, **labels):
    text = d.get("/metrics", key=d.admin_key).text
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {want} in /metrics")


def test_signup_rate_limits_per_address_and_subnet_and_sighup(new_daemon, tmp_path):
    d = new_daemon(options={"signup_rate_per_address": "2", "signup_rate_per_subnet": "3"})
    made = []

    def attempt(source):
        addr = unique_email("farm")
        status, headers, body = post_from(d, source, "/v1/signup", {"email": addr, "password": DEFAULT_PASSWORD,
                                                                    "invite_code": "AMD6GW"})
        if status == 201:
            made.append(body["user"]["id"])
        return status, headers, body

    assert attempt("127.0.0.1")[0] == 201
    assert attempt("127.0.0.1")[0] == 201
    status, headers, body = attempt("127.0.0.1")
    assert status == 429 and body["error"]["code"] == "too_many_requests", body
    assert 3500 <= int(headers["Retry-After"]) <= 3600 and "this address" in body["error"]["message"]
    # Another address of the same /24: one more, then the subnet is full.
    assert attempt("127.0.0.2")[0] == 201
    status, headers, body = attempt("127.0.0.3")
    assert status == 429 and "this network" in body["error"]["message"], body
    assert int(headers["Retry-After"]) > 0
    assert metric(d, "gpurent_signups_total") == 3
    assert metric(d, "gpurent_signups_refused_total", reason="rate_address") == 1
    assert metric(d, "gpurent_signups_refused_total", reason="rate_subnet") == 1
    # None of the accounts has credit: the code waits for verification.
    assert d.sql("SELECT count(*) FROM credit_grants") == [(0,)]
    # The admin sees where they came from.
    r = d.get("/v1/admin/signups", key=d.admin_key, params={"address": "127.0.0.1"})
    assert r.status_code == 200, r.text
    assert [u["id"] for u in r.json()["data"]] == made[1::-1]
    assert all(u["signup_address"] == "127.0.0.1" and u["email_verified"] is False for u in r.json()["data"])
    r = d.get("/v1/admin/signups", key=d.admin_key, params={"limit": "1"})
    assert [u["id"] for u in r.json()["data"]] == [made[-1]]

    # The hour passes: the address may sign up again.
    d.advance_clock(3601)
    assert attempt("127.0.0.1")[0] == 201
    assert attempt("127.0.0.1")[0] == 201
    assert attempt("127.0.0.1")[0] == 429


def test_sighup_changes_the_signup_limits(new_daemon, tmp_path):
    conf = "signup_rate_per_address = 1\nsignup_rate_per_subnet = 0\n"
    d = new_daemon(config=conf, start=False)
    # The file's limits, not the harness's overrides.
    del d.options["signup_rate_per_address"], d.options["signup_rate_per_subnet"]
    d.start()
    assert signup(d, unique_email("a")).status_code == 201
    signup(d, unique_email("b"), expect=429)
    with open(d.config_path, "w") as f:
        f.write("signup_rate_per_address = 0\nsignup_rate_per_subnet = 0\n")
    d.proc.send_signal(signal.SIGHUP)
    d.wait_for_log(r"reload: applied .*signup_rate_per_address=0 signup_rate_per_subnet=0")
    assert signup(d, unique_email("c")).status_code == 201


# ---------------------------------------------------------------- invite codes' per-day cap

def test_invite_per_day_cap(new_daemon):
    d = new_daemon()
    r = d.post("/v1/admin/invite-codes", key=d.admin_key,
               json={"code": "daily", "amount": "3.00", "max_uses_per_day": 2, "max_uses": 10})
    assert r.status_code == 201, r.text
    assert r.json()["max_uses_per_day"] == 2
    a = d.signup(invite_code="DAILY")
    b = d.signup(invite_code="DAILY")
    assert grants(d, a.id) == [("invite:DAILY", 3_000_000)] and grants(d, b.id) == [("invite:DAILY", 3_000_000)]
    e = assert_error(d.post("/v1/signup", json={"email": unique_email(), "password": DEFAULT_PASSWORD,
                                                "invite_code": "DAILY"}), 400, "invalid_invite_code", "invite_code")
    assert "today" in e["message"]
    # A later redemption meets the cap too.
    c = d.signup()
    r = d.post("/v1/admin/invite-codes", key=d.admin_key, json={"code": "ONEADAY", "amount": "1.00",
                                                                "max_uses_per_day": 1})
    d.signup(invite_code="ONEADAY")
    # c already had its trial (sign-up credit): 409 before the cap is asked.
    assert_error(d.post("/v1/invite-codes/redeem", key=c.key, json={"code": "ONEADAY"}), 409, "conflict", "code")
    # The next UTC day of the daemon's clock opens the cap again.
    now = d.now()
    d.set_clock(now - now % 86400 + 86400)
    late = d.signup(invite_code="DAILY")
    assert grants(d, late.id) == [("invite:DAILY", 3_000_000)]
    check_ledger(d)


# ---------------------------------------------------------------- the mailer retries

def test_mail_is_retried_until_the_server_takes_it(new_daemon):
    port = free_port()  # nothing listens yet
    d = new_daemon(options={"smtp_url": f"smtp://127.0.0.1:{port}", "smtp_tls": "none"})
    addr = unique_email("retry")
    uid = signup(d, addr).json()["user"]["id"]
    poll(lambda: d.sql("SELECT attempts FROM outbox WHERE user_id = ?", (uid,))[0][0] >= 1, 15, "a failed try")
    [(attempts, sent, err)] = d.sql("SELECT attempts, sent_at, last_error FROM outbox WHERE user_id = ?", (uid,))
    assert sent is None and err
    assert metric(d, "gpurent_mail_failures_total") >= 1
    # Across a restart the mail is still queued; the server comes up and the
    # backoff passes (on the daemon's clock).
    d.restart()
    s = Sink(port)
    try:
        d.advance_clock(3600)
        code = verification_code(s, addr)
        assert d.post("/v1/verify-email", json={"token": code}).status_code == 200
        poll(lambda: d.sql("SELECT sent_at IS NOT NULL FROM outbox WHERE user_id = ?", (uid,)) == [(1,)], 10, "sent")
    finally:
        s.stop()


def test_credentials_file_readable_by_others_is_refused(new_daemon, tmp_path):
    cred = tmp_path / "smtp.cred"
    cred.write_text("mailer:s3cret\n")
    os.chmod(cred, 0o644)
    d = new_daemon(start=False, options={"smtp_url": "smtp://127.0.0.1:1", "smtp_credentials_file": str(cred)})
    with pytest.raises(Exception):
        d.start()
    d.wait(timeout=30)
    assert "others may read or change it" in d.stderr_text() and "s3cret" not in d.stderr_text()
    # -n finds it too, and a file that is missing or not user:password.
    from harness import run_gpurentd
    bad = tmp_path / "bad.cred"
    bad.write_text("no colon here\n")
    os.chmod(bad, 0o600)
    for path, why in ((cred, "others may read or change it"), (tmp_path / "absent", "cannot read"),
                      (bad, "user:password")):
        p = run_gpurentd("-n", "-o", f"smtp_credentials_file={path}")
        assert p.returncode != 0 and why in p.stderr and "configuration OK" not in p.stdout, p.stderr
    os.chmod(cred, 0o600)
    p = run_gpurentd("-n", "-o", f"smtp_credentials_file={cred}")
    assert p.returncode == 0 and "s3cret" not in p.stdout + p.stderr, p.stderr
    d.start()
    d.wait_for_log(r"mailer: sending mail through smtp://127\.0\.0\.1:1 \(TLS required\) with AUTH")


def test_configuration_checks(tmp_path):
    from harness import run_gpurentd
    for opt, msg in (("smtp_url=http://x", "smtp:// or smtps://"), ("smtp_tls=maybe", "none, starttls or required"),
                     ("smtp_from=no-at-sign", "bare address"), ("email_verify_ttl_s=10", "email_verify_ttl_s"),
                     ("signup_rate_per_address=-1", "signup_rate_per_address")):
        p = run_gpurentd("serve", "-n", "--db", str(tmp_path / "x.db"), "-o", opt)
        assert p.returncode != 0 and msg in p.stderr, (opt, p.stderr)


# ---------------------------------------------------------------- admins: look-up and suspension

def test_admin_lookup_and_signups_bad_input(new_daemon):
    d = new_daemon()
    u = d.signup()
    admin = d.admin_key
    assert d.get("/v1/admin/users", key=admin, params={"email": "nobody@example.test"}).json() == {"data": []}
    for params, field in (({}, "email"), ({"email": "no-at"}, "email"), ({"email": "a@b", "x": "1"}, None)):
        r = d.get("/v1/admin/users", key=admin, params=params)
        assert r.status_code == 400 and r.json()["error"]["code"] in ("invalid_query", "unknown_field"), r.text
    for params in ({"address": "1.2.3"}, {"address": "x"}, {"limit": "0"}, {"limit": "1001"}, {"limit": "a"},
                   {"other": "1"}):
        r = d.get("/v1/admin/signups", key=admin, params=params)
        assert r.status_code == 400, (params, r.text)
    assert d.get("/v1/admin/signups", key=admin, params={"address": "::1"}).json() == {"data": []}
    for path in ("/v1/admin/users?email=a@b.c", "/v1/admin/signups"):
        assert_error(d.get(path, key=u.key), 403, "forbidden")
    for verb in ("suspend", "reinstate"):
        why = {"reason": "r"}
        assert_error(d.post(f"/v1/admin/users/{u.id}/{verb}", key=u.key, json=why), 403, "forbidden")
        assert_error(d.post(f"/v1/admin/users/usr_aaaaaaaaaaaaaaaaaaaa/{verb}", key=admin, json=why), 404,
                     "not_found")
        assert_error(d.post(f"/v1/admin/users/nope/{verb}", key=admin, json=why), 404, "not_found")
        assert_error(d.post(f"/v1/admin/users/{u.id}/{verb}", key=admin, json={}), 400, "missing_field", "reason")
        assert_error(d.post(f"/v1/admin/users/{u.id}/{verb}", key=admin, json={"reason": 5}), 400, "invalid_field",
                     "reason")
        assert_error(d.post(f"/v1/admin/users/{u.id}/{verb}", key=admin, json={"why": "x"}), 400, "unknown_field", "why")
        assert_error(d.post(f"/v1/admin/users/{u.id}/{verb}", key=admin, json={"reason": ""}), 400, "invalid_field", "reason")
    admin_id = d.get("/v1/me", key=admin).json()["id"]
    assert_error(d.post(f"/v1/admin/users/{admin_id}/suspend", key=admin, json={"reason": "oops"}), 409, "conflict")
    assert d.sql("SELECT count(*) FROM admin_actions WHERE action IN ('suspend', 'reinstate')") == [(0,)]
    assert d.sql("SELECT status FROM users WHERE id = ?", (u.id,)) == [("active",)]
    # The new fields of existing routes.
    for bad in ({}, {"token": 5}, {"token": None}, {"token": "x" * 65}, {"token": "evc_x", "more": 1}):
        r = d.post("/v1/verify-email", json=bad)
        assert r.status_code == 400, (bad, r.text)
    assert_error(d.post("/v1/verify-email/resend", key=u.key, json={"x": 1}), 400, "unknown_field", "x")
    assert_error(d.post("/v1/verify-email/resend"), 401, "unauthorized")
    for bad in (0, -1, 100000001, "2", 1.5, True):
        r = d.post("/v1/admin/invite-codes", key=admin, json={"code": "BADCAP", "amount": "1.00",
                                                              "max_uses_per_day": bad})
        assert r.status_code == 400 and r.json()["error"]["field"] == "max_uses_per_day", (bad, r.text)
    assert d.sql("SELECT count(*) FROM invite_codes WHERE code = 'BADCAP'") == [(0,)]


def test_suspension_stops_instances_and_refuses_keys(new_daemon, tmp_path):
    from instances_util import Cloud
    c = Cloud(new_daemon, tmp_path)
    try:
        c.fleet(1)
        u = c.user()
        inst = c.create(u, card_count=1)
        c.wait_state(u, inst["id"], ("running",))
        d = c.d
        r = d.post(f"/v1/admin/users/{u.id}/suspend", key=d.admin_key, json={"reason": "trial farming"})
        assert r.status_code == 200, r.text
        assert r.json()["instances_stopped"] == 1 and r.json()["user"]["status"] == "disabled"
        assert_error(d.get("/v1/me", key=u.key), 403, "account_disabled")
        assert_error(d.login(u.email, DEFAULT_PASSWORD), 403, "account_disabled")
        poll(lambda: d.sql("SELECT desired, state FROM instances WHERE id = ?", (inst["id"],)) ==
             [("stopped", "stopped")], 30, "the instance stopped")
        assert d.sql("SELECT count(*) FROM volumes WHERE user_id = ?", (u.id,))[0][0] >= 1
        rows = d.sql("SELECT action, target, reason, json_extract(detail, '$.instances_stopped') FROM admin_actions"
                     " WHERE action IN ('suspend', 'reinstate') ORDER BY id")
        assert rows == [("suspend", u.id, "trial farming", 1)]
        r = d.post(f"/v1/admin/users/{u.id}/reinstate", key=d.admin_key, json={"reason": "appeal"})
        assert r.status_code == 200 and r.json()["user"]["status"] == "active", r.text
        assert d.get("/v1/me", key=u.key).status_code == 200
        assert d.sql("SELECT action FROM admin_actions WHERE action = 'reinstate'") == [("reinstate",)]
        # Reinstated, it is not started again by itself.
        assert d.sql("SELECT desired FROM instances WHERE id = ?", (inst["id"],)) == [("stopped",)]
        check_ledger(d)
    finally:
        c.close()


# ---------------------------------------------------------------- accounts made before migration 0021

def test_accounts_from_before_the_migration_are_verified_and_keep_their_trial(new_daemon, tmp_path):
    import sqlite3
    from harness import api_key_hash, run_gpurentd
    d = new_daemon(start=False)
    assert run_gpurentd("migrate", "--db", d.db_path, "--to", "16").returncode == 0
    token_a = "gpk_" + "a" * 20 + "_" + "1" * 64
    token_b = "gpk_" + "b" * 20 + "_" + "2" * 64
    con = sqlite3.connect(d.db_path)
    with con:
        for uid, addr, token, grant in (("usr_" + "a" * 20, "a.b+old@gmail.com", token_a, True),
                                        ("usr_" + "b" * 20, "plain@example.test", token_b, False)):
            con.execute("INSERT INTO users (id, email, created_at) VALUES (?, ?, 1000)", (uid, addr))
            con.execute("INSERT INTO api_keys (id, user_id, name, secret_hash, created_at) VALUES (?, ?, 'k', ?, 1000)",
                        ("key_" + uid[4:], uid, api_key_hash(token)))
            if grant:
                con.execute("INSERT INTO credit_grants (id, user_id, source, amount, remaining, created_at)"
                            " VALUES (?, ?, 'signup', 1, 1, 1000)", ("grt_" + "c" * 20, uid))
    con.close()
    d.start()
    assert d.get("/v1/me", key=token_a).json()["email_verified"] is True
    rows = d.sql("SELECT id, email_key, email_verified_at, trial_at FROM users WHERE id IN (?, ?) ORDER BY id",
                 ("usr_" + "a" * 20, "usr_" + "b" * 20))
    assert rows == [("usr_" + "a" * 20, "a.b+old@gmail.com", 1000, 1000), ("usr_" + "b" * 20, "plain@example.test",
                                                                           1000, None)]
    # The one with a sign-up grant had its trial; the other may redeem a code.
    assert_error(d.post("/v1/invite-codes/redeem", key=token_a, json={"code": "AMD6GW"}), 409, "conflict", "code")
    assert d.post("/v1/invite-codes/redeem", key=token_b, json={"code": "AMD6GW"}).status_code == 201
    # Its old lower-cased address still finds it, though it is not in the new normal form.
    r = d.get("/v1/admin/users", key=d.admin_key, params={"email": "A.B+old@gmail.com"})
    assert [u["id"] for u in r.json()["data"]] == ["usr_" + "a" * 20]
