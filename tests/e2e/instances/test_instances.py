"""test_instances.py: renting cards end to end, with a real gpurentd and
real sim agents (`gpurent-agent sim-fleet`): 1, 8, 16 and 256 cards placed
best-fit on the right nodes and run by the agents with the image, cards,
/shared volume and distributed-job environment; the life cycle and its
events; a volume kept for every instance that can start again; running intervals as billing reads them; stop and start moving to
other nodes with the volume following; volumes and their size quota in
the agents' specs; card quotas; a reconciler
woken by new work rather than by its period.

Every check asks the agents themselves (signed GET /v1/workloads, and the
workload records they keep) as well as the API and the database."""
import signal

from agent_util import pause, poll
from harness import assert_error
from instances_util import cloud, cloud_with, wait  # noqa: F401  (cloud is a fixture)

# A reconciler whose own period (10 minutes) and sweep (an hour) never come
# within a test: whatever it does there, a wake-up made it do.
cloud_slow_reconciler = cloud_with(reconcile_interval_ms="600000", reconcile_sweep_ms="3600000")


def test_rent_one_then_two_cards_best_fit(cloud):
    """1 card goes on the first node; 2 more go on the same (fullest) node,
    keeping the other nodes whole; 8 then take a whole node."""
    cloud.fleet(3, prefix="n-")
    u = cloud.user()
    one = cloud.create(u, card_count=1, name="one")
    assert one["state"] == "pending" and one["name"] == "one" and one["card_count"] == 1
    assert [(p["node_name"], p["cards"]) for p in one["nodes"]] == [("n-01", [0])]
    two = cloud.create(u, card_count=2)
    assert [(p["node_name"], p["cards"]) for p in two["nodes"]] == [("n-01", [1, 2])]
    eight = cloud.create(u, card_count=8)
    assert [(p["node_name"], p["cards"]) for p in eight["nodes"]] == [("n-02", list(range(8)))]
    for inst in (one, two, eight):
        cloud.wait_state(u, inst["id"], "running")
        got = cloud.check_running(u, inst["id"])
        assert got["nodes"][0]["phase"] == "running"
    # Both small instances run side by side on n-01 with their own cards.
    assert sorted(w["gpus"] for w in cloud.workloads("n-01")) == [[0], [1, 2]]
    assert [w["gpus"] for w in cloud.workloads("n-02")] == [list(range(8))]
    assert cloud.workloads("n-03") == []
    # One default volume, created on first use, mounted by all three.
    vols = cloud.d.get("/v1/volumes", key=u.key).json()["data"]
    assert [(v["name"], v["instances"], v["in_use"]) for v in vols] == [("shared", 3, True)]
    assert {one["volume_id"], two["volume_id"], eight["volume_id"]} == {vols[0]["id"]}
    cloud.check_cards_consistent()


def test_rent_sixteen_cards_two_nodes_one_fabric(cloud):
    """16 cards take two whole nodes of one fabric, in rank order, with the
    distributed-job environment; a fabric with too few whole nodes is
    skipped even when it comes first."""
    cloud.fleet(1, fabric="fabric-a", prefix="a-")       # one whole node: not enough
    cloud.fleet(3, fabric="fabric-b", prefix="b-")
    u = cloud.user()
    inst = cloud.create(u, card_count=16)
    assert [(p["rank"], p["node_name"], p["cards"]) for p in inst["nodes"]] == \
        [(0, "b-01", list(range(8))), (1, "b-02", list(range(8)))]
    cloud.wait_state(u, inst["id"], "running")
    got = cloud.check_running(u, inst["id"])
    envs = [cloud.record(p["node_name"], w)["spec"]["env"] for p, w in
            zip(got["nodes"], [r for (r,) in cloud.d.sql(
                "SELECT workload_id FROM instance_nodes WHERE instance_id = ? ORDER BY rank", (inst["id"],))])]
    assert [(e["NODE_RANK"], e["NNODES"], e["GPURENT_CARDS_PER_NODE"]) for e in envs] == \
        [("0", "2", "8"), ("1", "2", "8")]
    assert cloud.workloads("a-01") == [] and cloud.workloads("b-03") == []
    cloud.check_cards_consistent()


