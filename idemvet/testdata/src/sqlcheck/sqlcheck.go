// Package sqlcheck reserves keys in SQL, rightly and wrongly.
package sqlcheck

import (
	"context"
	"database/sql"
)

const insertKey = `INSERT INTO idempotency_keys (scope, key, fingerprint) VALUES ($1, $2, $3)`

// LockThenInsert locks a row that may not exist, then inserts it.
func LockThenInsert(ctx context.Context, tx *sql.Tx, key string) error {
	var n int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM idempotency_keys WHERE key = $1 FOR UPDATE`, key).Scan(&n) // want `SELECT … FOR UPDATE on idempotency_keys before INSERT into it: .*why-insert-first.md`
	if err == sql.ErrNoRows {
		_, err = tx.ExecContext(ctx, insertKey, "s", key, "f")
	}
	return err
}

// LockThenInsertOtherTable: the same mistake on any table.
func LockThenInsertOtherTable(ctx context.Context, tx *sql.Tx) error {
	q := "SELECT id FROM public.\"Reservations\" " + // want `SELECT … FOR NO KEY UPDATE on reservations before INSERT into it`
		"WHERE ref = $1 FOR NO KEY UPDATE"
	if _, err := tx.ExecContext(ctx, q, "r"); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO reservations (ref) VALUES ($1) ON CONFLICT DO NOTHING", "r")
	return err
}

// MySQLLock: FOR UPDATE on InnoDB takes gap locks and deadlocks.
func MySQLLock(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, "SELECT * FROM `idem_keys` WHERE k = ? FOR UPDATE"); err != nil { // want `SELECT … FOR UPDATE on idem_keys before INSERT`
		return err
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO idem_keys (k) VALUES (?) ON DUPLICATE KEY UPDATE k = k")
	return err
}

// CheckThenInsert reads first, then inserts without a conflict clause.
func CheckThenInsert(ctx context.Context, db *sql.DB, key string) error {
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM idempotency_keys WHERE key = $1", key).Scan(&n); err != nil { // want `check-then-insert on idempotency_keys: .*why-insert-first.md`
		return err
	}
	if n > 0 {
		return nil
	}
	_, err := db.ExecContext(ctx, insertKey, "s", key, "f")
	return err
}

// InsertFirst is the right way: insert, and read only on conflict.
func InsertFirst(ctx context.Context, db *sql.DB, key string) error {
	res, err := db.ExecContext(ctx, `INSERT INTO idempotency_keys (scope, key) VALUES ($1, $2) ON CONFLICT DO NOTHING`, "s", key)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var state string
		return db.QueryRowContext(ctx, `SELECT state FROM idempotency_keys WHERE scope = $1 AND key = $2`, "s", key).Scan(&state)
	}
	return nil
}

// ReadFastPathThenUpsert: a read before an INSERT that settles conflicts
// itself is a harmless fast path.
func ReadFastPathThenUpsert(ctx context.Context, db *sql.DB, key string) error {
	var state string
	if err := db.QueryRowContext(ctx, `SELECT state FROM idempotency_keys WHERE key = $1`, key).Scan(&state); err == nil {
		return nil
	}
	_, err := db.ExecContext(ctx, `INSERT INTO idempotency_keys (key) VALUES ($1) ON CONFLICT (key) DO NOTHING`, key)
	return err
}

// CheckThenInsertOtherTable: check-then-insert is only reported on
// idempotency tables; orders have their own unique constraints.
func CheckThenInsertOtherTable(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `SELECT 1 FROM orders WHERE ref = $1`, "r"); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, `INSERT INTO orders (ref) VALUES ($1)`, "r")
	return err
}

// LockExistingRow: FOR UPDATE on a row that exists, then an UPDATE, is how
// a guarded state transition is written.
func LockExistingRow(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, `SELECT state FROM orders WHERE id = $1 FOR UPDATE`, 1); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `UPDATE orders SET state = 'paid' WHERE id = $1`, 1)
	return err
}

// InsertBeforeLock: the INSERT comes first.
func InsertBeforeLock(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, insertKey, "s", "k", "f"); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `SELECT * FROM idempotency_keys WHERE key = $1 FOR UPDATE`, "k")
	return err
}

// SeparateClosures: each function literal is judged on its own.
func SeparateClosures(ctx context.Context, tx *sql.Tx) []func() error {
	return []func() error{
		func() error {
			_, err := tx.ExecContext(ctx, `SELECT * FROM idempotency_keys WHERE key = $1 FOR UPDATE`, "k")
			return err
		},
		func() error {
			_, err := tx.ExecContext(ctx, insertKey, "s", "k", "f")
			return err
		},
	}
}

// OneString holds both statements; the comment and the quoted text do not
// count.
func OneString(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `-- INSERT INTO keys
		SELECT 'FOR UPDATE' FROM keys WHERE k = $1; /* FOR UPDATE */
		INSERT INTO keys (k) VALUES ($1)`)
	return err
}

// DashesInAString: "--" inside a string literal starts no comment, so the
// lock after it counts; a quote inside a comment starts no string.
func DashesInAString(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, "SELECT * FROM keys WHERE note = '--' AND k = $1 FOR UPDATE; -- don't\n"+ // want `SELECT … FOR UPDATE on keys before INSERT`
		"INSERT INTO keys (k) VALUES ($1)")
	return err
}

// CommentInAnIdentifier: "--" in a quoted table name is part of the name.
func CommentInAnIdentifier(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `SELECT * FROM "a--b" WHERE k = $1 FOR UPDATE; INSERT INTO "a--b" (k) VALUES ($1)`) // want `SELECT … FOR UPDATE on a--b before INSERT`
	return err
}

// LockedInOneString is the same mistake in one string.
func LockedInOneString(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `SELECT * FROM keys WHERE k = $1 FOR UPDATE; INSERT INTO keys (k) VALUES ($1)`) // want `SELECT … FOR UPDATE on keys before INSERT`
	return err
}

// Ignored says why.
func Ignored(ctx context.Context, tx *sql.Tx) error {
	//idem:ignore the row is created at sign-up and always exists here
	if _, err := tx.ExecContext(ctx, `SELECT * FROM idempotency_keys WHERE key = $1 FOR UPDATE`, "k"); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, insertKey, "s", "k", "f")
	return err
}

// NotSQL: strings that only look a little like SQL.
func NotSQL() []string {
	const local = "SELECT x FROM idempotency_keys FOR UPDATE"
	return []string{"please select from the menu", "insert coin", local}
}
