-- 0003_instances: images, volumes, instances with their placement, events
-- and running intervals, idempotency keys and per-user card quotas.

-- Container images users may run. An image declares its software stack and
-- only runs on GPU types of that stack.
CREATE TABLE images (
    id          TEXT PRIMARY KEY CHECK (id LIKE 'img\_%' ESCAPE '\'),  -- img_…: refs hold '/' and ':', so URLs name images by id
    ref         TEXT NOT NULL UNIQUE CHECK (length(ref) BETWEEN 1 AND 255),  -- what the runtime pulls, e.g. 'rocm/pytorch:2.3-rocm6.2'
    stack       TEXT NOT NULL CHECK (stack IN ('ROCm', 'CUDA')),  -- must equal the GPU type's stack
    description TEXT NOT NULL DEFAULT '' CHECK (length(description) <= 512),  -- shown by the console
    created_at  INTEGER NOT NULL  -- epoch seconds
) STRICT;

INSERT INTO images (id, ref, stack, description, created_at) VALUES
    ('img_rocm62_pytorch23', 'rocm/pytorch:2.3-rocm6.2', 'ROCm', 'PyTorch 2.3 on ROCm 6.2, with bitsandbytes, peft and transformers', 0),
    ('img_rocm57_pytorch23', 'rocm/pytorch:rocm5.7_ubuntu22.04_py3.10_pytorch_2.3', 'ROCm', 'AMD ROCm 5.7 + PyTorch 2.3', 0),
    ('img_cuda121_pytorch23', 'pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime', 'CUDA', 'PyTorch 2.3 on CUDA 12.1 for NVIDIA cards', 0);

-- Persistent user storage on the operator's shared storage, mounted at
-- /shared on every node of an instance. Outlives every instance.
CREATE TABLE volumes (
    id         TEXT PRIMARY KEY CHECK (id LIKE 'vol\_%' ESCAPE '\'),  -- vol_ + 20 random chars
    user_id    TEXT NOT NULL REFERENCES users (id),  -- owner
    name       TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 63),  -- unique per owner among live volumes; 'shared' is the default one
    size_gb    INTEGER NOT NULL CHECK (size_gb BETWEEN 1 AND 1048576),  -- quota
    source     TEXT NOT NULL CHECK (length(source) BETWEEN 1 AND 512),  -- what the agents mount, rendered from volume_source_template
    created_at INTEGER NOT NULL,  -- epoch seconds
    deleted_at INTEGER  -- epoch seconds; NULL while it exists
) STRICT;
CREATE UNIQUE INDEX volumes_name_live ON volumes (user_id, name) WHERE deleted_at IS NULL;

-- What a user rents. 'desired' is what the user asked for; 'state' is
-- where the reconciler has got to.
CREATE TABLE instances (
    id              TEXT PRIMARY KEY CHECK (id LIKE 'ins\_%' ESCAPE '\'),  -- ins_ + 20 random chars
    user_id         TEXT NOT NULL REFERENCES users (id),  -- owner
    name            TEXT NOT NULL CHECK (length(name) <= 63),  -- the owner's label
    gpu_model       TEXT NOT NULL REFERENCES gpu_types (code),  -- what kind of cards
    card_count      INTEGER NOT NULL CHECK (card_count BETWEEN 1 AND 256),  -- how many
    image           TEXT NOT NULL,  -- image ref run on every node
    volume_id       TEXT NOT NULL REFERENCES volumes (id),  -- mounted at /shared
    desired         TEXT NOT NULL CHECK (desired IN ('running', 'stopped', 'terminated')),  -- the user's intent
    state           TEXT NOT NULL CHECK (state IN ('pending', 'provisioning', 'running', 'stopping', 'stopped',
                                                   'terminated', 'failed', 'lost')),  -- observed life-cycle state
    phase           TEXT NOT NULL DEFAULT '',  -- while provisioning: pulling, mounting or starting (slowest node)
    state_reason    TEXT NOT NULL DEFAULT '',  -- why the last change happened (failures, funds, lost node)
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),  -- provisioning attempts that failed since the last start
    next_attempt_at INTEGER NOT NULL DEFAULT 0,  -- epoch seconds before which a failed attempt is not retried
    state_since     INTEGER NOT NULL,  -- epoch seconds of the last state change
    created_at      INTEGER NOT NULL,  -- epoch seconds
    updated_at      INTEGER NOT NULL   -- epoch seconds
) STRICT;
CREATE INDEX instances_by_user ON instances (user_id, created_at, id);
CREATE INDEX instances_active ON instances (state) WHERE state NOT IN ('stopped', 'terminated', 'failed');

-- Where an instance runs now: one row per node, in rank order. Rows go
-- when the instance stops; cards are held in node_cards.instance_id.
CREATE TABLE instance_nodes (
    instance_id TEXT NOT NULL REFERENCES instances (id),  -- the instance
    rank        INTEGER NOT NULL CHECK (rank >= 0),  -- 0 is the master of a multi-node job
    node_id     TEXT NOT NULL REFERENCES nodes (id),  -- the node
    workload_id TEXT NOT NULL UNIQUE,  -- the id used with the node's agent (wl_ + random)
    cards       TEXT NOT NULL CHECK (json_valid(cards)),  -- JSON array of card indexes on the node
    phase       TEXT NOT NULL DEFAULT '',  -- last phase the agent reported (pulling … running, exited, failed)
    message     TEXT NOT NULL DEFAULT '',  -- the agent's message with that phase
    put_done    INTEGER NOT NULL DEFAULT 0 CHECK (put_done IN (0, 1)),  -- the agent has accepted the workload
    PRIMARY KEY (instance_id, rank)
) STRICT;
CREATE INDEX instance_nodes_by_node ON instance_nodes (node_id);

-- Every state change, for the user to read.
CREATE TABLE instance_events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,  -- order of events
    instance_id TEXT NOT NULL REFERENCES instances (id),  -- whose
    at          INTEGER NOT NULL,  -- epoch seconds
    state       TEXT NOT NULL,  -- state entered (or the phase, for provisioning progress)
    reason      TEXT NOT NULL DEFAULT ''  -- why
) STRICT;
CREATE INDEX instance_events_by_instance ON instance_events (instance_id, seq);