def test_rent_256_cards_on_32_nodes(cloud):
    """256 cards are 32 whole nodes of one fabric, claimed all at once; the
    fabric that cannot hold them is left alone; once they are taken, the
    next 256 get insufficient_capacity naming the free cards."""
    cloud.fleet(4, fabric="fabric-a", prefix="a-")
    cloud.fleet(32, fabric="fabric-b", prefix="b-")
    u = cloud.user(max_cards=512)
    inst = cloud.create(u, card_count=256)
    names = [p["node_name"] for p in inst["nodes"]]
    assert names == [f"b-{i:02d}" for i in range(1, 33)]
    cloud.wait_state(u, inst["id"], "running")
    got = cloud.check_running(u, inst["id"])
    assert len(got["nodes"]) == 32
    for name in names:
        assert len(cloud.workloads(name)) == 1
    for i in range(1, 5):
        assert cloud.workloads(f"a-{i:02d}") == []
    err = assert_error(cloud.d.post("/v1/instances", key=u.key,
                                    json={"gpu_type": "MI450", "card_count": 256,
                                          "image": "rocm/pytorch:2.3-rocm6.2"}),
                       409, "insufficient_capacity", "card_count")
    assert err["cards_free"] == 32, err
    # The running interval opened once, for all 256 cards.
    assert cloud.d.sql("SELECT card_count, ended_at FROM running_intervals WHERE instance_id = ?",
                       (inst["id"],)) == [(256, None)]
    cloud.check_cards_consistent()
    cloud.action(u, inst["id"], "terminate")
    cloud.wait_state(u, inst["id"], "terminated")
    for name in names:
        assert cloud.workloads(name) == []
    assert cloud.held_cards(inst["id"]) == {}


def test_events_and_life_cycle(cloud):
    """Every state change is an event, in order, at the time it happened;
    each operation is allowed only from the states where it makes sense;
    repeating stop or terminate is harmless."""
    cloud.fleet(1, prefix="n-")
    u = cloud.user()
    t0 = cloud.d.now()
    inst = cloud.create(u, card_count=4)
    iid = inst["id"]
    cloud.wait_state(u, iid, "running")
    err = assert_error(cloud.d.post(f"/v1/instances/{iid}/start", key=u.key), 409, "invalid_state")
    assert err["state"] == "running", err
    t1 = cloud.d.advance_clock(60)
    assert cloud.action(u, iid, "stop")["state"] in ("stopping", "stopped")
    cloud.wait_state(u, iid, "stopped")
    again = cloud.action(u, iid, "stop")            # harmless
    assert again["state"] == "stopped"
    t2 = cloud.d.advance_clock(60)
    started = cloud.action(u, iid, "start")
    assert started["state"] == "pending" and started["desired_state"] == "running"
    cloud.wait_state(u, iid, "running")
    t3 = cloud.d.advance_clock(60)
    cloud.action(u, iid, "terminate")
    cloud.wait_state(u, iid, "terminated")
    assert cloud.action(u, iid, "terminate")["state"] == "terminated"   # harmless
    for verb in ("start", "stop"):
        err = assert_error(cloud.d.post(f"/v1/instances/{iid}/{verb}", key=u.key), 409, "invalid_state")
        assert err["state"] == "terminated"

    events = cloud.events(u, iid)
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert len({e["seq"] for e in events}) == len(events)
    states = [e["state"] for e in events if e["state"] not in ("pulling", "mounting", "starting")]
    assert states == ["pending", "provisioning", "running", "stopping", "stopped",
                      "pending", "provisioning", "running", "stopping", "terminated"], events
    phases = [e["state"] for e in events if e["state"] in ("pulling", "mounting", "starting")]
    assert all(e["reason"] for e in events), events
    at = {}
    for e in events:
        at.setdefault(e["state"], []).append(e["at"])
    iso = _iso
    assert at["pending"] == [iso(t0), iso(t2)]
    assert at["stopping"] == [iso(t1), iso(t3)] and at["stopped"] == [iso(t1)]
    assert at["terminated"] == [iso(t3)]
    assert set(phases) <= {"pulling", "mounting", "starting"}
    # The events are the user's only: the list is paginated, and the first
    # event says the instance was created.
    assert events[0]["reason"] == "created"
    assert cloud.held_cards(iid) == {}
    assert cloud.workloads("n-01") == []


