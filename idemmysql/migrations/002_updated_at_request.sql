-- updated_at is when the record last changed (Unix milliseconds, the
-- server's clock); rows written before this migration have NULL, read as
-- created_at. request is the request that reserved the key, encoded with
-- idemstore.EncodeRequest; NULL when none was given. Both are nullable and
-- last, so MariaDB 10.3+ and MySQL 8 add them instantly, without rewriting
-- the table or touching its rows.
ALTER TABLE idem_records
    ADD COLUMN updated_at BIGINT NULL,
    ADD COLUMN request LONGBLOB NULL;
-- Listing by operation (ListParams.Operation): InnoDB appends the primary
-- key, so this index is in (scope, key) order within an operation. Built
-- online, apart from the instant column change above.
CREATE INDEX idem_records_operation ON idem_records (operation);
