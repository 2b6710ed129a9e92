-- 0006_free_cards: each node's count of healthy, unallocated cards, kept by
-- triggers on node_cards, so that placement finds a best-fit node through an
-- index instead of reading every card of the fleet inside its transaction.

ALTER TABLE nodes ADD COLUMN free_cards INTEGER NOT NULL DEFAULT 0 CHECK (free_cards >= 0);  -- healthy cards with no instance; kept by the triggers below, never written by code

UPDATE nodes SET free_cards = (SELECT count(*) FROM node_cards c
                               WHERE c.node_id = nodes.id AND c.healthy = 1 AND c.instance_id IS NULL);

CREATE TRIGGER node_cards_free_after_insert AFTER INSERT ON node_cards BEGIN
    UPDATE nodes SET free_cards = (SELECT count(*) FROM node_cards c
                                   WHERE c.node_id = NEW.node_id AND c.healthy = 1 AND c.instance_id IS NULL)
    WHERE id = NEW.node_id;
END;

CREATE TRIGGER node_cards_free_after_update AFTER UPDATE OF healthy, instance_id ON node_cards BEGIN
    UPDATE nodes SET free_cards = (SELECT count(*) FROM node_cards c
                                   WHERE c.node_id = NEW.node_id AND c.healthy = 1 AND c.instance_id IS NULL)
    WHERE id = NEW.node_id;
END;

CREATE TRIGGER node_cards_free_after_delete AFTER DELETE ON node_cards BEGIN
    UPDATE nodes SET free_cards = (SELECT count(*) FROM node_cards c
                                   WHERE c.node_id = OLD.node_id AND c.healthy = 1 AND c.instance_id IS NULL)
    WHERE id = OLD.node_id;
END;

-- Only nodes that can take work, by type and free cards, then fabric and
-- name: best fit is the first row with enough free cards.
CREATE INDEX nodes_placement ON nodes (gpu_model, free_cards, fabric, name)
    WHERE removed_at IS NULL AND health = 'up' AND admin_state = 'active';
