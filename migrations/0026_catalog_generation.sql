-- 0026_catalog_generation.sql: a generation number for GET /v1/gpu-types.
-- The catalog reply (types, live card counts, prices) is rendered once and
-- served from memory until something it shows changes. These triggers bump
-- the number inside the very transaction that changes a card, a node, a type
-- or a price, so the daemon (which watches this row through SQLite's update
-- hook and learns of the commit through the WAL hook) can never serve a
-- reply older than a committed change; other processes' changes show in the
-- row itself, which the daemon re-reads at least once a second.
CREATE TABLE catalog_generation (
    id  INTEGER PRIMARY KEY CHECK (id = 1),  -- the one row
    gen INTEGER NOT NULL                     -- bumped by every change the catalog shows
) STRICT;
INSERT INTO catalog_generation (id, gen) VALUES (1, 1);

CREATE TRIGGER catalog_gen_card_insert AFTER INSERT ON node_cards
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER catalog_gen_card_delete AFTER DELETE ON node_cards
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER catalog_gen_card_update AFTER UPDATE OF healthy, instance_id, node_id ON node_cards
WHEN old.healthy IS NOT new.healthy OR old.instance_id IS NOT new.instance_id OR old.node_id IS NOT new.node_id
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;

CREATE TRIGGER catalog_gen_node_insert AFTER INSERT ON nodes
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER catalog_gen_node_delete AFTER DELETE ON nodes
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
-- Only the columns the counts read: heartbeats that change last_seen_at or
-- facts leave the cached reply alone.
CREATE TRIGGER catalog_gen_node_update
AFTER UPDATE OF health, unreachable_since, admin_state, removed_at, gpu_model, pool ON nodes
WHEN old.health IS NOT new.health OR old.unreachable_since IS NOT new.unreachable_since
     OR old.admin_state IS NOT new.admin_state OR old.removed_at IS NOT new.removed_at
     OR old.gpu_model IS NOT new.gpu_model OR old.pool IS NOT new.pool
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;

CREATE TRIGGER catalog_gen_type_insert AFTER INSERT ON gpu_types
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER catalog_gen_type_update AFTER UPDATE ON gpu_types
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER catalog_gen_type_delete AFTER DELETE ON gpu_types
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;

CREATE TRIGGER catalog_gen_price_insert AFTER INSERT ON prices
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER catalog_gen_price_update AFTER UPDATE ON prices
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER catalog_gen_price_delete AFTER DELETE ON prices
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;

-- The reserved pool's price (0024) is in the catalog too.
CREATE TRIGGER catalog_gen_reservation_price_insert AFTER INSERT ON reservation_prices
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER catalog_gen_reservation_price_update AFTER UPDATE ON reservation_prices
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
CREATE TRIGGER catalog_gen_reservation_price_delete AFTER DELETE ON reservation_prices
BEGIN UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1; END;
