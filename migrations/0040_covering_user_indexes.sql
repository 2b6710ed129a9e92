-- 0040_covering_user_indexes: the funds check of every create, the burn
-- rate in its reply and billing read a user's indexes alone, not a table
-- row for each instance or interval the user holds (issue 15). SQLite reads a row to
-- test a partial index's own condition unless the index holds the column,
-- so each index below holds the columns of its WHERE too.
--
-- The funds check sums the cards a user holds by model, leaving out
-- instances on a reservation; SQLite read each matching instance's row to
-- test reservation_id and state, a page read for each at 10 000 nodes,
-- where the writer's cache holds few of them. With both in the index the
-- query reads its leaf alone. state changes already rewrite this index's
-- entry (its WHERE names state), so keeping it in the key costs no write.
DROP INDEX instances_holding_by_user;
CREATE INDEX instances_holding_by_user ON instances (user_id, gpu_model, card_count, id, state, reservation_id)
    WHERE state IN ('pending', 'provisioning', 'running', 'stopping', 'unreachable');

-- A user's burn rate sums card_count by gpu_model over the open intervals,
-- and the funds check and billing read every unsettled interval of a user.
-- The burn rate found them through running_intervals_open_by_user, an
-- index of its own; all three then read each interval's row. An open
-- interval is always unsettled (gpurentd ledger verify checks it), so the
-- index of unsettled intervals by user, in the same (user_id, id) order as
-- before, now holds every column those reads take and they read no row;
-- the burn rate's index is dropped, one fewer for every interval opened,
-- closed or billed to write. Billing's UPDATE of an interval assigns
-- settled, which this index's WHERE names, so SQLite rewrote its entry
-- already, billed or not: billed in the key costs no write; ended_at
-- changes once, when the interval closes.
-- IF EXISTS: databases made with 0032 as first released (3cbba49) never had
-- it, since 0032 gained it after the fact; without it their upgrade failed here.
DROP INDEX IF EXISTS running_intervals_open_by_user;
DROP INDEX running_intervals_unsettled;
CREATE INDEX running_intervals_unsettled
    ON running_intervals (user_id, id, gpu_model, card_count, started_at, ended_at, billed, settled, instance_id)
    WHERE settled = 0;
