"""test_ops_reports_doc.py: docs/REPORTS.md is true. Its example database
(ada, bob, carol and dan, described on that page) is made through the API
on the testing clock; then every ```sql block on the page is run on it with
Python's sqlite3 module, read-only, and must give exactly the rows of the
output block that follows it, and every `$ gpurentd report …` and
`$ gpurentd ledger verify` example must print what the page shows.

Ids are random, so cells holding one (usr_…, grt_…, ins_…, top_…, key_…)
compare as "<id>". The one query that reads the wall clock (date('now')) runs as of
the day the page names for it.

The example has no refunds, storage, reservations or app calls, so the
page's reconciliation is also checked on a second database that has them
all (full_db): usage across midnight, a refund (a clock stepped back),
top-ups, grants that expire part-spent, a storage volume paid by credit and
then cash, reservations paid by credit, by cash and by both, one cancelled
early (refunded in full, to credit) and one late (half, to cash), and an
app call paid by credit and cash. On both databases every rule of the
page's table "Reconciling with the ledger" is evaluated term by term (each
term a number of `gpurentd ledger verify`'s three lines, a named column sum
of the App-marketplace money query, or `sum(view.column)`) and must hold
exactly, and the page's "totals lines, recomputed" query must give every
number `ledger verify` prints, to the micro.
"""
import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import time

import pytest
import requests

from harness import REPO, run_gpurentd
from money_util import MICRO, iso, start_cluster
from ops_util import parse_table, reconcile, run_report

DOC = os.path.join(REPO, "docs", "REPORTS.md")
ID = re.compile(r"\b(usr|grt|ins|top|key)_[0-9a-z]{20}\b")
TODAY = "2026-12-02"  # the day the example's date('now') query was run: dan signed up that day


def at(text):
    """'2026-11-01T09:00' (UTC) -> epoch seconds."""
    return int(datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.timezone.utc).timestamp())


def fenced_blocks(text):
    """[(info string, body, line number)] of every fenced block."""
    out = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        out.append((m.group(1), "\n".join(body), start + 1))
        i += 1
    return out


def examples():
    """(sql, expected output, line) for each ```sql block; the output is the
    plain ``` block right after it."""
    with open(DOC) as f:
        blocks = fenced_blocks(f.read())
    out = []
    for (info, body, line), nxt in zip(blocks, blocks[1:] + [(None, None, None)]):
        if info == "sql":
            assert nxt[0] == "", f"REPORTS.md:{line}: the sql block is not followed by its output"
            out.append((body, nxt[1], line))
    return out


def column_table(text):
    """sqlite3's `.mode column` output (.headers on): header, dashes, rows;
    cells by the dashes' spans; ids as <id>."""
    lines = text.split("\n")
    assert re.fullmatch(r"-+(  -+)*", lines[1]), f"second line is not the dashes: {lines[1]!r}"
    spans, pos = [], 0
    for run in lines[1].split("  "):
        spans.append((pos, pos + len(run)))
        pos += len(run) + 2

    def cells(line):
        assert len(line) <= spans[-1][1], f"line wider than the table: {line!r}"
        return [ID.sub("<id>", line[a:b].strip()) for a, b in spans]
    return cells(lines[0]), [cells(line) for line in lines[2:]]


def cli_text(v):
    """A value as the sqlite3 shell prints it."""
    if v is None:
        return ""
    return ID.sub("<id>", str(v))


