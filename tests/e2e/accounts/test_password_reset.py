"""The way back into an account whose password is forgotten, through the
real daemon and a real local SMTP server (aiosmtpd): POST
/v1/password-reset mails a single-use code, POST /v1/password-reset/confirm
sets the new password with it. Covered: the whole flow (the mail, only the
code's hash stored, the new password, the old one refused, every login
session ended and the other keys kept, the address verified with its
trial, the account's events, the report); the mailed curl line for an
address holding a '; the same answer and no mail for
an unknown or suspended address; no code in the log without smtp_url;
expiry on the daemon's clock; wrong tries until the code is dead; a newer
code replacing the older; replay of a used code; the rate limits per
address and per client address; wrong codes counted as failed logins from
the client; and bad input of every kind, which changes nothing."""
import hashlib
import json
import re
import shlex


from agent_util import poll
from harness import DEFAULT_PASSWORD, assert_error, run_gpurentd, unique_email
from mail_util import RESET_CODE, VERIFICATION_CODE, mail_options, post_from, reset_codes
from money_util import ledger_verify

NEW_PASSWORD = "a brand new passphrase"



def ask(d, addr, ttl=1800):
    r = d.post("/v1/password-reset", json={"email": addr})
    assert r.status_code == 202, r.text
    assert r.json() == {"status": "accepted", "expires_in_s": ttl}
    return r


def confirm(d, addr, code, password=NEW_PASSWORD):
    return d.post("/v1/password-reset/confirm", json={"email": addr, "code": code, "new_password": password})


def refused(d, addr, code, password=NEW_PASSWORD):
    return assert_error(confirm(d, addr, code, password), 400, "invalid_reset_code", "code")


def signup(d, addr):
    r = d.post("/v1/signup", json={"email": addr, "password": DEFAULT_PASSWORD})
    assert r.status_code == 201, r.text
    return r.json()


def events(d, uid):
    return [(e, json.loads(detail)) for e, detail in
            d.sql("SELECT event, detail FROM account_events WHERE user_id = ? ORDER BY id", (uid,))]


def check_ledger(d):
    rc, out = ledger_verify(d.db_path)
    assert rc == 0, out


def login_status(d, addr, password):
    return d.login(addr, password).status_code


# ---------------------------------------------------------------- the whole flow

