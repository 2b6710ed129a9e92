#!/usr/bin/env python3
"""bench/startup.py: how long gpurentd takes from exec to answering /readyz
on a database that already holds a long ledger, and how much memory it has
then; nginx's exec to its first answer on the same machine is the reference.

The database is made once by `gpurentd migrate` and filled with SQL:
--users users, each with a cash account, and --postings ledger postings
(top-ups of cash: a `topups` row, a `topup` ledger transaction, a posting
into the user's cash and one out of `payments`), with every cached balance
equal to the sum of its postings, so `gpurentd ledger verify` passes on it
(it is run once, and its time printed). Then, --rounds times, interleaved:

  gpurentd  `gpurentd serve` on a free loopback port, timed from exec to
            the first 200 of GET /readyz (polled over a new connection
            every millisecond); its RSS (VmRSS) then; SIGTERM, wait.
  nginx     nginx (nginx-light) serving one file, timed from exec to its
            first 200; SIGTERM, wait.

It prints one Markdown row per figure for `make bench` (bench/table.py):
the best round of each, with every round, and the ratio (gpurentd over
nginx; over 1 here means slower). Loopback only; nothing here is a test.

    python3 bench/startup.py --postings 1000000
"""
import argparse
import datetime
import http.client
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

from common import memory_kb

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from reads import Nginx, free_port, loadavg  # noqa: E402 (after the path)

T0 = 1_800_000_000  # epoch seconds the rows are dated from


def fill(db, users, postings):
    """Users with cash, and postings/2 top-ups spread over them, in SQL."""
    con = sqlite3.connect(db)
    con.executescript(f"""
        BEGIN;
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {users})
        INSERT INTO users (id, email, created_at)
            SELECT printf('usr_%020d', i), printf('u%d@bench.test', i), {T0} FROM n;
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {postings // 2})
        INSERT INTO topups (id, user_id, payment_id, amount, source, created_at)
            SELECT printf('top_%020d', i), printf('usr_%020d', i % {users}), printf('pay-%d', i),
                   1000000 + i % 1000, 'admin', {T0} + i FROM n;
        INSERT INTO ledger_transactions (at, kind, user_id, reason, topup_id, created_at)
            SELECT created_at, 'topup', user_id, 'top-up', id, created_at FROM topups ORDER BY id;
        INSERT INTO ledger_accounts (id, kind, user_id)
            SELECT 'cash:' || id, 'cash', id FROM users;
        INSERT INTO ledger_postings (transaction_id, account_id, amount)
            SELECT t.id, 'cash:' || t.user_id, p.amount FROM ledger_transactions t JOIN topups p ON p.id = t.topup_id
            UNION ALL
            SELECT t.id, 'payments', -p.amount FROM ledger_transactions t JOIN topups p ON p.id = t.topup_id
            ORDER BY 1;
        UPDATE ledger_accounts SET balance = (SELECT coalesce(sum(amount), 0) FROM ledger_postings
                                              WHERE account_id = ledger_accounts.id);
        COMMIT;
    """)
    n = con.execute("SELECT count(*) FROM ledger_postings").fetchone()[0]
    con.close()
    return n


def status(port, path):
    """The status of GET path on a new connection; 0 if none came."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        c.request("GET", path)
        s = c.getresponse().status
        c.close()
        return s
    except OSError:
        return 0


def until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.001)


def start_gpurentd(args, db, work):
    """Seconds from exec to /readyz, and the daemon's RSS in MiB then."""
    port = free_port()
    with open(os.path.join(work, "gpurentd.log"), "a") as log:
        t = time.monotonic()
        p = subprocess.Popen([args.gpurentd, "serve", "--listen", f"127.0.0.1:{port}", "--db", db,
                              "-o", "log_level=warn"], stdout=subprocess.DEVNULL, stderr=log,
                             stdin=subprocess.DEVNULL)
        try:
            until(lambda: p.poll() is not None or status(port, "/readyz") == 200, 60, "gpurentd's /readyz")
            if p.poll() is not None:
                raise SystemExit(f"gpurentd exited {p.returncode}; see {work}/gpurentd.log")
            took = time.monotonic() - t
            rss = memory_kb(p.pid)["VmRSS"] / 1024
        finally:
            p.terminate()
            p.wait(60)
    return took, rss


def start_nginx():
    """Seconds from exec to nginx's first 200."""
    t = time.monotonic()
    n = Nginx({"/ok": b"{}"})  # returns once the port accepts
    try:
        until(lambda: status(n.port, "/ok") == 200, 10, "nginx's first answer")
        return time.monotonic() - t
    finally:
        n.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--postings", type=int, default=1_000_000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gpurentd", default=os.environ.get("GPURENTD") or os.path.join(REPO, "build", "gpurentd"))
    args = ap.parse_args()
    if not shutil.which("nginx"):
        raise SystemExit("bench/startup.py needs nginx (scripts/deps.sh bench installs it)")
    work = tempfile.mkdtemp(prefix="gpurent-bench-startup-")
    try:
        db = os.path.join(work, "gpurent.db")
        subprocess.run([args.gpurentd, "migrate", "--db", db], check=True, capture_output=True)
        t = time.monotonic()
        n = fill(db, args.users, args.postings)
        print(f"# {n:,} postings of {args.users:,} users filled in {time.monotonic() - t:.1f} s", file=sys.stderr)
        t = time.monotonic()
        v = subprocess.run([args.gpurentd, "ledger", "verify", "--db", db], capture_output=True, text=True)
        if v.returncode != 0:
            raise SystemExit(f"ledger verify failed on the filled database:\n{v.stdout}{v.stderr}")
        print(f"# ledger verify passed in {time.monotonic() - t:.1f} s", file=sys.stderr)
        ours, rss, ref, loads = [], [], [], []
        for _ in range(args.rounds):
            loads.append(loadavg())
            took, mb = start_gpurentd(args, db, work)
            ours.append(took * 1000)
            rss.append(mb)
            ref.append(start_nginx() * 1000)
        loads.append(loadavg())
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
        cmd = f"python3 bench/startup.py --postings {args.postings}"
        best, best_ref = min(ours), min(ref)
        print(f"| start-up: exec to `/readyz` 200, a ledger of {n:,} postings | {best:.0f} ms "
              f"(rounds {', '.join(f'{v:.0f}' for v in ours)}); RSS then {min(rss):.1f}–{max(rss):.1f} MiB "
              f"| nginx exec to its first 200: {best_ref:.0f} ms (rounds {', '.join(f'{v:.0f}' for v in ref)}) "
              f"| {best / best_ref:.2f} | {min(loads)}–{max(loads)} | `{cmd}` | {date} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
