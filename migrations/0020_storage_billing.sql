-- 0020_storage_billing: volumes are billed for their size while they exist,
-- running or not. A price per GB-month (a month is 30 days, 2 592 000 s),
-- global or for one region, from an effective time on; each volume's region
-- and what billing has charged it so far; 'storage' ledger transactions
-- naming the volume; 'storage_price' admin actions.

-- Price per GB-month of storage from effective_at on. region '' is the
-- global price; a region with rows of its own uses them from its first row
-- on (the global price before). A change never applies backwards: rows are
-- only ever added (or a future one replaced).
CREATE TABLE storage_prices (
    region       TEXT NOT NULL CHECK (region = '' OR length(region) BETWEEN 1 AND 63),  -- '' global, else a region's own
    effective_at INTEGER NOT NULL CHECK (effective_at >= 0),  -- epoch seconds from which this price applies
    gb_month     INTEGER NOT NULL CHECK (gb_month >= 0),  -- micro-yuan per GB per 30 days
    created_at   INTEGER NOT NULL,  -- epoch seconds when an admin set it
    PRIMARY KEY (region, effective_at)
) STRICT;

ALTER TABLE volumes ADD COLUMN region TEXT NOT NULL DEFAULT '' CHECK (region = '' OR length(region) BETWEEN 1 AND 63);  -- whose storage price applies: '' the global one
ALTER TABLE volumes ADD COLUMN storage_billed INTEGER NOT NULL DEFAULT 0 CHECK (storage_billed >= 0);  -- micro-yuan of storage posted for it so far
ALTER TABLE volumes ADD COLUMN storage_billed_to INTEGER NOT NULL DEFAULT 0;  -- epoch second of the last storage charge; a deletion is never put before it
ALTER TABLE volumes ADD COLUMN storage_settled INTEGER NOT NULL DEFAULT 0 CHECK (storage_settled IN (0, 1));  -- 1: deleted and charged its whole tariff
CREATE INDEX volumes_storage_unsettled ON volumes (user_id, created_at, id) WHERE storage_settled = 0;

-- A storage transaction names the volume it charges.
ALTER TABLE ledger_transactions ADD COLUMN volume_id TEXT REFERENCES volumes (id);  -- storage: which volume
CREATE INDEX ledger_transactions_by_volume ON ledger_transactions (volume_id) WHERE volume_id IS NOT NULL;

-- Two CHECK lists gain a value, widened in place as 0012 does it (every
-- row the old list accepted, the new one does).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '(''usage'', ''grant'', ''expiry'', ''topup'', ''refund'')',
                          '(''usage'', ''grant'', ''expiry'', ''topup'', ''refund'', ''storage'')')
 WHERE type = 'table' AND name = 'ledger_transactions';
UPDATE sqlite_schema
   SET sql = replace(sql, '''limits'', ''billing_run'')', '''limits'', ''billing_run'', ''storage_price'')')
 WHERE type = 'table' AND name = 'admin_actions';
PRAGMA writable_schema = RESET;

-- Storage charged per day, user and volume, for the billing team
-- (gpurentd report storage): dated by the pass that posted it.
CREATE VIEW report_storage AS
SELECT date(t.at, 'unixepoch') AS day,
       t.user_id AS user_id,
       u.email AS email,
       t.volume_id AS volume_id,
       v.name AS volume_name,
       v.region AS region,
       v.size_gb AS size_gb,
       -sum(CASE WHEN a.kind IN ('cash', 'grant') THEN p.amount ELSE 0 END) AS cost_micro,
       -sum(CASE WHEN a.kind = 'grant' THEN p.amount ELSE 0 END) AS paid_by_credit_micro,
       -sum(CASE WHEN a.kind = 'cash' THEN p.amount ELSE 0 END) AS paid_by_cash_micro,
       count(DISTINCT t.id) AS transactions
FROM ledger_transactions t
JOIN ledger_postings p ON p.transaction_id = t.id
JOIN ledger_accounts a ON a.id = p.account_id
JOIN users u ON u.id = t.user_id
JOIN volumes v ON v.id = t.volume_id
WHERE t.kind = 'storage'
GROUP BY day, t.user_id, t.volume_id;