@pytest.fixture(scope="module")
def example_db(tmp_path_factory):
    """The example database of REPORTS.md, made as the page tells it:
    ada (invite code AMD6GW, seeded by migration 0004) ran 8 x MI450 for an hour; bob (10.00 trial
    credit, expiring after 30 days) ran 2 x MI300X for two hours; carol
    (trial credit, a 100.00 top-up and a 50.00 admin grant) ran 16 x MI450
    for six hours across midnight, then 8 x MI300X until her funds ran out;
    a month later bob's remaining credit expired, and dan signed up and got
    a 25.00 grant ("welcome offer") and a 30.00 top-up ("bank transfer").
    The fleet: 32 MI450 and 16 MI300X cards."""
    c = start_cluster(tmp_path_factory.mktemp("reports-doc"), nodes={"MI450": 4, "MI300X": 2},
                      clock=at("2026-11-01T08:00"), options={"signup_credit_days": "30"})
    try:
        d = c.d
        ada = c.signup(email="ada@example.com", invite_code="AMD6GW")
        bob = c.signup(email="bob@example.com")
        carol = c.signup(email="carol@example.com")
        c.topup(carol, 100 * MICRO, "pay-carol-1")
        c.grant(carol, 50 * MICRO)

        d.set_clock(at("2026-11-01T09:00"))
        ia = c.launch(ada, "MI450", 8)
        d.set_clock(at("2026-11-01T10:00"))
        c.stop(ada, ia)
        ib = c.launch(bob, "MI300X", 2)
        d.set_clock(at("2026-11-01T12:00"))
        c.stop(bob, ib)
        c.billing()

        d.set_clock(at("2026-11-01T21:00"))
        ic = c.launch(carol, "MI450", 16)
        d.set_clock(at("2026-11-01T23:00"))
        c.billing()                            # two hours posted on the 1st
        d.set_clock(at("2026-11-02T03:00"))
        c.stop(carol, ic)
        c.billing()                            # four on the 2nd: the rest of her credit, then cash

        d.set_clock(at("2026-11-03T08:00"))
        ic2 = c.launch(carol, "MI300X", 8)     # 44.80 of cash left at 17.60 an hour
        d.set_clock(at("2026-11-03T12:00"))
        c.billing()                            # her funds ran out at 10:32:43
        c.wait_state(carol, ic2, "stopped")

        d.set_clock(at("2026-12-02T12:00"))
        c.billing()                            # bob's (and carol's spent) trial credit expired on the 1st
        dan = c.signup(email="dan@example.com")
        c.grant(dan, 25 * MICRO, expires_at=at("2026-12-20T00:00"), reason="welcome offer")
        c.topup(dan, 30 * MICRO, "pay-dan-1", reason="bank transfer")
        c.wait_idle()
        c.verify()
        yield d.db_path
    finally:
        c.close()


EXAMPLES = examples()


def test_the_page_has_its_examples():
    assert len(EXAMPLES) >= 10, [line for _, _, line in EXAMPLES]


@pytest.mark.parametrize("sql, output, line", EXAMPLES, ids=[f"REPORTS.md:{line}" for _, _, line in EXAMPLES])
def test_sql_example_gives_the_rows_shown(example_db, sql, output, line):
    want_header, want_rows = column_table(output)
    if "date('now'" in sql:
        sql = sql.replace("date('now'", f"date('{TODAY}'")
    con = sqlite3.connect(f"file:{example_db}?mode=ro", uri=True, timeout=10)
    try:
        cur = con.execute(sql)
        header = [col[0] for col in cur.description]
        rows = [[cli_text(v) for v in row] for row in cur.fetchall()]
    finally:
        con.close()
    assert header == want_header, f"REPORTS.md:{line}"
    assert rows == want_rows, f"REPORTS.md:{line}:\n got {rows}\nwant {want_rows}"


def shell_examples():
    """($ command line, output, line) of the `$ gpurentd …` examples."""
    with open(DOC) as f:
        blocks = fenced_blocks(f.read())
    out = []
    for info, body, line in blocks:
        if info == "" and body.startswith("$ gpurentd "):
            first, _, rest = body.partition("\n")
            out.append((first[2:], rest, line))
    return out


SHELL = shell_examples()


