"""test_money_model.py: model-based random test of billing against the real
daemon and simulated nodes. Each seed drives a fresh gpurentd through a few
hundred random steps (sign-ups, admin and webhook top-ups, repeated payment
ids, admin grants, some expiring, price changes, launches, starts, stops,
clock jumps large and small or to the exact second funds or credit run out,
and billing passes). The same steps feed RefModel (money_util), plain
integer Python. After every step:

* the ledger's invariants hold, read from the database's raw rows
  (money_util.ledger_breaches, the rules `gpurentd ledger verify` checks);
* each user's cash, every grant's remainder and whether it was voided, spend
  and running intervals (start, end, charge, settled) equal the model's, and
  so does whether each instance is meant to run;
* each user's balance from the API (cash, credit, grants, unbilled usage,
  what is left to spend) equals the model's.

After every billing pass the instances' observed states must equal the
model's too. The real `gpurentd ledger verify` runs every CLI_EVERY steps
and at the end of each seed (spawning it every step would cost more than the
rest of the step under ASan). Launches and starts are predicted: 402 exactly
when the model says what is left does not cover a minimum run.

MONEY_MODEL_SEED=N reruns one seed; MONEY_MODEL_SEEDS sets how many seeds
(default 6), MONEY_MODEL_STEPS the steps per seed (default 500),
MONEY_MODEL_CLI_EVERY how often the command runs. A failure names its seed
and the last steps taken."""
import copy
import json
import os
import random
import signal
import sqlite3
import time

import pytest
import requests

from agent_util import poll
from money_util import (MICRO, PRICE, RefModel, accrue, ledger_breaches, ledger_verify, new_cluster,  # noqa: F401
                        webhook_headers, yuan)
from ops_util import reconcile

SECRET = "whsec-model"
STEPS = int(os.environ.get("MONEY_MODEL_STEPS", "500"))
CLI_EVERY = int(os.environ.get("MONEY_MODEL_CLI_EVERY", "50"))
if os.environ.get("MONEY_MODEL_SEED"):
    SEEDS = [int(os.environ["MONEY_MODEL_SEED"])]
else:
    _base = random.randrange(1, 10**6)
    SEEDS = [_base + i for i in range(int(os.environ.get("MONEY_MODEL_SEEDS", "6")))]
NODES = {"MI450": 5, "MI300X": 2}


