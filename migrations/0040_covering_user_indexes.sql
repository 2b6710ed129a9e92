-- 0040_covering_user_indexes: the funds check of every create and the burn
-- rate in its reply read a user's indexes alone, not a table row for each
-- instance or interval the user holds (issue 15).
--
-- The funds check sums the cards a user holds by model, leaving out
-- instances on a reservation; SQLite read each matching instance's row to
-- test reservation_id and state (SQLite tests a partial index's condition
-- on the row unless the index holds its column), a page read for each at 10 000 nodes,
-- where the writer's cache holds few of them. With both in the index the
-- query reads its leaf alone. state changes already rewrite this index's
-- entry (its WHERE names state), so keeping it in the key costs no write.
DROP INDEX instances_holding_by_user;
CREATE INDEX instances_holding_by_user ON instances (user_id, gpu_model, card_count, id, state, reservation_id)
    WHERE state IN ('pending', 'provisioning', 'running', 'stopping', 'unreachable');

-- A user's burn rate sums card_count by gpu_model over the open intervals;
-- neither changes while an interval is open. ended_at (always NULL here)
-- is in the key because SQLite reads a row to test a partial index's own
-- condition unless the index holds the column.
DROP INDEX running_intervals_open_by_user;
CREATE INDEX running_intervals_open_by_user ON running_intervals (user_id, gpu_model, card_count, ended_at)
    WHERE ended_at IS NULL;
