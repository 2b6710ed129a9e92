-- 0025_apps: the app marketplace (issue 17). A user publishes an app (an
-- image serving HTTP on a port); its replicas are instances owned by the
-- publisher and marked with the app; gateways report each call as a usage
-- record (its id from the gateway, so a resent batch charges once) and
-- their demand; every call is one 'app_call' ledger transaction: the
-- consumer's funds to the publisher's cash and the platform fee to revenue.

CREATE TABLE apps (
    id                 TEXT PRIMARY KEY CHECK (id LIKE 'app\_%' ESCAPE '\'),  -- app_ + 20 random chars
    slug               TEXT NOT NULL UNIQUE CHECK (length(slug) BETWEEN 3 AND 40),  -- its name in URLs: /apps/{slug}/…
    name               TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 80),  -- label in the marketplace
    description        TEXT NOT NULL DEFAULT '' CHECK (length(description) <= 2000),  -- for the marketplace
    publisher_id       TEXT NOT NULL REFERENCES users (id),  -- who publishes it, pays its replicas and earns
    image              TEXT NOT NULL,  -- image id or ref each replica runs
    command            TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(command) AND json_type(command) = 'array'),  -- replica command; [] the image's
    env                TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(env) AND json_type(env) = 'array'),  -- [{"name","value","secret"}]
    port               INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),  -- the HTTP port a replica serves on
    gpu_type           TEXT NOT NULL REFERENCES gpu_types (code),  -- cards of a replica
    cards_per_replica  INTEGER NOT NULL CHECK (cards_per_replica BETWEEN 1 AND 64),
    min_replicas       INTEGER NOT NULL CHECK (min_replicas BETWEEN 0 AND 64),  -- 0: scales to zero
    max_replicas       INTEGER NOT NULL CHECK (max_replicas BETWEEN 1 AND 64 AND max_replicas >= min_replicas),
    concurrency_target INTEGER NOT NULL CHECK (concurrency_target BETWEEN 1 AND 10000),  -- requests in flight per replica
    idle_seconds       INTEGER NOT NULL CHECK (idle_seconds BETWEEN 10 AND 86400),  -- without a call before scaling to min (to zero)
    visibility         TEXT NOT NULL CHECK (visibility IN ('public', 'private')),  -- private: the publisher and app_access only
    price_request      INTEGER NOT NULL DEFAULT 0 CHECK (price_request >= 0),  -- micro-yuan per call
    price_input_1k     INTEGER NOT NULL DEFAULT 0 CHECK (price_input_1k >= 0),  -- micro-yuan per 1000 input tokens
    price_output_1k    INTEGER NOT NULL DEFAULT 0 CHECK (price_output_1k >= 0),  -- micro-yuan per 1000 output tokens
    price_second       INTEGER NOT NULL DEFAULT 0 CHECK (price_second >= 0),  -- micro-yuan per second of a call
    rate_per_key       INTEGER NOT NULL DEFAULT 0 CHECK (rate_per_key BETWEEN 0 AND 100000),  -- calls a minute per consumer key; 0 none
    rate_per_app       INTEGER NOT NULL DEFAULT 0 CHECK (rate_per_app BETWEEN 0 AND 1000000),  -- calls a minute for the app; 0 none
    desired_replicas   INTEGER NOT NULL DEFAULT 0 CHECK (desired_replicas >= 0),  -- the scaler's last decision
    last_call_at       INTEGER NOT NULL DEFAULT 0,  -- epoch seconds of the latest demand a gateway reported
    below_since        INTEGER NOT NULL DEFAULT 0,  -- epoch seconds since demand fits fewer replicas (stabilisation)
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    deleted_at         INTEGER  -- epoch seconds; a deleted app keeps its rows for the ledger
) STRICT;
CREATE INDEX apps_by_publisher ON apps (publisher_id, created_at, id);

-- Who else may call a private app.
CREATE TABLE app_access (
    app_id  TEXT NOT NULL REFERENCES apps (id),
    user_id TEXT NOT NULL REFERENCES users (id),
    PRIMARY KEY (app_id, user_id)
) STRICT;

