"""test_instances_crash.py: a seeded fault harness for inventory and
instances. Round after round, concurrent requests create single-node,
multi-node (gang) and reserved instances, stop, start and terminate them,
make and delete volumes, and book and cancel reservations, while gpurentd is
killed with SIGKILL at a random moment and started again on the same
database and port, and sim fleets are killed and brought back or stopped
with SIGSTOP for a while (nodes going quiet, sometimes long enough to be
judged offline). After each round, once everything has settled, the promise
is checked from the API, the database and the agents' own lists:

* no card is held by two instances, an on-demand instance never sits on a
  reserved node, and a reserved one only on its block's nodes, within the
  cards the block holds there;
* GET /v1/gpu-types counts what the node and card rows say;
* every instance reaches a settled state, and each agent runs exactly the
  workloads the database places on its node, on the cards it gives them;
* every acknowledged create, booking, change of desired state and volume
  deletion is there after the crash, and a create or booking whose answer
  was lost, sent again with its Idempotency-Key, exists once;
* `gpurentd ledger verify` passes (also on what each kill left on disk), and
  no instance is billed for any stretch of the testing clock during which it
  was not running.

The testing clock moves only between rounds, while nothing is in flight, so
"was not running" is known exactly. GPURENT_CRASH_SEED picks the seed (one
is drawn and printed otherwise) and GPURENT_CRASH_ROUNDS the number of
rounds (8 by default, some 20 to 30 s) for longer soaks."""
import json
import os
import random
import signal
import sqlite3
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reservations"))

from agent_util import pause, poll  # noqa: E402
from instances_util import DEADLINE, HOLDING, Cloud  # noqa: E402
from money_util import from_iso, iso, ledger_breaches, ledger_verify  # noqa: E402
from resv_util import CUDA_IMAGE  # noqa: E402

SEED = int(os.environ.get("GPURENT_CRASH_SEED", "0")) or random.randrange(1, 10**9)
ROUNDS = int(os.environ.get("GPURENT_CRASH_ROUNDS", "8"))

IMAGE = "rocm/pytorch:2.3-rocm6.2"
# Billing passes run on their own every 250 ms, so kills land in them too.
# A call to a stopped agent times out after a second: three of them in a
# row make its node unreachable.
OPTIONS = {"billing_interval_ms": "250", "agent_timeout_ms": "1000"}
SETTLED = {"running", "stopped", "terminated", "failed", "succeeded", "lost"}
# What each desired state may settle in: a run can end on its own (a lost
# node, attempts used up), but never come back or be terminated unasked.
SETTLES_AS = {"running": {"running", "failed", "lost", "succeeded"},
              "stopped": {"stopped", "failed", "lost", "succeeded"},
              "terminated": {"terminated"}}
VERB_DESIRED = {"stop": "stopped", "start": "running", "terminate": "terminated"}


