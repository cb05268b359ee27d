-- idem_records holds one row per idempotency key. Times are unix
-- milliseconds (UTC); expires_at is NULL until the record is completed.
CREATE TABLE idem_records (
    scope       TEXT    NOT NULL,
    operation   TEXT    NOT NULL,
    "key"       TEXT    NOT NULL,
    fingerprint TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('pending', 'completed', 'needs_review')),
    token       TEXT    NOT NULL,
    lease_until INTEGER NOT NULL,
    response    BLOB,
    reason      TEXT    NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    PRIMARY KEY (scope, operation, "key")
) STRICT;

-- Recovery: pending records whose lease expired (ListExpiredLeases).
CREATE INDEX idem_records_lease ON idem_records (state, lease_until);

-- Retention: completed records past expires_at (Purge).
CREATE INDEX idem_records_expiry ON idem_records (state, expires_at);

-- Admin listing by state in key order (List with a state filter).
CREATE INDEX idem_records_state_key ON idem_records (state, scope, operation, "key");
