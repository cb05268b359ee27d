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
	db := openDB(t, idemsqlite.OpenOptions{})
	s, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

func TestConformance(t *testing.T) {
	t.Parallel()
	idemstoretest.Exercise(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store {
			s, _ := newStore(t)
			return s
		},
		Unavailable: func(t *testing.T) idemstore.Store {
			s, db := newStore(t)
			db.Close()
			return s
		},
	})
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
