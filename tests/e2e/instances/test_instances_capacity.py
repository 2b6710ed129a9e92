"""test_instances_capacity.py: no card is ever given twice, whatever the
concurrency, and Idempotency-Key makes a retried create safe: 50 parallel
requests for 8 cards against room for exactly 10; replays, conflicting
reuse and concurrent twins of one key."""
import threading
from concurrent.futures import ThreadPoolExecutor

from harness import assert_error
from instances_util import cloud  # noqa: F401  (fixture)

BODY = {"gpu_type": "MI450", "card_count": 8, "image": "rocm/pytorch:2.3-rocm6.2"}


def _parallel(n, fn):
    """Runs fn(i) for i in range(n) on n threads released together."""
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        return fn(i)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


def test_fifty_parallel_creates_for_ten_slots(cloud):
    cloud.fleet(10, prefix="n-")
    users = [cloud.user(max_cards=1000) for _ in range(5)]
    d = cloud.d
    replies = _parallel(50, lambda i: d.post("/v1/instances", key=users[i % 5].key, json=BODY, timeout=60))
    won = [r for r in replies if r.status_code == 201]
    lost = [r for r in replies if r.status_code != 201]
    assert len(won) == 10, [(r.status_code, r.text[:200]) for r in replies]
    for r in lost:
        err = assert_error(r, 409, "insufficient_capacity", "card_count")
        assert err["cards_free"] == 0, err
    created = [r.json() for r in won]
    nodes = [p["node_name"] for inst in created for p in inst["nodes"]]
    assert sorted(nodes) == [f"n-{i:02d}" for i in range(1, 11)], nodes
    # Exactly the winners exist, each holding one whole node.
    assert sorted(i for (i,) in d.sql("SELECT id FROM instances")) == sorted(i["id"] for i in created)
    claims = d.sql("SELECT instance_id, count(*), count(DISTINCT node_id) FROM node_cards GROUP BY instance_id")
    assert sorted(claims) == sorted([(i["id"], 8, 1) for i in created]), claims
    owner = {u.key: u for u in users}
    for r, inst in zip(won, created):
        acct = owner[r.request.headers["Authorization"].split(" ", 1)[1]]
        cloud.wait_state(acct, inst["id"], "running")
        cloud.check_running(acct, inst["id"])
    # Each agent runs one workload on all eight cards.
    for name, wls in cloud.all_workloads().items():
        assert len(wls) == 1 and wls[0]["gpus"] == list(range(8)), (name, wls)
    cloud.check_cards_consistent()
    cloud.wait_no_orphans()


def test_idempotency_key_replay_and_conflict(cloud):
    cloud.fleet(3, prefix="n-")
    u, other = cloud.user(), cloud.user()
    d = cloud.d
    key = {"Idempotency-Key": "create-7f3a"}
    first = d.post("/v1/instances", key=u.key, json=BODY, headers=key)
    assert first.status_code == 201, first.text
    assert "Idempotent-Replayed" not in first.headers
    inst = first.json()
    cloud.wait_state(u, inst["id"], "running")
    before = d.dump()
    again = d.post("/v1/instances", key=u.key, json=BODY, headers=key)
    assert again.status_code == 201, again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == inst            # the first answer, word for word
    # with its Location: a 201 without one would name the collection
    assert again.headers["Location"] == first.headers["Location"] == f"/v1/instances/{inst['id']}"
    assert d.dump() == before
    # The same key with another body is refused, and changes nothing.
    err = assert_error(d.post("/v1/instances", key=u.key, json={**BODY, "card_count": 4}, headers=key),
                       422, "idempotency_key_reused", "Idempotency-Key")
    assert err["message"]
    assert d.dump() == before
    assert [i for (i,) in d.sql("SELECT id FROM instances WHERE user_id = ?", (u.id,))] == [inst["id"]]
    # Keys belong to their user: another user's identical request is new.
    theirs = d.post("/v1/instances", key=other.key, json=BODY, headers=key)
    assert theirs.status_code == 201 and "Idempotent-Replayed" not in theirs.headers, theirs.text
    assert theirs.json()["id"] != inst["id"]
    # A refused request is not remembered: after fixing the cause the same
    # key runs (here the refusal was the quota).
    cloud.set_max_cards(u, 8)
    k2 = {"Idempotency-Key": "create-after-quota"}
    assert_error(d.post("/v1/instances", key=u.key, json=BODY, headers=k2), 403, "quota_exceeded", "card_count")
    cloud.set_max_cards(u, 16)
    r = d.post("/v1/instances", key=u.key, json=BODY, headers=k2)
    assert r.status_code == 201 and "Idempotent-Replayed" not in r.headers, r.text
    # Bad keys are refused.
    for bad in ("", "has space", "x" * 256):
        assert_error(d.post("/v1/instances", key=u.key, json=BODY, headers={"Idempotency-Key": bad}), 400,
                     "invalid_field", "Idempotency-Key")
    cloud.check_cards_consistent()


def test_idempotency_key_concurrent_twins_create_once(cloud):
    """Ten copies of one request with one key, sent at once (a client
    retrying while the first is in flight): one instance, and every answer
    is that instance's."""
    cloud.fleet(2, prefix="n-")
    u = cloud.user()
    d = cloud.d
    key = {"Idempotency-Key": "twins"}
    body = {**BODY, "card_count": 16}
    replies = _parallel(10, lambda i: d.post("/v1/instances", key=u.key, json=body, headers=key, timeout=60))
    assert {r.status_code for r in replies} == {201}, [(r.status_code, r.text[:200]) for r in replies]
    ids = {r.json()["id"] for r in replies}
    assert len(ids) == 1, ids
    assert {r.headers["Location"] for r in replies} == {f"/v1/instances/{next(iter(ids))}"}
    assert sum(r.headers.get("Idempotent-Replayed") != "true" for r in replies) == 1
    assert [i for (i,) in d.sql("SELECT id FROM instances")] == list(ids)
    cloud.wait_state(u, ids.pop(), "running")
    cloud.check_cards_consistent()
