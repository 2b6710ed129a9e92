"""test_apps_api.py: /v1/apps (issue 17) as a publisher and a stranger see
it: publish with defaults and bounds, the public list for anyone, the
publisher's view, PATCH and DELETE; every bad input (malformed JSON, wrong
types, missing and unknown fields, an oversize body, out-of-range numbers
and prices, another user's app) gets a clear 4xx and changes nothing."""
import pytest
import requests

from harness import assert_error, run_gpurentd

BASE = {"slug": "echo-one", "name": "Echo", "image": "rocm/pytorch:2.3-rocm6.2", "gpu_type": "MI450", "port": 8000}


def apps_count(d):
    return d.sql("SELECT count(*) FROM apps")[0][0]


def test_publish_defaults_list_get_patch_delete(daemon):
    pub, other = daemon.signup(), daemon.signup()
    slug = f"echo-{pub.id[-6:].lower()}"
    r = daemon.post("/v1/apps", key=pub.key, json={**BASE, "slug": slug, "price_per_1k_output_tokens": "0.004",
                                                   "env": [{"name": "MODEL", "value": "x"},
                                                           {"name": "TOKEN", "value": "s3cret", "secret": True}]})
    assert r.status_code == 201, r.text
    a = r.json()
    assert r.headers["Location"] == f"/v1/apps/{slug}"
    assert (a["min_replicas"], a["max_replicas"], a["concurrency_target"], a["idle_seconds"], a["visibility"]) == \
        (0, 1, 4, 300, "public")
    assert a["prices"] == {"per_request": "0.00", "per_1k_input_tokens": "0.00", "per_1k_output_tokens": "0.004",
                           "per_second": "0.00"}
    assert {"name": "TOKEN", "secret": True} in a["env"] and "s3cret" not in r.text
    listed = requests.get(daemon.base_url + "/v1/apps").json()["data"]
    mine = [x for x in listed if x["slug"] == slug]
    assert len(mine) == 1 and "env" not in mine[0] and "command" not in mine[0]
    seen = daemon.get(f"/v1/apps/{slug}", key=other.key).json()
    assert "env" not in seen and seen["publisher_id"] == pub.id
    r = daemon.request("PATCH", f"/v1/apps/{slug}", key=pub.key, json={"max_replicas": 3, "visibility": "private"})
    assert r.status_code == 200 and r.json()["max_replicas"] == 3, r.text
    assert_error(daemon.get(f"/v1/apps/{slug}", key=other.key), 404, "not_found")
    assert_error(daemon.request("PATCH", f"/v1/apps/{slug}", key=other.key, json={"max_replicas": 2}), 404, "not_found")
    assert_error(daemon.delete(f"/v1/apps/{slug}", key=other.key), 404, "not_found")
    assert_error(daemon.get(f"/v1/apps/{slug}/stats", key=other.key), 404, "not_found")
    assert_error(daemon.post("/v1/apps", key=other.key, json={**BASE, "slug": slug}), 409, "name_taken", "slug")
    assert daemon.delete(f"/v1/apps/{slug}", key=pub.key).status_code == 204
    assert_error(daemon.get(f"/v1/apps/{slug}", key=pub.key), 404, "not_found")
    assert_error(daemon.post("/v1/apps", json=BASE), 401, "unauthorized")