def test_a_workload_running_at_its_put_shows_each_state_once(cloud):
    """With no pull to wait for, the agent answers the PUT once the workload
    runs (agent_put_wait_ms), and the instance goes from pending to running
    in one pass: the row is written once, but the events still show the
    provisioning it went through, at the same moment as running."""
    cloud.fleet(1, prefix="z-", sim={"sim_pull_ms": "0", "sim_mount_ms": "0", "sim_start_ms": "0"})
    u = cloud.user()
    inst = cloud.create(u, card_count=2)
    iid = inst["id"]
    cloud.wait_state(u, iid, "running")
    # A loaded machine may still answer the PUT before the workload runs:
    # then the slowest node's phases show too, between the two.
    events = [e for e in cloud.events(u, iid) if e["state"] not in ("pulling", "mounting", "starting")]
    assert [e["state"] for e in events] == ["pending", "provisioning", "running"], events
    assert events[1]["reason"] == "the agents accepted the workload", events
    assert events[2]["reason"] == "every node is running", events
    assert events[1]["at"] == events[2]["at"], events   # the daemon's clock stands still in these tests
    got = cloud.d.get(f"/v1/instances/{iid}", key=u.key).json()
    assert got["state"] == "running" and got["phase"] == "" and got["state_since"] == events[2]["at"], got


def test_reconciler_is_woken_by_new_work(cloud_slow_reconciler):
    """Creating, stopping and starting an instance wake the reconciler: each
    completes within the poll deadline (a minute at most), far inside the
    ten-minute period, so the wake-ups drive them, not the period."""
    cloud = cloud_slow_reconciler
    cloud.fleet(2, prefix="n-")
    u = cloud.user()
    inst = cloud.create(u, card_count=8)
    iid = inst["id"]
    cloud.wait_state(u, iid, "running")
    cloud.check_running(u, iid)
    cloud.action(u, iid, "stop")
    cloud.wait_state(u, iid, "stopped")
    assert cloud.held_cards(iid) == {}
    assert cloud.all_workloads() == {"n-01": [], "n-02": []}
    cloud.action(u, iid, "start")
    cloud.wait_state(u, iid, "running")
    cloud.check_running(u, iid)
    cloud.check_cards_consistent()


def _iso(t):
    import datetime
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_running_interval_starts_when_all_nodes_run_and_ends_at_stop_request(cloud):
    """Billing's running interval opens only when the last node runs, and
    closes at the stop request, not when the workloads are gone."""
    fast = cloud.fleet(1, fabric="fabric-a", prefix="a-")
    slow = cloud.fleet(1, fabric="fabric-a", prefix="b-", sim={"sim_pull_ms": "2500"})
    u = cloud.user()
    inst = cloud.create(u, card_count=16)
    iid = inst["id"]
    assert [p["node_name"] for p in inst["nodes"]] == ["a-01", "b-01"]

    def fast_node_running():
        i = cloud.get(u, iid)
        return i["nodes"][0]["phase"] == "running" and i
    i = wait(fast_node_running, what="rank 0 running")
    assert i["state"] == "provisioning" and i["nodes"][1]["phase"] != "running", i
    assert [w["phase"] for w in cloud.workloads("b-01")] != ["running"]
    # One node runs, the other does not: nothing is billed yet.
    assert cloud.d.sql("SELECT * FROM running_intervals WHERE instance_id = ?", (iid,)) == []
    t_run = cloud.d.advance_clock(30)
    cloud.wait_state(u, iid, "running")
    assert cloud.d.sql("SELECT started_at, ended_at, card_count, gpu_model, user_id FROM running_intervals"
                       " WHERE instance_id = ?", (iid,)) == [(t_run, None, 16, "MI450", u.id)]

    # Freeze the slow fleet so its workload cannot be deleted yet: the
    # instance stays stopping while time passes, and billing still ends at
    # the request.
    t_stop = cloud.d.advance_clock(3600)
    pause(slow.proc)
    try:
        assert cloud.action(u, iid, "stop")["state"] == "stopping"
        assert cloud.d.sql("SELECT ended_at, end_reason FROM running_intervals WHERE instance_id = ?",
                           (iid,)) == [(t_stop, "stop requested by the user")]
        t_later = cloud.d.advance_clock(600)
        # The rank-0 workload is gone; the frozen node's is still held.
        wait(lambda: cloud.workloads("a-01") == [], what="a-01 emptied")
        assert cloud.get(u, iid)["state"] == "stopping"
    finally:
        slow.proc.send_signal(signal.SIGCONT)
    cloud.wait_state(u, iid, "stopped")
    assert cloud.workloads("b-01") == []
    assert cloud.d.sql("SELECT started_at, ended_at FROM running_intervals WHERE instance_id = ?",
                       (iid,)) == [(t_run, t_stop)]
    stopped = [e for e in cloud.events(u, iid) if e["state"] == "stopped"]
    assert [e["at"] for e in stopped] == [_iso(t_later)]
    assert fast.proc.poll() is None


