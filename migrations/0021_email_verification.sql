-- 0021_email_verification: trial credit for people, not scripts (issue 13).
-- An account proves its address before it gets trial or invite credit or
-- may launch; the address is unique in a normalised form; one trial per
-- account; the client address of each sign-up is kept for admins; invite
-- codes may cap their redemptions per UTC day; admins' suspensions are
-- audited like their money actions.

-- email stays the lower-cased login name. email_key is the form uniqueness
-- is checked on (domain/accounts.c: +tags stripped, dots ignored for the
-- configured domains); email_display the address as typed, for mail.
-- Accounts made before this migration keep their lower-cased email as key:
-- the options that normalise further cannot be read from SQL, and those
-- addresses were already unique.
ALTER TABLE users ADD COLUMN email_key TEXT CHECK (email_key IS NULL OR (email_key = lower(email_key) AND length(email_key) BETWEEN 3 AND 254));
ALTER TABLE users ADD COLUMN email_display TEXT NOT NULL DEFAULT '' CHECK (length(email_display) <= 254);
-- Epoch seconds the address was verified; NULL until then. Existing and
-- admin-made accounts count as verified.
ALTER TABLE users ADD COLUMN email_verified_at INTEGER;
-- Epoch seconds the account got its trial (sign-up credit or an invite
-- code's grant); NULL while it has had none. At most once per account.
ALTER TABLE users ADD COLUMN trial_at INTEGER;
-- The client address the sign-up came from ('' for accounts not made by
-- POST /v1/signup), for GET /v1/admin/signups.
ALTER TABLE users ADD COLUMN signup_address TEXT NOT NULL DEFAULT '' CHECK (length(signup_address) <= 63);
UPDATE users SET email_key = email, email_display = email, email_verified_at = created_at;
UPDATE users SET trial_at = (SELECT min(g.created_at) FROM credit_grants g
                              WHERE g.user_id = users.id AND (g.source = 'signup' OR g.source LIKE 'invite:%'))
 WHERE EXISTS (SELECT 1 FROM credit_grants g
                WHERE g.user_id = users.id AND (g.source = 'signup' OR g.source LIKE 'invite:%'));
CREATE UNIQUE INDEX users_by_email_key ON users (email_key);
CREATE INDEX users_by_signup_address ON users (signup_address, created_at);
CREATE INDEX users_by_created ON users (created_at, id);

-- Verification codes: only the SHA-256 of the code is kept; a code works
-- once (used_at) and until expires_at.
CREATE TABLE email_verifications (
    token_hash TEXT PRIMARY KEY CHECK (length(token_hash) = 64),  -- SHA-256 of the code, hex
    user_id    TEXT NOT NULL REFERENCES users (id),  -- whose address it proves
    created_at INTEGER NOT NULL,  -- epoch seconds
    expires_at INTEGER NOT NULL CHECK (expires_at > created_at),  -- epoch seconds; refused from then on
    used_at    INTEGER  -- epoch seconds it verified the address; NULL while unused
) STRICT;
CREATE INDEX email_verifications_by_user ON email_verifications (user_id, created_at);

-- Mail to send, written in the transaction that makes it necessary (so a
-- crash loses none) and sent by the mailer loop (loops/mailer.c), with
-- retries. The body holds the code in clear until it is sent; it is
-- blanked then.
CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY,  -- order of queueing
    user_id         TEXT REFERENCES users (id),  -- the account it is about, NULL for none
    to_addr         TEXT NOT NULL CHECK (length(to_addr) BETWEEN 3 AND 254),  -- recipient, as typed at sign-up
    subject         TEXT NOT NULL CHECK (length(subject) <= 200),  -- Subject: line
    body            TEXT NOT NULL,  -- plain-text body; '' once sent
    created_at      INTEGER NOT NULL,  -- epoch seconds
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),  -- sends tried
    next_attempt_at INTEGER NOT NULL,  -- epoch seconds of the next try
    sent_at         INTEGER,  -- epoch seconds it was handed to the SMTP server (or logged); NULL while pending
    failed_at       INTEGER,  -- epoch seconds the mailer gave up; NULL otherwise
    last_error      TEXT NOT NULL DEFAULT ''  -- why the last try failed
) STRICT;
CREATE INDEX outbox_pending ON outbox (next_attempt_at) WHERE sent_at IS NULL AND failed_at IS NULL;

-- An optional cap on an invite code's redemptions per UTC day.
ALTER TABLE invite_codes ADD COLUMN max_uses_per_day INTEGER CHECK (max_uses_per_day IS NULL OR max_uses_per_day > 0);
CREATE INDEX invite_redemptions_by_code_at ON invite_redemptions (code, at);

-- Suspending and reinstating accounts are admin actions too (widened as
-- 0012 widens a CHECK list; 'billing_run' with its quotes appears only in
-- the CHECK list, whatever other values were added around it).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '''billing_run''', '''billing_run'', ''suspend'', ''reinstate''')
 WHERE type = 'table' AND name = 'admin_actions';
PRAGMA writable_schema = RESET;
