"""money_util.py: helpers and fixtures shared by the money tests
(test_money*.py): integer micro-yuan arithmetic written from the design (not
from the C code), a real gpurentd with a real `gpurent-agent sim-fleet` so
instances run and accrue usage, and `gpurentd ledger verify` after every test.

Amounts
-------
MICRO                    micro-yuan per yuan
PRICE                    seed prices per card-hour, micro-yuan
micro(s) -> int          "9.60" -> 9600000, exact (no float); refuses anything else
accrue(price, cards, s)  floor(price * cards * s / 3600), the billing formula
tariff(prices, model, cards, start, end)  what an interval costs under a price
                         schedule {model: [(effective_at, price)]}
storage_cost(schedule, size_gb, start, end)  what a volume's storage costs under
                         [(effective_at, price per GB-month)]
yuan(micro) -> str       9600000 -> "9.60", as the API writes amounts
iso(t)                   epoch seconds -> "2027-01-15T08:00:00Z"
webhook_headers(secret, body, ts=None)  signed payment-webhook headers

Daemon and fleet
----------------
MONEY_OPTIONS            daemon options: billing only when asked (so each test
                         decides when passes run), fast heartbeats and
                         reconciler, many connections per client
Cluster(daemon, fleets)  a daemon with simulated nodes; see start_cluster()
start_cluster(directory, nodes={"MI450": 4}, options=None, clock=START_TIME)
                         starts gpurentd and one sim-fleet per GPU model,
                         waits for every node to be ready
Cluster methods          signup(**fields) -> Money user (with .id, .key);
                         cli_user() -> user with no credit at all;
                         launch(user, gpu, cards) -> instance id once running
                         (the clock does not move while it provisions, so its
                         running interval starts at the clock's value);
                         stop(user, iid); wait_state(user, iid, states);
                         billing() -> pass summary; balance(user, session=None) -> dict of
                         micro ints; topup(user, amount, payment_id, reason=None);
                         grant(user, amount, expires_at=None, reason=None) -> grant id;
                         spent(user) -> micro spent on usage (from the ledger);
                         verify() -> runs `gpurentd ledger verify`
ledger_verify(db_path) -> (exit code, output) of `gpurentd ledger verify`
ledger_breaches(con) -> [str]  the same invariants read from the raw rows in
                         Python (empty: all good), cheap enough for every
                         step of a random test; the real command is the
                         judge and runs less often

Fixtures (import them into a test module: `from money_util import *`)
--------
money_cluster            one Cluster per module (MI450 x 4 nodes, MI300X x 2)
cluster_fixture(nodes, options)  makes another module-scoped cluster fixture
new_cluster              factory for tests that need their own daemon; each
                         one's ledger is verified before it is stopped
verify_ledgers           autouse: after each test, `gpurentd ledger verify`
                         must pass on the module's money_cluster
"""
import contextlib
import datetime
import hashlib
import hmac
import os
import re
import signal
import threading
import time

import pytest

from agent_util import Fleet, pause, poll
from harness import START_TIME, Daemon, run_gpurentd, unique_email

MICRO = 1_000_000
PRICE = {"MI450": 1_200_000, "MI300X": 2_200_000, "RTX4090": 900_000}
IMAGE = "rocm/pytorch:2.3-rocm6.2"
SIM_ZERO = {"sim_pull_ms": "0", "sim_mount_ms": "0", "sim_start_ms": "0"}
MONEY_OPTIONS = {
    "billing_interval_ms": "3600000",      # passes only when a test asks for one
    "heartbeat_interval_ms": "200",
    "reconcile_interval_ms": "100",
    "reconcile_sweep_ms": "500",
    "max_connections_per_client": "1000",  # the concurrency tests open hundreds
    "max_connections": "2000",
    "threads": "16",
    # The default volumes are directories of this machine, which every sim
    # node of it shares (multi-node instances need that said).
    "volume_source_shared": "true",
}
_AMOUNT = re.compile(r"^(-?)(0|[1-9][0-9]*)\.([0-9]{2,6})$")


def micro(s):
    """An amount the API showed ("9.60", "-0.000333") as integer micro-yuan.
    Every amount the API shows has 2 to 6 fraction digits."""
    m = _AMOUNT.match(s)
    assert m, f"not an API amount: {s!r}"
    v = int(m.group(2)) * MICRO + int(m.group(3).ljust(6, "0"))
    return -v if m.group(1) else v


def yuan(v):
    """Micro-yuan as the API writes them: 2 to 6 fraction digits."""
    sign = "-" if v < 0 else ""
    v = abs(v)
    frac = f"{v % MICRO:06d}".rstrip("0").ljust(2, "0")
    return f"{sign}{v // MICRO}.{frac}"


