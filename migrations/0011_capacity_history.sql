-- 0011_capacity_history: what each node offered, and when, so that
-- report_utilisation measures each past day against the fleet of that day
-- instead of today's (docs/REPORTS.md).
--
-- A node offers capacity while it is accepted: not removed, and its health
-- 'up' or 'offline' (an offline node is still in the fleet, as the view has
-- always counted it), with as many cards as it has node_cards rows. The
-- daemon keeps this table current in the same transaction as every change
-- of those facts (store_capacity_sync in src/gpurentd/store_capacity.c),
-- on its own clock: a trigger could not read the testing clock.
--
-- History before this migration was not recorded. The backfill approximates
-- it with one open interval per node accepted now, from the node's
-- registration (created_at) with its cards of now; nodes removed or
-- rejected before this migration get none. Days before the migration can
-- therefore be off where the fleet changed; days after it are exact.
--
-- report_utilisation keeps every column of 0010 (names, order, meaning);
-- only how card_seconds_available is found changes, and card_hours_available
-- follows it (see below).

CREATE TABLE node_capacity (
    node_id   TEXT NOT NULL REFERENCES nodes (id),  -- the node
    gpu_model TEXT NOT NULL,  -- the node's model (nodes.gpu_model, copied so the view needs no join)
    cards     INTEGER NOT NULL CHECK (cards BETWEEN 1 AND 64),  -- card rows the node had throughout the interval
    from_at   INTEGER NOT NULL,  -- epoch seconds, inclusive: when the node began offering these cards
    to_at     INTEGER CHECK (to_at IS NULL OR to_at > from_at),  -- epoch seconds, exclusive: when it stopped; NULL while it still offers them
    PRIMARY KEY (node_id, from_at)
) STRICT;
-- At most one open interval per node: the one store_capacity_sync compares with.
CREATE UNIQUE INDEX node_capacity_open ON node_capacity (node_id) WHERE to_at IS NULL;
-- The view's lookup: a type's intervals in time order.
CREATE INDEX node_capacity_by_model ON node_capacity (gpu_model, from_at);

INSERT INTO node_capacity (node_id, gpu_model, cards, from_at, to_at)
SELECT n.id, n.gpu_model, count(*), n.created_at, NULL
FROM nodes n JOIN node_cards c ON c.node_id = n.id
WHERE n.removed_at IS NULL AND n.health IN ('up', 'offline')
GROUP BY n.id;

-- Utilisation per day and GPU type, as in 0010, except:
--
-- * card_seconds_available is the sum over the type's capacity intervals of
--   cards x the seconds the interval overlaps the UTC day [00:00, 24:00).
--   An interval still open counts to the end of the day asked about (the
--   view cannot read the daemon's clock), so the current day counts the
--   cards offered now as if they stay until midnight, as before.
-- * card_hours_available is card_seconds_available / 3600: an exact integer
--   when that divides evenly (nodes that came and went on whole hours),
--   otherwise a decimal string with four places rounded half up, computed
--   in integers like card_hours_sold.
-- * utilisation is NULL when nothing was available that day.
--
-- Rows are still the days and types with usage (report_usage): a day
-- without usage has no row, so sums of card_seconds_sold still add up to
-- report_usage's.

DROP VIEW report_utilisation;

CREATE VIEW report_utilisation AS
WITH
sold AS (
    SELECT day, gpu_type, sum(card_seconds) AS sold, CAST(strftime('%s', day) AS INTEGER) AS d0
    FROM report_usage GROUP BY day, gpu_type),
avail AS (
    SELECT s.day, s.gpu_type, s.sold,
           coalesce((SELECT sum(c.cards * (min(coalesce(c.to_at, s.d0 + 86400), s.d0 + 86400) - max(c.from_at, s.d0)))
                     FROM node_capacity c
                     WHERE c.gpu_model = s.gpu_type AND c.from_at < s.d0 + 86400
                       AND (c.to_at IS NULL OR c.to_at > s.d0)), 0) AS available
    FROM sold s)
SELECT day AS day,
       gpu_type AS gpu_type,
       sold AS card_seconds_sold,
       available AS card_seconds_available,
       CASE WHEN available > 0 THEN round(1.0 * sold / available, 4) END AS utilisation,
       printf('%d.%04d', (sold * 10000 + 1800) / 3600 / 10000, (sold * 10000 + 1800) / 3600 % 10000)
           AS card_hours_sold,
       CASE WHEN available % 3600 = 0 THEN available / 3600
            ELSE printf('%d.%04d', (available * 10000 + 1800) / 3600 / 10000,
                        (available * 10000 + 1800) / 3600 % 10000) END AS card_hours_available
FROM avail;
