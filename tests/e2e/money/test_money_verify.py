"""test_money_verify.py: `gpurentd ledger verify` fails on every kind of
breach it checks. A real daemon makes a ledger with every kind of row (a
top-up, grants spent, expired and voided, intervals settled and still
running); each test corrupts its own copy in one way, the way a bug or a
hand-written UPDATE would, and the verifier must exit non-zero and name the
breach and the row. Corruptions that the schema's CHECK constraints refuse
are made with PRAGMA ignore_check_constraints, after checking that the
constraint does refuse them. The same invariants in Python
(money_util.ledger_breaches, which the random model test runs after every
step) must see each corruption too."""
import os
import shutil
import sqlite3

import pytest

from money_util import MICRO, cluster_fixture, ledger_breaches, ledger_verify, verify_ledgers  # noqa: F401

verify_cluster = cluster_fixture({"MI450": 1})


@pytest.fixture(scope="module")
def base(verify_cluster, tmp_path_factory):
    """A copy of a ledger with every kind of row, and the ids worth corrupting."""
    c = verify_cluster
    u = c.signup()                                  # a 10.00 sign-up grant, drawn first
    t0 = c.d.now()
    c.topup(u, 100 * MICRO)
    soon = c.grant(u, 1 * MICRO, expires_at=t0 + 60)  # drawn, then what is left voided
    # Storage: the default volume billed while it lives, another deleted.
    r = c.admin("PUT", "/v1/admin/storage-prices/global", json={"price_per_gb_month": "3.00"})
    assert r.status_code == 200, r.text
    r = c.d.post("/v1/volumes", key=u.key, json={"name": "gone", "size_gb": 10})
    assert r.status_code == 201, r.text
    gone = r.json()["id"]
    done = c.launch(u, "MI450", 1)
    c.d.set_clock(t0 + 1000)
    assert c.d.delete(f"/v1/volumes/{gone}", key=u.key).status_code == 204
    c.d.set_clock(t0 + 3600)
    c.billing()
    c.stop(u, done)
    c.d.advance_clock(1)
    live = c.launch(u, "MI450", 1)
    c.d.advance_clock(600)
    c.billing()
    path = str(tmp_path_factory.mktemp("verify") / "base.db")
    src = sqlite3.connect(f"file:{c.d.db_path}?mode=ro", uri=True)
    dst = sqlite3.connect(path)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    con = sqlite3.connect(path)
    try:
        q = lambda sql, *a: con.execute(sql, a).fetchone()[0]  # noqa: E731
        ids = {
            "user": u.id,
            "cash": f"cash:{u.id}",
            "signup": q("SELECT id FROM credit_grants WHERE user_id = ? AND source = 'signup'", u.id),
            "soon": soon,
            "topup": q("SELECT id FROM topups WHERE user_id = ?", u.id),
            "topup_txn": q("SELECT id FROM ledger_transactions WHERE kind = 'topup' AND user_id = ?", u.id),
            "settled": q("SELECT id FROM running_intervals WHERE instance_id = ?", done),
            "open": q("SELECT id FROM running_intervals WHERE instance_id = ?", live),
            "gone": gone,
            "shared": q("SELECT volume_id FROM instances WHERE id = ?", live),
            "storage_txn": q("SELECT max(id) FROM ledger_transactions WHERE kind = 'storage' AND volume_id = ?",
                             q("SELECT volume_id FROM instances WHERE id = ?", live)),
        }
        assert q("SELECT storage_settled = 1 AND storage_billed > 0 FROM volumes WHERE id = ?", gone) == 1
        assert q("SELECT storage_settled = 0 AND storage_billed > 0 FROM volumes WHERE id = ?", ids["shared"]) == 1
        # What the corruptions rely on.
        assert q("SELECT voided_at IS NOT NULL AND remaining = 0 FROM credit_grants WHERE id = ?", soon) == 1
        assert q("SELECT remaining > 0 FROM credit_grants WHERE id = ?", ids["signup"]) == 1
        assert q("SELECT settled = 1 AND billed > 0 FROM running_intervals WHERE id = ?", ids["settled"]) == 1
        assert q("SELECT settled = 0 AND billed > 0 AND ended_at IS NULL FROM running_intervals WHERE id = ?",
                 ids["open"]) == 1
        assert q("SELECT balance FROM ledger_accounts WHERE id = ?", ids["cash"]) > 0
    finally:
        con.close()
    return path, ids


