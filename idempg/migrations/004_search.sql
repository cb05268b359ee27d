-- Finding records for operators. scope_label is the operator's label of
-- the scope (idemstore.Record.ScopeLabel, as stored: in clear or sealed)
-- and label_index what a search by label matches
-- (idemstore.ScopeLabelIndex of it); both NULL when the record has none.
-- Both are nullable, so adding them rewrites no row.
--
-- The indexes are on columns that never change after Reserve (key,
-- created_at, label_index), and no predicate names one that a settle
-- changes: settling a record still touches no index but the ones it did.
-- Each is IF NOT EXISTS: on a large table, create them beforehand with
-- CREATE INDEX CONCURRENTLY (same names and definitions) so that this
-- migration, which runs in one transaction, does not hold writes while
-- it builds them.
ALTER TABLE {schema}.idem_records
    ADD COLUMN scope_label text,
    ADD COLUMN label_index text COLLATE "C";

-- A search by key value or key prefix, across scopes and operations.
CREATE INDEX IF NOT EXISTS idem_records_key_value ON {schema}.idem_records (key);

-- Listings by age (oldest or newest first).
CREATE INDEX IF NOT EXISTS idem_records_created ON {schema}.idem_records (created_at);

-- A search by label: only labelled records.
CREATE INDEX IF NOT EXISTS idem_records_label ON {schema}.idem_records (label_index)
    WHERE label_index IS NOT NULL;