def accrue(price, cards, seconds):
    return price * cards * seconds // 3600


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_iso(s):
    return int(datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp())


class User:
    def __init__(self, id, key, email):
        self.id, self.key, self.email = id, key, email

    def __repr__(self):
        return f"User({self.id})"


def webhook_headers(secret, body, ts=None):
    """The payment provider's headers: hex HMAC-SHA256 of "TIMESTAMP.BODY"
    keyed with the shared secret, the timestamp in wall-clock seconds."""
    ts = str(int(time.time()) if ts is None else ts)
    if isinstance(body, str):
        body = body.encode()
    sig = hmac.new(secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"X-Gpurent-Webhook-Timestamp": ts, "X-Gpurent-Webhook-Signature": sig,
            "Content-Type": "application/json"}


def ledger_verify(db_path):
    """Runs `gpurentd ledger verify --db`; returns (exit code, output)."""
    p = run_gpurentd("ledger", "verify", "--db", db_path, timeout=120)
    return p.returncode, p.stdout + p.stderr


def kill_during_passes(c, rng, rounds, step, seed, skip_every=4, between=None):
    """The crash harness: `rounds` times, the clock moves on by
    rng.randint(*step) seconds, a billing pass is asked for (in every round
    but each skip_every-th), and gpurentd is killed with SIGKILL within 12
    ms, whatever it is doing; `ledger verify` must pass on what it left, and
    it is started again, then between(round) runs if given. Returns how many
    of the passes asked for were cut before they answered."""
    cut = []

    def ask_for_a_pass():
        try:
            c.admin("POST", "/v1/admin/billing/run", json={}, timeout=5)
        except Exception:
            cut.append(1)  # killed before it answered

    for rnd in range(rounds):
        c.d.advance_clock(rng.randint(*step))
        if rnd % skip_every != skip_every - 1:
            threading.Thread(target=ask_for_a_pass, daemon=True).start()
        time.sleep(rng.uniform(0, 0.012))
        c.d.proc.kill()
        c.d.proc.wait(timeout=30)
        c.d.proc = None
        rc, out = ledger_verify(c.d.db_path)
        assert rc == 0, f"after kill {rnd} (seed {seed}):\n{out}"
        c.d.start()
        if between:
            between(rnd)
    return len(cut)


def tariff(prices, model, cards, start, end):
    """What an interval costs under the price schedule [(effective_at,
    price)], each price piece by the formula."""
    total, pts = 0, prices.get(model, [])
    for k, (eff, p) in enumerate(pts):
        lo = max(eff, start)
        hi = min(pts[k + 1][0], end) if k + 1 < len(pts) else end
        if hi > lo:
            total += accrue(p, cards, hi - lo)
    return total


