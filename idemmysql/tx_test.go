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

// TestCompleteTxAtomicity kills a business transaction after CompleteTx but
// before COMMIT: neither the order nor the completion may persist. After the
// lease expires, a retry takes over and the order exists exactly once.
func TestCompleteTxAtomicity(t *testing.T) {
	t.Parallel()
	s, db, _ := newOrdersStore(t)
	ctx := t.Context()
	base := time.Now().UTC().Truncate(time.Millisecond)
	k := idemstore.Key{Scope: "tenant-1", Operation: "POST /orders", Key: "order-1"}
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok-1", LeaseUntil: base.Add(time.Minute), Now: base}); err != nil || !created {
		t.Fatalf("Reserve = %v, %v", created, err)
	}

	txCtx, kill := context.WithCancel(ctx)
	tx, err := db.BeginTx(txCtx, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := txLease{key: k, token: "tok-1", now: base, expiresAt: base.Add(24 * time.Hour)}
	if err := purchase(txCtx, s, tx, first, "first"); err != nil {
		t.Fatalf("first purchase: %v", err)
	}
	kill() // the caller dies: database/sql rolls the transaction back
	if err := tx.Commit(); err == nil {
		t.Fatal("Commit after the context was cancelled succeeded")
	}
	if n := countOrders(t, db, k.Key); n != 0 {
		t.Fatalf("order rows after the killed transaction = %d, want 0", n)
	}
	got, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != idemstore.StatePending || got.Token != "tok-1" || got.Response != nil {
		t.Fatalf("after the killed transaction: state %q token %q response %v; want pending tok-1 nil", got.State, got.Token, got.Response)
	}

	later := base.Add(2 * time.Minute)
	if err := s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: "tok-1", NewToken: "tok-2", LeaseUntil: later.Add(time.Minute), Now: later}); err != nil {
		t.Fatalf("Takeover: %v", err)
	}
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := purchase(ctx, s, tx, txLease{key: k, token: "tok-2", now: later, expiresAt: later.Add(24 * time.Hour)}, "second"); err != nil {
		t.Fatalf("second purchase: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := countOrders(t, db, k.Key); n != 1 {
		t.Fatalf("order rows = %d, want exactly 1", n)
	}
	got, err = s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != idemstore.StateCompleted || got.Response == nil || string(got.Response.Body) != "second" {
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

	base := time.Now().UTC().Truncate(time.Millisecond)
	k := idemstore.Key{Scope: "tenant-1", Operation: "POST /orders", Key: "order-ack"}
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok-1", LeaseUntil: base.Add(time.Minute), Now: base}); err != nil {
		t.Fatal(err)
	}
	tx, err := viaProxy.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := purchase(ctx, s, tx, txLease{key: k, token: "tok-1", now: base, expiresAt: base.Add(24 * time.Hour)}, "committed answer"); err != nil {
		t.Fatal(err)
	}
	proxy.DropNextCommit()
	if err := tx.Commit(); err == nil {
		t.Fatal("Commit reported success; the proxy should have dropped its acknowledgement")
	}

	if err := s.Release(ctx, k, "tok-1"); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Release after a lost acknowledgement = %v, want ErrLeaseLost", err)
	}
	got, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != idemstore.StateCompleted || got.Response == nil || string(got.Response.Body) != "committed answer" || got.Response.Status != 201 {
		t.Fatalf("after Release: state %q response %+v; want completed with the committed answer", got.State, got.Response)
	}
	if n := countOrders(t, db, k.Key); n != 1 {
		t.Fatalf("order rows = %d, want 1", n)
	}
}