class Harness:
    def __init__(self, cloud, rng):
        self.c, self.d, self.rng = cloud, cloud.d, rng
        self.users = []
        self.inst = {}        # id -> {"user", "resv", "key", "cards", "desired": the set it may be}
        self.volumes = {}     # id -> {"user", "deleted": None | True | "maybe"}
        self.resv = {}        # id -> {"user", "cards", "start", "end", "cancelled": False | True | "maybe"}
        self.keys = {}        # Idempotency-Key -> ("instance" | "reservation", user, body, id or None)
        self.not_running = []  # (t_from, t_to, {instance ids not running during that stretch})
        self.claimed = set()  # volumes and blocks a request of this round already deletes
        self.lock = threading.Lock()
        self.resent = 0       # how many were sent again
        self.lost = []        # keys of creates and bookings whose answer a kill swallowed
        self.log = []

    # ------------------------------------------------------------ requests

    def send(self, method, path, user, body=None, key=None):
        """The reply, or None when the daemon died before answering."""
        h = {"Idempotency-Key": key} if key else None
        try:
            return self.d.request(method, path, key=user.key, json=body, headers=h, timeout=30) \
                if body is not None else self.d.request(method, path, key=user.key, headers=h, timeout=30)
        except requests.RequestException:
            return None

    def op_create(self, kind):
        u = self.rng.choice(self.users)
        key = f"ck-{uuid.uuid4().hex[:16]}"
        body = {"gpu_type": "MI450", "image": IMAGE, "name": key[:63]}
        if kind == "single":
            body["card_count"] = self.rng.choice([1, 2, 4, 8])
            vols = [v for v, m in self.volumes.items() if m["user"] is u and m["deleted"] is None]
            if vols and self.rng.random() < 0.5:
                body["volume_id"] = self.rng.choice(vols)
        elif kind == "gang":
            body["card_count"] = 16
        else:
            now = self.d.now()
            live = [r for r, m in self.resv.items() if m["user"] is u and m["cancelled"] is False
                    and m["start"] <= now < m["end"]]
            if not live:
                return None
            body.update(gpu_type="H100-SXM", image=CUDA_IMAGE, reservation_id=self.rng.choice(live),
                        card_count=self.rng.choice([1, 2, 4, 8]))
        self.keys[key] = ("instance", u, body, None)
        return ("create", key, self.send("POST", "/v1/instances", u, body, key))

    def op_action(self, iid, verb):
        m = self.inst[iid]
        if verb == "terminate":
            r = self.send("DELETE", f"/v1/instances/{iid}", m["user"])
        else:
            r = self.send("POST", f"/v1/instances/{iid}/{verb}", m["user"])
        return (verb, iid, r)

    def op_volume(self):
        u = self.rng.choice(self.users)
        with self.lock:
            mine = [v for v, m in self.volumes.items()
                    if m["user"] is u and m["deleted"] is None and v not in self.claimed]
            vid = self.rng.choice(mine) if mine and self.rng.random() < 0.5 else None
            self.claimed.add(vid)
        if vid:
            return ("volume_delete", vid, self.send("DELETE", f"/v1/volumes/{vid}", u))
        name = f"v{uuid.uuid4().hex[:10]}"
        return ("volume_create", u, self.send("POST", "/v1/volumes", u, {"name": name, "size_gb": 10}))

    def op_book(self):
        u = self.rng.choice(self.users)
        now = self.d.now()
        start = now - now % 3600 + 3600 * self.rng.randint(1, 3)
        body = {"gpu_type": "H100-SXM", "cards": self.rng.choice([1, 2, 4, 8, 16]), "starts_at": iso(start),
                "ends_at": iso(start + 3600 * self.rng.randint(1, 2))}
        key = f"rk-{uuid.uuid4().hex[:16]}"
        self.keys[key] = ("reservation", u, body, None)
        return ("book", key, self.send("POST", "/v1/reservations", u, body, key))

    def op_cancel(self):
        now = self.d.now()
        with self.lock:
            future = [r for r, m in self.resv.items()
                      if m["cancelled"] is False and m["start"] > now and r not in self.claimed]
            if not future:
                return None
            rid = self.rng.choice(future)
            self.claimed.add(rid)
        return ("cancel", rid, self.send("DELETE", f"/v1/reservations/{rid}", self.resv[rid]["user"]))

    def plan(self):
        """A round's requests: a dozen or so, at most one per instance."""
        ops = []
        live = [i for i, m in self.inst.items() if m["desired"] != {"terminated"}]
        self.rng.shuffle(live)
        for _ in range(self.rng.randint(6, 14)):
            x = self.rng.random()
            if x < 0.30:
                ops.append(("create", "single"))
            elif x < 0.40:
                ops.append(("create", "gang"))
            elif x < 0.52:
                ops.append(("create", "resv"))
            elif x < 0.82 and live:
                iid = live.pop()
                ops.append(("action", iid, self.rng.choice(["stop", "stop", "start", "start", "terminate"])))
            elif x < 0.90:
                ops.append(("volume",))
            elif x < 0.96:
                ops.append(("book",))
            else:
                ops.append(("cancel",))
        return ops

    def run(self, op):
        if op[0] == "create":
            return self.op_create(op[1])
        if op[0] == "action":
            return self.op_action(op[1], op[2])
        if op[0] == "volume":
            return self.op_volume()
        if op[0] == "book":
            return self.op_book()
        return self.op_cancel()

    # ------------------------------------------------------------ replies

    def note(self, result):
        """Records what a reply (or its absence) acknowledged."""
        if result is None:
            return
        what, arg, r = result
        if what in ("create", "book"):
            kind, u, body, _ = self.keys[arg]
            if r is None:
                self.lost.append(arg)  # sent again after the restart
                return
            if r.status_code == 201:
                oid = r.json()["id"]
                self.keys[arg] = (kind, u, body, oid)
                if kind == "instance":
                    self.inst[oid] = {"user": u, "resv": body.get("reservation_id"), "key": arg,
                                      "desired": {"running"}, "cards": body["card_count"]}
                else:
                    self.resv[oid] = {"user": u, "cards": body["cards"], "key": arg,
                                      "start": from_iso(body["starts_at"]), "end": from_iso(body["ends_at"]),
                                      "cancelled": False}
            elif r.status_code == 400 and body.get("volume_id"):
                # A delete of the volume in the same round came first.
                assert r.json()["error"]["field"] == "volume_id", r.text
                assert self.d.sql("SELECT deleted_at IS NOT NULL FROM volumes WHERE id = ?",
                                  (body["volume_id"],)) == [(1,)], r.text
            elif r.status_code == 400 and kind == "reservation":
                # Sent again after the clock moved on while the daemon was
                # down: the first never committed, and its hour has begun.
                assert r.json()["error"]["field"] == "starts_at", r.text
                assert from_iso(body["starts_at"]) <= self.d.now(), r.text
            else:
                assert r.status_code in (402, 403, 409), f"{what} {body}: {r.status_code} {r.text}"
        elif what in VERB_DESIRED:
            m = self.inst[arg]
            if r is None:
                m["desired"] = m["desired"] | {VERB_DESIRED[what]}
            elif r.status_code == 200:
                assert r.json()["desired_state"] == VERB_DESIRED[what], r.text
                m["desired"] = {VERB_DESIRED[what]}
            else:
                # A start with no room, or a change a settled state refuses.
                assert r.status_code in (402, 409), f"{what} {arg}: {r.status_code} {r.text}"
        elif what == "volume_create":
            if r is not None and r.status_code == 201:
                self.volumes[r.json()["id"]] = {"user": arg, "deleted": None}
        elif what == "volume_delete":
            m = self.volumes[arg]
            if r is None:
                m["deleted"] = "maybe"
            elif r.status_code == 204:
                m["deleted"] = True
            else:
                assert r.status_code == 409, r.text
        elif what == "cancel":
            m = self.resv[arg]
            if r is None:
                m["cancelled"] = "maybe"
            elif r.status_code == 200:
                m["cancelled"] = True
            else:
                assert r.status_code == 409, r.text

    def resend_lost(self):
        """Creates and bookings whose answer a kill swallowed go again with
        their key: the first answer if it committed, else a fresh run."""
        lost, self.lost = self.lost, []
        self.resent += len(lost)
        for key in lost:
            kind, u, body, _ = self.keys[key]
            path = "/v1/instances" if kind == "instance" else "/v1/reservations"
            r = self.send("POST", path, u, body, key)
            assert r is not None, f"no answer to a resent {kind}"
            self.note(("create" if kind == "instance" else "book", key, r))

    # ------------------------------------------------------------ faults

    def fault(self, kind, delay, fleet, quiet_for):
        time.sleep(delay)
        if kind in ("daemon", "both"):
            self.d.proc.kill()
        if kind in ("fleet_kill", "both"):
            fleet.proc.kill()
        if kind == "fleet_stop":
            pause(fleet.proc)
            time.sleep(quiet_for)
            fleet.proc.send_signal(signal.SIGCONT)

    def recover(self, kind, fleet, kill=False, outage=0):
        if kill:
            self.d.proc.kill()
        if kind in ("daemon", "both"):
            self.d.proc.wait(timeout=30)
            self.d.proc = None
            self.check_on_disk()
            # The clock may move on while the daemon is down: what the rows
            # left say was not running must not be billed for that stretch.
            self.jump(self.d.now() + outage)
            self.d.start()
        if kind in ("fleet_kill", "both"):
            fleet.proc.wait(timeout=30)
            self.c.restart_fleet(fleet)

    # ------------------------------------------------------------ settling

    def instance_rows(self):
        return {i: (s, d, n) for i, s, d, n in self.d.sql(
            "SELECT id, state, desired, next_attempt_at FROM instances")}

    def jump(self, to):
        """Moves the testing clock while nothing is in flight, noting which
        instances were not running for that stretch."""
        now = self.d.now()
        if to <= now:
            return
        idle = {i for i, (s, _, _) in self.instance_rows().items() if s != "running"}
        self.not_running.append((now, to, idle))
        self.d.set_clock(to)

    def settle(self):
        """Waits until every instance is settled; one waiting out a retry's
        backoff has the clock moved to its retry."""
        deadline = time.monotonic() + 2 * DEADLINE
        while True:
            rows = self.instance_rows()
            now = self.d.now()
            unsettled = {i: r for i, r in rows.items() if r[0] not in SETTLED}
            if not unsettled:
                return rows
            waiting = [n for s, _, n in unsettled.values() if s == "pending" and n > now]
            if len(waiting) == len(unsettled):
                self.jump(max(waiting))
                continue
            assert time.monotonic() < deadline, \
                f"instances never settled (seed {SEED}): {unsettled}\n{self.d.stderr_text()[-3000:]}"
            time.sleep(0.05)

    def quiet_jump(self, fleet, seconds):
        """A node goes quiet and the clock moves on before it answers again:
        its running instances are judged unreachable (or lost) first, and
        none may be billed for the stretch, nor any other instance that was
        not running."""
        d = self.d
        names = sorted(fleet.nodes)
        marks = ",".join("?" * len(names))
        on_it = {i for (i,) in d.sql(f"SELECT DISTINCT p.instance_id FROM instance_nodes p JOIN nodes n"
                                     f" ON n.id = p.node_id WHERE n.name IN ({marks})", names)}
        pause(fleet.proc)
        try:
            def judged():
                # Nothing on it runs or moves any more until it answers.
                rows = self.instance_rows()
                return all(rows[i][0] not in ("running", "provisioning", "pending", "stopping") for i in on_it) \
                    and d.sql(f"SELECT count(*) FROM nodes WHERE name IN ({marks}) AND (health = 'offline'"
                              f" OR unreachable_since IS NOT NULL)", names) == [(len(names),)]
            poll(judged, DEADLINE, f"{names} and their instances to be judged silent")
            self.jump(d.now() + seconds)
            # The pass that comes with the moved clock (lost, credits).
            r = d.request("POST", "/v1/admin/billing/run", key=d.admin_key, json={})
            assert r.status_code == 200, r.text
        finally:
            fleet.proc.send_signal(signal.SIGCONT)

    def agents_match(self):
        """Each agent runs exactly the workloads the database places on its
        node, on the cards it gives them."""
        want = {}
        for name, wl, cards in self.d.sql("SELECT n.name, p.workload_id, p.cards FROM instance_nodes p"
                                          " JOIN nodes n ON n.id = p.node_id"):
            want.setdefault(name, {})[wl] = sorted(json.loads(cards))
        got = {name: {w["id"]: sorted(w["gpus"]) for w in wls} for name, wls in self.c.all_workloads().items()}
        bad = {n: (want.get(n, {}), got[n]) for n in got if want.get(n, {}) != got[n]}
        return True if not bad else bad

    # ------------------------------------------------------------ checks

    def check_on_disk(self):
        """What a kill left: the ledger holds, no card is held twice."""
        rc, out = ledger_verify(self.d.db_path)
        assert rc == 0, f"ledger verify after a kill (seed {SEED}):\n{out}"
        self.c.check_cards_consistent()

    def check_pools(self):
        d = self.d
        pool = {n: (p, m) for n, p, m in d.sql(
            "SELECT n.id, n.pool, (SELECT reservation_required FROM gpu_types WHERE code = n.gpu_model)"
            " FROM nodes n")}
        bound = {(r, n): k for r, n, k in d.sql("SELECT reservation_id, node_id, cards FROM reservation_nodes")}
        used = {}
        for iid, rid, node, cards in d.sql(
                "SELECT i.id, i.reservation_id, p.node_id, p.cards FROM instances i"
                " JOIN instance_nodes p ON p.instance_id = i.id"):
            reserved = pool[node][0] == "reserved" or pool[node][1] == 1
            if rid is None:
                assert not reserved, f"on-demand instance {iid} on reserved node {node}"
                continue
            assert reserved, f"reserved instance {iid} on on-demand node {node}"
            assert (rid, node) in bound, f"instance {iid} of {rid} on node {node} its block does not hold"
            used[(rid, node)] = used.get((rid, node), 0) + len(json.loads(cards))
        for k, n in used.items():
            assert n <= bound[k], f"block {k} holds {bound[k]} cards there, its instances use {n}"
        # No node-hour is bound past its cards.
        per = {}
        for node, cards, s, e in d.sql("SELECT b.node_id, b.cards, r.starts_at, r.ends_at FROM reservation_nodes b"
                                       " JOIN reservations r ON r.id = b.reservation_id WHERE r.state = 'booked'"):
            for h in range(s, e, 3600):
                per[(node, h)] = per.get((node, h), 0) + cards
        assert all(v <= 8 for v in per.values()), per

    def catalog_matches(self):
        """GET /v1/gpu-types against the node and card rows."""
        rows = self.d.sql(
            "SELECT n.gpu_model, n.health, n.unreachable_since, n.admin_state, c.healthy, c.instance_id,"
            " n.pool = 'reserved' OR t.reservation_required FROM node_cards c JOIN nodes n ON n.id = c.node_id"
            " JOIN gpu_types t ON t.code = n.gpu_model WHERE n.removed_at IS NULL")
        want = {}
        for model, health, unreach, admin, healthy, holder, reserved in rows:
            w = want.setdefault(model, [0, 0, 0, 0])
            usable = health == "up" and admin == "active" and healthy == 1
            w[0] += health in ("up", "offline")
            w[1] += usable and unreach is None and holder is None and not reserved
            w[2] += holder is not None
            w[3] += usable and bool(reserved)
        r = self.d.get("/v1/gpu-types")
        assert r.status_code == 200, r.text
        got = {t["code"]: [t["cards_total"], t["cards_free"], t["cards_in_use"], t["cards_reservable"]]
               for t in r.json()["data"] if t["code"] in want}
        return True if got == want else (got, want)

    def check_acknowledged(self, rows):
        now = self.d.now()
        for iid, m in self.inst.items():
            assert iid in rows, f"acknowledged create {iid} is gone (seed {SEED})"
            state, desired, _ = rows[iid]
            if m["resv"] and now >= self.resv[m["resv"]]["end"] and m["desired"] != {"terminated"}:
                m["desired"] = m["desired"] | {"stopped"}  # the block's end stops it
            assert desired in m["desired"], f"{iid}: desired {desired}, acknowledged {m['desired']}"
            m["desired"] = {desired}
            assert state in SETTLES_AS[desired], f"{iid}: {state} while desired {desired}"
        # A key never made two.
        for key, (kind, _, _, oid) in self.keys.items():
            if kind == "instance":
                made = [i for (i,) in self.d.sql("SELECT id FROM instances WHERE name = ?", (key[:63],))]
                assert made == ([oid] if oid else []), f"create {key}: {made}, acknowledged {oid}"
        for vid, m in self.volumes.items():
            [(deleted,)] = self.d.sql("SELECT deleted_at IS NOT NULL FROM volumes WHERE id = ?", (vid,))
            assert m["deleted"] in ("maybe", bool(deleted)) or (m["deleted"] is None and not deleted), (vid, m)
            m["deleted"] = True if deleted else None
        assert self.d.sql("SELECT i.id FROM instances i JOIN volumes v ON v.id = i.volume_id"
                          " WHERE i.state <> 'terminated' AND v.deleted_at IS NOT NULL") == []
        for rid, m in self.resv.items():
            [(state,)] = self.d.sql("SELECT state FROM reservations WHERE id = ?", (rid,))
            assert m["cancelled"] == "maybe" or (state == "cancelled") == m["cancelled"], (rid, m, state)
            m["cancelled"] = state == "cancelled"

    def check_money(self, rows):
        rc, out = ledger_verify(self.d.db_path)
        assert rc == 0 and out.strip().splitlines()[-1] == "ledger OK", f"seed {SEED}:\n{out}"
        con = sqlite3.connect(f"file:{self.d.db_path}?mode=ro", uri=True)
        try:
            con.execute("BEGIN")
            assert ledger_breaches(con) == [], f"seed {SEED}"
        finally:
            con.close()
        ivs = {}
        for iid, s, e in self.d.sql("SELECT instance_id, started_at, ended_at FROM running_intervals ORDER BY id"):
            ivs.setdefault(iid, []).append((s, e))
        for iid, (state, _, _) in rows.items():
            mine = ivs.get(iid, [])
            reserved = bool(self.inst[iid]["resv"])
            if reserved:
                assert mine == [], f"reserved instance {iid} has running intervals {mine}"
            assert sum(e is None for _, e in mine) == (state == "running" and not reserved), \
                (iid, state, mine)
            for (s1, e1), (s2, _) in zip(mine, mine[1:]):
                assert e1 is not None and e1 <= s2, f"{iid}: intervals overlap {mine}"
        # No time billed while an instance was not running.
        for t0, t1, idle in self.not_running:
            for iid in idle:
                for s, e in ivs.get(iid, []):
                    assert not (s < t1 and (e is None or e > t0)), \
                        f"{iid} billed {s}..{e} across {t0}..{t1}, when it was not running (seed {SEED})"

    def check(self):
        rows = self.settle()
        self.c.check_cards_consistent()
        self.check_pools()
        self.check_acknowledged(rows)
        last = {}

        def agree(fn):
            def f():
                last["v"] = fn()
                return last["v"] is True
            return f
        try:
            poll(agree(self.agents_match), DEADLINE, "agents to run what the database places")
        except AssertionError as e:
            raise AssertionError(f"{e} (seed {SEED}): {last['v']}\n{self.d.stderr_text()[-3000:]}")
        try:
            poll(agree(self.catalog_matches), DEADLINE, "/v1/gpu-types to count the cards")
        except AssertionError as e:
            raise AssertionError(f"{e} (seed {SEED}): {last['v']}")
        self.check_money(rows)
        return rows


