// Package reserve reserves an idempotency key the way that lets duplicates
// through.
package reserve

// Queries runs, in order, a lock on a row that may not exist and the
// insert that was meant to be guarded by it.
func Queries() []string {
	return []string{
		`SELECT state FROM idempotency_keys WHERE key = $1 FOR UPDATE`,
		`INSERT INTO idempotency_keys (key, state) VALUES ($1, 'pending')`,
	}
}
