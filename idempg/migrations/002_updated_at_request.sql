-- Contract v2: records say when they last changed and which request
-- reserved them. Both columns are nullable so that adding them rewrites no
-- row: the store reads a NULL updated_at as created_at, and a NULL request
-- as none.
ALTER TABLE {schema}.idem_records
    ADD COLUMN updated_at timestamptz,
    ADD COLUMN request    bytea;

-- Admin listing filtered by operation, in key order (scope, then key, since
-- the operation is fixed).
CREATE INDEX idem_records_operation_key ON {schema}.idem_records (operation, scope, key);
