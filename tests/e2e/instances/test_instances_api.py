"""test_instances_api.py: the instance, volume and image API's edges: bad
requests are clear 4xx errors that change nothing (the whole database is
compared before and after); another user's instance, volume or events are a
404 on every route; the image catalog; listing and filtering instances."""
import pytest

from harness import assert_error
from instances_util import cloud, cloud_with  # noqa: F401  (fixtures)

# Funds must cover two hours: the 10.00 trial credit covers one MI450 card,
# not eight (8 x 1.2 x 2 h = 19.20).
cloud_2h = cloud_with(min_run_minutes="120")

ROCM = "rocm/pytorch:2.3-rocm6.2"
CUDA = "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"


@pytest.fixture
def busy(cloud_2h):
    """A cloud where user a runs an instance (and so has a volume), at rest:
    nothing changes in the database until a request changes it."""
    cloud = cloud_2h
    cloud.fleet(2, prefix="n-")
    a, b = cloud.user(), cloud.user()
    inst = cloud.create(a, card_count=8)
    cloud.wait_state(a, inst["id"], "running")
    cloud.a, cloud.b, cloud.inst = a, b, inst
    # Every key has been used once, so last-used stamps are settled.
    for acct in (a, b):
        assert cloud.d.get("/v1/instances", key=acct.key).status_code == 200
    return cloud


BAD_CREATES = [
    # (label, body, status, code, field)
    ("zero cards", {"gpu_type": "MI450", "card_count": 0, "image": ROCM}, 400, "invalid_field", "card_count"),
    ("nine cards", {"gpu_type": "MI450", "card_count": 9, "image": ROCM}, 400, "invalid_field", "card_count"),
    ("twelve cards", {"gpu_type": "MI450", "card_count": 12, "image": ROCM}, 400, "invalid_field", "card_count"),
    ("257 cards", {"gpu_type": "MI450", "card_count": 257, "image": ROCM}, 400, "invalid_field", "card_count"),
    ("264 cards", {"gpu_type": "MI450", "card_count": 264, "image": ROCM}, 400, "invalid_field", "card_count"),
    ("negative", {"gpu_type": "MI450", "card_count": -8, "image": ROCM}, 400, "invalid_field", "card_count"),
    ("huge", {"gpu_type": "MI450", "card_count": 2 ** 40 + 8, "image": ROCM}, 400, "invalid_field", "card_count"),
    ("string count", {"gpu_type": "MI450", "card_count": "8", "image": ROCM}, 400, "invalid_field", "card_count"),
    ("float count", {"gpu_type": "MI450", "card_count": 8.5, "image": ROCM}, 400, "invalid_field", "card_count"),
    ("bool count", {"gpu_type": "MI450", "card_count": True, "image": ROCM}, 400, "invalid_field", "card_count"),
    ("no count", {"gpu_type": "MI450", "image": ROCM}, 400, "missing_field", "card_count"),
    ("no type", {"card_count": 8, "image": ROCM}, 400, "missing_field", "gpu_type"),
    ("no image", {"gpu_type": "MI450", "card_count": 8}, 400, "missing_field", "image"),
    ("unknown type", {"gpu_type": "MI999", "card_count": 8, "image": ROCM}, 400, "invalid_field", "gpu_type"),
    ("type as number", {"gpu_type": 450, "card_count": 8, "image": ROCM}, 400, "invalid_field", "gpu_type"),
    ("unknown image", {"gpu_type": "MI450", "card_count": 8, "image": "example/nope:1"}, 400, "invalid_field",
     "image"),
    ("CUDA image on MI450", {"gpu_type": "MI450", "card_count": 8, "image": CUDA}, 400, "stack_mismatch", "image"),
    ("ROCm image on RTX4090", {"gpu_type": "RTX4090", "card_count": 1, "image": ROCM}, 400, "stack_mismatch",
     "image"),
    ("H100 needs a reservation", {"gpu_type": "H100-SXM", "card_count": 8, "image": CUDA}, 403,
     "reservation_required", "gpu_type"),
    ("unknown volume", {"gpu_type": "MI450", "card_count": 8, "image": ROCM, "volume_id": "vol_nosuchvolume000000"},
     400, "invalid_field", "volume_id"),
    ("unknown field", {"gpu_type": "MI450", "card_count": 8, "image": ROCM, "cpu": 4}, 400, "unknown_field", "cpu"),
    ("long name", {"gpu_type": "MI450", "card_count": 8, "image": ROCM, "name": "x" * 64}, 400, "invalid_field",
     "name"),
    ("no capacity", {"gpu_type": "MI450", "card_count": 16, "image": ROCM}, 409, "insufficient_capacity",
     "card_count"),
    ("no MI300X nodes", {"gpu_type": "MI300X", "card_count": 1, "image": ROCM}, 409, "insufficient_capacity",
     "card_count"),
]


