-- 0019_gang: multi-node jobs that rendezvous (issue 12). Nodes get a
-- data-plane address (what MASTER_ADDR and the ranks' hostfiles name, never
-- the agent's management URL); instances of more than one node get an
-- internal SSH key pair and a bound on how long their ranks may take to
-- come up together.

-- data_host is the admin's (registration or PATCH /v1/admin/nodes/{id}),
-- '' when unset; data_address is what the agent's facts report, NULL while
-- it reports none. The admin's wins; with neither, the node's public host.
ALTER TABLE nodes ADD COLUMN data_host TEXT NOT NULL DEFAULT '' CHECK (length(data_host) <= 253);
ALTER TABLE nodes ADD COLUMN data_address TEXT CHECK (data_address IS NULL OR length(data_address) BETWEEN 1 AND 253);

-- Seconds from the first rank seen running to the last (30..3600; the API
-- checks the range, the default is the option rendezvous_timeout_s), and
-- when this attempt's first rank was seen running (NULL: none yet).
ALTER TABLE instances ADD COLUMN rendezvous_timeout_s INTEGER NOT NULL DEFAULT 600 CHECK (rendezvous_timeout_s BETWEEN 30 AND 3600);
ALTER TABLE instances ADD COLUMN rendezvous_since INTEGER;

-- The instance-internal key pair its ranks ssh to each other with (made by
-- the control plane, secrets.c): the public key as an OpenSSH line, the
-- private key in OpenSSH's own format. Sent only to the instance's agents;
-- never in an API reply, an event or a log line. NULL for single-node ones.
ALTER TABLE instances ADD COLUMN internal_pubkey TEXT CHECK (internal_pubkey IS NULL OR internal_pubkey LIKE 'ssh-ed25519 %');
ALTER TABLE instances ADD COLUMN internal_key TEXT CHECK (internal_key IS NULL OR internal_key LIKE '-----BEGIN OPENSSH PRIVATE KEY-----%');
