"""test_apps_gateway.py: the marketplace end to end (issue 17) with a real
gpurentd, a real gpurent-gateway and sim agents whose replicas run
`gpurent-agent sim-model-server`: a first call scales the app from zero and
succeeds, OpenAI-style calls (plain and streamed as server-sent events)
charge the consumer, credit the publisher and record the fee to the
micro-yuan, `ledger verify` passes; a stream cut by the client is charged
for what the replica reported by the cut, an upstream error nothing; a
resent usage batch is charged once; the gateway serves from its copy while gpurentd is
stopped and its reports arrive when it is back; 429, 402, a private app's
404 and a revoked key's refusal within the sync period."""
import json
from decimal import Decimal
import socket
import threading
import time

import pytest
import requests

from agent_util import poll
from apps_util import DEADLINE, assert_ledger_ok
from ports import exchange


CHAT = "/v1/chat/completions"


def price(in_tok, out_tok, per_request=10000, p_in=2000, p_out=4000):
    """The app's prices of apps_util.publish, as the daemon computes them."""
    return per_request + (in_tok * p_in + out_tok * p_out) // 1000


def split(charge, ppm=100000):
    fee = charge * ppm // 1000000
    return charge - fee, fee


def cash(m, user):
    rows = m.d.sql("SELECT balance FROM ledger_accounts WHERE id = ?", [f"cash:{user.id}"])
    return rows[0][0] if rows else 0


def revenue(m):
    return m.d.sql("SELECT balance FROM ledger_accounts WHERE id = 'revenue'")[0][0]


def sse_events(r):
    events = []
    for line in r.iter_lines():
        if line.startswith(b"data: "):
            events.append(line[6:].decode())
    return events