def test_bad_creates_change_nothing(busy):
    d = busy.d
    before = d.dump()
    for label, body, status, code, field in BAD_CREATES:
        err = assert_error(d.post("/v1/instances", key=busy.b.key, json=body), status, code, field)
        assert err["message"], label
        if code == "stack_mismatch":
            assert "ROCm" in err["message"] and "CUDA" in err["message"], err
        if label == "no capacity":
            assert err["cards_free"] == 8 and "8" in err["message"], err
    # Not JSON, not an object, no key.
    assert_error(d.post("/v1/instances", key=busy.b.key, data=b"{", headers={"Content-Type": "application/json"}),
                 400, "malformed_json")
    assert_error(d.post("/v1/instances", key=busy.b.key, json=[1]), 400, "not_an_object")
    assert_error(d.post("/v1/instances", json=BAD_CREATES[0][1]), 401, "unauthorized")
    assert d.dump() == before
    # Funds: the trial credit alone does not cover two hours of 8 cards.
    poor = busy.user(funds=None)
    assert d.get("/v1/instances", key=poor.key).status_code == 200
    before = d.dump()
    err = assert_error(d.post("/v1/instances", key=poor.key, json={"gpu_type": "MI450", "card_count": 8,
                                                                    "image": ROCM}), 402, "insufficient_funds")
    assert (err["needed"], err["available"]) == ("19.20", "10.00"), err
    assert d.dump() == before
    one = busy.create(poor, card_count=1)
    busy.wait_state(poor, one["id"], "running")


def test_every_route_of_anothers_objects_is_404(busy):
    d, a, b, inst = busy.d, busy.a, busy.b, busy.inst
    iid, vid = inst["id"], inst["volume_id"]
    before = d.dump()
    routes = [
        ("GET", f"/v1/instances/{iid}"),
        ("GET", f"/v1/instances/{iid}/events"),
        ("POST", f"/v1/instances/{iid}/stop"),
        ("POST", f"/v1/instances/{iid}/start"),
        ("DELETE", f"/v1/instances/{iid}"),
        ("GET", f"/v1/volumes/{vid}"),
        ("DELETE", f"/v1/volumes/{vid}"),
    ]
    missing = [(m, p.replace(iid, "ins_nosuchinstance00000").replace(vid, "vol_nosuchvolume000000"))
               for m, p in routes]
    for method, path in routes:
        theirs = assert_error(d.request(method, path, key=b.key), 404, "not_found")
        # Indistinguishable from an id that does not exist.
        m, p = missing[routes.index((method, path))]
        nothing = assert_error(d.request(m, p, key=b.key), 404, "not_found")
        assert theirs["message"].replace(iid, "X").replace(vid, "X") == \
            nothing["message"].replace("ins_nosuchinstance00000", "X").replace("vol_nosuchvolume000000", "X")
    # Malformed ids are 404s too.
    for path in ("/v1/instances/nope", "/v1/instances/nope/events", "/v1/volumes/nope"):
        assert_error(d.get(path, key=b.key), 404, "not_found")
    # Lists show only one's own.
    assert d.get("/v1/instances", key=b.key).json()["data"] == []
    assert d.get("/v1/volumes", key=b.key).json()["data"] == []
    # Another's volume cannot be mounted either.
    assert_error(d.post("/v1/instances", key=b.key, json={"gpu_type": "MI450", "card_count": 1, "image": ROCM,
                                                           "volume_id": vid}),
                 400, "invalid_field", "volume_id")
    assert d.dump() == before
    assert busy.get(a, iid)["state"] == "running"
    busy.check_running(a, iid)


