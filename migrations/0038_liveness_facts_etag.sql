-- 0038_liveness_facts_etag: a heartbeat that finds a node's facts as they
-- were costs neither end the reply's bytes (issue 15).
--
-- An agent tags its facts reply with an ETag. The heartbeat keeps the ETag
-- of the reply it recorded and sends it back in If-None-Match; the agent
-- answers 304 while its facts are those. The digest (0033, 0036) of a
-- tagged reply is then taken over the declared model, card count and ETag
-- rather than the bytes, so a 304 is judged as the same reply. NULL: the
-- reply recorded had no ETag (an older agent), or none was recorded yet.
ALTER TABLE node_liveness ADD COLUMN facts_etag TEXT  -- the recorded facts reply's ETag, as the agent sent it
    CHECK (facts_etag IS NULL OR (length(facts_etag) BETWEEN 1 AND 64 AND facts_etag NOT GLOB '*[^ -~]*'));
