-- idem records: one row per (scope, operation, key). Key columns are
-- VARBINARY: byte-exact comparison and byte-sized limits, so the primary key
-- (1024 + 1024 + 255 bytes) fits InnoDB's 3072-byte index limit. Times are
-- BIGINT Unix milliseconds.
CREATE TABLE IF NOT EXISTS idem_records (
    scope       VARBINARY(1024) NOT NULL,
    operation   VARBINARY(1024) NOT NULL,
    `key`       VARBINARY(255) NOT NULL,
    fingerprint VARBINARY(512) NOT NULL,
    state       VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token       VARBINARY(255) NOT NULL,
    lease_until BIGINT NOT NULL,
    response    LONGBLOB NULL,
    reason      BLOB NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NULL,
    PRIMARY KEY (scope, operation, `key`),
    -- Recovery (pending by lease deadline) and purge (completed by expiry).
    KEY idem_records_state_lease (state, lease_until),
    KEY idem_records_state_expiry (state, expires_at),
    -- Listing by state: InnoDB appends the primary key, so this index is
    -- also in (scope, operation, key) order within a state.
    KEY idem_records_state (state)
) ENGINE = InnoDB;
