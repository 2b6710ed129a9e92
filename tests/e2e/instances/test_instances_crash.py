"""test_instances_crash.py: a seeded fault harness for inventory and
instances. Round after round, concurrent requests create single-node,
multi-node (gang) and reserved instances, stop, start and terminate them,
make and delete volumes, and book and cancel reservations, while gpurentd is
killed with SIGKILL at a random moment and started again on the same
database and port, and sim fleets are killed and brought back or stopped
with SIGSTOP for a while (nodes going quiet, sometimes long enough to be
judged offline), or gpurentd itself is stopped with SIGSTOP for a while
(requests time out; what it took is finished when it runs again, and lost
answers are sent again with their Idempotency-Key). Jobs with restart
policies exit on their own (the sim's exit-after images) under all of it,
and an operator races the renters: nodes are cordoned, drained, put in
maintenance or back to ready, and removed. Between rounds the operator
removes drained nodes once empty (their users asked to stop), brings
removed nodes back, and fails or repairs cards (a fleet started again with
inventory_failed_cards). After each round, once everything has settled, the
promise is checked from the API, the database and the agents' own lists:

* no card is held by two instances, an on-demand instance never sits on a
  reserved node, and a reserved one only on its block's nodes, within the
  cards the block holds there (billing never moves a block off a node its
  instances hold cards on, set aside, silent or refused as it may be);
* GET /v1/gpu-types counts what the node and card rows say;
* every instance reaches a settled state, and each agent runs exactly the
  workloads the database places on its node, on the cards it gives them;
* every acknowledged create, booking, change of desired state and volume
  deletion is there after the crash, and a create or booking whose answer
  was lost, sent again with its Idempotency-Key, exists once;
* `gpurentd ledger verify` passes (also on what each kill left on disk), and
  no instance is billed for any stretch of the testing clock during which it
  was not running; nor, when a node goes silent and the clock moves after
  it missed a beat but before it is judged, past that node's last good
  heartbeat (a billing pass runs in that window);
* nothing new is placed on a node set aside or removed, nor on a card
  reported failed, a job's restart by its policy included (it moves to
  healthy cards, or ends failed with no room for it); every acknowledged
  admin state and removal stands, and a removed node holds nothing;
* each job's restarts are numbered once each, as its policy allows, and it
  ends as its image and policy say;
* reservation credits are whole hours of lost cards at the block's price,
  and in an hour the clock entered after only cards failed, the cards
  credited are exactly those the bound nodes could not give.

The testing clock moves only between rounds, while nothing is in flight, so
"was not running" is known exactly. GPURENT_CRASH_SEED picks the seed (one
is drawn and printed otherwise) and GPURENT_CRASH_ROUNDS the number of
rounds (6 by default, some 15 to 25 s) for longer soaks."""
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
ROUNDS = int(os.environ.get("GPURENT_CRASH_ROUNDS", "6"))

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
# An admin's node states as the API names them, and as nodes.admin_state keeps them.
ADMIN_STATES = {"ready": "active", "cordoned": "cordoned", "draining": "draining", "maintenance": "maintenance"}
# Jobs: the sim's images say when they exit and with which status
# (runtime.c); each policy says what an exit leads to.
JOB_POLICIES = ("never", "on_failure", "always")


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
        self.jobs = {}        # instance id -> (restart_policy, the status its image exits with)
        self.admin_state = {}  # node name -> the admin states it may be in (acknowledged, or maybe)
        self.removed = {}     # node name -> True (acknowledged) | "maybe"
        self.failed = {}      # fleet prefix -> the card indexes it reports failed ("" for none)
        self.touched = set()  # nodes an operator's request of this round changes
        self.snapshot = None  # placements, closed nodes and failed cards when the last check ended
        self.timeout = 30     # seconds a request waits for its answer

    # ------------------------------------------------------------ requests

    def send(self, method, path, user, body=None, key=None):
        """The reply, or None when the daemon died before answering."""
        h = {"Idempotency-Key": key} if key else None
        token = user if isinstance(user, str) else user.key
        try:
            return self.d.request(method, path, key=token, json=body, headers=h, timeout=self.timeout) \
                if body is not None else self.d.request(method, path, key=token, headers=h, timeout=self.timeout)
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
        elif kind == "job":
            policy, code = self.rng.choice(JOB_POLICIES), self.rng.choice([0, 0, 3])
            ms = self.rng.choice([200, 600, 1500])
            body.update(card_count=self.rng.choice([1, 2, 4]), restart_policy=policy,
                        image=f"example/exit-after-{ms}" + (f"-exit-code-{code}" if code else "") + ":1")
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

    def node_id(self, name):
        [(nid,)] = self.d.sql("SELECT id FROM nodes WHERE name = ? AND removed_at IS NULL", (name,))
        return nid

    def op_node_state(self, name, state):
        r = self.send("POST", f"/v1/admin/nodes/{self.node_id(name)}/state", self.d.admin_key,
                      {"state": state, "reason": "crash harness"})
        return ("node_state", (name, state), r)

    def op_remove(self, name):
        return ("remove", name, self.send("DELETE", f"/v1/admin/nodes/{self.node_id(name)}", self.d.admin_key))

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
        # An operator's requests: at most one per node.
        nodes = [n for n, in self.d.sql("SELECT name FROM nodes WHERE removed_at IS NULL ORDER BY name")]
        self.rng.shuffle(nodes)
        self.touched = set()
        for _ in range(self.rng.randint(6, 14)):
            x = self.rng.random()
            if x < 0.24:
                ops.append(("create", "single"))
            elif x < 0.32:
                ops.append(("create", "gang"))
            elif x < 0.42:
                ops.append(("create", "resv"))
            elif x < 0.50:
                ops.append(("create", "job"))
            elif x < 0.74 and live:
                iid = live.pop()
                ops.append(("action", iid, self.rng.choice(["stop", "stop", "start", "start", "terminate"])))
            elif x < 0.80:
                ops.append(("volume",))
            elif x < 0.85:
                ops.append(("book",))
            elif x < 0.88:
                ops.append(("cancel",))
            elif x < 0.97 and nodes:
                name = nodes.pop()
                self.touched.add(name)
                ops.append(("node_state", name, self.rng.choice(["cordoned", "draining", "maintenance", "ready",
                                                                  "ready"])))
            elif nodes:
                name = nodes.pop()
                self.touched.add(name)
                ops.append(("remove", name))
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
        if op[0] == "node_state":
            return self.op_node_state(op[1], op[2])
        if op[0] == "remove":
            return self.op_remove(op[1])
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
                    if "restart_policy" in body:
                        code = body["image"].split("exit-code-")[1].split(":")[0] if "exit-code-" in body["image"] \
                            else "0"
                        self.jobs[oid] = (body["restart_policy"], int(code))
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
        elif what == "node_state":
            name, state = arg
            if r is None:
                self.admin_state[name] = self.admin_state.get(name, {"active"}) | {ADMIN_STATES[state]}
            else:
                assert r.status_code == 200, r.text
                assert r.json()["state"] in (state, "unreachable", "offline", "rejected", "pending"), r.text
                self.admin_state[name] = {ADMIN_STATES[state]}
        elif what == "remove":
            if r is None:
                self.removed[arg] = "maybe"
            elif r.status_code == 204:
                self.removed[arg] = True
            else:
                # Cards in use, or a block bound to it that no spare can take.
                assert r.status_code == 409 and r.json()["error"]["code"] == "conflict", r.text
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
        if kind == "daemon_stop":
            # gpurentd itself stops answering (a stalled host, a debugger)
            # while agents and clients go on: requests time out, and what
            # it already took is finished once it runs again.
            pause(self.d.proc)
            time.sleep(quiet_for)
            self.d.proc.send_signal(signal.SIGCONT)

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
            self.restart_fleet(fleet)

    def restart_fleet(self, fleet, failed=None):
        """Starts a fleet again on its old port, killing it first if it
        runs; failed (a card list, "" for none) changes the cards its nodes
        report failed. A node removed meanwhile registers afresh."""
        if fleet.proc is not None and fleet.proc.poll() is None:
            fleet.proc.kill()
            fleet.proc.wait(timeout=30)
        port = fleet.base_url.rsplit(":", 1)[1]
        args, i = [], 0
        while i < len(fleet.args):
            a = fleet.args[i]
            if a == "--listen" or (a == "-o" and fleet.args[i + 1].startswith("inventory_failed_cards=")):
                i += 2
                continue
            args.append(a)
            i += 1
        prefix = sorted(fleet.nodes)[0].rsplit("-", 1)[0]
        if failed is not None:
            self.failed[prefix] = failed
        if self.failed.get(prefix):
            args += ["-o", f"inventory_failed_cards={self.failed[prefix]}"]
        fleet.args = args + ["--listen", f"127.0.0.1:{port}"]
        fleet.start()
        assert fleet.base_url.endswith(f":{port}"), fleet.base_url
        for name, n in fleet.nodes.items():
            if n["status"] == "registered":
                assert self.removed.get(name) in (True, "maybe"), (name, fleet.stdout_text())
                del self.removed[name]
                self.admin_state[name] = {"active"}
            else:
                assert n["status"] == "kept" and self.removed.get(name) is not True, (name, fleet.stdout_text())
                self.removed.pop(name, None)  # a removal whose answer was lost did not happen

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
        self.settle()  # what the operators asked to stop is stopped first
        names = self.live_nodes(fleet)
        if not names:
            return self.jump(d.now() + seconds)
        marks = ",".join("?" * len(names))
        on_it = {i for (i,) in d.sql(f"SELECT DISTINCT p.instance_id FROM instance_nodes p JOIN nodes n"
                                     f" ON n.id = p.node_id WHERE n.name IN ({marks})", names)}
        pause(fleet.proc)
        try:
            def judged():
                # Nothing on it runs or moves any more until it answers.
                rows = self.instance_rows()
                now = d.now()
                # (A job waiting out its restart's backoff waits for the clock.)
                return all(rows[i][0] not in ("running", "provisioning", "pending", "stopping")
                           or (rows[i][0] == "pending" and rows[i][2] > now) for i in on_it) \
                    and d.sql(f"SELECT count(*) FROM nodes WHERE removed_at IS NULL AND name IN ({marks})"
                              f" AND (health = 'offline' OR unreachable_since IS NOT NULL)", names) == [(len(names),)]
            poll(judged, DEADLINE, f"{names} and their instances to be judged silent")
            self.jump(d.now() + seconds)
            # The pass that comes with the moved clock (lost, credits).
            r = d.request("POST", "/v1/admin/billing/run", key=d.admin_key, json={})
            assert r.status_code == 200, r.text
        finally:
            fleet.proc.send_signal(signal.SIGCONT)

    def silent_bill(self, fleet, seconds):
        """A node stops answering and the clock moves on after it has
        missed a beat but (as a rule) before the daemon judges it: billing
        runs in that window, and no instance on it may be charged past its
        node's last good heartbeat, then or after.

        The window follows the rule the daemon bills by (ARCHITECTURE.md,
        "Only time known to have run is charged"): an interval is charged
        up to now until one of its nodes misses a beat, and from then only
        up to that node's last good one. So the nodes first answer at the
        current clock: otherwise billing may already have charged up to it
        (settle() may have moved it) before their first beat there. And the
        miss waited for is one of this silence: a miss left from before the
        pause (a restart, a slow reply) may be followed by the answer of a
        pass asked before it, which lifts the cap again. Removed nodes do
        not count: one registered again under its name keeps its old row."""
        d = self.d
        self.settle()
        live = self.live_nodes(fleet)
        if not live:
            return self.jump(d.now() + seconds)
        marks = ",".join("?" * len(live))
        liveness = (f"SELECT n.id, l.missed_beats, l.last_seen_at FROM node_liveness l JOIN nodes n"
                    f" ON n.id = l.node_id WHERE n.removed_at IS NULL AND n.name IN ({marks})")
        now = d.now()
        poll(lambda: all(m == 0 and t == now for _, m, t in d.sql(liveness, live)), DEADLINE,
             f"{live} to answer at {now}")
        pause(fleet.proc)
        try:
            # Counted after the pause: a pass asked before it may still
            # write an answer (0) or a miss; a count above this one is a
            # miss after whatever that pass wrote, and no answer follows.
            before = {n: m for n, m, _ in d.sql(liveness, live)}
            poll(lambda: all(m > before[n] for n, m, _ in d.sql(liveness, live)), DEADLINE,
                 f"{live} to miss a heartbeat")
            last = {n: t for n, _, t in d.sql(liveness, live)}
            heard = {}
            for iid, node in d.sql(f"SELECT p.instance_id, p.node_id FROM instance_nodes p JOIN instances i"
                                   f" ON i.id = p.instance_id WHERE i.reservation_id IS NULL"
                                   f" AND p.node_id IN ({','.join('?' * len(last))})", list(last)):
                heard[iid] = min(heard.get(iid, last[node]), last[node])
            to = d.now() + seconds
            for iid, t in heard.items():
                self.not_running.append((t, to, {iid}))
            self.jump(to)
            r = d.request("POST", "/v1/admin/billing/run", key=d.admin_key, json={})
            assert r.status_code == 200, r.text
            [(price,)] = d.sql("SELECT card_hour FROM prices WHERE gpu_model = 'MI450'")
            for iid, t in heard.items():
                for s, e, cards, billed in d.sql("SELECT started_at, ended_at, card_count, billed FROM"
                                                 " running_intervals WHERE instance_id = ?", (iid,)):
                    end = min(t, e if e is not None else t)
                    due = price * cards * max(0, end - s) // 3600
                    assert billed <= due, \
                        f"{iid}: {billed} billed for {s}..{e}, its node last answered at {t} (seed {SEED})"
            poll(lambda: d.sql(f"SELECT count(*) FROM nodes WHERE removed_at IS NULL AND name IN ({marks})"
                               f" AND (health = 'offline' OR unreachable_since IS NOT NULL)", live) == [(len(live),)]
                 and not [i for i in heard if self.instance_rows()[i][0] == "running"],
                 DEADLINE, f"{live} and their instances to be judged silent")
            seen = d.sql(liveness, live)
            for iid, t in heard.items():
                for s, e, why in d.sql("SELECT started_at, ended_at, end_reason FROM running_intervals"
                                       " WHERE instance_id = ?", (iid,)):
                    assert s > t or (e is not None and e <= t), \
                        f"{iid}: interval {s}..{e} ({why}) runs past {t}, its node's last good heartbeat " \
                        f"(seed {SEED}); nodes now {seen}, before {last}"
        finally:
            fleet.proc.send_signal(signal.SIGCONT)

    def live_nodes(self, fleet):
        marks = ",".join("?" * len(fleet.nodes))
        return sorted(n for (n,) in self.d.sql(f"SELECT name FROM nodes WHERE removed_at IS NULL AND name IN ({marks})",
                                               sorted(fleet.nodes)))

    # ------------------------------------------------------------ operators

    def operate(self, fleets):
        """Between rounds, as an operator would: drained nodes are removed
        once empty (their users asked to stop what runs there), removed
        nodes come back, cards fail or are repaired. Returns whether the
        reserved pool's cards changed."""
        d = self.d
        for name, states in list(self.admin_state.items()):
            if states != {"draining"} or name in self.removed:
                continue
            [(nid, used)] = d.sql("SELECT id, (SELECT count(*) FROM node_cards c WHERE c.node_id = n.id"
                                  " AND c.instance_id IS NOT NULL) FROM nodes n WHERE name = ? AND removed_at IS NULL",
                                  (name,))
            if used == 0:
                r = d.request("DELETE", f"/v1/admin/nodes/{nid}", key=d.admin_key)
                if r.status_code == 204:
                    self.removed[name] = True
                    assert d.sql("SELECT count(*) FROM instance_nodes WHERE node_id = ?", (nid,)) == [(0,)]
                else:
                    assert r.status_code == 409 and "hour" in r.json()["error"], r.text
            elif self.rng.random() < 0.6:
                for (iid,) in d.sql("SELECT DISTINCT instance_id FROM instance_nodes WHERE node_id = ?", (nid,)):
                    r = self.send("POST", f"/v1/instances/{iid}/stop", self.inst[iid]["user"])
                    assert r is not None and r.status_code in (200, 409), r
                    if r.status_code == 200:
                        self.inst[iid]["desired"] = {"stopped"}
        changed = False
        x = self.rng.random()
        if x < 0.3 and any(v is True for v in self.removed.values()):
            fleet = self.c.node_fleet(next(n for n, v in self.removed.items() if v is True))
            self.restart_fleet(fleet)
            self.wait_cards(fleet)
            changed = fleet is fleets[-1]
        elif x < 0.55:
            fleet = self.rng.choice(fleets)
            prefix = sorted(fleet.nodes)[0].rsplit("-", 1)[0]
            self.restart_fleet(fleet, "" if self.failed.get(prefix) else self.rng.choice(["3", "1,6", "0", "7"]))
            self.wait_cards(fleet)
            changed = fleet is fleets[-1]
        return changed

    def wait_cards(self, fleet):
        """Until every node of the fleet is up with the cards it reports failed."""
        prefix = sorted(fleet.nodes)[0].rsplit("-", 1)[0]
        want = sorted(int(i) for i in self.failed.get(prefix, "").split(",") if i)
        live = self.live_nodes(fleet)

        def seen():
            for name in live:
                rows = self.d.sql("SELECT n.health, c.idx, c.healthy FROM nodes n JOIN node_cards c"
                                  " ON c.node_id = n.id WHERE n.name = ? AND n.removed_at IS NULL", (name,))
                if len(rows) != 8 or any(h != "up" for h, _, _ in rows) or \
                        sorted(i for _, i, ok in rows if not ok) != want:
                    return False
            return True
        poll(seen, DEADLINE, f"{live} up with failed cards {want}")

    def take_snapshot(self):
        """What placements must respect until the next check: the nodes set
        aside or removed, and the cards reported failed."""
        d = self.d
        self.snapshot = {
            "workloads": {w for (w,) in d.sql("SELECT workload_id FROM instance_nodes")},
            "pairs": set(d.sql("SELECT instance_id, node_id FROM instance_nodes")),
            "closed": dict(d.sql("SELECT id, name FROM nodes WHERE admin_state <> 'active' OR removed_at IS NOT NULL")),
            "failed": set(d.sql("SELECT node_id, idx FROM node_cards WHERE healthy = 0")),
        }

    def check_placements(self):
        """No workload put since the snapshot went on a card reported failed
        by then, nor any new placement on a node then set aside or removed
        (unless a request of this round brought it back)."""
        snap = self.snapshot
        if snap is None:
            return
        for iid, node, wl, cards in self.d.sql("SELECT instance_id, node_id, workload_id, cards FROM instance_nodes"):
            if wl in snap["workloads"]:
                continue
            bad = [c for c in json.loads(cards) if (node, c) in snap["failed"]]
            assert not bad, f"{iid} put on cards {bad} of {node}, reported failed (seed {SEED})"
            if node in snap["closed"] and snap["closed"][node] not in self.touched:
                assert (iid, node) in snap["pairs"], \
                    f"{iid} placed on {snap['closed'][node]}, which was set aside or removed (seed {SEED})"

    def check_nodes(self):
        """Every acknowledged admin state and removal is there, and a removed
        node holds nothing."""
        d = self.d
        for name, v in list(self.removed.items()):
            live = d.sql("SELECT count(*) FROM nodes WHERE name = ? AND removed_at IS NULL", (name,))[0][0]
            assert v == "maybe" or live == 0, f"acknowledged removal of {name} is gone"
            if live:
                del self.removed[name]
        for name, states in list(self.admin_state.items()):
            if name in self.removed:
                continue
            [(state,)] = d.sql("SELECT admin_state FROM nodes WHERE name = ? AND removed_at IS NULL", (name,))
            assert state in states, f"{name}: admin state {state}, acknowledged {states} (seed {SEED})"
            self.admin_state[name] = {state}
        assert d.sql("SELECT c.node_id, c.idx FROM node_cards c JOIN nodes n ON n.id = c.node_id"
                     " WHERE n.removed_at IS NOT NULL AND c.instance_id IS NOT NULL") == []
        assert d.sql("SELECT p.instance_id FROM instance_nodes p JOIN nodes n ON n.id = p.node_id"
                     " WHERE n.removed_at IS NOT NULL") == []

    def check_jobs(self):
        """Each job's restarts are counted once, in order, and only as its
        policy allows; how it ended is what its image and policy say."""
        con = sqlite3.connect(f"file:{self.d.db_path}?mode=ro", uri=True)
        try:
            con.execute("BEGIN")
            rows = {i: r for i, *r in con.execute("SELECT id, state, restart_count, exit_code, state_reason"
                                                  " FROM instances")}
            events = {}
            for iid, reason in con.execute("SELECT instance_id, reason FROM instance_events ORDER BY seq"):
                events.setdefault(iid, []).append(reason)
        finally:
            con.close()
        for iid, (policy, code) in self.jobs.items():
            state, count, exit_code, why = rows[iid]
            n = 0
            for reason in events.get(iid, []):
                if reason in ("created", "started by the user"):
                    n = 0
                elif reason.startswith("restart "):
                    n += 1
                    assert reason.startswith(f"restart {n} "), f"{iid} ({policy}): {events[iid]} (seed {SEED})"
                    assert policy != "never", f"{iid}: a never job restarted: {reason}"
                    assert policy == "always" or "exited with status 0" not in reason, reason
            assert count == n, f"{iid} ({policy}): restart_count {count}, {n} restarts since its start: {events[iid]}"
            if state == "succeeded":
                assert policy != "always" and code == 0 and exit_code == 0, (iid, policy, code, rows[iid])
            if state == "failed" and why.startswith("workload exited"):
                assert policy == "never" and exit_code == code != 0, (iid, policy, code, rows[iid])

    def check_credits(self, exact):
        """Reservation credits: each hour's grant is its lost cards at the
        block's price, never more cards than it holds; and in an hour in
        which nothing but failed cards took capacity (exact), the cards
        credited are the cards the bound nodes could not give."""
        d = self.d
        blocks = {r: (c, p, cr) for r, c, p, cr in d.sql("SELECT id, card_count, card_hour, credited FROM reservations")}
        per = {}
        for rid, hour, cards, amount in d.sql("SELECT reservation_id, hour, cards, amount FROM reservation_credits"):
            n, price, _ = blocks[rid]
            assert 0 < cards <= n, (rid, hour, cards, n)
            per[rid] = per.get(rid, 0) + amount
            assert amount <= cards * price, (rid, hour, cards, amount)
        for rid, (n, price, credited) in blocks.items():
            assert credited == per.get(rid, 0), f"{rid}: credited {credited}, hours {per.get(rid, 0)}"
        if not exact:
            return
        now = d.now()
        hour = now - now % 3600
        # A reserved instance placed this hour (a job's restart the jump
        # made due) may have moved its block to a spare after a pass had
        # credited the hour by the old node: the hour is then not checked
        # exactly against the bindings as they are now.
        if d.sql("SELECT 1 FROM instances i WHERE i.reservation_id IS NOT NULL AND (i.state IN ('pending',"
                 " 'provisioning') OR EXISTS (SELECT 1 FROM instance_events e WHERE e.instance_id = i.id"
                 " AND e.at >= ?)) LIMIT 1", (hour,)):
            return
        nodes = {i: (h, u, a, rm) for i, h, u, a, rm in d.sql(
            "SELECT id, health, unreachable_since, admin_state, removed_at FROM nodes WHERE gpu_model = 'H100-SXM'")}
        held = {}
        for node, cards in d.sql("SELECT b.node_id, b.cards FROM reservation_nodes b JOIN reservations r"
                                 " ON r.id = b.reservation_id WHERE r.state = 'booked' AND r.starts_at <= ?"
                                 " AND ? < r.ends_at", (hour, hour)):
            held[node] = held.get(node, 0) + cards
        short = 0
        for node, n in held.items():
            h, unreach, admin, removed = nodes[node]
            if removed is None and (h != "up" or unreach is not None or admin != "active"):
                return  # credited by other rules: not checked exactly
            usable = 0 if removed is not None else \
                d.sql("SELECT count(*) FROM node_cards WHERE node_id = ? AND healthy = 1", (node,))[0][0]
            short += max(0, n - usable)
        got = d.sql("SELECT coalesce(sum(c.cards), 0) FROM reservation_credits c WHERE c.hour = ?", (hour,))[0][0]
        assert got == short, f"hour {hour}: {got} cards credited, the bound nodes were short of {short} " \
                             f"(seed {SEED}): {d.sql('SELECT * FROM reservation_credits WHERE hour = ?', (hour,))}"

    def agents_match(self):
        """Each agent runs exactly the workloads the database places on its
        node, on the cards it gives them."""
        want, waiting = {}, set()
        for name, wl, cards, state in self.d.sql("SELECT n.name, p.workload_id, p.cards, i.state FROM instance_nodes p"
                                                 " JOIN nodes n ON n.id = p.node_id"
                                                 " JOIN instances i ON i.id = p.instance_id"):
            if state == "pending":
                # A job waiting out its restart's backoff, its next
                # workloads not yet put (or just put).
                waiting.add(wl)
                continue
            want.setdefault(name, {})[wl] = sorted(json.loads(cards))
        # A removed node's agent is the operator's to stop: the daemon no
        # longer asks it anything.
        got = {name: {w["id"]: sorted(w["gpus"]) for w in wls if w["id"] not in waiting}
               for name, wls in self.c.all_workloads().items() if name not in self.removed}
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
            assert (rid, node) in bound, f"instance {iid} of {rid} on node {node} its block does not hold " \
                f"(seed {SEED}): {d.sql('SELECT * FROM reservation_nodes WHERE reservation_id = ?', (rid,))}"
            used[(rid, node)] = used.get((rid, node), 0) + len(json.loads(cards))
        for k, n in used.items():
            assert n <= bound[k], f"block {k} holds {bound[k]} cards there, its instances use {n}"
        # No node-hour is bound past its cards. A block re-homed holds its
        # new node from the hour it moved in (bound_at), not the hours
        # before, which that node may have given another block.
        per = {}
        for node, cards, s, e, at in d.sql("SELECT b.node_id, b.cards, r.starts_at, r.ends_at, b.bound_at"
                                           " FROM reservation_nodes b JOIN reservations r ON r.id = b.reservation_id"
                                           " WHERE r.state = 'booked'"):
            for h in range(max(s, at - at % 3600), e, 3600):
                per[(node, h)] = per.get((node, h), 0) + cards
        assert all(v <= 8 for v in per.values()), f"{per} (seed {SEED})"

    def catalog_matches(self):
        """GET /v1/gpu-types against the node and card rows."""
        rows = self.d.sql(
            "SELECT n.gpu_model, n.health, n.unreachable_since, n.admin_state, c.healthy, c.instance_id,"
            " n.pool = 'reserved' OR t.reservation_required, n.id, n.fabric, n.card_count FROM node_cards c"
            " JOIN nodes n ON n.id = c.node_id JOIN gpu_types t ON t.code = n.gpu_model WHERE n.removed_at IS NULL")
        want, free_on = {}, {}
        for model, health, unreach, admin, healthy, holder, reserved, node, fabric, cards in rows:
            w = want.setdefault(model, [0, 0, 0, 0, 0])
            usable = health == "up" and admin == "active" and healthy == 1
            w[0] += health in ("up", "offline")
            free = usable and unreach is None and holder is None and not reserved
            w[1] += free
            w[2] += holder is not None
            w[3] += usable and bool(reserved)
            k = (model, fabric, node, cards)
            free_on[k] = free_on.get(k, 0) + free
        # The largest one create can take: up to 8 cards of one node, or
        # whole free 8-card nodes of one fabric (up to 32 of them).
        for model, w in want.items():
            whole = {}
            for (m, fabric, node, cards), free in free_on.items():
                if m == model:
                    w[4] = max(w[4], min(free, 8))
                    whole[fabric] = whole.get(fabric, 0) + (cards == 8 and free == 8)
            most = min(max(whole.values(), default=0), 32)
            if most >= 2:
                w[4] = 8 * most
        r = self.d.get("/v1/gpu-types")
        assert r.status_code == 200, r.text
        got = {t["code"]: [t["cards_total"], t["cards_free"], t["cards_in_use"], t["cards_reservable"],
                           t["cards_launchable"]]
               for t in r.json()["data"] if t["code"] in want}
        return True if got == want else (got, want)

    def check_acknowledged(self, rows):
        now = self.d.now()
        for iid, m in self.inst.items():
            assert iid in rows, f"acknowledged create {iid} is gone (seed {SEED})"
            state, desired, _ = rows[iid]
            if m["resv"] and now >= self.resv[m["resv"]]["end"] and m["desired"] != {"terminated"}:
                m["desired"] = m["desired"] | {"stopped"}  # the block's end stops it
            if iid in self.jobs and state in ("succeeded", "failed") and m["desired"] != {"terminated"}:
                m["desired"] = m["desired"] | {"stopped"}  # a job that is over is settled so
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
        # Every instance but a terminated one keeps its volume.
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
            # States and intervals from one snapshot: a job may end or
            # restart while this reads.
            rows = {i: (s,) for i, s in con.execute("SELECT id, state FROM instances")}
            ivs = {}
            for iid, s, e in con.execute("SELECT instance_id, started_at, ended_at FROM running_intervals"
                                         " ORDER BY id"):
                ivs.setdefault(iid, []).append((s, e))
        finally:
            con.close()
        for iid, (state,) in rows.items():
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
        self.check_nodes()
        self.check_placements()
        self.check_jobs()
        self.check_credits(False)
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
        for ms in (200, 600, 1500):
            for code in ("", "-exit-code-3"):
                c.add_image(f"example/exit-after-{ms}{code}:1")
        # Blocks for the next hours, which the clock then enters.
        for _ in range(4):
            h.note(h.op_book())
        h.jump(d.now() - d.now() % 3600 + 3600 + 60)
        for rnd in range(ROUNDS):
            t_round = time.monotonic()
            ops = h.plan()
            h.claimed = set()
            kind = rng.choice(["daemon", "daemon", "daemon", "fleet_kill", "fleet_stop", "fleet_stop", "both",
                               "daemon_stop", "daemon_stop", "none"])
            fleet = rng.choice(fleets)
            quiet_for = rng.choice([0.05, 0.2, 0.6, 1.5, 2.5])
            # While gpurentd is stopped, requests time out rather than fail.
            h.timeout = rng.choice([0.5, 1.0]) if kind == "daemon_stop" else 30
            h.log.append((rnd, kind, fleet.nodes and sorted(fleet.nodes)[0], quiet_for, ops))
            faulter = threading.Thread(target=h.fault, args=(kind, rng.choice([0.02, 0.1, 0.3, 0.6]) * rng.random(),
                                                          fleet, quiet_for))
            with ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(h.run, op) for op in ops]
                faulter.start()
                results = [f.result() for f in futures]
            faulter.join()
            # A node this round removed registers afresh when its fleet
            # starts again (restart_fleet), which must know of the removal.
            for res in results:
                if res is not None and res[0] == "remove":
                    h.note(res)
            h.recover(kind, fleet, outage=rng.choice([0, 0, 5, 45, 600]))
            if kind in ("daemon", "both") and rng.random() < 0.3:
                # Once more, while the new run makes its first passes.
                time.sleep(rng.uniform(0, 0.3))
                h.recover("daemon", fleet, kill=True)
            h.timeout = 30
            if kind == "daemon_stop":
                # What it took before it stopped it answers first; then
                # what timed out is sent again.
                time.sleep(0.5)
            for res in results:
                if res is None or res[0] != "remove":
                    h.note(res)
            h.resend_lost()
            t_settle = time.monotonic()
            h.check()
            t_op = time.monotonic()
            reserved_changed = h.operate(fleets)
            h.settle()  # a fleet started again leaves its instances unreachable for a moment
            t_quiet = time.monotonic()
            h.take_snapshot()
            # Time moves on while things run (billing, block ends), or
            # while a node is silent, before or after it is judged so.
            x = rng.random()
            if x < 0.25:
                h.quiet_jump(rng.choice(fleets), rng.choice([5, 20, 45, 600, 3600]))
                h.check()
            elif x < 0.45:
                h.silent_bill(rng.choice(fleets[:3]), rng.choice([5, 20, 45, 600]))
                h.check()
            else:
                now = d.now()
                # Into a fresh hour when the reserved pool's cards changed:
                # that hour's credits are then checked exactly.
                to = now - now % 3600 + 3600 + 30 if reserved_changed or rng.random() < 0.2 \
                    else now + rng.choice([1, 30, 120, 600, 1500])
                h.jump(to)
                if to % 3600 == 30:
                    r = d.request("POST", "/v1/admin/billing/run", key=d.admin_key, json={})
                    assert r.status_code == 200, r.text
                    h.check_credits(True)
            d.request("POST", "/v1/admin/billing/run", key=d.admin_key, json={})
            print(f"round {rnd}: {kind}, {len(ops)} requests, settled in {t_op - t_settle:.1f} s; operators "
                  f"{t_quiet - t_op:.1f} s, time moving {time.monotonic() - t_quiet:.1f} s, "
                  f"{time.monotonic() - t_round:.1f} s in all")
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
