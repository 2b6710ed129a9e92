-- 0044_card_failed_at: since when a failed card has been failed. The
-- reservations pass credits a block for the hours its reserved cards were
-- missing, as it sees them; hours no pass saw (gpurentd down, its clock moved
-- on) are caught up from history. A silent node has its last good beat; a
-- node that answers with failed cards had none, so such hours went uncredited.
-- Cards failed before this migration have no known start (NULL), and their
-- missed hours stay uncredited as before.
ALTER TABLE node_cards ADD COLUMN failed_at INTEGER CHECK (failed_at IS NULL OR healthy = 0);  -- epoch seconds of the first accepted report that showed the card failed; NULL while healthy, or when unknown
