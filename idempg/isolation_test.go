package idempg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

var isolationLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

// TestCompleteTxWhileTouched is issue 9, point 10: a business transaction
// at each isolation level takes its snapshot with a business write, then a
// heartbeat (Extend) or a waiter (Subscribe) touches the record from
// another connection, and only then does CompleteTx run. PostgreSQL refuses
// (40001) to update at REPEATABLE READ or SERIALIZABLE a row that a
// transaction committed after the snapshot updated, so neither may write
// the record's row; they lock it, and a committed lock does not make the
// update fail. The waiter must still be woken by the commit.
func TestCompleteTxWhileTouched(t *testing.T) {
	t.Parallel()
	// The store's own statements run at the pool's default level: the
	// server's (READ COMMITTED), or the business transaction's.
	for _, level := range isolationLevels {
		for _, storeLevel := range []string{"", string(level)} {
			name := string(level) + "/store at " + storeLevel
			if storeLevel == "" {
				name = string(level) + "/store at default"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				testCompleteTxWhileTouched(t, level, storeLevel)
			})
		}
	}
}

func testCompleteTxWhileTouched(t *testing.T, level pgx.TxIsoLevel, storeLevel string) {
	pool := testPool(t, storeLevel)
	s, schema := newStoreIn(t, pool, idempg.Config{})
	orders := newOrders(t, pool, schema)
	touches := []struct {
		name  string
		touch func(t *testing.T, k idemstore.Key, token string) <-chan struct{}
	}{
		{"Extend", func(t *testing.T, k idemstore.Key, token string) <-chan struct{} {
			if err := s.Extend(t.Context(), idemstore.ExtendParams{Key: k, Token: token, Lease: time.Hour}); err != nil {
				t.Fatalf("Extend: %v", err)
			}
			return nil
		}},
		{"Subscribe", func(t *testing.T, k idemstore.Key, _ string) <-chan struct{} {
			return subscribe(t, s, k)
		}},
		{"ExtendAndSubscribe", func(t *testing.T, k idemstore.Key, token string) <-chan struct{} {
			if err := s.Extend(t.Context(), idemstore.ExtendParams{Key: k, Token: token, Lease: time.Hour}); err != nil {
				t.Fatalf("Extend: %v", err)
			}
			return subscribe(t, s, k)
		}},
	}
	// One touch at a time on this schema's table: at SERIALIZABLE,
	// PostgreSQL tracks reads by page, so transactions on other keys of the
	// same pages could fail each other with 40001, which is the
	// application's to retry and not what this test is about.
	for _, tc := range touches {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			k := reserveKey(t, s, randomHex(8))
			token := "tok-" + k.Key
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			// The business write takes the transaction's snapshot.
			if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (key, body) VALUES ($1, 'x')", k.Key); err != nil {
				t.Fatal(err)
			}
			woken := tc.touch(t, k, token)
			// The touch locked the record's row (its xmax names the locker)
			// after the snapshot, and committed; a lock is not a change.
			var locked bool
			err = pool.QueryRow(ctx, "SELECT xmax::text <> '0' FROM "+pgx.Identifier{schema, "idem_records"}.Sanitize()+
				" WHERE scope = $1 AND operation = $2 AND key = $3", k.Scope, k.Operation, k.Key).Scan(&locked)
			if err != nil || !locked {
				t.Fatalf("after %s the record's row shows no lock (%v)", tc.name, err)
			}
			if err := s.CompleteTx(ctx, tx, txLease{key: k, token: token}, &idemstore.Response{Status: 201}); err != nil {
				t.Fatalf("CompleteTx after %s: %v", tc.name, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("Commit after %s: %v", tc.name, err)
			}
			if got, err := s.Get(ctx, k); err != nil || got.State != idemstore.StateCompleted {
				t.Fatalf("after commit: %+v, %v; want completed", got, err)
			}
			if woken != nil {
				waitWake(t, woken, "the waiter after the commit")
			}
		})
	}
}
