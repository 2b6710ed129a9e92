-- 0016_published_ports: published ports (issue 11). An instance names a few
-- container TCP ports at create; placement gives each rank a host port of
-- its node for each, from the range the node's agent reports in its facts,
-- held like cards until the instance releases its placement.

-- The container ports asked for at create: a JSON array of 0..8 distinct
-- integers 1..65535 (checked by the API before it is stored).
ALTER TABLE instances ADD COLUMN ports TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(ports) AND json_type(ports) = 'array');

-- The host ports a node's agent publishes on (facts "publish_ports"), both
-- NULL while it reports none: such a node takes no instance that asks for ports.
ALTER TABLE nodes ADD COLUMN publish_first INTEGER CHECK (publish_first IS NULL OR publish_first BETWEEN 1 AND 65535);
ALTER TABLE nodes ADD COLUMN publish_last INTEGER CHECK (publish_last IS NULL OR (publish_last BETWEEN publish_first AND 65535));

-- What rank r of an instance publishes: [{"container": 8888, "host": 30007}],
-- the spec's "ports" (AGENT_PROTOCOL.md) and the view's "published".
ALTER TABLE instance_nodes ADD COLUMN ports TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(ports) AND json_type(ports) = 'array');

-- Host ports given out, one row each: the primary key is what keeps one
-- host port of a node from going to two instances. Rows go with the
-- placement (store_instance_release).
CREATE TABLE node_ports (
    node_id        TEXT NOT NULL REFERENCES nodes (id),  -- whose host port
    host_port      INTEGER NOT NULL CHECK (host_port BETWEEN 1 AND 65535),  -- the port on the node
    instance_id    TEXT NOT NULL REFERENCES instances (id),  -- who holds it
    container_port INTEGER NOT NULL CHECK (container_port BETWEEN 1 AND 65535),  -- where it leads
    PRIMARY KEY (node_id, host_port)
) STRICT;
CREATE INDEX node_ports_by_instance ON node_ports (instance_id);
