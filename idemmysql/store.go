package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

var _ idemstore.Store = (*Store)(nil)

// Column limits, in bytes. The primary key (scope, operation, key) must fit
// InnoDB's 3072-byte index limit.
const (
	MaxScopeLen       = idemstore.MaxScopeLength
	MaxOperationLen   = idemstore.MaxOperationLength
	MaxKeyLen         = idemstore.MaxKeyLength
	MaxFingerprintLen = 512
	MaxTokenLen       = 255
	MaxReasonLen      = 65535
)

// Config configures a Store. The zero value is ready to use against a
// database that has already been migrated.
type Config struct {
	// Migrate makes New run Migrate before returning (with a one-minute
	// timeout). Production deployments usually migrate once, from a deploy
	// step (the idem migrate command), and leave this off. Defaults to false.
	Migrate bool

	// ReserveRetries is how many times Reserve repeats an insert that the
	// server aborted for contention (deadlock 1213 or lock wait timeout
	// 1205, which change nothing). Defaults to 3.
	ReserveRetries int

	// MigrateLockTimeout bounds how long Migrate waits for another migrator
	// to finish (GET_LOCK). Defaults to 60s.
	MigrateLockTimeout time.Duration

	// DisableBatch turns group commit off: every Reserve, Complete,
	// Release, Escalate and Extend then runs as its own autocommit
	// statement. With batching on, calls that arrive while others are
	// being written queue up, and the next batch writes them all in one
	// transaction with a few multi-row statements (see the package
	// documentation); a call that finds the store idle runs alone, as
	// without batching. The store URL parameter batch=off sets it.
	// Defaults to false: batching on.
	DisableBatch bool
}

func (c Config) withDefaults() Config {
	if c.ReserveRetries == 0 {
		c.ReserveRetries = 3
	}
	if c.MigrateLockTimeout == 0 {
		c.MigrateLockTimeout = time.Minute
	}
	return c
}

func (c Config) validate() error {
	if c.ReserveRetries < 0 {
		return fmt.Errorf("idemmysql: ReserveRetries %d is negative", c.ReserveRetries)
	}
	if c.MigrateLockTimeout < time.Second {
		return fmt.Errorf("idemmysql: MigrateLockTimeout %v is under a second", c.MigrateLockTimeout)
	}
	return nil
}

// Store is the MySQL/MariaDB idemstore.Store. It is safe for concurrent use.
type Store struct {
	db    *sql.DB
	cfg   Config
	batch *groupcommit.Batcher // nil with Config.DisableBatch
}

// New returns a Store that keeps its records in the idem_records table of
// db's database. db stays the caller's. New does not touch the database
// unless cfg.Migrate is true.
//
// db's DSN needs no special parameters: times are stored as Unix
// milliseconds of the server's UTC clock, so parseTime, loc and the
// session time_zone do not matter; every statement is sent alone, so
// multiStatements is not needed; and fenced changes are correct whether
// clientFoundRows reports matched or changed rows.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("idemmysql: nil db")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Migrate {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := Migrate(ctx, db, cfg); err != nil {
			return nil, err
		}
	}
	s := &Store{db: db, cfg: cfg}
	if !cfg.DisableBatch {
		s.batch = groupcommit.New(groupcommit.Config{Single: s.alone().Run, Batch: s.runBatch})
	}
	return s, nil
}

// BatchStats reports what group commit has done since the store was made:
// batches, the calls they carried, and calls that ran alone. ok is false
// with Config.DisableBatch.
func (s *Store) BatchStats() (stats idemstore.BatchStats, ok bool) { return s.batch.Report() }

// Capabilities reports that the store offers CompleteTx and searches. It
// has no Notifier: the engine's waiters poll with backoff.
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{TransactionalComplete: true, Notify: false, Search: true}
}

// checkKey rejects keys that do not fit the table's columns, with an error
// that says which part is too long.
func checkKey(k idemstore.Key) error {
	switch {
	case len(k.Scope) > MaxScopeLen:
		return fmt.Errorf("idemmysql: scope is %d bytes, at most %d fit", len(k.Scope), MaxScopeLen)
	case len(k.Operation) > MaxOperationLen:
		return fmt.Errorf("idemmysql: operation is %d bytes, at most %d fit", len(k.Operation), MaxOperationLen)
	case len(k.Key) > MaxKeyLen:
		return fmt.Errorf("idemmysql: key is %d bytes, at most %d fit", len(k.Key), MaxKeyLen)
	}
	return nil
}