def test_stop_then_start_moves_to_free_nodes_and_volume_follows(cloud):
    """A stopped instance holds no cards; when its nodes are taken it starts
    on others, with the same volume mounted at /shared."""
    cloud.fleet(4, prefix="n-")
    a, b = cloud.user(), cloud.user()
    r = cloud.d.post("/v1/volumes", key=a.key, json={"name": "work", "size_gb": 50})
    assert r.status_code == 201, r.text
    vol = r.json()
    x = cloud.create(a, card_count=16, volume_id=vol["id"])
    assert [p["node_name"] for p in x["nodes"]] == ["n-01", "n-02"]
    cloud.wait_state(a, x["id"], "running")
    first = cloud.check_running(a, x["id"])
    source = cloud.d.sql("SELECT source FROM volumes WHERE id = ?", (vol["id"],))[0][0]
    cloud.action(a, x["id"], "stop")
    cloud.wait_state(a, x["id"], "stopped")
    stopped = cloud.get(a, x["id"])
    assert stopped["nodes"] == [] and cloud.held_cards(x["id"]) == {}
    assert cloud.workloads("n-01") == [] and cloud.workloads("n-02") == []
    # The volume outlives the stop.
    assert cloud.volume(a, vol["id"])["in_use"] is False

    y = cloud.create(b, card_count=16)
    assert [p["node_name"] for p in y["nodes"]] == ["n-01", "n-02"]
    started = cloud.action(a, x["id"], "start")
    assert [p["node_name"] for p in started["nodes"]] == ["n-03", "n-04"]
    cloud.wait_state(a, x["id"], "running")
    cloud.wait_state(b, y["id"], "running")
    moved = cloud.check_running(a, x["id"])
    assert moved["volume_id"] == vol["id"]
    assert {p["node_id"] for p in moved["nodes"]}.isdisjoint({p["node_id"] for p in first["nodes"]})
    for p in moved["nodes"]:
        (wl,) = cloud.workloads(p["node_name"])
        assert cloud.record(p["node_name"], wl["id"])["spec"]["volumes"] == \
            [{"source": source, "target": "/shared", "size_gb": 50}]
    cloud.check_running(b, y["id"])
    # Two running intervals for x, one per run.
    rows = cloud.d.sql("SELECT ended_at IS NULL FROM running_intervals WHERE instance_id = ? ORDER BY id",
                       (x["id"],))
    assert rows == [(0,), (1,)]
    # Nothing free now: starting needs room, and says so.
    cloud.action(a, x["id"], "stop")
    cloud.wait_state(a, x["id"], "stopped")
    z = cloud.create(b, card_count=16)
    cloud.wait_state(b, z["id"], "running")
    before = cloud.d.dump()
    err = assert_error(cloud.d.post(f"/v1/instances/{x['id']}/start", key=a.key), 409, "insufficient_capacity",
                       "card_count")
    assert err["cards_free"] == 0
    assert cloud.d.dump() == before
    assert cloud.get(a, x["id"])["state"] == "stopped"
    cloud.check_cards_consistent()


