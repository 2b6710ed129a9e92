-- 0014_quiet_nodes: the nodes that have missed a heartbeat, found through a
-- partial index. Billing asks on every read of running intervals whether any
-- node is quiet (then an interval on it is charged only to its last good
-- heartbeat); nearly always none is, and the index answers that without
-- reading the nodes.
CREATE INDEX nodes_quiet ON nodes (id) WHERE missed_beats > 0;
