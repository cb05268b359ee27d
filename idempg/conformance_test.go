package idempg_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemstore/idemstoretest"
)

// batchModes are the two ways the store runs, each of which the
// conformance suite checks: group commit on (the default) and off.
var batchModes = []struct {
	name string
	cfg  idempg.Config
}{
	{"batch=on", idempg.Config{}},
	{"batch=off", idempg.Config{DisableBatch: true}},
}

func TestConformance(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			exercise(t, pool, mode.cfg)
		})
	}
}

// exercise runs the store conformance suite on stores of cfg in pool.
func exercise(t *testing.T, pool *pgxpool.Pool, cfg idempg.Config) {
	idemstoretest.Exercise(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store { return newStore(t, pool, cfg) },
		Unavailable: func(t *testing.T) idemstore.Store {
			s, err := idempg.New(closedPortPool(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Tx: func(t *testing.T) idemstoretest.TxHarness { return txHarness(t, pool, cfg) },
	})
}

// txHarness runs the suite's business transactions on pool: a table of
// business rows next to a store's records, in the store's own schema.
func txHarness(t *testing.T, pool *pgxpool.Pool, cfg idempg.Config) idemstoretest.TxHarness {
	s, schema := newStoreIn(t, pool, cfg)
	table := pgx.Identifier{schema, "business"}.Sanitize()
	if _, err := pool.Exec(t.Context(), "CREATE TABLE "+table+" (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	return idemstoretest.TxHarness{
		Store:  s,
		Levels: []string{"read committed", "repeatable read", "serializable"},
		Run: func(ctx context.Context, level string, lease idemstore.TxLease, resp *idemstore.Response, id string, commit bool, between func()) error {
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.TxIsoLevel(level)})
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ($1)", id); err != nil {
				return err
			}
			if between != nil {
				between()
			}
			if err := s.CompleteTx(ctx, tx, lease, resp); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback(ctx)
			}
			return tx.Commit(ctx)
		},
		Committed: func(ctx context.Context, id string) (bool, error) {
			err := pool.QueryRow(ctx, "SELECT FROM "+table+" WHERE id = $1", id).Scan()
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			return err == nil, err
		},
	}
}

// TestConcurrencyIsolationLevels races reservations with every session
// defaulting to each isolation level: the unique constraint must hold at all
// of them.
func TestConcurrencyIsolationLevels(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			pool := testPool(t, level)
			for _, mode := range batchModes {
				t.Run(mode.name, func(t *testing.T) {
					idemstoretest.ExerciseConcurrency(t, idemstoretest.Harness{
						New: func(t *testing.T) idemstore.Store { return newStore(t, pool, mode.cfg) },
					})
				})
			}
		})
	}
}
