-- 0036_liveness_facts_digest: a judged reply that changes nothing the node
-- row holds writes only the narrow row (issue 15).
--
-- An agent's facts carry its count of workloads, so a placement or a
-- removal changes the reply's bytes and its digest (0033) while the facts
-- recorded from it (the canonical document) stay the same. The digest was
-- kept in the wide nodes row, so every such beat rewrote that row only to
-- note it. It moves to node_liveness, which such a beat writes anyway.
ALTER TABLE node_liveness ADD COLUMN facts_digest TEXT
    CHECK (facts_digest IS NULL OR length(facts_digest) = 64);  -- SHA-256 hex of the last reply judged (0033)

UPDATE node_liveness SET facts_digest = (SELECT n.facts_digest FROM nodes n WHERE n.id = node_liveness.node_id);

ALTER TABLE nodes DROP COLUMN facts_digest;