@pytest.fixture
def copy(base, tmp_path):
    """A fresh copy of the base ledger for one test to corrupt."""
    path, ids = base
    out = str(tmp_path / "corrupt.db")
    shutil.copyfile(path, out)
    return out, ids


def post(con, user, kind, legs, at=1_800_000_000):
    """Writes a transaction with legs [(account, amount, grant_id)] and
    moves the cached balances, as the daemon would, but with no checks."""
    cur = con.execute("INSERT INTO ledger_transactions (at, kind, user_id, reason, created_at)"
                      " VALUES (?, ?, ?, 'corruption', ?)", (at, kind, user, at))
    txn = cur.lastrowid
    for account, amount, grant in legs:
        con.execute("INSERT INTO ledger_postings (transaction_id, account_id, amount, grant_id) VALUES (?, ?, ?, ?)",
                    (txn, account, amount, grant))
        con.execute("UPDATE ledger_accounts SET balance = balance + ? WHERE id = ?", (amount, account))
    return txn


def balance(con, account):
    return con.execute("SELECT balance FROM ledger_accounts WHERE id = ?", (account,)).fetchone()[0]


def corrupt(path, fn):
    con = sqlite3.connect(path)
    try:
        with con:
            out = fn(con)
    finally:
        con.close()
    return out


def python_breaches(path):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return ledger_breaches(con)
    finally:
        con.close()


def assert_breach(path, what, subject):
    assert python_breaches(path), f"money_util.ledger_breaches missed a corrupt ledger ({what})"
    rc, out = ledger_verify(path)
    assert rc != 0, f"ledger verify passed a corrupt ledger ({what}):\n{out}"
    assert f"breach: {what}: {subject}" in out, f"want a breach '{what}' naming {subject}:\n{out}"
    assert "ledger OK" not in out, out
    assert "breaches" in out.splitlines()[-1], out
    return out


def test_the_uncorrupted_copy_passes(copy):
    path, _ = copy
    rc, out = ledger_verify(path)
    assert rc == 0 and out.strip().splitlines()[-1] == "ledger OK", out
    assert python_breaches(path) == []


def test_an_unbalanced_transaction(copy):
    path, ids = copy

    def fn(con):
        # The payments leg of the top-up grows by 7 (its cache too): the
        # transaction sums to -7.
        con.execute("UPDATE ledger_postings SET amount = amount - 7"
                    " WHERE transaction_id = ? AND account_id = 'payments'", (ids["topup_txn"],))
        con.execute("UPDATE ledger_accounts SET balance = balance - 7 WHERE id = 'payments'")
    corrupt(path, fn)
    out = assert_breach(path, "transaction does not balance", f"{ids['topup_txn']}: postings sum to -7")
    assert "breach: money exists outside the ledger" in out


def test_a_transaction_with_fewer_than_two_postings(copy):
    path, ids = copy
    txn = corrupt(path, lambda con: post(con, ids["user"], "usage", []))
    assert_breach(path, "transaction has fewer than two postings", f"{txn}: 0 postings")


def test_a_cached_balance_that_differs_from_its_postings(copy):
    path, ids = copy
    was = corrupt(path, lambda con: balance(con, ids["cash"]))
    corrupt(path, lambda con: con.execute("UPDATE ledger_accounts SET balance = balance + 5 WHERE id = ?",
                                          (ids["cash"],)))
    assert_breach(path, "cached balance differs from the sum of postings",
                  f"{ids['cash']}: balance {was + 5}, postings {was}")


def test_money_outside_the_ledger(copy):
    path, ids = copy
    corrupt(path, lambda con: con.execute("UPDATE ledger_accounts SET balance = balance + 3 WHERE id = 'revenue'"))
    assert_breach(path, "money exists outside the ledger", "all accounts: sum 3")


