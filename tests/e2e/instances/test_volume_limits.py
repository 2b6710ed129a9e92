"""Per-user bounds on volumes, like card quotas: how many live volumes and
how many GB together (default_max_volumes, default_max_volume_gb, or what
an admin set with PUT /v1/admin/users/{id}/limits); a new account cannot
create a million-GB volume, and refusals change nothing."""
from harness import assert_error
from instances_util import cloud_with  # noqa: F401  (fixture)

limited = cloud_with(default_max_volumes="3", default_max_volume_gb="1000", max_volume_size_gb="1048576")


def vol(c, u, name, size):
    return c.d.post("/v1/volumes", key=u.key, json={"name": name, "size_gb": size})


def test_volume_bounds_by_default_and_by_admin(limited):
    c = limited
    u = c.user()
    before = c.d.dump()
    err = assert_error(vol(c, u, "huge", 1000000), 403, "quota_exceeded", "size_gb")
    assert "1000 GB" in err["message"], err
    assert c.d.dump() == before
    assert vol(c, u, "a", 600).status_code == 201
    err = assert_error(vol(c, u, "b", 401), 403, "quota_exceeded", "size_gb")
    assert "400" in err["message"], err  # what is left
    assert vol(c, u, "b", 400).status_code == 201
    # The count: a third fits (in GB too after an admin raises that), a fourth does not.
    r = c.admin("PUT", f"/v1/admin/users/{u.id}/limits", json={"max_volume_gb": 5000, "reason": "lab"})
    assert r.status_code == 200, r.text
    assert r.json() == {"user_id": u.id, "max_cards": 64, "max_volumes": 3, "max_volume_gb": 5000}
    assert vol(c, u, "c", 100).status_code == 201
    err = assert_error(vol(c, u, "d", 1), 403, "quota_exceeded", "size_gb")
    assert "at most 3 volumes" in err["message"], err
    # Deleting one makes room; another user is not affected.
    vid = c.d.get("/v1/volumes", key=u.key).json()["data"][0]["id"]
    assert c.d.delete(f"/v1/volumes/{vid}", key=u.key).status_code in (200, 204)
    assert vol(c, u, "d", 1).status_code == 201
    other = c.user()
    assert vol(c, other, "x", 1000).status_code == 201
    # The default volume an instance makes counts too.
    c.fleet(1)
    full = c.user()
    assert vol(c, full, "big", 1000).status_code == 201
    r = c.d.post("/v1/instances", key=full.key, json={"gpu_type": "MI450", "card_count": 1,
                                                        "image": "rocm/pytorch:2.3-rocm6.2"})
    err = assert_error(r, 403, "quota_exceeded", "volume_id")
    assert "default volume" in err["message"], err
    # The admin route's bad input.
    for body, code, field in (({"max_volumes": -1}, "invalid_field", "max_volumes"),
                              ({"max_volume_gb": 1000000001}, "invalid_field", "max_volume_gb"),
                              ({"max_volumes": "3"}, "invalid_field", "max_volumes"),
                              ({}, "missing_field", "max_cards")):
        assert_error(c.admin("PUT", f"/v1/admin/users/{u.id}/limits", json=body), 400, code, field)
    assert_error(c.d.request("PUT", f"/v1/admin/users/{u.id}/limits", key=u.key, json={"max_volumes": 99}),
                 403, "forbidden")
