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
package idemsqlite
