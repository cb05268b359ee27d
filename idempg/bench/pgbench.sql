-- The two statements of idempg's Reserve+Complete pair, as the store sends
-- them (no waiters, so pg_notify is not reached), for pgbench:
--   pgbench -n -c 16 -j 2 -T 20 -f idempg/bench/pgbench.sql "$IDEM_TEST_POSTGRES_URL"
-- run.sh creates the idem_bench schema this script writes to.
\set n random(1, 1000000000000)
INSERT INTO idem_bench.idem_records (scope, operation, key, fingerprint, state, token, lease_until, created_at)
VALUES ('bench', 'POST /orders', 'pgb-' || :client_id || '-' || :n, 'fp', 'pending', 'tok-' || :n, now() + interval '30 seconds', now())
ON CONFLICT (scope, operation, key) DO NOTHING
RETURNING scope, operation, key, fingerprint, state, token, lease_until, response, reason, created_at, expires_at;
WITH u AS (UPDATE idem_bench.idem_records
    SET state = 'completed', response = '\x01c9010000207b226964223a226f72645f313233222c22737461747573223a2270616964227d'::bytea, expires_at = now() + interval '24 hours'
    WHERE scope = 'bench' AND operation = 'POST /orders' AND key = 'pgb-' || :client_id || '-' || :n AND state = 'pending' AND token = 'tok-' || :n
    RETURNING waiters)
SELECT CASE WHEN u.waiters THEN pg_notify('idem_idem_bench', 'a1b2c3') END FROM u;
