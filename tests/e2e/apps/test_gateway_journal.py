"""test_gateway_journal.py: gpurent-gateway's usage journal (--state-dir,
src/gateway/journal.c) with a real gpurentd, real gateways and a sim
replica. A gateway SIGKILLed before it reported its calls (once before its
first report, once while gpurentd was stopped) resends them from the
journal when it starts again with the same state directory, and every call
it served is charged exactly once, to the micro-yuan; a record torn by a
crash mid-write is skipped with a log line; a journal replayed after
gpurentd had settled its records (the answer lost with the process) charges
nothing again; answered records leave the journal; a gateway SIGKILLed in
the middle of a streamed answer has the call charged, at its next start,
for what its last progress line says was delivered. `ledger verify`
passes."""
import json
import os
import shutil
import time

from agent_util import poll
from apps_util import DEADLINE, assert_ledger_ok

CHAT = "/v1/chat/completions"


def price(in_tok, out_tok, per_request=10000, p_in=2000, p_out=4000):
    """What a call costs under apps_util.publish's prices, as gpurentd computes it."""
    return per_request + (in_tok * p_in + out_tok * p_out) // 1000


def journal(gw):
    return os.path.join(gw.state_dir, "usage.journal")


def journal_lines(gw):
    with open(journal(gw), "rb") as f:
        return f.read().splitlines()


def records_in(gw):
    """The journal's usage records (not its progress or answered lines)."""
    return [j for j in map(json.loads, journal_lines(gw)) if "id" in j]


def set_flag(gw, flag, value):
    gw.args[gw.args.index(flag) + 1] = value


def drawn_from(m, user, app_id):
    """Per settled call of app_id: how many ledger transactions it has, and
    what they drew from the consumer (their cash and grants, the negative
    legs of app_call transactions on their behalf)."""
    rows = m.d.sql("SELECT c.id, count(DISTINCT t.id), coalesce(sum(CASE WHEN p.amount < 0 THEN -p.amount END), 0)"
                   " FROM app_calls c JOIN ledger_transactions t ON t.app_call_id = c.id AND t.kind = 'app_call'"
                   " AND t.user_id = ? JOIN ledger_postings p ON p.transaction_id = t.id WHERE c.app_id = ?"
                   " GROUP BY c.id", [user.id, app_id])
    return {call_id: (txns, drawn) for call_id, txns, drawn in rows}


def chat(gw, slug, key, words, stream=False):
    body = {"messages": [{"role": "user", "content": words}], "stream": stream}
    r = gw.call(slug, CHAT, key, json=body, stream=stream)
    assert r.status_code == 200, r.text
    if stream:
        events = [line[6:] for line in r.iter_lines() if line.startswith(b"data: ")]
        assert events[-1] == b"[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == len(words.split())
    else:
        assert r.json()["usage"]["completion_tokens"] == len(words.split())
    return len(words.split())


def test_killed_gateway_resends_its_journal_and_each_call_is_charged_once(market):
    m = market
    m.fleet(1)
    pub, con = m.user(), m.user()
    app = m.publish(pub, min_replicas=1)
    slug = app["slug"]
    poll(lambda: m.d.sql("SELECT count(*) FROM instances WHERE app_id = ? AND state = 'running'", [app["id"]])[0][0],
         DEADLINE, "a running replica")
    # A report period far beyond the test: nothing this run serves reaches
    # gpurentd before the kill, except through the journal.
    gw = m.gateway(report_ms=600000)
    served = []  # (input, output tokens) of each call answered
    for words, stream in (("one", False), ("two words", True), ("three more words", False)):
        n = chat(gw, slug, con.key, words, stream)
        served.append((n, n))
    assert len(records_in(gw)) == len(served), "each call's record is in the journal before its answer ends"
    gw.kill()
    assert m.calls(app["id"]) == [], "gpurentd heard nothing of the killed gateway's calls"

    # A crash in the middle of writing a record leaves half a line: skipped.
    with open(journal(gw), "ab") as f:
        f.write(b'{"id":"gw-test-torn0001","app_id":"' + app["id"].encode())
    saved = os.path.join(m.tmp, "journal-before-restart")
    shutil.copy(journal(gw), saved)

    set_flag(gw, "--report-ms", "150")
    gw.start()
    rows = m.wait_calls(app["id"], len(served))
    assert "cut short by a crash; skipped" in gw.text()
    assert sorted(row[4] for row in rows) == sorted(price(i, o) for i, o in served), rows
    poll(lambda: journal_lines(gw) == [], DEADLINE, "answered records to leave the journal")

    # gpurentd out of reach: the gateway serves from its copy, journals,
    # and is killed before gpurentd is back.
    m.d.listen = f"127.0.0.1:{m.d.port}"  # back on the same port: the gateway knows only that one
    m.d.stop()
    for words in ("during", "the outage"):
        n = chat(gw, slug, con.key, words)
        served.append((n, n))
    gw.kill()
    assert len(records_in(gw)) == 2
    m.d.start()
    gw.start()
    rows = m.wait_calls(app["id"], len(served))
    poll(lambda: journal_lines(gw) == [], DEADLINE, "answered records to leave the journal")

    # The first restart's journal again, as if the gateway had died after
    # gpurentd settled those records but before it heard the answer: the
    # resend is answered as duplicates and charges nothing more.
    gw.kill()
    shutil.copy(saved, journal(gw))
    gw.start()
    poll(lambda: journal_lines(gw) == [], DEADLINE, "the replayed records to be answered")

    rows = m.calls(app["id"])
    assert len(rows) == len(served), rows
    want = sorted(price(i, o) for i, o in served)
    assert sorted(row[4] for row in rows) == want and all(row[7] == 0 for row in rows), rows
    per_call = drawn_from(m, con, app["id"])
    assert len(per_call) == len(served) and all(txns == 1 for txns, _ in per_call.values()), per_call
    assert sorted(amount for _, amount in per_call.values()) == want, per_call
    assert_ledger_ok(m)


