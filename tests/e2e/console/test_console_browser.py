"""The web console in a real browser (issue 14): headless Chromium (Debian's
chromium) driven by playwright-core (package.json) through browser.mjs,
against a real gpurentd with a sim fleet. Each test builds its world here
(accounts, nodes, instances), runs one scenario of browser.mjs and answers
what the scenario asks for: the verification code from a real SMTP sink,
the testing clock moved, a billing pass. Without Chromium, node or
playwright-core the tests are skipped, saying which is missing."""
import json
import os
import shutil
import subprocess
import sys
import time
import warnings

import pytest
import requests

from agent_util import poll
from harness import REPO, DEFAULT_PASSWORD, unique_email
from instances_util import FAST_CLOUD, Cloud
from mail_util import reset_codes, verification_code
from money_util import iso, ledger_verify

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "reservations"))
sys.path.insert(0, os.path.join(HERE, "..", "apps"))

from apps_util import Market, free_port  # noqa: E402
from resv_util import CUDA_IMAGE, ResvCloud  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
PLAYWRIGHT = os.path.join(REPO, "node_modules", "playwright-core")
XTERM = os.path.join(REPO, "console", "vendor", "xterm", "xterm.mjs")


def missing():
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is not installed (apt-get install chromium; scripts/deps.sh test installs it)"
    if not shutil.which("node"):
        return "node is not installed (apt-get install nodejs npm)"
    if not os.path.isdir(PLAYWRIGHT):
        return "node_modules/playwright-core is missing (scripts/deps.sh test runs npm ci)"
    if not os.path.isfile(XTERM):
        return "console/vendor/xterm is missing: run make (it copies xterm.js from node_modules)"
    return None


pytestmark = pytest.mark.skipif(missing() is not None, reason=f"browser tests skipped: {missing()}")


def as_user(d, acct, **more):
    """The world of a scenario that logs in as acct on daemon d."""
    return {"base_url": d.base_url, "email": acct.email, "password": acct.password, **more}