def test_publish_call_from_zero_stream_and_money(market):
    m = market
    m.fleet(1)
    pub, con = m.user(), m.user()
    app = m.publish(pub)
    slug = app["slug"]
    assert app["min_replicas"] == 0 and app["replicas"] == [] and app["prices"]["per_request"] == "0.01"
    listed = requests.get(m.d.base_url + "/v1/apps").json()["data"]
    assert any(a["slug"] == slug and "command" not in a for a in listed)
    gw = m.gateway()
    pub_cash, rev0 = cash(m, pub), revenue(m)

    # Scale from zero: the first call is held while a replica starts, then succeeds.
    r = gw.call(slug, CHAT, con.key, json={"messages": [{"role": "user", "content": "hello big world"}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "hello big world"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    events = m.d.get(f"/v1/apps/{slug}", key=pub.key).json()["events"]
    assert any(e["kind"] == "scale_up" for e in events), events

    # Streamed: the events come through as sent, the last carrying the totals.
    r = gw.call(slug, CHAT, con.key, stream=True,
                json={"messages": [{"role": "user", "content": "one two three four"}], "stream": True})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    ev = sse_events(r)
    assert ev[-1] == "[DONE]" and json.loads(ev[-2])["usage"]["completion_tokens"] == 4, ev
    chunks = [json.loads(e) for e in ev[:-1]]
    # OpenAI's chunk shape, which its client libraries read field by field:
    # every chunk has its delta (the last an empty one with the reason),
    # the first names the role.
    assert all(c["object"] == "chat.completion.chunk" and isinstance(c["created"], int) and c["model"]
               and "delta" in c["choices"][0] for c in chunks), chunks
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "one two three four"

    rows = m.wait_calls(app["id"], 2)
    want = [price(3, 3), price(4, 4)]
    assert [row[4] for row in rows] == want, rows
    assert rows[0][9] == 1 and rows[1][9] == 0, "only the first call was a cold start"
    earnings = [split(c)[0] for c in want]
    fees = [split(c)[1] for c in want]
    assert [(row[5], row[6]) for row in rows] == list(zip(earnings, fees))
    # Publisher credited (their replica's card time is billed apart, to revenue), fee to revenue.
    m.d.post("/v1/admin/billing/run", key=m.d.admin_key)
    assert cash(m, pub) - pub_cash >= 0
    txns = m.d.sql("SELECT t.user_id, p.account_id, p.amount FROM ledger_transactions t JOIN ledger_postings p"
                   " ON p.transaction_id = t.id WHERE t.kind = 'app_call' ORDER BY p.id")
    credited = sum(a for u, acct, a in txns if acct == f"cash:{pub.id}")
    fee_in = sum(a for u, acct, a in txns if acct == "revenue")
    drawn = -sum(a for u, acct, a in txns if u == con.id and a < 0)
    assert (drawn, credited, fee_in) == (sum(want), sum(earnings), sum(fees))
    assert revenue(m) - rev0 >= sum(fees)
    # The consumer sees the calls among their transactions.
    tx = m.d.get("/v1/transactions", key=con.key).json()["data"]
    assert sum(1 for t in tx if t["kind"] == "app_call") == 2, tx
    assert len(m.d.get("/v1/transactions?kind=app_call", key=con.key).json()["data"]) == 2
    usage = m.d.get("/v1/usage", key=con.key).json()["apps"]
    assert usage == [{"app_id": app["id"], "slug": slug, "calls": 2, "input_tokens": 7, "output_tokens": 7,
                      "charged_micro": sum(want), "charged": usage[0]["charged"]}], usage
    month = m.d.sql("SELECT strftime('%Y-%m', max(at), 'unixepoch') FROM app_calls")[0][0]
    st = m.d.get(f"/v1/statements/{month}", key=con.key).json()
    assert st["apps"][0]["calls"] == 2 and sum(1 for t in st["transactions"] if t["kind"] == "app_call") == 2
    # Each side's line of a call is its own money: the consumer paid the
    # charge, the publisher earned the earning (the fee is neither's); and
    # each one's statement adds up to its closing balance.
    def yuan_micro(text):
        return int(Decimal(text) * 1_000_000)

    def call_lines(u):
        return sorted(yuan_micro(t["amount"]) for t in m.d.get("/v1/transactions?kind=app_call", key=u.key).json()["data"])

    assert call_lines(con) == sorted(-c for c in want)
    assert call_lines(pub) == sorted(earnings)
    for u in (con, pub):
        st = m.d.get(f"/v1/statements/{month}", key=u.key).json()
        lines = sum(yuan_micro(t["amount"]) for t in st["transactions"])
        assert yuan_micro(st["opening_balance"]) + lines == yuan_micro(st["closing_balance"]), st
    # The publisher's stats.
    st = m.d.get(f"/v1/apps/{slug}/stats", key=pub.key).json()["days"]
    assert st[0]["calls"] == 2 and st[0]["cold_starts"] == 1 and st[0]["earnings_micro"] == sum(earnings), st
    assert st[0]["output_tokens"] == 7 and st[0]["latency_p50_ms"] is not None
    # Any method and path, with its query: GET /v1/models, as OpenAI clients list models.
    r = requests.get(f"{gw.url}/apps/{slug}/v1/models?limit=5&x=a%20b", headers={"Authorization": f"Bearer {con.key}"},
                     timeout=30)
    assert r.status_code == 200 and r.json()["object"] == "list", r.text
    [model] = r.json()["data"]
    assert model["id"] == "sim-echo" and model["object"] == "model" and model["owned_by"] and \
        isinstance(model["created"], int), model
    assert requests.get(f"{gw.url}/apps/{slug}/v1/models").status_code == 401
    assert requests.get(f"{gw.url}/apps/no-such-app/v1/models", headers={"Authorization": f"Bearer {con.key}"},
                        timeout=30).status_code == 404
    assert_ledger_ok(m)


def test_a_cut_stream_pays_what_its_replica_reported_and_an_upstream_error_nothing(market):
    m = market
    m.fleet(1)
    pub, con = m.user(), m.user()
    port = None
    app = m.publish(pub, min_replicas=1, model_port=port)
    # Slow tokens so the client can leave half way.
    slug = app["slug"]
    gw = m.gateway()
    poll(lambda: len(m.live_replicas(app["id"])) == 1, DEADLINE, "a replica for min_replicas 1")
    r = gw.call(slug, "/v1/completions", con.key, json={"prompt": "warm"})
    assert r.status_code == 200, r.text
    # 2 000 words at the sim server's 5 ms a token: 10 s, far longer than
    # the 2 s the gateway reads a stream on after its client left.
    words = " ".join(f"w{i}" for i in range(2000))
    r = gw.call(slug, "/v1/completions", con.key, stream=True, json={"prompt": words, "stream": True})
    got = []
    for line in r.iter_lines():
        if line.startswith(b"data: "):
            got.append(json.loads(line[6:]))
        if len(got) == 3:
            break
    r.close()  # the client leaves after three events
    m.wait_calls(app["id"], 2)  # recorded once the stream is cut, 2 s on
    r = gw.call(slug, "/v1/completions", con.key, json={"prompt": "__fail__"})
    assert r.status_code == 500
    rows = m.wait_calls(app["id"], 3)
    warm, cut, failed = rows
    assert warm[4] == price(1, 1)
    # Cut: the input and the tokens the replica reported by the cut (at
    # least the three seen, far fewer than 2 000).
    assert cut[8] == 0 and 3 <= cut[3] < 2000 and cut[2] == 2000, cut
    assert cut[4] == price(2000, cut[3]), cut
    # Upstream error: nothing delivered, nothing charged.
    assert failed[1] == 500 and failed[4] == 0 and failed[3] == 0, failed
    assert_ledger_ok(m)


def test_usage_batch_sent_twice_is_charged_once(market):
    m = market
    pub, con = m.user(), m.user()
    app = m.publish(pub)
    rec = {"id": "gw-x-0001abcd", "app_id": app["id"], "user_id": con.id, "key_id": con.key_id, "at": int(time.time()),
           "status": 200, "input_tokens": 10, "output_tokens": 20, "duration_ms": 50, "cold_start": 0, "completed": 1}
    batch = {"gateway_id": "gw-x", "demand": [], "usage": [rec]}
    r1 = m.signed("POST", "/internal/gateway/reports", batch)
    r2 = m.signed("POST", "/internal/gateway/reports", batch)
    assert r1.status_code == 200 and r1.json()["accepted"] == [rec["id"]], r1.text
    assert r2.status_code == 200 and r2.json()["duplicates"] == [rec["id"]] and r2.json()["accepted"] == []
    rows = m.calls(app["id"])
    assert len(rows) == 1 and rows[0][4] == price(10, 20)
    n = m.d.sql("SELECT count(*) FROM ledger_transactions WHERE app_call_id = ?", [rec["id"]])[0][0]
    assert n == 1
    # Unsigned or wrongly signed reports are refused and change nothing.
    r = requests.post(m.d.base_url + "/internal/gateway/reports", json=batch, timeout=10)
    assert r.status_code == 401
    bad = dict(rec, id="gw-x-0002abcd", status=900)
    r = m.signed("POST", "/internal/gateway/reports", {"gateway_id": "gw-x", "demand": [], "usage": [bad]})
    assert r.status_code == 200 and r.json()["rejected"][0]["id"] == bad["id"]
    r = m.signed("POST", "/internal/gateway/reports", {"gateway_id": "gw-x", "demand": [], "usage": [], "x": 1})
    assert r.status_code == 400
    assert len(m.calls(app["id"])) == 1
    assert_ledger_ok(m)


def test_a_call_is_priced_as_admitted_an_error_is_free_and_a_long_one_pays_its_day(market):
    m = market
    pub, con = m.user(), m.user()
    app = m.publish(pub, price_per_second="0.001")
    n = iter(range(100))

    def report(**fields):
        rec = {"id": f"gw-x-{next(n):04d}pric", "app_id": app["id"], "user_id": con.id, "key_id": con.key_id,
               "at": int(time.time()), "status": 200, "input_tokens": 10, "output_tokens": 20, "duration_ms": 0,
               "cold_start": 0, "completed": 1, **fields}
        r = m.signed("POST", "/internal/gateway/reports", {"gateway_id": "gw-x", "demand": [], "usage": [rec]})
        assert r.status_code == 200, r.text
        return rec["id"], r.json()

    def settle(**fields):
        rec_id, answer = report(**fields)
        assert answer["accepted"] == [rec_id], answer
        [(charge,)] = m.d.sql("SELECT charge FROM app_calls WHERE id = ?", [rec_id])
        return charge

    admitted = {"request": 10000, "input_1k": 2000, "output_1k": 4000, "second": 1000}
    # The publisher raises every price after the calls were let in: each is
    # charged at the price it was admitted at.
    r = m.d.request("PATCH", f"/v1/apps/{app['slug']}", key=pub.key, json={
        "price_per_request": "900.00", "price_per_1k_input_tokens": "900.00", "price_per_1k_output_tokens": "900.00",
        "price_per_second": "900.00"})
    assert r.status_code == 200, r.text
    assert settle(prices=admitted, duration_ms=2000) == price(10, 20) + 2 * 1000
    # Lowered since: the lower price now.
    r = m.d.request("PATCH", f"/v1/apps/{app['slug']}", key=pub.key, json={"price_per_request": "0.001"})
    assert r.status_code == 200, r.text
    assert settle(prices=admitted) == price(10, 20, per_request=1000)
    # A record from a gateway that stamps no prices (an older journal): today's.
    assert settle() == price(10, 20, per_request=1000, p_in=900_000_000, p_out=900_000_000)
    # An error answer costs nothing, whatever tokens the replica claimed.
    assert settle(prices=admitted, status=500, input_tokens=100_000_000, output_tokens=100_000_000) == 0
    # A call past a day is charged its first day, not dropped as free.
    assert settle(prices=admitted, input_tokens=0, output_tokens=0, duration_ms=3 * 86_400_000) == \
        1000 + 86_400 * 1000
    # Stamped prices out of range or misshapen are refused, and charge nothing.
    for bad in ({"request": -1, "input_1k": 0, "output_1k": 0, "second": 0},
                {"request": 10**15, "input_1k": 0, "output_1k": 0, "second": 0},
                {"request": 1, "input_1k": 0, "output_1k": 0}, {"request": "1", "input_1k": 0, "output_1k": 0,
                                                                "second": 0}, [1, 2, 3, 4]):
        rec_id, answer = report(prices=bad)
        assert answer["rejected"][0]["id"] == rec_id, answer
    assert len(m.calls(app["id"])) == 5
    assert_ledger_ok(m)


def test_a_suspended_publisher_is_neither_served_listed_nor_scaled(market):
    m = market
    m.fleet(1)
    pub, con = m.user(), m.user()
    app = m.publish(pub, min_replicas=1)
    gw = m.gateway()
    poll(lambda: len(m.live_replicas(app["id"])) == 1, DEADLINE, "a replica for min_replicas 1")
    poll(lambda: gw.call(app["slug"], CHAT, con.key, json={"messages": [{"role": "user", "content": "hi"}]})
         .status_code == 200, DEADLINE, "the gateway serving the app")
    r = m.d.post(f"/v1/admin/users/{pub.id}/suspend", key=m.d.admin_key, json={"reason": "abuse report"})
    assert r.status_code == 200, r.text
    # Not in the market, not served, and no replica is started for demand:
    # the scaler says why instead.
    r = m.signed("POST", "/internal/gateway/reports", {"gateway_id": "gw-x", "usage": [], "demand": [
        {"app_id": app["id"], "in_flight": 0, "queued": 4, "busy": []}]})
    assert r.status_code == 200, r.text
    assert all(a["slug"] != app["slug"] for a in requests.get(m.d.base_url + "/v1/apps", timeout=10).json()["data"])
    poll(lambda: gw.call(app["slug"], CHAT, con.key, json={"messages": [{"role": "user", "content": "hi"}]})
         .status_code == 404, DEADLINE, "the gateway to stop serving the app")
    poll(lambda: m.d.sql("SELECT count(*) FROM app_events WHERE app_id = ? AND kind = 'scale_refused'"
                         " AND detail LIKE '%suspended%'", [app["id"]])[0][0] > 0, DEADLINE, "a refused scale-up")
    assert m.d.sql("SELECT count(*) FROM instances WHERE app_id = ? AND desired = 'running'", [app["id"]])[0][0] == 0
    assert_ledger_ok(m)


def test_gateway_serves_from_its_copy_while_the_daemon_is_stopped(market):
    m = market
    m.fleet(1)
    pub, con = m.user(), m.user()
    app = m.publish(pub, min_replicas=1)
    gw = m.gateway()
    poll(lambda: m.d.sql("SELECT count(*) FROM instances WHERE app_id = ? AND state = 'running'", [app["id"]])[0][0],
         DEADLINE, "a running replica")
    r = gw.call(app["slug"], CHAT, con.key, json={"messages": [{"role": "user", "content": "before"}]})
    assert r.status_code == 200, r.text
    m.wait_calls(app["id"], 1)
    m.d.listen = f"127.0.0.1:{m.d.port}"  # back on the same port: the gateway knows only that one
    m.d.stop()
    for word in ("during", "the", "outage"):
        r = gw.call(app["slug"], CHAT, con.key, json={"messages": [{"role": "user", "content": word}]})
        assert r.status_code == 200, r.text
    m.d.start()
    rows = m.wait_calls(app["id"], 4)
    assert len(rows) == 4 and all(row[4] == price(1, 1) for row in rows), rows
    assert_ledger_ok(m)


def test_limits_funds_private_apps_and_revoked_keys(market):
    m = market
    m.fleet(1)
    pub, con, other = m.user(), m.user(), m.user()
    broke = m.d.signup(verify=False)  # no trial credit: no funds
    app = m.publish(pub, min_replicas=1, rate_limit_per_key=2)
    private = m.publish(pub, visibility="private", allowed_users=[con.id], min_replicas=0)
    gw = m.gateway()
    poll(lambda: m.d.sql("SELECT count(*) FROM instances WHERE app_id = ? AND state = 'running'", [app["id"]])[0][0],
         DEADLINE, "a running replica")
    msg = {"messages": [{"role": "user", "content": "hi"}]}
    assert gw.call(app["slug"], CHAT, con.key, json=msg).status_code == 200
    assert gw.call(app["slug"], CHAT, con.key, json=msg).status_code == 200
    r = gw.call(app["slug"], CHAT, con.key, json=msg)
    assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60, r.text
    r = gw.call(app["slug"], CHAT, broke.key, json=msg)
    assert r.status_code == 402, r.text
    assert gw.call(private["slug"], CHAT, other.key, json=msg).status_code == 404
    assert m.d.get(f"/v1/apps/{private['slug']}", key=other.key).status_code == 404
    assert private["slug"] not in [a["slug"] for a in requests.get(m.d.base_url + "/v1/apps").json()["data"]]
    # The listed account is let through (held, not refused: it scales from zero).
    r = gw.call(private["slug"], CHAT, con.key, json=msg, headers={"X-Gpurent-Wait-Seconds": "0"})
    assert r.status_code == 503 and r.headers["Retry-After"], r.text
    assert gw.call(app["slug"], CHAT, "gpk_nonsense", json=msg).status_code == 401
    # A revoked key is refused within the gateway's sync period.
    key2 = m.d.post("/v1/api-keys", key=other.key, json={"name": "k2"}).json()
    assert gw.call(app["slug"], CHAT, key2["token"], json=msg).status_code in (200, 401)
    poll(lambda: gw.call(app["slug"], CHAT, key2["token"], json=msg).status_code == 200, 10, "the new key to work")
    assert m.d.delete(f"/v1/api-keys/{key2['id']}", key=other.key).status_code in (200, 204)
    t0 = time.monotonic()
    poll(lambda: gw.call(app["slug"], CHAT, key2["token"], json=msg).status_code == 401, 5, "the revoked key refused")
    assert time.monotonic() - t0 < 5
    assert_ledger_ok(m)


def synced(g):
    """Waits until the gateway took a copy wholly after now: two more good
    syncs (the first may have begun before), as its /healthz counts them."""
    def syncs():
        r = requests.get(g.url + "/healthz", timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "serving", r.text
        assert 0 <= r.json()["copy_age_ms"] < 60_000, r.text
        return r.json()["syncs"]
    first = syncs()
    poll(lambda: syncs() >= first + 2, DEADLINE, "two more syncs of the gateway")


def test_rate_limits_hold_across_gateways(market):
    """Limits count every gateway's calls: a key that spent its calls of
    the minute through one gateway is refused by another once the first
    one's report reached gpurentd and the second synced, and so is the
    app's own limit. Limits are per minute of gpurentd's clock, so the test
    starts early in one."""
    m = market
    m.fleet(1)
    pub, con, con2 = m.user(), m.user(), m.user()
    app = m.publish(pub, min_replicas=1, rate_limit_per_key=3, rate_limit_per_app=5)
    slug, app_id = app["slug"], app["id"]
    a, b = m.gateway(gateway_id="gw-a"), m.gateway(gateway_id="gw-b")

    def ready_in_copy():
        apps = [x for x in m.signed("GET", "/internal/gateway/state").json()["apps"] if x["id"] == app_id]
        return apps and apps[0]["replicas"]
    poll(ready_in_copy, DEADLINE, "a ready replica in the gateways' copy")

    # Minutes are on gpurentd's clock (the state's `at`), as calls are dated.
    def now():
        return m.signed("GET", "/internal/gateway/state").json()["at"]
    poll(lambda: now() % 60 < 30, 40, "the first half of a minute")
    minute = now() // 60
    msg = {"messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):
        r = a.call(slug, CHAT, con.key, json=msg)
        assert r.status_code == 200, r.text
    m.wait_calls(app_id, 2)
    state = m.signed("GET", "/internal/gateway/state").json()
    assert {(c["gateway_id"], c["key_id"], c["minute"], c["calls"]) for c in state["recent_calls"]} == \
        {("gw-a", con.key_id, minute, 2)}, state["recent_calls"]

    # The key's third call of the minute passes through gw-b, the fourth not.
    synced(b)
    r = b.call(slug, CHAT, con.key, json=msg)
    assert r.status_code == 200, r.text
    r = b.call(slug, CHAT, con.key, json=msg)
    assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60, r.text
    assert "rate limit" in r.json()["error"]["message"]
    # gw-a refuses it too, once gw-b's call is reported and gw-a synced.
    m.wait_calls(app_id, 3)
    synced(a)
    assert a.call(slug, CHAT, con.key, json=msg).status_code == 429

    # Another key has a limit of its own, but the app's (5 a minute) counts
    # both keys on both gateways: two more calls, one through each.
    assert b.call(slug, CHAT, con2.key, json=msg).status_code == 200
    m.wait_calls(app_id, 4)
    synced(a)
    assert a.call(slug, CHAT, con2.key, json=msg).status_code == 200
    m.wait_calls(app_id, 5)
    synced(b)
    r = b.call(slug, CHAT, con2.key, json=msg)
    assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60, r.text
    assert a.call(slug, CHAT, con2.key, json=msg).status_code == 429
    assert len(m.calls(app_id)) == 5
    assert now() // 60 == minute, "the minute ended mid-test; its limits started again"
    assert_ledger_ok(m)


def gateway_threads(gw):
    with open(f"/proc/{gw.proc.pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("Threads:")))


def waiting_calls(m, n, wait_s, before=lambda gw: None):
    """An app on a GPU type with no nodes (no replica ever becomes ready),
    a gateway, before(gateway), and n calls to it from threads, each
    allowed wait_s: returns the gateway, the threads and the list their
    (status, code, Retry-After) go to, once the gateway's demand report
    says all n wait."""
    m.fleet(1)
    pub, con = m.user(), m.user()
    app = m.publish(pub, gpu_type="MI300X", min_replicas=0)
    gw = m.gateway()
    before(gw)
    results = []

    def call():
        r = gw.call(app["slug"], "/v1/completions", con.key, json={"prompt": "hi"},
                    headers={"X-Gpurent-Wait-Seconds": str(wait_s)})
        results.append((r.status_code, r.json()["error"]["code"], r.headers.get("Retry-After")))

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    poll(lambda: m.d.sql("SELECT queued FROM app_demand WHERE app_id = ?", [app["id"]]) == [(n,)], DEADLINE,
         f"the gateway to report {n} calls waiting")
    return gw, threads, results


def test_waiting_and_idle_connections_hold_no_thread(market):
    """Forty calls waiting for a replica that never becomes ready and forty
    idle keep-alive connections: the gateway's threads stay those it had
    (its HTTP pool, the waiter, sync and report), where a thread per
    connection would be eighty more. Each waiting call is answered 503
    no_replica with Retry-After at its deadline."""
    seen = {}

    def before(gw):
        seen["base"] = gateway_threads(gw)
        seen["idle"] = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(40)]
    gw, threads, results = waiting_calls(market, 40, 8, before)
    waiting = gateway_threads(gw)
    assert waiting <= seen["base"] + 2, (seen["base"], waiting)
    for t in threads:
        t.join()
    for s in seen["idle"]:
        s.close()
    assert results == [(503, "no_replica", "5")] * 40, results


def test_calls_being_answered_hold_no_thread(market):
    """Thirty streams in progress at once (each 120 tokens 50 ms apart): the
    gateway's threads are those it had plus the one upstream thread, where
    a thread per upstream call would be thirty more. Each stream arrives
    whole and is charged for what it delivered. A stream lasts 6 s so that
    none has ended before the last has begun on a loaded machine (at 2 s,
    one had, under ASan beside other suites)."""
    m = market
    app, con = m.running_app(token_ms=50)
    gw = m.gateway()
    base = gateway_threads(gw)
    words = " ".join(f"w{i}" for i in range(120))
    started = threading.Semaphore(0)
    results = []

    def call():
        r = gw.call(app["slug"], "/v1/completions", con.key, stream=True, json={"prompt": words, "stream": True})
        events = []
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                if not events:
                    started.release()
                events.append(line[6:])
        results.append((r.status_code, events[-1], json.loads(events[-2])["usage"]["completion_tokens"]))

    threads = [threading.Thread(target=call) for _ in range(30)]
    for t in threads:
        t.start()
    for _ in threads:
        assert started.acquire(timeout=DEADLINE), "every stream to begin"
    answering = gateway_threads(gw)
    assert answering <= base + 2, (base, answering)
    assert requests.get(gw.url + "/healthz").json()["calls"] == 30
    for t in threads:
        t.join()
    assert results == [(200, b"[DONE]", 120)] * 30, results
    rows = m.wait_calls(app["id"], 30)
    assert [(r[1], r[2], r[3], r[4], r[8]) for r in rows] == [(200, 120, 120, price(120, 120), 1)] * 30, rows
    assert_ledger_ok(m)


def read_chunked(sock):
    """An HTTP/1.1 answer read to its end from a socket: (status, headers
    text, body) with the chunked body decoded."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    body = b""
    while True:
        while b"\r\n" not in rest:
            rest += sock.recv(65536)
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        while len(rest) < size + 2:
            more = sock.recv(1 << 20)
            assert more, "the answer ended mid-chunk"
            rest += more
        body += rest[:size]
        rest = rest[size + 2:]
        if size == 0:
            return int(head.split(b" ")[1]), head.decode(), body


def test_slow_client_pauses_its_upstream_and_gets_every_byte(market):
    """A client that reads nothing while a stream of about 10 MB is sent
    (a 4 KiB receive buffer; the kernel's send buffer takes up to 4 MiB):
    the gateway holds 1 MiB of it, then pauses
    the upstream transfer (its /healthz says so) rather than buffer more or
    block a thread; once the client reads, the transfer goes on and the
    client gets every event, in order, and the call is charged in full."""
    m = market
    app, con = m.running_app(token_ms=0)
    gw = m.gateway()
    words = [f"{i:03d}" + "x" * 237 for i in range(100)]
    tokens = 25000  # the words over and over (sim-model-server's max_tokens)
    body = json.dumps({"prompt": " ".join(words), "stream": True, "max_tokens": tokens}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    sock.sendall(f"POST /apps/{app['slug']}/v1/completions HTTP/1.1\r\nHost: gw\r\n"
                 f"Authorization: Bearer {con.key}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    health = lambda: requests.get(gw.url + "/healthz").json()
    poll(lambda: health()["paused_upstreams"] == 1, DEADLINE, "the upstream to be paused for the slow client")
    assert health()["calls"] == 1
    status, _, answer = read_chunked(sock)
    sock.close()
    assert status == 200
    events = [line[6:] for line in answer.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]" and len(events) == tokens + 2, len(events)  # + the finish event
    texts = [json.loads(e)["choices"][0]["text"].strip() for e in events[:-2]]
    assert texts == [words[i % len(words)] for i in range(tokens)]
    assert json.loads(events[-2])["usage"]["completion_tokens"] == tokens
    assert health()["paused_upstreams"] == 0
    [row] = m.wait_calls(app["id"], 1)
    assert (row[1], row[2], row[3], row[4], row[8]) == (200, 100, tokens, price(100, tokens), 1), row
    assert_ledger_ok(m)


@pytest.mark.parametrize("request_bytes,status,code", [
    (b"POST /apps/echo\x00x/v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{}", 400, "bad_request"),
    (b"POST /apps/echo/v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
     "bad_request"),
    (b"POST /apps/echo/v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}", 400,
     "bad_request"),
    # Framings a proxy in front may read otherwise: were passed on, or (gzip) never answered.
    (b"POST /apps/echo/v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n", 400, "bad_request"),
    (b"POST /apps/echo/v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}",
     400, "bad_request"),
    (b"POST /healthz HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip\r\n\r\n{}", 501, "not_implemented"),
    # Past libmicrohttpd's default memory, where it answered with its HTML page.
    (b"GET /apps/echo/v1/models HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n", 431,
     "headers_too_large"),
    (b"GET /apps/echo/" + b"a" * 200000 + b" HTTP/1.1\r\nHost: gw\r\n\r\n", 414, "uri_too_long"),
    (b"\r\n" * 100000, 400, "bad_request"),
], ids=["nul", "bad-chunk", "two-lengths", "length-and-chunked", "gzip-and-length", "gzip", "big-header", "big-target",
        "empty-lines"])  # short: pytest puts the id in the environment of what the test starts
def test_the_gateway_refuses_malformed_requests_with_a_json_error(market, request_bytes, status, code):
    """The gateway reads consumers' bytes through the same guard as the API
    (a raw NUL, a bad chunk, two lengths, unsure framings, heads too large):
    the API's JSON error, and the connection closed."""
    reply = exchange(market.gateway().port, request_bytes)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status) and b"Content-Type: application/json" in head, reply[:300]
    assert json.loads(body)["error"]["code"] == code, body


def test_odd_app_names_paths_and_methods_are_answered(market):
    m = market
    m.fleet(1)
    pub, con = m.user(), m.user()
    app = m.publish(pub, min_replicas=1)
    gw = m.gateway()
    poll(lambda: m.d.sql("SELECT count(*) FROM instances WHERE app_id = ? AND state = 'running'", [app["id"]])[0][0],
         DEADLINE, "a running replica")
    auth = {"Authorization": f"Bearer {con.key}"}
    # A name not in UTF-8, or one the message cuts mid-character: the
    # message could not be encoded and the gateway crashed on it.
    for name in ("%ff", "a" + "%C3%A9" * 30):
        r = requests.get(f"{gw.url}/apps/{name}/v1/models", headers=auth, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        assert r.json()["error"]["field"] is None and r.headers["Content-Type"] == "application/json"
    # A HEAD is answered (libcurl waited for a body that never came).
    r = requests.head(f"{gw.url}/apps/{app['slug']}/v1/models", headers=auth, timeout=30)
    assert r.status_code in (200, 404), r.status_code
    # Encoded bytes reach the replica encoded: a space is not a broken URL
    # (502), an encoded '?' is not a query (the replica knows no such path).
    for path in ("/v1/mo%20dels", "/v1/models%3Fa=1", "/v1/models%0d%0aX-Injected:%201"):
        r = requests.get(f"{gw.url}/apps/{app['slug']}{path}", headers=auth, timeout=30)
        assert r.status_code == 404 and r.json() == {"error": {"message": "no such route"}}, (path, r.text)
    assert requests.get(f"{gw.url}/apps/{app['slug']}/v1/models", headers=auth, timeout=30).status_code == 200
    assert_ledger_ok(m)


def test_a_web_page_on_any_origin_may_call_an_app(market):
    """A browser calling an app from a web page (an OpenAI-compatible client
    does) first sends a CORS preflight, an OPTIONS without the key: it is
    answered 204 allowing the method and the headers asked for (an SDK's
    own among them), not 401; and every answer, a proxied one or the
    gateway's own error, lets the page read it. Before, the preflight was
    refused 401 and no answer carried Access-Control-Allow-Origin, so no
    browser could call an app at all."""
    m = market
    m.fleet(1)
    pub, con = m.user(), m.user()
    app = m.publish(pub, min_replicas=1)
    gw = m.gateway()
    poll(lambda: m.d.sql("SELECT count(*) FROM instances WHERE app_id = ? AND state = 'running'", [app["id"]])[0][0],
         DEADLINE, "a running replica")
    url = f"{gw.url}/apps/{app['slug']}{CHAT}"
    origin = {"Origin": "https://chat.example"}
    r = requests.options(url, timeout=30, headers={**origin, "Access-Control-Request-Method": "POST",
                                                   "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"})
    assert r.status_code == 204, r.text
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in r.headers["Access-Control-Allow-Methods"]
    assert r.headers["Access-Control-Allow-Headers"] == "authorization,content-type,x-stainless-os"
    r = requests.post(url, timeout=60, headers={**origin, "Authorization": f"Bearer {con.key}"},
                      json={"messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "*", (r.status_code, r.headers)
    r = requests.post(url, timeout=30, headers=origin, json={})
    assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == "*", (r.status_code, r.headers)
    [row] = m.wait_calls(app["id"], 1)  # the preflight is not a call
    assert row[1] == 200, row
    assert_ledger_ok(m)


def test_stopping_gateway_answers_its_waiting_calls(market):
    """SIGTERM while calls wait for a replica (none ever comes): each is
    answered 503 with Retry-After at once and the gateway exits cleanly,
    rather than hanging on connections it had suspended."""
    gw, threads, results = waiting_calls(market, 5, 60)
    gw.stop()  # SIGTERM; asserts no sanitizer report
    for t in threads:
        t.join()
    assert results == [(503, "unavailable", "1")] * 5, results
