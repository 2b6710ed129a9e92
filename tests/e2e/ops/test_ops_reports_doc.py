"""test_ops_reports_doc.py: docs/REPORTS.md is true. Its example database
(ada, bob, carol and dan, described on that page) is made through the API
on the testing clock; then every ```sql block on the page is run on it with
Python's sqlite3 module, read-only, and must give exactly the rows of the
output block that follows it, and every `$ gpurentd report …` and
`$ gpurentd ledger verify` example must print what the page shows.

Ids are random, so cells holding one (usr_…, grt_…, ins_…, top_…, key_…)
compare as "<id>". The one query that reads the wall clock (date('now')) runs as of
the day the page names for it.
"""
import datetime
import os
import re
import sqlite3

import pytest

from harness import REPO, run_gpurentd
from money_util import MICRO, start_cluster
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
