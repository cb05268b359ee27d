package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/dropproxy"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
)

// The conformance suite (TestConformance/CompleteTx) checks commit,
// rollback, lost leases and a heartbeat before CompleteTx at every
// isolation level. These tests cover what is particular to database/sql and
// InnoDB: a caller dying mid-transaction, a lost COMMIT acknowledgement,
// REPEATABLE READ snapshots, and row locks held from CompleteTx to the end
// of the transaction.

// purchase is the business transaction of these tests: insert an order and
// store the answer with CompleteTx, in one transaction.
func purchase(ctx context.Context, s *idemmysql.Store, tx *sql.Tx, lease txLease, body string) error {
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (k, body) VALUES (?, ?)", lease.key.Key, body); err != nil {
		return err
	}
	return s.CompleteTx(ctx, tx, lease, &idemstore.Response{Status: 201, Body: []byte(body)})
}

func newOrdersStore(t *testing.T) (*idemmysql.Store, *sql.DB, *mysql.Config) {
	t.Helper()
	db, cfg := newDatabase(t, "")
	if _, err := db.ExecContext(t.Context(), "CREATE TABLE orders (k VARBINARY(255) PRIMARY KEY, body TEXT NOT NULL) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	s, err := idemmysql.New(db, idemmysql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s, db, cfg
}

func countOrders(t *testing.T, db *sql.DB, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM orders WHERE k = ?", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func reserve(t *testing.T, s *idemmysql.Store, k idemstore.Key, token string, lease time.Duration) {
	t.Helper()
	if _, created, err := s.Reserve(t.Context(), idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: token, Lease: lease}); err != nil || !created {
		t.Fatalf("Reserve(%v) = %v, %v", k, created, err)
	}
}

func get(t *testing.T, s *idemmysql.Store, k idemstore.Key) *idemstore.Record {
	t.Helper()
	rec, err := s.Get(t.Context(), k)
	if err != nil {
		t.Fatalf("Get(%v): %v", k, err)
	}
	return rec
}

// TestCompleteTxKilledCaller kills a business transaction after CompleteTx
// but before COMMIT (database/sql rolls back when the context ends): neither
// the order nor the completion may persist. The lease, already expired as a
// dead holder's would be, is then taken over and the retry's order exists
// exactly once.
func TestCompleteTxKilledCaller(t *testing.T) {
	t.Parallel()
	s, db, _ := newOrdersStore(t)
	ctx := t.Context()
	k := idemstore.Key{Scope: "tenant-1", Operation: "POST /orders", Key: "order-1"}
	reserve(t, s, k, "tok-1", -time.Minute)

	txCtx, kill := context.WithCancel(ctx)
	tx, err := db.BeginTx(txCtx, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := txLease{key: k, token: "tok-1", retention: 24 * time.Hour}
	if err := purchase(txCtx, s, tx, first, "first"); err != nil {
		t.Fatalf("first purchase: %v", err)
	}
	kill()
	if err := tx.Commit(); err == nil {
		t.Fatal("Commit after the context was cancelled succeeded")
	}
	if n := countOrders(t, db, k.Key); n != 0 {
		t.Fatalf("order rows after the killed transaction = %d, want 0", n)
	}
	if got := get(t, s, k); got.State != idemstore.StatePending || got.Token != "tok-1" || got.Response != nil {
		t.Fatalf("after the killed transaction: state %q token %q response %v; want pending tok-1 nil", got.State, got.Token, got.Response)
	}

	if err := s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: "tok-1", NewToken: "tok-2", Lease: time.Minute}); err != nil {
		t.Fatalf("Takeover: %v", err)
	}
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := purchase(ctx, s, tx, txLease{key: k, token: "tok-2", retention: 24 * time.Hour}, "second"); err != nil {
		t.Fatalf("second purchase: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := countOrders(t, db, k.Key); n != 1 {
		t.Fatalf("order rows = %d, want exactly 1", n)
	}
	if got := get(t, s, k); got.State != idemstore.StateCompleted || got.Response == nil || string(got.Response.Body) != "second" {
		t.Fatalf("after the retry: state %q response %+v", got.State, got.Response)
	}

	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := s.CompleteTx(ctx, tx, first, &idemstore.Response{Status: 201}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("CompleteTx with the old token = %v, want ErrLeaseLost", err)
	}
}

// TestCompleteTxLostAcknowledgement commits a business transaction whose
// acknowledgement never reaches the client. The caller, seeing an error,
// releases the key; the release must leave the completed record alone.
func TestCompleteTxLostAcknowledgement(t *testing.T) {
	t.Parallel()
	s, db, cfg := newOrdersStore(t)
	ctx := t.Context()
	proxy := dropproxy.New(t, cfg.Addr)
	viaCfg := cfg.Clone()
	viaCfg.Addr = proxy.Addr()
	viaProxy := openDB(t, viaCfg)

	k := idemstore.Key{Scope: "tenant-1", Operation: "POST /orders", Key: "order-ack"}
	reserve(t, s, k, "tok-1", time.Minute)
	tx, err := viaProxy.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := purchase(ctx, s, tx, txLease{key: k, token: "tok-1", retention: 24 * time.Hour}, "committed answer"); err != nil {
		t.Fatal(err)
	}
	proxy.DropNextCommit()
	if err := tx.Commit(); err == nil {
		t.Fatal("Commit reported success; the proxy should have dropped its acknowledgement")
	}

	if err := s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok-1"}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Release after a lost acknowledgement = %v, want ErrLeaseLost", err)
	}
	got := get(t, s, k)
	if got.State != idemstore.StateCompleted || got.Response == nil || string(got.Response.Body) != "committed answer" || got.Response.Status != 201 {
		t.Fatalf("after Release: state %q response %+v; want completed with the committed answer", got.State, got.Response)
	}
	if n := countOrders(t, db, k.Key); n != 1 {
		t.Fatalf("order rows = %d, want 1", n)
	}
}