class Run:
    """One seed's random walk: the daemon, the model and the bookkeeping
    that maps between them."""

    def __init__(self, c, seed):
        self.c, self.d, self.seed = c, c.d, seed
        self.rng = random.Random(seed)
        self.model = RefModel()
        self.users = {}        # uid -> User
        self.instances = {}    # iid -> {"uid", "gpu", "cards", "state": running|stopped}
        self.pending = []      # (user, iid) created but not yet seen running
        self.payments = []     # (uid, payment_id, amount) already paid
        self.log = []
        self.steps = 0
        self.passes = 0
        self.checks = 0
        self.cli_checks = 0
        # One read-only connection for the checks after every step, and one
        # HTTP session for the balances: a new connection per call would
        # cost more than the check.
        self.db = sqlite3.connect(f"file:{self.d.db_path}?mode=ro", uri=True, timeout=10, isolation_level=None)
        self.http = requests.Session()
        self.http.trust_env = False  # no proxy look-up per request: loopback only
        self.counts = {"ran out": 0, "refused 402": 0, "no capacity": 0}

    def fail(self, msg):
        tail = "\n  ".join(self.log[-25:])
        raise AssertionError(f"seed {self.seed} (rerun: MONEY_MODEL_SEED={self.seed}), step {len(self.log)}: "
                             f"{msg}\nlast steps:\n  {tail}")

    def check(self, cond, msg):
        if not cond:
            self.fail(msg)

    def close(self):
        self.db.close()
        self.http.close()

    def now(self):
        return self.d.now()

    # ------------------------------------------------------------ waiting

    def settle_launches(self):
        """Instances created open their interval when they run; the clock
        must not move before they do."""
        for u, iid in self.pending:
            body = self.c.wait_state(u, iid, "running")
            self.check(body["state"] == "running", f"{iid} did not run")
        self.pending = []

    def settle_stops(self):
        self.c.wait_idle()

    # ------------------------------------------------------------ steps

    def step_signup(self):
        kind = self.rng.choice(["plain", "plain", "invite", "cli"])
        if kind == "cli":
            u = self.c.cli_user()
        else:
            u = self.c.signup(**({"invite_code": "AMD6GW"} if kind == "invite" else {}))
        self.users[u.id] = u
        self.model.add_user(u.id)
        if kind != "cli":
            [(gid, created)] = self.d.sql("SELECT id, created_at FROM credit_grants WHERE user_id = ?", (u.id,))
            self.model.grant(u.id, gid, 10 * MICRO, None, created)
        self.log.append(f"signup {kind} {u.id}")

    def user(self):
        return self.users[self.rng.choice(sorted(self.users))]

    def amount(self):
        return self.rng.choice([self.rng.randint(1, 50 * MICRO), self.rng.randint(1, 3) * MICRO,
                                self.rng.randint(1, 1000)])

    def step_topup(self):
        if self.payments and self.rng.random() < 0.2:
            uid, pid, amount = self.rng.choice(self.payments)  # a retry: no change
            fresh = False
        else:
            uid, pid, amount, fresh = self.user().id, f"pay-{self.seed}-{len(self.log)}", self.amount(), True
        if self.rng.random() < 0.5:
            r = self.c.admin("POST", f"/v1/admin/users/{uid}/topups", json={"amount": yuan(amount),
                                                                          "payment_id": pid})
        else:
            raw = json.dumps({"payment_id": pid, "user_id": uid, "amount": yuan(amount), "currency": "CNY"})
            r = self.d.post("/v1/payments/webhook", data=raw, headers=webhook_headers(SECRET, raw))
        self.check(r.status_code == (201 if fresh else 200), f"top-up: {r.status_code} {r.text}")
        if fresh:
            self.model.topup(uid, amount)
            self.payments.append((uid, pid, amount))
        self.log.append(f"topup {uid} {yuan(amount)} {pid} {'fresh' if fresh else 'repeat'}")

    def step_grant(self):
        u, amount, now = self.user(), self.amount(), self.now()
        expires = None
        if self.rng.random() < 0.6:
            expires = now + self.rng.choice([1, 2, 60, self.rng.randint(1, 7200), self.rng.randint(1, 86400)])
        gid = self.c.grant(u, amount, expires_at=expires)
        self.model.grant(u.id, gid, amount, expires, now)
        self.log.append(f"grant {u.id} {yuan(amount)} expires {expires and expires - now} -> {gid}")

    def held(self, uid):
        out = {}
        for i in self.instances.values():
            if i["uid"] == uid and i["state"] == "running":
                out[i["gpu"]] = out.get(i["gpu"], 0) + i["cards"]
        return out

    def predict_refusal(self, uid, gpu, cards):
        now = self.now()
        need = self.model.min_run_need(uid, gpu, cards, now, self.held(uid))
        return self.model.available(uid, now) < need

    def step_launch(self):
        self.settle_stops()
        u = self.user()
        gpu = self.rng.choice(["MI450", "MI450", "MI300X"])
        cards = self.rng.choice([1, 1, 2, 4, 8])
        poor = self.predict_refusal(u.id, gpu, cards)
        r = self.c.create(u, gpu, cards)
        self.log.append(f"launch {u.id} {cards} x {gpu}: {r.status_code}")
        if poor:
            self.check(r.status_code == 402 and r.json()["error"]["code"] == "insufficient_funds",
                       f"launch should be refused for funds: {r.status_code} {r.text}")
            self.counts["refused 402"] += 1
            return
        if r.status_code == 409 and r.json()["error"]["code"] == "insufficient_capacity":
            self.counts["no capacity"] += 1
            return
        self.check(r.status_code == 201, f"launch: {r.status_code} {r.text}")
        iid = r.json()["id"]
        self.instances[iid] = {"uid": u.id, "gpu": gpu, "cards": cards, "state": "running"}
        self.model.open_interval(u.id, iid, gpu, cards, self.now())
        self.pending.append((u, iid))
        self.log[-1] += f" -> {iid}"

    def step_start(self):
        stopped = [iid for iid, i in sorted(self.instances.items()) if i["state"] == "stopped"]
        if not stopped:
            return self.step_launch()
        self.settle_stops()
        iid = self.rng.choice(stopped)
        i = self.instances[iid]
        u = self.users[i["uid"]]
        poor = self.predict_refusal(u.id, i["gpu"], i["cards"])
        r = self.c.start(u, iid)
        self.log.append(f"start {iid}: {r.status_code}")
        if poor:
            self.check(r.status_code == 402, f"start should be refused for funds: {r.status_code} {r.text}")
            self.counts["refused 402"] += 1
            return
        if r.status_code == 409 and r.json()["error"]["code"] == "insufficient_capacity":
            self.counts["no capacity"] += 1
            return
        self.check(r.status_code == 200, f"start: {r.status_code} {r.text}")
        i["state"] = "running"
        self.model.open_interval(u.id, iid, i["gpu"], i["cards"], self.now())
        self.pending.append((u, iid))

    def step_stop(self):
        running = [iid for iid, i in sorted(self.instances.items()) if i["state"] == "running"]
        if not running:
            return self.step_launch()
        self.settle_launches()
        iid = self.rng.choice(running)
        i = self.instances[iid]
        self.c.stop(self.users[i["uid"]], iid, wait=False)
        i["state"] = "stopped"
        self.model.close_interval(i["uid"], iid, self.now())
        self.log.append(f"stop {iid}")

    def interesting_times(self):
        """Seconds worth landing on: grant expiries and when funds run out."""
        now, out = self.now(), []
        for uid, u in self.model.users.items():
            out += [g["expires"] + k for g in u["grants"].values() if g["expires"] for k in (-1, 0, 1)]
        dry = copy.deepcopy(self.model)
        out += [s + k for s in dry.billing_pass(now + 40 * 3600).values() for k in (-1, 0, 1)]
        return [t for t in out if t > now]

    def step_clock(self):
        self.settle_launches()
        now = self.now()
        r = self.rng.random()
        special = self.interesting_times() if r < 0.35 else []
        if special:
            t = self.rng.choice(special)
        elif r < 0.8:
            t = now + self.rng.randint(1, 600)
        else:
            t = now + self.rng.randint(600, 4 * 3600)
        self.d.set_clock(t)
        self.log.append(f"clock +{t - now}")

    def step_price(self):
        gpu = self.rng.choice(["MI450", "MI300X"])
        price = self.rng.choice([self.rng.randint(100_000, 5 * MICRO), 1_200_000, 2_200_000])
        eff = self.now() + self.rng.choice([0, 1, self.rng.randint(1, 7200)])
        self.c.set_price(gpu, price, eff)
        self.model.set_price(gpu, price, eff)
        self.log.append(f"price {gpu} {yuan(price)} from +{eff - self.now()}")

    def step_billing(self):
        self.settle_launches()
        now = self.now()
        self.c.billing()
        stopped = self.model.billing_pass(now)
        self.passes += 1
        self.counts["ran out"] += len(stopped)
        for iid, i in self.instances.items():
            if i["uid"] in stopped and i["state"] == "running":
                i["state"] = "stopped"
        self.log.append(f"billing at {now}: stopped {sorted(stopped.items())}")
        self.settle_stops()
        states = dict(self.d.sql("SELECT id, state FROM instances"))
        for iid, i in self.instances.items():
            self.check(states[iid] == i["state"], f"{iid} is {states[iid]}, model says {i['state']}")

    # ------------------------------------------------------------ comparing

    def compare(self):
        """After every step: the ledger's invariants, the database's money
        rows and the API's balances against the model."""
        now = self.now()
        self.checks += 1
        self.db.execute("BEGIN")  # one snapshot for all the reads
        try:
            breaches = ledger_breaches(self.db)
            cash = dict(self.db.execute("SELECT user_id, balance FROM ledger_accounts WHERE kind = 'cash'"))
            grants = {}
            for gid, uid, remaining, voided in self.db.execute(
                    "SELECT id, user_id, remaining, voided_at IS NOT NULL FROM credit_grants"):
                grants.setdefault(uid, {})[gid] = (remaining, bool(voided))
            spent = dict(self.db.execute(
                "SELECT t.user_id, -sum(p.amount) FROM ledger_postings p JOIN ledger_transactions t"
                " ON t.id = p.transaction_id JOIN ledger_accounts a ON a.id = p.account_id"
                " WHERE t.kind = 'usage' AND a.kind IN ('cash', 'grant') GROUP BY t.user_id"))
            intervals = {}
            for uid, *row in self.db.execute("SELECT user_id, instance_id, started_at, ended_at, billed, settled"
                                             " FROM running_intervals ORDER BY id"):
                intervals.setdefault(uid, []).append(tuple(row))
            desired = dict(self.db.execute("SELECT id, desired FROM instances"))
        finally:
            self.db.execute("COMMIT")
        self.check(not breaches, "the ledger's invariants are broken:\n  " + "\n  ".join(breaches))
        # A launch not yet seen running has no interval yet; the clock waits
        # for it, so once it has one, it starts where the model says.
        pending = {iid for _, iid in self.pending}
        for uid in sorted(self.users):
            m = self.model.users[uid]
            self.check(cash.get(uid, 0) == m["cash"], f"{uid} cash {yuan(cash.get(uid, 0))} != model {yuan(m['cash'])}")
            want = {gid: (g["remaining"], g["voided"]) for gid, g in m["grants"].items()}
            self.check(grants.get(uid, {}) == want,
                       f"{uid} grants (remaining, voided) {grants.get(uid)} != model {want}")
            self.check(spent.get(uid, 0) == self.model.spent(uid),
                       f"{uid} spent {spent.get(uid, 0)} != model {self.model.spent(uid)}")
            got = [iv for iv in intervals.get(uid, []) if not (iv[0] in pending and iv[2] is None)]
            want = [(iv["iid"], iv["start"], iv["end"], iv["billed"], int(iv["settled"])) for iv in m["intervals"]]
            early = {iv[0]: iv for iv in want if iv[0] in pending and iv[2] is None}
            want = [iv for iv in want if not (iv[0] in pending and iv[2] is None)]
            self.check(sorted(got, key=repr) == sorted(want, key=repr),
                       f"{uid} intervals\n  daemon {got}\n  model  {want}")
            for iv in intervals.get(uid, []):
                if iv[0] in early and iv[2] is None:
                    self.check(iv == early[iv[0]], f"{uid} interval of {iv[0]} opened as {iv}, model {early[iv[0]]}")
        for iid, i in self.instances.items():
            self.check(desired[iid] == i["state"], f"{iid} is meant to be {desired[iid]}, model says {i['state']}")
        for uid in sorted(self.users):
            u, m = self.users[uid], self.model.users[uid]
            b = self.c.balance(u, session=self.http)
            want_grants = {gid: self.model.grant_shown(uid, gid, now) for gid in m["grants"]}
            got_grants = {gid: g["remaining"] for gid, g in b["grants"].items()}
            self.check(got_grants == want_grants, f"{uid} balance grants {got_grants} != model {want_grants}")
            self.check(b["cash"] == m["cash"], f"{uid} balance cash {yuan(b['cash'])} != model {yuan(m['cash'])}")
            want_credit = self.model.funds(uid, now) - m["cash"]
            self.check(b["credit"] == want_credit, f"{uid} credit {yuan(b['credit'])} != model {yuan(want_credit)}")
            want = (self.model.unbilled(uid, now), self.model.available(uid, now))
            self.check((b["unbilled"], b["available"]) == want,
                       f"{uid} unbilled, available {(b['unbilled'], b['available'])} != model {want}")

    def verify_cli(self):
        """The real `gpurentd ledger verify`, the judge of the invariants."""
        self.cli_checks += 1
        rc, out = ledger_verify(self.d.db_path)
        self.check(rc == 0 and out.strip().splitlines()[-1] == "ledger OK", f"ledger verify ({rc}):\n{out}")

    # ------------------------------------------------------------ the walk

    def step(self, fn):
        fn()
        self.steps += 1
        self.compare()
        if self.steps % CLI_EVERY == 0:
            self.verify_cli()

    def walk(self, steps):
        self.step(self.step_signup)
        table = [(self.step_signup, 1.0), (self.step_topup, 2.0), (self.step_grant, 2.0), (self.step_launch, 2.5),
                 (self.step_start, 0.8), (self.step_stop, 1.5), (self.step_clock, 4.0), (self.step_billing, 3.0),
                 (self.step_price, 0.3)]
        fns, weights = zip(*table)
        for _ in range(steps):
            fn = self.rng.choices(fns, weights)[0]
            if fn == self.step_signup and len(self.users) >= 8:
                fn = self.step_topup
            self.step(fn)
        # Everything stops; a last pass settles every interval.
        self.settle_launches()
        for iid, i in sorted(self.instances.items()):
            if i["state"] == "running":
                self.c.stop(self.users[i["uid"]], iid, wait=False)
                i["state"] = "stopped"
                self.model.close_interval(i["uid"], iid, self.now())
                self.log.append(f"stop {iid}")
        self.compare()
        self.d.advance_clock(1)
        self.step(self.step_billing)
        for uid in self.users:
            self.check(not self.model.unsettled(uid), f"{uid} has unsettled intervals after the last pass")
        self.verify_cli()


