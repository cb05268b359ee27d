package idempg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// TestConformanceAtStricterDefaults runs the store conformance suite with
// every session of the pool defaulting to REPEATABLE READ and to
// SERIALIZABLE: the store's own transactions must not depend on the
// database's default_transaction_isolation.
func TestConformanceAtStricterDefaults(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			pool := testPool(t, level)
			for _, mode := range batchModes {
				t.Run(mode.name, func(t *testing.T) {
					t.Parallel()
					exercise(t, pool, mode.cfg)
				})
			}
		})
	}
}

// TestSettleAloneWaiterSubscribedAtStricterDefaults is
// TestNotifyWaiterSubscribedWhileCompleting for every settling call of a
// pending record that a store makes alone (outside a batch: batching off, or a call that finds
// the store idle), with the pool's sessions defaulting to each isolation
// level: a waiter that subscribed while the call waited for the record's
// row must be woken, and the call must succeed.
func TestSettleAloneWaiterSubscribedAtStricterDefaults(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		for _, mode := range batchModes {
			t.Run(level+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				testSettleAloneWaiterSubscribed(t, testPool(t, level), mode.cfg)
			})
		}
	}
}

func testSettleAloneWaiterSubscribed(t *testing.T, pool *pgxpool.Pool, cfg idempg.Config) {
	s, schema := newStoreIn(t, pool, cfg)
	resp := &idemstore.Response{Status: 200}
	for _, tc := range []struct {
		name   string
		settle func(ctx context.Context, k idemstore.Key, token string) error
	}{
		{"Complete", func(ctx context.Context, k idemstore.Key, token string) error {
			return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: token, Response: resp, Retention: time.Hour})
		}},
		{"Release", func(ctx context.Context, k idemstore.Key, token string) error {
			return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: token})
		}},
		{"Escalate", func(ctx context.Context, k idemstore.Key, token string) error {
			return s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: token, Reason: "r"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			k := reserveKey(t, s, tc.name)
			token := "tok-" + tc.name
			pid, release := shareLock(t, pool, schema, k)
			done := make(chan error, 1)
			go func() { done <- tc.settle(ctx, k, token) }()
			waitBlockedBy(t, pool, pid) // the call has its snapshot and waits for the row
			woken := subscribe(t, s, k)
			select {
			case <-woken:
				t.Fatal("woken before the record changed")
			default:
			}
			release()
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			waitWake(t, woken, "the waiter that subscribed while "+tc.name+" waited for the row")
		})
	}
}

// TestAloneWhileRecordChangesAtStricterDefaults makes a waiter (Subscribe)
// wait for the row of a record that another transaction is escalating,
// with the pool's sessions defaulting to each isolation level. Once the
// escalation commits, Subscribe must wake its waiter at once, as at READ
// COMMITTED, rather than fail with a serialization error. (Extend's lock,
// FOR KEY SHARE, does not wait for such an update; the conformance suite's
// races of Extend with recovery, TestConformanceAtStricterDefaults, cover
// it.)
func TestAloneWhileRecordChangesAtStricterDefaults(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			pool := testPool(t, level)
			s, schema := newStoreIn(t, pool, idempg.Config{DisableBatch: true})
			for _, tc := range []struct {
				name  string
				check func(t *testing.T, k idemstore.Key, token string, changed func())
			}{
				{"Subscribe", func(t *testing.T, k idemstore.Key, _ string, changed func()) {
					type result struct {
						ch     <-chan struct{}
						cancel func()
						err    error
					}
					done := make(chan result, 1)
					go func() {
						ch, cancel, err := s.Subscribe(t.Context(), k)
						done <- result{ch, cancel, err}
					}()
					changed()
					r := <-done
					if r.err != nil {
						t.Fatalf("Subscribe to a record being escalated: %v", r.err)
					}
					t.Cleanup(r.cancel)
					waitWake(t, r.ch, "a waiter of a record escalated while it subscribed")
				}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					ctx := t.Context()
					k := reserveKey(t, s, tc.name)
					tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
					var pid uint32
					err = tx.QueryRow(ctx, "UPDATE "+pgx.Identifier{schema, "idem_records"}.Sanitize()+
						" SET state = 'needs_review', reason = 'r' WHERE scope = $1 AND operation = $2 AND key = $3 RETURNING pg_backend_pid()",
						k.Scope, k.Operation, k.Key).Scan(&pid)
					if err != nil {
						t.Fatal(err)
					}
					tc.check(t, k, "tok-"+tc.name, func() {
						waitBlockedBy(t, pool, pid)
						if err := tx.Commit(ctx); err != nil {
							t.Fatal(err)
						}
					})
				})
			}
		})
	}
}
