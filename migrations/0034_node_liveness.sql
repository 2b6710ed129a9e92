-- 0034_node_liveness: a heartbeat that repeats the last one writes a few
-- bytes, not the node's whole row (issue 15).
--
-- Every good beat moves a node's last_seen_at. In the nodes row, next to
-- its facts document, labels, secret and SSH host key (about 1 KB), that
-- rewrote some 3 300 pages a pass at 10 000 nodes, every 5 s, through the
-- WAL and again at its checkpoint. What each beat moves now lives in a
-- narrow table of its own; the nodes row changes only when what a beat
-- says changes (facts, health, unreachable or back).
CREATE TABLE node_liveness (
    node_id        TEXT PRIMARY KEY REFERENCES nodes (id),  -- one row per node, made with it
    missed_beats   INTEGER NOT NULL DEFAULT 0 CHECK (missed_beats >= 0),  -- heartbeats failed in a row
    last_seen_at   INTEGER,  -- epoch seconds of the last good heartbeat (NULL: never)
    workload_exits INTEGER NOT NULL DEFAULT -1  -- the agent's count of ended workloads in its last facts; -1 before any
) STRICT, WITHOUT ROWID;

INSERT INTO node_liveness (node_id, missed_beats, last_seen_at, workload_exits)
    SELECT id, missed_beats, last_seen_at, workload_exits FROM nodes;

-- The nodes that have missed a heartbeat (0014), now found here: billing
-- asks on every read of running intervals whether any node is quiet.
DROP INDEX nodes_quiet;
CREATE INDEX node_liveness_quiet ON node_liveness (node_id) WHERE missed_beats > 0;

ALTER TABLE nodes DROP COLUMN missed_beats;
ALTER TABLE nodes DROP COLUMN last_seen_at;
ALTER TABLE nodes DROP COLUMN workload_exits;
