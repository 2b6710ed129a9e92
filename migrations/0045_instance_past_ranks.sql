-- 0045_instance_past_ranks: where each rank of an instance last ran, so its
-- output can still be read once it has ended. instance_nodes' rows go when
-- an instance stops; the agent keeps a removed workload's output for a while
-- (ended_log_keep_s), and GET /v1/instances/{id}/logs of an ended instance
-- asks the node named here. Replaced by each run's ranks when it ends.
CREATE TABLE instance_past_ranks (
    instance_id TEXT NOT NULL REFERENCES instances (id),  -- the instance
    rank        INTEGER NOT NULL CHECK (rank >= 0),  -- its rank in its last run
    node_id     TEXT NOT NULL REFERENCES nodes (id),  -- the node that rank ran on
    workload_id TEXT NOT NULL,  -- the id the node's agent knew it by
    PRIMARY KEY (instance_id, rank)
) STRICT, WITHOUT ROWID;