-- A replica is an instance with app_id set, owned by the publisher.
ALTER TABLE instances ADD COLUMN app_id TEXT REFERENCES apps (id);  -- the app it is a replica of, or NULL
CREATE INDEX instances_by_app ON instances (app_id) WHERE app_id IS NOT NULL;

-- One call through a gateway, as it reported it. The id is the gateway's:
-- a record seen again (a resent batch) is not charged again.
CREATE TABLE app_calls (
    id             TEXT PRIMARY KEY CHECK (length(id) BETWEEN 8 AND 64),  -- the gateway's record id
    app_id         TEXT NOT NULL REFERENCES apps (id),
    consumer_id    TEXT NOT NULL REFERENCES users (id),  -- who called
    key_id         TEXT NOT NULL,  -- with which API key
    gateway_id     TEXT NOT NULL,  -- which gateway reported it
    at             INTEGER NOT NULL,  -- epoch seconds the call started
    status         INTEGER NOT NULL,  -- HTTP status the consumer got
    input_tokens   INTEGER NOT NULL CHECK (input_tokens >= 0),  -- from the upstream's usage
    output_tokens  INTEGER NOT NULL CHECK (output_tokens >= 0),  -- delivered, from the upstream's usage
    duration_ms    INTEGER NOT NULL CHECK (duration_ms >= 0),  -- the call's whole time
    cold_start     INTEGER NOT NULL CHECK (cold_start IN (0, 1)),  -- it waited for a replica to start
    completed      INTEGER NOT NULL CHECK (completed IN (0, 1)),  -- 0: cut short (client left, upstream failed)
    charge         INTEGER NOT NULL CHECK (charge >= 0),  -- micro-yuan taken from the consumer
    earning        INTEGER NOT NULL CHECK (earning >= 0),  -- to the publisher
    fee            INTEGER NOT NULL CHECK (fee >= 0 AND fee + earning = charge),  -- to the platform
    unpaid         INTEGER NOT NULL DEFAULT 0 CHECK (unpaid >= 0),  -- priced but beyond the consumer's funds
    transaction_id INTEGER REFERENCES ledger_transactions (id),  -- NULL when nothing was charged
    created_at     INTEGER NOT NULL
) STRICT;
CREATE INDEX app_calls_by_app ON app_calls (app_id, at);
CREATE INDEX app_calls_by_consumer ON app_calls (consumer_id, at);

-- What each gateway last said of an app's demand.
CREATE TABLE app_demand (
    app_id     TEXT NOT NULL REFERENCES apps (id),
    gateway_id TEXT NOT NULL,
    in_flight  INTEGER NOT NULL CHECK (in_flight >= 0),
    queued     INTEGER NOT NULL CHECK (queued >= 0),  -- held waiting for a replica
    at         INTEGER NOT NULL,  -- epoch seconds of the report
    busy       TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(busy)),  -- replicas (instance ids) with calls in flight: not removed
    PRIMARY KEY (app_id, gateway_id)
) STRICT;

-- Every scaling decision and change of an app.
CREATE TABLE app_events (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    app_id TEXT NOT NULL REFERENCES apps (id),
    at     INTEGER NOT NULL,
    kind   TEXT NOT NULL,  -- published, updated, deleted, scale_up, scale_down, scale_to_zero, scale_refused
    detail TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX app_events_by_app ON app_events (app_id, seq);

-- An app call transaction names its call.
ALTER TABLE ledger_transactions ADD COLUMN app_call_id TEXT;  -- app_call: which call (app_calls.id)
CREATE INDEX ledger_transactions_by_app_call ON ledger_transactions (app_call_id) WHERE app_call_id IS NOT NULL;

-- Anchored on 'topup' with its quotes, which appears only in the kind
-- CHECK list (as 0024 does), so it holds whatever 0024 added beside it.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '''topup''', '''topup'', ''app_call''')
 WHERE type = 'table' AND name = 'ledger_transactions';
PRAGMA writable_schema = RESET;
