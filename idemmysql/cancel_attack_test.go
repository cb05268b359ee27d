package idemmysql_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/dropproxy"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// These tests end a claim's context while its statement waits for a lock
// on the key (see batchtest.CancelledReserve and the checks beside it).
// go-sql-driver/mysql answers a context that ends mid-statement by closing
// the connection; the server does not notice until the statement is over.

// hold is a batchtest.Hold: a transaction of its own on db, on connection
// id, in database name; waiter is the connection that waits for it, once
// Waiter has seen it. (information_schema's InnoDB tables would say who
// waits for whom, but a busy server can take minutes to answer about
// them; the process list answers at once.)
type hold struct {
	db         *sql.DB
	tx         *sql.Tx
	name       string
	id, waiter int64
}

// holdGap returns a batchtest.Holder that locks, in a REPEATABLE READ
// transaction that stays open, the gap where the key's record would go
// (the key has none): an INSERT of the key waits, a DELETE does not.
func holdGap(db *sql.DB) batchtest.Holder {
	return func(t testing.TB, k idemstore.Key) batchtest.Hold {
		h := newHold(t, db, sql.LevelRepeatableRead)
		var n int
		err := h.tx.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM idem_records WHERE scope = ? AND operation = ? AND `key` = ? FOR UPDATE",
			k.Scope, k.Operation, k.Key).Scan(&n)
		if err != nil || n != 0 {
			t.Fatalf("locking the gap of %s: %d rows, %v", k.Key, n, err)
		}
		return h
	}
}

// holdRow returns a batchtest.Holder that locks the key's record FOR
// UPDATE in a transaction that stays open: any change of it waits.
func holdRow(db *sql.DB) batchtest.Holder {
	return func(t testing.TB, k idemstore.Key) batchtest.Hold {
		h := newHold(t, db, sql.LevelDefault)
		var n int
		err := h.tx.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM idem_records WHERE scope = ? AND operation = ? AND `key` = ? FOR UPDATE",
			k.Scope, k.Operation, k.Key).Scan(&n)
		if err != nil || n != 1 {
			t.Fatalf("locking the row of %s: %d rows, %v", k.Key, n, err)
		}
		return h
	}
}

// newHold begins the hold's transaction at isolation.
func newHold(t testing.TB, db *sql.DB, isolation sql.IsolationLevel) *hold {
	t.Helper()
	tx, err := db.BeginTx(t.Context(), &sql.TxOptions{Isolation: isolation})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	h := &hold{db: db, tx: tx}
	if err := tx.QueryRowContext(t.Context(), "SELECT CONNECTION_ID(), DATABASE()").Scan(&h.id, &h.name); err != nil {
		t.Fatal(err)
	}
	return h
}

// poll runs check every few milliseconds until it reports true, and
// fails the test with what if that takes longer than pollBound: a server
// that never gets there must fail this test, not hang the package until
// its timeout.
func poll(t testing.TB, what string, check func() bool) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	bound := time.NewTimer(pollBound)
	defer bound.Stop()
	for !check() {
		select {
		case <-tick.C:
		case <-bound.C:
			t.Fatalf("after %v: %s", pollBound, what)
		case <-t.Context().Done():
			t.Fatal(what)
		}
	}
}

// pollBound bounds poll: far longer than any wait these tests make on a
// loaded machine (innodb_lock_wait_timeout is 50 s).
const pollBound = 2 * time.Minute

// Waiter returns once another connection runs an INSERT or UPDATE in the
// test's database: the hold keeps it from finishing, so it waits, or will.
func (h *hold) Waiter(t testing.TB) {
	t.Helper()
	poll(t, "nothing waited for the hold", func() bool {
		err := h.db.QueryRowContext(t.Context(), `SELECT ID FROM information_schema.PROCESSLIST
			WHERE DB = ? AND ID <> ? AND COMMAND <> 'Sleep' AND (INFO LIKE 'INSERT%' OR INFO LIKE 'UPDATE%') LIMIT 1`, h.name, h.id).Scan(&h.waiter)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		return err == nil
	})
}

func (h *hold) Unblock(t testing.TB) {
	t.Helper()
	if err := h.tx.Rollback(); err != nil {
		t.Fatal(err)
	}
}

// Settled: the waiter's statement is over and nothing it did can still
// commit: its connection is gone (its client dropped it, or it was
// killed, and the server ended it once the statement was over, having
// committed or rolled back what it did), or it sits idle with no InnoDB
// transaction open (its statement ended before the client could drop
// it, and whatever it did has been committed or rolled back already).
// Either way, what the store left behind is final.
func (h *hold) Settled(t testing.TB) {
	t.Helper()
	poll(t, "the waiter still runs what its client abandoned, or holds a transaction open", func() bool {
		var n int
		err := h.db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.PROCESSLIST p WHERE p.ID = ?
			AND (p.COMMAND <> 'Sleep' OR EXISTS (SELECT 1 FROM information_schema.INNODB_TRX x WHERE x.trx_mysql_thread_id = p.ID))`, h.waiter).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

func (h *hold) Kill(t testing.TB) {
	t.Helper()
	if _, err := h.db.ExecContext(t.Context(), "KILL ?", h.waiter); err != nil {
		t.Fatal(err)
	}
}

var cancelModes = []struct {
	name string
	cfg  idemmysql.Config
}{
	{"batch=on", idemmysql.Config{}}, // a lone call runs alone at once
	{"batch=off", idemmysql.Config{DisableBatch: true}},
}

func TestCancelledLoneReserveLandsNoOrphan(t *testing.T) {
	t.Parallel()
	for _, mode := range cancelModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			s, db := newStoreWith(t, "", mode.cfg)
			batchtest.CancelledReserve(t, s, holdGap(db))
		})
	}
}

func TestCancelledLoneBeginLandsNoOrphan(t *testing.T) {
	t.Parallel()
	for _, mode := range cancelModes {
		for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
			t.Run(mode.name+"/"+kind.String(), func(t *testing.T) {
				t.Parallel()
				s, db := newStoreWith(t, "", mode.cfg)
				batchtest.CancelledBegin(t, s, kind, holdGap(db))
			})
		}
	}
}

func TestCancelledBatchLandsNoOrphan(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, "")
	batchtest.CancelledBatch(t, s, s.Batcher(), holdGap(db))
}

func TestCancelledBatchedBeginLandsNoOrphan(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, "")
	batchtest.CancelledBatchedBegin(t, s, s.Batcher(), holdRow(db))
}

func TestCancelledTakeoverLandsNothing(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, "")
	batchtest.CancelledTakeover(t, s, holdRow(db))
}

// TestLoneReserveConnectionKilled: KILL of the connection of a lone
// Reserve that waits.
func TestLoneReserveConnectionKilled(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, "")
	batchtest.KilledBegin(t, s, holdGap(db))
}

// TestLoneReserveLostCommitReply: the reply to a lone Reserve's COMMIT is
// lost.
func TestLoneReserveLostCommitReply(t *testing.T) {
	t.Parallel()
	_, cfg := newDatabase(t, "")
	proxy := dropproxy.New(t, cfg.Addr)
	viaCfg := cfg.Clone()
	viaCfg.Addr = proxy.Addr()
	s, err := idemmysql.New(openDB(t, viaCfg), idemmysql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	batchtest.LostCommitReply(t, s, func() func() bool {
		proxy.DropNext([]byte("\x03COMMIT")) // the COMMIT command (COM_QUERY)
		return func() bool { return !proxy.Armed() }
	})
}