def test_reset_sets_the_password_ends_sessions_and_verifies_the_address(new_daemon, sink):
    d = new_daemon(options=mail_options(sink))
    typed = "Grace.Hopper+cloud@Example.test"
    body = signup(d, typed)
    uid, signup_key = body["user"]["id"], body["api_key"]["token"]
    # Two browser sessions and a key for scripts.
    sessions = [d.login(typed, DEFAULT_PASSWORD, key_name=f"browser {i}").json()["api_key"]["token"] for i in (1, 2)]
    script_key = d.create_key(signup_key, name="ci")["token"]
    assert d.get("/v1/me", key=sessions[0]).json()["email_verified"] is False

    # Asked for in another spelling of the same mailbox.
    ask(d, "GRACE.HOPPER+other@example.TEST")
    rcpt, sender, msg = [m for m in sink.mail_to(typed, 2) if m[2]["Subject"] == "Reset your gpurent password"][0]
    assert rcpt == [typed] and sender == "noreply@gpurent.test"
    text = msg.get_content()
    code = RESET_CODE.search(text).group(1)
    assert "https://api.gpurent.test/v1/password-reset/confirm" in text and "30 minutes" in text
    # Only the code's hash is kept, and the outbox forgets the text once sent.
    assert d.sql("SELECT code_hash, failures, requested_from FROM password_resets WHERE user_id = ?", (uid,)) == [
        (hashlib.sha256(code.encode()).hexdigest(), 0, "127.0.0.1")]
    assert d.sql("SELECT count(*) FROM password_resets WHERE code_hash = ?", (code,)) == [(0,)]
    poll(lambda: d.sql("SELECT count(*) FROM outbox WHERE user_id = ? AND body LIKE '%prc_%'", (uid,)) == [(0,)],
         10, "the reset mail blanked once sent")
    # Asking changes nothing yet: the old password still logs in.
    r = d.login(typed, DEFAULT_PASSWORD)
    assert r.status_code == 200, r.text
    sessions.append(r.json()["api_key"]["token"])

    r = confirm(d, typed, code)
    assert r.status_code == 200, r.text
    done = r.json()
    # Three login keys ended; the sign-up key and the script key kept.
    assert done == {"changed": True, "login_keys_revoked": 3, "api_keys_kept": 2, "email_verified": True,
                    "credit": {"grant_id": done["credit"]["grant_id"], "source": "signup", "amount": "10.00",
                               "currency": "CNY"}}
    for k in sessions:
        assert_error(d.get("/v1/me", key=k), 401, "unauthorized")
    for k in (signup_key, script_key):
        me = d.get("/v1/me", key=k)
        assert me.status_code == 200 and me.json()["email_verified"] is True, me.text
    assert d.sql("SELECT source, amount FROM credit_grants WHERE user_id = ?", (uid,)) == [("signup", 10_000_000)]
    # The old password is refused, the new one logs in.
    assert_error(d.login(typed, DEFAULT_PASSWORD), 401, "invalid_credentials")
    assert login_status(d, typed, NEW_PASSWORD) == 200
    # The code is used up: a replay is refused like any wrong code, and
    # changes nothing.
    assert d.sql("SELECT count(*) FROM password_resets WHERE user_id = ?", (uid,)) == [(0,)]
    before = d.dump()
    refused(d, typed, code, "yet another passphrase")
    assert d.dump() == before
    assert login_status(d, typed, NEW_PASSWORD) == 200
    # The verification code mailed at sign-up has nothing left to do.
    verify = VERIFICATION_CODE.search(sink.mail_to(typed)[0][2].get_content()).group(1)
    assert d.post("/v1/verify-email", json={"token": verify}).json()["credit"] is None
    assert d.sql("SELECT count(*) FROM credit_grants WHERE user_id = ?", (uid,)) == [(1,)]

    # The account's record: asked for, then done (and a change made with
    # the current password is recorded too).
    key = d.login(typed, NEW_PASSWORD).json()["api_key"]["token"]
    r = d.post("/v1/me/password", key=key, json={"current_password": NEW_PASSWORD, "new_password": DEFAULT_PASSWORD})
    assert r.status_code == 200, r.text
    got = events(d, uid)
    assert [e for e, _ in got] == ["password_reset_requested", "password_reset", "password_change"]
    assert got[1][1] == {"login_keys_revoked": 3, "api_keys_kept": 2, "email_verified_now": True}
    assert got[2][1]["api_key_id"] == d.get("/v1/me", key=key).json()["api_key_id"]
    assert d.sql("SELECT DISTINCT client_address FROM account_events WHERE user_id = ?", (uid,)) == [("127.0.0.1",)]
    p = run_gpurentd("report", "account-events", "--db", d.db_path, "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = [r for r in json.loads(p.stdout) if r["user_id"] == uid]
    assert [(r["event"], r["email"]) for r in rows] == [("password_reset_requested", typed.lower()),
                                                       ("password_reset", typed.lower()),
                                                       ("password_change", typed.lower())]
    check_ledger(d)


def test_a_verified_account_keeps_its_trial_and_a_newer_code_replaces_the_older(new_daemon, sink):
    d = new_daemon(options=mail_options(sink))
    acct = d.signup(verify=False)
    d.post("/v1/verify-email", json={"token": VERIFICATION_CODE.search(sink.mail_to(acct.email)[0][2].get_content())
                                     .group(1)})
    grants = d.sql("SELECT id FROM credit_grants WHERE user_id = ?", (acct.id,))
    assert len(grants) == 1
    ask(d, acct.email)
    ask(d, acct.email)
    first, second = reset_codes(sink, acct.email, 2)
    assert first != second
    refused(d, acct.email, first)
    r = confirm(d, acct.email, second)
    assert r.status_code == 200, r.text
    assert r.json()["credit"] is None and r.json()["login_keys_revoked"] == 0
    assert d.sql("SELECT id FROM credit_grants WHERE user_id = ?", (acct.id,)) == grants
    assert events(d, acct.id)[-1][1]["email_verified_now"] is False
    check_ledger(d)


def test_the_mailed_command_works_for_an_address_with_a_quote(new_daemon, sink):
    """An address may hold a ' (o'brien@...): the curl line in the mail,
    pasted into a shell, must still send the address and the code."""
    d = new_daemon(options=mail_options(sink))
    typed = "o'brien@example.test"
    signup(d, typed)
    ask(d, typed)
    text = [m for m in sink.mail_to(typed, 2) if m[2]["Subject"] == "Reset your gpurent password"][0][2].get_content()
    code = RESET_CODE.search(text).group(1)
    line = text[text.index("curl -X POST"):].split("\n\n")[0].replace("\\\n", " ")
    argv = shlex.split(line)
    sent = json.loads(argv[argv.index("-d") + 1])
    assert sent["email"] == typed and sent["code"] == code
    sent["new_password"] = NEW_PASSWORD
    r = d.post("/v1/password-reset/confirm", json=sent)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- what the request tells

def test_unknown_and_suspended_addresses_get_the_same_answer_and_no_mail(new_daemon, sink):
    d = new_daemon(options=mail_options(sink))
    known = d.signup(verify=False)
    suspended = d.signup(verify=False)
    r = d.post(f"/v1/admin/users/{suspended.id}/suspend", key=d.admin_key, json={"reason": "a test"})
    assert r.status_code == 200, r.text
    ghost = unique_email("nobody")

    answers = {}
    for addr in (known.email, ghost, suspended.email):
        before = d.sql("SELECT count(*) FROM outbox")[0][0]
        r = ask(d, addr)
        answers[addr] = (r.status_code, r.content, tuple(sorted(k for k in r.headers if k not in ("Date", "X-Request-Id"))))
        if addr != known.email:
            # Nothing written: no code, no mail, no event.
            assert d.sql("SELECT count(*) FROM outbox")[0][0] == before
    assert len(set(answers.values())) == 1, answers
    reset_codes(sink, known.email, 1)
    assert d.sql("SELECT count(*) FROM password_resets") == [(1,)]
    assert d.sql("SELECT count(*) FROM account_events WHERE user_id != ?", (known.id,)) == [(0,)]
    assert sink.count(ghost) == 0 and sink.count(suspended.email) == 1  # its sign-up mail only

    # The confirm says no more: an unknown address, an account without a
    # code and a wrong code all get the one answer, and change nothing
    # but the wrong try's count.
    before = d.dump()
    messages = {refused(d, ghost, "prc_aaaaaaaaaaaaaaaaaaaa")["message"],
                refused(d, suspended.email, "prc_aaaaaaaaaaaaaaaaaaaa")["message"]}
    assert d.dump() == before
    messages.add(refused(d, known.email, "prc_aaaaaaaaaaaaaaaaaaaa")["message"])
    assert len(messages) == 1, messages
    assert d.sql("SELECT failures FROM password_resets WHERE user_id = ?", (known.id,)) == [(1,)]


def test_a_suspended_account_gets_no_new_password_with_a_code_it_had(new_daemon, sink):
    d = new_daemon(options=mail_options(sink))
    acct = d.signup(verify=False)
    ask(d, acct.email)
    code = reset_codes(sink, acct.email, 1)[0]
    assert d.post(f"/v1/admin/users/{acct.id}/suspend", key=d.admin_key, json={"reason": "a test"}).status_code == 200
    refused(d, acct.email, code)
    assert d.post(f"/v1/admin/users/{acct.id}/reinstate", key=d.admin_key, json={"reason": "a test"}).status_code == 200
    assert login_status(d, acct.email, DEFAULT_PASSWORD) == 200
    assert confirm(d, acct.email, code).status_code == 200
    assert login_status(d, acct.email, NEW_PASSWORD) == 200


def test_without_smtp_url_the_code_is_never_logged(new_daemon):
    # A verification code is logged for make run; a reset code would let
    # whoever reads the log into the account.
    d = new_daemon()
    acct = d.signup(verify=False)
    ask(d, acct.email)
    d.wait_for_log(rf'E-MAIL NOT SENT \(no smtp_url\): to {re.escape(acct.email)}, subject "Reset your gpurent password"')
    poll(lambda: d.sql("SELECT count(*) FROM outbox WHERE body LIKE '%prc_%'") == [(0,)], 10,
         "the reset mail marked sent and blanked")
    assert "prc_" not in d.stdout_text() + d.stderr_text()


# ---------------------------------------------------------------- expiry and wrong tries

def test_a_code_expires_on_the_daemons_clock(new_daemon, sink):
    d = new_daemon(options=mail_options(sink, password_reset_ttl_s="600"))
    acct = d.signup(verify=False)
    ask(d, acct.email, ttl=600)
    code = reset_codes(sink, acct.email, 1)[0]
    assert "10 minutes" in sink.mail_to(acct.email, 2)[-1][2].get_content()
    d.advance_clock(599)
    assert d.sql("SELECT count(*) FROM password_resets WHERE user_id = ?", (acct.id,)) == [(1,)]
    d.advance_clock(1)
    refused(d, acct.email, code)
    # Gone for good, the password as it was.
    assert d.sql("SELECT count(*) FROM password_resets WHERE user_id = ?", (acct.id,)) == [(0,)]
    assert login_status(d, acct.email, DEFAULT_PASSWORD) == 200
    assert login_status(d, acct.email, NEW_PASSWORD) == 401
    # A new request works again.
    ask(d, acct.email, ttl=600)
    assert confirm(d, acct.email, reset_codes(sink, acct.email, 2)[1]).status_code == 200


def test_wrong_tries_are_counted_until_the_code_is_dead(new_daemon, sink):
    d = new_daemon(options=mail_options(sink, password_reset_max_tries="3"))
    acct = d.signup(verify=False)
    ask(d, acct.email)
    code = reset_codes(sink, acct.email, 1)[0]
    # A wrong code one character off: counted.
    wrong = code[:-1] + ("a" if code[-1] != "a" else "b")
    refused(d, acct.email, wrong)
    refused(d, acct.email, "prc_" + "z" * 20)
    assert d.sql("SELECT failures FROM password_resets WHERE user_id = ?", (acct.id,)) == [(2,)]
    # Under the bound, the right code still works...
    assert confirm(d, acct.email, code).status_code == 200
    # ...and a new one that meets its third wrong try is dead, right code
    # or not.
    ask(d, acct.email)
    code = reset_codes(sink, acct.email, 2)[1]
    for _ in range(3):
        refused(d, acct.email, wrong)
    assert d.sql("SELECT count(*) FROM password_resets WHERE user_id = ?", (acct.id,)) == [(0,)]
    refused(d, acct.email, code, "a third passphrase")
    assert login_status(d, acct.email, NEW_PASSWORD) == 200


def test_wrong_codes_count_as_failed_logins_from_the_client(new_daemon, sink):
    # login_max_failures 1: four wrong tries from one client address, then
    # 429 for login_lockout_s, whichever account they named.
    d = new_daemon(options=mail_options(sink, login_max_failures="1", login_lockout_s="120"))
    addrs = [unique_email("guess") for _ in range(4)]
    for a in addrs:
        refused(d, a, "prc_aaaaaaaaaaaaaaaaaaaa")
    e = assert_error(confirm(d, addrs[0], "prc_aaaaaaaaaaaaaaaaaaaa"), 429, "too_many_requests")
    assert "wrong codes" in e["message"]
    # Another client is not locked out.
    status, headers, body = post_from(d, "127.0.0.2", "/v1/password-reset/confirm",
                                      {"email": addrs[0], "code": "prc_aaaaaaaaaaaaaaaaaaaa",
                                       "new_password": NEW_PASSWORD})
    assert status == 400 and body["error"]["code"] == "invalid_reset_code", body
    d.advance_clock(121)
    refused(d, addrs[0], "prc_aaaaaaaaaaaaaaaaaaaa")


def test_a_reset_ends_the_accounts_login_lockout(new_daemon, sink):
    d = new_daemon(options=mail_options(sink, login_max_failures="2"))
    acct = d.signup(verify=False)
    for _ in range(2):
        assert_error(d.login(acct.email, "not the password at all"), 401, "invalid_credentials")
    assert_error(d.login(acct.email, DEFAULT_PASSWORD), 429, "too_many_requests")
    ask(d, acct.email)
    assert confirm(d, acct.email, reset_codes(sink, acct.email, 1)[0]).status_code == 200
    assert login_status(d, acct.email, NEW_PASSWORD) == 200


# ---------------------------------------------------------------- rate limits

def test_requests_are_limited_per_address_and_per_client(new_daemon, sink):
    d = new_daemon(options=mail_options(sink, password_reset_rate_per_email="2",
                                        password_reset_rate_per_address="3"))
    known = d.signup(verify=False)
    ghost = unique_email("ghost")

    def attempt(source, addr):
        return post_from(d, source, "/v1/password-reset", {"email": addr})

    # Per e-mail address, counted alike for an account's and for nobody's,
    # and for every spelling of the mailbox.
    for addr in (known.email, ghost):
        assert attempt("127.0.0.2", addr)[0] == 202
        assert attempt("127.0.0.3", addr.upper())[0] == 202
        status, headers, body = attempt("127.0.0.4", addr)
        assert status == 429 and body["error"]["code"] == "too_many_requests", body
        assert 3500 <= int(headers["Retry-After"]) <= 3600 and "e-mail address" in body["error"]["message"]
    assert len(reset_codes(sink, known.email, 2)) == 2
    # Per client address.
    for i in range(3):
        assert attempt("127.0.0.5", unique_email("spray"))[0] == 202
    status, headers, body = attempt("127.0.0.5", unique_email("spray"))
    assert status == 429 and "client address" in body["error"]["message"], body
    assert 3500 <= int(headers["Retry-After"]) <= 3600
    # A refused request sends nothing.
    assert sink.count(known.email) == 3  # the sign-up's mail and two codes
    # An hour on the daemon's clock later, both may ask again.
    d.advance_clock(3601)
    assert attempt("127.0.0.5", known.email)[0] == 202
    assert len(reset_codes(sink, known.email, 3)) == 3


# ---------------------------------------------------------------- bad input

BAD_REQUESTS = [
    ("no body", None, 400, "missing_field", "email"),
    ("not an object", [], 400, "not_an_object", None),
    ("missing email", {}, 400, "missing_field", "email"),
    ("unknown field", {"email": "a@b.test", "captcha": 1}, 400, "unknown_field", "captcha"),
    ("number", {"email": 7}, 400, "invalid_field", "email"),
    ("null", {"email": None}, 400, "missing_field", "email"),
    ("not an address", {"email": "nobody"}, 400, "invalid_field", "email"),
    ("two @", {"email": "a@b@c.test"}, 400, "invalid_field", "email"),
    ("too long", {"email": "a" * 250 + "@b.test"}, 400, "invalid_field", "email"),
]


def confirm_body(**change):
    body = {"email": "owner@example.test", "code": "prc_aaaaaaaaaaaaaaaaaaaa", "new_password": NEW_PASSWORD}
    body.update(change)
    return {k: v for k, v in body.items() if v is not ...}


BAD_CONFIRMS = [
    ("not an object", "[1]", 400, "not_an_object", None),
    ("malformed", '{"email": ', 400, "malformed_json", None),
    ("duplicate", '{"email": "a@b.test", "email": "c@d.test", "code": "x", "new_password": "0123456789"}', 400,
     "duplicate_key", "email"),
    ("missing code", confirm_body(code=...), 400, "missing_field", "code"),
    ("missing email", confirm_body(email=...), 400, "missing_field", "email"),
    ("missing password", confirm_body(new_password=...), 400, "missing_field", "new_password"),
    ("unknown field", confirm_body(password="x"), 400, "unknown_field", "password"),
    ("code a number", confirm_body(code=12345), 400, "invalid_field", "code"),
    ("code too long", confirm_body(code="prc_" + "a" * 61), 400, "invalid_field", "code"),
    ("code malformed", confirm_body(code="prc_AAAAAAAAAAAAAAAAAAAA"), 400, "invalid_reset_code", "code"),
    ("code another kind", confirm_body(code="evc_aaaaaaaaaaaaaaaaaaaa"), 400, "invalid_reset_code", "code"),
    ("code empty", confirm_body(code=""), 400, "invalid_reset_code", "code"),
    ("password short", confirm_body(new_password="short"), 400, "invalid_field", "new_password"),
    ("password long", confirm_body(new_password="p" * 257), 400, "invalid_field", "new_password"),
    ("password bool", confirm_body(new_password=True), 400, "invalid_field", "new_password"),
    ("email bad", confirm_body(email="owner.example.test"), 400, "invalid_field", "email"),
    ("email list", confirm_body(email=["owner@example.test"]), 400, "invalid_field", "email"),
]


def send(d, path, body):
    if body is None:
        return d.request("POST", path)
    if isinstance(body, str):
        return d.request("POST", path, data=body)
    return d.post(path, json=body)


def test_bad_input_is_refused_naming_the_field_and_changes_nothing(new_daemon, sink):
    d = new_daemon(options=mail_options(sink))
    acct = d.signup(email="owner@example.test", verify=False)
    ask(d, acct.email)
    code = reset_codes(sink, acct.email, 1)[0]
    before = d.dump()
    for path, cases in (("/v1/password-reset", BAD_REQUESTS), ("/v1/password-reset/confirm", BAD_CONFIRMS)):
        for label, body, status, err, field in cases:
            try:
                assert_error(send(d, path, body), status, err, field)
            except AssertionError as e:
                raise AssertionError(f"{path}, {label}: {e}") from None
    # Not JSON, too large, a query.
    assert_error(d.request("POST", "/v1/password-reset", data="email=owner@example.test",
                           headers={"Content-Type": "application/x-www-form-urlencoded"}), 415,
                 "unsupported_media_type", "Content-Type")
    assert_error(d.post("/v1/password-reset/confirm", data=json.dumps(confirm_body(code="x" * 2_000_000))), 413,
                 "body_too_large")
    assert_error(d.post("/v1/password-reset?force=1", json={"email": acct.email}), 400, "invalid_query", "force")
    assert_error(d.request("GET", "/v1/password-reset"), 405, "method_not_allowed")
    # Nothing changed, the wrong tries included (none of them reached the
    # code), and the code still works.
    assert d.dump() == before
    assert confirm(d, acct.email, code).status_code == 200
