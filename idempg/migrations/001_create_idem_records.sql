-- idem records: one row per (scope, operation, key). The primary key leads
-- with scope so that a distribution by scope keeps each key on one shard.
-- Text keys use the "C" collation: byte order, deterministic listing.
CREATE TABLE {schema}.idem_records (
    scope       text COLLATE "C" NOT NULL,
    operation   text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    fingerprint text NOT NULL,
    state       text NOT NULL CHECK (state IN ('pending', 'completed', 'needs_review')),
    token       text NOT NULL,
    lease_until timestamptz NOT NULL,
    response    bytea,
    reason      text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz,
    -- waiters is set by Subscribe while the record is pending; only then do
    -- state changes pg_notify (notifying transactions commit one at a time).
    waiters     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (scope, operation, key)
);

-- Recovery: pending records whose lease expired.
CREATE INDEX idem_records_pending_lease ON {schema}.idem_records (lease_until)
    WHERE state = 'pending';

-- Purge: completed records by expiry.
CREATE INDEX idem_records_completed_expiry ON {schema}.idem_records (expires_at)
    WHERE state = 'completed';

-- Admin listing filtered by state, in key order.
CREATE INDEX idem_records_state_key ON {schema}.idem_records (state, scope, operation, key);
