"""test_gateway_sse_line_ends.py: a replica whose server-sent events end
their lines with a lone CR (or CR LF), as the SSE standard allows, is
metered as one ending them with LF: its consumer is charged the usage it
reports, to the micro-yuan, the usage event the client did not ask for
reaches it as a comment, and the hold counts its events, a token an event,
so a stream its consumer cannot pay for is cut where the funds end, with a
last event saying why. Before, the gateway ended lines at LF only: such a
stream had no usage read (no token charged), its usage event went to the
client as data, and the hold took the whole stream for one event."""
import json
import re

from apps_util import assert_ledger_ok
from test_gateway_hardening import fake_app, per_output_token_app, ready_in_copy, stream_call, topped_up

USAGE = {"prompt_tokens": 5, "completion_tokens": 3}


def cash(m, user):
    rows = m.d.sql("SELECT balance FROM ledger_accounts WHERE id = ?", [f"cash:{user.id}"])
    return rows[0][0] if rows else 0


def lines_of(text):
    """The lines of an SSE stream, by the standard's line ends."""
    return re.split(r"\r\n|\r|\n", text)


def test_a_stream_with_lone_cr_line_ends_is_charged_its_reported_usage(market):
    """A replica streams three words and its usage (5 + 3 tokens) with
    each line ended by a lone CR, then by CR LF. Whether the client asks
    for the usage (it gets it as an event) or not (the gateway asks, and
    the client gets it as a comment, ":data: ..."), each call is charged
    its 5 + 3 tokens at the app's prices, the ledger draws exactly that
    from the consumer, and the books verify."""
    m = market
    app, con = fake_app(m, "openai")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    calls = 0
    for line_end in ("\r", "\r\n"):
        for asked in (False, True):
            body = {"prompt": "hi", "stream": True, "line_end": line_end}
            if asked:
                body["stream_options"] = {"include_usage": True}
            r = gw.call(app["slug"], "/v1/completions", con.key, json=body)
            assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r.text
            assert line_end + line_end in r.text and ("\n" not in r.text or line_end == "\r\n"), repr(r.text)
            lines = lines_of(r.text)
            events = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]
            comments = [json.loads(x[7:]) for x in lines if x.startswith(":data: ")]
            assert lines.count("data: [DONE]") == 1, repr(r.text)
            assert [e["choices"][0]["delta"]["content"] for e in events if e["choices"]] == ["one", "two", "three"]
            if asked:
                assert comments == [] and events[-1] == {"choices": [], "usage": USAGE}, repr(r.text)
            else:
                assert comments == [{"choices": [], "usage": USAGE}] and all(e["choices"] for e in events), \
                    repr(r.text)
            calls += 1
    rows = m.wait_calls(app["id"], calls)
    # Status, input and output tokens, charge (10000 a call, 2000 and 4000 per 1k tokens), unpaid, completed.
    assert [(row[1], row[2], row[3], row[4], row[7], row[8]) for row in rows] == \
        [(200, 5, 3, 10000 + (5 * 2000 + 3 * 4000) // 1000, 0, 1)] * calls, rows
    # What the ledger drew from the consumer for the calls is those charges.
    postings = m.d.sql("SELECT p.amount FROM ledger_transactions t JOIN ledger_postings p ON p.transaction_id = t.id"
                       " WHERE t.kind = 'app_call' AND t.user_id = ? AND p.amount < 0", [con.id])
    assert -sum(a for (a,) in postings) == sum(row[4] for row in rows), (postings, rows)
    assert_ledger_ok(m)


def test_a_lone_cr_stream_is_held_a_token_an_event_and_cut_where_its_funds_end(market):
    """An app at 0.001 yuan an output token whose replica streams 100 words,
    a token an event, its lines ended by a lone CR, reporting its usage
    only at its end. A consumer with 0.15 yuan gets it all and is charged
    its 100 tokens. A consumer with 0.08 yuan is cut once the tokens held,
    one an event, pass the funds, with a last event saying why
    (insufficient_funds), before the end of the stream, and is charged no
    more than its funds, nothing unpaid. Before, no event was counted: the
    hold stayed at a token, both got the whole stream, and neither paid a
    token."""
    m = market
    app = per_output_token_app(m)
    enough, poor = topped_up(m, "0.15"), topped_up(m, "0.08")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "words": 100, "line_end": "\r"}
    assert stream_call(gw, app["slug"], enough.key, body) == (200, None, 100, True)
    [row] = m.wait_calls(app["id"], 1)
    # Status, input and output tokens, charge, unpaid, completed.
    assert (row[1], row[2], row[3], row[4], row[7], row[8]) == (200, 5, 100, 100000, 0, 1), row
    status, code, chunks, done = stream_call(gw, app["slug"], poor.key, body)
    assert (status, code, done) == (200, "insufficient_funds", False) and 0 < chunks < 100, (status, code, chunks)
    rows = m.wait_calls(app["id"], 2)
    assert rows[1][1] == 200 and rows[1][7] == 0 and rows[1][4] <= 80000, rows
    assert cash(m, poor) >= 0
    assert_ledger_ok(m)
