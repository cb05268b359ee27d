-- The index of open records replaces the index of states, and holds only
-- the records it serves: pending and needs_review ones, for the admin
-- listings of those states in key order, the review queue and Counts.
-- Completed records, nearly all of the table, are listed in key order
-- from the primary key. A settle is not a HOT update (it changes state),
-- so it writes an entry in every index whose predicate the completed row
-- matches: the old index on (state, scope, operation, key) took one per
-- settle, at a random place, and this one takes none.
--
-- IF NOT EXISTS: on a large table, create the index beforehand with CREATE
-- INDEX CONCURRENTLY (same name and definition) so that this migration,
-- which runs in one transaction, does not hold writes while it builds it.
-- Dropping the old index takes a brief exclusive lock on the table.
-- The table's exclusive lock first: building the index takes SHARE and
-- dropping the old one ACCESS EXCLUSIVE, and a lock raised from one to the
-- other in the middle deadlocks with a store's transaction that holds a
-- weaker lock on the table and waits to write. Reads wait too while the
-- index builds: another reason to build it beforehand on a large table.
LOCK TABLE {schema}.idem_records IN ACCESS EXCLUSIVE MODE;

CREATE INDEX IF NOT EXISTS idem_records_open_key ON {schema}.idem_records (state, scope, operation, key)
    WHERE state <> 'completed';

DROP INDEX IF EXISTS {schema}.idem_records_state_key;
