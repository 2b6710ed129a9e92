-- 0032_reconciler_attention: the reconciler's passes between sweeps read
-- only the instances that need attention (issue 15), so their cost follows
-- what is changing, not how many instances are live. A running instance
-- with nothing to decide is read only by the sweep, or when its node stops
-- answering or a heartbeat saw one of its workloads end.

-- What a pass must look at whatever the agents say: instances on their way
-- up or down, unreachable ones, and running ones with something to decide
-- each pass (a stop asked for, a replica's health check, a run time limit).
-- The expression is repeated word for word in store_instances.c's
-- SQL_INS_ATTENTION, which SQLite needs to use this partial index.
CREATE INDEX instances_attention ON instances (created_at, id)
 WHERE state IN ('pending', 'provisioning', 'stopping', 'unreachable')
    OR (state = 'stopped' AND desired = 'terminated')
    OR (state = 'running' AND (desired <> 'running' OR app_id IS NOT NULL OR max_runtime_minutes IS NOT NULL));

-- Nodes not answering, whose running instances a pass must move on.
CREATE INDEX nodes_not_answering ON nodes (id) WHERE health <> 'up' OR unreachable_since IS NOT NULL;
