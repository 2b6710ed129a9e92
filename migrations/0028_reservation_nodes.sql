-- 0028_reservation_nodes: each booked block is bound to nodes of the
-- reserved pool, so an hour cannot fragment: a block of up to 8 cards holds
-- that many cards of ONE node for every hour of its window, a block of more
-- holds whole nodes of one fabric. The calendar check is per node per hour
-- over these rows; placement of an instance inside the block uses only its
-- nodes and at most its cards on each. When a bound node is lost mid-window
-- the row moves to a spare node (re-homing). Blocks booked before this
-- migration have no rows; the reservations pass binds them while their
-- window lasts.
CREATE TABLE reservation_nodes (
    reservation_id TEXT NOT NULL REFERENCES reservations (id),  -- the block
    node_id        TEXT NOT NULL REFERENCES nodes (id),  -- a reserved node it holds cards of
    cards          INTEGER NOT NULL CHECK (cards BETWEEN 1 AND 8),  -- cards of that node it holds every hour of its window
    bound_at       INTEGER NOT NULL,  -- epoch seconds of the booking or the last re-homing
    PRIMARY KEY (reservation_id, node_id)
) STRICT;
CREATE INDEX reservation_nodes_by_node ON reservation_nodes (node_id, reservation_id);
