package storeurl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemredis"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// Options configures Open.
type Options struct {
	// Migrate brings the schema up to date once the store is reachable
	// (SQLite, PostgreSQL, MySQL; Redis needs none). Defaults to false.
	Migrate bool

	// Lazy makes Open return at once, even when the backend cannot be
	// reached: the store then connects (and migrates) in the background,
	// retrying, and every call made before it is ready fails with an error
	// wrapping idemstore.ErrUnavailable. Defaults to false: Open connects
	// first and returns its error.
	Lazy bool

	// RetryInterval is the longest pause between background connection
	// attempts of a Lazy store. Defaults to 5s.
	RetryInterval time.Duration

	// Logger receives connection attempts of a Lazy store, with the URL
	// redacted, and the store's own warnings (a Redis maxmemory-policy that
	// could not be verified). Defaults to slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.RetryInterval == 0 {
		o.RetryInterval = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Open turns rawURL into a store. The returned close function releases
// everything Open created (pools, clients, the background connector); call
// it after the last use of the store.
//
// A malformed URL always fails here. An unreachable backend fails here too,
// with an error wrapping idemstore.ErrUnavailable, unless opts.Lazy is set.
func Open(ctx context.Context, rawURL string, opts Options) (idemstore.Store, func() error, error) {
	t, err := Parse(rawURL)
	if err != nil {
		return nil, nil, err
	}
	opts = opts.withDefaults()
	t.logger = opts.Logger
	if opts.Lazy {
		l := newLazy(t, opts)
		return l, l.close, nil
	}
	return t.Connect(ctx, opts.Migrate)
}

// Connect opens the store t names, checks that it answers, and migrates it
// when migrate is true.
func (t *Target) Connect(ctx context.Context, migrate bool) (idemstore.Store, func() error, error) {
	s, closeFn, err := t.connect(ctx, migrate)
	if err != nil {
		err = fmt.Errorf("store %s: %w", t.Redacted, err)
		if !errors.Is(err, idemstore.ErrUnavailable) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", idemstore.ErrUnavailable, err)
		}
	}
	return s, closeFn, err
}

func (t *Target) connect(ctx context.Context, migrate bool) (idemstore.Store, func() error, error) {
	switch t.Kind {
	case KindMemory:
		s, err := idemmem.New(t.mem)
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	case KindSQLite:
		db, err := idemsqlite.Open(t.sqlitePath, t.sqliteOpts)
		if err != nil {
			return nil, nil, err
		}
		s, err := idemsqlite.New(db, idemsqlite.Config{SkipMigrate: !migrate, DisableBatch: t.batchOff})
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return s, db.Close, nil
	case KindPostgres:
		pool, err := pgxpool.NewWithConfig(ctx, t.pg.Copy())
		if err != nil {
			return nil, nil, err
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, nil, err
		}
		cfg := idempg.Config{Schema: t.pgSchema, DisableBatch: t.batchOff}
		if migrate {
			if err := idempg.Migrate(ctx, pool, cfg); err != nil {
				pool.Close()
				return nil, nil, err
			}
		}
		s, err := idempg.New(pool, cfg)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, func() error { s.Close(); pool.Close(); return nil }, nil
	case KindMySQL:
		db := sql.OpenDB(mustConnector(t.my))
		if err := db.PingContext(ctx); err != nil {
			db.Close()
			return nil, nil, err
		}
		s, err := openMySQL(ctx, db, migrate, t.batchOff)
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return s, db.Close, nil
	case KindRedis, KindRedisCluster:
		c, cfg, err := t.redisClient()
		if err != nil {
			return nil, nil, err
		}
		s, err := idemredis.New(c, cfg)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return s, func() error { c.Close(); return nil }, nil
	}
	return nil, nil, fmt.Errorf("unknown store kind %q", t.Kind)
}

// Capabilities returns what the store t names can do, known without
// connecting: what the store itself reports once open.
func (t *Target) Capabilities() idemstore.Capabilities {
	switch t.Kind {
	case KindRedis, KindRedisCluster, KindMemory:
		return idemstore.Capabilities{Notify: true, Search: true}
	case KindPostgres:
		return idemstore.Capabilities{TransactionalComplete: true, Notify: true, Search: true}
	default:
		return idemstore.Capabilities{TransactionalComplete: true, Search: true}
	}
}

func mustConnector(cfg *mysql.Config) *mysqlConnector {
	return &mysqlConnector{cfg: cfg.Clone()}
}
