"""test_gateway_crash.py: the marketplace's money under crashes. Consumers
call a published app through a real gpurent-gateway (its replica a sim
model server echoing word by word, usage in every chunk) in a steady load
of calls, streamed and not, some left by their client mid-stream, some
refused 402 or cut mid-stream as a consumer topped up a little each round
runs out of funds; at seeded random moments the gateway is killed with
SIGKILL and started again on its journal (once killed again just after,
while it resends what it recovered), gpurentd is killed with SIGKILL while
the gateway's report is in flight, and both are killed together. After
each restart, once every call has settled:

* a call whose answer its consumer received whole is charged exactly
  once, its full price (never twice after a journal replay, never lost);
* a call cut short is charged no more than its whole answer, and one the
  gateway's death or its funds cut no more than the tokens its client had
  received (a
  client that leaves is charged what its replica sent within the 2 s the
  gateway reads on for it, ARCHITECTURE.md "Metering", so only the first
  bound applies to it);
* the replica's time a call pays for (the app has a price per second too)
  is within the time its client waited, but for a client that left;
* no call is unpaid, no cash account below zero, the poor consumer's
  charges within the funds it was given;
* each charged call has one app_call transaction, whose legs draw its
  charge from the consumer, credit the publisher the charge less the fee
  (app_platform_fee_ppm, 10% in apps_util.Market) and revenue the fee;
* `gpurentd ledger verify` and the Python auditor pass.

Each call is told apart by its prompt: call n sends n + 1 words (its
record has n + 1 input tokens) and asks for 3 to 120 output tokens
(max_tokens), which the sim replica echoes. GPURENT_CRASH_SEED and
GPURENT_CRASH_ROUNDS (a multiple of the kills below) run it longer, as a
soak."""
import json
import os
import random
import signal
import subprocess
import threading
import time

import requests

from agent_util import poll
from apps_util import DEADLINE, assert_ledger_ok
from money_util import ledger_verify
from test_gateway_hardening import ready_in_copy, topped_up
from test_gateway_journal import journal_lines, price

SEED = int(os.environ.get("GPURENT_CRASH_SEED", "1207"))
ROUNDS = int(os.environ.get("GPURENT_CRASH_ROUNDS", "1"))
# What each round kills: the gateway (4 times, once again just after its
# restart), gpurentd in the middle of a report (twice), both at once.
KILLS = ["gateway"] * 3 + ["gateway twice"] + ["gpurentd"] * 2 + ["both"]
FEE_PPM = 100000  # apps_util.Market's app_platform_fee_ppm
POOR_TOPUP = "0.1"  # yuan, each round: a few calls, some cut mid-stream, then 402s
OUTPUT_PRICE = "0.4"  # yuan per 1k output tokens: 0.0004 a token, a whole answer worth holding
SECOND_PRICE = "0.01"  # yuan per second of the replica's time


def cost(input_tokens, output_tokens, duration_ms):
    """What a call costs at these prices, as gpurentd computes it."""
    return price(input_tokens, output_tokens, p_out=400000) + duration_ms * 10000 // 1000


class Load:
    """Worker threads calling the app in a loop until stopped; each call's
    outcome kept by its number n (its prompt has n + 1 words)."""

    def __init__(self, gw, slug, consumers, seed):
        self.gw, self.slug, self.consumers = gw, slug, consumers
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.next_n = 0
        self.outcomes = {}  # n -> {consumer, kind, max_tokens, status, whole, seen, broken, funds_cut, elapsed_ms}
        self.stopping = threading.Event()
        self.threads = []

    def _take(self):
        with self.lock:
            n = self.next_n
            self.next_n += 1
            out = {"consumer": self.consumers[self.rng.randrange(len(self.consumers))],
                   "kind": self.rng.choice(("json", "stream", "stream", "cut")),
                   "max_tokens": self.rng.randint(3, 120), "status": None, "whole": False, "seen": 0,
                   "broken": False, "funds_cut": None}
            self.outcomes[n] = out
            return n, out, self.rng.randint(1, 3)

    def one(self):
        n, out, leave_after = self._take()
        start = time.monotonic()
        try:
            self._call(n, out, leave_after)
        finally:
            out["elapsed_ms"] = (time.monotonic() - start) * 1000

    def _call(self, n, out, leave_after):
        consumer, kind = out["consumer"], out["kind"]
        out["consumer"] = consumer.id
        body = {"messages": [{"role": "user", "content": " ".join(["w"] * (n + 1))}],
                "max_tokens": out["max_tokens"], "stream": kind != "json"}
        try:
            r = self.gw.call(self.slug, "/v1/chat/completions", consumer.key, json=body, stream=kind != "json",
                             timeout=30)
            out["status"] = r.status_code
            if r.status_code != 200:
                r.close()
                return
            if kind == "json":
                out["seen"] = r.json()["usage"]["completion_tokens"]
                out["whole"] = True
                return
            for line in r.iter_lines():
                if line == b"data: [DONE]":
                    out["whole"] = True
                elif line.startswith(b"data: {"):
                    event = json.loads(line[6:])
                    if "error" in event:
                        out["funds_cut"] = event["error"]["code"]  # its funds ran out mid-stream
                    elif event.get("choices"):
                        out["seen"] += 1
                        if kind == "cut" and out["seen"] >= leave_after:
                            break  # the client leaves mid-stream
            r.close()
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError, ValueError):
            out["broken"] = True  # the gateway died under it, or was down

    def _run(self):
        while not self.stopping.is_set():
            self.one()

    def start(self, workers=4):
        self.stopping.clear()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a call hung"


