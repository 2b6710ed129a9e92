"""instances_util.py: a small cloud for instance tests: a real gpurentd with
real `gpurent-agent sim-fleet` processes registered to it, and the checks the
instance tests share.

Agents are asked directly: each fleet node's secret is read from the fleet's
state directory (nodes/NAME/registration.json), and its workloads come from
a signed GET /v1/workloads. What the control plane put (the spec's volumes
and environment, which the agent's API does not echo) is read from the
agent's durable workload record, nodes/NAME/workloads/ID.json.

Cloud(new_daemon, tmp_path, options=None)
    starts a gpurentd on a testing clock with fast reconcile and heartbeat
    periods (FAST_CLOUD, overridable by options).
  fleet(nodes, model="MI450", fabric="fabric-a", prefix=None, sim=None,
        cards=8) -> Fleet
        starts a sim fleet registered to the daemon (prefix defaults to a
        fresh one per fleet, so several fleets never clash) and waits for
        every node to be up with its cards.
  user(funds="100000.00", max_cards=None) -> Account
        a signed-up user, topped up and optionally with a card quota.
  create(acct, expect=201, **body) -> dict; wait_state(acct, id, states)
  add_image(ref, stack="ROCm") -> dict
  node_fleet(name) -> Fleet; workloads(name) -> [workload]; record(name, id)
  check_running(acct, inst_id) -> instance: asserts the instance runs on
        the nodes and cards the database gives it, the agents run exactly
        those workloads with the image, cards, /shared volume and
        distributed-job environment.
  check_cards_consistent(): no card held twice, node_cards and
        instance_nodes agree, agents hold no workload on a card twice.
  wait_no_orphans(): polls until every agent runs only workloads that an
        instance owns (the reconciler's sweep deletes the others).
  restart_fleet(f): starts a stopped or killed fleet again on its old port.

Fixtures: cloud (a Cloud with FAST_CLOUD options); cloud_with(**options)
makes a fixture whose daemon has extra options.
"""
import itertools
import json
import os
import uuid

import pytest

from agent_util import Fleet, poll

# Periods short enough that tests wait for milliseconds, not seconds.
FAST_CLOUD = {
    "reconcile_interval_ms": "100",
    "reconcile_sweep_ms": "300",
    "heartbeat_interval_ms": "100",
    "heartbeat_miss_limit": "3",
    # No unreachable stage unless a test asks for one: a silent node is
    # offline at the miss limit (test_unreachable.py covers the stage).
    "node_lost_after_s": "0",
    "agent_timeout_ms": "2000",
    "agent_connect_timeout_ms": "500",
    "provision_timeout_s": "600",
    "billing_interval_ms": "60000",
    "volume_source_template": "nfs.example:/export/{user_id}/{volume_id}",
}
SIM_DELAYS = {"sim_pull_ms": "40", "sim_mount_ms": "40", "sim_start_ms": "40"}
HOLDING = ("pending", "provisioning", "running", "stopping", "unreachable")
DEADLINE = 60  # a bound on polls, generous for sanitizer builds; tests finish far sooner