@pytest.mark.parametrize("seed", SEEDS)
def test_random_walks_match_the_reference_model(new_cluster, seed):
    started = time.monotonic()
    c = new_cluster(nodes=NODES, options={"payment_webhook_secret": SECRET})
    run = Run(c, seed)
    try:
        run.walk(STEPS)
    except Exception as e:
        if not isinstance(e, AssertionError) or f"seed {seed}" not in str(e):
            raise AssertionError(f"seed {seed} (rerun: MONEY_MODEL_SEED={seed}), step {len(run.log)}: {e}\n"
                                 "last steps:\n  " + "\n  ".join(run.log[-25:])) from e
        raise
    finally:
        run.close()
    voided = sum(g["voided"] for u in run.model.users.values() for g in u["grants"].values())
    print(f"seed {seed}: {run.steps} steps, {run.checks} checks against the model and the invariants, "
          f"{run.cli_checks} ledger verify runs, {run.passes} billing passes, {len(run.instances)} instances, "
          f"{len(run.users)} users, {voided} grants voided, {run.counts} in {time.monotonic() - started:.1f}s")
    assert run.checks >= run.steps > STEPS
    assert run.passes > 10
    # The billing team's reports agree with the ledger after a long random run.
    totals = reconcile(run.d.db_path)
    assert totals["revenue"] == sum(run.model.spent(uid) for uid in run.model.users)


