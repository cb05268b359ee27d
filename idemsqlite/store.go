package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

var _ idemstore.Store = (*Store)(nil)

// Store is an idemstore.Store kept in one SQLite database file. It is safe
// for concurrent use by many goroutines and by several processes sharing the
// file (open it with Open in each).
type Store struct {
	db    *sql.DB
	q     dbQuerier // db, through prepared statements
	cfg   Config
	batch *groupcommit.Batcher // nil with Config.DisableBatch
}

// New returns a Store over db, which the caller opened (preferably with
// Open) and still owns: closing the Store is closing db. Unless
// cfg.SkipMigrate is set, New brings the schema up to date first.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errorf("New: nil *sql.DB")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if !cfg.SkipMigrate {
		if err := Migrate(context.Background(), db); err != nil {
			return nil, err
		}
	}
	s := &Store{db: db, q: dbQuerier{&stmtCache{db: db}}, cfg: cfg}
	if !cfg.DisableBatch {
		s.batch = groupcommit.New(groupcommit.Config{Single: s.calls(s.q).Run, Batch: s.runBatch})
	}
	return s, nil
}

// BatchStats reports what group commit has done since the store was made:
// batches, the calls they carried, and calls that ran alone. ok is false
// with Config.DisableBatch.
func (s *Store) BatchStats() (stats idemstore.BatchStats, ok bool) { return s.batch.Report() }

// Capabilities reports that the store offers CompleteTx and searches. It
// cannot wake waiters in other processes, so it does not implement
// idemstore.Notifier.
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{TransactionalComplete: true, Search: true}
}

// nullString is s, or NULL when it is empty.
func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

// recordColumns is the column list scanRecord reads, in order.
const recordColumns = `scope, operation, "key", fingerprint, state, token, lease_until, response, reason, created_at, expires_at, updated_at, request, scope_label`

// rowScanner is *sql.Row or *sql.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}

// scanRecord reads one row selected with recordColumns, read at now.
func scanRecord(r rowScanner, now time.Time) (*idemstore.Record, error) {
	var (
		rec                              idemstore.Record
		state                            string
		leaseUntil, createdAt, updatedAt int64
		expiresAt                        sql.NullInt64
		response, request                []byte
		label                            sql.NullString
	)
	if err := r.Scan(&rec.Key.Scope, &rec.Key.Operation, &rec.Key.Key, &rec.Fingerprint, &state, &rec.Token,
		&leaseUntil, &response, &rec.Reason, &createdAt, &expiresAt, &updatedAt, &request, &label); err != nil {
		return nil, err
	}
	rec.ScopeLabel = label.String
	rec.State = idemstore.State(state)
	rec.LeaseUntil = fromMillis(leaseUntil)
	rec.CreatedAt = fromMillis(createdAt)
	rec.UpdatedAt = fromMillis(updatedAt)
	rec.ReadAt = now.UTC().Truncate(time.Millisecond)
	req, err := idemstore.DecodeRequest(request)
	if err != nil {
		return nil, err
	}
	rec.Request = req
	if expiresAt.Valid {
		rec.ExpiresAt = fromMillis(expiresAt.Int64)
	}
	resp, err := idemstore.DecodeResponse(response)
	if err != nil {
		return nil, err
	}
	rec.Response = resp
	return &rec, nil
}

// Get returns the record for key, or idemstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	return s.get(ctx, s.q, key)
}

// get reads the record for key through q: the store's database, or a
// batch's transaction.
func (s *Store) get(ctx context.Context, q querier, key idemstore.Key) (*idemstore.Record, error) {
	now := s.now() // taken before the read: a lease expiring meanwhile still counts as alive
	row := q.QueryRowContext(ctx, `SELECT `+recordColumns+` FROM idem_records
		WHERE scope = ? AND operation = ? AND "key" = ?`, key.Scope, key.Operation, key.Key)
	rec, err := scanRecord(row, now)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, idemstore.ErrNotFound
	}
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	return rec, nil
}

// now is the store's clock.
func (s *Store) now() time.Time { return s.cfg.Now() }

// millis turns t into the unix milliseconds stored in the time columns. The
// zero time is stored as 0.
func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// fromMillis reverses millis, in UTC.
func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}