@pytest.mark.parametrize("body,status,code,field", [
    ("{not json", 400, "malformed_json", None),
    ([1, 2], 400, "not_an_object", None),
    ({**BASE, "port": "8000"}, 400, "invalid_field", "port"),
    ({**BASE, "max_replicas": True}, 400, "invalid_field", "max_replicas"),
    ({**BASE, "colour": "red"}, 400, "unknown_field", "colour"),
    ({k: v for k, v in BASE.items() if k != "image"}, 400, "missing_field", "image"),
    ({k: v for k, v in BASE.items() if k != "slug"}, 400, "missing_field", "slug"),
    ({**BASE, "slug": "Bad_Slug"}, 400, "invalid_field", "slug"),
    ({**BASE, "slug": "-ab"}, 400, "invalid_field", "slug"),
    ({**BASE, "port": 0}, 400, "invalid_field", "port"),
    ({**BASE, "port": 65536}, 400, "invalid_field", "port"),
    ({**BASE, "max_replicas": 65}, 400, "invalid_field", "max_replicas"),
    ({**BASE, "min_replicas": -1}, 400, "invalid_field", "min_replicas"),
    ({**BASE, "min_replicas": 3, "max_replicas": 2}, 400, "invalid_field", "min_replicas"),
    ({**BASE, "idle_seconds": 5}, 400, "invalid_field", "idle_seconds"),
    ({**BASE, "concurrency_target": 0}, 400, "invalid_field", "concurrency_target"),
    ({**BASE, "cards_per_replica": 0}, 400, "invalid_field", "cards_per_replica"),
    ({**BASE, "visibility": "secret"}, 400, "invalid_field", "visibility"),
    ({**BASE, "price_per_request": "-1"}, 400, "invalid_field", "price_per_request"),
    ({**BASE, "price_per_request": "0.0000001"}, 400, "invalid_field", "price_per_request"),
    ({**BASE, "price_per_second": "1000.01"}, 400, "invalid_field", "price_per_second"),
    ({**BASE, "price_per_1k_input_tokens": 5}, 400, "invalid_field", "price_per_1k_input_tokens"),
    ({**BASE, "gpu_type": "NOPE"}, 400, "invalid_field", "gpu_type"),
    ({**BASE, "allowed_users": ["nobody"]}, 400, "invalid_field", "allowed_users"),
    ({**BASE, "allowed_users": ["usr_aaaaaaaaaaaaaaaaaaaa"]}, 400, "invalid_field", "allowed_users"),
    ({**BASE, "command": "echo"}, 400, "invalid_field", "command"),
    ({**BASE, "env": [{"name": "GPURENT_X", "value": "1"}]}, 400, "invalid_field", None),
    ({**BASE, "name": ""}, 400, "invalid_field", "name"),
    ({**BASE, "description": "x" * 2001}, 400, "invalid_field", "description"),
    # health_path (0027): what a replica's agent GETs on the app's port.
    ({**BASE, "health_path": "health"}, 400, "invalid_field", "health_path"),
    ({**BASE, "health_path": ""}, 400, "invalid_field", "health_path"),
    ({**BASE, "health_path": "/a b"}, 400, "invalid_field", "health_path"),
    ({**BASE, "health_path": "/ok\r\nX: 1"}, 400, "invalid_field", "health_path"),
    ({**BASE, "health_path": "/" + "a" * 255}, 400, "invalid_field", "health_path"),
    ({**BASE, "health_path": 5}, 400, "invalid_field", "health_path"),
])
def test_bad_publish_is_refused_and_changes_nothing(daemon, body, status, code, field):
    u = daemon.signup()
    before = apps_count(daemon)
    kw = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, str) else {"json": body}
    r = daemon.post("/v1/apps", key=u.key, **kw)
    if field is None and code == "invalid_field":
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_field", r.text
    else:
        assert_error(r, status, code, field)
    assert apps_count(daemon) == before


def test_oversize_body_and_bad_patch(daemon):
    u = daemon.signup()
    r = daemon.post("/v1/apps", key=u.key, json={**BASE, "description": "x" * (2 << 20)})
    assert r.status_code == 413, r.text
    slug = f"echo-{u.id[-6:].lower()}"
    assert daemon.post("/v1/apps", key=u.key, json={**BASE, "slug": slug}).status_code == 201
    for body, code, field in [({"slug": "other"}, "unknown_field", "slug"), ({"port": -1}, "invalid_field", "port"),
                              ({"min_replicas": 2}, "invalid_field", "min_replicas"),
                              ({"price_per_request": "x"}, "invalid_field", "price_per_request")]:
        assert_error(daemon.request("PATCH", f"/v1/apps/{slug}", key=u.key, json=body), 400, code, field)
    assert_error(daemon.request("PATCH", f"/v1/apps/{slug}", key=u.key, json={}), 400, "missing_field")
    a = daemon.get(f"/v1/apps/{slug}", key=u.key).json()
    assert (a["port"], a["min_replicas"], a["prices"]["per_request"]) == (8000, 0, "0.00")
    assert_error(daemon.get(f"/v1/apps/{slug}/stats?days=0", key=u.key), 400, "invalid_query", "days")
    assert_error(daemon.get("/v1/apps?limit=0"), 400, "invalid_query", "limit")


def test_mine_lists_the_callers_own_apps_private_ones_too(daemon):
    pub, other = daemon.signup(), daemon.signup()
    tag = pub.id[-6:].lower()
    for slug, vis in ((f"pub-{tag}", "public"), (f"priv-{tag}", "private")):
        assert daemon.post("/v1/apps", key=pub.key, json={**BASE, "slug": slug, "visibility": vis}).status_code == 201
    assert daemon.post("/v1/apps", key=other.key, json={**BASE, "slug": f"oth-{tag}"}).status_code == 201
    mine = daemon.get("/v1/apps?mine=1", key=pub.key).json()
    assert sorted(a["slug"] for a in mine["data"]) == [f"priv-{tag}", f"pub-{tag}"], mine
    assert mine["next_cursor"] is None and all(a["publisher_id"] == pub.id for a in mine["data"])
    # Paged like the public list.
    first = daemon.get("/v1/apps?mine=1&limit=1", key=pub.key).json()
    assert len(first["data"]) == 1 and first["next_cursor"], first
    rest = daemon.get(f"/v1/apps?mine=1&limit=1&cursor={first['next_cursor']}", key=pub.key).json()
    assert [a["slug"] for a in first["data"] + rest["data"]] == [a["slug"] for a in mine["data"]]
    # mine=0 and no mine are the public marketplace: the private app is not in it, for its publisher either.
    for path in ("/v1/apps?mine=0", "/v1/apps"):
        slugs = [a["slug"] for a in daemon.get(path, key=pub.key).json()["data"]]
        assert f"pub-{tag}" in slugs and f"oth-{tag}" in slugs and f"priv-{tag}" not in slugs
    # Bad values and a missing or bad key: a JSON error, nothing listed.
    for bad in ("2", "x", "", "-1", "1.0", "true"):
        assert_error(daemon.get(f"/v1/apps?mine={bad}", key=pub.key), 400, "invalid_query", "mine")
    assert_error(requests.get(daemon.base_url + "/v1/apps?mine=1", timeout=10), 401, "unauthorized")
    assert_error(requests.get(daemon.base_url + "/v1/apps?mine=1", timeout=10,
                              headers={"Authorization": "Bearer gpk_nonsense"}), 401, "unauthorized")
    assert_error(daemon.get("/v1/apps?mine=1&colour=red", key=pub.key), 400, "invalid_query", "colour")


