-- 0004_money: prices, a double-entry ledger, credit grants, invite codes,
-- top-ups, and what billing has posted for each running interval.
-- Every amount is an integer number of micro-yuan (1 yuan = 1 000 000).

-- Price per card-hour of a GPU type from effective_at on. A change never
-- applies backwards: rows are only ever added.
CREATE TABLE prices (
    gpu_model     TEXT NOT NULL REFERENCES gpu_types (code),  -- which cards
    effective_at  INTEGER NOT NULL CHECK (effective_at >= 0),  -- epoch seconds from which this price applies
    card_hour     INTEGER NOT NULL CHECK (card_hour >= 0),  -- micro-yuan per card-hour
    created_at    INTEGER NOT NULL,  -- epoch seconds when an admin set it
    PRIMARY KEY (gpu_model, effective_at)
) STRICT;
INSERT INTO prices (gpu_model, effective_at, card_hour, created_at) VALUES
    ('MI450', 0, 1200000, 0),
    ('MI300X', 0, 2200000, 0),
    ('RTX4090', 0, 900000, 0);

-- Ledger accounts. Users' accounts hold what the platform owes them (cash
-- and each credit grant); platform accounts balance them.
CREATE TABLE ledger_accounts (
    id         TEXT PRIMARY KEY,  -- 'cash:usr_…', 'grant:grt_…', 'revenue', 'promotion', 'payments'
    kind       TEXT NOT NULL CHECK (kind IN ('cash', 'grant', 'revenue', 'promotion', 'payments')),  -- what it is
    user_id    TEXT REFERENCES users (id),  -- owner of cash and grant accounts, NULL for platform accounts
    balance    INTEGER NOT NULL DEFAULT 0,  -- cached sum of its postings, kept in the same transaction; checked by ledger verify
    CHECK ((kind IN ('cash', 'grant')) = (user_id IS NOT NULL)),
    CHECK (kind NOT IN ('cash', 'grant') OR balance >= 0)  -- users' funds never go negative
) STRICT;
INSERT INTO ledger_accounts (id, kind) VALUES ('revenue', 'revenue'), ('promotion', 'promotion'), ('payments', 'payments');

-- One money movement: its postings sum to zero.
CREATE TABLE ledger_transactions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- order
    at          INTEGER NOT NULL,  -- epoch seconds the movement is for
    kind        TEXT NOT NULL CHECK (kind IN ('usage', 'grant', 'expiry', 'topup')),  -- what moved money
    user_id     TEXT NOT NULL REFERENCES users (id),  -- whose money
    reason      TEXT NOT NULL,  -- a sentence for statements
    instance_id TEXT REFERENCES instances (id),  -- usage: which instance
    interval_id INTEGER REFERENCES running_intervals (id),  -- usage: which running interval
    grant_id    TEXT,  -- grant and expiry: which grant
    topup_id    TEXT,  -- topup: which top-up
    created_at  INTEGER NOT NULL  -- epoch seconds when it was posted
) STRICT;
CREATE INDEX ledger_transactions_by_user ON ledger_transactions (user_id, id);

-- The legs of a transaction.
CREATE TABLE ledger_postings (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,  -- order
    transaction_id INTEGER NOT NULL REFERENCES ledger_transactions (id),  -- the movement
    account_id     TEXT NOT NULL REFERENCES ledger_accounts (id),  -- the account moved
    amount         INTEGER NOT NULL CHECK (amount <> 0),  -- micro-yuan, signed: + into the account
    grant_id       TEXT  -- the grant that paid, on grant legs
) STRICT;
CREATE INDEX ledger_postings_by_transaction ON ledger_postings (transaction_id);
CREATE INDEX ledger_postings_by_account ON ledger_postings (account_id);

-- Credit given to a user: sign-up trial, an invite code, or an admin.
CREATE TABLE credit_grants (
    id         TEXT PRIMARY KEY CHECK (id LIKE 'grt\_%' ESCAPE '\'),  -- grt_ + 20 random chars
    user_id    TEXT NOT NULL REFERENCES users (id),  -- who may spend it
    source     TEXT NOT NULL,  -- 'signup', 'invite:AMD6GW' or 'admin'
    amount     INTEGER NOT NULL CHECK (amount > 0),  -- micro-yuan granted
    remaining  INTEGER NOT NULL CHECK (remaining BETWEEN 0 AND amount),  -- micro-yuan not yet spent or voided
    expires_at INTEGER,  -- epoch seconds; NULL never expires
    voided_at  INTEGER,  -- epoch seconds the expired remainder was voided
    created_at INTEGER NOT NULL  -- epoch seconds
) STRICT;
CREATE INDEX credit_grants_by_user ON credit_grants (user_id, expires_at);

-- Invite codes an admin hands out; each grants credit once per account.
CREATE TABLE invite_codes (
    code       TEXT PRIMARY KEY CHECK (code = upper(code) AND length(code) BETWEEN 1 AND 32),  -- e.g. 'AMD6GW'
    amount     INTEGER NOT NULL CHECK (amount > 0),  -- micro-yuan each redemption grants
    credit_days INTEGER,  -- the grant expires this many days after redemption; NULL never
    expires_at INTEGER,  -- epoch seconds after which the code no longer redeems; NULL never
    max_uses   INTEGER CHECK (max_uses IS NULL OR max_uses > 0),  -- NULL unlimited
    uses       INTEGER NOT NULL DEFAULT 0 CHECK (max_uses IS NULL OR uses <= max_uses),  -- redemptions so far
    created_at INTEGER NOT NULL  -- epoch seconds
) STRICT;
INSERT INTO invite_codes (code, amount, credit_days, expires_at, max_uses, created_at) VALUES ('AMD6GW', 10000000, NULL, NULL, NULL, 0);

CREATE TABLE invite_redemptions (
    code     TEXT NOT NULL REFERENCES invite_codes (code),  -- which code
    user_id  TEXT NOT NULL REFERENCES users (id),  -- who redeemed it
    grant_id TEXT NOT NULL REFERENCES credit_grants (id),  -- the credit it gave
    at       INTEGER NOT NULL,  -- epoch seconds
    PRIMARY KEY (code, user_id)  -- once per account
) STRICT;

-- Cash added to users' accounts, by an admin or a payment provider's webhook.
CREATE TABLE topups (
    id         TEXT PRIMARY KEY CHECK (id LIKE 'top\_%' ESCAPE '\'),  -- top_ + 20 random chars
    user_id    TEXT NOT NULL REFERENCES users (id),  -- whose cash
    payment_id TEXT NOT NULL UNIQUE CHECK (length(payment_id) BETWEEN 1 AND 128),  -- the payment's id: a repeat adds nothing
    amount     INTEGER NOT NULL CHECK (amount > 0),  -- micro-yuan
    source     TEXT NOT NULL CHECK (source IN ('admin', 'webhook')),  -- who reported it
    created_at INTEGER NOT NULL  -- epoch seconds
) STRICT;

-- What billing has charged for each running interval so far; the next pass
-- posts only the difference from what is due.
ALTER TABLE running_intervals ADD COLUMN billed INTEGER NOT NULL DEFAULT 0 CHECK (billed >= 0);  -- micro-yuan posted for it so far
ALTER TABLE running_intervals ADD COLUMN settled INTEGER NOT NULL DEFAULT 0 CHECK (settled IN (0, 1));  -- 1: ended and billed in full
CREATE INDEX running_intervals_unsettled ON running_intervals (user_id) WHERE settled = 0;
