-- 0005_reports: views for the billing team. Each is documented column by
-- column in docs/REPORTS.md and read by `gpurentd report NAME`. Amounts in
-- columns ending in _micro are integer micro-units of the platform currency
-- (1 yuan = 1 000 000); days are UTC dates 'YYYY-MM-DD'.

-- Revenue per day and GPU type, dated by the billing pass that posted it.
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
WHERE t.kind = 'usage'
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
    WHERE t.kind = 'usage'
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

-- Utilisation per day and GPU type: card-seconds sold over card-seconds
-- available, where availability is today's accepted cards of that type
-- around the clock (the store keeps no history of capacity).
CREATE VIEW report_utilisation AS
SELECT u.day AS day,
       u.gpu_type AS gpu_type,
       sum(u.card_seconds) AS card_seconds_sold,
       c.cards * 86400 AS card_seconds_available,
       CASE WHEN c.cards > 0 THEN round(1.0 * sum(u.card_seconds) / (c.cards * 86400), 4) END AS utilisation
FROM report_usage u
JOIN (SELECT n.gpu_model, count(*) AS cards FROM node_cards nc JOIN nodes n ON n.id = nc.node_id
      WHERE n.removed_at IS NULL AND n.health IN ('up', 'offline') GROUP BY n.gpu_model) c ON c.gpu_model = u.gpu_type
GROUP BY u.day, u.gpu_type;

-- Outstanding credit: every grant with money left, with its expiry (day is
-- the expiry date, NULL for credit that never expires).
CREATE VIEW report_credit_liability AS
SELECT date(g.expires_at, 'unixepoch') AS day,
       g.user_id AS user_id,
       u.email AS email,
       g.id AS grant_id,
       g.source AS source,
       g.amount AS granted_micro,
       g.remaining AS remaining_micro,
       datetime(g.expires_at, 'unixepoch') AS expires_at
FROM credit_grants g JOIN users u ON u.id = g.user_id
WHERE g.remaining > 0 AND g.voided_at IS NULL;

-- Cash top-ups, by the day they arrived.
CREATE VIEW report_topups AS
SELECT date(t.created_at, 'unixepoch') AS day,
       t.user_id AS user_id,
       u.email AS email,
       t.id AS topup_id,
       t.payment_id AS payment_id,
       t.source AS source,
       t.amount AS amount_micro
FROM topups t JOIN users u ON u.id = t.user_id;
