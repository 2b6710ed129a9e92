-- 0023_volume_limits: per-user bounds on volumes, set by admins like card
-- quotas; users without a row get default_max_volumes and
-- default_max_volume_gb. A trial account cannot create a million-GB volume.
CREATE TABLE user_volume_limits (
    user_id       TEXT PRIMARY KEY REFERENCES users (id),  -- whose
    max_volumes   INTEGER CHECK (max_volumes IS NULL OR max_volumes BETWEEN 0 AND 100000),  -- live volumes at once; NULL: the default
    max_volume_gb INTEGER CHECK (max_volume_gb IS NULL OR max_volume_gb BETWEEN 0 AND 1000000000)  -- GB of all live volumes together; NULL: the default
) STRICT;
