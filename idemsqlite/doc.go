// Package idemsqlite keeps idem's idempotency records in a SQLite database
// file, using modernc.org/sqlite (pure Go, no cgo). It is the embedded
// default: nothing to start, and several processes on one machine can share
// the file.
//
// Start with [Open], which opens the file with the settings the store
// relies on (WAL, busy_timeout, synchronous, BEGIN IMMEDIATE transactions),
// then [New], which migrates the schema and returns a [Store] implementing
// idemstore.Store:
//
//	db, err := idemsqlite.Open("idem.db", idemsqlite.OpenOptions{})
//	...
//	defer db.Close()
//	store, err := idemsqlite.New(db, idemsqlite.Config{})
//
// To store an operation's answer in the same transaction as its business
// change, begin a transaction on the same *sql.DB and call
// [Store.CompleteTx] before committing.
//
// The schema lives in migrations/ and is embedded; [Migrate] applies it
// (New does so unless Config.SkipMigrate is set) and records each version in
// the idem_schema_migrations table. Records are in idem_records, keyed by
// (scope, operation, key), with times stored as unix milliseconds.
//
// Reservation is an INSERT … ON CONFLICT DO NOTHING against the primary
// key; every later change is a single UPDATE or DELETE fenced by
// state = 'pending' AND token = ?. Native errors are mapped to the
// idemstore sentinels: SQLITE_BUSY and SQLITE_LOCKED (after busy_timeout
// has waited) to idemstore.ErrRetryable, a closed database or an unusable
// file to idemstore.ErrUnavailable.
//
// # Group commit
//
// SQLite writes one transaction at a time, and on a small machine the cost
// of each commit, not the disk, bounds how many requests a second the
// store takes: every request is two writes (reserve, then complete). So
// Reserve, Complete, Release, Escalate and Extend (not CompleteTx, which
// runs in the caller's transaction, nor Takeover, Resolve, Delete or the
// IfExpired variants) go through a queue. A call that finds the store idle
// runs at once, alone, as its own statement: a lone request pays nothing
// extra. Calls that arrive while it runs queue up, and when it ends they
// are written together, in one BEGIN IMMEDIATE transaction, each by the
// same statement it would run alone, in key order; there is no timer, a
// batch is what queued during the previous one.
//
// Every caller gets its own outcome: two Reserves of one key in one batch
// see what they would see one after the other (one wins, the other gets
// the pending record), and a fenced change that matches nothing returns
// idemstore.ErrLeaseLost without touching the others. If a statement fails
// otherwise, the transaction rolls back: a busy or unusable database fails
// every member with the same idemstore.ErrRetryable or
// idemstore.ErrUnavailable, and any other error (a value the database
// refused, which may be one call's fault) makes each member run again
// alone, so that one bad call cannot fail the rest. A failed COMMIT is
// reported as idemstore.ErrUnavailable, never as ErrRetryable: nobody is
// told "acquired" or "done" unless the batch committed, nor "nothing
// changed" unless that is sure. A caller whose context ends while its
// call is queued takes it out (nothing is written); once its batch has
// started it gets the context's error and the batch goes on. If the batch
// commits that caller's reservation, the batch releases it, fenced, before
// it answers the others or the next batch runs: the caller's own release
// of the token is bounded and may give up while the batch waits for the
// write lock. A Reserve that runs alone needs no such care: SQLite runs
// the statement on the caller's goroutine and stops it when the context
// ends, so nothing is left running when Reserve returns.
//
// Config.DisableBatch (or batch=off in the idem CLI's store URL) turns
// batching off.
package idemsqlite