def ledger_breaches(con):
    """The ledger's invariants (the design's money rules), checked from the
    raw rows of an open sqlite3 connection in plain Python rather than in
    SQL: every transaction balances and has two postings or more; cached
    balances equal their postings; all balances sum to zero; no user account
    (cash or grant) ever below zero, posting by posting; each grant funded
    exactly its amount once, never drawn beyond it net of what refunds gave
    back, its remaining equal to its account, nothing left once voided,
    every grant leg naming its grant; each interval's revenue equal to what
    it says was billed, settled only once ended, and then billed exactly its
    tariff, and never more than that to its end or latest charge before;
    each refund naming its interval and moving only revenue back to
    its user's cash and grants, never giving an account more than it paid
    for that interval; each top-up adding its amount in cash. Returns a list
    of breaches, empty when all hold. Read it in one transaction so that it
    sees one snapshot."""
    out = []
    accounts = {a: (kind, bal, uid) for a, kind, bal, uid in
                con.execute("SELECT id, kind, balance, user_id FROM ledger_accounts")}
    txns = {t: (kind, iv, top, uid) for t, kind, iv, top, uid in
            con.execute("SELECT id, kind, interval_id, topup_id, user_id FROM ledger_transactions")}
    txn_sum, txn_legs, acct_sum, low = {}, {}, {}, {}
    funded, drawn, revenue, topup_cash, paid = {}, {}, {}, {}, {}
    for pid, txn, acct, amount, grant in con.execute(
            "SELECT id, transaction_id, account_id, amount, grant_id FROM ledger_postings ORDER BY id"):
        txn_sum[txn] = txn_sum.get(txn, 0) + amount
        txn_legs[txn] = txn_legs.get(txn, 0) + 1
        acct_sum[acct] = acct_sum.get(acct, 0) + amount
        kind, _, owner = accounts.get(acct, ("?", 0, None))
        if kind in ("cash", "grant"):
            low[acct] = min(low.get(acct, 0), acct_sum[acct])
        if acct.startswith("grant:") and grant != acct[len("grant:"):]:
            out.append(f"posting {pid} on {acct} names grant {grant}")
        t = txns.get(txn)
        if t is None:
            out.append(f"posting {pid} belongs to no transaction ({txn})")
            continue
        if acct.startswith("grant:"):
            # Funded by its grant transaction; drawn (usage, expiry) net of
            # what refunds gave back.
            g = acct[len("grant:"):]
            if t[0] == "grant":
                funded[g] = funded.get(g, 0) + amount
            else:
                drawn[g] = drawn.get(g, 0) - amount
        if acct == "revenue" and t[1] is not None:
            revenue[t[1]] = revenue.get(t[1], 0) + amount
        if kind == "cash" and t[2] is not None:
            topup_cash[t[2]] = topup_cash.get(t[2], 0) + amount
        if t[0] in ("usage", "refund") and kind in ("cash", "grant"):
            paid[(t[1], acct)] = paid.get((t[1], acct), 0) - amount
        if t[0] == "refund" and not ((kind == "revenue" and amount < 0) or
                                     (kind in ("cash", "grant") and amount > 0 and owner == t[3])):
            out.append(f"refund {txn} moves {amount} on {acct}, not revenue back to its user's funds")
    for t, (kind, iv, _, _) in txns.items():
        if txn_sum.get(t, 0) != 0:
            out.append(f"transaction {t} sums to {txn_sum[t]}")
        if txn_legs.get(t, 0) < 2:
            out.append(f"transaction {t} has {txn_legs.get(t, 0)} postings")
        if kind == "refund" and iv is None:
            out.append(f"refund {t} names no interval")
    for (iv, acct), v in paid.items():
        if v < 0:
            out.append(f"{acct} was refunded {-v} more than it paid for interval {iv}")
    for a, (kind, bal, _) in accounts.items():
        if bal != acct_sum.get(a, 0):
            out.append(f"account {a} caches {bal}, its postings sum to {acct_sum.get(a, 0)}")
    for a in acct_sum:
        if a not in accounts:
            out.append(f"postings on {a}, an account that does not exist")
    if sum(bal for _, bal, _ in accounts.values()) != 0:
        out.append(f"balances sum to {sum(bal for _, bal, _ in accounts.values())}")
    for a, v in low.items():
        if v < 0:
            out.append(f"user account {a} went down to {v}")
    for g, amount, remaining, voided in con.execute("SELECT id, amount, remaining, voided_at FROM credit_grants"):
        if funded.get(g, 0) != amount:
            out.append(f"grant {g} of {amount} was funded {funded.get(g, 0)}")
        if drawn.get(g, 0) > amount:
            out.append(f"grant {g} of {amount} was drawn {drawn[g]}")
        if remaining != accounts.get(f"grant:{g}", (None, 0, None))[1]:
            out.append(f"grant {g} has {remaining} remaining, its account "
                       f"{accounts.get(f'grant:{g}', (None, 0, None))[1]}")
        if voided is not None and remaining != 0:
            out.append(f"grant {g} was voided with {remaining} remaining")
    last_usage = dict(con.execute("SELECT interval_id, max(at) FROM ledger_transactions"
                                  " WHERE kind = 'usage' AND interval_id IS NOT NULL GROUP BY interval_id"))
    prices = {}
    for model, eff, price in con.execute("SELECT gpu_model, effective_at, card_hour FROM prices"
                                         " ORDER BY gpu_model, effective_at"):
        prices.setdefault(model, []).append((eff, price))
    for iv, model, cards, start, end, billed, settled in con.execute(
            "SELECT id, gpu_model, card_count, started_at, ended_at, billed, settled FROM running_intervals"):
        if revenue.get(iv, 0) != billed:
            out.append(f"interval {iv} says {billed} billed, its revenue is {revenue.get(iv, 0)}")
        if settled and end is None:
            out.append(f"interval {iv} is settled while still open")
        elif settled and billed != tariff(prices, model, cards, start, end):
            due = tariff(prices, model, cards, start, end)
            out.append(f"settled interval {iv} billed {billed}, its tariff is {due}")
        elif not settled and billed:
            # Never more than its tariff to its end or, while it runs, to
            # its latest charge: time not known to have run is not kept.
            upto = min(e for e in (end, last_usage.get(iv, 0)) if e is not None)
            due = tariff(prices, model, cards, start, max(start, upto))
            if billed > due:
                out.append(f"interval {iv} billed {billed}, beyond its tariff {due} to {upto}")
    for top, amount in con.execute("SELECT id, amount FROM topups"):
        if topup_cash.get(top, 0) != amount:
            out.append(f"top-up {top} of {amount} added {topup_cash.get(top, 0)} cash")
    out += storage_breaches(con)
    return out