def test_volume_size_reaches_the_agents(cloud):
    """The volume's size quota travels with it in every node's workload spec,
    where the agent's mount_command can hand it to the storage as
    {size_gb}: an explicit size on both nodes of a 16-card instance, and the
    default volume's size for an instance that names none."""
    cloud.fleet(3, prefix="n-")
    u = cloud.user()
    r = cloud.d.post("/v1/volumes", key=u.key, json={"name": "quota", "size_gb": 777})
    assert r.status_code == 201, r.text
    vol = r.json()
    big = cloud.create(u, card_count=16, volume_id=vol["id"])
    small = cloud.create(u, card_count=1)
    default = cloud.volume(u, small["volume_id"])
    assert default["name"] == "shared" and default["size_gb"] == 100  # volume_default_size_gb
    for inst, v, n in ((big, vol, 2), (small, default, 1)):
        cloud.wait_state(u, inst["id"], "running")
        nodes = cloud.get(u, inst["id"])["nodes"]
        assert len(nodes) == n, nodes
        source = cloud.d.sql("SELECT source FROM volumes WHERE id = ?", (v["id"],))[0][0]
        rows = dict(cloud.d.sql("SELECT rank, workload_id FROM instance_nodes WHERE instance_id = ?", (inst["id"],)))
        for p in nodes:
            spec = cloud.record(p["node_name"], rows[p["rank"]])["spec"]
            assert spec["volumes"] == [{"source": source, "target": "/shared", "size_gb": v["size_gb"]}], spec


