-- 0048_failed_instances_keep_volumes: a failed instance can be started
-- again, as a stopped, lost or succeeded one can, so it still needs its
-- volume: until now the volume could be deleted under it (the index of live
-- instances by volume left failed ones out) and the start then answered 409.
-- A volume is now in use by every instance using it that is not terminated;
-- store_volumes.c repeats this WHERE word for word so that SQLite uses it.
DROP INDEX instances_live_by_volume;
CREATE INDEX instances_live_by_volume ON instances (volume_id, state)
    WHERE state <> 'terminated';
