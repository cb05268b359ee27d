package idemsqlite_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// writeLock is a batchtest.Hold: a transaction that holds the database's
// write lock (BEGIN IMMEDIATE), so that every write waits under
// busy_timeout.
type writeLock struct {
	db *sql.DB
	tx *sql.Tx
}

// holdWriteLock returns a batchtest.Holder that takes db's write lock,
// whatever the key.
func holdWriteLock(db *sql.DB) batchtest.Holder {
	return func(t testing.TB, _ idemstore.Key) batchtest.Hold {
		tx, err := db.BeginTx(t.Context(), nil) // BEGIN IMMEDIATE (see Open)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		return &writeLock{db: db, tx: tx}
	}
}

// Waiter returns once a second connection is in use beside the lock's: the
// waiting statement has its own, and waits for the lock on it.
func (w *writeLock) Waiter(t testing.TB) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for w.db.Stats().InUse < 2 {
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal("nothing waited for the write lock")
		}
	}
}

func (w *writeLock) Unblock(t testing.TB) {
	t.Helper()
	if err := w.tx.Rollback(); err != nil {
		t.Fatal(err)
	}
}

// Settled has nothing to wait for: SQLite runs a statement on its caller's
// goroutine, and the call that waited has returned.
func (w *writeLock) Settled(testing.TB) {}

func (w *writeLock) Kill(t testing.TB) { t.Fatal("a SQLite connection cannot be ended from outside") }

// TestCancelledLoneBeginLandsNoOrphan ends Begin's context while its
// Reserve waits under busy_timeout for the write lock. On PostgreSQL and
// MySQL the server could still commit such an insert after the engine's
// release (see their cancel_attack_test.go). SQLite runs in the caller's
// process: modernc.org/sqlite runs the statement on the calling goroutine
// and, when the context ends, interrupts it, so Reserve returns only once
// SQLite has stopped the statement (rolling back its implicit
// transaction) or finished it; nothing is left running to commit later.
func TestCancelledLoneBeginLandsNoOrphan(t *testing.T) {
	t.Parallel()
	for _, mode := range batchModes {
		for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
			t.Run(mode.name+"/"+kind.String(), func(t *testing.T) {
				t.Parallel()
				s, db := newStoreWith(t, mode.cfg)
				batchtest.CancelledBegin(t, s, kind, holdWriteLock(db))
			})
		}
	}
}

// TestCancelledBatchedBeginLandsNoOrphan: a batch, unlike a lone call,
// goes on when one of its members leaves; the batch releases that member's
// reservation (see groupcommit's left.go).
func TestCancelledBatchedBeginLandsNoOrphan(t *testing.T) {
	t.Parallel()
	s, db := newStoreWith(t, idemsqlite.Config{})
	batchtest.CancelledBatchedBegin(t, s, s.Batcher(), holdWriteLock(db))
}
