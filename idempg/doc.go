// Package idempg keeps idem's idempotency records in PostgreSQL, through a
// pgx v5 pool.
//
// Start with [New], which takes your own *pgxpool.Pool and a [Config], and
// [Migrate], which creates the schema's idem_records table (run it from a
// deploy step, the idem migrate command, or set Config.Migrate):
//
//	if err := idempg.Migrate(ctx, pool, idempg.Config{}); err != nil { ... }
//	store, err := idempg.New(pool, idempg.Config{})
//	eng, err := idem.NewEngine(store, idem.EngineConfig{})
//
// Reservations are INSERT … ON CONFLICT DO NOTHING against the primary key
// (scope, operation, key), committed on their own before any work runs, so
// they are safe at every isolation level. Every later change is fenced by
// the lease token.
//
// [Store.CompleteTx] stores the answer inside your own pgx.Tx, next to the
// business change it describes: both commit, or neither does. That is what
// makes takeover of an expired lease safe for transactional operations.
//
// The store implements idemstore.Notifier with LISTEN/NOTIFY: completing,
// releasing, escalating, resolving or taking over a record that a waiter
// subscribed to sends a pg_notify in the same statement (delivered at
// commit), and one dedicated connection per Store wakes the waiters of that
// key. Records nobody waits for are not announced, because PostgreSQL
// serialises the commits of notifying transactions.
//
// Native errors become the idemstore sentinels: serialization failures and
// deadlocks are idemstore.ErrRetryable, connection failures
// idemstore.ErrUnavailable, context errors stay context errors.
package idempg