@pytest.mark.parametrize("command, output, line", SHELL, ids=[f"REPORTS.md:{line}" for _, _, line in SHELL])
def test_command_example_prints_what_is_shown(example_db, command, output, line):
    args = command.split()[1:]
    assert args[args.index("--db") + 1] == "gpurent.db", command
    args[args.index("--db") + 1] = example_db
    if args[0] == "report":
        got = parse_table(run_report(example_db, args[1], "table", *args[2:]))
        # The page's lines lose the trailing spaces that pad the last column.
        lines = output.split("\n")
        want = parse_table("".join(line.ljust(len(lines[1])) + "\n" for line in lines))
        norm = lambda t: ([ID.sub("<id>", h) for h in t[0]], [[ID.sub("<id>", v) for v in r] for r in t[1]])  # noqa: E731
        assert norm(got) == norm(want), f"REPORTS.md:{line}"
    else:
        p = run_gpurentd(*args)
        assert p.returncode == 0, p.stderr
        assert p.stdout == output + "\n", f"REPORTS.md:{line}"


def test_the_example_reconciles(example_db):
    """The page says the views agree with the ledger to the micro."""
    t = reconcile(example_db)
    assert t["credits_expired"] == 1_200_000 and t["cash_held"] == 30_003_112


# ---------------------------------------------------------------- every kind of money

def verify_numbers(db):
    """{(line, number): micro} of every number on `gpurentd ledger verify`'s
    three totals lines, in the order printed; asserts it passed."""
    p = run_gpurentd("ledger", "verify", "--db", db, timeout=120)
    assert p.returncode == 0, f"ledger verify failed ({p.returncode}):\n{p.stdout}{p.stderr}"
    lines = p.stdout.split("\n")
    assert lines[-2:] == ["ledger OK", ""], p.stdout
    out = {}
    for prefix, names in (("totals", ("revenue", "credits granted", "credits spent", "credits expired",
                                      "credit outstanding", "top-ups", "cash held", "refunds", "credits refunded")),
                          ("storage totals", ("revenue", "credits spent")),
                          ("reservation totals", ("paid", "refunded", "credits spent", "credits refunded"))):
        rx = f"^{prefix}: " + ", ".join(f"{re.escape(n)} (\\d+\\.\\d{{2,6}})" for n in names) + "$"
        (m,) = [m for m in (re.match(rx, line) for line in lines) if m]
        for n, v in zip(names, m.groups()):
            whole, frac = v.split(".")
            out[(prefix, n)] = int(whole) * MICRO + int(frac.ljust(6, "0"))
    return out


def doc_sql(title):
    """The ```sql block that follows the paragraph starting **title** in
    the page's "sqlite3 for analysts"."""
    with open(DOC) as f:
        text = f.read()
    text = text[text.index("## sqlite3 for analysts"):]
    m = re.search(r"^\*\*" + re.escape(title) + r"\*\*.*?^```sql\n(.*?)^```", text, re.S | re.M)
    assert m, f"REPORTS.md has no query **{title}**"
    return m.group(1)


def query(db, sql):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        cur = con.execute(sql)
        return [col[0] for col in cur.description], cur.fetchall()
    finally:
        con.close()


def reconciliation_rules():
    """[(line, [[side, …] cells])]: the rows of the page's table under
    "## Reconciling with the ledger", each cell split at ' = '."""
    with open(DOC) as f:
        text = f.read()
    section = text[text.index("## Reconciling with the ledger"):]
    section = section[:section.index("\n## ")]
    lines = section.split("\n")
    start = lines.index("| totals | equals |")
    assert lines[start + 1] == "|---|---|"
    rules = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == 2, line
        rules.append((line, [side.strip() for cell in cells for side in cell.split(" = ")]))
    return rules


RULES = reconciliation_rules()
VIEW_SUM = re.compile(r"`sum\(([a-z_]+)\.([a-z_]+)\)`")
APP_COLUMNS = {"app charged": "charged_micro", "app paid by credit": "paid_by_credit_micro",
               "app paid by cash": "paid_by_cash_micro", "app earnings": "earnings_micro",
               "app fees": "fees_micro"}


