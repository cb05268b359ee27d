-- The review queue is listed oldest first: the partial index of records
-- not completed is ordered by state and creation time (then key, for the
-- ties), so that the oldest 50 in review are its first 50 entries rather
-- than a sort of every record in review. It replaces the one in key
-- order, as one partial index: the write path keeps the cost it had.
-- Listings of those records in key order sort them (they are few).
DROP INDEX IF EXISTS idem_records_open_key;
CREATE INDEX idem_records_open_created ON idem_records (state, created_at, scope, operation, "key") WHERE state <> 'completed';