def storage_cost(schedule, size_gb, start, end):
    """What a volume costs under [(effective_at, price per GB-month)]: each
    price piece floor(price x size_gb x seconds / 2 592 000), a month being
    30 days."""
    total = 0
    for k, (eff, p) in enumerate(schedule):
        lo = max(eff, start)
        hi = min(schedule[k + 1][0], end) if k + 1 < len(schedule) else end
        if hi > lo:
            total += p * size_gb * (hi - lo) // 2_592_000
    return total


def storage_breaches(con):
    """The storage rules (migration 0020) from the raw rows: each storage
    transaction names a volume of its user and moves only that user's funds
    to revenue; each volume's revenue is what it says was billed; a settled
    volume is deleted and billed exactly its tariff from creation to
    deletion, any other never more than its tariff to its deletion or, while
    it exists, its latest charge. A region's schedule is the global prices
    before its own first price, then its own."""
    out = []
    if not con.execute("SELECT 1 FROM sqlite_schema WHERE name = 'storage_prices'").fetchall():
        return out
    prices = {}
    for region, eff, price in con.execute("SELECT region, effective_at, gb_month FROM storage_prices"
                                          " ORDER BY region, effective_at"):
        prices.setdefault(region, []).append((eff, price))

    def schedule(region):
        own = prices.get(region, []) if region else []
        return [pt for pt in prices.get("", []) if not own or pt[0] < own[0][0]] + own
    owner = dict(con.execute("SELECT id, user_id FROM volumes"))
    revenue, last = {}, {}
    for txn, uid, vid, at in con.execute("SELECT id, user_id, volume_id, at FROM ledger_transactions"
                                         " WHERE kind = 'storage'"):
        if vid is None or owner.get(vid) != uid:
            out.append(f"storage transaction {txn} names volume {vid}, not one of {uid}'s")
        last[vid] = max(last.get(vid, 0), at)
        for acct, amount, kind, acct_user in con.execute(
                "SELECT p.account_id, p.amount, a.kind, a.user_id FROM ledger_postings p"
                " JOIN ledger_accounts a ON a.id = p.account_id WHERE p.transaction_id = ?", (txn,)):
            if kind == "revenue" and amount > 0:
                revenue[vid] = revenue.get(vid, 0) + amount
            elif not (kind in ("cash", "grant") and amount < 0 and acct_user == uid):
                out.append(f"storage transaction {txn} moves {amount} on {acct}")
    for vid, region, size, created, deleted, billed, settled in con.execute(
            "SELECT id, region, size_gb, created_at, deleted_at, storage_billed, storage_settled FROM volumes"):
        if revenue.get(vid, 0) != billed:
            out.append(f"volume {vid} says {billed} billed, its storage revenue is {revenue.get(vid, 0)}")
        end = deleted if deleted is not None else last.get(vid, created)
        due = storage_cost(schedule(region), size, created, max(end, created))
        if settled and (deleted is None or billed != due):
            out.append(f"settled volume {vid} billed {billed}, its tariff is {due} (deleted {deleted})")
        elif not settled and billed > due:
            out.append(f"volume {vid} billed {billed}, beyond its tariff {due}")
    return out