# ---------------------------------------------------------------- funds running out, the end moved back

# A node that misses a beat is noticed within a second; it stays reachable
# (missed, not unreachable) for the whole test.
SILENT_OPTIONS = {"agent_timeout_ms": "1000", "heartbeat_miss_limit": "100", "node_lost_after_s": "3600"}


def _intervals(c):
    return {iid: (start, end, billed, settled) for iid, start, end, billed, settled in c.d.sql(
        "SELECT instance_id, started_at, ended_at, billed, settled FROM running_intervals ORDER BY id")}


def _node(c, gpu):
    [(last_seen, missed)] = c.d.sql("SELECT last_seen_at, missed_beats FROM nodes WHERE gpu_model = ?", (gpu,))
    return last_seen, missed


def _net_charges(c, user):
    """What the user's funds paid for usage, net of refunds, from the ledger."""
    return c.d.sql("SELECT coalesce(-sum(p.amount), 0) FROM ledger_postings p JOIN ledger_transactions t"
                   " ON t.id = p.transaction_id JOIN ledger_accounts a ON a.id = p.account_id"
                   " WHERE t.kind IN ('usage', 'refund') AND t.user_id = ? AND a.kind IN ('cash', 'grant')",
                   (user.id,))[0][0]


def test_funds_running_out_never_bill_a_silent_node_past_its_last_heartbeat(new_cluster):
    """One user, two instances: one on a node that has missed a heartbeat
    (billed only up to its last good one), one on a healthy node whose cost
    runs the user's funds out well after that heartbeat. The pass that stops
    them must leave the silent node's interval ending no later than its last
    good heartbeat and billed exactly its tariff; `ledger verify` passes."""
    c = new_cluster(nodes={"MI450": 1, "MI300X": 1}, options=SILENT_OPTIONS)
    u = c.cli_user()
    c.topup(u, 3 * MICRO)
    t0 = c.d.now()
    quiet = c.launch(u, "MI300X", 1)
    busy = c.launch(u, "MI450", 8)
    t1 = c.d.advance_clock(60)
    poll(lambda: _node(c, "MI300X") == (t1, 0), 60, "a good heartbeat at the new time")
    [fleet] = [f for f in c.fleets if f.dir.endswith("fleet-mi300x")]
    fleet.proc.send_signal(signal.SIGSTOP)
    try:
        poll(lambda: _node(c, "MI300X")[1] >= 1, 60, "the MI300X node to miss a heartbeat")
        assert _node(c, "MI300X")[0] == t1
        c.d.set_clock(t0 + 3600)
        c.billing()
        got = _intervals(c)
        # Funds cover the quiet one's 60 confirmed seconds and the busy one
        # up to the last second they cover.
        quiet_due = accrue(PRICE["MI300X"], 1, 60)
        busy_s = max(s for s in range(3600) if quiet_due + accrue(PRICE["MI450"], 8, s) <= 3 * MICRO)
        assert got[busy] == (t0, t0 + busy_s, accrue(PRICE["MI450"], 8, busy_s), 1), got
        start, end, billed, settled = got[quiet]
        assert settled == 1 and start == t0 and end <= t1, f"the silent node's interval ends past {t1}: {got[quiet]}"
        assert billed == accrue(PRICE["MI300X"], 1, end - start), got[quiet]
        assert _net_charges(c, u) == sum(iv[2] for iv in got.values())
        rc, out = ledger_verify(c.d.db_path)
        assert rc == 0, out
    finally:
        fleet.proc.send_signal(signal.SIGCONT)


