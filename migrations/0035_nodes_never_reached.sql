-- 0035_nodes_never_reached: registering a node costs a look at the nodes
-- not yet reached, not at the whole fleet (issue 15).
--
-- A registration wakes the heartbeat to reach the new node at once. That
-- pass read every registered node and kept those never reached; at 10 000
-- nodes a read of some 16 ms, a few times a second while a fleet registers.
-- Through this index it reads only the nodes whose health is still
-- 'unknown'; the entry goes with the first beat that judges the node.
CREATE INDEX nodes_never_reached ON nodes (id) WHERE health = 'unknown' AND removed_at IS NULL;