def test_gateway_url_is_null_without_gateway_public_url(daemon):
    u = daemon.signup()
    slug = f"gwn-{u.id[-6:].lower()}"
    a = daemon.post("/v1/apps", key=u.key, json={**BASE, "slug": slug}).json()
    assert a["gateway_url"] is None
    assert daemon.get(f"/v1/apps/{slug}", key=u.key).json()["gateway_url"] is None
    assert all(x["gateway_url"] is None for x in requests.get(daemon.base_url + "/v1/apps", timeout=10).json()["data"])


def test_gateway_url_from_gateway_public_url(new_daemon):
    d = new_daemon(options={"gateway_public_url": "https://gw.example.com/"})
    pub, other = d.signup(), d.signup()
    slug = f"gwu-{pub.id[-6:].lower()}"
    want = f"https://gw.example.com/apps/{slug}/"
    r = d.post("/v1/apps", key=pub.key, json={**BASE, "slug": slug})
    assert r.status_code == 201 and r.json()["gateway_url"] == want, r.text
    assert d.get(f"/v1/apps/{slug}", key=other.key).json()["gateway_url"] == want
    assert d.request("PATCH", f"/v1/apps/{slug}", key=pub.key, json={"max_replicas": 2}).json()["gateway_url"] == want
    listed = requests.get(d.base_url + "/v1/apps", timeout=10).json()["data"]
    assert [x["gateway_url"] for x in listed if x["slug"] == slug] == [want]
    assert [x["gateway_url"] for x in d.get("/v1/apps?mine=1", key=pub.key).json()["data"]] == [want]


@pytest.mark.parametrize("value", ["gw.example.com", "ftp://gw.example.com", "https://", "http:///x",
                                   "https://gw.example.com/?a=1", "https://gw.example.com/#x", "https://gw example.com",
                                   "https://" + "a" * 200])
@pytest.mark.parametrize("option", ["gateway_public_url", "public_url"])
def test_bad_public_url_is_refused_at_load(option, value):
    p = run_gpurentd("-n", "-o", f"{option}={value}")
    assert p.returncode != 0 and f"{option}: '{value}' is not an http:// or https:// base URL" in p.stderr, \
        (p.stdout, p.stderr)


@pytest.mark.parametrize("option", ["gateway_public_url", "public_url"])
def test_good_public_urls_load(option):
    for value in ("", "http://127.0.0.1:8084", "https://gw.example.com/market"):
        p = run_gpurentd("-n", "-o", f"{option}={value}")
        assert p.returncode == 0 and p.stdout == "configuration OK\n", (value, p.stderr)


def test_an_unverified_account_cannot_publish(daemon):
    u = daemon.signup(verify=False)
    r = daemon.post("/v1/apps", key=u.key, json={**BASE, "slug": "unverified-app", "min_replicas": 1})
    assert_error(r, 403, "email_not_verified")
    assert daemon.sql("SELECT count(*) FROM apps WHERE slug = 'unverified-app'")[0][0] == 0


def test_a_publisher_s_apps_are_bounded_and_a_deleted_one_frees_its_place(new_daemon):
    """Every app is in the marketplace and in every gateway's copy each
    second: max_apps_per_user bounds what one account publishes."""
    d = new_daemon(options={"max_apps_per_user": "2"})
    pub, other = d.signup(), d.signup()
    for slug in ("capped-one", "capped-two"):
        assert d.post("/v1/apps", key=pub.key, json={**BASE, "slug": slug}).status_code == 201
    before = d.dump()
    err = assert_error(d.post("/v1/apps", key=pub.key, json={**BASE, "slug": "capped-three"}), 403, "quota_exceeded")
    assert err["limit"] == 2 and "max_apps_per_user" in err["message"], err
    assert d.dump() == before
    # Another publisher has a count of its own.
    assert d.post("/v1/apps", key=other.key, json={**BASE, "slug": "others-one"}).status_code == 201
    assert d.delete("/v1/apps/capped-one", key=pub.key).status_code in (200, 204)
    assert d.post("/v1/apps", key=pub.key, json={**BASE, "slug": "capped-three"}).status_code == 201
