-- 0015_ssh_keys: SSH access (issue 11). Users keep OpenSSH public keys on
-- their account; an instance takes a snapshot of them (the ones it names, or
-- all) at create and at every start, which the reconciler sends to the
-- agents; nodes get the host users connect to and what their agent's SSH
-- server reports (port and host key) in its facts.

-- Public keys of an account, parsed and fingerprinted by the daemon
-- (domain/ssh_keys.c) before they are stored: nothing here is unchecked text.
CREATE TABLE ssh_keys (
    id          TEXT PRIMARY KEY CHECK (id LIKE 'sshk\_%' ESCAPE '\'),  -- sshk_ + 20 random chars
    user_id     TEXT NOT NULL REFERENCES users (id),  -- owner
    name        TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 64),  -- the owner's label
    type        TEXT NOT NULL CHECK (type IN ('ssh-ed25519', 'ecdsa-sha2-nistp256', 'ecdsa-sha2-nistp384',
                                              'ecdsa-sha2-nistp521', 'ssh-rsa')),  -- key type, the blob's own
    bits        INTEGER NOT NULL CHECK (bits BETWEEN 256 AND 16384),  -- size as ssh-keygen -l shows it
    blob        TEXT NOT NULL CHECK (length(blob) BETWEEN 1 AND 16384),  -- the key's base64, as given
    comment     TEXT NOT NULL DEFAULT '' CHECK (length(comment) <= 256),  -- the line's comment, trimmed
    fingerprint TEXT NOT NULL CHECK (fingerprint LIKE 'SHA256:%'),  -- SHA256 of the blob, as ssh-keygen -l prints it
    created_at  INTEGER NOT NULL  -- epoch seconds
) STRICT;
-- One key (the same blob, so the same fingerprint) once per account.
CREATE UNIQUE INDEX ssh_keys_by_fingerprint ON ssh_keys (user_id, fingerprint);
CREATE INDEX ssh_keys_by_user ON ssh_keys (user_id, created_at, id);

-- The keys an instance was created with: a JSON array of key ids, or NULL
-- for "every key of the account". ssh_keys is the snapshot taken from them at
-- create and at every start: a JSON array of "type base64" lines, what the
-- workload spec's ssh.authorized_keys carries (AGENT_PROTOCOL.md). A key
-- deleted from the account leaves the snapshot at the next start.
ALTER TABLE instances ADD COLUMN ssh_key_ids TEXT CHECK (ssh_key_ids IS NULL OR (json_valid(ssh_key_ids) AND json_type(ssh_key_ids) = 'array'));
ALTER TABLE instances ADD COLUMN ssh_keys TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(ssh_keys) AND json_type(ssh_keys) = 'array');

-- Where users connect: public_host is admin-set at registration ('' for the
-- host of agent_url); ssh_port, ssh_host_key ("type base64") and
-- ssh_host_fingerprint come from the agent's facts, NULL while it reports no
-- SSH server.
ALTER TABLE nodes ADD COLUMN public_host TEXT NOT NULL DEFAULT '' CHECK (length(public_host) <= 253);
ALTER TABLE nodes ADD COLUMN ssh_port INTEGER CHECK (ssh_port IS NULL OR ssh_port BETWEEN 1 AND 65535);
ALTER TABLE nodes ADD COLUMN ssh_host_key TEXT CHECK (ssh_host_key IS NULL OR length(ssh_host_key) <= 1024);
ALTER TABLE nodes ADD COLUMN ssh_host_fingerprint TEXT CHECK (ssh_host_fingerprint IS NULL OR ssh_host_fingerprint LIKE 'SHA256:%');
