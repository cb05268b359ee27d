-- Finding records for operators. scope_label is the operator's label of
-- the scope (idemstore.Record.ScopeLabel, as stored: in clear or sealed)
-- and label_index what a search by label matches
-- (idemstore.ScopeLabelIndex of it); both NULL when the record has none.
-- Nullable and last, so MariaDB 10.3+ and MySQL 8 add them instantly.
ALTER TABLE idem_records
    ADD COLUMN scope_label VARBINARY(512) NULL,
    ADD COLUMN label_index VARBINARY(512) NULL;
-- Indexes on columns that never change after Reserve, so settling a
-- record touches none of them; each built online. InnoDB appends the
-- primary key, so idem_records_key_value is in (key, scope, operation)
-- order and idem_records_created in (created_at, scope, operation, key)
-- order: the orders of a search by key and of a listing by age.
CREATE INDEX idem_records_key_value ON idem_records (`key`);
CREATE INDEX idem_records_created ON idem_records (created_at);
CREATE INDEX idem_records_label ON idem_records (label_index);
