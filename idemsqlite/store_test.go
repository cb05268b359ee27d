package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemstore/idemstoretest"
)

// openDB opens a fresh database file in t's temp directory, closed at
// cleanup.
func openDB(t testing.TB, opts idemsqlite.OpenOptions) *sql.DB {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// newStore returns a migrated store over a fresh database file.
func newStore(t testing.TB) (*idemsqlite.Store, *sql.DB) {
	t.Helper()
	return newStoreWith(t, idemsqlite.Config{})
}

// newStoreWith is newStore with cfg.
func newStoreWith(t testing.TB, cfg idemsqlite.Config) (*idemsqlite.Store, *sql.DB) {
	t.Helper()
	db := openDB(t, idemsqlite.OpenOptions{})
	s, err := idemsqlite.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

// batchModes are the two ways the store runs, each of which the
// conformance suite checks: group commit on (the default) and off.
var batchModes = []struct {
	name string
	cfg  idemsqlite.Config
}{
	{"batch=on", idemsqlite.Config{}},
	{"batch=off", idemsqlite.Config{DisableBatch: true}},
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			idemstoretest.Exercise(t, idemstoretest.Harness{
				New: func(t *testing.T) idemstore.Store {
					s, _ := newStoreWith(t, mode.cfg)
					return s
				},
				Unavailable: func(t *testing.T) idemstore.Store {
					s, db := newStoreWith(t, mode.cfg)
					db.Close()
					return s
				},
				Tx: func(t *testing.T) idemstoretest.TxHarness { return txHarness(t, mode.cfg) },
			})
		})
	}
}

// txHarness runs business transactions on a table beside the records. The
// store's Open makes every transaction BEGIN IMMEDIATE, so no other
// connection writes while one is open: between runs before it begins.
func txHarness(t *testing.T, cfg idemsqlite.Config) idemstoretest.TxHarness {
	s, db := newStoreWith(t, cfg)
	if _, err := db.Exec(`CREATE TABLE business (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return idemstoretest.TxHarness{
		Store:  s,
		Levels: []string{"serializable"},
		Run: func(ctx context.Context, level string, lease idemstore.TxLease, resp *idemstore.Response, id string, commit bool, between func()) error {
			if between != nil {
				between()
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, `INSERT INTO business (id) VALUES (?)`, id); err != nil {
				return err
			}
			if err := s.CompleteTx(ctx, tx, lease, resp); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback()
			}
			return tx.Commit()
		},
		Committed: func(ctx context.Context, id string) (bool, error) {
			var n int
			err := db.QueryRowContext(ctx, `SELECT count(*) FROM business WHERE id = ?`, id).Scan(&n)
			return n == 1, err
		},
	}
}

func TestNewRejectsNilDB(t *testing.T) {
	t.Parallel()
	if _, err := idemsqlite.New(nil, idemsqlite.Config{}); err == nil {
		t.Fatal("New(nil) succeeded")
	}
}

func TestCapabilities(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	c := s.Capabilities()
	if !c.TransactionalComplete || c.Notify {
		t.Fatalf("Capabilities() = %+v", c)
	}
	if _, ok := any(s).(idemstore.Notifier); ok != c.Notify {
		t.Fatalf("Notifier implemented = %v, Capabilities.Notify = %v", ok, c.Notify)
	}
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: idemstore.Key{Scope: "s", Operation: "o", Key: "k"}, Token: "t"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve with cancelled ctx: %v", err)
	}
}
