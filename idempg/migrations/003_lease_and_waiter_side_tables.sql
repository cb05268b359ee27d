-- Heartbeats and waiters never write a record's row. PostgreSQL refuses
-- (SQLSTATE 40001) to update, in a REPEATABLE READ or SERIALIZABLE
-- transaction, a row that another transaction changed after the snapshot;
-- so a heartbeat or a waiter that touched the record while the holder's
-- business transaction was open would make its CompleteTx fail. Both keep
-- their state in side tables keyed like the record instead.

-- idem_leases holds the latest heartbeat of a key: Extend's new deadline,
-- for the lease whose token it carries. The record's effective deadline is
-- this one while the record is pending under that token, its own
-- lease_until otherwise. shrunk says the heartbeat moved the deadline
-- before the record's own (a shorter lease), so that recovery finds such
-- leases by index.
CREATE TABLE {schema}.idem_leases (
    scope       text COLLATE "C" NOT NULL,
    operation   text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    token       text NOT NULL,
    lease_until timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    shrunk      boolean NOT NULL,
    PRIMARY KEY (scope, operation, key)
);

CREATE INDEX idem_leases_shrunk ON {schema}.idem_leases (lease_until) WHERE shrunk;

-- idem_waiters lists the keys that a waiter subscribed to while they were
-- pending; only their changes are announced (notifying transactions commit
-- one at a time). It replaces idem_records.waiters, which this version no
-- longer reads or writes.
CREATE TABLE {schema}.idem_waiters (
    scope     text COLLATE "C" NOT NULL,
    operation text COLLATE "C" NOT NULL,
    key       text COLLATE "C" NOT NULL,
    PRIMARY KEY (scope, operation, key)
);

-- idem_wake runs after a statement changed the record of a key: it
-- announces the change on channel if a waiter subscribed to the key (or if
-- always), and with forget deletes the key's heartbeat and waiter rows (the
-- record is gone). Being VOLATILE, its queries take a fresh snapshot under
-- READ COMMITTED, after the calling statement locked the record's row: a
-- waiter that subscribed in between is seen, and one that comes later waits
-- for the row lock and then finds the record changed. A NULL channel
-- announces nothing. It returns whether a waiter was found.
CREATE FUNCTION {schema}.idem_wake(channel text, payload text, k_scope text, k_operation text, k_key text,
                                   always boolean, forget boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $idem_wake$
DECLARE
    waited boolean;
BEGIN
    IF forget THEN
        DELETE FROM {schema}.idem_leases WHERE scope = k_scope AND operation = k_operation AND key = k_key;
        DELETE FROM {schema}.idem_waiters WHERE scope = k_scope AND operation = k_operation AND key = k_key;
        waited := FOUND;
    ELSIF always THEN
        -- Not read: at SERIALIZABLE, reading the waiters would add a
        -- read-write dependency on every concurrent Subscribe.
        waited := false;
    ELSE
        waited := EXISTS (SELECT 1 FROM {schema}.idem_waiters
                          WHERE scope = k_scope AND operation = k_operation AND key = k_key);
    END IF;
    IF channel IS NOT NULL AND (waited OR always) THEN
        PERFORM pg_notify(channel, payload);
    END IF;
    RETURN waited;
END
$idem_wake$;
