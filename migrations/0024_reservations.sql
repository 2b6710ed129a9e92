-- 0024_reservations: capacity blocks. Nodes belong to a pool, on-demand or
-- reserved; a reservation books cards of a GPU type in the reserved pool for
-- whole hours, is paid when booked ('reservation' ledger transactions,
-- 'reservation_refund' when cancelled), and instances launched inside it
-- name it. Hours lost to failed reserved hardware are credited back
-- (reservation_credits, each a grant). Views for the billing team.

ALTER TABLE nodes ADD COLUMN pool TEXT NOT NULL DEFAULT 'on_demand' CHECK (pool IN ('on_demand', 'reserved'));  -- which placement may use the node: on-demand instances or reservations

-- One booked block: card_count cards of gpu_model for [starts_at, ends_at),
-- whole hours. Whether it is upcoming, active or ended is derived from the
-- clock; state says only whether it still holds its hours.
CREATE TABLE reservations (
    id           TEXT PRIMARY KEY CHECK (id LIKE 'rsv\_%' ESCAPE '\'),  -- rsv_ + 20 random chars
    user_id      TEXT NOT NULL REFERENCES users (id),  -- the holder, who paid
    gpu_model    TEXT NOT NULL REFERENCES gpu_types (code),  -- which cards
    card_count   INTEGER NOT NULL CHECK (card_count BETWEEN 1 AND 256),  -- cards held every hour of the window
    fabric       TEXT,  -- more than 8 cards: the RDMA fabric whose whole nodes it holds; NULL otherwise
    starts_at    INTEGER NOT NULL CHECK (starts_at % 3600 = 0),  -- epoch seconds, a whole hour
    ends_at      INTEGER NOT NULL CHECK (ends_at % 3600 = 0 AND ends_at > starts_at),  -- epoch seconds, a whole hour, exclusive
    state        TEXT NOT NULL DEFAULT 'booked' CHECK (state IN ('booked', 'cancelled')),  -- cancelled: its hours are free again
    card_hour    INTEGER NOT NULL CHECK (card_hour >= 0),  -- micro-yuan per card-hour it was sold at
    amount       INTEGER NOT NULL CHECK (amount = card_hour * card_count * ((ends_at - starts_at) / 3600)),  -- micro-yuan paid at booking
    refunded     INTEGER NOT NULL DEFAULT 0 CHECK (refunded BETWEEN 0 AND amount),  -- micro-yuan given back on cancelling
    credited     INTEGER NOT NULL DEFAULT 0 CHECK (credited >= 0),  -- micro-yuan granted back for hours lost to failed hardware
    cancelled_at INTEGER,  -- epoch seconds of the cancellation
    warned_at    INTEGER,  -- epoch seconds the end-of-block warning went to its instances
    closed_at    INTEGER,  -- epoch seconds its end was processed (its instances stopped)
    created_at   INTEGER NOT NULL  -- epoch seconds of the booking
) STRICT;
CREATE INDEX reservations_by_user ON reservations (user_id, created_at, id);
CREATE INDEX reservations_calendar ON reservations (gpu_model, starts_at, ends_at) WHERE state = 'booked';
CREATE INDEX reservations_open ON reservations (ends_at) WHERE state = 'booked' AND closed_at IS NULL;

-- Optional reservation price per GPU type; without one a block costs the
-- type's card-hour price at booking time.
CREATE TABLE reservation_prices (
    gpu_model  TEXT PRIMARY KEY REFERENCES gpu_types (code),  -- which cards
    card_hour  INTEGER NOT NULL CHECK (card_hour >= 0),  -- micro-yuan per reserved card-hour
    updated_at INTEGER NOT NULL  -- epoch seconds of the last change
) STRICT;

-- Card-hours of a reservation lost to failed reserved hardware, one row per
-- hour: the most cards found missing in that hour, and what was granted
-- for them (so a later pass in the same hour only adds the difference).
CREATE TABLE reservation_credits (
    reservation_id TEXT NOT NULL REFERENCES reservations (id),  -- the block
    hour           INTEGER NOT NULL CHECK (hour % 3600 = 0),  -- epoch seconds of the hour
    cards          INTEGER NOT NULL CHECK (cards > 0),  -- cards the pool could not give it that hour
    node_id        TEXT NOT NULL REFERENCES nodes (id),  -- the failed node named in the grant's reason
    amount         INTEGER NOT NULL CHECK (amount >= 0),  -- micro-yuan granted for this hour
    grant_id       TEXT,  -- the last grant for it (NULL when the amount was 0)
    created_at     INTEGER NOT NULL,  -- epoch seconds
    PRIMARY KEY (reservation_id, hour)
) STRICT;

-- An instance launched inside a block names it: placed on the reserved
-- pool within its cards, not billed per second.
ALTER TABLE instances ADD COLUMN reservation_id TEXT REFERENCES reservations (id);  -- NULL: on-demand
CREATE INDEX instances_by_reservation ON instances (reservation_id) WHERE reservation_id IS NOT NULL;

-- Reservation payments and their refunds name the block.
ALTER TABLE ledger_transactions ADD COLUMN reservation_id TEXT REFERENCES reservations (id);  -- reservation, reservation_refund: which block
CREATE INDEX ledger_transactions_by_reservation ON ledger_transactions (reservation_id) WHERE reservation_id IS NOT NULL;

-- The kind list gains two values, widened in place as 0012 and 0020 do it.
-- Anchored on 'topup' with its quotes, which appears only in that CHECK
-- list (as 0021 anchors on 'billing_run'), so the widening holds whatever
-- other values another migration added around it.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '''topup''', '''topup'', ''reservation'', ''reservation_refund''')
 WHERE type = 'table' AND name = 'ledger_transactions';
