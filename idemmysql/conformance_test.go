package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemstore/idemstoretest"
)

// batchModes are the two ways the store runs, each of which the
// conformance suite checks: group commit on (the default) and off.
var batchModes = []struct {
	name string
	cfg  idemmysql.Config
}{
	{"batch=on", idemmysql.Config{}},
	{"batch=off", idemmysql.Config{DisableBatch: true}},
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			idemstoretest.Exercise(t, idemstoretest.Harness{
				New: func(t *testing.T) idemstore.Store {
					s, _ := newStoreWith(t, "", mode.cfg)
					return s
				},
				Unavailable: func(t *testing.T) idemstore.Store {
					s, err := idemmysql.New(closedPortDB(t), mode.cfg)
					if err != nil {
						t.Fatal(err)
					}
					return s
				},
				Tx: func(t *testing.T) idemstoretest.TxHarness { return txHarness(t, mode.cfg) },
			})
		})
	}
}

// txHarness runs the suite's business transactions on a table of the
// store's own database, through CompleteTx, at the isolation levels InnoDB
// offers (READ UNCOMMITTED aside).
func txHarness(t *testing.T, cfg idemmysql.Config) idemstoretest.TxHarness {
	s, db := newStoreWith(t, "", cfg)
	if _, err := db.ExecContext(t.Context(), "CREATE TABLE business (id VARBINARY(255) PRIMARY KEY) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	levels := make([]string, 0, len(isolationLevels))
	for name := range isolationLevels {
		levels = append(levels, name)
	}
	slices.Sort(levels)
	return idemstoretest.TxHarness{
		Store:  s,
		Levels: levels,
		Run: func(ctx context.Context, level string, lease idemstore.TxLease, resp *idemstore.Response, id string, commit bool, between func()) error {
			iso, ok := isolationLevels[level]
			if !ok {
				return fmt.Errorf("unknown isolation level %q", level)
			}
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }() // no-op after Commit
			if _, err := tx.ExecContext(ctx, "INSERT INTO business (id) VALUES (?)", id); err != nil {
				return err
			}
			if between != nil {
				between()
			}
			if err := s.CompleteTx(ctx, tx, lease, resp); err != nil {
				return err
			}
			if commit {
				return tx.Commit()
			}
			return tx.Rollback()
		},
		Committed: func(ctx context.Context, id string) (bool, error) {
			var one int
			err := db.QueryRowContext(ctx, "SELECT 1 FROM business WHERE id = ?", id).Scan(&one)
			if errors.Is(err, sql.ErrNoRows) {
				return false, nil
			}
			return err == nil, err
		},
	}
}

// TestConcurrencyIsolationLevels races reservations with sessions at
// REPEATABLE READ (InnoDB's default, where SELECT … FOR UPDATE designs
// deadlock on gap locks) and READ COMMITTED.
func TestConcurrencyIsolationLevels(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"REPEATABLE-READ", "READ-COMMITTED"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			for _, mode := range batchModes {
				t.Run(mode.name, func(t *testing.T) {
					idemstoretest.ExerciseConcurrency(t, idemstoretest.Harness{
						New: func(t *testing.T) idemstore.Store {
							s, db := newStoreWith(t, level, mode.cfg)
							var got string
							if err := db.QueryRowContext(t.Context(), "SELECT @@tx_isolation").Scan(&got); err != nil || got != level {
								t.Fatalf("session isolation = %q, %v; want %s", got, err, level)
							}
							return s
						},
					})
				})
			}
		})
	}
}