-- The exact intervals during which every node of an instance ran. Billing
-- charges these and nothing else.
CREATE TABLE running_intervals (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- order
    instance_id TEXT NOT NULL REFERENCES instances (id),  -- which instance
    user_id     TEXT NOT NULL REFERENCES users (id),  -- who pays
    gpu_model   TEXT NOT NULL REFERENCES gpu_types (code),  -- at which card price
    card_count  INTEGER NOT NULL CHECK (card_count >= 1),  -- how many cards
    started_at  INTEGER NOT NULL,  -- epoch seconds when the last node reported running
    ended_at    INTEGER CHECK (ended_at IS NULL OR ended_at >= started_at),  -- NULL while running
    end_reason  TEXT NOT NULL DEFAULT ''  -- stop, terminate, lost, failed …
) STRICT;
CREATE UNIQUE INDEX running_intervals_open ON running_intervals (instance_id) WHERE ended_at IS NULL;

-- Idempotency-Key replay: the first answer to a key is kept and replayed.
CREATE TABLE idempotency_keys (
    user_id      TEXT NOT NULL REFERENCES users (id),  -- keys are scoped to their user
    key          TEXT NOT NULL CHECK (length(key) BETWEEN 1 AND 255),  -- the header's value
    request_hash TEXT NOT NULL CHECK (length(request_hash) = 64),  -- SHA-256 of method, path and body
    status       INTEGER NOT NULL,  -- HTTP status of the first answer
    response     TEXT NOT NULL,  -- body of the first answer
    created_at   INTEGER NOT NULL,  -- epoch seconds
    PRIMARY KEY (user_id, key)
) STRICT;

-- Per-user limits set by admins; a user without a row gets the configured default.
CREATE TABLE user_limits (
    user_id   TEXT PRIMARY KEY REFERENCES users (id),  -- whose
    max_cards INTEGER NOT NULL CHECK (max_cards BETWEEN 0 AND 100000)  -- cards held at once
) STRICT;
