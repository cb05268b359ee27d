// Package idempg keeps idem's idempotency records in PostgreSQL, through a
// pgx v5 pool.
//
// Start with [New], which takes your own *pgxpool.Pool and a [Config], and
// [Migrate], which creates the schema's tables (run it from a deploy step,
// the idem migrate command, or set Config.Migrate):
//
//	if err := idempg.Migrate(ctx, pool, idempg.Config{}); err != nil { ... }
//	store, err := idempg.New(pool, idempg.Config{})
//	eng, err := idem.NewEngine(store, idem.EngineConfig{})
//
// Reservations are INSERT … ON CONFLICT DO NOTHING against the primary key
// (scope, operation, key), in a transaction of their own committed before
// any work runs, so they are safe at every isolation level. The COMMIT is
// sent only once the insert has answered: a Reserve whose context ends
// while its insert waits for a lock is dropped with its connection and
// rolled back, instead of committing later under a token that the
// caller, told it failed, has already released. Every later change is fenced by
// the lease token. Time is the server's: every deadline is
// statement_timestamp() plus a duration, and every expiry is judged on it
// in the statement that acts.
//
// [Store.CompleteTx] stores the answer inside your own pgx.Tx, next to the
// business change it describes: both commit, or neither does. That is what
// makes takeover of an expired lease safe for transactional operations.
// It works at READ COMMITTED, REPEATABLE READ and SERIALIZABLE.
//
// # Heartbeats and waiters do not write the record
//
// At REPEATABLE READ and SERIALIZABLE, PostgreSQL fails (SQLSTATE 40001)
// an UPDATE of a row that a transaction committed after the snapshot
// changed. If a heartbeat (Extend) or a waiter (Subscribe) wrote the
// record's row while the holder's business transaction was open, the
// holder's CompleteTx would fail although its lease was never lost. So
// only the changes that settle or hand over a lease (Complete, Release,
// Escalate, Takeover, Resolve, Delete, Purge) write idem_records; the two
// others keep their state in side tables keyed like the record:
//
//   - idem_leases holds the latest heartbeat of a key with the token it
//     extended. A pending record's effective deadline is the heartbeat's
//     while the heartbeat carries the record's current token, the record's
//     own lease_until otherwise (a takeover's new token leaves the old
//     heartbeat behind). Get, List, Reserve's existing record,
//     ListExpiredLeases, Takeover and IfExpired Release and Escalate all
//     judge that effective deadline.
//   - idem_waiters lists the keys that a waiter subscribed to; the settling
//     statements notify only those.
//
// Extend locks the record's row FOR KEY SHARE before it writes the
// heartbeat, and Subscribe FOR SHARE before it lists the key. A lock is not
// a change: a committed lock does not make a later UPDATE fail at any
// isolation level. Takeover and IfExpired Release and Escalate run in a
// READ COMMITTED transaction of their own that first locks the row FOR
// UPDATE (which waits for a heartbeat in progress) and then, with a fresh
// snapshot, checks the effective deadline: an Extend that committed first
// makes them fail with idemstore.ErrLeaseLost, and one that comes after them
// waits for their commit and finds the lease gone. CompleteTx never touches
// the side tables' rows except to read idem_waiters at READ COMMITTED.
// Side rows are deleted with their record (Release, Resolve, Delete,
// Purge); after a completion they stay until the record is purged.
//
// A CompleteTx that does fail with a serialization error because the
// record's row really changed (the lease was taken over, released or
// escalated during the transaction) returns idemstore.ErrLeaseLost, as it
// would at READ COMMITTED.
//
// # Notifications
//
// The store implements idemstore.Notifier with LISTEN/NOTIFY: completing,
// releasing, escalating, resolving or taking over a record that a waiter
// subscribed to sends a pg_notify in the same transaction (delivered at
// commit), and one dedicated connection per Store wakes the waiters of that
// key. Records nobody waits for are not announced, because PostgreSQL
// serialises the commits of notifying transactions. The check runs in the
// schema's idem_wake function after the statement has locked the record's
// row; being VOLATILE it takes a fresh snapshot at READ COMMITTED, so a
// waiter that subscribed while the statement waited for the row is seen,
// and one that subscribes later waits for the row lock and then finds the
// record settled. A CompleteTx at REPEATABLE READ or SERIALIZABLE cannot see
// a waiter that subscribed after its snapshot, so it always notifies.
//
// A batch runs at READ COMMITTED whatever the database's default
// (default_transaction_isolation), so that these checks see such a waiter
// there too; at SERIALIZABLE a waiter that subscribed while a batch ran
// would otherwise fail the whole batch with a serialization error. So does
// every statement the store makes alone (a lone Reserve, Complete,
// Release, Escalate, Extend, Resolve or Delete, Subscribe's listing, a
// Purge batch): on a connection whose default is not READ COMMITTED
// (asked once per connection), BEGIN ISOLATION LEVEL READ COMMITTED, the
// statement and COMMIT go in one round trip. Only CompleteTx runs at the
// caller's level. The answer is kept with the connection, and PostgreSQL
// does not report a later SET default_transaction_isolation: code that
// shares the store's pool must not change its sessions' default isolation
// (SET LOCAL or BEGIN ISOLATION LEVEL are fine).
//
// A batch completes a round's records in one statement. On a schema with
// migration 006 that statement first asks, once, whether any key is
// awaited at all (the schema's idem_awaited function, VOLATILE too, called
// after the statement has locked every row it completes), and calls
// idem_wake for each record only if so; on a schema at 005 it calls
// idem_wake for each record. The store reads which migrations the schema
// has the first time a batch completes records (New with Config.Migrate
// knows) and keeps the answer: a store started before migration 006 was
// applied keeps the per-record check, as correct and dearer, until it is
// made again. Stores of this version and of the previous one can thus
// share a schema during a rolling upgrade, before or after the migration.
//
// # Group commit
//
// Every request is two writes (reserve, then complete), each with its own
// commit, and on a small machine that per-transaction cost bounds the
// store. So Reserve, Complete, Release, Escalate and Extend (not
// CompleteTx, which runs in the caller's transaction, nor Takeover,
// Resolve, Delete or the IfExpired variants, which lock first in a
// transaction of their own) go through a queue. A call that finds the
// store idle runs at once, alone, as without batching: a lone request pays
// nothing extra. Calls that arrive while it runs queue up, and when it
// ends they are sent together as one pipeline (pgx SendBatch: one round
// trip) in a transaction that BEGIN opens, and a COMMIT follows once every
// statement has answered. The calls go in rounds of distinct keys (the calls of one key
// keep their order, one round after another). A round's Reserves are one
// multi-row INSERT … ON CONFLICT DO NOTHING over arrays of their values,
// which also reads the existing record of each key it did not insert, so
// that no call needs a second round trip; its Completes are one multi-row
// UPDATE fenced on each record's token; Release, Escalate and Extend run
// the statement they run alone. The server then pays one statement's
// overhead per round rather than per call. The Reserves go first and each
// statement takes its rows in key order, so that batches from several
// processes lock rows in one order. There is no timer: a batch is what
// queued during the previous one.
//
// Every caller gets its own outcome: two Reserves of one key in one batch
// see what they would see one after the other (one wins, the other gets
// the pending record), and a fenced change that matches nothing returns
// idemstore.ErrLeaseLost without touching the others. A statement the
// server refuses rolls the whole batch back: a conflict or an unusable
// connection fails every member with the same idemstore.ErrRetryable or
// idemstore.ErrUnavailable, and any other refusal (a value the server does
// not take, which may be one call's fault) makes each member run again
// alone. A batch whose outcome is unknown (the connection broke after its
// COMMIT was sent) fails every member with idemstore.ErrUnavailable, never
// ErrRetryable: nobody is told "acquired" or "done" unless the batch
// committed, nor "nothing changed" unless that is sure. A caller whose
// context ends while its call is queued takes it out (nothing is written);
// once its batch has been sent it gets the context's error and the batch
// goes on. If the batch commits that caller's reservation, the batch
// releases it, fenced, before it answers the others or the next batch
// runs: the caller's own release of the token, which the contract asks
// for, is bounded and may give up while the batch waits for a lock. When
// every member has left, the batch's connection is dropped before its
// COMMIT, and nothing it wrote commits.
//
// Config.DisableBatch (or batch=off in the idem CLI's store URL) turns
// batching off.
//
// Native errors become the idemstore sentinels: serialization failures and
// deadlocks are idemstore.ErrRetryable, connection failures
// idemstore.ErrUnavailable, context errors stay context errors.
package idempg
