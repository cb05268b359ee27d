package idempg_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/dropproxy"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// purchase is the business transaction of these tests: insert an order and
// store the answer with CompleteTx, in one transaction.
func purchase(ctx context.Context, s *idempg.Store, tx pgx.Tx, orders string, lease txLease, body string) error {
	if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (key, body) VALUES ($1, $2)", lease.key.Key, body); err != nil {
		return err
	}
	return s.CompleteTx(ctx, tx, lease, &idemstore.Response{Status: 201, Body: []byte(body)})
}

func newOrders(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	if _, err := pool.Exec(t.Context(), "CREATE TABLE "+orders+" (key text PRIMARY KEY, body text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return orders
}

func countOrders(t *testing.T, pool *pgxpool.Pool, orders, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+orders+" WHERE key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCompleteTxLostAcknowledgement commits a business transaction whose
// acknowledgement never reaches the client. The caller, seeing an error,
// releases the key; the release must leave the completed record alone.
func TestCompleteTxLostAcknowledgement(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s, schema := newStoreIn(t, pool, idempg.Config{})
	orders := newOrders(t, pool, schema)
	ctx := t.Context()

	cfg := pool.Config().ConnConfig
	proxy := dropproxy.New(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	viaProxy, err := pgxpool.New(ctx, strings.Replace(testURL(t), net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), proxy.Addr(), 1))
	if err != nil {
		t.Fatal(err)
	}
	defer viaProxy.Close()

	k := idemstore.Key{Scope: "tenant-1", Operation: "POST /orders", Key: "order-ack"}
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok-1", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := viaProxy.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lease := txLease{key: k, token: rec.Token}
	if err := purchase(ctx, s, tx, orders, lease, "committed answer"); err != nil {
		t.Fatal(err)
	}
	proxy.DropNextCommit()
	err = tx.Commit(ctx)
	if err == nil {
		t.Fatal("Commit reported success; the proxy should have dropped its acknowledgement")
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "closed") {
		t.Logf("Commit error (expected a broken connection): %v", err)
	}

	// The caller does not know whether it committed and releases if pending.
	if err := s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: rec.Token}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Release after a lost acknowledgement = %v, want ErrLeaseLost", err)
	}
	got, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != idemstore.StateCompleted || got.Response == nil || string(got.Response.Body) != "committed answer" || got.Response.Status != 201 {
		t.Fatalf("after Release: state %q response %+v; want completed with the committed answer", got.State, got.Response)
	}
	if n := countOrders(t, pool, orders, k.Key); n != 1 {
		t.Fatalf("order rows = %d, want 1", n)
	}
}