def test_a_negative_user_account_past_its_check(copy):
    path, ids = copy
    cash = ids["cash"]

    def overdraw(con):
        have = balance(con, cash)
        post(con, ids["user"], "usage", [(cash, -(have + 1), None), ("revenue", have + 1, None)])

    # The schema refuses it...
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        corrupt(path, overdraw)
    # ...unless its checks are switched off; the verifier still sees it.
    def fn(con):
        con.execute("PRAGMA ignore_check_constraints = ON")
        overdraw(con)
    corrupt(path, fn)
    assert corrupt(path, lambda con: balance(con, cash)) == -1
    assert_breach(path, "user account went below zero", f"{cash}: lowest running balance -1")


def test_a_user_account_that_dipped_below_zero_and_came_back(copy):
    """No CHECK sees it: the cached balance ends at zero. Only the running
    sum of the postings shows the overdraft."""
    path, ids = copy
    cash = ids["cash"]

    def fn(con):
        have = balance(con, cash)
        con.execute("PRAGMA ignore_check_constraints = ON")
        post(con, ids["user"], "usage", [(cash, -(have + 2), None), ("revenue", have + 2, None)])
        con.execute("PRAGMA ignore_check_constraints = OFF")
        post(con, ids["user"], "topup", [(cash, 2, None), ("payments", -2, None)])
    corrupt(path, fn)
    assert corrupt(path, lambda con: balance(con, cash)) == 0
    assert_breach(path, "user account went below zero", f"{cash}: lowest running balance -2")


def test_a_grant_overspent(copy):
    path, ids = copy
    g = ids["signup"]

    def fn(con):
        con.execute("PRAGMA ignore_check_constraints = ON")
        left = balance(con, f"grant:{g}")
        post(con, ids["user"], "usage", [(f"grant:{g}", -(left + 1), g), ("revenue", left + 1, None)])
        con.execute("UPDATE credit_grants SET remaining = -1 WHERE id = ?", (g,))
    corrupt(path, fn)
    out = assert_breach(path, "grant overspent or never funded",
                        f"{g}: amount {10 * MICRO}, funded {10 * MICRO}, drawn {10 * MICRO + 1}")
    assert f"breach: user account went below zero: grant:{g}: lowest running balance -1" in out


def test_a_grant_never_funded(copy):
    path, ids = copy
    g = "grt_" + "z" * 20
    corrupt(path, lambda con: con.execute(
        "INSERT INTO credit_grants (id, user_id, source, amount, remaining, created_at)"
        " VALUES (?, ?, 'admin', 5, 0, 1800000000)", (g, ids["user"])))
    assert_breach(path, "grant overspent or never funded", f"{g}: amount 5, funded 0, drawn 0")


def test_a_grant_remaining_that_differs_from_its_account(copy):
    path, ids = copy
    g = ids["signup"]
    left = corrupt(path, lambda con: balance(con, f"grant:{g}"))
    corrupt(path, lambda con: con.execute("UPDATE credit_grants SET remaining = remaining - 1 WHERE id = ?", (g,)))
    assert_breach(path, "grant's remaining differs from its account", f"{g}: remaining {left - 1}, account {left}")


def test_a_voided_grant_with_money_left(copy):
    path, ids = copy
    corrupt(path, lambda con: con.execute("UPDATE credit_grants SET remaining = 1 WHERE id = ?", (ids["soon"],)))
    assert_breach(path, "voided grant still has money", f"{ids['soon']}: remaining 1")


def test_a_grant_leg_that_does_not_name_its_grant(copy):
    path, ids = copy
    g = ids["signup"]

    def fn(con):
        pid = con.execute("SELECT min(id) FROM ledger_postings WHERE account_id = ?", (f"grant:{g}",)).fetchone()[0]
        con.execute("UPDATE ledger_postings SET grant_id = NULL WHERE id = ?", (pid,))
        return pid
    pid = corrupt(path, fn)
    assert_breach(path, "grant leg does not name its grant", f"{pid}: grant:{g}")