// TestCompleteTxAfterHeartbeatOnOlderSnapshot: at REPEATABLE READ the
// business transaction's snapshot predates a heartbeat that another
// connection committed, yet CompleteTx's UPDATE reads the latest committed
// row, so it neither misses the lease nor fails to serialize.
func TestCompleteTxAfterHeartbeatOnOlderSnapshot(t *testing.T) {
	t.Parallel()
	s, db, _ := newOrdersStore(t)
	ctx := t.Context()
	k := idemstore.Key{Scope: "tenant-1", Operation: "POST /orders", Key: "order-snap"}
	reserve(t, s, k, "tok-1", time.Minute)
	before := get(t, s, k)

	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	snapshotLease := func() int64 {
		t.Helper()
		var ms int64
		if err := tx.QueryRowContext(ctx, "SELECT lease_until FROM idem_records WHERE `key` = ?", k.Key).Scan(&ms); err != nil {
			t.Fatal(err)
		}
		return ms
	}
	seen := snapshotLease() // the consistent read fixes the snapshot

	if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok-1", Lease: time.Hour}); err != nil {
		t.Fatalf("Extend from another connection: %v", err)
	}
	if extended := get(t, s, k); !extended.LeaseUntil.After(before.LeaseUntil) {
		t.Fatalf("Extend left LeaseUntil at %v", extended.LeaseUntil)
	}
	if again := snapshotLease(); again != seen {
		t.Fatalf("the snapshot moved from %d to %d: not the REPEATABLE READ this test needs", seen, again)
	}
	if err := purchase(ctx, s, tx, txLease{key: k, token: "tok-1", retention: time.Hour}, "answer"); err != nil {
		t.Fatalf("CompleteTx on a snapshot older than the heartbeat: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if got := get(t, s, k); got.State != idemstore.StateCompleted || got.Token != "tok-1" {
		t.Fatalf("record %q token %q, want completed by tok-1", got.State, got.Token)
	}
}

// TestHeartbeatWaitsForCompleteTx: once CompleteTx has updated the record,
// its row is locked until the business transaction ends, and a heartbeat
// Extend from another connection waits for it. Nothing deadlocks: after a
// commit the Extend finds the record completed (ErrLeaseLost, the lease has
// ended), after a rollback it extends the still pending lease.
func TestHeartbeatWaitsForCompleteTx(t *testing.T) {
	t.Parallel()
	s, db, cfg := newOrdersStore(t)
	for _, level := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
		for _, commit := range []bool{true, false} {
			name := level.String() + "/rollback"
			if commit {
				name = level.String() + "/commit"
			}
			// One at a time: each holds three of the pool's connections
			// (the transaction, the Extend and the poll), and waitForExtend
			// looks for any Extend in the database.
			t.Run(name, func(t *testing.T) {
				ctx := t.Context()
				k := idemstore.Key{Scope: "tenant-1", Operation: "POST /orders", Key: "hb-" + randomHex(6)}
				reserve(t, s, k, "tok-1", time.Minute)
				before := get(t, s, k)

				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback() }()
				if err := purchase(ctx, s, tx, txLease{key: k, token: "tok-1", retention: time.Hour}, "answer"); err != nil {
					t.Fatalf("CompleteTx: %v", err)
				}

				extended := make(chan error, 1)
				go func() {
					extended <- s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok-1", Lease: time.Hour})
				}()
				waitForExtend(t, db, cfg.DBName, extended)

				if commit {
					err = tx.Commit()
				} else {
					err = tx.Rollback()
				}
				if err != nil {
					t.Fatalf("ending the business transaction: %v", err)
				}
				err = <-extended
				got := get(t, s, k)
				if commit {
					if !errors.Is(err, idemstore.ErrLeaseLost) {
						t.Fatalf("Extend after the commit = %v, want ErrLeaseLost", err)
					}
					if got.State != idemstore.StateCompleted || got.Token != "tok-1" || countOrders(t, db, k.Key) != 1 {
						t.Fatalf("after commit: record %q token %q; want completed by tok-1 with its order", got.State, got.Token)
					}
					return
				}
				if err != nil {
					t.Fatalf("Extend after the rollback: %v", err)
				}
				if got.State != idemstore.StatePending || got.Token != "tok-1" || !got.LeaseUntil.After(before.LeaseUntil) || countOrders(t, db, k.Key) != 0 {
					t.Fatalf("after rollback: record %q token %q lease %v (was %v); want pending tok-1, extended, no order",
						got.State, got.Token, got.LeaseUntil, before.LeaseUntil)
				}
			})
		}
	}
}

// waitForExtend returns once the server is executing an Extend's UPDATE in
// database dbName, which can only finish once the business transaction
// holding the row ends. It reads PROCESSLIST, which the server builds
// afresh for every query; InnoDB's lock tables in information_schema are a
// cache that continuous polling keeps from refreshing. It fails the test if
// done delivers first: the Extend did not wait.
func waitForExtend(t *testing.T, db *sql.DB, dbName string, done <-chan error) {
	t.Helper()
	const q = `SELECT count(*) FROM information_schema.PROCESSLIST
		WHERE DB = ? AND STATE = 'Updating' AND INFO LIKE 'UPDATE idem_records SET lease_until%'`
	for {
		select {
		case err := <-done:
			t.Fatalf("Extend did not wait for the transaction's row lock (returned %v)", err)
		default:
		}
		var n int
		if err := db.QueryRowContext(t.Context(), q, dbName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
}
