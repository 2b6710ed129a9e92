-- 0018_jobs: jobs and services (issue 12). An instance says what happens
-- when its main process exits (restart_policy), may bound how long one run
-- lasts (max_runtime_minutes), and shows how often it was restarted and
-- the status its job last exited with. A job that ends well is succeeded.

-- The state list gains 'succeeded', widened in place as 0012 does it
-- (every row the old list accepted stays accepted).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '''terminated'', ''failed'',', '''terminated'', ''failed'', ''succeeded'',')
 WHERE type = 'table' AND name = 'instances';
PRAGMA writable_schema = RESET;

-- never: an exit ends the instance (succeeded on status 0, else failed);
-- on_failure: a non-zero exit restarts it, status 0 ends it succeeded;
-- always: every exit restarts it.
ALTER TABLE instances ADD COLUMN restart_policy TEXT NOT NULL DEFAULT 'never'
    CHECK (restart_policy IN ('never', 'on_failure', 'always'));
-- A run (from when every node was first seen running after a create or a
-- start, restarts included) is stopped after this many minutes; NULL: never.
ALTER TABLE instances ADD COLUMN max_runtime_minutes INTEGER
    CHECK (max_runtime_minutes IS NULL OR max_runtime_minutes BETWEEN 1 AND 43200);
-- Restarts by the restart policy since the last create or start.
ALTER TABLE instances ADD COLUMN restart_count INTEGER NOT NULL DEFAULT 0 CHECK (restart_count >= 0);
-- The backoff the last restart waited, seconds (0: none yet); the next one doubles it.
ALTER TABLE instances ADD COLUMN restart_backoff_s INTEGER NOT NULL DEFAULT 0 CHECK (restart_backoff_s >= 0);
-- The status the job last exited with; NULL before any exit or when unknown.
ALTER TABLE instances ADD COLUMN exit_code INTEGER;
-- Epoch second the current run began (max_runtime_minutes counts from it); NULL before it runs.
ALTER TABLE instances ADD COLUMN run_started_at INTEGER;
-- Epoch second the max_runtime_warning event was written for this run; NULL: not yet.
ALTER TABLE instances ADD COLUMN runtime_warned_at INTEGER;
-- The latest second at which a rank of a multi-node job exited with status
-- 0 while others still ran (the job succeeds when the last one does, and
-- is billed to the last exit); NULL when none has.
ALTER TABLE instances ADD COLUMN ranks_exited_at INTEGER;
