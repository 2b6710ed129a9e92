-- 0022_api_key_life: keys made by logging in expire (login_key_ttl_s), and
-- every key says when it was last used, so a user can see what to revoke.
ALTER TABLE api_keys ADD COLUMN expires_at INTEGER CHECK (expires_at IS NULL OR expires_at > created_at);  -- epoch seconds from which the key no longer works; NULL never
ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;  -- epoch seconds of its last use, written at most once a minute; NULL never used
