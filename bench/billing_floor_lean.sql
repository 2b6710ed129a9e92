-- bench/billing_floor_lean.sql: what a full billing pass would cost with
-- fewer ledger rows per charge than today's, to size a redesign (issue 15):
-- one ledger transaction for the whole pass instead of one per charged
-- interval, one posting per user account, inserted in account order, and one
-- revenue posting for the sum; each grant's remaining taken to be its
-- account's balance, so it is not written twice. Same database and charges
-- as bench/billing_floor.sql (every unsettled interval an hour more, from the
-- one grant the bench gave its user). Not the daemon's ledger: its
-- statements and refunds read a transaction per charge, and the transaction
-- row below names only the first user. Not a test.
--
--   build/bench/billing --instances 100000 --dir /tmp/floor --keep
--   sqlite3 /tmp/floor/gpurent.db < bench/billing_floor_lean.sql
.timer on
PRAGMA foreign_keys = ON;
PRAGMA synchronous = FULL;
BEGIN IMMEDIATE;
CREATE TEMP TABLE lean_due AS
    SELECT r.id AS interval_id, r.user_id, r.card_count * 1200000 AS amount,
           'grant:' || (SELECT id FROM credit_grants g WHERE g.user_id = r.user_id) AS account_id
    FROM running_intervals r WHERE r.settled = 0;
INSERT INTO ledger_transactions (at, kind, user_id, reason, created_at)
    SELECT 1900000000, 'usage', (SELECT user_id FROM lean_due LIMIT 1), 'card time, every user', 1900000000;
INSERT INTO ledger_postings (transaction_id, account_id, amount)
    SELECT (SELECT max(id) FROM ledger_transactions), account_id, -sum(amount) FROM lean_due
    GROUP BY account_id ORDER BY account_id;
INSERT INTO ledger_postings (transaction_id, account_id, amount)
    SELECT (SELECT max(id) FROM ledger_transactions), 'revenue', sum(amount) FROM lean_due;
UPDATE ledger_accounts SET balance = balance - m.delta
    FROM (SELECT account_id, sum(amount) AS delta FROM lean_due GROUP BY account_id) m
    WHERE ledger_accounts.id = m.account_id;
UPDATE running_intervals SET billed = billed + d.amount FROM lean_due d WHERE running_intervals.id = d.interval_id;
COMMIT;