def serving(gw):
    assert gw.proc.poll() is None, gw.text()[-4000:]
    try:
        return requests.get(gw.url + "/healthz", timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def settled(gw):
    """Waits until the gateway has no call open (a client that left is read
    on for up to 2 s) and its journal holds nothing gpurentd has not
    answered for."""
    poll(lambda: requests.get(gw.url + "/healthz", timeout=10).json()["calls"] == 0, DEADLINE, "no call open")
    poll(lambda: journal_lines(gw) == [], DEADLINE, "every record answered")


def reports_cut(gw):
    """How many of the gateway's reports gpurentd died in the middle of."""
    return sum(1 for line in gw.text().splitlines()
               if "POST /internal/gateway/reports: " in line and "Couldn't connect" not in line)


def kill_gpurentd_mid_report(m, gw, rng):
    """Stops gpurentd at a random moment (inside a report's transaction, or
    between two), lets the gateway's next report reach its socket, then
    SIGKILLs it: the report is cut whatever gpurentd had done of it, and
    `ledger verify` passes on the database it left."""
    m.d.proc.send_signal(signal.SIGSTOP)
    # A record gpurentd has not answered for, then 3 report periods or more:
    # a report of it is sent and waits for its answer.
    poll(lambda: journal_lines(gw) != [], DEADLINE, "a call to report")
    time.sleep(0.15 + rng.uniform(0, 0.1))
    m.d.proc.kill()
    m.d.proc.wait(timeout=30)
    m.d.proc = None
    rc, out = ledger_verify(m.d.db_path)  # what it left, before a start could touch it
    assert rc == 0, out


def check_books(m, app, pub_id, load, poor, poor_funds, when):
    """Every call of the load against its app_calls row and the ledger (see
    the top of this file); when says which round, for the messages."""
    rows = m.d.sql("SELECT id, consumer_id, status, input_tokens, output_tokens, charge, earning, fee, unpaid,"
                   " duration_ms FROM app_calls WHERE app_id = ?", [app["id"]])
    by_call = {}
    for row in rows:
        by_call.setdefault((row[1], row[3] - 1), []).append(row)
    for n, out in sorted(load.outcomes.items()):
        mine = by_call.get((out["consumer"], n), [])
        what = f"{when}: call {n} {out}: {mine}"
        assert len(mine) <= 1, "recorded twice: " + what
        if mine and out["kind"] != "cut":
            # The replica's time it pays for is within the time its client
            # waited (one that leaves pays the 2 s read on for it).
            assert mine[0][9] <= out["elapsed_ms"], "charged time past the call's: " + what
        if out["whole"]:
            # Received whole: charged once, its full price, whatever crashed
            # (the poor consumer's funds held it too, or it was cut).
            assert len(mine) == 1 and mine[0][2] == 200, "a whole answer not charged once: " + what
            assert mine[0][4] == out["max_tokens"] and mine[0][5] == cost(n + 1, out["max_tokens"], mine[0][9]), what
        elif mine and mine[0][2] < 400:
            assert mine[0][4] <= out["max_tokens"] and mine[0][5] <= cost(n + 1, out["max_tokens"], mine[0][9]), what
            if (out["broken"] or out["funds_cut"]) and out["kind"] != "json":
                # Cut by the gateway's death or by its funds: no more than
                # its client received.
                assert mine[0][4] <= out["seen"], "charged past what was delivered: " + what
        else:
            assert all(r[5] == 0 for r in mine), "an error or refusal charged: " + what
    assert [r for r in rows if r[8]] == [], f"{when}: unpaid calls"
    assert all(r[7] == r[5] * FEE_PPM // 1000000 and r[6] == r[5] - r[7] for r in rows), when
    assert sum(r[5] for r in rows if r[1] == poor.id) <= poor_funds, when
    negative = m.d.sql("SELECT id, balance FROM ledger_accounts WHERE id LIKE 'cash:%' AND balance < 0")
    assert negative == [], f"{when}: {negative}"
    legs = m.d.sql("SELECT t.app_call_id, t.id, t.payee_id, p.account_id, p.amount FROM ledger_transactions t"
                   " JOIN ledger_postings p ON p.transaction_id = t.id JOIN app_calls c ON c.id = t.app_call_id"
                   " WHERE t.kind = 'app_call' AND c.app_id = ?", [app["id"]])
    per_call = {}
    for call_id, txn, *_ in legs:
        per_call.setdefault(call_id, set()).add(txn)
    assert per_call.keys() == {r[0] for r in rows if r[5] > 0}, f"{when}: charged calls without a transaction"
    assert all(len(t) == 1 for t in per_call.values()), f"{when}: a call with several transactions"
    assert {leg[2] for leg in legs} <= {pub_id}, when
    drawn = -sum(leg[4] for leg in legs if leg[4] < 0)
    credited = sum(leg[4] for leg in legs if leg[3] == f"cash:{pub_id}")
    fees = sum(leg[4] for leg in legs if leg[3] == "revenue")
    assert (drawn, credited, fees) == (sum(r[5] for r in rows), sum(r[6] for r in rows), sum(r[7] for r in rows)), \
        when
    assert_ledger_ok(m)


def test_money_holds_when_the_gateway_and_gpurentd_are_killed_under_load(market):
    m = market
    rng = random.Random(SEED)
    app, rich = m.running_app(token_ms=5, price_per_1k_output_tokens=OUTPUT_PRICE, price_per_second=SECOND_PRICE)
    [(pub_id,)] = m.d.sql("SELECT publisher_id FROM apps WHERE id = ?", [app["id"]])
    poor, poor_funds = topped_up(m, POOR_TOPUP), 0
    gw = m.gateway(report_ms=50)
    ready_in_copy(m, gw, app["id"])
    m.d.listen = f"127.0.0.1:{m.d.port}"  # restarted on the same port: the gateway knows only that one
    load = Load(gw, app["slug"], [rich, rich, poor], SEED)
    kills = KILLS * ROUNDS
    reports_killed = 0  # gpurentd kills that cut a report (whether one was in flight is timing's)
    rng.shuffle(kills)
    for rnd, what in enumerate(kills):
        when = f"round {rnd}, {what} killed (seed {SEED})"
        if rnd:  # topped up again: its calls are refused, or cut, as its funds run out
            r = m.d.post(f"/v1/admin/users/{poor.id}/topups", key=m.d.admin_key,
                         json={"amount": POOR_TOPUP, "payment_id": f"pay-{poor.id}-{rnd}"})
            assert r.status_code in (200, 201), r.text
        poor_funds += 100000
        load.start()
        time.sleep(rng.uniform(0.3, 1.5))
        if what.startswith("gateway"):
            gw.kill()
            if what == "gateway twice":
                gw.start()  # under load, resending its journal
                time.sleep(rng.uniform(0, 0.3))
                gw.kill()
            load.stop()
            gw.start()
        elif what == "gpurentd":
            cut_before = reports_cut(gw)
            kill_gpurentd_mid_report(m, gw, rng)
            time.sleep(rng.uniform(0, 0.5))  # the gateway serves on from its copy, and journals
            load.stop()
            m.d.start()
            reports_killed += reports_cut(gw) > cut_before
        else:
            kill_gpurentd_mid_report(m, gw, rng)
            time.sleep(rng.uniform(0, 0.5))
            gw.kill()
            load.stop()
            # Started before gpurentd is back: it reads its journal, and
            # serves once its first copy comes.
            gw.proc = subprocess.Popen(gw.args, stdout=open(gw.log, "ab"), stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
            m.d.start()
            poll(lambda: serving(gw), DEADLINE, "the gateway's first copy")
        settled(gw)
        check_books(m, app, pub_id, load, poor, poor_funds, when)
    outcomes = list(load.outcomes.values())
    # The load was what it says: whole answers of each kind, clients that
    # left, calls the gateway's death cut mid-stream, calls refused for funds.
    assert any(o["whole"] and o["kind"] == "json" for o in outcomes)
    assert any(o["whole"] and o["kind"] == "stream" for o in outcomes)
    assert any(o["kind"] == "cut" and o["status"] == 200 and not o["whole"] and not o["broken"] for o in outcomes)
    assert any(o["broken"] and o["status"] == 200 and o["kind"] != "json" for o in outcomes)
    assert any(o["status"] == 402 for o in outcomes)
    assert reports_killed > 0, "no report was in flight when gpurentd was killed alone"
    # Some kill landed mid-answer, and the journal's progress lines made
    # those calls' records at the next start.
    assert "cut short by the last gateway's end" in gw.text(), "no call cut by a kill was recovered from its progress"