def test_crashes_and_quiet_nodes_lose_nothing_and_give_no_card_twice(new_daemon, tmp_path):
    print(f"seed {SEED}, {ROUNDS} rounds (rerun with GPURENT_CRASH_SEED={SEED} GPURENT_CRASH_ROUNDS={ROUNDS})")
    rng = random.Random(SEED)
    # Half the seeds judge a silent node at once (offline at the third
    # missed beat), half are patient: a quiet node is then unreachable (its
    # instances unbilled) until it answers or 30 s pass on the clock.
    patient = rng.random() < 0.5
    options = {**OPTIONS, **({"node_lost_after_s": "30"} if patient else {})}
    print(f"patient nodes: {patient}")
    c = Cloud(new_daemon, tmp_path, options)
    d = c.d
    # Restarts keep the port: agents and clients know the daemon by it.
    d.listen = f"127.0.0.1:{d.port}"
    fleets = [c.fleet(2, prefix="a-"), c.fleet(2, prefix="b-"), c.fleet(1, prefix="c-"),
              c.fleet(2, model="H100-SXM", fabric="ib-1", prefix="h-")]
    h = Harness(c, rng)
    try:
        r = c.admin("PUT", "/v1/admin/prices/H100-SXM", json={"price_per_card_hour": "2.00", "effective_at":
                                                             iso(d.now())})
        assert r.status_code == 200, r.text
        h.users = [c.user(max_cards=64) for _ in range(3)]
        # Blocks for the next hours, which the clock then enters.
        for _ in range(4):
            h.note(h.op_book())
        h.jump(d.now() - d.now() % 3600 + 3600 + 60)
        for rnd in range(ROUNDS):
            ops = h.plan()
            h.claimed = set()
            kind = rng.choice(["daemon", "daemon", "daemon", "fleet_kill", "fleet_stop", "fleet_stop", "both",
                               "none"])
            fleet = rng.choice(fleets)
            quiet_for = rng.choice([0.05, 0.2, 0.6, 1.5, 2.5])
            h.log.append((rnd, kind, fleet.nodes and sorted(fleet.nodes)[0], quiet_for, ops))
            faulter = threading.Thread(target=h.fault, args=(kind, rng.choice([0.02, 0.1, 0.3, 0.6]) * rng.random(),
                                                          fleet, quiet_for))
            with ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(h.run, op) for op in ops]
                faulter.start()
                results = [f.result() for f in futures]
            faulter.join()
            h.recover(kind, fleet, outage=rng.choice([0, 0, 5, 45, 600]))
            if kind in ("daemon", "both") and rng.random() < 0.3:
                # Once more, while the new run makes its first passes.
                time.sleep(rng.uniform(0, 0.3))
                h.recover("daemon", fleet, kill=True)
            for res in results:
                h.note(res)
            h.resend_lost()
            t_settle = time.monotonic()
            h.check()
            print(f"round {rnd}: {kind}, {len(ops)} requests, settled in {time.monotonic() - t_settle:.1f} s")
            # Time moves on while things run (billing, block ends), or
            # while a node is silent.
            if rng.random() < 0.35:
                h.quiet_jump(rng.choice(fleets), rng.choice([5, 20, 45, 600, 3600]))
                h.check()
            else:
                h.jump(d.now() + rng.choice([1, 30, 120, 600, 1500]))
            d.request("POST", "/v1/admin/billing/run", key=d.admin_key, json={})
        h.check()
        made = len(h.inst)
        print(f"{made} instances, {len(h.resv)} reservations, {h.resent} sent again after a kill; states "
              f"{sorted({s for s, _, _ in h.instance_rows().values()})}")
    except BaseException:
        print(f"seed {SEED}; rounds so far: {h.log}")
        raise
    finally:
        for f in fleets:
            if f.proc is not None and f.proc.poll() is None:
                f.proc.send_signal(signal.SIGCONT)
        c.close()
