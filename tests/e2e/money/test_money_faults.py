"""test_money_faults.py: money under faults and late passes. A billing pass
may come every second or once an hour late (a daemon stopped, a disk full,
a crash): what it charges and where it stops an instance must not depend
on which. Expected amounts come from the design's formulas, floor(price x
cards x seconds / 3600) for card time and floor(price x size_gb x seconds
/ 2 592 000) for storage, never from the daemon; `gpurentd ledger verify`
runs after every test."""
from money_util import MICRO, PRICE, accrue, iso, new_cluster, storage_cost, verify_ledgers, yuan  # noqa: F401

IMAGE = "rocm/pytorch:2.3-rocm6.2"


def run_out_second(funds, storage_price, size_gb, cards, horizon):
    """The last second s whose storage and card time together funds cover."""
    return max(s for s in range(horizon + 1)
               if storage_cost([(0, storage_price)], size_gb, 0, s) + accrue(PRICE["MI450"], cards, s) <= funds)


def test_funds_with_storage_run_out_at_the_same_second_whenever_passes_run(new_cluster):
    c = new_cluster(nodes={"MI450": 1})
    price = 30 * MICRO  # 30.00 a GB-month: 100 GB cost about as much as 1 card
    r = c.admin("PUT", "/v1/admin/storage-prices/far", json={"price_per_gb_month": yuan(price)})
    assert r.status_code == 200, r.text
    want = run_out_second(4 * MICRO, price, 100, 4, 3000)
    assert 1500 < want < 1700

    def run(step):
        """A user with 4.00, a 100 GB volume and 4 cards, billed every
        `step` seconds for 3 000 s; returns where the card time ended."""
        u = c.cli_user()
        c.topup(u, 4 * MICRO)
        t0 = c.d.now()
        r = c.d.post("/v1/volumes", key=u.key, json={"name": "data", "size_gb": 100, "region": "far"})
        assert r.status_code == 201, r.text
        vid = r.json()["id"]
        r = c.d.post("/v1/instances", key=u.key,
                     json={"gpu_type": "MI450", "card_count": 4, "image": IMAGE, "volume_id": vid})
        assert r.status_code == 201, r.text
        iid = r.json()["id"]
        c.wait_state(u, iid, "running")  # the clock stands still meanwhile
        while c.d.now() < t0 + 3000:
            c.d.set_clock(min(c.d.now() + step, t0 + 3000))
            c.billing()
        c.wait_state(u, iid, "stopped")
        [(start, end, billed, settled, reason)] = c.intervals(iid)
        assert (start, settled, reason) == (t0, 1, "funds exhausted")
        # Card time is charged to where the funds ran out; storage is charged
        # to there too and then takes what was left, owing the rest.
        assert billed == c.spent(u) == accrue(PRICE["MI450"], 4, end - start)
        [(storage_billed,)] = c.d.sql("SELECT storage_billed FROM volumes WHERE id = ?", (vid,))
        assert storage_billed == 4 * MICRO - billed
        assert storage_cost([(0, price)], 100, 0, end - t0) <= storage_billed
        assert c.balance(u)["cash"] == 0
        c.d.set_clock(t0 + 3600)
        return end - t0

    # Passes every 7 s, every 50 s, and one pass an hour late, as after a
    # daemon stopped or a disk full: the same second each time.
    assert [run(7), run(50), run(3000)] == [want] * 3