class Cluster:
    """A gpurentd with simulated nodes, and the money operations tests use."""

    def __init__(self, daemon, fleets):
        self.d = daemon
        self.fleets = fleets

    # ------------------------------------------------------------ users

    def signup(self, **fields):
        acct = self.d.signup(**fields)
        return User(acct.id, acct.key, acct.email)

    def cli_user(self):
        """An account made by `gpurentd admin create-user`: no trial credit."""
        email = unique_email("cash")
        key = self.d.cli_create_user(email)
        r = self.d.get("/v1/me", key=key)
        assert r.status_code == 200, r.text
        return User(r.json()["id"], key, email)

    # ------------------------------------------------------------ money

    def admin(self, method, path, **kw):
        return self.d.request(method, path, key=self.d.admin_key, **kw)

    def billing(self):
        r = self.admin("POST", "/v1/admin/billing/run", json={})
        assert r.status_code == 200, r.text
        return r.json()

    def balance(self, user, session=None):
        r = self.d.get("/v1/balance", key=user.key, session=session)
        assert r.status_code == 200, r.text
        b = r.json()
        out = {k: micro(b[k]) for k in ("cash", "credit", "unbilled", "available", "burn_rate_per_hour")}
        out["grants"] = {g["id"]: dict(g, amount=micro(g["amount"]), remaining=micro(g["remaining"]))
                         for g in b["grants"]}
        out["raw"] = b
        return out

    def topup(self, user, amount, payment_id=None, reason=None):
        body = {"amount": yuan(amount), "payment_id": payment_id or f"pay-{os.urandom(8).hex()}"}
        if reason is not None:
            body["reason"] = reason
        r = self.admin("POST", f"/v1/admin/users/{user.id}/topups", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def grant(self, user, amount, expires_at=None, reason=None):
        body = {"amount": yuan(amount)}
        if expires_at is not None:
            body["expires_at"] = iso(expires_at)
        if reason is not None:
            body["reason"] = reason
        r = self.admin("POST", f"/v1/admin/users/{user.id}/grants", json=body)
        assert r.status_code == 201, r.text
        return r.json()["grant_id"]

    def set_price(self, gpu, price, effective_at):
        r = self.admin("PUT", f"/v1/admin/prices/{gpu}",
                       json={"price_per_card_hour": yuan(price), "effective_at": iso(effective_at)})
        assert r.status_code == 200, r.text
        return r.json()

    def spent(self, user):
        """Micro-yuan the user's funds paid for usage, from the ledger rows."""
        rows = self.d.sql(
            "SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t"
            " ON t.id = p.transaction_id JOIN ledger_accounts a ON a.id = p.account_id"
            " WHERE t.kind = 'usage' AND t.user_id = ? AND a.kind IN ('cash', 'grant')", (user.id,))
        return rows[0][0]

    def transactions(self, user, **params):
        out, cursor = [], None
        while True:
            q = dict(params, limit=200)
            if cursor:
                q["cursor"] = cursor
            r = self.d.get("/v1/transactions", key=user.key, params=q)
            assert r.status_code == 200, r.text
            out += r.json()["data"]
            cursor = r.json()["next_cursor"]
            if not cursor:
                return out

    def intervals(self, iid):
        """(started_at, ended_at, billed, settled, end_reason) of each running interval."""
        return self.d.sql("SELECT started_at, ended_at, billed, settled, end_reason FROM running_intervals"
                          " WHERE instance_id = ? ORDER BY id", (iid,))

    def verify(self):
        rc, out = ledger_verify(self.d.db_path)
        assert rc == 0 and out.strip().splitlines()[-1] == "ledger OK", f"ledger verify failed ({rc}):\n{out}"

    # ------------------------------------------------------------ instances

    def create(self, user, gpu="MI450", cards=8, **kw):
        return self.d.post("/v1/instances", key=user.key,
                           json={"gpu_type": gpu, "card_count": cards, "image": IMAGE}, **kw)

    def instance(self, user, iid):
        r = self.d.get(f"/v1/instances/{iid}", key=user.key)
        assert r.status_code == 200, r.text
        return r.json()

    def wait_state(self, user, iid, states, timeout=30):
        states = {states} if isinstance(states, str) else set(states)

        def check():
            body = self.instance(user, iid)
            if body["state"] in ("failed", "lost") and body["state"] not in states:
                raise AssertionError(f"instance {iid} went {body['state']}: {body['state_reason']}")
            return body if body["state"] in states else None
        return poll(check, timeout, f"instance {iid} to reach {sorted(states)}")

    def launch(self, user, gpu="MI450", cards=8):
        """Creates an instance and waits (without moving the clock) until it runs."""
        r = self.create(user, gpu, cards)
        assert r.status_code == 201, r.text
        iid = r.json()["id"]
        self.wait_state(user, iid, "running")
        return iid

    def stop(self, user, iid, wait=True):
        r = self.d.post(f"/v1/instances/{iid}/stop", key=user.key)
        assert r.status_code == 200, r.text
        if wait:
            self.wait_state(user, iid, "stopped")
        return r.json()

    def start(self, user, iid):
        return self.d.post(f"/v1/instances/{iid}/start", key=user.key)

    def events(self, user, iid):
        r = self.d.get(f"/v1/instances/{iid}/events", key=user.key, params={"limit": 500})
        assert r.status_code == 200, r.text
        return r.json()["data"]

    def wait_idle(self, timeout=30):
        """Waits until no instance is between states (every wind-down finished)."""
        poll(lambda: not self.d.sql("SELECT 1 FROM instances WHERE state IN ('pending', 'provisioning', 'stopping')"
                                    " LIMIT 1"), timeout, "every instance to settle")

    # ------------------------------------------------------------ lifecycle

    def close(self):
        """Stops the daemon (asserting a clean exit) and the fleets; kills
        whatever does not stop, so nothing outlives the test."""
        errors = []
        try:
            self.d.stop()
        except Exception as e:
            errors.append(f"gpurentd: {e}")
            self.d.kill()
        for f in self.fleets:
            try:
                f.stop()
            except Exception as e:
                errors.append(f"sim-fleet: {e}")
                if f.proc.poll() is None:
                    f.proc.kill()
                    f.proc.wait()
        assert not errors, "\n\n".join(errors)


def start_cluster(directory, nodes=None, options=None, clock=START_TIME, fleet_options=None):
    """gpurentd plus one sim-fleet per GPU model in nodes {model: count};
    fleet_options are the fleets' settings beyond SIM_ZERO."""
    nodes = {"MI450": 4} if nodes is None else nodes
    d = Daemon(os.path.join(str(directory), "daemon"), options={**MONEY_OPTIONS, **(options or {})}, clock=clock)
    fleets = []
    try:
        for model, count in nodes.items():
            f = Fleet(os.path.join(str(directory), f"fleet-{model.lower()}"), d.base_url, nodes=count, model=model,
                      admin_key=d.admin_key, options={**SIM_ZERO, **(fleet_options or {})}, start=False)
            fleets.append(f)
            f.start()
        want = sum(nodes.values())

        def ready():
            r = d.get("/v1/admin/nodes", key=d.admin_key, params={"limit": 100})
            assert r.status_code == 200, r.text
            data = r.json()["data"]
            return len(data) >= min(want, 100) and all(n["state"] == "ready" for n in data)
        if want:
            poll(ready, 60, "every simulated node to be ready")
    except BaseException:
        d.kill()
        for f in fleets:
            if f.proc and f.proc.poll() is None:
                f.proc.kill()
                f.proc.wait()
        raise
    return Cluster(d, fleets)


@contextlib.contextmanager
def quiet(fleet):
    """The fleet's agents stop answering inside the block (SIGSTOP): they
    accept connections and answer nothing, as a hung host does."""
    pause(fleet.proc)
    try:
        yield
    finally:
        fleet.proc.send_signal(signal.SIGCONT)


# ---------------------------------------------------------------- fixtures

_LIVE = []  # clusters whose ledgers are verified after each test


def cluster_fixture(nodes=None, options=None):
    """A module-scoped fixture: one Cluster for the module, its ledger
    verified after each test."""
    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory):
        c = start_cluster(tmp_path_factory.mktemp("money"), nodes=nodes, options=options)
        _LIVE.append(c)
        try:
            yield c
        finally:
            _LIVE.remove(c)
            c.close()
    return fixture