def test_funds_running_out_refund_what_was_charged_past_the_end(new_cluster):
    """The clock steps back below what an interval was already charged for;
    a second instance then runs the user's funds out. The pass ends both at
    the last second funds covered: the first one was charged past it, and
    gets the difference back as a refund naming its interval, so it is
    billed exactly its tariff; `ledger verify` passes."""
    c = new_cluster(nodes={"MI450": 2})
    u = c.cli_user()
    c.topup(u, 3_500_000)
    t0 = c.d.now()
    first = c.launch(u, "MI450", 1)
    c.d.set_clock(t0 + 3600)
    c.billing()
    assert _intervals(c)[first] == (t0, None, PRICE["MI450"], 0)
    c.d.set_clock(t0 + 1000)
    second = c.launch(u, "MI450", 8)
    c.d.set_clock(t0 + 2200)
    c.billing()
    got = _intervals(c)
    # The pass found funds (2.30) short of the second's cost at t0 + 2200.
    end = got[second][1]
    assert got[second] == (t0 + 1000, end, accrue(PRICE["MI450"], 8, end - t0 - 1000), 1), got
    assert t0 + 1000 < end < t0 + 3600, got
    assert got[first] == (t0, end, accrue(PRICE["MI450"], 1, end - t0), 1), \
        f"charged {PRICE['MI450']} for the first up to t0 + 3600, settled at t0 + {end - t0}: {got[first]}"
    [(iv_id,)] = c.d.sql("SELECT id FROM running_intervals WHERE instance_id = ?", (first,))
    refunds = c.d.sql("SELECT interval_id FROM ledger_transactions WHERE kind = 'refund'")
    assert refunds == [(iv_id,)], refunds
    assert _net_charges(c, u) == sum(iv[2] for iv in got.values())
    rc, out = ledger_verify(c.d.db_path)
    assert rc == 0, out