def rule_names(db):
    """What each named term of the rules is on db: the verify lines' numbers
    by the page's names, the App-marketplace money query's columns, the
    revenue account's balance."""
    v = verify_numbers(db)
    names = {n: v[("totals", n)] for (line, n) in v if line == "totals"}
    names["storage revenue"] = v[("storage totals", "revenue")]
    names["storage credits spent"] = v[("storage totals", "credits spent")]
    names["reservations paid"] = v[("reservation totals", "paid")]
    names["reservations refunded"] = v[("reservation totals", "refunded")]
    names["reservation credits spent"] = v[("reservation totals", "credits spent")]
    names["reservation credits refunded"] = v[("reservation totals", "credits refunded")]
    header, rows = query(db, doc_sql("App-marketplace money"))
    for name, col in APP_COLUMNS.items():
        names[name] = sum(row[header.index(col)] for row in rows)
    (names["the revenue account's balance"],), = query(
        db, "SELECT coalesce(sum(balance), 0) FROM ledger_accounts WHERE id = 'revenue'")[1]
    return names


def evaluate(db, names, side):
    """A side of a rule: terms joined by ' + ' and ' − ', each a name or
    `sum(view.column)`; anything else fails."""
    parts = re.split(r" ([+−]) ", side)
    total, sign = 0, "+"
    for i, term in enumerate(parts):
        if i % 2:
            sign = term
            continue
        m = VIEW_SUM.fullmatch(term)
        if m:
            ((value,),) = query(db, f"SELECT coalesce(sum({m.group(2)}), 0) FROM {m.group(1)}")[1]
        else:
            assert term in names, f"REPORTS.md's rule has a term the test cannot read: {term!r}"
            value = names[term]
        total += value if sign == "+" else -value
    return total


def check_rules(db):
    names = rule_names(db)
    for line, sides in RULES:
        values = [evaluate(db, names, side) for side in sides]
        assert len(set(values)) == 1, f"REPORTS.md rule does not hold:\n{line}\n{list(zip(sides, values))}"
    return names


def check_totals_query(db):
    header, rows = query(db, doc_sql("The totals lines, recomputed"))
    assert header == ["line", "total", "micro"], header
    assert [((line, total), micro) for line, total, micro in rows] == list(verify_numbers(db).items())


