"""test_gateway_hardening.py: gpurent-gateway against consumers and
replicas that do not play fair, with a real gpurentd, a sim fleet and
replicas that are either `gpurent-agent sim-model-server` or
fake_replica.py (a replica that lies about its usage or never answers).
A request without a valid key, or for no app, is refused at its headers,
before any of its body is read; token counts are bounded by the bytes
that passed through the gateway; a replica that never answers is cut
after --upstream-idle-s (504); a call is ended after --max-call-s; a
non-streamed answer over the 4 MiB kept whole is still charged its
tokens; rate-limit windows never run out; a stream from a server that
reports usage only when asked is charged its tokens whatever the client
asked, and a client that leaves mid-stream pays what the stream reports
within the 2 s it is read on. Headers trickled, or idle connections
from one address, cannot take the gateway's connections. The funds a call holds are close to its
cost when its replica reports usage only at the end: a stream is held a
token an event, an answer in one body the usage it reports (withheld
until whole, chunked JSON too, or refused 402 or 502 whole), each within a
token a byte and the request's max_tokens; a prompt a token a byte, or a
token per 4 bytes when the funds do not hold that. Bad requests get the
API's errors, naming the field, and cost nothing."""
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import requests

from agent_util import poll
from apps_util import DEADLINE, GATEWAY, Market, assert_ledger_ok, free_port
from ports import cut_off_while_trickling

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_replica.py")


def fake_app(m, mode, **fields):
    """On a fleet of one node, an app whose one replica is fake_replica.py
    in mode, running, and a consumer: (app, consumer)."""
    m.fleet(1)
    pub, con = m.user(), m.user()
    port = free_port()
    app = m.publish(pub, min_replicas=1, max_replicas=1, model_port=port,
                    command=[sys.executable, FAKE, str(port), mode], **fields)
    poll(lambda: m.d.sql("SELECT count(*) FROM instances WHERE app_id = ? AND state = 'running'",
                         [app["id"]])[0][0], DEADLINE, "a running replica")
    return app, con


def ready_in_copy(m, gw, app_id):
    """Waits until the gateway's copy lists a ready replica of app_id (a call
    then goes straight to it)."""
    def ready():
        apps = [x for x in m.signed("GET", "/internal/gateway/state").json()["apps"] if x["id"] == app_id]
        return apps and apps[0]["replicas"]
    poll(ready, DEADLINE, "a ready replica in the copy")
    first = requests.get(gw.url + "/healthz", timeout=10).json()["syncs"]
    poll(lambda: requests.get(gw.url + "/healthz", timeout=10).json()["syncs"] >= first + 2, DEADLINE, "two syncs")


def test_requests_without_a_key_are_refused_before_their_body(market):
    """Connections announcing a body of nearly 8 MiB and sending a little of
    it: without a key (or with one, for no app) each is answered 401 (404)
    with the JSON error at once, without waiting for the rest of a body the
    gateway would otherwise have buffered."""
    m = market
    pub, con = m.user(), m.user()
    app = m.publish(pub)
    gw = m.gateway()
    head = ("POST /apps/{slug}/v1/completions HTTP/1.1\r\nHost: gw\r\n{auth}Content-Type: application/json\r\n"
            "Content-Length: 8000000\r\n\r\n")
    cases = [("anything", "", 401, "unauthorized"),
             ("anything", "Authorization: Bearer gpk_nonsense\r\n", 401, "unauthorized"),
             ("no-such-app", f"Authorization: Bearer {con.key}\r\n", 404, "not_found")]
    socks = []
    for slug, auth, status, code in cases * 8:
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=DEADLINE)
        s.sendall(head.format(slug=slug, auth=auth).encode() + b"{" + b" " * 65536)
        socks.append((s, status, code))
    for s, status, code in socks:
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = s.recv(65536)  # the socket's timeout is the deadline
            assert chunk, reply
            reply += chunk
        head_text, _, body = reply.partition(b"\r\n\r\n")
        assert head_text.startswith(b"HTTP/1.1 %d " % status) and b"Content-Type: application/json" in head_text
        assert json.loads(body)["error"]["code"] == code, body
    for s, _, _ in socks:
        s.close()
    # A body announced over the bound is refused before it is read too.
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=DEADLINE)
    s.sendall(head.format(slug=app["slug"], auth=f"Authorization: Bearer {con.key}\r\n").replace(
        "8000000", str(9 << 20)).encode())
    reply = s.recv(65536)
    s.close()
    assert reply.startswith(b"HTTP/1.1 413 ") and b'"body_too_large"' in reply, reply
    # Each refused connection ends once the gateway has seen its close, which
    # may come after this line's own request: none is left open.
    poll(lambda: requests.get(gw.url + "/healthz", timeout=10).json()["calls"] == 0, DEADLINE,
         "every refused connection ended")


