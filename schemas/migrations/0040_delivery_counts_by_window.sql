-- 0040 The status snapshot's inbox decisions cost what they show, not the replay window. Each
-- snapshot grouped every retained consumers.deliveries row (the consumers keep them for the
-- replay window, 7 days by default): O(a week of deliveries) per `accord status` and per
-- /metrics scrape of `accord metrics-serve`. `accord status` now counts the decisions within
-- its window (--since) through deliveries_received_idx, and the conflicts among all retained
-- deliveries (accord_inbox_conflicts) through this index, which holds only
-- conflicts: a healthy system writes none to it.
CREATE INDEX deliveries_conflict_idx ON consumers.deliveries (consumer, tenant)
    WHERE outcome = 'conflict';
