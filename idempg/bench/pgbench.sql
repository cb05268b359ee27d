-- The two statements of idempg's Reserve+Complete pair, as the store sends
-- them (no waiters, so idem_wake finds none and does not notify), for
-- pgbench:
--   pgbench -n -c 16 -j 2 -T 20 -f idempg/bench/pgbench.sql "$IDEM_TEST_POSTGRES_URL"
-- run.sh creates the idem_bench schema this script writes to.
\set n random(1, 1000000000000)
INSERT INTO idem_bench.idem_records (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at, request)
VALUES ('bench', 'POST /orders', 'pgb-' || :client_id || '-' || :n, 'fp', 'pending', 'tok-' || :n,
    statement_timestamp() + interval '30 seconds', statement_timestamp(), statement_timestamp(), NULL)
ON CONFLICT (scope, operation, key) DO NOTHING;
WITH u AS (UPDATE idem_bench.idem_records r
    SET state = 'completed', response = '\x01c9010000207b226964223a226f72645f313233222c22737461747573223a2270616964227d'::bytea,
        expires_at = statement_timestamp() + interval '24 hours', updated_at = statement_timestamp()
    WHERE r.scope = 'bench' AND r.operation = 'POST /orders' AND r.key = 'pgb-' || :client_id || '-' || :n
        AND r.state = 'pending' AND r.token = 'tok-' || :n
    RETURNING r.scope, r.operation, r.key)
SELECT idem_bench.idem_wake('idem_idem_bench', 'a1b2c3', u.scope, u.operation, u.key, false, false) FROM u;
