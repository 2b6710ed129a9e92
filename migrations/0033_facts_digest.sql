-- 0033_facts_digest: a beat that repeats the last one costs a write of the
-- time, not a parse of its facts (issue 15).
--
-- The SHA-256 of the last facts reply the heartbeat judged and recorded for
-- the node, with the model and card count it was judged against, in hex;
-- NULL until the first. It is written in the transaction that records that
-- reply's verdict, so while it matches, the node's row already holds what
-- judging the same bytes again would write.
ALTER TABLE nodes ADD COLUMN facts_digest TEXT CHECK (facts_digest IS NULL OR length(facts_digest) = 64);
