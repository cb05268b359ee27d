package idempg

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

var (
	_ idemstore.Store    = (*Store)(nil)
	_ idemstore.Notifier = (*Store)(nil)
)

// maxChannelLen is PostgreSQL's identifier limit (NAMEDATALEN - 1), which
// also bounds NOTIFY channel names.
const maxChannelLen = 63

// Config configures a Store. The zero value is ready to use against a
// schema that has already been migrated.
type Config struct {
	// Schema is the PostgreSQL schema that holds the store's tables
	// (idem_records, its side tables idem_leases and idem_waiters, and
	// idem_schema_migrations) and its idem_wake and idem_awaited
	// functions. Defaults to "public".
	Schema string

	// Migrate makes New run Migrate before returning (with a one-minute
	// timeout). Production deployments usually migrate once, from a deploy
	// step (the idem migrate command), and leave this off. Defaults to false.
	//
	// A store also runs against a schema that lacks the latest migration,
	// as during a rolling upgrade. Without migration 006, a batch's
	// completions check for waiters once per record instead of once per
	// statement (see the package documentation); a store keeps what it
	// found at its first batch of completions, so one made before
	// migration 006 was applied does so until it is made again.
	Migrate bool

	// Channel is the LISTEN/NOTIFY channel on which state changes are
	// announced to waiters. Stores sharing a schema must use the same
	// channel. At most 63 bytes. Defaults to "idem_" followed by Schema,
	// cut to 63 bytes.
	Channel string

	// DisableNotify turns off LISTEN/NOTIFY: state changes never call
	// pg_notify, Capabilities reports Notify false and Subscribe fails, so
	// the engine's waiters poll. Only records with a subscribed waiter are
	// announced (and completions by CompleteTx at REPEATABLE READ or
	// SERIALIZABLE, which cannot tell), so notifications cost little; this
	// is for servers or poolers without LISTEN support (e.g. PgBouncer in
	// transaction mode). Defaults to false (notifications on).
	DisableNotify bool

	// ReserveRetries is how many times Reserve repeats an insert that the
	// server aborted for contention (serialization failure or deadlock,
	// which change nothing). Defaults to 3.
	ReserveRetries int

	// ListenerRetry is the longest pause between attempts to re-establish
	// the listening connection after it dropped. Defaults to 5s.
	ListenerRetry time.Duration

	// DisableBatch turns group commit off: every Reserve, Complete,
	// Release, Escalate and Extend then runs as its own autocommit
	// statement. With batching on, calls that arrive while others are
	// being written queue up, and the next batch sends them all in one
	// pipeline that runs as one transaction (see the package
	// documentation); a call that finds the store idle runs alone, as
	// without batching. The store URL parameter batch=off sets it.
	// Defaults to false: batching on.
	DisableBatch bool
}

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.Channel == "" {
		c.Channel = "idem_" + c.Schema
		if len(c.Channel) > maxChannelLen {
			c.Channel = c.Channel[:maxChannelLen]
		}
	}
	if c.ReserveRetries == 0 {
		c.ReserveRetries = 3
	}
	if c.ListenerRetry == 0 {
		c.ListenerRetry = 5 * time.Second
	}
	return c
}

func (c Config) validate() error {
	if len(c.Schema) > maxChannelLen {
		return fmt.Errorf("idempg: schema name %q is longer than %d bytes", c.Schema, maxChannelLen)
	}
	if len(c.Channel) > maxChannelLen {
		return fmt.Errorf("idempg: channel name %q is longer than %d bytes", c.Channel, maxChannelLen)
	}
	if c.ReserveRetries < 0 {
		return fmt.Errorf("idempg: ReserveRetries %d is negative", c.ReserveRetries)
	}
	if c.ListenerRetry < 0 {
		return fmt.Errorf("idempg: ListenerRetry %v is negative", c.ListenerRetry)
	}
	return nil
}

// Store is the PostgreSQL idemstore.Store. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	cfg   Config
	q     queries
	l     *listener
	batch *groupcommit.Batcher // nil with Config.DisableBatch

	// awaited is whether the schema has migration 006 (idem_awaited), as
	// first read: awaitedUnknown until a batch with completions reads it
	// (or New migrated). See completeManySQL.
	awaited atomic.Int32

	statementBytes int // maxStatementBytes if 0; tests set it lower
}

// New returns a Store that keeps its records in cfg.Schema through pool. The
// pool stays the caller's: Close does not close it. New does not touch the
// database unless cfg.Migrate is true.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("idempg: nil pool")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Migrate {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := Migrate(ctx, pool, cfg); err != nil {
			return nil, err
		}
	}
	s := &Store{
		pool: pool,
		cfg:  cfg,
		q:    buildQueries(cfg.Schema, !cfg.DisableNotify),
	}
	if cfg.Migrate {
		s.awaited.Store(awaitedYes)
	}
	s.l = newListener(pool, cfg.Channel, cfg.ListenerRetry)
	if !cfg.DisableBatch {
		s.batch = groupcommit.New(groupcommit.Config{Single: s.alone().Run, Batch: s.runBatch})
	}
	return s, nil
}

// BatchStats reports what group commit has done since the store was made:
// batches, the calls they carried, and calls that ran alone. ok is false
// with Config.DisableBatch.
func (s *Store) BatchStats() (stats idemstore.BatchStats, ok bool) { return s.batch.Report() }

// Capabilities reports that the store offers CompleteTx and, unless
// Config.DisableNotify is set, LISTEN/NOTIFY wake-ups.
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{TransactionalComplete: true, Notify: !s.cfg.DisableNotify, Search: true}
}

// Close stops the listening connection, if Subscribe started one, and wakes
// every subscriber. It does not close the pool. Close is idempotent; after
// it, Subscribe fails but the other methods keep working.
func (s *Store) Close() error {
	s.l.close()
	return nil
}
