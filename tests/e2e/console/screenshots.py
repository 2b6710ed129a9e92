#!/usr/bin/python3
"""screenshots.py OUTDIR: `make screenshots`. Starts a throw-away gpurentd
with a sim fleet (the e2e harness), fills it with a renter who has run an
instance, booked a reserved block and published an app, and an admin, and
has screenshots.mjs photograph the console's main pages in Chinese and
English at a laptop's (1366) and a phone's (390) width into OUTDIR
(docs/screenshots). SHOTS=name,name (screenshots.mjs's names) takes only
those pages."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))

from harness import DEFAULT_PASSWORD, REPO, Daemon, stop_all  # noqa: E402
from instances_util import FAST_CLOUD, Cloud  # noqa: E402
from money_util import iso  # noqa: E402


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory(prefix="gpurent-shots-") as tmp:
        def new_daemon(**kw):
            d = Daemon(os.path.join(tmp, f"d{len(made)}"), **kw)
            made.append(d)
            return d
        from pathlib import Path
        c = Cloud(new_daemon, Path(tmp), options={**FAST_CLOUD, "billing_interval_ms": "3600000"})
        try:
            c.fleet(2)
            c.fleet(1, model="MI300X")
            c.fleet(2, model="H100-SXM", fabric="ib-1")
            user = c.d.signup(email="renter@example.com", password=DEFAULT_PASSWORD, invite_code="AMD6GW")
            c.admin("POST", f"/v1/admin/users/{user.id}/topups", json={"amount": "200.00", "payment_id": "pay-shots-1"})
            inst = c.create(user, card_count=8, name="llama-finetune",
                            command=["sh", "-c", "echo epoch 1/3 loss=2.31; echo epoch 2/3 loss=1.87; sleep 3600"])
            c.wait_state(user, inst["id"], ["running"])
            c.d.advance_clock(5400)
            c.admin("POST", "/v1/admin/billing/run", json={})
            c.d.cli_create_user("admin@example.com", admin=True, password=DEFAULT_PASSWORD)
            # A booked block of the reservation-only type and a published app.
            now = c.d.now()
            day = now - now % 3600 + 24 * 3600
            c.admin("PUT", "/v1/admin/prices/H100-SXM", json={"price_per_card_hour": "2.00", "effective_at": iso(now)})
            r = c.d.post("/v1/reservations", key=user.key, json={"gpu_type": "H100-SXM", "cards": 8, "starts_at": iso(day + 3 * 3600),
                                                                 "ends_at": iso(day + 9 * 3600)})
            assert r.status_code == 201, r.text
            r = c.d.post("/v1/apps", key=user.key, json={
                "slug": "llama-chat", "name": "Llama 3 Chat (fine-tuned)", "description": "A chat model fine-tuned on MI450s",
                "image": "rocm/pytorch:2.3-rocm6.2", "gpu_type": "MI450", "port": 8000, "max_replicas": 4,
                "price_per_1k_input_tokens": "0.002", "price_per_1k_output_tokens": "0.006"})
            assert r.status_code == 201, r.text
            world = {"base_url": c.d.base_url, "user": user.email, "admin": "admin@example.com",
                     "password": DEFAULT_PASSWORD, "instance_id": inst["id"], "outdir": os.path.abspath(outdir),
                     "reservations_from": iso(day), "app_slug": "llama-chat"}
            subprocess.run(["node", os.path.join(HERE, "screenshots.mjs")], cwd=REPO, check=True,
                           env=dict(os.environ, CONSOLE_WORLD=json.dumps(world)))
        finally:
            c.close()
            stop_all(made)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "docs", "screenshots"))
