-- 0050_password_resets: a way back into an account whose password is
-- forgotten. POST /v1/password-reset mails a single-use code to the
-- account's address; POST /v1/password-reset/confirm takes it with a new
-- password. Only the code's hash is kept, one live code per account (a new
-- request replaces the row), dead after password_reset_max_tries wrong
-- tries or password_reset_ttl_s, and gone once used. account_events is the
-- account's own security record (resets asked for and done, password
-- changes), written in the transaction of what it records, read by
-- `gpurentd report account-events`.

CREATE TABLE password_resets (
    user_id        TEXT PRIMARY KEY REFERENCES users (id),  -- the account; one live code each
    code_hash      TEXT NOT NULL CHECK (length(code_hash) = 64),  -- SHA-256 of the code, hex
    created_at     INTEGER NOT NULL,  -- epoch seconds it was asked for
    expires_at     INTEGER NOT NULL CHECK (expires_at > created_at),  -- epoch seconds; refused from then on
    failures       INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),  -- wrong codes tried for this account since
    requested_from TEXT NOT NULL CHECK (length(requested_from) <= 63)  -- client address of the request
) STRICT;

CREATE TABLE account_events (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,  -- order: a later event has a larger id
    at             INTEGER NOT NULL,  -- epoch seconds on the daemon's clock
    user_id        TEXT NOT NULL REFERENCES users (id),  -- whose account
    event          TEXT NOT NULL CHECK (event IN ('password_reset_requested', 'password_reset', 'password_change')),  -- what happened
    client_address TEXT NOT NULL CHECK (length(client_address) <= 63),  -- the client it came from
    detail         TEXT NOT NULL CHECK (json_valid(detail) AND json_type(detail) = 'object')  -- what it did, as JSON: keys revoked and kept, the address verified by it
) STRICT;
CREATE INDEX account_events_by_user ON account_events (user_id, id);

-- Account events, by the UTC day they happened, for the operators
-- (gpurentd report account-events).
CREATE VIEW report_account_events AS
SELECT date(e.at, 'unixepoch') AS day,
       datetime(e.at, 'unixepoch') AS at,
       e.id AS event_id,
       e.event AS event,
       e.user_id AS user_id,
       u.email AS email,
       e.client_address AS client_address,
       e.detail AS detail
FROM account_events e JOIN users u ON u.id = e.user_id;
