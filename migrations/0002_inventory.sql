-- 0002_inventory: the GPU catalog, the nodes that carry the cards, and the cards.

-- GPU models the cloud rents. Data, not code: admins add and change them.
CREATE TABLE gpu_types (
    code                 TEXT PRIMARY KEY CHECK (length(code) BETWEEN 1 AND 32),  -- catalog code, e.g. 'MI450'
    vendor               TEXT NOT NULL CHECK (vendor IN ('AMD', 'NVIDIA')),  -- who makes it
    memory_gb            INTEGER NOT NULL CHECK (memory_gb BETWEEN 1 AND 4096),  -- GPU memory per card, GB
    memory_type          TEXT NOT NULL CHECK (length(memory_type) BETWEEN 1 AND 32),  -- e.g. 'HBM3e', 'GDDR6X'
    stack                TEXT NOT NULL CHECK (stack IN ('ROCm', 'CUDA')),  -- software stack images must match
    reservation_required INTEGER NOT NULL DEFAULT 0 CHECK (reservation_required IN (0, 1)),  -- 1: rent only through a reservation
    features             TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(features) AND json_type(features) = 'array'),  -- e.g. ["FP8"]
    description          TEXT NOT NULL DEFAULT '' CHECK (length(description) <= 512),  -- shown by the console
    created_at           INTEGER NOT NULL,  -- epoch seconds
    updated_at           INTEGER NOT NULL   -- epoch seconds of the last admin change
) STRICT;

INSERT INTO gpu_types (code, vendor, memory_gb, memory_type, stack, reservation_required, features, description, created_at, updated_at) VALUES
    ('MI450',    'AMD',    192, 'HBM3e',  'ROCm', 0, '[]',            'AMD Instinct MI450', 0, 0),
    ('MI300X',   'AMD',     96, 'HBM3',   'ROCm', 0, '["FP8"]',       'AMD Instinct MI300X', 0, 0),
    ('MI250',    'AMD',    128, 'HBM2e',  'ROCm', 0, '[]',            'AMD Instinct MI250', 0, 0),
    ('H100-SXM', 'NVIDIA',  80, 'HBM3',   'CUDA', 1, '["FP8"]',       'NVIDIA H100 SXM (reservation required)', 0, 0),
    ('RTX4090',  'NVIDIA',  24, 'GDDR6X', 'CUDA', 0, '["inference"]', 'NVIDIA GeForce RTX 4090, for inference', 0, 0);

-- GPU hosts, each driven by one gpurent-agent. What an admin declares is
-- checked against what the agent reports before the node is put in service.
CREATE TABLE nodes (
    id             TEXT PRIMARY KEY CHECK (id LIKE 'node\_%' ESCAPE '\'),  -- node_ + 20 random chars
    name           TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 63),  -- admin's name, unique among nodes not removed
    agent_url      TEXT NOT NULL CHECK (agent_url LIKE 'http://%' OR agent_url LIKE 'https://%'),  -- base URL of the agent's API
    secret         TEXT NOT NULL CHECK (length(secret) = 64),  -- HMAC key signing every call to the agent (hex)
    gpu_model      TEXT NOT NULL REFERENCES gpu_types (code),  -- declared model; the agent must report only this
    card_count     INTEGER NOT NULL CHECK (card_count BETWEEN 1 AND 64),  -- declared number of cards
    fabric         TEXT NOT NULL CHECK (length(fabric) BETWEEN 1 AND 63),  -- RDMA fabric; multi-node instances stay in one
    region         TEXT NOT NULL CHECK (length(region) BETWEEN 1 AND 63),  -- where the node is
    labels         TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels) AND json_type(labels) = 'object'),  -- admin's key/value labels
    admin_state    TEXT NOT NULL DEFAULT 'active' CHECK (admin_state IN ('active', 'cordoned', 'draining', 'maintenance')),  -- what the admin wants
    health         TEXT NOT NULL DEFAULT 'unknown' CHECK (health IN ('unknown', 'up', 'offline', 'rejected')),  -- what the heartbeats see
    state_reason   TEXT NOT NULL DEFAULT '',  -- why the node is rejected, offline or set aside
    missed_beats   INTEGER NOT NULL DEFAULT 0 CHECK (missed_beats >= 0),  -- heartbeats failed in a row
    last_seen_at   INTEGER,  -- epoch seconds of the last good heartbeat (NULL: never)
    driver_version TEXT NOT NULL DEFAULT '',  -- from the agent's facts
    stack_version  TEXT NOT NULL DEFAULT '',  -- ROCm or CUDA version from the agent's facts
    facts          TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(facts)),  -- the last facts document the agent sent
    created_at     INTEGER NOT NULL,  -- epoch seconds
    updated_at     INTEGER NOT NULL,  -- epoch seconds of the last change of state
    removed_at     INTEGER  -- epoch seconds when an admin removed it; NULL while registered
) STRICT;
CREATE UNIQUE INDEX nodes_name_live ON nodes (name) WHERE removed_at IS NULL;
CREATE INDEX nodes_by_model ON nodes (gpu_model, fabric) WHERE removed_at IS NULL;

-- One row per card of a node whose facts were accepted. A card is in use
-- while instance_id is set; the row is the unit of allocation, so one card
-- can never hold two instances.
CREATE TABLE node_cards (
    node_id       TEXT NOT NULL REFERENCES nodes (id),  -- the node
    idx           INTEGER NOT NULL CHECK (idx BETWEEN 0 AND 63),  -- the card's index on the node (as the agent numbers them)
    model         TEXT NOT NULL,  -- model the agent reported for this card
    memory_gb     INTEGER NOT NULL CHECK (memory_gb >= 0),  -- memory the agent reported
    healthy       INTEGER NOT NULL CHECK (healthy IN (0, 1)),  -- 0: failed, out of the free pool
    health_reason TEXT NOT NULL DEFAULT '',  -- why the card failed
    instance_id   TEXT,  -- the instance holding the card; NULL when free
    PRIMARY KEY (node_id, idx)
) STRICT;
CREATE INDEX node_cards_by_instance ON node_cards (instance_id) WHERE instance_id IS NOT NULL;

-- A node's state as users of the API see it, derived so it cannot disagree
-- with its parts: pending (never reached), rejected, offline, or the admin state.
CREATE VIEW node_states AS
SELECT id AS node_id,
       CASE
           WHEN health = 'unknown' THEN 'pending'
           WHEN health = 'rejected' THEN 'rejected'
           WHEN health = 'offline' THEN 'offline'
           WHEN admin_state = 'active' THEN 'ready'
           ELSE admin_state
       END AS state
FROM nodes WHERE removed_at IS NULL;
