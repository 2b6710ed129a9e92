"""test_money_many.py: one user with more running intervals than billing
ever read at once (it once read 256 per user): 300 one-card instances, after
an admin raised the user's card quota. Every interval must count: what the
balance shows as unbilled, what a pass charges, and the exact second funds
run out, after which every instance stops. Expected amounts come from the
formula floor(price x cards x seconds / 3600), never from the daemon;
`gpurentd ledger verify` must pass."""
from agent_util import poll
from money_util import PRICE, accrue, iso, new_cluster, verify_ledgers  # noqa: F401

N = 300          # instances of one card each: more than 256
NODES = 38       # x 8 cards = 304
RUN_OUT = 1000   # the second (from the start) the funds last to


def running(c, user):
    return c.d.sql("SELECT count(*) FROM instances WHERE user_id = ? AND state = 'running'", (user.id,))[0][0]


def test_more_than_256_running_instances_of_one_user_all_count(new_cluster):
    c = new_cluster(nodes={"MI450": NODES})
    price = PRICE["MI450"]
    u = c.cli_user()
    r = c.admin("PUT", f"/v1/admin/users/{u.id}/limits", json={"max_cards": N})
    assert r.status_code == 200, r.text
    # Funds for exactly RUN_OUT seconds of all N, and a little change: one
    # second more of every instance would cost far more than the change.
    funds = N * accrue(price, 1, RUN_OUT) + 100
    assert N * accrue(price, 1, RUN_OUT + 1) > funds
    c.topup(u, funds)

    # All N start at t0: the clock does not move while they provision.
    t0 = c.d.now()
    ids = []
    for _ in range(N):
        r = c.create(u, "MI450", 1)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    poll(lambda: running(c, u) == N, 120, f"all {N} instances to run")
    assert c.d.sql("SELECT count(*), min(started_at), max(started_at) FROM running_intervals WHERE user_id = ?",
                   (u.id,)) == [(N, t0, t0)]
    assert c.balance(u)["burn_rate_per_hour"] == N * price

    # Between passes the balance counts every interval's usage.
    c.d.set_clock(t0 + 100)
    b = c.balance(u)
    assert b["unbilled"] == N * accrue(price, 1, 100)
    assert b["available"] == funds - N * accrue(price, 1, 100)

    # A pass charges every interval.
    c.billing()
    assert c.spent(u) == N * accrue(price, 1, 100)
    assert c.d.sql("SELECT count(*) FROM running_intervals WHERE user_id = ? AND billed = ? AND settled = 0",
                   (u.id, accrue(price, 1, 100))) == [(N,)]
    b = c.balance(u)
    assert (b["cash"], b["unbilled"]) == (funds - N * accrue(price, 1, 100), 0)

    # Long past the funds: billing ends for every instance at RUN_OUT.
    c.d.set_clock(t0 + 2 * RUN_OUT)
    b = c.balance(u)
    assert b["unbilled"] == N * accrue(price, 1, 2 * RUN_OUT) - N * accrue(price, 1, 100)
    assert b["available"] == 0
    c.billing()
    assert c.spent(u) == N * accrue(price, 1, RUN_OUT)
    rows = c.d.sql("SELECT started_at, ended_at, billed, settled, end_reason, count(*) FROM running_intervals"
                   " WHERE user_id = ? GROUP BY 1, 2, 3, 4, 5", (u.id,))
    assert rows == [(t0, t0 + RUN_OUT, accrue(price, 1, RUN_OUT), 1, "funds exhausted", N)]
    b = c.balance(u)
    assert (b["cash"], b["credit"], b["unbilled"], b["available"], b["burn_rate_per_hour"]) == (100, 0, 0, 100, 0)
    poll(lambda: c.d.sql("SELECT count(*) FROM instances WHERE user_id = ? AND state = 'stopped'", (u.id,))[0][0] == N,
         120, f"all {N} instances to stop")
    reasons = c.d.sql("SELECT DISTINCT state_reason FROM instances WHERE user_id = ?", (u.id,))
    assert reasons == [(f"funds ran out at {iso(t0 + RUN_OUT)}; the volume is kept",)]

    # Later passes change nothing; the ledger holds together.
    c.d.set_clock(t0 + 3 * RUN_OUT)
    c.billing()
    assert c.spent(u) == N * accrue(price, 1, RUN_OUT)
    c.verify()
