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
// and returned. Neither INSERT IGNORE (which hides other errors) nor
// SELECT … FOR UPDATE (which takes gap locks and deadlocks under REPEATABLE
// READ) is used. Every later change is fenced by the lease token.
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
// of prepare, execute and close.
//
// The store has no Notifier: the engine's waiters poll with backoff.
//
// Native errors become the idemstore sentinels: deadlocks (1213) and lock
// wait timeouts (1205) are idemstore.ErrRetryable, connection failures
// idemstore.ErrUnavailable, context errors stay context errors.
package idemmysql