def test_an_interval_billed_other_than_its_revenue(copy):
    path, ids = copy
    iv = ids["open"]
    billed = corrupt(path, lambda con: con.execute("SELECT billed FROM running_intervals WHERE id = ?",
                                                   (iv,)).fetchone()[0])
    corrupt(path, lambda con: con.execute("UPDATE running_intervals SET billed = billed + 1 WHERE id = ?", (iv,)))
    assert_breach(path, "interval's revenue differs from what it says was billed",
                  f"{iv}: billed {billed + 1}, revenue {billed}")


def test_an_interval_settled_while_still_open(copy):
    path, ids = copy
    iv = ids["open"]
    corrupt(path, lambda con: con.execute("UPDATE running_intervals SET settled = 1 WHERE id = ?", (iv,)))
    assert_breach(path, "interval settled while still open", f"{iv}: billed")


def test_a_settled_interval_billed_other_than_its_tariff(copy):
    path, ids = copy
    iv = ids["settled"]
    billed = corrupt(path, lambda con: con.execute("SELECT billed FROM running_intervals WHERE id = ?",
                                                   (iv,)).fetchone()[0])
    # A minute more of one MI450 card at 1.20 an hour is 0.02 more due.
    corrupt(path, lambda con: con.execute("UPDATE running_intervals SET ended_at = ended_at + 60 WHERE id = ?", (iv,)))
    out = assert_breach(path, "settled interval billed other than its tariff", f"{iv}: billed {billed}, due")
    assert f"due {billed + 20_000}" in out, out


def test_a_topup_that_differs_from_the_cash_it_added(copy):
    path, ids = copy
    corrupt(path, lambda con: con.execute("UPDATE topups SET amount = amount + 1 WHERE id = ?", (ids["topup"],)))
    assert_breach(path, "top-up differs from the cash it added",
                  f"{ids['topup']}: amount {100 * MICRO + 1}, cash {100 * MICRO}")


def test_a_volume_billed_other_than_its_storage_revenue(copy):
    path, ids = copy
    vid = ids["shared"]
    billed = corrupt(path, lambda con: con.execute("SELECT storage_billed FROM volumes WHERE id = ?",
                                                   (vid,)).fetchone()[0])
    corrupt(path, lambda con: con.execute("UPDATE volumes SET storage_billed = storage_billed + 1 WHERE id = ?",
                                          (vid,)))
    assert_breach(path, "volume's storage revenue differs from what it says was billed",
                  f"{vid}: billed {billed + 1}, revenue {billed}")


def test_a_deleted_volume_billed_other_than_its_storage_tariff(copy):
    path, ids = copy
    vid = ids["gone"]
    billed = corrupt(path, lambda con: con.execute("SELECT storage_billed FROM volumes WHERE id = ?",
                                                   (vid,)).fetchone()[0])
    # A day more of 10 GB at 3.00 a GB-month is 1.00 more due.
    corrupt(path, lambda con: con.execute("UPDATE volumes SET deleted_at = deleted_at + 86400 WHERE id = ?", (vid,)))
    out = assert_breach(path, "deleted volume's storage billed other than its tariff", f"{vid}: billed {billed}, due")
    assert f"due {billed + 1_000_000}" in out, out


def test_a_volume_settled_while_it_exists(copy):
    path, ids = copy
    corrupt(path, lambda con: con.execute("UPDATE volumes SET storage_settled = 1 WHERE id = ?", (ids["shared"],)))
    assert_breach(path, "volume's storage settled while it exists", f"{ids['shared']}: billed")


def test_a_storage_transaction_that_names_no_volume(copy):
    path, ids = copy
    txn = ids["storage_txn"]
    corrupt(path, lambda con: con.execute("UPDATE ledger_transactions SET volume_id = NULL WHERE id = ?", (txn,)))
    assert_breach(path, "storage transaction names no volume of its user or moves other than its funds to revenue",
                  f"{txn}: volume none")


def test_the_base_copy_is_left_alone(base):
    """Each test corrupted its own copy: the base still passes."""
    path, _ = base
    assert os.path.exists(path)
    rc, out = ledger_verify(path)
    assert rc == 0, out