def test_volumes_crud_and_in_use(cloud):
    cloud.fleet(2, prefix="n-")
    u = cloud.user()
    d = cloud.d
    r = d.post("/v1/volumes", key=u.key, json={"name": "datasets", "size_gb": 500})
    assert r.status_code == 201, r.text
    vol = r.json()
    assert vol["name"] == "datasets" and vol["size_gb"] == 500 and vol["mount_path"] == "/shared"
    assert vol["id"].startswith("vol_") and vol["instances"] == 0 and vol["in_use"] is False
    assert d.get(f"/v1/volumes/{vol['id']}", key=u.key).json() == vol
    assert_error(d.post("/v1/volumes", key=u.key, json={"name": "datasets"}), 409, "name_taken", "name")
    before = d.dump()
    assert_error(d.post("/v1/volumes", key=u.key, json={"name": "Bad Name"}), 400, "invalid_field", "name")
    assert_error(d.post("/v1/volumes", key=u.key, json={"name": "x", "size_gb": 0}), 400, "invalid_field", "size_gb")
    assert_error(d.post("/v1/volumes", key=u.key, json={"name": "x", "size_gb": "1"}), 400, "invalid_field",
                 "size_gb")
    assert_error(d.post("/v1/volumes", key=u.key, json={"name": "x", "extra": 1}), 400, "unknown_field", "extra")
    assert d.dump() == before
    # Template rendered per volume.
    assert d.sql("SELECT source FROM volumes WHERE id = ?", (vol["id"],)) == \
        [(f"nfs.example:/export/{u.id}/{vol['id']}",)]

    # Two instances mount it at once.
    i1 = cloud.create(u, card_count=8, volume_id=vol["id"])
    i2 = cloud.create(u, card_count=2, volume_id=vol["id"])
    for i in (i1, i2):
        cloud.wait_state(u, i["id"], "running")
        cloud.check_running(u, i["id"])
    got = d.get(f"/v1/volumes/{vol['id']}", key=u.key).json()
    assert got["instances"] == 2 and got["in_use"] is True
    err = assert_error(d.delete(f"/v1/volumes/{vol['id']}", key=u.key), 409, "volume_in_use")
    assert vol["id"] in err["message"]
    # A stopped instance still needs its volume to start again.
    cloud.action(u, i1["id"], "stop")
    cloud.wait_state(u, i1["id"], "stopped")
    cloud.action(u, i2["id"], "terminate")
    cloud.wait_state(u, i2["id"], "terminated")
    assert d.get(f"/v1/volumes/{vol['id']}", key=u.key).json()["instances"] == 1
    assert_error(d.delete(f"/v1/volumes/{vol['id']}", key=u.key), 409, "volume_in_use")
    cloud.action(u, i1["id"], "terminate")
    cloud.wait_state(u, i1["id"], "terminated")
    r = d.delete(f"/v1/volumes/{vol['id']}", key=u.key)
    assert r.status_code == 204, r.text
    assert_error(d.get(f"/v1/volumes/{vol['id']}", key=u.key), 404, "not_found")
    assert_error(d.delete(f"/v1/volumes/{vol['id']}", key=u.key), 404, "not_found")
    assert vol["id"] not in [v["id"] for v in d.get("/v1/volumes", key=u.key).json()["data"]]
    # A deleted volume cannot be mounted; the name is free again.
    assert_error(d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 1,
                                                            "image": "rocm/pytorch:2.3-rocm6.2",
                                                            "volume_id": vol["id"]}),
                 400, "invalid_field", "volume_id")
    r = d.post("/v1/volumes", key=u.key, json={"name": "datasets"})
    assert r.status_code == 201 and r.json()["size_gb"] == 100 and r.json()["id"] != vol["id"], r.text
    # Pagination over several volumes.
    for n in range(3):
        assert d.post("/v1/volumes", key=u.key, json={"name": f"v{n}"}).status_code == 201
    seen, cursor = [], None
    while True:
        page = d.get("/v1/volumes", key=u.key, params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [v["name"] for v in page["data"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert sorted(seen) == ["datasets", "v0", "v1", "v2"]


def test_a_failed_job_keeps_its_volume_for_its_next_start(cloud):
    """A failed instance can be started again, as a stopped one can, so its
    volume stays in use until it is terminated."""
    cloud.fleet(1, prefix="n-")
    cloud.add_image("example/job:1")
    u = cloud.user()
    d = cloud.d
    vol = d.post("/v1/volumes", key=u.key, json={"name": "work"}).json()
    inst = cloud.create(u, card_count=1, image="example/job:1", volume_id=vol["id"], command=["sh", "-c", "exit 3"])
    cloud.wait_state(u, inst["id"], "failed")
    assert d.get(f"/v1/volumes/{vol['id']}", key=u.key).json()["instances"] == 1
    before = d.dump()
    err = assert_error(d.delete(f"/v1/volumes/{vol['id']}", key=u.key), 409, "volume_in_use")
    assert vol["id"] in err["message"]
    assert d.dump() == before
    r = d.post(f"/v1/instances/{inst['id']}/start", key=u.key)
    assert r.status_code == 200 and r.json()["state"] == "pending", r.text
    cloud.wait_state(u, inst["id"], "failed")
    cloud.action(u, inst["id"], "terminate")
    cloud.wait_state(u, inst["id"], "terminated")
    assert d.get(f"/v1/volumes/{vol['id']}", key=u.key).json()["instances"] == 0
    assert d.delete(f"/v1/volumes/{vol['id']}", key=u.key).status_code == 204


def test_the_catalog_says_the_largest_instance_one_create_can_get(cloud):
    """Free cards in pieces are not one instance's worth: cards_launchable
    is the most one create can be placed with now, as placement places."""
    cloud.fleet(3, prefix="n-")
    u = cloud.user(max_cards=1000)

    def launchable():
        [t] = [t for t in cloud.d.get("/v1/gpu-types").json()["data"] if t["code"] == "MI450"]
        return t["cards_free"], t["cards_launchable"]
    assert launchable() == (24, 24)  # three whole nodes of one fabric
    one = cloud.create(u, card_count=1)
    assert launchable() == (23, 16)
    eight = cloud.create(u, card_count=8)
    assert launchable() == (15, 8)  # one whole node, and the 7 beside the one card
    cloud.create(u, card_count=8)
    assert launchable() == (7, 7)
    assert_error(cloud.d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 8,
                                                                 "image": "rocm/pytorch:2.3-rocm6.2"}),
                 409, "insufficient_capacity", "card_count")
    for i in (one, eight):
        cloud.action(u, i["id"], "terminate")
    poll(lambda: launchable() == (16, 16), 30, "the cards to come back")


def test_card_quota(cloud):
    cloud.fleet(2, prefix="n-")
    u = cloud.user(max_cards=8)
    d = cloud.d
    first = cloud.create(u, card_count=6)
    cloud.wait_state(u, first["id"], "running")
    before = d.dump()
    err = assert_error(d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 4,
                                                                 "image": "rocm/pytorch:2.3-rocm6.2"}),
                       403, "quota_exceeded", "card_count")
    assert err["limit"] == 8 and err["in_use"] == 6, err
    assert "8" in err["message"]
    assert d.dump() == before
    second = cloud.create(u, card_count=2)
    for i in (first, second):
        cloud.wait_state(u, i["id"], "running")
    # A stopped instance holds no cards, so room frees up; starting it again
    # counts against the quota.
    cloud.action(u, first["id"], "stop")
    cloud.wait_state(u, first["id"], "stopped")
    third = cloud.create(u, card_count=6)
    assert_error(d.post(f"/v1/instances/{first['id']}/start", key=u.key), 403, "quota_exceeded", "card_count")
    # The admin raises it.
    cloud.set_max_cards(u, 16)
    cloud.action(u, first["id"], "start")
    cloud.wait_state(u, first["id"], "running")
    cloud.wait_state(u, third["id"], "running")
    # Bad limits are refused; users other than admins cannot set them.
    for bad in (-1, 100001, "8", 1.5, True):
        assert_error(cloud.admin("PUT", f"/v1/admin/users/{u.id}/limits", json={"max_cards": bad}), 400,
                     "invalid_field", "max_cards")
    assert_error(cloud.admin("PUT", f"/v1/admin/users/{u.id}/limits", json={}), 400, "missing_field", "max_cards")
    assert_error(cloud.admin("PUT", "/v1/admin/users/usr_nosuchuser000000000/limits", json={"max_cards": 8}),
                 404, "not_found")
    assert_error(d.request("PUT", f"/v1/admin/users/{u.id}/limits", key=u.key, json={"max_cards": 1000}),
                 403, "forbidden")
    # Zero: nothing more may be rented.
    v = cloud.user(max_cards=0)
    assert_error(d.post("/v1/instances", key=v.key, json={"gpu_type": "MI450", "card_count": 1,
                                                           "image": "rocm/pytorch:2.3-rocm6.2"}),
                 403, "quota_exceeded", "card_count")
    cloud.check_cards_consistent()


