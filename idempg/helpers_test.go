package idempg_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

const urlEnv = "IDEM_TEST_POSTGRES_URL"

// testURL returns the server URL, skipping the test when it is not set
// (failing instead when CI=true).
func testURL(tb testing.TB) string {
	tb.Helper()
	return testenv.Getenv(tb, urlEnv)
}

var (
	poolsMu sync.Mutex
	pools   = map[string]*pgxpool.Pool{}
)

// testPool returns a pool shared by the tests of this package whose
// transactions default to isolation ("" for the server default). Pools live
// until the test binary exits.
func testPool(tb testing.TB, isolation string) *pgxpool.Pool {
	tb.Helper()
	u := testURL(tb)
	poolsMu.Lock()
	defer poolsMu.Unlock()
	if p := pools[isolation]; p != nil {
		return p
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 16
	if isolation != "" {
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = isolation
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	pools[isolation] = p
	return p
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newSchema creates an empty migrated schema of its own for one test and
// drops it in cleanup.
func newSchema(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	schema := "idem_t_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := idempg.Migrate(ctx, pool, idempg.Config{Schema: schema}); err != nil {
		tb.Fatalf("Migrate: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// newStore returns a store on a fresh schema of its own.
func newStore(tb testing.TB, pool *pgxpool.Pool, cfg idempg.Config) *idempg.Store {
	tb.Helper()
	s, _ := newStoreIn(tb, pool, cfg)
	return s
}

// newStoreIn returns a store on a fresh schema of its own, and the schema.
func newStoreIn(tb testing.TB, pool *pgxpool.Pool, cfg idempg.Config) (*idempg.Store, string) {
	tb.Helper()
	cfg.Schema = newSchema(tb, pool)
	s, err := idempg.New(pool, cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, cfg.Schema
}

// closedPortPool returns a pool pointed at a loopback port nobody listens on.
func closedPortPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	p, err := pgxpool.New(context.Background(), "postgres://postgres@"+addr+"/idem_test?sslmode=disable&connect_timeout=5")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// txLease is the part of an engine lease that CompleteTx needs.
type txLease struct {
	key   idemstore.Key
	token string
}

func (l txLease) PrepareTxComplete(resp *idemstore.Response) (idemstore.CompleteParams, error) {
	return idemstore.CompleteParams{Key: l.key, Token: l.token, Response: resp, Retention: 24 * time.Hour}, nil
}
