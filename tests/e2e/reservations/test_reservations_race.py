"""test_reservations_race.py: the calendar check is exact under concurrency.
Two users racing for the last 8 H100 cards of an hour: exactly one wins.
A model-based test: many random bookings sent at once on many threads never
oversubscribe any hour (per type, per fabric for multi-node blocks, and per
node: each block is bound to its own nodes, 0028), and
every refusal is one the final calendar would refuse too (bookings only
add, so a window that fits at the end fit whenever it was tried)."""
import os
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor


sys.path.insert(0, os.path.dirname(__file__))

from harness import assert_error  # noqa: E402
from instances_util import cloud  # noqa: E402,F401  (fixture)
from money_util import iso  # noqa: E402
from resv_util import rc  # noqa: E402,F401  (rc is a fixture)


def _parallel(n, fn):
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        return fn(i)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


def _body(cards, start, hours):
    return {"gpu_type": "H100-SXM", "cards": cards, "starts_at": iso(start), "ends_at": iso(start + hours * 3600)}


def test_two_users_race_for_the_last_eight_cards_of_an_hour(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1")
    first = rc.c.user()
    start = rc.hour(6)
    rc.book(first, 8, start, 2)
    racers = [rc.c.user(), rc.c.user()]
    for _ in range(3):  # a few rounds, each for a fresh hour
        replies = _parallel(2, lambda i: rc.d.post("/v1/reservations", key=racers[i].key, json=_body(8, start, 1),
                                                   timeout=60))
        won = [r for r in replies if r.status_code == 201]
        lost = [r for r in replies if r.status_code != 201]
        assert len(won) == 1 and len(lost) == 1, [(r.status_code, r.text[:200]) for r in replies]
        err = assert_error(lost[0], 409, "insufficient_capacity", "cards")
        assert err["cards_free"] == 0 and err["hour"] == iso(start), err
        booked = rc.d.sql("SELECT sum(card_count) FROM reservations WHERE state = 'booked' AND starts_at <= ?"
                          " AND ends_at > ?", (start, start))[0][0]
        assert booked == 16
        start += 7200
        rc.book(first, 8, start, 2)
    rc.verify()


def _calendar(rows):
    """{hour: cards} and {(fabric, hour): cards of multi-node blocks}."""
    total, fabric = {}, {}
    for cards, fab, s, e in rows:
        for h in range(s, e, 3600):
            total[h] = total.get(h, 0) + cards
            if fab:
                fabric[(fab, h)] = fabric.get((fab, h), 0) + cards
    return total, fabric


def test_random_concurrent_bookings_never_oversubscribe_an_hour(rc):
    rc.c.fleet(2, model="H100-SXM", fabric="ib-1", prefix="a-")
    rc.c.fleet(1, model="H100-SXM", fabric="ib-2", prefix="b-")
    cap, whole = 24, {"ib-1": 2, "ib-2": 1}
    users = [rc.c.user() for _ in range(4)]
    rnd = random.Random(16)
    base = rc.hour(2)
    asks = []
    for _ in range(60):
        cards = rnd.choice([1, 2, 3, 4, 8, 8, 16])
        asks.append((cards, base + 3600 * rnd.randrange(0, 12), rnd.randrange(1, 5)))
    replies = _parallel(12, lambda i: [rc.d.post("/v1/reservations", key=users[(i + k) % 4].key,
                                                 json=_body(*asks[k]), timeout=60)
                                       for k in range(i, len(asks), 12)])
    flat = {}
    for i, rs in enumerate(replies):
        for j, r in enumerate(rs):
            flat[i + 12 * j] = r
    assert len(flat) == len(asks)
    rows = rc.d.sql("SELECT card_count, fabric, starts_at, ends_at FROM reservations WHERE state = 'booked'")
    total, fabric = _calendar(rows)
    assert all(v <= cap for v in total.values()), total
    assert all(v <= 8 * whole[f] for (f, _), v in fabric.items()), fabric
    # Per node (0028): every block is bound to nodes holding exactly its
    # cards (one node, or whole nodes of its fabric), and no node-hour is
    # oversubscribed.
    nodes = dict(rc.d.sql("SELECT id, fabric FROM nodes"))
    bind = rc.d.sql("SELECT r.id, r.card_count, coalesce(r.fabric, ''), r.starts_at, r.ends_at, b.node_id, b.cards"
                    " FROM reservations r LEFT JOIN reservation_nodes b ON b.reservation_id = r.id"
                    " WHERE r.state = 'booked'")
    per_block, per_node = {}, {}
    for rid, cards, fab, s, e, node, held in bind:
        assert node is not None, rid
        per_block.setdefault(rid, []).append(held)
        if cards > 8:
            assert held == 8 and nodes[node] == fab, (rid, node)
        for h in range(s, e, 3600):
            per_node[(node, h)] = per_node.get((node, h), 0) + held
    assert all(sum(v) == cards for (rid, cards, *_), v in ((b, per_block[b[0]]) for b in bind)), per_block
    assert all(len(v) == 1 for rid, v in per_block.items() if sum(v) <= 8), per_block
    assert all(v <= 8 for v in per_node.values()), per_node
    won = [k for k, r in flat.items() if r.status_code == 201]
    assert len(won) == len(rows) and len(won) > 5, len(won)
    for k, r in flat.items():
        if r.status_code == 201:
            continue
        assert_error(r, 409, "insufficient_capacity", "cards")
        cards, s, hours = asks[k]
        hs = range(s, s + hours * 3600, 3600)
        # Refused only if no node (or no fabric's whole nodes) had room
        # in every hour of the window at the end either.
        if cards <= 8:
            fits = any(all(per_node.get((n, h), 0) + cards <= 8 for h in hs) for n in nodes)
        else:
            fits = any(sum(1 for n, nf in nodes.items() if nf == f and all(per_node.get((n, h), 0) == 0 for h in hs))
                       >= cards // 8 for f in whole)
        assert not fits, (asks[k], r.text)
    # Availability says the same as the rows: free cards over the nodes,
    # and the largest block of each hour.
    got = rc.d.get("/v1/reservations/availability", key=users[0].key,
                   params={"gpu_type": "H100-SXM", "from": iso(base), "to": iso(base + 16 * 3600)}).json()
    assert [h["cards_free"] for h in got["hours"]] == [cap - total.get(base + 3600 * i, 0) for i in range(16)]
    for i, h in enumerate(got["hours"]):
        t = base + 3600 * i
        free = {n: 8 - per_node.get((n, t), 0) for n in nodes}
        most = max(free.values())
        for f in whole:
            empty = sum(1 for n, nf in nodes.items() if nf == f and free[n] == 8)
            if empty > 1:
                most = max(most, 8 * empty)
        assert h["largest_block"] == most, (i, h, free)
    rc.verify()
