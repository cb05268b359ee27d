-- idem_awaited says whether any waiter is subscribed to any key. A batch's
-- completion (one statement for many records) calls it once, after its
-- update has locked every row it completes, and calls idem_wake for each
-- completed record only if it returns true: with no waiter anywhere, the
-- statement checks the waiters once instead of once per record. Being
-- VOLATILE and in plpgsql (never inlined), its query takes a fresh
-- snapshot under READ COMMITTED, as idem_wake's do: a waiter that
-- subscribed after the statement's own snapshot, before the update got
-- the row's lock, is seen. after is not read: the statement passes the
-- number of rows it updated, so that the call waits for the update.
CREATE FUNCTION {schema}.idem_awaited(after bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $idem_awaited$
BEGIN
    RETURN EXISTS (SELECT 1 FROM {schema}.idem_waiters);
END
$idem_awaited$;
