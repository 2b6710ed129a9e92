"""test_instance_reply_cache.py: GET /v1/instances/{id} serves a rendered
reply from its HTTP thread's cache (issue 15), and a cached reply is never
one a client could tell is stale: it changes the moment a change commits,
it is never served to another user, a revoked key is refused on the very
next request, and a write by another process shows within a second or so.
The daemon runs one HTTP thread, so every request meets the same cache."""
import sqlite3

from agent_util import poll
from money_util import new_cluster  # noqa: F401 (a fixture)

OPTIONS = {"threads": "1"}


def body(c, user, iid):
    r = c.d.get(f"/v1/instances/{iid}", key=user.key)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/json", r.headers
    return r.json()


def test_a_cached_reply_changes_the_moment_a_change_commits(new_cluster):
    c = new_cluster(nodes={"MI450": 1}, options=OPTIONS)
    u = c.signup()
    c.topup(u, 100 * 1_000_000)
    iid = c.launch(u, cards=8)
    first = body(c, u, iid)
    assert body(c, u, iid) == first  # the cached copy is the same reply
    assert first["desired_state"] == "running"
    r = c.d.post(f"/v1/instances/{iid}/stop", key=u.key)
    assert r.status_code == 200, r.text
    # The very next read, on the thread that cached the running reply.
    assert body(c, u, iid)["desired_state"] == "stopped"
    c.wait_state(u, iid, "stopped")
    r = c.d.post(f"/v1/instances/{iid}/start", key=u.key)
    assert r.status_code == 200, r.text
    assert body(c, u, iid)["desired_state"] == "running"
    c.wait_state(u, iid, "running")


def test_a_cached_reply_is_never_served_to_another_user_or_a_revoked_key(new_cluster):
    c = new_cluster(nodes={"MI450": 1}, options=OPTIONS)
    u = c.signup()
    c.topup(u, 100 * 1_000_000)
    iid = c.launch(u, cards=1)
    body(c, u, iid)
    body(c, u, iid)
    other = c.signup()
    r = c.d.get(f"/v1/instances/{iid}", key=other.key)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    made = c.d.create_key(u.key)
    r = c.d.get(f"/v1/instances/{iid}", key=made["token"])
    assert r.status_code == 200, r.text
    r = c.d.delete(f"/v1/api-keys/{made['id']}", key=u.key)
    assert r.status_code in (200, 204), r.text
    r = c.d.get(f"/v1/instances/{iid}", key=made["token"])
    assert r.status_code == 401, r.text


def test_a_write_by_another_process_shows_within_the_cache_bound(new_cluster):
    c = new_cluster(nodes={"MI450": 1}, options=OPTIONS)
    u = c.signup()
    c.topup(u, 100 * 1_000_000)
    iid = c.launch(u, cards=1)
    assert body(c, u, iid)["name"] != "renamed-by-an-operator"
    con = sqlite3.connect(c.d.db_path, timeout=10)
    try:
        with con:
            con.execute("UPDATE instances SET name = 'renamed-by-an-operator' WHERE id = ?", (iid,))
    finally:
        con.close()
    poll(lambda: body(c, u, iid)["name"] == "renamed-by-an-operator", 10, "the operator's rename to show")
