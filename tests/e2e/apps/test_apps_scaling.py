"""test_apps_scaling.py: the scaler (issue 17) from the gateways' reports:
up under concurrent load to max_replicas and never beyond, down to what
demand needs once the stabilisation window has passed, to zero after
idle_seconds without a call; a publisher's card quota bounds it too, the
refusal an event on the app. Time is the daemon's testing clock."""
import threading

from agent_util import poll
from apps_util import DEADLINE
from money_util import ledger_verify

CHAT = "/v1/chat/completions"


def live(m, app):
    return len(m.live_replicas(app["id"]))


def kinds(m, pub, app):
    return [e["kind"] for e in m.d.get(f"/v1/apps/{app['slug']}", key=pub.key).json()["events"]]


def slow_calls(gw, app, con, n, words=150):
    """n calls in flight at once, each some seconds long; their statuses."""
    out = []
    msg = {"messages": [{"role": "user", "content": " ".join(["w"] * words)}]}

    def one():
        out.append(gw.call(app["slug"], CHAT, con.key, json=msg).status_code)
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, out


def test_scale_up_to_max_down_after_window_and_to_zero_after_idle(market):
    m = market
    m.fleet(1)
    pub, con = m.user(), m.user()
    port = None
    app = m.publish(pub, max_replicas=2, concurrency_target=1, idle_seconds=60, model_port=port)
    # Slow tokens: 150 words at 20 ms keep each call in flight for seconds.
    r = m.d.request("PATCH", f"/v1/apps/{app['slug']}", key=pub.key,
                    json={"command": m.model_command(app["port"], token_ms=20)})
    assert r.status_code == 200, r.text
    gw = m.gateway()
    assert live(m, app) == 0
    threads, statuses = slow_calls(gw, app, con, 5)
    seen = []
    poll(lambda: seen.append(live(m, app)) or seen[-1] == 2, DEADLINE, "two replicas under load")
    for t in threads:
        t.join()
    seen.append(live(m, app))
    assert statuses == [200] * 5, statuses
    assert max(seen) == 2, seen  # five calls want five replicas; max_replicas is 2
    assert "scale_up" in kinds(m, pub, app)

    # One call keeps demand at one replica: after the window, one goes.
    threads, statuses = slow_calls(gw, app, con, 1, words=600)
    poll(lambda: m.d.sql("SELECT coalesce(sum(in_flight), 0) FROM app_demand WHERE app_id = ?",
                         [app["id"]])[0][0] == 1, DEADLINE, "the gateway to report one call in flight")
    assert live(m, app) == 2  # inside the stabilisation window nothing goes
    m.d.advance_clock(31)
    poll(lambda: live(m, app) == 1, DEADLINE, "scale down to one after the window")
    assert "scale_down" in kinds(m, pub, app)
    for t in threads:
        t.join()
    assert statuses == [200], (statuses, m.d.sql("SELECT instance_id, seq, state, reason FROM instance_events ORDER BY seq"),
                               m.d.sql("SELECT * FROM app_demand"), m.gateways[0].text()[-1500:])
    # No call for idle_seconds: to zero.
    poll(lambda: m.d.sql("SELECT coalesce(sum(in_flight + queued), 0) FROM app_demand WHERE app_id = ?",
                         [app["id"]])[0][0] == 0, DEADLINE, "no demand reported")
    m.d.advance_clock(61)
    poll(lambda: live(m, app) == 0, DEADLINE, "scale to zero after idle_seconds")
    assert "scale_to_zero" in kinds(m, pub, app)
    rc, out = ledger_verify(m.d.db_path)
    assert rc == 0, out


def test_quota_bounds_the_scaler_and_the_refusal_is_an_event(market):
    m = market
    m.fleet(1)
    pub, con = m.user(max_cards=1), m.user()
    app = m.publish(pub, min_replicas=2, max_replicas=3)
    poll(lambda: "scale_refused" in kinds(m, pub, app), DEADLINE, "the quota refusal")
    poll(lambda: live(m, app) == 1, DEADLINE, "one replica, the quota's")
    events = m.d.get(f"/v1/apps/{app['slug']}", key=pub.key).json()["events"]
    refused = [e for e in events if e["kind"] == "scale_refused"]
    assert "quota" in refused[0]["detail"], refused
    assert live(m, app) == 1
    # Tried again a minute later, not every pass: one refusal per minute.
    assert len(refused) == 1, refused
    m.d.advance_clock(61)
    poll(lambda: kinds(m, pub, app).count("scale_refused") == 2, DEADLINE, "the retry a minute later")
    assert live(m, app) == 1
