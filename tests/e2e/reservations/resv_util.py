"""resv_util.py: what the reservation tests share: a Cloud on the testing
clock with H100 (reservation-required) nodes priced, booking helpers, and
the ledger checks every money test ends with.

ResvCloud(cloud) wraps an instances_util.Cloud:
  price(model, yuan)            sets the type's card-hour price from now on
  book(acct, cards, start, hours, gpu="H100-SXM", expect=201, **kw) -> dict
  hour(n) -> the whole hour n hours after the current one
  billing()                     a full billing pass (runs the reservations pass first)
  verify()                      `gpurentd ledger verify` passes and the Python re-check finds nothing
  bound(rid) -> [(node name, cards)]  the nodes block rid is bound to
  reservation_grants() -> [(user_id, amount)]  the credit reservations gave, oldest first
  node_id(name) -> the id of the node so named
rc                              pytest fixture: a ResvCloud over the test's `cloud`
                                with H100-SXM at 2.00 a card-hour
"""
import os
import sqlite3
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))

from money_util import iso, ledger_breaches, ledger_verify  # noqa: E402

CUDA_IMAGE = "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"


class ResvCloud:
    def __init__(self, cloud):
        self.c = cloud
        self.d = cloud.d

    def price(self, model, amount):
        r = self.c.admin("PUT", f"/v1/admin/prices/{model}",
                         json={"price_per_card_hour": amount, "effective_at": iso(self.d.now())})
        assert r.status_code == 200, r.text

    def hour(self, n):
        now = self.d.now()
        return now - now % 3600 + 3600 * n

    def book(self, acct, cards, start, hours, gpu="H100-SXM", expect=201, headers=None):
        r = self.d.post("/v1/reservations", key=acct.key, headers=headers,
                        json={"gpu_type": gpu, "cards": cards, "starts_at": iso(start),
                              "ends_at": iso(start + hours * 3600)})
        assert r.status_code == expect, r.text
        return r.json()

    def billing(self):
        r = self.c.admin("POST", "/v1/admin/billing/run", json={})
        assert r.status_code == 200, r.text

    def verify(self):
        rc, out = ledger_verify(self.d.db_path)
        assert rc == 0 and out.strip().splitlines()[-1] == "ledger OK", out
        con = sqlite3.connect(self.d.db_path)
        try:
            con.execute("BEGIN")
            assert ledger_breaches(con) == []
        finally:
            con.close()

    def launch(self, acct, reservation_id, cards, expect=201):
        return self.c.create(acct, expect=expect, gpu_type="H100-SXM", image=CUDA_IMAGE, card_count=cards,
                             reservation_id=reservation_id)

    def bound(self, rid):
        """Names of the nodes the block is bound to, with its cards on each."""
        return self.d.sql("SELECT n.name, b.cards FROM reservation_nodes b JOIN nodes n ON n.id = b.node_id"
                          " WHERE b.reservation_id = ? ORDER BY n.name", (rid,))

    def reservation_grants(self):
        return self.d.sql("SELECT user_id, amount FROM credit_grants WHERE source = 'reservation'"
                          " ORDER BY created_at")

    def node_id(self, name):
        return self.d.sql("SELECT id FROM nodes WHERE name = ?", (name,))[0][0]

    def counts(self):
        """What a refused request must leave as it was."""
        return self.d.sql("SELECT (SELECT count(*) FROM reservations), (SELECT count(*) FROM ledger_transactions),"
                          " (SELECT coalesce(sum(balance), 0) FROM ledger_accounts WHERE kind = 'cash')")[0]


@pytest.fixture
def rc(cloud):
    r = ResvCloud(cloud)
    r.price("H100-SXM", "2.00")
    return r