# ---------------------------------------------------------------- found by the walk's design (daemon bugs)

def _fleet(c, gpu):
    [fleet] = [f for f in c.fleets if f.dir.endswith(f"fleet-{gpu.lower()}")]
    return fleet


def test_a_stop_on_a_silent_node_is_billed_only_to_its_last_heartbeat(new_cluster):
    """Daemon bug (found while extending the walk): a user stops an instance
    whose node has missed heartbeats. Stopping closes the interval at now
    (instances.c wind_down -> ledger_close_interval(now)), and a closed
    interval's billable end is its end: confirmed_until only caps open ones
    (store_money.c BILLABLE_COLUMNS). So the time since the node's last good
    heartbeat, not known to have run, is billed while the node is still
    silent, and stays billed if it never answers again (the instance is then
    stopped, not lost, and billed to the stop; had the user not stopped it,
    it would be lost and billed to the last heartbeat)."""
    c = new_cluster(nodes={"MI450": 1}, options=SILENT_OPTIONS)
    u = c.cli_user()
    c.topup(u, 100 * MICRO)
    t0 = c.d.now()
    iid = c.launch(u, "MI450", 8)
    t1 = c.d.advance_clock(60)
    poll(lambda: _node(c, "MI450") == (t1, 0), 60, "a good heartbeat at the new time")
    fleet = _fleet(c, "MI450")
    fleet.proc.send_signal(signal.SIGSTOP)
    try:
        poll(lambda: _node(c, "MI450")[1] >= 1, 60, "the node to miss a heartbeat")
        assert _node(c, "MI450")[0] == t1
        c.d.set_clock(t0 + 3600)
        c.stop(u, iid, wait=False)
        c.billing()
        assert _node(c, "MI450")[1] >= 1, "the node answered again"
        assert _net_charges(c, u) == accrue(PRICE["MI450"], 8, 60), \
            f"billed {_net_charges(c, u)} for {_intervals(c)[iid]}, the node silent since t0 + 60"
    finally:
        fleet.proc.send_signal(signal.SIGCONT)