def test_list_instances_filter_and_pages(busy):
    d, a = busy.d, busy.a
    more = [busy.create(a, card_count=1, name=f"small-{n}") for n in range(3)]
    for inst in more:
        busy.wait_state(a, inst["id"], "running")
    busy.action(a, more[0]["id"], "stop")
    busy.wait_state(a, more[0]["id"], "stopped")
    ids, cursor = [], None
    while True:
        r = d.get("/v1/instances", key=a.key, params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        ids += [i["id"] for i in r.json()["data"]]
        cursor = r.json()["next_cursor"]
        if not cursor:
            break
    assert sorted(ids) == sorted([busy.inst["id"]] + [i["id"] for i in more])
    assert len(ids) == len(set(ids))
    stopped = d.get("/v1/instances", key=a.key, params={"state": "stopped"}).json()["data"]
    assert [i["id"] for i in stopped] == [more[0]["id"]]
    running = d.get("/v1/instances", key=a.key, params={"state": "running"}).json()["data"]
    assert len(running) == 3 and all(i["state"] == "running" for i in running)
    assert_error(d.get("/v1/instances", key=a.key, params={"state": "sleeping"}), 400, "invalid_query", "state")
    assert_error(d.get("/v1/instances", key=a.key, params={"cursor": "garbage"}), 400, "invalid_query", "cursor")
    assert_error(d.get("/v1/instances", key=a.key, params={"limit": 0}), 400, "invalid_query", "limit")
    assert_error(d.get("/v1/instances", key=a.key, params={"colour": "red"}), 400, "invalid_query", "colour")
    one = busy.get(a, more[1]["id"])
    assert one["name"] == "small-1" and one["gpu_type"] == "MI450" and one["image"] == ROCM
    assert {"id", "name", "gpu_type", "card_count", "image", "volume_id", "state", "desired_state", "phase",
            "state_reason", "nodes", "state_since", "created_at", "updated_at"} <= set(one)
    assert set(one["nodes"][0]) >= {"rank", "node_id", "node_name", "cards", "phase"}


def test_actions_take_no_body(busy):
    d, a, iid = busy.d, busy.a, busy.inst["id"]
    before = d.dump()
    assert_error(d.post(f"/v1/instances/{iid}/stop", key=a.key, json={"force": True}), 400, "unknown_field", "force")
    assert d.dump() == before


def test_image_catalog(cloud):
    d = cloud.d
    images = d.get("/v1/images").json()["data"]
    refs = {i["ref"]: i for i in images}
    assert refs[ROCM]["stack"] == "ROCm" and "bitsandbytes" in refs[ROCM]["description"]
    assert refs[CUDA]["stack"] == "CUDA"
    assert any("5.7" in i["description"] and i["stack"] == "ROCm" for i in images), images
    u = cloud.user()
    before = d.dump()
    assert_error(d.post("/v1/admin/images", key=u.key, json={"ref": "example/x:1", "stack": "ROCm"}), 403,
                 "forbidden")
    for body, field in (({"ref": "bad ref", "stack": "ROCm"}, "ref"), ({"ref": "-x", "stack": "ROCm"}, "ref"),
                        ({"ref": "example/x:1", "stack": "OpenCL"}, "stack"),
                        ({"ref": "example/x:1", "stack": "ROCm", "size": 1}, "size")):
        code = "unknown_field" if field == "size" else "invalid_field"
        assert_error(cloud.admin("POST", "/v1/admin/images", json=body), 400, code, field)
    assert_error(cloud.admin("POST", "/v1/admin/images", json={"ref": ROCM, "stack": "ROCm"}), 409, "name_taken",
                 "ref")
    assert d.dump() == before
    img = cloud.add_image("example/train:2", stack="ROCm")
    assert img["id"].startswith("img_") and img["ref"] == "example/train:2"
    assert img in d.get("/v1/images").json()["data"]
    # Instances name an image by ref or by id.
    cloud.fleet(1, prefix="n-")
    by_id = cloud.create(u, card_count=1, image=img["id"])
    assert by_id["image"] == "example/train:2"
    cloud.wait_state(u, by_id["id"], "running")
    cloud.check_running(u, by_id["id"])
    r = cloud.admin("DELETE", f"/v1/admin/images/{img['id']}")
    assert r.status_code == 204, r.text
    assert_error(cloud.admin("DELETE", f"/v1/admin/images/{img['id']}"), 404, "not_found")
    assert_error(d.post("/v1/instances", key=u.key, json={"gpu_type": "MI450", "card_count": 1,
                                                           "image": "example/train:2"}),
                 400, "invalid_field", "image")
    # The running instance keeps its image, and can start again with it.
    assert cloud.get(u, by_id["id"])["image"] == "example/train:2"
    cloud.action(u, by_id["id"], "stop")
    cloud.wait_state(u, by_id["id"], "stopped")
    cloud.action(u, by_id["id"], "start")
    cloud.wait_state(u, by_id["id"], "running")
    again = cloud.check_running(u, by_id["id"])
    (wl,) = cloud.workloads(again["nodes"][0]["node_name"])
    spec = cloud.record(again["nodes"][0]["node_name"], wl["id"])["spec"]
    assert spec["image"] == "example/train:2" and spec["stack"] == "ROCm", spec
