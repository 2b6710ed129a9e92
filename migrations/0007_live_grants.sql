-- 0007_live_grants: an index over the grants that still hold money, covering
-- what the funds checks read (owner, expiry, remaining), so that a billing
-- pass looks up each user's spendable credit without reading spent or voided
-- grants or visiting the table.
CREATE INDEX credit_grants_live ON credit_grants (user_id, expires_at, remaining)
    WHERE remaining > 0 AND voided_at IS NULL;
