package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Synchronous is SQLite's synchronous setting: how hard a commit pushes its
// data to stable storage.
type Synchronous string

const (
	// SynchronousNormal syncs the write-ahead log at checkpoints only. In WAL
	// mode the database cannot be corrupted, but a power loss or OS crash can
	// roll back the last commits (never a process crash). The recommended
	// setting with WAL, and the default.
	SynchronousNormal Synchronous = "NORMAL"
	// SynchronousFull syncs the log on every commit, so a committed
	// reservation or completion survives a power loss, at the price of an
	// fsync per write.
	SynchronousFull Synchronous = "FULL"
)

// OpenOptions configures Open.
type OpenOptions struct {
	// BusyTimeout is how long a connection waits for another connection (in
	// this or another process) to release the write lock before giving up
	// with SQLITE_BUSY, which the store reports as idemstore.ErrRetryable.
	// Defaults to 5s.
	BusyTimeout time.Duration

	// Synchronous selects the durability of commits. Defaults to
	// SynchronousNormal.
	Synchronous Synchronous

	// MaxOpenConns bounds the pool (sql.DB.SetMaxOpenConns and
	// SetMaxIdleConns). SQLite runs one writer at a time whatever the pool
	// size; a small pool keeps waiting writers in database/sql's queue,
	// which is fair, instead of in SQLite's busy handler, which polls with
	// sleeps and can starve a writer past busy_timeout when hundreds of
	// connections contend. Extra connections serve concurrent readers.
	// Defaults to 8.
	MaxOpenConns int
}

func (o OpenOptions) withDefaults() OpenOptions {
	if o.BusyTimeout == 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if o.Synchronous == "" {
		o.Synchronous = SynchronousNormal
	}
	if o.MaxOpenConns == 0 {
		o.MaxOpenConns = 8
	}
	return o
}

func (o OpenOptions) validate() error {
	if o.BusyTimeout < 0 {
		return errorf("OpenOptions.BusyTimeout must not be negative, got %v", o.BusyTimeout)
	}
	switch o.Synchronous {
	case SynchronousNormal, SynchronousFull:
	default:
		return errorf("OpenOptions.Synchronous must be NORMAL or FULL, got %q", o.Synchronous)
	}
	if o.MaxOpenConns < 0 {
		return errorf("OpenOptions.MaxOpenConns must not be negative, got %d", o.MaxOpenConns)
	}
	return nil
}

// Open opens (creating if needed) the SQLite database file at path with the
// settings idem relies on, applied to every connection of the pool:
//
//   - journal_mode(WAL): readers do not block the writer nor the writer
//     readers, and several processes can share the file;
//   - busy_timeout (OpenOptions.BusyTimeout): a writer waits for the lock
//     held by another connection or process instead of failing at once;
//   - synchronous(NORMAL), or FULL (OpenOptions.Synchronous);
//   - foreign_keys(on), so an application's own tables in the same file
//     get the referential checks they declare;
//   - _txlock=immediate: every transaction begun with db.BeginTx starts
//     with BEGIN IMMEDIATE and takes the write lock up front, waiting under
//     busy_timeout. A deferred transaction that reads and then writes must
//     upgrade its lock mid-way, and in WAL mode that upgrade fails at once
//     with SQLITE_BUSY (busy_timeout does not apply) when another
//     connection wrote in between: a CompleteTx business transaction would
//     then fail spuriously under load.
//
// Open pings the database, so a path that cannot be opened fails here with
// an error wrapping idemstore.ErrUnavailable. The caller owns the returned
// *sql.DB and closes it; pass it to New.
func Open(path string, opts OpenOptions) (*sql.DB, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	dsn, err := buildDSN(path, opts)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(opts.MaxOpenConns)
	db.SetMaxIdleConns(opts.MaxOpenConns) // keep them: each new connection re-runs the pragmas
	ctx, cancel := context.WithTimeout(context.Background(), opts.BusyTimeout+5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, interpretError(ctx, err))
	}
	return db, nil
}

// buildDSN returns the modernc.org/sqlite data source name for path: the
// file name, then "?" and the query parameters. busy_timeout is listed first
// so that switching to WAL can itself wait for the lock.
func buildDSN(path string, opts OpenOptions) (string, error) {
	if path == "" {
		return "", errorf("empty database path")
	}
	if strings.ContainsAny(path, "?#") || strings.HasPrefix(path, "file:") {
		// The driver would read "?" as the start of the parameters, and
		// "file:" as a URI whose parameters we would have to merge.
		return "", errorf("database path %q must be a plain file name without '?', '#' or a file: prefix", path)
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(opts.BusyTimeout.Milliseconds(), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+string(opts.Synchronous)+")")
	q.Add("_pragma", "foreign_keys(on)")
	q.Set("_txlock", "immediate")
	return path + "?" + q.Encode(), nil
}

// errorf returns an error prefixed with the package name.
func errorf(format string, args ...any) error {
	return fmt.Errorf("idemsqlite: "+format, args...)
}
