-- 0032_live_instance_costs: what a create and the reconciler cost no longer
-- grows with how many instances are live in the whole cloud (issue 15).
--
-- The reconciler's passes between sweeps read only the instances that need
-- attention, so their cost follows what is changing. A running instance
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

-- A user's burn rate (every create's reply and GET /v1/balance) sums that
-- user's open intervals: found by user, not by scanning everyone's.
CREATE INDEX running_intervals_open_by_user ON running_intervals (user_id) WHERE ended_at IS NULL;
