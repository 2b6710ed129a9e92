-- The last usage report of each gateway that gpurentd committed, named by
-- the gateway's run (a random name it takes at each start) and that run's
-- report number. Written in the report's own transaction and read with the
-- funds in the gateway's state, so a gateway that never got the answer (the
-- connection failed, gpurentd died) still learns which of its records the
-- funds in its copy already show, and stops counting them against their
-- consumers a second time.
CREATE TABLE gateway_reports (
    gateway_id TEXT PRIMARY KEY,
    run        TEXT NOT NULL CHECK (length(run) BETWEEN 1 AND 64),
    seq        INTEGER NOT NULL CHECK (seq >= 1),  -- the highest of this run's reports committed
    at         INTEGER NOT NULL  -- when the last one was, on the daemon's clock
) STRICT;
