"""test_catalog_cache.py: GET /v1/gpu-types is rendered once per change and
served from memory (issue 15), with a strong ETag and 304 for a matching
If-None-Match. The cached reply must change the moment inventory changes: a
node joins, an instance claims cards, a node drains, a price changes (now or
when a scheduled one takes effect), the catalog entry is edited. Every check
asks several times on fresh connections, so that each of the daemon's HTTP
threads (one cache each) is seen to be current."""
import http.client
import requests

from instances_util import cloud, wait  # noqa: F401  (cloud is a fixture)
from money_util import iso

ASKS = 12  # more than the daemon's HTTP threads, each on a new connection


def catalog(d, headers=None):
    r = requests.get(d.url("/v1/gpu-types"), headers={"Connection": "close", **(headers or {})}, timeout=10)
    return r


def mi450(d):
    """MI450 as every thread answers it; asserts they all agree."""
    seen = []
    for _ in range(ASKS):
        r = catalog(d)
        assert r.status_code == 200, r.text
        assert r.headers["Cache-Control"] == "no-cache"
        etag = r.headers["ETag"]
        assert etag.startswith('"') and etag.endswith('"') and not etag.startswith("W/")
        t = next(t for t in r.json()["data"] if t["code"] == "MI450")
        seen.append((etag, t["cards_total"], t["cards_free"], t["cards_in_use"], t["price_per_card_hour"],
                     t["description"]))
    assert len(set(seen)) == 1, seen
    return seen[0]


def released(d):
    """The instance's cards are back, as every thread says (the release
    happens in the background, so one round of asks may straddle it)."""
    try:
        return mi450(d)[3] == 0
    except AssertionError:
        return False


def test_etag_and_not_modified(cloud):
    cloud.fleet(1, prefix="c-")
    etag, total, free, used, _, _ = mi450(cloud.d)
    assert (total, free, used) == (8, 8, 0)
    for inm in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
        r = catalog(cloud.d, {"If-None-Match": inm})
        assert r.status_code == 304, (inm, r.status_code, r.text)
        assert r.content == b"" and r.headers["ETag"] == etag
    for inm in ('"nope"', etag[:-2] + '"'):
        r = catalog(cloud.d, {"If-None-Match": inm})
        assert r.status_code == 200 and r.headers["ETag"] == etag
    # The 304's length is the 200's (RFC 9110 8.6), on a connection kept for
    # the next request.
    conn = http.client.HTTPConnection("127.0.0.1", cloud.d.port, timeout=10)
    try:
        conn.request("GET", "/v1/gpu-types")
        body = conn.getresponse().read()
        conn.request("GET", "/v1/gpu-types", headers={"If-None-Match": etag})
        r = conn.getresponse()
        assert (r.status, r.read(), r.getheader("Content-Length")) == (304, b"", str(len(body)))
        conn.request("GET", "/v1/gpu-types")
        assert conn.getresponse().read() == body
    finally:
        conn.close()
    # HEAD answers with the same validator and no body.
    r = requests.head(cloud.d.url("/v1/gpu-types"), timeout=10)
    assert r.status_code == 200 and r.headers["ETag"] == etag


def test_cached_reply_follows_inventory_at_once(cloud):
    d = cloud.d
    cloud.fleet(1, prefix="a-")
    e0, total, free, used, price, _ = mi450(d)
    assert (total, free, used, price) == (8, 8, 0, "1.20")

    # A node joins: its cards count as soon as it is up.
    cloud.fleet(1, prefix="b-")
    e1, total, free, used, _, _ = mi450(d)
    assert (total, free, used) == (16, 16, 0) and e1 != e0
    assert catalog(d, {"If-None-Match": e0}).status_code == 200  # the old validator no longer matches

    # An instance claims cards: the reply right after the 201 shows them.
    u = cloud.user()
    inst = cloud.create(u, card_count=2)
    _, total, free, used, _, _ = mi450(d)
    assert (total, free, used) == (16, 14, 2)

    # A node drains: its free cards leave the free pool at once.
    nodes = d.get("/v1/admin/nodes", key=d.admin_key).json()["data"]
    r = d.post(f"/v1/admin/nodes/{nodes[0]['id']}/state", key=d.admin_key, json={"state": "draining"})
    assert r.status_code == 200, r.text
    _, total, free, used, _, _ = mi450(d)
    # 8 or 6 free cards leave with it, as it holds the instance's or not.
    assert (total, used) == (16, 2) and free in (6, 8), (total, free, used)
    drained_free = free

    # A price that takes effect now shows now; a scheduled one when it starts.
    now = d.now()
    r = d.request("PUT", "/v1/admin/prices/MI450", key=d.admin_key, json={"price_per_card_hour": "2.40", "effective_at": iso(now)})
    assert r.status_code == 200, r.text
    assert mi450(d)[4] == "2.40"
    r = d.request("PUT", "/v1/admin/prices/MI450", key=d.admin_key,
              json={"price_per_card_hour": "3.60", "effective_at": iso(now + 100)})
    assert r.status_code == 200, r.text
    assert mi450(d)[4] == "2.40"
    d.set_clock(now + 100)
    assert mi450(d)[4] == "3.60"

    # The catalog entry itself.
    r = d.request("PUT", "/v1/admin/gpu-types/MI450", key=d.admin_key,
              json={"vendor": "AMD", "memory_gb": 192, "memory_type": "HBM3e", "stack": "ROCm",
                    "description": "edited for the cache test"})
    assert r.status_code == 200, r.text
    assert mi450(d)[5] == "edited for the cache test"

    # The instance ends: its cards come back (the drained node's stay out).
    cloud.action(u, inst["id"], "terminate")
    wait(lambda: released(d), what="cards to be released")
    _, total, free, used, _, _ = mi450(d)
    assert total == 16 and free >= drained_free


def test_cached_reply_follows_pools_and_reservation_prices(cloud):
    """What issue 16 adds to the catalog: a node moved into the reserved
    pool leaves the on-demand free cards for the reservable ones, and a
    reservation price shows the moment it is set."""
    d = cloud.d
    cloud.fleet(2, prefix="p-")

    def shown():
        seen = set()
        for _ in range(ASKS):
            t = next(t for t in catalog(d).json()["data"] if t["code"] == "MI450")
            seen.add((t["cards_free"], t["cards_reservable"], t["reservation_price_per_card_hour"]))
        assert len(seen) == 1, seen
        return seen.pop()
    free, reservable, _ = shown()
    assert (free, reservable) == (16, 0)
    node = d.sql("SELECT id FROM nodes WHERE name LIKE 'p-%' ORDER BY name LIMIT 1")[0][0]
    r = d.request("PATCH", f"/v1/admin/nodes/{node}", key=d.admin_key, json={"pool": "reserved"})
    assert r.status_code == 200, r.text
    assert shown()[:2] == (8, 8)
    r = d.request("PUT", "/v1/admin/prices/MI450", key=d.admin_key,
                  json={"price_per_card_hour": "1.20", "reservation_price_per_card_hour": "0.90"})
    assert r.status_code == 200, r.text
    assert shown()[2] == "0.90"
    r = d.request("PATCH", f"/v1/admin/nodes/{node}", key=d.admin_key, json={"pool": "on_demand"})
    assert r.status_code == 200, r.text
    assert shown()[:2] == (16, 0)
