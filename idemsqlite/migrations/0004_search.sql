-- Finding records for operators. scope_label is the operator's label of
-- the scope (idemstore.Record.ScopeLabel, as stored: in clear or sealed)
-- and label_index what a search by label matches
-- (idemstore.ScopeLabelIndex of it); both NULL when the record has none.
-- Neither, nor "key" or created_at, changes after Reserve, so the indexes
-- below cost a settle nothing.
ALTER TABLE idem_records ADD COLUMN scope_label TEXT;
ALTER TABLE idem_records ADD COLUMN label_index TEXT;

-- A search by key value or key prefix, across scopes and operations.
CREATE INDEX idem_records_key_value ON idem_records ("key", scope, operation);

-- Listings by age (oldest or newest first).
CREATE INDEX idem_records_created ON idem_records (created_at, scope, operation, "key");

-- A search by label: only labelled records.
CREATE INDEX idem_records_label ON idem_records (label_index) WHERE label_index IS NOT NULL;