def test_funds_running_out_stop_an_unreachable_instance_too(new_cluster):
    """Daemon bug (found while extending the walk): when funds run out the
    user's instances are stopped, but stop_for_funds (billing.c) stops only
    pending, provisioning and running ones. An unreachable instance keeps
    desired state running, so once its node answers it runs again, opening
    a new interval with no funds behind it (cut back to nothing only by the
    next pass that looks)."""
    c = new_cluster(nodes={"MI450": 1, "MI300X": 1},
                    options={"agent_timeout_ms": "1000", "heartbeat_miss_limit": "3", "node_lost_after_s": "86400"})
    u = c.cli_user()
    c.topup(u, 3 * MICRO)
    t0 = c.d.now()
    quiet = c.launch(u, "MI300X", 1)
    busy = c.launch(u, "MI450", 8)
    t1 = c.d.advance_clock(60)
    poll(lambda: _node(c, "MI300X") == (t1, 0), 60, "a good heartbeat at the new time")
    fleet = _fleet(c, "MI300X")
    fleet.proc.send_signal(signal.SIGSTOP)
    try:
        c.wait_state(u, quiet, "unreachable", timeout=60)
        c.d.set_clock(t0 + 3600)
        c.billing()
        c.wait_state(u, busy, "stopped", timeout=60)
        assert _intervals(c)[quiet][1:] == (t1, accrue(PRICE["MI300X"], 1, 60), 1), _intervals(c)
        desired = dict(c.d.sql("SELECT id, desired FROM instances"))
        assert desired == {busy: "stopped", quiet: "stopped"}, f"funds ran out, yet {desired}"
    finally:
        fleet.proc.send_signal(signal.SIGCONT)