class Cloud:
    _prefixes = itertools.count()

    def __init__(self, new_daemon, tmp_path, options=None):
        self.tmp = tmp_path
        self.d = new_daemon(options={**FAST_CLOUD, **(options or {})})
        self.fleets = []
        self.payments = itertools.count()
        # Every fleet of the cloud mounts its volumes here: the sim's
        # stand-in for the one network store all real nodes mount.
        self.network_store = tmp_path / "network-store"

    # ------------------------------------------------------------ fleet

    def fleet(self, nodes, model="MI450", fabric="fabric-a", prefix=None, sim=None, cards=8):
        prefix = prefix or f"f{next(self._prefixes)}-{model.lower()}-"
        f = Fleet(self.tmp / f"fleet-{prefix.rstrip('-')}", self.d.base_url, nodes=nodes, model=model, cards=cards,
                  admin_key=self.d.admin_key, extra=("--fabric", fabric, "--name-prefix", prefix),
                  options={**SIM_DELAYS, "mount_root": str(self.network_store), **(sim or {})})
        assert len(f.nodes) == nodes and all(n["status"] in ("registered", "kept") for n in f.nodes.values()), \
            f.stdout_text()
        self.fleets.append(f)
        self.wait_nodes_up(list(f.nodes), cards)
        return f

    def wait_nodes_up(self, names, cards=8):
        marks = ",".join("?" * len(names))

        def up():
            rows = self.d.sql(f"SELECT n.name, n.health, (SELECT count(*) FROM node_cards c WHERE c.node_id = n.id)"
                              f" FROM nodes n WHERE n.removed_at IS NULL AND n.name IN ({marks})", names)
            return len(rows) == len(names) and all(h == "up" and c == cards for _, h, c in rows)
        poll(up, DEADLINE, f"nodes {names[:3]}... to be up")

    def node_fleet(self, name):
        for f in self.fleets:
            if name in f.nodes:
                return f
        raise AssertionError(f"no fleet serves node {name}")

    def secret(self, name):
        f = self.node_fleet(name)
        with open(os.path.join(f.state_dir, "nodes", name, "registration.json")) as fh:
            return json.load(fh)["secret"]

    def agent(self, name, method, path, **kw):
        return self.node_fleet(name).request(name, self.secret(name), method, path, **kw)

    def workloads(self, name):
        r = self.agent(name, "GET", "/v1/workloads")
        assert r.status_code == 200, r.text
        return r.json()["workloads"]

    def all_workloads(self, fleets=None):
        """{node name: [workload]} over every node of every (running) fleet."""
        out = {}
        for f in fleets or self.fleets:
            if f.proc is None or f.proc.poll() is not None:
                continue
            for name in f.nodes:
                out[name] = self.workloads(name)
        return out

    def restart_fleet(self, f):
        """Starts a stopped or killed fleet again on its old port (gpurentd
        keeps calling the URLs it registered), with its state directory."""
        port = f.base_url.rsplit(":", 1)[1]
        f.args += ["--listen", f"127.0.0.1:{port}"]
        f.start()
        assert f.base_url.endswith(f":{port}"), f.base_url
        assert all(n["status"] == "kept" for n in f.nodes.values()), f.stdout_text()

    def fail_cards(self, f, cards):
        """Card indexes `cards` ("1" or "1,6") of every node of fleet f fail:
        the fleet is killed, its nodes waited for until unreachable (a daemon
        with a long node_lost_after_s keeps them from being lost), and it is
        started again reporting those cards failed, until the database has
        them so."""
        names = sorted(f.nodes)
        f.proc.kill()
        f.proc.wait()
        marks = ",".join("?" * len(names))

        def silent():
            rows = self.d.sql(f"SELECT unreachable_since FROM nodes WHERE name IN ({marks})", names)
            return len(rows) == len(names) and all(t is not None for (t,) in rows)
        wait(silent, what=f"{names} to be unreachable")
        args, i = [], 0
        while i < len(f.args):  # an earlier failure is replaced, not added to
            if f.args[i] == "-o" and f.args[i + 1].startswith("inventory_failed_cards="):
                i += 2
                continue
            args.append(f.args[i])
            i += 1
        f.args = args + ["-o", f"inventory_failed_cards={cards}"]
        self.restart_fleet(f)
        want = sorted(int(c) for c in cards.split(","))

        def reported():
            for name in names:
                rows = self.d.sql("SELECT n.health, n.unreachable_since, c.idx, c.healthy FROM nodes n"
                                  " JOIN node_cards c ON c.node_id = n.id WHERE n.name = ?", (name,))
                if any(h != "up" or t is not None for h, t, _, _ in rows) or \
                        sorted(i for _, _, i, ok in rows if not ok) != want:
                    return False
            return True
        wait(reported, what=f"{names} up with cards {want} failed")

    def record(self, name, wl_id):
        f = self.node_fleet(name)
        with open(os.path.join(f.state_dir, "nodes", name, "workloads", f"{wl_id}.json")) as fh:
            return json.load(fh)

    # ------------------------------------------------------------ users

    def admin(self, method, path, **kw):
        return self.d.request(method, path, key=self.d.admin_key, **kw)

    def set_node_state(self, name, state):
        """The admin puts the live node so named in state (ready, cordoned,
        draining, maintenance)."""
        [(node,)] = self.d.sql("SELECT id FROM nodes WHERE name = ? AND removed_at IS NULL", (name,))
        r = self.admin("POST", f"/v1/admin/nodes/{node}/state", json={"state": state, "reason": "test"})
        assert r.status_code == 200, r.text

    def user(self, funds="100000.00", max_cards=None):
        u = self.d.signup()
        if funds:
            r = self.admin("POST", f"/v1/admin/users/{u.id}/topups",
                           json={"amount": funds, "payment_id": f"pay-{uuid.uuid4().hex}"})
            assert r.status_code in (200, 201), r.text
        if max_cards is not None:
            self.set_max_cards(u, max_cards)
        return u

    def set_max_cards(self, u, n):
        r = self.admin("PUT", f"/v1/admin/users/{u.id}/limits", json={"max_cards": n})
        assert r.status_code == 200, r.text
        assert r.json()["user_id"] == u.id and r.json()["max_cards"] == n, r.text

    def add_image(self, ref, stack="ROCm"):
        r = self.admin("POST", "/v1/admin/images", json={"ref": ref, "stack": stack})
        assert r.status_code == 201, r.text
        return r.json()

    # ------------------------------------------------------------ instances

    def create(self, acct, expect=201, headers=None, **body):
        body.setdefault("gpu_type", "MI450")
        body.setdefault("image", "rocm/pytorch:2.3-rocm6.2")
        r = self.d.post("/v1/instances", key=acct.key, json=body, headers=headers)
        assert r.status_code == expect, r.text
        return r.json()

    def get(self, acct, inst_id):
        r = self.d.get(f"/v1/instances/{inst_id}", key=acct.key)
        assert r.status_code == 200, r.text
        return r.json()

    def action(self, acct, inst_id, verb, expect=200):
        if verb == "terminate":
            r = self.d.delete(f"/v1/instances/{inst_id}", key=acct.key)
        else:
            r = self.d.post(f"/v1/instances/{inst_id}/{verb}", key=acct.key)
        assert r.status_code == expect, r.text
        return r.json()

    def wait_state(self, acct, inst_id, states, timeout=DEADLINE):
        states = {states} if isinstance(states, str) else set(states)
        last = {}

        def check():
            last["i"] = self.get(acct, inst_id)
            return last["i"] if last["i"]["state"] in states else None
        try:
            return poll(check, timeout, f"instance {inst_id} to be {sorted(states)}")
        except AssertionError as e:
            raise AssertionError(f"{e}\ninstance: {last.get('i')}\ndaemon log:\n{self.d.stderr_text()[-3000:]}")

    def events(self, acct, inst_id):
        out, cursor = [], None
        while True:
            r = self.d.get(f"/v1/instances/{inst_id}/events", key=acct.key,
                           params={"limit": 3, **({"cursor": cursor} if cursor else {})})
            assert r.status_code == 200, r.text
            body = r.json()
            out += body["data"]
            cursor = body["next_cursor"]
            if not cursor:
                return out

    def volume(self, acct, vol_id):
        r = self.d.get(f"/v1/volumes/{vol_id}", key=acct.key)
        assert r.status_code == 200, r.text
        return r.json()

    # ------------------------------------------------------------ checks

    def held_cards(self, inst_id):
        """{node name: [card idx]} that node_cards gives the instance."""
        out = {}
        for name, idx in self.d.sql("SELECT n.name, c.idx FROM node_cards c JOIN nodes n ON n.id = c.node_id"
                                    " WHERE c.instance_id = ? ORDER BY n.name, c.idx", (inst_id,)):
            out.setdefault(name, []).append(idx)
        return out

    def check_running(self, acct, inst_id):
        inst = self.get(acct, inst_id)
        assert inst["state"] == "running", inst
        nodes = inst["nodes"]
        n = len(nodes)
        assert [p["rank"] for p in nodes] == list(range(n)), nodes
        assert sum(len(p["cards"]) for p in nodes) == inst["card_count"], inst
        if inst["card_count"] > 8:
            assert n == inst["card_count"] // 8 and all(p["cards"] == list(range(8)) for p in nodes), nodes
            fabrics = {f for (f,) in self.d.sql(
                f"SELECT DISTINCT fabric FROM nodes WHERE id IN ({','.join('?' * n)})", [p["node_id"] for p in nodes])}
            assert len(fabrics) == 1, f"a multi-node instance spans fabrics {fabrics}"
        else:
            assert n == 1, nodes
        assert len({p["node_id"] for p in nodes}) == n, "a node appears twice"
        # The database's card claims are exactly what the instance shows.
        assert self.held_cards(inst_id) == {p["node_name"]: sorted(p["cards"]) for p in nodes}
        vol = self.volume(acct, inst["volume_id"])
        source = self.d.sql("SELECT source FROM volumes WHERE id = ?", (inst["volume_id"],))[0][0]
        assert inst["volume_id"] in source, source
        rows = dict(self.d.sql("SELECT rank, workload_id FROM instance_nodes WHERE instance_id = ?", (inst_id,)))
        master = nodes[0]["node_name"]
        for p in nodes:
            wl_id = rows[p["rank"]]
            # The agent itself runs it, with these cards and this image.
            mine = [w for w in self.workloads(p["node_name"]) if w["id"] == wl_id]
            assert len(mine) == 1, (p["node_name"], self.workloads(p["node_name"]))
            assert mine[0]["phase"] == "running", mine
            assert mine[0]["gpus"] == p["cards"] and mine[0]["image"] == inst["image"], mine
            spec = self.record(p["node_name"], wl_id)["spec"]
            assert spec["volumes"] == [{"source": source, "target": "/shared", "size_gb": vol["size_gb"]}], spec
            env = spec["env"]
            assert env["NODE_RANK"] == str(p["rank"]), env
            assert env["NNODES"] == str(n), env
            assert env["WORLD_SIZE"] == str(inst["card_count"]), env
            assert env["MASTER_PORT"] == "29500", env
            assert env["GPURENT_INSTANCE_ID"] == inst_id, env
            # Rank 0's data-plane address (ranks' data_address), which for a
            # sim node without data_host or facts is its agent URL's host.
            assert env["MASTER_ADDR"] == nodes[0]["data_address"], env
            if not self.d.sql("SELECT 1 FROM nodes WHERE name = ? AND (data_host <> '' OR data_address IS NOT NULL)",
                              (master,)):
                assert env["MASTER_ADDR"] == _host(self.node_fleet(master).nodes[master]["url"]), env
            assert env["LOCAL_WORLD_SIZE"] == env["GPURENT_GPUS_PER_NODE"] == str(len(p["cards"])), env
            # The hostfile is named only where the agent writes one: with
            # the ranks' "cluster", never for a single node.
            assert env.get("GPURENT_HOSTFILE") == ("/etc/gpurent/hostfile" if "cluster" in spec else None), env
            assert n > 1 or "cluster" not in spec, spec
        assert vol["in_use"] is True and vol["mount_path"] == "/shared", vol
        return inst

    def check_cards_consistent(self):
        # One read transaction: a job that ends meanwhile frees its cards
        # and leaves HOLDING in one write, which separate reads would split.
        con = self.d._connect()
        try:
            con.execute("BEGIN")

            def sql(q):
                return con.execute(q).fetchall()
            # node_cards and instance_nodes say the same thing, card by card.
            claimed = sorted(sql("SELECT node_id, idx, instance_id FROM node_cards WHERE instance_id IS NOT NULL"))
            placed = []
            for inst, node, cards in sql("SELECT instance_id, node_id, cards FROM instance_nodes"):
                placed += [(node, c, inst) for c in json.loads(cards)]
            assert sorted(placed) == claimed, "node_cards and instance_nodes disagree"
            assert len({(n, c) for n, c, _ in placed}) == len(placed), "a card is placed twice"
            # Only instances that hold cards have them.
            holders = {i for (i,) in sql(f"SELECT id FROM instances WHERE state IN {HOLDING}")}
            assert {i for _, _, i in claimed} <= holders
            # Each node's free-card count (kept by triggers for placement) is its cards' truth.
            assert sql("SELECT id, free_cards FROM nodes WHERE free_cards <> (SELECT count(*) FROM node_cards c"
                       " WHERE c.node_id = nodes.id AND c.healthy = 1 AND c.instance_id IS NULL)") == []
        finally:
            con.close()
        # The agents agree: no card is in two workloads on any node.
        for name, wls in self.all_workloads().items():
            gpus = [g for w in wls for g in w["gpus"]]
            assert len(gpus) == len(set(gpus)), (name, wls)

    def owned_workloads(self):
        return {w for (w,) in self.d.sql("SELECT workload_id FROM instance_nodes")}

    def wait_no_orphans(self, fleets=None, timeout=DEADLINE):
        """Every agent's list holds only workloads an instance owns, on the
        node the instance is placed on."""
        def clean():
            where = {w: n for w, n in self.d.sql(
                "SELECT p.workload_id, n.name FROM instance_nodes p JOIN nodes n ON n.id = p.node_id")}
            bad = {name: [w["id"] for w in wls if where.get(w["id"]) != name]
                   for name, wls in self.all_workloads(fleets).items()}
            bad = {k: v for k, v in bad.items() if v}
            return True if not bad else (False, bad)

        last = {}

        def check():
            last["r"] = clean()
            return last["r"] is True
        try:
            poll(check, timeout, "agents to run only owned workloads")
        except AssertionError as e:
            raise AssertionError(f"{e}: {last.get('r')}")

    def close(self):
        for f in self.fleets:
            if f.proc is not None and f.proc.poll() is None:
                f.stop()


def _host(url):
    h = url.split("://", 1)[1]
    return h[1:h.index("]")] if h.startswith("[") else h.split("/")[0].split(":")[0]


def wait(fn, timeout=DEADLINE, what=""):
    return poll(fn, timeout, what)


@pytest.fixture
def cloud(new_daemon, tmp_path):
    """A Cloud on its own daemon; its fleets stop before the daemon does."""
    c = Cloud(new_daemon, tmp_path)
    yield c
    c.close()


def cloud_with(**options):
    """A fixture like cloud, with extra daemon options."""
    @pytest.fixture
    def fixture(new_daemon, tmp_path):
        c = Cloud(new_daemon, tmp_path, options)
        yield c
        c.close()
    return fixture
