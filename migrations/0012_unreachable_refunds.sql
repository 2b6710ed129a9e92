-- 0012_unreachable_refunds: nodes that stop answering for a while before
-- they count as gone, instances that wait with them instead of being lost at
-- once, refunds of time charged that turned out not to have run, and the
-- agent's count of workload exits that tells the reconciler when to look.

-- Two CHECK lists gain a value. SQLite cannot ALTER a constraint; widening
-- an IN list accepts every row the old one did, so the table's text is
-- edited in place (the procedure SQLite's documentation gives for loosening
-- a constraint) instead of copying every instance and ledger row into a new
-- table. writable_schema = RESET reloads this connection's schema; the DDL
-- after it bumps the schema cookie, so every other connection reloads too.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '''stopping'', ''stopped'',', '''stopping'', ''stopped'', ''unreachable'',')
 WHERE type = 'table' AND name = 'instances';
UPDATE sqlite_schema
   SET sql = replace(sql, '(''usage'', ''grant'', ''expiry'', ''topup'')',
                          '(''usage'', ''grant'', ''expiry'', ''topup'', ''refund'')')
 WHERE type = 'table' AND name = 'ledger_transactions';
PRAGMA writable_schema = RESET;

-- A node that has missed heartbeat_miss_limit beats in a row but was seen
-- within node_lost_after_s is unreachable: its health stays what it was
-- ('up'), its cards stay with their instances, and nothing new is placed on
-- it. Past node_lost_after_s it goes offline and its instances are lost.
ALTER TABLE nodes ADD COLUMN unreachable_since INTEGER;  -- epoch seconds of the beat that made it unreachable; NULL while it answers
-- The agent's count of workloads that ended (facts' workload_exits); a
-- change makes the reconciler list the node's workloads at once.
ALTER TABLE nodes ADD COLUMN workload_exits INTEGER NOT NULL DEFAULT -1;  -- last value the facts reported; -1 before any

DROP VIEW node_states;
-- A node's state as users of the API see it, derived so it cannot disagree
-- with its parts: pending (never reached), rejected, offline, unreachable,
-- or the admin state.
CREATE VIEW node_states AS
SELECT id AS node_id,
       CASE
           WHEN health = 'unknown' THEN 'pending'
           WHEN health = 'rejected' THEN 'rejected'
           WHEN health = 'offline' THEN 'offline'
           WHEN unreachable_since IS NOT NULL THEN 'unreachable'
           WHEN admin_state = 'active' THEN 'ready'
           ELSE admin_state
       END AS state
FROM nodes WHERE removed_at IS NULL;

-- An unreachable instance still holds its cards: the live-instance indexes
-- of 0009 cover it too, or the quota and funds checks would stop using them.
DROP INDEX instances_holding_by_user;
CREATE INDEX instances_holding_by_user ON instances (user_id, gpu_model, card_count, id)
    WHERE state IN ('pending', 'provisioning', 'running', 'stopping', 'unreachable');

-- A refund reverses the usage postings of one interval: found by interval.
CREATE INDEX ledger_transactions_by_interval ON ledger_transactions (interval_id) WHERE interval_id IS NOT NULL;

-- The usage reports count refunds against the usage they return, so the
-- money in them is what users were finally charged.
DROP VIEW report_daily_revenue;
DROP VIEW report_usage;

-- Revenue per day and GPU type, dated by the billing pass that posted it;
-- a refund counts against the day it was given.
CREATE VIEW report_daily_revenue AS
SELECT date(t.at, 'unixepoch') AS day,
       r.gpu_model AS gpu_type,
       sum(CASE WHEN p.account_id = 'revenue' THEN p.amount ELSE 0 END) AS revenue_micro,
       -sum(CASE WHEN a.kind = 'grant' THEN p.amount ELSE 0 END) AS paid_by_credit_micro,
       -sum(CASE WHEN a.kind = 'cash' THEN p.amount ELSE 0 END) AS paid_by_cash_micro,
       count(DISTINCT t.id) AS transactions
FROM ledger_transactions t
JOIN ledger_postings p ON p.transaction_id = t.id
JOIN ledger_accounts a ON a.id = p.account_id
JOIN running_intervals r ON r.id = t.interval_id
WHERE t.kind IN ('usage', 'refund')
GROUP BY day, r.gpu_model;

-- Usage per day, user and instance: card-seconds run that day (an interval
-- still running counts up to the last billing pass, so it matches the money)
-- and what was charged that day, split into credit and cash.
CREATE VIEW report_usage AS
WITH RECURSIVE
spans AS (
    SELECT r.id, r.instance_id, r.user_id, r.gpu_model, r.card_count AS cards, r.started_at AS s,
           coalesce(r.ended_at, (SELECT max(t.at) FROM ledger_transactions t WHERE t.interval_id = r.id), r.started_at) AS e
    FROM running_intervals r),
days(instance_id, user_id, gpu_model, cards, d0, s, e) AS (
    SELECT instance_id, user_id, gpu_model, cards, (s / 86400) * 86400, s, e FROM spans WHERE e > s
    UNION ALL
    SELECT instance_id, user_id, gpu_model, cards, d0 + 86400, s, e FROM days WHERE d0 + 86400 < e),
secs AS (
    SELECT date(d0, 'unixepoch') AS day, user_id, instance_id, gpu_model,
           sum(cards * (min(e, d0 + 86400) - max(s, d0))) AS card_seconds
    FROM days GROUP BY 1, 2, 3, 4),
money AS (
    SELECT date(t.at, 'unixepoch') AS day, t.user_id, t.instance_id,
           -sum(CASE WHEN a.kind IN ('cash', 'grant') THEN p.amount ELSE 0 END) AS cost,
           -sum(CASE WHEN a.kind = 'grant' THEN p.amount ELSE 0 END) AS credit,
           -sum(CASE WHEN a.kind = 'cash' THEN p.amount ELSE 0 END) AS cash
    FROM ledger_transactions t
    JOIN ledger_postings p ON p.transaction_id = t.id
    JOIN ledger_accounts a ON a.id = p.account_id
    WHERE t.kind IN ('usage', 'refund')
    GROUP BY 1, 2, 3)
SELECT coalesce(secs.day, money.day) AS day,
       coalesce(secs.user_id, money.user_id) AS user_id,
       u.email AS email,
       coalesce(secs.instance_id, money.instance_id) AS instance_id,
       i.gpu_model AS gpu_type,
       coalesce(secs.card_seconds, 0) AS card_seconds,
       coalesce(money.cost, 0) AS cost_micro,
       coalesce(money.credit, 0) AS paid_by_credit_micro,
       coalesce(money.cash, 0) AS paid_by_cash_micro
FROM secs FULL OUTER JOIN money ON money.day = secs.day AND money.instance_id = secs.instance_id
JOIN users u ON u.id = coalesce(secs.user_id, money.user_id)
JOIN instances i ON i.id = coalesce(secs.instance_id, money.instance_id);