@pytest.fixture(scope="module")
def full_db(tmp_path_factory):
    """A database with every kind of money the ledger holds (see the module's
    docstring), made through the API on the testing clock; prices: MI450
    1.20 a card-hour, H100-SXM 2.00, storage 0.30 per GB-month; trial
    credit 10.00 expiring after a day; the platform's app fee 10%."""
    tmp = tmp_path_factory.mktemp("reports-full")
    secret = secrets.token_hex(32)
    secret_file = str(tmp / "gateway.secret")
    with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(secret + "\n")
    c = start_cluster(tmp, nodes={"MI450": 2, "H100-SXM": 1}, clock=at("2027-03-01T08:00"),
                      options={"signup_credit_days": "1", "gateway_secret_file": secret_file,
                               "app_platform_fee_ppm": "100000"})

    def ok(r, code=200):
        assert r.status_code == code, (r.status_code, r.text)
        return r.json() if r.content else None

    def book(user, cards, start, end):
        return ok(d.post("/v1/reservations", key=user.key, json={"gpu_type": "H100-SXM", "cards": cards,
                                                                 "starts_at": start, "ends_at": end}), 201)

    def gateway_report(body):
        """POST /internal/gateway/reports signed as a gateway signs it."""
        path, data = "/internal/gateway/reports", json.dumps(body).encode()
        ts, nonce = str(int(time.time())), secrets.token_hex(16)
        canon = "\n".join(["POST", path, ts, nonce, hashlib.sha256(data).hexdigest()])
        sig = hmac.new(secret.encode(), canon.encode(), hashlib.sha256).hexdigest()
        return requests.post(d.base_url + path, data=data, timeout=30, headers={
            "X-Gpurent-Timestamp": ts, "X-Gpurent-Nonce": nonce, "X-Gpurent-Signature": sig,
            "Content-Type": "application/json"})
    try:
        d = c.d
        ok(c.admin("PUT", "/v1/admin/prices/H100-SXM",
                   json={"price_per_card_hour": "2.00", "effective_at": iso(d.now())}))
        ok(c.admin("PUT", "/v1/admin/storage-prices/global",
                   json={"price_per_gb_month": "0.30", "effective_at": iso(d.now())}))
        # ben: two hours charged (credit, then cash), then the clock steps
        # back an hour before he stops: an hour is refunded, cash first.
        ben = d.signup(email="ben@example.com")
        c.topup(ben, 20 * MICRO, "pay-ben-1")
        d.set_clock(at("2027-03-01T09:00"))
        ib = c.launch(ben, "MI450", 8)
        d.set_clock(at("2027-03-01T11:00"))
        c.billing()
        d.set_clock(at("2027-03-01T10:00"))
        c.stop(ben, ib)
        c.billing()
        ok(d.post(f"/v1/admin/users/{ben.id}/suspend", key=d.admin_key, json={"reason": "trial farming"}))
        ok(d.post(f"/v1/admin/users/{ben.id}/reinstate", key=d.admin_key, json={"reason": "appeal"}))
        # ann: runs across midnight, her trial credit then cash.
        ann = d.signup(email="ann@example.com")
        c.topup(ann, 60 * MICRO, "pay-ann-1")
        # cara: a 100 GB volume, paid from a 20.00 grant that expires
        # part-spent, then from cash.
        cara = d.signup(email="cara@example.com")
        c.grant(cara, 20 * MICRO, expires_at=at("2027-03-02T12:00"), reason="promo")
        c.topup(cara, 5 * MICRO, "pay-cara-1")
        ok(d.post("/v1/volumes", key=cara.key, json={"name": "data", "size_gb": 100}), 201)
        # dora: 8.00 paid by credit and cancelled early (refunded in full,
        # to credit); 32.00 by the rest of her credit and cash; 6.00 by cash,
        # cancelled inside the notice (half refunded, to cash).
        dora = d.signup(email="dora@example.com")
        c.topup(dora, 100 * MICRO, "pay-dora-1")
        early = book(dora, 2, "2027-03-10T00:00:00Z", "2027-03-10T02:00:00Z")
        book(dora, 4, "2027-03-05T00:00:00Z", "2027-03-05T04:00:00Z")
        late = book(dora, 1, "2027-03-02T00:00:00Z", "2027-03-02T03:00:00Z")
        assert ok(d.delete(f"/v1/reservations/{early['id']}", key=dora.key))["refunded"] == "8.00"
        assert ok(d.delete(f"/v1/reservations/{late['id']}", key=dora.key))["refunded"] == "3.00"
        # quinn calls pia's app once: 12.00, her 10.00 of credit and 2.00 of
        # cash; pia earns 10.80, the platform 1.20.
        pia = d.signup(email="pia@example.com")
        c.grant(pia, 5 * MICRO, reason="launch bonus")   # never expires: outstanding at the end
        quinn = d.signup(email="quinn@example.com")
        c.topup(quinn, 10 * MICRO, "pay-quinn-1")
        app = ok(d.post("/v1/apps", key=pia.key, json={
            "slug": "echo-model", "name": "Echo", "image": "rocm/pytorch:2.3-rocm6.2", "gpu_type": "MI450",
            "port": 8000, "cards_per_replica": 1, "min_replicas": 0, "max_replicas": 1, "concurrency_target": 2,
            "idle_seconds": 60, "price_per_request": "12.00"}), 201)
        call = {"id": "gw-doc-0001call", "app_id": app["id"], "user_id": quinn.id, "key_id": quinn.key_id,
                "at": int(time.time()), "status": 200, "input_tokens": 10, "output_tokens": 20, "duration_ms": 50,
                "cold_start": 0, "completed": 1}
        assert ok(gateway_report({"gateway_id": "gw-doc", "demand": [], "usage": [call]}))["accepted"] == [call["id"]]

        d.set_clock(at("2027-03-01T21:00"))
        ia = c.launch(ann, "MI450", 8)
        d.set_clock(at("2027-03-01T23:00"))
        c.billing()
        d.set_clock(at("2027-03-02T03:00"))
        c.stop(ann, ia)
        c.billing()
        d.set_clock(at("2027-03-03T12:00"))
        c.billing()                            # the trial credits and cara's promo expire
        c.wait_idle()
        c.verify()
        yield d.db_path
    finally:
        c.close()


