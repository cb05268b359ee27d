// Package idemmysql keeps idem's idempotency records in MySQL or MariaDB,
// through database/sql and github.com/go-sql-driver/mysql. It is tested on
// MariaDB 10.11.
//
// Start with [New], which takes your own *sql.DB and a [Config], and
// [Migrate], which creates the idem_records table in db's database (run it
// from a deploy step, the idem migrate command, or set Config.Migrate):
//
//	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/app")
//	if err := idemmysql.Migrate(ctx, db, idemmysql.Config{}); err != nil { ... }
//	store, err := idemmysql.New(db, idemmysql.Config{})
//	eng, err := idem.NewEngine(store, idem.EngineConfig{})
//
// Reservations are plain INSERTs against the primary key (scope, operation,
// key); a duplicate key (1062) means the key exists and its record is read
// and returned. Every later change is fenced by the lease token. A call
// that runs alone uses neither INSERT IGNORE (which hides other errors) nor
// SELECT … FOR UPDATE (which takes gap locks and deadlocks under
// REPEATABLE READ); batches use both, safely, as described below.
//
// [Store.CompleteTx] stores the answer inside your own *sql.Tx, next to the
// business change it describes: both commit, or neither does.
//
// Key columns are VARBINARY, compared byte for byte, and sized so that the
// primary key fits InnoDB's 3072-byte index limit: longer scopes,
// operations or keys (see MaxScopeLen, MaxOperationLen, MaxKeyLen) are
// rejected with an error saying so.
//
// Time belongs to the server. Times are stored as Unix milliseconds taken
// from the server's clock (UTC_TIMESTAMP, whatever the session time zone),
// in the statement that writes them: callers pass lease and retention
// durations, and every expiry (Takeover, Release and Escalate with
// IfExpired, ListExpiredLeases, Purge) is judged on that clock in the
// statement that acts. Records carry ReadAt, the server's clock at the
// read. The clocks of the processes sharing the database do not matter.
//
// The DSN needs no special parameters. interpolateParams=true is worth
// setting for throughput: each statement then takes one round trip instead
// of prepare, execute and close. It escapes on the client, so it is unsafe
// with a multi-byte charset such as GBK or SJIS. The idem CLI's mysql://
// store URLs set it unless the DSN sets it itself or names another charset
// than UTF-8, latin1, ascii or binary.
//
// The store has no Notifier: the engine's waiters poll with backoff.
//
// # Group commit
//
// Every request is two writes (reserve, then complete), each with its own
// commit and round trips, and on a small machine that per-statement cost
// bounds the store. So Reserve, Complete, Release, Escalate and Extend (not
// CompleteTx, which runs in the caller's transaction, nor Takeover,
// Resolve, Delete or the IfExpired variants) go through a queue. A call
// that finds the store idle runs at once, alone, as without batching: a
// lone request pays nothing extra. Calls that arrive while it runs queue
// up, and when it ends they are written together in one transaction, in
// key order and in rounds of distinct keys, each round in a few multi-row
// statements whatever its size: one INSERT IGNORE of the new reservations
// (inputs are checked before they queue, so IGNORE can only skip a
// duplicate key; when rows were skipped, one read tells which records
// carry the Reserve's own token — every Reserve offers a fresh token — and
// returns the others' existing records), and one UPDATE or DELETE per kind
// of fenced change, conditioned on every record being pending under its
// token (the Completes' UPDATE joins a derived table of their keys on the
// primary key, which spares the server's range optimizer one index dive
// per call). When a change matches fewer records than it was given (a lease
// was lost), the transaction rolls back and the batch runs again locking
// first: in a READ COMMITTED transaction, a SELECT … FOR UPDATE of the
// records the fenced changes aim at (which at READ COMMITTED locks only
// the rows it finds, no gaps) tells which changes lost their lease, and
// the others are applied to their still locked rows. There is no timer: a
// batch is what queued during the previous one. Calls carrying a body over
// 256 KiB run alone, so that a value over the server's max_allowed_packet
// fails only its own call.
//
// Every caller gets its own outcome: two Reserves of one key in one batch
// see what they would see one after the other (one wins, the other gets
// the pending record). A statement that fails rolls the whole batch back:
// a deadlock, a lock wait timeout or a broken connection fails every
// member with the same idemstore.ErrRetryable or idemstore.ErrUnavailable,
// and any other refusal (which may be one call's fault) makes each member
// run again alone. A COMMIT whose reply is lost fails every member with
// idemstore.ErrUnavailable, never ErrRetryable: nobody is told "acquired"
// or "done" unless the batch committed, nor "nothing changed" unless that
// is sure. A caller whose context ends while its call is queued takes it
// out (nothing is written); once its batch has started it gets the
// context's error and the batch goes on. If the batch commits that
// caller's reservation, the batch releases it, fenced, before it answers
// the others or the next batch runs: the caller's own release of the
// token, which the contract asks for, is bounded and may give up while the
// batch waits for a lock. When every member has left, the batch's
// connection is dropped before its COMMIT, and nothing it wrote commits.
// A Reserve or Takeover that runs alone does so in a transaction of its
// own for the same reason: its statement may wait for a lock, and one
// whose context ended meanwhile must not commit once the lock comes free.
//
// Config.DisableBatch (or batch=off in the idem CLI's store URL) turns
// batching off.
//
// Native errors become the idemstore sentinels: deadlocks (1213) and lock
// wait timeouts (1205) are idemstore.ErrRetryable, connection failures
// idemstore.ErrUnavailable, context errors stay context errors.
package idemmysql