money_cluster = cluster_fixture({"MI450": 4, "MI300X": 2})


@pytest.fixture
def new_cluster(tmp_path):
    made = []

    def make(**kw):
        c = start_cluster(tmp_path / f"c{len(made)}", **kw)
        made.append(c)
        _LIVE.append(c)
        return c
    yield make
    for c in made:
        _LIVE.remove(c)
    errors = []
    for c in made:
        try:
            if c.d.running:
                c.verify()
        except Exception as e:
            errors.append(str(e))
        try:
            c.close()
        except Exception as e:
            errors.append(str(e))
    assert not errors, "\n\n".join(errors)


@pytest.fixture(autouse=True)
def verify_ledgers():
    """`gpurentd ledger verify` passes on every money daemon after each test."""
    yield
    for c in list(_LIVE):
        c.verify()


# ---------------------------------------------------------------- reference model

class RefModel:
    """What the money rules say each user's funds and spend are, in plain
    integer Python, fed the same operations as the daemon.

    Billing is lazy, as the design describes it: a pass at `now` recomputes
    every unsettled interval from its start, so its outcome depends only on
    what happened before it, not on when earlier passes ran. Per user, each
    grant expiry E up to now is a checkpoint: usage up to E is paid with the
    funds valid in the second before E (so a grant pays for usage up to its
    expiry), then what is left of grants expiring at E is void. When what is
    due exceeds the funds, billing ends at the last second s they cover (due
    is floor(price x cards x seconds / 3600) per price piece, so the search is
    over whole seconds) and every interval of the user is cut at s, or at its
    billable end when that is sooner. Usage draws grants soonest expiry first
    (never-expiring last; then by creation time and id), then cash.

    Only time known to have run is charged: an open interval of an instance
    in caps (its node missed a heartbeat) is billed up to caps[iid], that
    node's last good heartbeat. An interval whose end moves below what it was
    charged (closed, or settled by a pass, there) gets the difference back:
    a refund to the accounts that paid it, the one whose latest posting on it
    is newest first; credit given back to a grant already voided is voided
    again, and a voided grant whose expiry a stepped-back clock has not yet
    reached gets back all its voids took. Each interval keeps its postings
    (paid: [seq, account, amount], account a grant id or "cash") for that
    order. Intervals are billed in the
    daemon's order, by id when the test has set it (open_interval(id=...)).

    users[uid] = {"cash": int, "grants": {gid: grant}, "intervals": [iv],
                  "charged": usage posted, "refunded": refunds posted}
    grant = {"amount", "remaining", "expires": int or None, "created", "voided",
             "void_took": what its voids took, given back if the clock steps back before "expires"}
    iv = {"iid", "model", "cards", "start", "end" (None while open), "billed",
          "settled", "id" (the daemon's, or None), "paid"}
    """

    def __init__(self, prices=None):
        self.prices = {m: [(0, p)] for m, p in (prices or PRICE).items()}
        self.users = {}
        self.caps = {}   # iid -> last good heartbeat of its silent node
        self.seq = 0     # postings, in the order the daemon writes them

    # ---- operations the tests perform

    def add_user(self, uid):
        self.users[uid] = {"cash": 0, "grants": {}, "intervals": [], "charged": 0, "refunded": 0}

    def grant(self, uid, gid, amount, expires, created):
        self.users[uid]["grants"][gid] = {"amount": amount, "remaining": amount, "expires": expires,
                                          "created": created, "voided": False, "void_took": 0}

    def topup(self, uid, amount):
        self.users[uid]["cash"] += amount

    def set_price(self, model, price, effective_at):
        pts = [p for p in self.prices[model] if p[0] != effective_at] + [(effective_at, price)]
        self.prices[model] = sorted(pts)

    def open_interval(self, uid, iid, model, cards, start, id=None):
        self.users[uid]["intervals"].append({"iid": iid, "model": model, "cards": cards, "start": start,
                                             "end": None, "billed": 0, "settled": False, "id": id, "paid": []})

    def open_of(self, uid, iid):
        """The instance's open interval, or None."""
        for iv in self.users[uid]["intervals"]:
            if iv["iid"] == iid and iv["end"] is None:
                return iv
        return None

    def drop_open(self, uid, iid):
        """Forgets the instance's open interval: the daemon never opened it
        (the job ended before every node was seen running)."""
        self.users[uid]["intervals"].remove(self.open_of(uid, iid))

    def close_interval(self, uid, iid, at):
        """Ends the open interval at max(start, at), refunding what it was
        charged past there (ledger_close_interval)."""
        iv = self.open_of(uid, iid)
        if iv is None:
            return
        iv["end"] = max(iv["start"], at)
        due = self.due(iv, iv["end"])
        if due < iv["billed"]:
            self._refund(uid, iv, iv["billed"] - due)
            iv["billed"] = due

    # ---- what the rules derive

    def price_at(self, model, t):
        price = None
        for eff, p in self.prices[model]:
            if eff <= t:
                price = p
        return price

    def billable_end(self, iv, t):
        """How far the interval may be billed at t: its end, or t, and for an
        open one never past its silent node's last good heartbeat."""
        if iv["end"] is not None:
            return min(iv["end"], t)
        cap = self.caps.get(iv["iid"])
        return t if cap is None else min(t, cap)

    def due(self, iv, t):
        end = self.billable_end(iv, t)
        total, pts = 0, self.prices[iv["model"]]
        for k, (eff, p) in enumerate(pts):
            lo = max(eff, iv["start"])
            hi = min(pts[k + 1][0], end) if k + 1 < len(pts) else end
            if hi > lo:
                total += accrue(p, iv["cards"], hi - lo)
        return total

    def spendable(self, uid, at):
        """Grants usable for the second before `at`, in draw order."""
        gs = [(gid, g) for gid, g in self.users[uid]["grants"].items()
              if not g["voided"] and g["remaining"] > 0 and (g["expires"] is None or g["expires"] > at - 1)]
        return sorted(gs, key=lambda x: (x[1]["expires"] is None, x[1]["expires"] or 0, x[1]["created"], x[0]))

    def funds(self, uid, now):
        """Cash and credit valid at now, as posted."""
        u = self.users[uid]
        return u["cash"] + sum(g["remaining"] for _, g in self.spendable(uid, now + 1))

    def unbilled(self, uid, now):
        """Usage accrued up to now and not yet posted."""
        return sum(max(0, self.due(iv, now) - iv["billed"]) for iv in self.unsettled(uid))

    def available(self, uid, now):
        """What the balance says is left to spend: posted funds less unbilled
        usage (credit that expired since the last pass counts for nothing)."""
        return max(0, self.funds(uid, now) - self.unbilled(uid, now))

    def grant_shown(self, uid, gid, now):
        g = self.users[uid]["grants"][gid]
        return 0 if g["expires"] is not None and g["expires"] <= now else g["remaining"]

    def spent(self, uid):
        """Usage net of refunds."""
        return sum(iv["billed"] for iv in self.users[uid]["intervals"])

    def unsettled(self, uid):
        """Unsettled intervals in the order the daemon bills them."""
        ivs = [iv for iv in self.users[uid]["intervals"] if not iv["settled"]]
        return sorted(ivs, key=lambda iv: (iv["id"] is None, iv["id"] or 0))

    def _owed(self, ivs, t):
        return sum(max(0, self.due(iv, t) - iv["billed"]) for iv in ivs)

    def _post(self, iv, account, amount):
        self.seq += 1
        iv["paid"].append((self.seq, account, amount))

    def _charge(self, uid, amount, at, iv):
        u = self.users[uid]
        u["charged"] += amount
        for gid, g in self.spendable(uid, at):
            if amount == 0:
                break
            take = min(g["remaining"], amount)
            g["remaining"] -= take
            amount -= take
            self._post(iv, gid, take)
        if amount:
            assert amount <= u["cash"], "the model overdrew cash"
            u["cash"] -= amount
            self._post(iv, "cash", amount)

    def payers(self, iv):
        """[(account, net paid)] for the interval, the latest posted first."""
        net, last = {}, {}
        for seq, account, amount in iv["paid"]:
            net[account] = net.get(account, 0) + amount
            last[account] = seq
        return [(a, net[a]) for a in sorted(net, key=lambda a: -last[a]) if net[a] > 0]

    def _refund(self, uid, iv, amount):
        u = self.users[uid]
        u["refunded"] += amount
        for account, paid in self.payers(iv):
            if amount == 0:
                break
            take = min(paid, amount)
            if account == "cash":
                u["cash"] += take
            elif not u["grants"][account]["voided"]:
                u["grants"][account]["remaining"] += take
            else:  # given back and voided again
                u["grants"][account]["void_took"] += take
            amount -= take
            self._post(iv, account, -take)
        assert amount == 0, "the model refunded more than the interval was charged"

    def _expire(self, uid, at):
        for g in self.users[uid]["grants"].values():
            if not g["voided"] and g["remaining"] > 0 and g["expires"] is not None and g["expires"] <= at:
                g["void_took"] = g["remaining"]
                g["remaining"] = 0
                g["voided"] = True

    def _unexpire(self, now):
        """A grant voided at an expiry still ahead of now (the clock ran
        ahead, then stepped back) gets back what its voids took."""
        for u in self.users.values():
            for g in u["grants"].values():
                if g["voided"] and g["expires"] > now:
                    g["remaining"], g["void_took"], g["voided"] = g["void_took"], 0, False

    def _bill_until(self, uid, t):
        """Returns the second funds ran out at, or None."""
        ivs = self.unsettled(uid)
        if not ivs:
            return None
        funds = self.users[uid]["cash"] + sum(g["remaining"] for _, g in self.spendable(uid, t))
        until, exhausted = t, self._owed(ivs, t) > funds
        if exhausted:
            lo, hi = min(iv["start"] for iv in ivs), t
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._owed(ivs, mid) <= funds:
                    lo = mid
                else:
                    hi = mid - 1
            until = lo
        for iv in ivs:
            d = self.due(iv, until)
            settled = exhausted or (iv["end"] is not None and iv["end"] <= until)
            if exhausted:
                cut = self.billable_end(iv, until)
                if iv["end"] is None or iv["end"] > cut:
                    iv["end"] = max(iv["start"], cut)
            if d > iv["billed"]:
                self._charge(uid, d - iv["billed"], until, iv)
                iv["billed"] = d
            elif settled and d < iv["billed"]:
                self._refund(uid, iv, iv["billed"] - d)
                iv["billed"] = d
            iv["settled"] = settled
        return until if exhausted else None

    def billing_pass(self, now):
        """Returns {uid: second its funds ran out} for users stopped."""
        stopped = {}
        for uid in sorted(self.users):
            if not self.unsettled(uid):
                continue
            expiries = sorted({g["expires"] for g in self.users[uid]["grants"].values()
                               if not g["voided"] and g["remaining"] > 0 and g["expires"] is not None
                               and g["expires"] <= now})
            for e in expiries:
                out = self._bill_until(uid, e)
                if out is not None:
                    stopped[uid] = out
                self._expire(uid, e)
            out = self._bill_until(uid, now)
            if out is not None:
                stopped[uid] = out
        self._unexpire(now)
        for uid in self.users:
            if not self.unsettled(uid):
                self._expire(uid, now)
        return stopped

    def min_run_need(self, uid, model, cards, now, held, minutes=10):
        """Funds a create/start needs: a minimum run of it and of every card
        the user holds (held: {model: cards})."""
        need = accrue(self.price_at(model, now), cards, minutes * 60)
        for m, n in held.items():
            need += accrue(self.price_at(m, now), n, minutes * 60)
        return need


def charged_usage(cloud, u):
    """Micro-yuan the user paid for usage, refunds counted (a billing pass first)."""
    r = cloud.admin("POST", "/v1/admin/billing/run", json={})
    assert r.status_code == 200, r.text
    return cloud.d.sql(
        "SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t"
        " ON t.id = p.transaction_id JOIN ledger_accounts a ON a.id = p.account_id"
        " WHERE t.kind IN ('usage', 'refund') AND t.user_id = ? AND a.kind IN ('cash', 'grant')", (u.id,))[0][0]
