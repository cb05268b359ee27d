-- updated_at is when the record last changed (unix milliseconds); request is
-- the encoded request that reserved the key (idemstore.EncodeRequest), for
-- operators.
ALTER TABLE idem_records ADD COLUMN updated_at INTEGER NOT NULL DEFAULT 0;
UPDATE idem_records SET updated_at = created_at;
ALTER TABLE idem_records ADD COLUMN request BLOB;
