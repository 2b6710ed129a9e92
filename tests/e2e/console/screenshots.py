#!/usr/bin/python3
"""screenshots.py OUTDIR: `make screenshots`. Starts a throw-away gpurentd
with a sim fleet (the e2e harness), fills it with a renter who has run an
instance and an admin, and has screenshots.mjs photograph the console's main
pages in Chinese and English at a laptop's (1366) and a phone's (390) width
into OUTDIR (docs/screenshots)."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))

from harness import DEFAULT_PASSWORD, REPO, Daemon, stop_all  # noqa: E402
from instances_util import FAST_CLOUD, Cloud  # noqa: E402


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
            user = c.d.signup(email="renter@example.com", password=DEFAULT_PASSWORD, invite_code="AMD6GW")
            c.admin("POST", f"/v1/admin/users/{user.id}/topups", json={"amount": "200.00", "payment_id": "pay-shots-1"})
            inst = c.create(user, card_count=8, name="llama-finetune",
                            command=["sh", "-c", "echo epoch 1/3 loss=2.31; echo epoch 2/3 loss=1.87; sleep 3600"])
            c.wait_state(user, inst["id"], ["running"])
            c.d.advance_clock(5400)
            c.admin("POST", "/v1/admin/billing/run", json={})
            c.d.cli_create_user("admin@example.com", admin=True, password=DEFAULT_PASSWORD)
            world = {"base_url": c.d.base_url, "user": user.email, "admin": "admin@example.com",
                     "password": DEFAULT_PASSWORD, "instance_id": inst["id"], "outdir": os.path.abspath(outdir)}
            subprocess.run(["node", os.path.join(HERE, "screenshots.mjs")], cwd=REPO, check=True,
                           env=dict(os.environ, CONSOLE_WORLD=json.dumps(world)))
        finally:
            c.close()
            stop_all(made)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "docs", "screenshots"))