def run_scenario(name, world, tmp_path, answer=None, timeout=240):
    """Runs browser.mjs NAME; answers its ASK lines with answer(dict) ->
    dict. Fails with the scenario's output unless it printed PASS."""
    env = dict(os.environ, CONSOLE_WORLD=json.dumps(world), CHROMIUM=CHROMIUM,
               CONSOLE_FAIL_PNG=str(tmp_path / f"{name}-failure.png"))
    p = subprocess.Popen(["node", os.path.join(HERE, "browser.mjs"), name], cwd=REPO, env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = []
    try:
        for line in p.stdout:
            out.append(line)
            if line.startswith("ASK "):
                reply = answer(json.loads(line[4:])) if answer else None
                assert reply is not None, f"scenario {name} asked {line!r} and the test has no answer"
                p.stdin.write(json.dumps(reply) + "\n")
                p.stdin.flush()
            elif line.startswith("NOTE SKIP"):
                warnings.warn(line[5:].strip())
        rc = p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = p.stderr.read()
    assert rc == 0 and "PASS\n" in out, f"scenario {name} failed (rc {rc}):\n{''.join(out)}\n{err}"
    return "".join(out)



_clouds = []  # made by cloud_for in the running test; their fleets stop after it


@pytest.fixture(autouse=True)
def close_clouds():
    yield
    while _clouds:
        _clouds.pop().close()


def cloud_for(new_daemon, tmp_path, **options):
    c = Cloud(new_daemon, tmp_path, options={**FAST_CLOUD, "billing_interval_ms": "3600000", **options})
    _clouds.append(c)
    return c


def check_ledger(d):
    rc, out = ledger_verify(d.db_path)
    assert rc == 0, out


def test_new_user_signs_up_launches_watches_stops_and_pays(new_daemon, tmp_path, sink):
    c = cloud_for(new_daemon, tmp_path, smtp_url=f"smtp://127.0.0.1:{sink.port}", smtp_tls="none",
                  smtp_from="noreply@gpurent.test", public_url="http://console.test/")
    c.fleet(1)
    world = {"base_url": c.d.base_url, "email": unique_email("browser"), "password": DEFAULT_PASSWORD}

    def answer(q):
        if "mail_code" in q:
            return {"code": verification_code(sink, q["mail_code"])}
        if "advance_clock" in q:
            c.d.advance_clock(q["advance_clock"])
            return {"ok": True}
        if "billing" in q:
            r = c.admin("POST", "/v1/admin/billing/run", json={})
            assert r.status_code == 200, r.text
            return r.json()
        return None

    run_scenario("journey", world, tmp_path, answer)
    # What the browser showed is what the ledger holds.
    [(amount,)] = c.d.sql("SELECT sum(p.amount) FROM ledger_transactions t JOIN ledger_postings p"
                          " ON p.transaction_id = t.id JOIN ledger_accounts a ON a.id = p.account_id"
                          " WHERE t.kind = 'usage' AND a.kind IN ('cash', 'grant')")
    assert amount == -4_800_000
    check_ledger(c.d)


def test_forgotten_password_is_reset_with_a_mailed_code(new_daemon, tmp_path, sink):
    d = new_daemon(options={"smtp_url": f"smtp://127.0.0.1:{sink.port}", "smtp_tls": "none"})
    email = unique_email("forgetful")
    d.cli_create_user(email, password=DEFAULT_PASSWORD)  # its key for scripts is kept
    session = d.login(email, DEFAULT_PASSWORD).json()["api_key"]["token"]

    def answer(q):
        if "reset_code" in q:
            return {"code": reset_codes(sink, q["reset_code"], q["n"])[q["n"] - 1]}
        return None

    new_password = "a brand new passphrase"
    run_scenario("reset", {"base_url": d.base_url, "email": email, "password": DEFAULT_PASSWORD,
                           "new_password": new_password}, tmp_path, answer)
    assert d.get("/v1/me", key=session).status_code == 401
    assert d.login(email, DEFAULT_PASSWORD).status_code == 401
    assert d.login(email, new_password).status_code == 200
    assert [e for (e,) in d.sql("SELECT event FROM account_events ORDER BY id")] == [
        "password_reset_requested", "password_reset_requested", "password_reset"]


def test_too_little_credit_is_said_in_chinese_and_english(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    email = unique_email("poor")
    c.d.cli_create_user(email, password=DEFAULT_PASSWORD)  # verified, no trial credit
    run_scenario("poor", {"base_url": c.d.base_url, "email": email, "password": DEFAULT_PASSWORD}, tmp_path)
    assert c.d.sql("SELECT count(*) FROM instances") == [(0,)]
    check_ledger(c.d)


def test_admin_drains_a_node_and_sees_its_state_change(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    f = c.fleet(2)
    node = sorted(f.nodes)[0]
    email = unique_email("root")
    c.d.cli_create_user(email, admin=True, password=DEFAULT_PASSWORD)
    run_scenario("drain", {"base_url": c.d.base_url, "email": email, "password": DEFAULT_PASSWORD, "node": node},
                 tmp_path)
    assert c.d.sql("SELECT admin_state FROM nodes WHERE name = ?", (node,)) == [("draining",)]


def test_cancelling_the_drain_reason_leaves_the_node_alone(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    f = c.fleet(1)
    node = sorted(f.nodes)[0]
    email = unique_email("root")
    c.d.cli_create_user(email, admin=True, password=DEFAULT_PASSWORD)
    run_scenario("drain_cancelled", {"base_url": c.d.base_url, "email": email, "password": DEFAULT_PASSWORD,
                                     "node": node}, tmp_path)
    assert c.d.sql("SELECT admin_state FROM nodes WHERE name = ?", (node,)) == [("draining",)]


def test_a_node_change_in_flight_keeps_its_button_disabled(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    f = c.fleet(1)
    node = sorted(f.nodes)[0]
    email = unique_email("root")
    c.d.cli_create_user(email, admin=True, password=DEFAULT_PASSWORD)
    run_scenario("node_change_in_flight", {"base_url": c.d.base_url, "email": email, "password": DEFAULT_PASSWORD,
                                           "node": node}, tmp_path)
    assert c.d.sql("SELECT admin_state FROM nodes WHERE name = ?", (node,)) == [("draining",)]


def test_admin_suspends_and_reinstates_an_account(new_daemon, tmp_path):
    d = new_daemon()
    email = unique_email("root")
    d.cli_create_user(email, admin=True, password=DEFAULT_PASSWORD)
    target = d.signup()
    run_scenario("suspend", {"base_url": d.base_url, "email": email, "password": DEFAULT_PASSWORD,
                             "target_email": target.email}, tmp_path)
    assert d.get("/v1/me", key=target.key).status_code == 200  # reinstated; its key works again
    reasons = [a["reason"] for a in d.get("/v1/admin/audit", key=d.admin_key).json()["data"]]
    assert "console abuse" in reasons and "console appeal" in reasons, reasons


def test_admin_top_up_appears_in_the_audit_trail(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    email = unique_email("root")
    c.d.cli_create_user(email, admin=True, password=DEFAULT_PASSWORD)
    target = c.d.signup()
    run_scenario("topup", {"base_url": c.d.base_url, "email": email, "password": DEFAULT_PASSWORD,
                           "target_email": target.email, "target_id": target.id}, tmp_path)
    b = c.d.get("/v1/balance", key=target.key).json()
    assert b["cash"] == "50.00", b
    check_ledger(c.d)


def test_another_users_instance_in_the_address_is_not_found(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()
    secret_image = "rocm/pytorch:2.3-rocm6.2"
    inst = c.create(owner, card_count=8, name="owners-secret-run")
    email = unique_email("nosy")
    c.d.cli_create_user(email, password=DEFAULT_PASSWORD)
    run_scenario("foreign", {"base_url": c.d.base_url, "email": email, "password": DEFAULT_PASSWORD,
                             "instance_id": inst["id"], "secret_image": secret_image}, tmp_path)


def test_a_crafted_route_in_a_link_reaches_no_other_api_path(new_daemon, tmp_path):
    d = new_daemon()
    email = unique_email("link")
    d.cli_create_user(email, password=DEFAULT_PASSWORD)
    run_scenario("crafted_route", {"base_url": d.base_url, "email": email, "password": DEFAULT_PASSWORD}, tmp_path)
    # Nothing was revoked: the user's keys are as they were.
    [(revoked,)] = d.sql("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL")
    assert revoked == 0


def test_an_instance_still_provisioning_shows_when_its_logs_come(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1, sim={"sim_pull_ms": "600000"})  # the image pull outlasts the test
    owner = c.user()
    inst = c.create(owner, card_count=1)
    poll(lambda: c.get(owner, inst["id"])["state"] == "provisioning", 60, "the instance to be provisioning")
    run_scenario("provisioning", as_user(c.d, owner, instance_id=inst["id"]), tmp_path)


def test_terminal_page_speaks_the_terminal_contract(new_daemon, tmp_path):
    # The server's side of the WebSocket is played inside the browser
    # (browser.mjs routes it); the journey above runs the real one once the
    # daemon serves /v1/instances/{id}/terminal-tokens.
    d = new_daemon()
    email = unique_email("term")
    d.cli_create_user(email, password=DEFAULT_PASSWORD)
    run_scenario("terminal", {"base_url": d.base_url, "email": email, "password": DEFAULT_PASSWORD}, tmp_path)


def test_user_books_a_reserved_block_sees_the_charge_then_cancels_for_a_refund(new_daemon, tmp_path):
    rc = ResvCloud(cloud_for(new_daemon, tmp_path))
    rc.price("H100-SXM", "2.00")
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1")
    booker = rc.c.user(funds="100.00")
    start = rc.hour(72)  # well before the 48-hour notice: a full refund
    run_scenario("reserve", as_user(rc.d, booker, start=iso(start)), tmp_path)
    [(state, amount, refunded)] = rc.d.sql("SELECT state, amount, refunded FROM reservations")
    assert (amount, refunded) == (48_000_000, 48_000_000), (state, amount, refunded)
    assert state == "cancelled"
    # The kind's whole name reaches the API (it was cut to 15 characters).
    kinds = [x["kind"] for x in rc.d.get("/v1/transactions", key=booker.key).json()["data"]]
    assert "reservation" in kinds and "reservation_refund" in kinds, kinds
    rc.verify()


def test_user_launches_into_an_active_reservation(new_daemon, tmp_path):
    rc = ResvCloud(cloud_for(new_daemon, tmp_path))
    rc.price("H100-SXM", "2.00")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    booker = rc.c.user(funds="100.00")
    start = rc.hour(1)
    r = rc.book(booker, 8, start, 3)
    rc.d.set_clock(start + 60)
    run_scenario("launch_reserved", as_user(rc.d, booker, reservation_id=r["id"], image=CUDA_IMAGE), tmp_path)
    [inst] = rc.d.get("/v1/instances", key=booker.key).json()["data"]
    assert inst["reservation_id"] == r["id"] and inst["gpu_type"] == "H100-SXM", inst
    rc.verify()


@pytest.mark.parametrize("gateway", [None, "https://gw.example.test"])
def test_publisher_publishes_an_app_and_it_is_in_the_public_list(new_daemon, tmp_path, gateway):
    options = {"billing_interval_ms": "3600000"}
    if gateway:
        options["gateway_public_url"] = gateway
    m = Market(new_daemon, tmp_path, options=options)
    try:
        m.fleet(1)
        email = unique_email("publisher")
        m.d.cli_create_user(email, password=DEFAULT_PASSWORD)
        port = free_port()
        slug = "console-echo"
        run_scenario("publish", {"base_url": m.d.base_url, "email": email, "password": DEFAULT_PASSWORD,
                                 "slug": slug, "port": port, "command": " ".join(m.model_command(port)),
                                 "gateway": gateway}, tmp_path)
        listed = m.d.get("/v1/apps").json()["data"]
        assert [a["slug"] for a in listed] == [slug], listed
        assert listed[0]["prices"]["per_request"].startswith("0.01"), listed
    finally:
        m.close()


def test_another_users_reservation_in_the_address_is_not_found(new_daemon, tmp_path):
    rc = ResvCloud(cloud_for(new_daemon, tmp_path))
    rc.price("H100-SXM", "2.00")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    owner = rc.c.user()
    r = rc.book(owner, 8, rc.hour(10), 3)
    email = unique_email("nosy")
    rc.d.cli_create_user(email, password=DEFAULT_PASSWORD)
    run_scenario("foreign_reservation", {"base_url": rc.d.base_url, "email": email, "password": DEFAULT_PASSWORD,
                                         "reservation_id": r["id"]}, tmp_path)
    assert rc.d.get(f"/v1/reservations/{r['id']}", key=owner.key).json()["state"] == "upcoming"
    rc.verify()


def running_instance(c, owner, command="echo quiet-now; sleep 3600", **body):
    inst = c.create(owner, card_count=1, command=["sh", "-c", command], **body)
    poll(lambda: c.get(owner, inst["id"])["state"] == "running", 60, "the instance to run")
    return inst


def test_leaving_an_instance_page_ends_its_log_stream(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()
    inst = running_instance(c, owner)
    run_scenario("follow_leave", as_user(c.d, owner, instance_id=inst["id"]), tmp_path)


def test_polled_pages_keep_keyboard_focus_and_announce_the_state(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()
    inst = running_instance(c, owner)
    run_scenario("poll_focus", as_user(c.d, owner, instance_id=inst["id"]), tmp_path)
    assert c.get(owner, inst["id"])["state"] == "stopped"


def test_an_action_in_flight_keeps_its_buttons_disabled_through_polls(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()
    inst = running_instance(c, owner)
    run_scenario("action_in_flight", as_user(c.d, owner, instance_id=inst["id"]), tmp_path)
    assert c.get(owner, inst["id"])["state"] == "stopped"


def test_the_skip_link_stays_on_the_page(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup()
    run_scenario("skip_link", as_user(d, user), tmp_path)


def test_the_phone_menu_is_named_and_says_when_it_closes(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup()
    run_scenario("phone_menu", as_user(d, user), tmp_path)


def test_the_instance_page_rides_out_a_502_and_a_429(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()
    inst = running_instance(c, owner)
    run_scenario("api_trouble", as_user(c.d, owner, instance_id=inst["id"]), tmp_path)


def test_a_revoked_session_ends_once_and_comes_back_to_its_page(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup()
    run_scenario("session_revoked", as_user(d, user, key=user.key), tmp_path)


def test_a_wrong_password_in_an_open_session_is_said_and_ends_nothing(new_daemon, tmp_path):
    d = new_daemon(options={"login_max_failures": "2"})  # the second wrong current password locks them out
    user = d.signup()
    run_scenario("wrong_password", as_user(d, user), tmp_path)
    assert d.get("/v1/me", key=user.key).status_code == 200


def test_the_event_timeline_names_phases_and_warnings(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()
    inst = running_instance(c, owner)
    run_scenario("event_names", as_user(c.d, owner, instance_id=inst["id"]), tmp_path)


def test_the_phone_header_keeps_its_controls_whole(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup(email=unique_email("a-rather-long-address-for-a-phone"))
    run_scenario("phone_header", as_user(d, user), tmp_path)
    # Log out revoked the console's key, and only that one.
    assert d.sql("SELECT name FROM api_keys WHERE revoked_at IS NOT NULL") == [("console",)]
    assert d.get("/v1/me", key=user.key).status_code == 200


def test_every_page_passes_axe(new_daemon, tmp_path):
    """axe-core, the accessibility checker browsers' own tools run, finds
    nothing on any page: logged out, as a renter with an instance, a
    volume, keys, a reservation and an app, and as an admin."""
    m = Market(new_daemon, tmp_path)
    try:
        rc = ResvCloud(m)
        rc.price("H100-SXM", "2.00")
        m.fleet(1, model="H100-SXM", fabric="ib-1")
        m.fleet(1)
        owner = m.user(funds="100.00")
        assert m.d.post("/v1/volumes", key=owner.key, json={"name": "data", "size_gb": 10}).status_code == 201
        r = m.d.post("/v1/ssh-keys", key=owner.key, json={"name": "laptop", "public_key": SSH_KEY})
        assert r.status_code == 201, r.text
        assert m.d.post("/v1/api-keys", key=owner.key, json={"name": "ci"}).status_code == 201
        resv = rc.book(owner, 1, rc.hour(5), 1)
        app = m.publish(owner, slug="axe-app")
        inst = m.create(owner, card_count=1, command=["sh", "-c", "echo hello; sleep 3600"])
        poll(lambda: m.get(owner, inst["id"])["state"] == "running", 60, "the instance to run")
        admin = unique_email("root")
        m.d.cli_create_user(admin, admin=True, password=DEFAULT_PASSWORD)
        run_scenario("axe_every_page", as_user(m.d, owner, instance_id=inst["id"], reservation_id=resv["id"],
                                               slug=app["slug"], admin_email=admin, admin_password=DEFAULT_PASSWORD),
                     tmp_path, timeout=600)
    finally:
        m.close()


def test_every_page_has_a_title_of_its_own(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup()
    run_scenario("page_titles", as_user(d, user), tmp_path)


def test_a_slow_page_says_it_is_loading(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup()
    run_scenario("slow_page", as_user(d, user), tmp_path)


def test_row_buttons_name_their_row(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup()
    for name in ("data-a", "data-b"):
        assert d.post("/v1/volumes", key=user.key, json={"name": name, "size_gb": 10}).status_code == 201
    other = SSH_KEY.replace("IOMqq", "IOMqr")
    for name, key in (("laptop", SSH_KEY), ("desktop", other)):
        r = d.post("/v1/ssh-keys", key=user.key, json={"name": name, "public_key": key})
        assert r.status_code == 201, r.text
    assert d.post("/v1/api-keys", key=user.key, json={"name": "ci"}).status_code == 201
    run_scenario("row_names", as_user(d, user), tmp_path)


def test_the_statement_shows_storage_and_app_calls(new_daemon, tmp_path):
    d = new_daemon(options={"billing_interval_ms": "3600000"})
    r = d.request("PUT", "/v1/admin/storage-prices/rs", key=d.admin_key, json={"price_per_gb_month": "3.00"})
    assert r.status_code == 200, r.text
    user = d.signup()
    r = d.post("/v1/volumes", key=user.key, json={"name": "shared-data", "size_gb": 100, "region": "rs"})
    assert r.status_code == 201, r.text
    d.advance_clock(7200)
    assert d.post("/v1/admin/billing/run", key=d.admin_key, json={}).status_code == 200
    # floor(3.00 x 100 GB x 7200 s / 2 592 000 s) = 0.833333
    storage = [x for x in d.get("/v1/transactions", key=user.key).json()["data"] if x["kind"] == "storage"]
    assert [x["amount"] for x in storage] == ["-0.833333"], storage
    run_scenario("statement_lines", as_user(d, user, volume="shared-data", cost="0.83"), tmp_path)
    check_ledger(d)


def test_a_refused_value_marks_its_input(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup()
    run_scenario("field_error", as_user(d, user), tmp_path)


def test_a_language_that_cannot_load_is_said_not_blank(new_daemon, tmp_path):
    d = new_daemon()
    run_scenario("catalogue_fails", {"base_url": d.base_url}, tmp_path)


def test_the_instance_list_says_when_it_cannot_update(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()
    inst = c.create(owner, card_count=1)
    run_scenario("list_poll_error", as_user(c.d, owner, instance_id=inst["id"]), tmp_path)


def test_an_instance_page_names_itself_and_its_volume_and_renames_it(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()
    r = c.d.post("/v1/volumes", key=owner.key, json={"name": "shared-data", "size_gb": 10})
    assert r.status_code == 201, r.text
    name = "llama3_70b_instruct_finetune_lr3e5_bs256_seed42_final_v2"  # one long word
    inst = running_instance(c, owner, volume_id=r.json()["id"], name=name)

    def answer(q):
        if "rename" in q:
            r = c.d.request("PATCH", f"/v1/instances/{inst['id']}", key=owner.key, json={"name": q["rename"]})
            assert r.status_code == 200, r.text
            return {"ok": True}
        if "terminate" in q:
            c.action(owner, inst["id"], "terminate")
            return {"ok": True}
        return None

    run_scenario("instance_volume", as_user(c.d, owner, instance_id=inst["id"], name=name), tmp_path, answer)
    # The name the page gave stands (the one too long changed nothing), and
    # each rename, the API's and the page's, is one event naming the field.
    assert c.get(owner, inst["id"])["name"] == "llama-70b 微调 v2"
    events = c.d.get(f"/v1/instances/{inst['id']}/events", key=owner.key).json()["data"]
    assert [e["reason"] for e in events].count("changed by the user: name") == 2, events


def test_an_address_verified_in_another_tab_is_verified_on_the_overview(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup(verify=False)

    def answer(q):
        if "verify" in q:
            d.verify_email(q["verify"])
            return {"ok": True}
        return None

    run_scenario("verified_elsewhere", as_user(d, user),
                 tmp_path, answer)


def test_three_quick_enters_launch_one_instance(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    user = c.user()
    run_scenario("enter_thrice", as_user(c.d, user), tmp_path)
    assert len(c.d.get("/v1/instances", key=user.key).json()["data"]) == 1


def test_log_times_are_in_the_consoles_language(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()
    inst = running_instance(c, owner)
    run_scenario("log_times", as_user(c.d, owner, instance_id=inst["id"]), tmp_path)


def test_the_focus_ring_stands_out_on_the_header_and_the_page(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup()
    run_scenario("focus_contrast", as_user(d, user), tmp_path)


def test_boxes_that_scroll_on_a_phone_are_reached_by_keyboard(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    owner = c.user()  # topped up by an admin: a row in the audit trail
    inst = running_instance(c, owner)
    admin = unique_email("root")
    c.d.cli_create_user(admin, admin=True, password=DEFAULT_PASSWORD)
    run_scenario("scroll_regions", as_user(c.d, owner, instance_id=inst["id"], admin_email=admin,
                                           admin_password=DEFAULT_PASSWORD), tmp_path)


def test_a_retry_after_a_lost_answer_does_nothing_twice(new_daemon, tmp_path):
    rc = ResvCloud(cloud_for(new_daemon, tmp_path))
    rc.price("H100-SXM", "2.00")
    rc.c.fleet(1)
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    user = rc.c.user(funds="100.00")
    admin = unique_email("root")
    rc.d.cli_create_user(admin, admin=True, password=DEFAULT_PASSWORD)
    run_scenario("retry_lost_answer", as_user(rc.d, user, admin_email=admin, start=iso(rc.hour(72))), tmp_path)
    assert len(rc.d.get("/v1/instances", key=user.key).json()["data"]) == 1
    assert len(rc.d.get("/v1/reservations", key=user.key).json()["data"]) == 1
    topups = rc.d.get("/v1/transactions", key=user.key, params={"kind": "topup"}).json()["data"]
    assert [x["amount"] for x in topups] == ["100.00", "50.00"], topups
    rc.verify()


def test_saving_an_app_edit_keeps_its_command(new_daemon, tmp_path):
    m = Market(new_daemon, tmp_path)
    try:
        user = m.user()
        line = ["sh", "-c", "python3 -m http.server 8000 --bind 0.0.0.0"]
        argv = ["python3", "-m", "http.server", "8000"]
        for slug, cmd in (("edit-line", line), ("edit-argv", argv)):
            m.publish(user, slug=slug, command=cmd)
        apps = {"edit-line": line[2], "edit-argv": json.dumps(argv, separators=(",", ":"))}
        run_scenario("app_edit", as_user(m.d, user, apps=apps), tmp_path)
        for slug, cmd in (("edit-line", line), ("edit-argv", argv)):
            a = m.d.get(f"/v1/apps/{slug}", key=user.key).json()
            assert a["command"] == cmd and a["prices"]["per_request"].startswith("0.002"), a
        # A page that answers late does not draw over the one opened after it.
        run_scenario("stale_page", as_user(m.d, user, apps={"edit-line": "", "edit-argv": ""}), tmp_path)
    finally:
        m.close()


SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl console@test"


def test_a_plain_http_host_launches_and_copies(new_daemon, tmp_path):
    c = cloud_for(new_daemon, tmp_path)
    c.fleet(1)
    user = c.user()
    r = c.d.post("/v1/ssh-keys", key=user.key, json={"name": "laptop", "public_key": SSH_KEY})
    assert r.status_code == 201, r.text
    run_scenario("plain_http", as_user(c.d, user), tmp_path)
    assert len(c.d.get("/v1/instances", key=user.key).json()["data"]) == 1


def test_more_transactions_than_one_read_are_all_listed_newest_first(new_daemon, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    d = new_daemon()
    user = d.signup()
    n = 2050  # more than the 20 pages of 100 the console's lists stopped at
    admin = requests.Session()

    def grant(i):
        r = d.post(f"/v1/admin/users/{user.id}/grants", key=d.admin_key, session=admin,
                   json={"amount": "0.01", "reason": f"grant-{i:04d}"})
        assert r.status_code in (200, 201), r.text

    others = len(d.get("/v1/transactions", key=user.key).json()["data"])  # the trial credit
    grant(1)
    for first in range(2, n, 50):  # a second of the testing clock per 50
        d.advance_clock(1)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(grant, range(first, min(first + 50, n))))
    d.advance_clock(1)
    grant(n)
    month = time.strftime("%Y-%m", time.gmtime(d.now()))
    run_scenario("many_transactions", as_user(d, user, n=n, others=others, month=month), tmp_path)


def test_no_page_shows_the_word_null(new_daemon, tmp_path):
    m = Market(new_daemon, tmp_path)
    try:
        rc = ResvCloud(m)
        rc.price("H100-SXM", "2.00")
        m.fleet(1, model="H100-SXM", fabric="ib-1")
        user = m.user(funds="100.00")
        r = rc.book(user, 1, rc.hour(5), 1)
        assert m.d.delete(f"/v1/reservations/{r['id']}", key=user.key).status_code == 200
        app = m.publish(user, slug="no-events")
        run_scenario("no_null_text", as_user(m.d, user, reservation_id=r["id"], slug=app["slug"]), tmp_path)
    finally:
        m.close()


def test_a_refused_value_is_explained_and_passwords_want_ten(new_daemon, tmp_path):
    d = new_daemon()
    user = d.signup()
    r = d.post("/v1/volumes", key=user.key, json={"name": "My Data", "size_gb": 10})
    assert r.status_code == 400 and r.json()["error"]["field"] == "name", r.text
    run_scenario("server_message", as_user(d, user, bad_volume_name="My Data",
                                           volume_message=r.json()["error"]["message"]), tmp_path)


def test_exact_money_whole_booking_numbers_and_a_phone_wide_launch(new_daemon, tmp_path):
    horizon = 48  # hours: a window longer is refused, naming its end
    rc = ResvCloud(cloud_for(new_daemon, tmp_path, reservation_horizon_hours=str(horizon)))
    rc.price("H100-SXM", "2.00")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-1")
    user = rc.c.user(funds="100.00")
    r = rc.d.post("/v1/ssh-keys", key=user.key, json={"name": "laptop", "public_key": SSH_KEY})
    assert r.status_code == 201, r.text
    run_scenario("exact_money_fractions_phone", {"base_url": rc.d.base_url, "email": user.email,
                                                  "password": user.password, "horizon": horizon,
                                                  "start": iso(rc.hour(2))}, tmp_path)
    assert rc.d.get("/v1/reservations", key=user.key).json()["data"] == []