def test_the_full_database_has_every_kind_of_money(full_db):
    """Else the rules below would be checked on zeros."""
    v = verify_numbers(full_db)
    assert [k for k in v if v[k] <= 0] == [], v
    t = rule_names(full_db)
    # Reservation cash, net of its refund; app money in credit and cash.
    assert t["reservations paid"] - t["reservations refunded"] - t["reservation credits spent"] \
        + t["reservation credits refunded"] == 33 * MICRO   # 30.00 + 6.00 paid in cash, 3.00 back
    assert (t["app charged"], t["app paid by credit"], t["app paid by cash"], t["app earnings"], t["app fees"]) == \
        (12 * MICRO, 10 * MICRO, 2 * MICRO, 10_800_000, 1_200_000)
    # Usage across midnight: one instance with card time on two days.
    _, rows = query(full_db, "SELECT instance_id, count(*) FROM report_usage WHERE card_seconds > 0"
                             " GROUP BY instance_id HAVING count(*) > 1")
    assert len(rows) == 1, rows


@pytest.mark.parametrize("which", ["example_db", "full_db"])
def test_every_reconciliation_rule_holds(request, which):
    """Every row of the page's reconciliation table, on both databases."""
    assert len(RULES) >= 15, RULES
    check_rules(request.getfixturevalue(which))


@pytest.mark.parametrize("which", ["example_db", "full_db"])
def test_the_totals_query_gives_every_number_of_ledger_verify(request, which):
    check_totals_query(request.getfixturevalue(which))


def test_every_query_on_the_page_runs_on_the_full_database(full_db):
    for sql, _, line in EXAMPLES:
        query(full_db, sql.replace("date('now'", f"date('{TODAY}'"))  # raises on an error


def test_admin_actions_lists_every_action_and_suspensions(full_db):
    """The page's `action` list is the schema's, and a suspension and a
    reinstatement read as it says."""
    ((schema,),) = query(full_db, "SELECT sql FROM sqlite_schema WHERE name = 'admin_actions'")[1]
    allowed = set(re.findall(r"'([a-z_]+)'", re.search(r"action\s+TEXT NOT NULL CHECK \(action IN \(([^)]*)\)",
                                                       schema).group(1)))
    with open(DOC) as f:
        (row,) = [line for line in f if line.startswith("| `action` |")]
    listed = set(re.findall(r"`([a-z_]+)`", row.split(" | ")[1].split("(")[0] + row.split(") or ")[1]))
    assert listed == allowed, (listed, allowed)
    _, rows = query(full_db, "SELECT r.action, r.target, r.amount_micro, r.detail FROM report_admin_actions r"
                             " JOIN users u ON u.id = r.target WHERE r.action IN ('suspend', 'reinstate')"
                             " AND u.email = 'ben@example.com' ORDER BY r.action_id")
    assert [(a, amount, json.loads(detail)) for a, _, amount, detail in rows] == [
        ("suspend", None, {"instances_stopped": 0, "status": "disabled"}),
        ("reinstate", None, {"instances_stopped": 0, "status": "active"})]
