-- bench/billing_floor.sql: the least a full billing pass can cost with the
-- ledger's rows as they are (one usage transaction and two postings per
-- charged interval, cached balances, grants spent in place), measured as
-- plain set-based SQL in one transaction: no C between the statements, no
-- savepoints, no per-user reads. Not the daemon's code and not a test: the
-- floor that code can approach. It charges every unsettled interval an hour
-- more, each from the one grant the bench gave its user (bench/billing.c
-- makes exactly that database):
--
--   build/bench/billing --instances 100000 --dir /tmp/floor --keep
--   sqlite3 /tmp/floor/gpurent.db < bench/billing_floor.sql
--
-- sqlite3 prints each statement's time (.timer); the whole run is the sum.
.timer on
PRAGMA foreign_keys = ON;
PRAGMA synchronous = FULL;
BEGIN IMMEDIATE;
CREATE TEMP TABLE floor_base AS SELECT max(id) AS txn FROM ledger_transactions;
CREATE TEMP TABLE floor_due AS
    SELECT r.id AS interval_id, r.instance_id, r.user_id, r.card_count * 1200000 AS amount,
           (SELECT id FROM credit_grants g WHERE g.user_id = r.user_id) AS grant_id
    FROM running_intervals r WHERE r.settled = 0 ORDER BY r.id;
INSERT INTO ledger_transactions (at, kind, user_id, reason, instance_id, interval_id, created_at)
    SELECT 1900000000, 'usage', user_id, '1 x MI450, ' || instance_id, instance_id, interval_id, 1900000000
    FROM floor_due ORDER BY interval_id;
INSERT INTO ledger_postings (transaction_id, account_id, amount, grant_id)
    SELECT t.id, 'grant:' || d.grant_id, -d.amount, d.grant_id FROM floor_due d
    JOIN ledger_transactions t ON t.interval_id = d.interval_id AND t.id > (SELECT txn FROM floor_base);
INSERT INTO ledger_postings (transaction_id, account_id, amount)
    SELECT t.id, 'revenue', d.amount FROM floor_due d
    JOIN ledger_transactions t ON t.interval_id = d.interval_id AND t.id > (SELECT txn FROM floor_base);
UPDATE ledger_accounts SET balance = balance + m.delta
    FROM (SELECT account_id, sum(amount) AS delta FROM ledger_postings INDEXED BY ledger_postings_by_transaction
          WHERE transaction_id > (SELECT txn FROM floor_base) GROUP BY account_id) m
    WHERE ledger_accounts.id = m.account_id;
UPDATE credit_grants SET remaining = remaining + m.delta
    FROM (SELECT grant_id, sum(amount) AS delta FROM ledger_postings
          WHERE transaction_id > (SELECT txn FROM floor_base) AND grant_id IS NOT NULL GROUP BY grant_id) m
    WHERE credit_grants.id = m.grant_id;
UPDATE running_intervals SET billed = billed + d.amount FROM floor_due d WHERE running_intervals.id = d.interval_id;
COMMIT;
