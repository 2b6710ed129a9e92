-- 0001_accounts: users and their API keys.
-- Released migrations are never edited; add a new numbered file instead.

-- One row per account. Money, instances and everything else hang off users.id.
CREATE TABLE users (
    id            TEXT PRIMARY KEY CHECK (id LIKE 'usr\_%' ESCAPE '\'),  -- usr_ + 20 random base32 chars
    email         TEXT NOT NULL UNIQUE CHECK (email = lower(email) AND length(email) BETWEEN 3 AND 254),  -- login name, stored lowercase
    password_hash TEXT NOT NULL DEFAULT '',  -- "pbkdf2-sha256$ITER$SALT$HASH", '' for accounts that log in by key only
    role          TEXT NOT NULL DEFAULT 'user' CHECK (role IN ('user', 'admin')),  -- admin may call /v1/admin routes
    status        TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),  -- disabled accounts cannot authenticate
    invite_code   TEXT NOT NULL DEFAULT '',  -- invite code given at sign-up ('' if none), honoured by billing
    created_at    INTEGER NOT NULL CHECK (created_at >= 0)  -- epoch seconds
) STRICT;

-- API keys: the secret is shown once at creation; only its SHA-256 is kept.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY CHECK (id LIKE 'key\_%' ESCAPE '\'),  -- key_ + 20 random chars; also embedded in the token
    user_id     TEXT NOT NULL REFERENCES users (id),  -- owner
    name        TEXT NOT NULL CHECK (length(name) <= 128),  -- the owner's label, e.g. "laptop" or "login"
    secret_hash BLOB NOT NULL CHECK (length(secret_hash) = 32),  -- SHA-256 of the token's secret part
    created_at  INTEGER NOT NULL CHECK (created_at >= 0),  -- epoch seconds
    revoked_at  INTEGER CHECK (revoked_at IS NULL OR revoked_at >= created_at)  -- NULL while the key works
) STRICT;
CREATE INDEX api_keys_by_user ON api_keys (user_id, created_at, id);
