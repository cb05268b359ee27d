-- The secondary indexes hold only the records each one serves, so that
-- the write path touches fewer b-tree pages: completing a record no longer
-- moves it within an index on (state, scope, operation, key) at a random
-- place, and a pending record enters no expiry index. Completed records,
-- nearly all of the table, are listed in key order from the primary key.

-- Recovery: pending records whose lease expired (ListExpiredLeases).
DROP INDEX IF EXISTS idem_records_lease;
CREATE INDEX idem_records_pending_lease ON idem_records (lease_until) WHERE state = 'pending';

-- Retention: completed records past expires_at (Purge).
DROP INDEX IF EXISTS idem_records_expiry;
CREATE INDEX idem_records_completed_expiry ON idem_records (expires_at) WHERE state = 'completed';

-- Admin listing of pending and needs_review records in key order (List
-- with those states, and the review queue).
DROP INDEX IF EXISTS idem_records_state_key;
CREATE INDEX idem_records_open_key ON idem_records (state, scope, operation, "key") WHERE state <> 'completed';