PRAGMA writable_schema = RESET;

-- Reservation revenue per day of booking and GPU type: what was paid, given
-- back on cancelling and credited for lost hours (gpurentd report
-- reservation_revenue).
CREATE VIEW report_reservation_revenue AS
SELECT date(r.created_at, 'unixepoch') AS day,
       r.gpu_model AS gpu_model,
       count(*) AS reservations,
       sum(r.card_count * ((r.ends_at - r.starts_at) / 3600)) AS card_hours_booked,
       sum(r.amount) AS paid_micro,
       sum(r.refunded) AS refunded_micro,
       sum(r.credited) AS credited_micro,
       sum(r.amount) - sum(r.refunded) AS revenue_micro
FROM reservations r
GROUP BY day, r.gpu_model;

-- Each block against the reserved capacity it took: card-hours booked,
-- card-hours the pool could not give it (failed hardware), and how many
-- instances were launched in it (gpurentd report reservation_utilisation).
CREATE VIEW report_reservation_utilisation AS
SELECT date(r.starts_at, 'unixepoch') AS day,
       r.id AS reservation_id,
       r.user_id AS user_id,
       r.gpu_model AS gpu_model,
       r.card_count AS cards,
       datetime(r.starts_at, 'unixepoch') AS starts_at,
       datetime(r.ends_at, 'unixepoch') AS ends_at,
       r.state AS state,
       r.card_count * ((r.ends_at - r.starts_at) / 3600) AS card_hours_booked,
       coalesce((SELECT count(*) FROM instances i WHERE i.reservation_id = r.id), 0) AS instances,
       coalesce((SELECT sum(c.cards) FROM reservation_credits c WHERE c.reservation_id = r.id), 0) AS card_hours_lost
FROM reservations r;

-- Money given back: cancellation refunds and credits for lost hours, one
-- row each (gpurentd report reservation_refunds).
CREATE VIEW report_reservation_refunds AS
SELECT date(r.cancelled_at, 'unixepoch') AS day,
       'cancellation' AS kind,
       r.id AS reservation_id,
       r.user_id AS user_id,
       r.gpu_model AS gpu_model,
       NULL AS node_id,
       r.refunded AS amount_micro
FROM reservations r WHERE r.state = 'cancelled'
UNION ALL
SELECT date(c.hour, 'unixepoch') AS day,
       'sla_credit' AS kind,
       c.reservation_id AS reservation_id,
       r.user_id AS user_id,
       r.gpu_model AS gpu_model,
       c.node_id AS node_id,
       c.amount AS amount_micro
FROM reservation_credits c JOIN reservations r ON r.id = c.reservation_id;