def test_placement_skips_set_aside_nodes_and_failed_cards(cloud):
    """Cordoned and maintenance nodes are never chosen, nor failed cards."""
    cloud.fleet(2, prefix="a-")
    cloud.fleet(1, prefix="b-", sim={"inventory_failed_cards": "3,5"})
    u = cloud.user()
    ids = {name: node_id for node_id, name in cloud.d.sql("SELECT id, name FROM nodes")}

    def set_state(name, state):
        r = cloud.admin("POST", f"/v1/admin/nodes/{ids[name]}/state", json={"state": state, "reason": "test"})
        assert r.status_code == 200, r.text

    set_state("a-01", "cordoned")
    first = cloud.create(u, card_count=8)
    assert [(p["node_name"], p["cards"]) for p in first["nodes"]] == [("a-02", list(range(8)))]
    err = assert_error(cloud.d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 8,
                                                                       "image": "rocm/pytorch:2.3-rocm6.2"}),
                       409, "insufficient_capacity", "card_count")
    assert err["cards_free"] == 6, err          # b-01's healthy cards only
    six = cloud.create(u, card_count=6)
    assert [(p["node_name"], p["cards"]) for p in six["nodes"]] == [("b-01", [0, 1, 2, 4, 6, 7])]
    set_state("a-01", "maintenance")
    assert_error(cloud.d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 1,
                                                                 "image": "rocm/pytorch:2.3-rocm6.2"}),
                 409, "insufficient_capacity", "card_count")
    set_state("a-01", "ready")
    last = cloud.create(u, card_count=1)
    assert [(p["node_name"], p["cards"]) for p in last["nodes"]] == [("a-01", [0])]
    for inst in (first, six, last):
        cloud.wait_state(u, inst["id"], "running")
        cloud.check_running(u, inst["id"])
    cloud.check_cards_consistent()
