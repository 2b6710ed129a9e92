-- 0027_app_health: replicas are health-checked through the agent (issue
-- 17). An app names the path its replicas answer health checks on; each
-- rank of an instance with a health check keeps what its agent last
-- reported, and the gateways are sent only the replicas reported healthy.

ALTER TABLE apps ADD COLUMN health_path TEXT NOT NULL DEFAULT '/health'
    CHECK (length(health_path) BETWEEN 1 AND 255 AND substr(health_path, 1, 1) = '/');  -- GET by the agent on the app's port
ALTER TABLE instance_nodes ADD COLUMN health TEXT
    CHECK (health IN ('starting', 'healthy', 'unhealthy'));  -- the agent's last verdict; NULL: no check or none reported
ALTER TABLE instance_nodes ADD COLUMN health_at INTEGER NOT NULL DEFAULT 0;  -- epoch seconds it was stored

-- Replicas already running were placed without a health check, so their
-- agents will never report one: they keep the traffic they had (the
-- gateway had probed them) rather than vanish from the gateways' copy.
-- Replicas placed from now on carry the check and start unreported.
UPDATE instance_nodes SET health = 'healthy', health_at = CAST(strftime('%s', 'now') AS INTEGER)
 WHERE rank = 0 AND instance_id IN (SELECT id FROM instances WHERE app_id IS NOT NULL AND state = 'running');
