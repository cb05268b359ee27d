package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// txLease is the part of a lease CompleteTx uses: it hands out the fenced
// completion for its key and token, as the engine's *idem.Lease does.
type txLease struct {
	key   idemstore.Key
	token string
	err   error
}

func (l txLease) PrepareTxComplete(resp *idemstore.Response) (idemstore.CompleteParams, error) {
	if l.err != nil {
		return idemstore.CompleteParams{}, l.err
	}
	return idemstore.CompleteParams{Key: l.key, Token: l.token, Response: resp, Retention: time.Hour}, nil
}

// txFixture is a store, a business table in the same file, and a reserved
// key.
type txFixture struct {
	s     *idemsqlite.Store
	db    *sql.DB
	key   idemstore.Key
	token string
}

func newTxFixture(t *testing.T) *txFixture {
	t.Helper()
	s, db := newStore(t)
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	f := &txFixture{s: s, db: db, key: idemstore.Key{Scope: "user-1", Operation: "POST /orders", Key: "k1"},
		token: "tok-1"}
	if _, created, err := s.Reserve(context.Background(), idemstore.ReserveParams{
		Key: f.key, Fingerprint: "fp", Token: f.token, Lease: time.Minute,
	}); err != nil || !created {
		t.Fatalf("Reserve: created=%v err=%v", created, err)
	}
	return f
}

// order runs the business change and CompleteTx in one transaction, then
// commits or rolls back.
func (f *txFixture) order(t *testing.T, lease idemstore.TxLease, commit bool) error {
	t.Helper()
	ctx := context.Background()
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES ('o1', 42)`); err != nil {
		t.Fatal(err)
	}
	resp := &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"o1"}`)}
	if err := f.s.CompleteTx(ctx, tx, lease, resp); err != nil {
		return err // the caller's duty: roll back (deferred)
	}
	if commit {
		return tx.Commit()
	}
	return tx.Rollback()
}

func (f *txFixture) orders(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *txFixture) lease() txLease {
	return txLease{key: f.key, token: f.token}
}

func TestCompleteTxPrepareError(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t)
	boom := errors.New("lease already finished")
	l := f.lease()
	l.err = boom
	if err := f.order(t, l, true); !errors.Is(err, boom) {
		t.Fatalf("CompleteTx: %v, want the lease's error", err)
	}
	if n := f.orders(t); n != 0 {
		t.Fatalf("%d orders, want 0", n)
	}
}

func TestCompleteTxNilArguments(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t)
	if err := f.s.CompleteTx(context.Background(), nil, f.lease(), nil); err == nil {
		t.Error("CompleteTx with a nil tx succeeded")
	}
	tx, err := f.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := f.s.CompleteTx(context.Background(), tx, nil, nil); err == nil {
		t.Error("CompleteTx with a nil lease succeeded")
	}
}