def raw_answer(port, request):
    """The bytes a server sends for one request until it closes the
    connection (or DEADLINE): (status line, {header: value}, what follows)."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as s:
        s.sendall(request.encode())
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, after = got.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    return lines[0], {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}, after


def test_answers_without_a_body_are_relayed_without_one(market):
    """A HEAD, and a replica's 304, reach the client as headers alone: no
    chunked framing and not one byte after them (libmicrohttpd would send
    the empty last chunk, which a client keeping the connection reads as the
    start of its next answer), and the connection then closes. A client's
    If-None-Match reaches the replica, and its answer keeps the replica's
    ETag."""
    m = market
    app, con = fake_app(m, "bodiless")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    auth = f"Host: gw\r\nAuthorization: Bearer {con.key}\r\n\r\n"
    status, fields, after = raw_answer(gw.port, f"HEAD /apps/{app['slug']}/v1/models HTTP/1.1\r\n{auth}")
    assert status == "HTTP/1.1 200 OK" and fields["content-type"] == "application/json", (status, fields)
    assert "transfer-encoding" not in fields and after == b"", (fields, after)
    status, fields, after = raw_answer(gw.port, f"GET /apps/{app['slug']}/v1/304 HTTP/1.1\r\n"
                                                f"If-None-Match: \"v1\"\r\n{auth}")
    assert status == "HTTP/1.1 304 Not Modified" and fields["etag"] == '"v1"', (status, fields)
    assert "transfer-encoding" not in fields and after == b"", (fields, after)
    r = requests.get(f"{gw.url}/apps/{app['slug']}/v1/304", headers={"Authorization": f"Bearer {con.key}"},
                     timeout=DEADLINE)
    assert (r.status_code, r.content, r.headers["ETag"]) == (200, b"new", '"v1"'), r.headers


def test_token_counts_are_bounded_by_the_bytes_that_passed(market):
    """A replica whose usage claims a million tokens each way for a body of
    a few bytes: the call is charged at most a token per byte of the
    request and per byte of the answer delivered."""
    m = market
    app, con = fake_app(m, "liar")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    body = b'{"prompt": "hi"}'
    r = requests.post(f"{gw.url}/apps/{app['slug']}/v1/completions", data=body, timeout=DEADLINE,
                      headers={"Authorization": f"Bearer {con.key}", "Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 1000000, r.text
    [row] = m.wait_calls(app["id"], 1)
    assert (row[1], row[2], row[3]) == (200, len(body), len(r.content)), row
    assert row[4] == 10000 + (len(body) * 2000 + len(r.content) * 4000) // 1000, row
    assert_ledger_ok(m)


def test_a_stream_is_charged_its_tokens_whether_or_not_the_client_asked_for_usage(market):
    """A replica that streams its usage only when stream_options.include_usage
    is true, as OpenAI's API and vLLM do. Whether the client leaves it out
    or says false, the gateway asks, the call is charged its 5 + 3 tokens,
    and the usage chunk the client did not ask for reaches it as an SSE
    comment, never as an event with no choices; a client that asked gets
    it as an event. The path is read as servers that merge slashes read it,
    and one with a dot segment (which libcurl or the replica could resolve
    to a completion) is refused. A body the gateway might read otherwise
    than the replica (a `stream` that is not a boolean, a repeated key, not
    JSON) is refused."""
    m = market
    app, con = fake_app(m, "openai")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])

    def post(path, body):
        """(status, text) of a POST of body to the app's path, sent as it is
        (requests would resolve dot segments itself)."""
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=DEADLINE)
        conn.request("POST", f"/apps/{app['slug']}{path}", body,
                     {"Authorization": f"Bearer {con.key}", "Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode()
        conn.close()
        return r.status, r.getheader("Content-Type"), text

    def stream(options, path="/v1/completions"):
        status, kind, text = post(path, json.dumps({"prompt": "hi", "stream": True, **options}))
        assert status == 200 and kind.startswith("text/event-stream"), text
        lines = text.split("\n")
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]
        comments = [json.loads(x[7:]) for x in lines if x.startswith(":data: ")]
        assert lines.count("data: [DONE]") == 1, text
        return events, comments

    usage = {"prompt_tokens": 5, "completion_tokens": 3}
    for options in ({}, {"stream_options": {"include_usage": False}}, {"stream_options": None}):
        events, comments = stream(options)
        assert [e["choices"][0]["delta"]["content"] for e in events] == ["one", "two", "three"], events
        assert all(e["seen"] == {"include_usage": True} for e in events), events
        assert comments == [{"choices": [], "usage": usage}], comments
    events, comments = stream({"stream_options": {"include_usage": True}})
    assert comments == [] and events[-1] == {"choices": [], "usage": usage}, events
    events, comments = stream({}, path="//v1//chat/completions/")
    assert comments == [{"choices": [], "usage": usage}] and events[0]["seen"] == {"include_usage": True}, events
    # A path or body the gateway could read otherwise than the replica.
    for path, body, code in (("/v1/./completions", '{"prompt": "hi", "stream": true}', "invalid_path"),
                             ("/v1/x/../chat/completions", '{"prompt": "hi", "stream": true}', "invalid_path"),
                             ("/v1/chat/completions", '{"prompt": "hi", "stream": "true"}', "invalid_field"),
                             ("/v1/chat/completions", '{"prompt": "hi", "stream": 1}', "invalid_field"),
                             ("/v1/chat/completions", '{"stream": false, "prompt": "hi", "stream": true}',
                              "duplicate_key"),
                             ("/v1/chat/completions", '{"prompt": "hi", "stream": true', "malformed_json")):
        status, _, text = post(path, body)
        assert status == 400 and json.loads(text)["error"]["code"] == code, (path, body, text)
    rows = m.wait_calls(app["id"], 11)
    assert [(row[1], row[2], row[3]) for row in rows] == [(200, 5, 3)] * 5 + [(400, 0, 0)] * 6, rows
    assert [row[4] for row in rows] == [10000 + (5 * 2000 + 3 * 4000) // 1000] * 5 + [0] * 6, rows
    assert_ledger_ok(m)


def test_a_client_that_leaves_a_stream_pays_the_tokens_reported_within_2_s(market):
    """OpenAI's API and vLLM report a stream's usage only in a chunk after
    its last content. A client that leaves mid-stream used to pay for no
    token at all: the gateway dropped the rest unread. Now it reads the
    stream on without a client, for up to 2 s: one that ends by then is
    charged the usage it reports (tokens generated for the call, delivered
    or not), and one still going is cut there and charged the tokens it
    reported by then (none, from such a server)."""
    m = market
    app, con = fake_app(m, "openai")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])

    def leave_after_three(words):
        """Streams words content chunks, one every 200 ms, and leaves after
        the first three."""
        r = gw.call(app["slug"], "/v1/completions", con.key, stream=True,
                    json={"prompt": "hi", "stream": True, "words": words, "word_ms": 200})
        assert r.status_code == 200, r.text
        got = []
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                got.append(json.loads(line[6:])["choices"][0]["delta"]["content"])
            if len(got) == 3:
                break
        r.close()
        assert got == ["w1", "w2", "w3"], got

    # 6 chunks end about 0.6 s after the client left: charged all 5 + 6.
    leave_after_three(6)
    [row] = m.wait_calls(app["id"], 1)
    # Status, input and output tokens, completed.
    assert (row[1], row[2], row[3], row[8]) == (200, 5, 6, 0), row
    assert row[4] == 10000 + (5 * 2000 + 6 * 4000) // 1000, row
    # 60 chunks (12 s) are cut 2 s after the client left, before the usage.
    leave_after_three(60)
    rows = m.wait_calls(app["id"], 2)
    assert (rows[1][1], rows[1][2], rows[1][3], rows[1][8]) == (200, 0, 0, 0), rows
    assert rows[1][4] == 10000, rows
    assert_ledger_ok(m)


def test_a_replica_that_never_answers_is_cut_after_upstream_idle_s(market):
    """A replica that reads the call and answers nothing: with
    --upstream-idle-s 1 the call is answered 504 within seconds (it was
    held for ever), recorded as the gateway's error (nothing charged), and
    the gateway holds no call afterwards."""
    m = market
    app, con = fake_app(m, "silent")
    gw = m.gateway(extra=("--upstream-idle-s", "1"))
    ready_in_copy(m, gw, app["id"])
    t0 = time.monotonic()
    r = gw.call(app["slug"], "/v1/completions", con.key, json={"prompt": "hi"}, timeout=30)
    assert r.status_code == 504 and r.json()["error"]["code"] == "gateway_timeout", r.text
    assert time.monotonic() - t0 < 20
    [row] = m.wait_calls(app["id"], 1)
    assert (row[1], row[3], row[4]) == (504, 0, 0), row
    poll(lambda: requests.get(gw.url + "/healthz", timeout=10).json()["calls"] == 0, DEADLINE, "no call left")
    assert_ledger_ok(m)


def test_a_call_is_ended_after_max_call_s(market):
    """A stream of 300 tokens 100 ms apart (30 s) through a gateway with
    --max-call-s 2: it is cut short, as a client leaving would cut it, and
    charged for what was delivered with a duration of at most 2 s."""
    m = market
    app, con = m.running_app(token_ms=100)
    gw = m.gateway(extra=("--max-call-s", "2"))
    ready_in_copy(m, gw, app["id"])
    words = " ".join(f"w{i}" for i in range(300))
    t0 = time.monotonic()
    r = gw.call(app["slug"], "/v1/completions", con.key, stream=True, json={"prompt": words, "stream": True})
    events = []
    try:
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                events.append(line[6:])
    except requests.exceptions.ChunkedEncodingError:
        pass  # the stream was cut mid-answer
    assert time.monotonic() - t0 < 20 and b"[DONE]" not in events and 0 < len(events) < 300, len(events)
    [row] = m.wait_calls(app["id"], 1)
    assert row[8] == 0 and 0 < row[3] < 300, row
    [(duration,)] = m.d.sql("SELECT duration_ms FROM app_calls WHERE app_id = ?", [app["id"]])
    assert 1000 <= duration <= 2000, duration
    assert_ledger_ok(m)


def test_a_large_answer_is_charged_its_tokens(market):
    """A non-streamed answer of about 5 MB, over the 4 MiB the gateway keeps
    whole to read its usage: the usage is found in its end and charged (it
    was charged no tokens: the kept copy had a hole and did not parse)."""
    m = market
    app, con = m.running_app(token_ms=0)
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    words = " ".join(f"{i:03d}" + "x" * 97 for i in range(100))
    tokens = 50000
    r = gw.call(app["slug"], "/v1/completions", con.key, json={"prompt": words, "max_tokens": tokens})
    assert r.status_code == 200 and len(r.content) > 4 << 20, (r.status_code, len(r.content))
    assert r.json()["usage"]["completion_tokens"] == tokens
    [row] = m.wait_calls(app["id"], 1)
    assert (row[1], row[2], row[3], row[8]) == (200, 100, tokens, 1), row
    assert row[4] == 10000 + (100 * 2000 + tokens * 4000) // 1000, row
    assert_ledger_ok(m)


def test_a_large_answer_without_usage_is_charged_no_tokens(market):
    """A 5 MB answer with no `usage` of its own (only the text of one, inside
    a string, at its end): no tokens are charged (never an estimate, never
    the byte bound), and the gateway says so once for the app."""
    m = market
    app, con = fake_app(m, "huge")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    for _ in range(2):
        r = gw.call(app["slug"], "/v1/completions", con.key, json={"prompt": "hi"})
        assert r.status_code == 200 and len(r.content) > 5 << 20
    rows = m.wait_calls(app["id"], 2)
    assert [(row[1], row[2], row[3], row[4]) for row in rows] == [(200, 0, 0, 10000)] * 2, rows
    assert gw.text().count(f"app {app['id']} answered over 4 MiB without a `usage`") == 1, gw.text()[-2000:]
    assert_ledger_ok(m)


def test_rate_limits_hold_as_the_window_table_grows(new_daemon, tmp_path):
    """2100 keys, each with a limit of one call a minute on one app, each
    call once within a minute: every key's second call is refused 429,
    including those of the keys past the first table's 2048 (the gateway
    used to let calls past its 4096th window through uncounted; the table
    now grows, moving every window). One consumer holds them all, so its
    max_api_keys_per_user is raised."""
    m = Market(new_daemon, tmp_path, options={"max_api_keys_per_user": "3000"})
    try:
        pub, con = m.user(), m.user()
        app = m.publish(pub, rate_limit_per_key=1)
        s = requests.Session()
        keys = [s.post(m.d.url("/v1/api-keys"), headers={"Authorization": f"Bearer {con.key}"},
                       json={"name": f"k{i}"}, timeout=30).json()["token"] for i in range(2100)]
        gw = m.gateway()

        def now():
            return m.signed("GET", "/internal/gateway/state").json()["at"]
        poll(lambda: now() % 60 < 20, 70, "the first third of a minute")
        minute = now() // 60
        g = requests.Session()

        def call(key):
            r = g.post(f"{gw.url}/apps/{app['slug']}/v1/completions", json={"prompt": "hi"}, timeout=30,
                       headers={"Authorization": f"Bearer {key}", "X-Gpurent-Wait-Seconds": "0"})
            return r.status_code
        assert {call(k) for k in keys} == {503}  # counted, then no replica
        assert [call(k) for k in keys[:4] + keys[2044:2052] + keys[-4:]] == [429] * 16
        assert call(keys[0]) == 429
        assert now() // 60 == minute, "the minute ended mid-test; its windows started again"
    finally:
        m.close()


def test_funds_cover_every_call_in_flight(market):
    """A consumer with 0.025 yuan and an app at 0.01 a call whose replica
    never answers: two calls in flight at once, and a third while they
    wait is refused 402 (every one got in: the funds were checked against
    one call's price). Both end 504 after --upstream-idle-s, which costs
    nothing, and then a call gets in again (the count went down)."""
    m = market
    app, _ = fake_app(m, "silent")
    poor = m.d.signup(verify=False)  # no trial credit
    r = m.d.post(f"/v1/admin/users/{poor.id}/topups", key=m.d.admin_key,
                 json={"amount": "0.025", "payment_id": f"pay-{poor.id}"})
    assert r.status_code in (200, 201), r.text
    gw = m.gateway(extra=("--upstream-idle-s", "8"))
    ready_in_copy(m, gw, app["id"])
    results = []

    def call():
        results.append(gw.call(app["slug"], "/v1/completions", poor.key, json={"prompt": "hi"}).status_code)
    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    poll(lambda: requests.get(gw.url + "/healthz", timeout=10).json()["calls"] == 2, DEADLINE, "two calls in flight")
    r = gw.call(app["slug"], "/v1/completions", poor.key, json={"prompt": "hi"})
    assert r.status_code == 402 and r.json()["error"]["code"] == "insufficient_funds", r.text
    for t in threads:
        t.join()
    assert results == [504, 504], results
    r = gw.call(app["slug"], "/v1/completions", poor.key, json={"prompt": "hi"})
    assert r.status_code == 504, r.text
    rows = m.wait_calls(app["id"], 3)
    assert [(row[1], row[4]) for row in rows] == [(504, 0)] * 3, rows
    assert_ledger_ok(m)


def stream_call(gw, slug, key, body):
    """A streamed chat completion read to its end: (status, the error code
    of the answer or of an event in the stream, or None, content chunks
    received, whether it ended with [DONE])."""
    r = gw.call(slug, "/v1/chat/completions", key, json=body, stream=True)
    if r.status_code != 200:
        return r.status_code, r.json()["error"]["code"], 0, False
    code, chunks, done = None, 0, False
    try:
        for line in r.iter_lines():
            if line == b"data: [DONE]":
                done = True
            elif line.startswith(b"data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    code = event["error"]["code"]
                    assert code != "insufficient_funds" or event["error"]["type"] == "insufficient_quota", event
                elif event["choices"]:
                    chunks += 1
    except requests.exceptions.ChunkedEncodingError:
        pass  # cut: the funds held no more of it
    return 200, code, chunks, done


def topped_up(m, amount):
    """A consumer with no trial credit and amount yuan."""
    u = m.d.signup(verify=False)
    r = m.d.post(f"/v1/admin/users/{u.id}/topups", key=m.d.admin_key,
                 json={"amount": amount, "payment_id": f"pay-{u.id}"})
    assert r.status_code in (200, 201), r.text
    return u


def test_concurrent_streams_cannot_spend_more_than_the_funds(market):
    """A consumer with 1.2 yuan and an app at 1 yuan per 1k output tokens
    (no per-call price) sends 16 streams of 200 tokens (0.2 yuan each) at
    once. Before, each was admitted against the same 1.2 yuan and ran to
    its end: 3.2 yuan of answers, 2 of them recorded `unpaid`, work nobody
    paid for. Now each call holds part of the funds while it is in flight,
    growing as its answer comes: a call the funds cannot hold is refused
    402 (`insufficient_funds`) or its stream is cut where the funds ran
    out. Nothing is unpaid, the charges stay within the 1.2 yuan, each call
    pays its delivered tokens to the micro-yuan, and the books verify."""
    m = market
    app, _ = m.running_app(10, price_per_request="0", price_per_1k_input_tokens="0", price_per_1k_output_tokens="1")
    poor = topped_up(m, "1.2")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    body = {"messages": [{"role": "user", "content": "one two three four five"}], "stream": True, "max_tokens": 200}
    results = []

    def call():
        results.append(stream_call(gw, app["slug"], poor.key, body))
    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {r[:2] for r in results} <= {(200, None), (200, "insufficient_funds"), (402, "insufficient_funds")}, results
    assert sum(1 for r in results if r[3]) < 6, results  # 6 whole streams would cost 1.2 yuan and more
    gw.stop()  # its last report sends every record
    rows = m.calls(app["id"])
    assert rows and all(row[7] == 0 for row in rows), rows  # nothing unpaid
    assert all(row[4] == (row[3] * 1000 if row[1] < 400 else 0) for row in rows), rows  # 1000 a token
    assert sum(row[4] for row in rows) <= 1200000, rows
    assert m.d.sql("SELECT balance FROM ledger_accounts WHERE id = ?", [f"cash:{poor.id}"])[0][0] >= 0
    assert_ledger_ok(m)


def test_a_stream_priced_per_second_ends_when_its_funds_do(market):
    """An app at 0.1 yuan a second (no other price) whose replica sends a
    token every 100 ms, and a consumer with 0.35 yuan: a stream of 300
    tokens (30 s, 3 yuan) is cut within the seconds the funds pay for,
    whether or not bytes are flowing, with a last event saying why
    (`insufficient_funds`), and is charged its time to the
    micro-yuan, within the funds, nothing unpaid. Before, it ran its 30 s
    and 2.65 yuan of it was recorded unpaid."""
    m = market
    app, _ = m.running_app(100, price_per_request="0", price_per_1k_input_tokens="0", price_per_1k_output_tokens="0",
                           price_per_second="0.1")
    poor = topped_up(m, "0.35")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    t0 = time.monotonic()
    status, code, chunks, done = stream_call(gw, app["slug"], poor.key, {
        "messages": [{"role": "user", "content": "one two three"}], "stream": True, "max_tokens": 300})
    # Cut with an event saying why (an OpenAI client raises it), no [DONE].
    assert (status, code, done) == (200, "insufficient_funds", False) and 0 < chunks < 300, (status, code, chunks, done)
    assert time.monotonic() - t0 < 10
    [row] = m.wait_calls(app["id"], 1)
    [(duration,)] = m.d.sql("SELECT duration_ms FROM app_calls WHERE app_id = ?", [app["id"]])
    assert row[7] == 0 and row[4] == duration * 100000 // 1000 and 0 < row[4] <= 350000, (row, duration)
    assert_ledger_ok(m)


def per_output_token_app(m):
    """A fake_replica.py app in openai mode at 1 yuan per 1k output tokens
    (0.001 a token), no other price."""
    app, _ = fake_app(m, "openai", price_per_request="0", price_per_1k_input_tokens="0",
                      price_per_1k_output_tokens="1")
    return app


def test_a_stream_reporting_usage_only_at_its_end_is_held_about_its_cost(market):
    """A replica that reports a stream's usage only in its last chunk, as
    OpenAI's API and vLLM do, and a consumer with 0.15 yuan: a stream of
    100 tokens (0.1 yuan) in chunks of some 130 bytes is served in full
    and charged its 100 tokens. Before, the hold counted every answer byte
    as a token until the usage came, 13 yuan for this stream, and it was
    cut with insufficient_funds after its first chunk."""
    m = market
    app = per_output_token_app(m)
    poor = topped_up(m, "0.15")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    result = stream_call(gw, app["slug"], poor.key, {"messages": [{"role": "user", "content": "hi"}],
                                                     "stream": True, "words": 100})
    assert result == (200, None, 100, True), result
    [row] = m.wait_calls(app["id"], 1)
    # Status, input and output tokens, charge, unpaid, completed.
    assert (row[1], row[2], row[3], row[4], row[7], row[8]) == (200, 5, 100, 100000, 0, 1), row
    assert_ledger_ok(m)


def test_an_answer_with_its_usage_at_its_end_is_held_for_the_usage_it_reports(market):
    """One JSON answer of 30 words (some 200 bytes) with its usage at its
    end, and a consumer with 0.1 yuan at 0.001 a token. Its bytes, a
    token each, are more than the funds hold, so the answer is withheld
    until it is whole, then held for the 30 tokens it reports, served and
    charged them; before, it was refused 402. A replica claiming a million
    tokens for such an answer is held and charged at most a token a byte
    of it, which the funds do not hold: 402, nothing charged. With
    max_completion_tokens 20 and n 2 the claim is held and charged 40."""
    m = market
    app = per_output_token_app(m)
    poor = topped_up(m, "0.1")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    body = {"prompt": "hi", "words": 30}
    r = gw.call(app["slug"], "/v1/completions", poor.key, json={**body, "claim_tokens": 1000000})
    assert r.status_code == 402 and r.json()["error"]["code"] == "insufficient_funds", r.text
    r = gw.call(app["slug"], "/v1/completions", poor.key, json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 30, r.text
    assert len(r.content) > 150, r.content  # over what the funds hold a token a byte
    r = gw.call(app["slug"], "/v1/completions", poor.key,
                json={**body, "max_completion_tokens": 20, "n": 2, "claim_tokens": 1000000})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1000000, r.text
    rows = m.wait_calls(app["id"], 3)
    assert [(row[1], row[3], row[4], row[7]) for row in rows] == [(402, 0, 0, 0), (200, 30, 30000, 0),
                                                                  (200, 40, 40000, 0)], rows
    assert_ledger_ok(m)


def test_an_answer_withheld_past_1_mib_is_refused_whole(market):
    """A JSON answer of 5 MB, and a consumer with 20 yuan at 0.001 a
    token, which holds some 20 KB of it a token a byte: held at its first
    bytes for all it announces, it is withheld for its usage, but only up
    to 1 MiB (no more of an answer waits in the gateway), so it is refused
    402 whole and charged nothing. Before, its first pieces passed and the
    client got a 200 whose body was cut short."""
    m = market
    app, _ = fake_app(m, "huge", price_per_request="0", price_per_1k_input_tokens="0",
                      price_per_1k_output_tokens="1")
    poor = topped_up(m, "20")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    r = gw.call(app["slug"], "/v1/completions", poor.key, json={"prompt": "hi"})
    assert r.status_code == 402 and r.json()["error"]["code"] == "insufficient_funds", r.text[:200]
    [row] = m.wait_calls(app["id"], 1)
    assert (row[1], row[3], row[4], row[7]) == (402, 0, 0, 0), row
    assert_ledger_ok(m)


def test_a_stream_claiming_more_tokens_than_it_sent_is_capped(market):
    """A replica that streams three words and then claims a million
    completion tokens: a consumer with funds to spare is charged a token
    a byte of the answer it got (the hard ceiling), or the max_tokens it
    asked for; a consumer with 0.1 yuan gets the three words and is
    charged no more than its funds held, nothing unpaid."""
    m = market
    app = per_output_token_app(m)
    rich, poor = topped_up(m, "10"), topped_up(m, "0.1")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    # The client asks for the usage itself: the bytes it gets are all the replica's.
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "words": 3, "claim_tokens": 1000000,
            "stream_options": {"include_usage": True}}
    r = gw.call(app["slug"], "/v1/chat/completions", rich.key, json=body)
    assert r.status_code == 200 and b"data: [DONE]" in r.content, r.text
    [row] = m.wait_calls(app["id"], 1)
    assert (row[1], row[3], row[4], row[7]) == (200, len(r.content), len(r.content) * 1000, 0), (row, len(r.content))
    r = gw.call(app["slug"], "/v1/chat/completions", rich.key, json={**body, "max_tokens": 10})
    assert r.status_code == 200 and b"data: [DONE]" in r.content, r.text
    rows = m.wait_calls(app["id"], 2)
    assert (rows[1][1], rows[1][3], rows[1][4]) == (200, 10, 10000), rows
    status, code, chunks, _ = stream_call(gw, app["slug"], poor.key, body)
    assert (status, chunks) == (200, 3) and code in (None, "insufficient_funds"), (status, code, chunks)
    rows = m.wait_calls(app["id"], 3)
    assert rows[2][1] == 200 and rows[2][7] == 0 and 0 < rows[2][4] <= 100000, rows
    assert m.d.sql("SELECT balance FROM ledger_accounts WHERE id = ?", [f"cash:{poor.id}"])[0][0] >= 0
    assert_ledger_ok(m)


def test_a_call_priced_per_request_only_is_held_its_price_whatever_its_answer(market):
    """An app priced 0.01 a call and nothing else, and a consumer with
    0.015 yuan: a stream of 200 chunks is served in full and charged 0.01;
    its hold never depended on the answer's bytes or tokens."""
    m = market
    app, _ = fake_app(m, "openai", price_per_request="0.01", price_per_1k_input_tokens="0",
                      price_per_1k_output_tokens="0")
    poor = topped_up(m, "0.015")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    result = stream_call(gw, app["slug"], poor.key, {"messages": [{"role": "user", "content": "hi"}],
                                                     "stream": True, "words": 200})
    assert result == (200, None, 200, True), result
    [row] = m.wait_calls(app["id"], 1)
    assert (row[1], row[3], row[4], row[7], row[8]) == (200, 200, 10000, 0, 1), row
    assert_ledger_ok(m)


def test_funds_held_on_one_gateway_are_not_spent_on_another(market):
    """A consumer with 0.025 yuan and an app at 0.01 a call whose replica
    never answers: two calls in flight through gateway A hold 0.02 and
    more of the funds; A reports its holds, gpurentd's state lists them,
    and gateway B takes them off the funds in its copy, so a call through
    B is refused 402. Before, B saw the whole 0.025 and let a third call
    in: through two gateways a consumer could spend the same funds
    twice."""
    m = market
    app, _ = fake_app(m, "silent")
    poor = topped_up(m, "0.025")
    gw_a = m.gateway(gateway_id="gw-a", extra=("--upstream-idle-s", "8"))
    gw_b = m.gateway(gateway_id="gw-b", extra=("--upstream-idle-s", "8"))
    ready_in_copy(m, gw_a, app["id"])
    ready_in_copy(m, gw_b, app["id"])
    results = []

    def call():
        results.append(gw_a.call(app["slug"], "/v1/completions", poor.key, json={"prompt": "hi"}).status_code)
    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    poll(lambda: requests.get(gw_a.url + "/healthz", timeout=10).json()["calls"] == 2, DEADLINE, "two calls in flight")
    poll(lambda: [h for h in m.signed("GET", "/internal/gateway/state").json()["holds"]
                  if (h["gateway_id"], h["user_id"]) == ("gw-a", poor.id) and h["held"] >= 20000],
         DEADLINE, "gateway A's holds in the state")
    first = requests.get(gw_b.url + "/healthz", timeout=10).json()["syncs"]
    poll(lambda: requests.get(gw_b.url + "/healthz", timeout=10).json()["syncs"] >= first + 2, DEADLINE, "two syncs")
    r = gw_b.call(app["slug"], "/v1/completions", poor.key, json={"prompt": "hi"})
    assert r.status_code == 402 and r.json()["error"]["code"] == "insufficient_funds", r.text
    for t in threads:
        t.join()
    assert results == [504, 504], results
    rows = m.wait_calls(app["id"], 2)
    assert [(row[1], row[4]) for row in rows] == [(504, 0)] * 2, rows
    assert_ledger_ok(m)


def test_calls_one_after_another_cannot_spend_the_same_funds(market):
    """A consumer with 0.025 yuan and an app at 0.01 a call (no token price)
    behind a gateway whose copy is not refreshed (--sync-ms 600000, so its
    copy's funds stay 0.025): two calls one after the other are served and
    the third is refused 402, the copy's funds less what the first two cost
    (recorded, answered for by gpurentd or not) no longer covering it.
    Before, each call was checked against the same 0.025 and the third was
    served and left unpaid."""
    m = market
    app, _ = fake_app(m, "liar", price_per_1k_input_tokens="0", price_per_1k_output_tokens="0")
    poor = m.d.signup(verify=False)  # no trial credit
    r = m.d.post(f"/v1/admin/users/{poor.id}/topups", key=m.d.admin_key,
                 json={"amount": "0.025", "payment_id": f"pay-{poor.id}"})
    assert r.status_code in (200, 201), r.text
    poll(lambda: [a for a in m.signed("GET", "/internal/gateway/state").json()["apps"]
                  if a["id"] == app["id"] and a["replicas"]], DEADLINE, "a ready replica in the state")
    gw = m.gateway(sync_ms=600000)
    statuses = [gw.call(app["slug"], "/v1/completions", poor.key, json={"prompt": "hi"}).status_code
                for _ in range(3)]
    assert statuses == [200, 200, 402], statuses
    rows = m.wait_calls(app["id"], 2)
    assert [(row[1], row[4], row[7]) for row in rows] == [(200, 10000, 0)] * 2, rows
    assert_ledger_ok(m)


def test_a_call_is_charged_the_prices_it_was_admitted_with(market):
    """Each usage record carries the app's four prices at the call's
    admission. A publisher who raises the per-call price after a call and
    before its record reaches gpurentd (here: the gateway reports only
    when it stops) does not get the higher price for it: gpurentd charges
    each price component at most as stamped."""
    m = market
    m.fleet(1)
    pub, con = m.user(), m.user()
    app = m.publish(pub, min_replicas=1, max_replicas=1)
    gw = m.gateway(report_ms=600000)
    ready_in_copy(m, gw, app["id"])
    r = gw.call(app["slug"], "/v1/completions", con.key, json={"prompt": "one two three"})
    assert r.status_code == 200, r.text
    with open(os.path.join(gw.state_dir, "usage.journal")) as f:
        [record] = [j for j in map(json.loads, f.read().splitlines()) if "id" in j]
    assert record["prices"] == {"request": 10000, "input_1k": 2000, "output_1k": 4000, "second": 0}, record
    r = m.d.request("PATCH", f"/v1/apps/{app['slug']}", key=pub.key, json={"price_per_request": "0.05"})
    assert r.status_code == 200, r.text
    first = requests.get(gw.url + "/healthz", timeout=10).json()["syncs"]
    poll(lambda: requests.get(gw.url + "/healthz", timeout=10).json()["syncs"] >= first + 2, DEADLINE, "two syncs")
    gw.stop()  # its last report sends the record
    [row] = m.wait_calls(app["id"], 1)
    assert (row[1], row[2], row[3]) == (200, 3, 3) and row[4] == 10000 + (3 * 2000 + 3 * 4000) // 1000, row
    assert_ledger_ok(m)


def test_a_client_that_leaves_while_the_replica_is_silent_ends_its_call(market):
    """A call to a replica that never answers, whose client closes its
    connection while it waits: the gateway notices (the connection was
    suspended, so nothing watched it) and ends the call within seconds,
    long before --upstream-idle-s (300), recording it unanswered and
    uncharged."""
    m = market
    app, con = fake_app(m, "silent")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    body = b'{"prompt": "hi"}'
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=DEADLINE)
    s.sendall(f"POST /apps/{app['slug']}/v1/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {con.key}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    calls = lambda: requests.get(gw.url + "/healthz", timeout=10).json()["calls"]
    poll(lambda: m.d.sql("SELECT in_flight FROM app_demand WHERE app_id = ?", [app["id"]]) == [(1,)], DEADLINE,
         "the call in flight")
    assert calls() == 1
    s.close()
    poll(lambda: calls() == 0, 20, "the call of the client gone to end")
    [row] = m.wait_calls(app["id"], 1)
    assert row[4] == 0 and row[1] >= 500, row
    assert_ledger_ok(m)


def test_bad_command_lines_say_what_is_wrong():
    """A port out of range or a stray word on the command line is named,
    with exit status 2, before anything starts."""
    for args, says in ((["--listen", "127.0.0.1:99999", "--secret-file", "/nonexistent"],
                        "--listen must be HOST:PORT"),
                       (["extra"], "unexpected argument 'extra'"),
                       (["--sync-ms"], "--sync-ms needs a value"),
                       # A misspelt option is named as unknown, last or not
                       # (last, it was "--bogus needs a value"), in one line.
                       (["--bogus"], "unknown option --bogus (see --help)"),
                       (["--gateway-id", "gw-2", "--sync-mz", "50"], "unknown option --sync-mz (see --help)")):
        p = subprocess.run([GATEWAY, *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and says in p.stderr, (args, p.returncode, p.stderr)
        assert p.stderr.count("\n") == 1 and p.stdout == "", (args, p.stderr)


def per_token_app(m):
    """A fake_replica.py app in openai mode at 1 yuan per 1k input and per
    1k output tokens (0.001 a token each way), no other price."""
    app, _ = fake_app(m, "openai", price_per_request="0", price_per_1k_input_tokens="1",
                      price_per_1k_output_tokens="1")
    return app


def test_a_long_prompt_is_held_an_estimate_of_its_tokens_when_the_funds_do_not_hold_a_token_a_byte(market):
    """A prompt of some 40 KB at 0.001 yuan an input token: a token a byte
    it would hold 40 yuan, its estimate (a token per 4 bytes) some 10. A
    consumer with 12 yuan whose replica reports 10000 prompt tokens is
    served and charged them (it was refused 402: every byte was held as a
    token). One whose replica claims 30000, within the bytes but past the
    estimate, pays no more than its funds held, nothing unpaid; a consumer
    whose funds hold the bytes is charged the 30000. A consumer whose
    funds hold a 20 KB prompt a token a byte but not that and a stream of
    500 tokens gets the whole stream: the input's share of the hold drops
    to the estimate when the answer needs it (the stream was cut)."""
    m = market
    app = per_token_app(m)
    poor, poorer, rich, streamer = (topped_up(m, a) for a in ("12", "12", "100", "20.3"))
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    prompt = "x" * 40000
    r = gw.call(app["slug"], "/v1/completions", poor.key, json={"prompt": prompt, "prompt_tokens": 10000})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 10000, r.text[:300]
    for who in (poorer, rich):
        r = gw.call(app["slug"], "/v1/completions", who.key, json={"prompt": prompt, "prompt_tokens": 30000})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 30000, r.text[:300]
    result = stream_call(gw, app["slug"], streamer.key, {"messages": [{"role": "user", "content": prompt[:20000]}],
                                                          "stream": True, "words": 500})
    assert result == (200, None, 500, True), result
    rows = m.wait_calls(app["id"], 4)
    # Status, input and output tokens, charge, unpaid, consumer.
    got = [(row[1], row[2], row[3], row[4], row[7], row[10]) for row in rows]
    assert got[0] == (200, 10000, 3, 10003000, 0, poor.id), got
    assert got[1][0] == 200 and got[1][4] == 0 and got[1][5] == poorer.id, got
    assert 10000000 < got[1][3] <= 12000000 and got[1][1] < 30000, got  # what was held, within the funds
    assert got[2] == (200, 30000, 3, 30003000, 0, rich.id), got
    assert got[3] == (200, 5, 500, 505000, 0, streamer.id), got
    for who in (poor, poorer, rich, streamer):
        assert m.d.sql("SELECT balance FROM ledger_accounts WHERE id = ?", [f"cash:{who.id}"])[0][0] >= 0
    assert_ledger_ok(m)


def test_an_answer_without_a_content_length_is_withheld_until_whole(market):
    """A JSON answer of 30 words sent chunked, without a Content-Length, in
    pieces of 16 bytes, and a consumer with 0.1 yuan at 0.001 an output
    token: its first pieces were held a token a byte and passed, and it
    was cut where 100 bytes had gone, a 200 with half a JSON body. Now it
    is withheld until whole, as one that announces its length, then held
    for the 30 tokens it reports and served whole; one claiming a million
    tokens (held a token a byte of it, over the funds) is refused 402
    whole, nothing charged."""
    m = market
    app = per_output_token_app(m)
    poor = topped_up(m, "0.1")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    body = {"prompt": "hi", "words": 30, "chunked": 16, "word_ms": 20}
    r = gw.call(app["slug"], "/v1/completions", poor.key, json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 30, r.text
    assert len(r.content) > 150, r.content  # over what the funds hold a token a byte
    r = gw.call(app["slug"], "/v1/completions", poor.key, json={**body, "claim_tokens": 1000000})
    assert r.status_code == 402 and r.json()["error"]["code"] == "insufficient_funds", r.text
    rows = m.wait_calls(app["id"], 2)
    assert [(row[1], row[3], row[4], row[7]) for row in rows] == [(200, 30, 30000, 0), (402, 0, 0, 0)], rows
    assert_ledger_ok(m)


def test_a_withheld_answer_whose_replica_fails_before_it_is_whole_is_a_502(market):
    """A JSON answer withheld for its usage (the funds do not hold it a
    token a byte) whose replica closes the connection part way, with a
    Content-Length announced and chunked: the client gets 502 bad_gateway,
    never the part, and nothing is charged."""
    m = market
    app = per_output_token_app(m)
    poor = topped_up(m, "0.1")
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    for cut in ({"break_after": 60}, {"break_after": 60, "chunked": 16}):
        r = gw.call(app["slug"], "/v1/completions", poor.key, json={"prompt": "hi", "words": 30, **cut})
        assert r.status_code == 502 and r.json()["error"] == {
            "code": "bad_gateway", "message": "the replica's answer ended before it was whole", "field": None,
            "type": "server_error", "param": None}, r.text
    rows = m.wait_calls(app["id"], 2)
    assert [(row[1], row[3], row[4], row[7]) for row in rows] == [(502, 0, 0, 0)] * 2, rows
    assert m.d.sql("SELECT balance FROM ledger_accounts WHERE id = ?", [f"cash:{poor.id}"]) == [(100000,)]
    assert_ledger_ok(m)


def test_bad_requests_get_the_apis_errors_and_cost_nothing(market):
    """The gateway's own surface against the daemon's standard: each bad
    request gets the API's JSON error naming the field at fault and
    charges nothing. A completion whose body the gateway would read
    otherwise than its replica (sent as another type or encoded, not UTF-8,
    not an object, a field it reads of the wrong type) is refused 400 or
    415, where before a text/plain or gzipped body was read as JSON anyway
    and a max_tokens of "100" passed unseen; a 401 names its challenge
    (WWW-Authenticate: Bearer); a key whose secret is another consumer's,
    or a consumer not listed on a private app, is refused. A request to
    another path than /apps/... is answered at its headers, before any
    body (a connection without a key could make the gateway buffer 8 MiB
    there), and /healthz takes GET or HEAD only. Fields of the app's own
    are the app's: passed on. Each error also carries OpenAI's type and
    param."""
    m = market
    app, con = fake_app(m, "openai")
    other = m.user()
    private = m.publish(m.user(), visibility="private", allowed_users=[other.id])
    gw = m.gateway()
    ready_in_copy(m, gw, app["id"])
    completions = f"/apps/{app['slug']}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {con.key}"}
    as_json = {**auth, "Content-Type": "application/json"}
    swapped = con.key[:-64] + other.key[-64:]  # the key's id, another consumer's secret

    def error(r):
        assert r.headers["Content-Type"] == "application/json", (r.status_code, r.headers, r.text)
        e = r.json()["error"]
        # OpenAI's "type" and "param" beside the API's code and field, for
        # the OpenAI client libraries the apps are called through.
        want = {401: "authentication_error"}.get(r.status_code, "invalid_request_error")
        assert e["type"] == want and e["param"] == e["field"], e
        return r.status_code, e["code"], e["field"]

    cases = [
        # (method, path, headers, body, status, code, field)
        ("POST", completions, as_json, b'{"messages": [', 400, "malformed_json", None),
        ("POST", completions, as_json, b'{"prompt": "\xff"}', 400, "invalid_encoding", None),
        ("POST", completions, as_json, b'[{"prompt": "hi"}]', 400, "not_an_object", None),
        ("POST", completions, as_json, b'{"prompt": "hi", "stream": "true"}', 400, "invalid_field", "stream"),
        ("POST", completions, as_json, b'{"prompt": "hi", "max_tokens": "100"}', 400, "invalid_field", "max_tokens"),
        ("POST", completions, as_json, b'{"prompt": "hi", "max_tokens": 100.0}', 400, "invalid_field", "max_tokens"),
        ("POST", completions, as_json, b'{"prompt": "hi", "max_completion_tokens": -1}', 400, "invalid_field",
         "max_completion_tokens"),
        ("POST", completions, as_json, b'{"prompt": "hi", "n": 0}', 400, "invalid_field", "n"),
        ("POST", completions, as_json, b'{"prompt": "hi", "stream": true, "stream_options": "usage"}', 400,
         "invalid_field", "stream_options"),
        ("POST", completions, as_json, b'{"prompt": "hi", "stream_options": {"include_usage": 1}}', 400,
         "invalid_field", "stream_options.include_usage"),
        ("POST", completions, {**auth, "Content-Type": "text/plain"}, b'{"prompt": "hi"}', 415,
         "unsupported_media_type", "Content-Type"),
        ("POST", completions, {**auth, "Content-Type": "application/x-www-form-urlencoded"}, b"prompt=hi", 415,
         "unsupported_media_type", "Content-Type"),
        ("POST", completions, {**as_json, "Content-Encoding": "gzip"}, b'{"prompt": "hi"}', 415,
         "unsupported_media_type", "Content-Encoding"),
        ("POST", completions, {**as_json, "X-Gpurent-Wait-Seconds": "soon"}, b'{"prompt": "hi"}', 400,
         "invalid_header", "X-Gpurent-Wait-Seconds"),
        ("POST", completions, {"Content-Type": "application/json"}, b'{"prompt": "hi"}', 401, "unauthorized", None),
        ("POST", completions, {"Authorization": "Basic dXNlcjpwYXNz"}, b'{"prompt": "hi"}', 401, "unauthorized",
         None),
        ("POST", completions, {"Authorization": "Bearer "}, b'{"prompt": "hi"}', 401, "unauthorized", None),
        ("POST", completions, {"Authorization": f"Bearer {swapped}"}, b'{"prompt": "hi"}', 401, "unauthorized",
         None),
        ("POST", f"/apps/{private['slug']}/v1/completions", as_json, b'{"prompt": "hi"}', 404, "not_found", None),
        ("POST", "/healthz", as_json, b"{}", 405, "method_not_allowed", None),
        ("GET", "/v1/models", auth, None, 404, "not_found", None),
    ]
    for method, path, headers, body, status, code, field in cases:
        r = requests.request(method, gw.url + path, headers=headers, data=body, timeout=DEADLINE)
        assert error(r) == (status, code, field), (path, headers, body, r.status_code, r.text)
        if status == 401:
            assert r.headers["WWW-Authenticate"] == "Bearer", r.headers
    # A 401 says which: no key, a token that is not a gpurent key (an
    # OpenAI key pasted by mistake), or a key the gateway does not know.
    for token, says in (("", "an API key is required"), ("sk-proj-abc", "is not a gpurent API key"),
                        (swapped, "unknown, revoked or expired")):
        r = requests.post(gw.url + completions, headers={"Authorization": f"Bearer {token}"},
                          json={"prompt": "hi"}, timeout=DEADLINE)
        assert r.status_code == 401 and says in r.json()["error"]["message"], (token, r.text)
        if status == 405:
            assert r.headers["Allow"] == "GET, HEAD", r.headers
    # A request to no app is answered at its headers, before its body.
    with socket.create_connection(("127.0.0.1", gw.port), timeout=DEADLINE) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 8000000\r\n\r\n{" + b" " * 65536)
        reply = b""
        while not reply.rstrip().endswith(b"}"):
            chunk = s.recv(65536)  # the socket's timeout is the deadline
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 404 ") and b'"not_found"' in reply, reply
    # The app's own fields, and a body sent without a Content-Type (taken
    # as JSON, and sent on so), are passed on.
    r = requests.post(gw.url + completions, headers=auth, timeout=DEADLINE,
                      data=b'{"prompt": "hi", "top_k": 5, "my_app_option": {"x": [1]}}')
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    assert requests.head(gw.url + "/healthz", timeout=DEADLINE).status_code == 200
    # The refused completions after admission are recorded 4xx, uncharged;
    # the one passed on is charged its price and tokens.
    rows = m.wait_calls(app["id"], 15)
    assert sorted(row[1] for row in rows) == [200] + [400] * 11 + [415] * 3, rows
    assert [row[4] for row in rows if row[1] != 200] == [0] * 14, rows
    poll(lambda: requests.get(gw.url + "/healthz", timeout=10).json()["calls"] == 0, DEADLINE, "no call left")
    assert_ledger_ok(m)


def test_slow_and_idle_connections_cannot_take_the_gateways_connections(market):
    """The gateway had libmicrohttpd's idle timeout alone (600 s, restarted
    by every byte) and no bound per address: a client trickling a header
    line every second held its connection for ever, and one address could
    hold all 4096 the gateway serves, leaving consumers no call. Now, as
    on the API, a request's headers must be in within --header-timeout-s
    of its start, and an address holding --max-connections-per-client
    connections still sending headers that opens one more loses its
    longest-waiting one, so its own fresh call still gets in; a call whose
    headers are in is not cut by that deadline."""
    m = market
    app, con = fake_app(m, "openai")
    gw = m.gateway(extra=("--header-timeout-s", "2", "--max-connections-per-client", "4"))
    ready_in_copy(m, gw, app["id"])
    assert cut_off_while_trickling(gw.port, b"GET /apps/x/v1/models HTTP/1.1\r\nHost: gw\r\n", b"X-Slow: 1\r\n"), \
        "headers trickled a line a second were never cut off"
    idle = [socket.create_connection(("127.0.0.1", gw.port), timeout=DEADLINE) for _ in range(4)]
    try:
        # A fifth from the address: the longest-waiting is let go at once
        # (its recv sees the end; the socket's timeout is the deadline).
        idle.append(socket.create_connection(("127.0.0.1", gw.port), timeout=DEADLINE))
        assert idle[0].recv(1) == b"", "the longest-waiting connection of a full address was kept"
        r = requests.post(f"{gw.url}/apps/{app['slug']}/v1/completions", json={"prompt": "hi"},
                          headers={"Authorization": f"Bearer {con.key}"}, timeout=DEADLINE)
        assert r.status_code == 200, r.text
    finally:
        for s in idle:
            s.close()
