-- 0049_low_balance_notices: a renter is mailed when a billing pass leaves
-- their funds lasting less than low_balance_minutes at what they burn, once
-- until money comes in again (a grant or a top-up clears the mark), so the
-- warning is neither lost nor repeated every pass.
ALTER TABLE users ADD COLUMN low_balance_noticed_at INTEGER;  -- when the last such mail was queued; NULL: none since money came in