def test_gateway_killed_mid_stream_charges_what_it_had_delivered(market):
    m = market
    app, con = m.running_app(token_ms=20)  # 300 tokens 20 ms apart: a stream of about 6 s
    gw = m.gateway(report_ms=600000)
    words = " ".join(f"w{i}" for i in range(300))
    r = gw.call(app["slug"], "/v1/completions", con.key, stream=True, json={"prompt": words, "stream": True})
    assert r.status_code == 200, r.text
    seen = []  # the usage of each event the client read
    start = time.monotonic()
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            seen.append(json.loads(line[6:])["usage"]["completion_tokens"])
        if time.monotonic() - start > 2.5:  # past two progress lines (journal.c: GW_PROGRESS_MS)
            break
    gw.kill()  # mid-answer: no record, only progress lines
    r.close()
    assert records_in(gw) == [] and m.calls(app["id"]) == []
    progress = [j["progress"] for j in map(json.loads, journal_lines(gw)) if "progress" in j]
    assert len(progress) >= 2 and len({p["id"] for p in progress}) == 1, progress
    last = progress[-1]["output_tokens"]
    assert 0 < last < 300 and seen[0] <= last, (last, seen)

    set_flag(gw, "--report-ms", "150")
    gw.start()
    [row] = m.wait_calls(app["id"], 1)
    assert "cut short by the last gateway's end" in gw.text()
    status, in_tok, out_tok, charge, completed = row[1], row[2], row[3], row[4], row[8]
    assert (status, in_tok, out_tok, completed) == (200, 300, last, 0), row
    assert charge == price(300, last), row
    poll(lambda: journal_lines(gw) == [], DEADLINE, "the recorded call to leave the journal")
    assert_ledger_ok(m)


def test_gateway_killed_in_a_streams_first_second_charges_what_it_had_delivered(market):
    """The first progress line goes with a stream's first bytes: a gateway
    killed right after them (long before a second has passed; the next
    token is 2 s away) still has the call charged for what it delivered."""
    m = market
    app, con = m.running_app(token_ms=2000)
    gw = m.gateway(report_ms=600000)
    r = gw.call(app["slug"], "/v1/completions", con.key, stream=True, json={"prompt": "a b c", "stream": True})
    assert r.status_code == 200, r.text
    first = next(line for line in r.iter_lines() if line.startswith(b"data: {"))
    seen = json.loads(first[6:])["usage"]["completion_tokens"]
    gw.kill()
    r.close()
    progress = [j["progress"] for j in map(json.loads, journal_lines(gw)) if "progress" in j]
    assert records_in(gw) == [] and len(progress) == 1, journal_lines(gw)
    assert progress[0]["output_tokens"] == seen == 1, (progress, seen)

    set_flag(gw, "--report-ms", "150")
    gw.start()
    [row] = m.wait_calls(app["id"], 1)
    status, in_tok, out_tok, charge, completed = row[1], row[2], row[3], row[4], row[8]
    assert (status, in_tok, out_tok, completed) == (200, 3, 1, 0), row
    assert charge == price(3, 1), row
    assert_ledger_ok(m)
