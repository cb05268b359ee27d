package idemstoretest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// txLease is the part of a lease CompleteTx uses: the fenced completion of
// its key and token, as the engine's *idem.Lease hands it out.
type txLease struct {
	key   idemstore.Key
	token string
}

func (l txLease) PrepareTxComplete(resp *idemstore.Response) (idemstore.CompleteParams, error) {
	return idemstore.CompleteParams{Key: l.key, Token: l.token, Response: resp, Retention: retainLive}, nil
}

// testCompleteTx checks CompleteTx inside business transactions: the answer
// and the business change commit together or not at all, at every isolation
// level the driver supports, also while a heartbeat and a waiter touch the
// record from other connections during the transaction.
func testCompleteTx(t *testing.T, h Harness) {
	if h.Tx == nil {
		t.Skip("Harness.Tx is not set: the store offers no CompleteTx")
	}
	tx := h.Tx(t)
	s := tx.Store
	if !s.Capabilities().TransactionalComplete {
		t.Fatal("Harness.Tx is set but the store does not report TransactionalComplete")
	}
	if len(tx.Levels) == 0 {
		t.Fatal("TxHarness.Levels is empty")
	}
	resp := &idemstore.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"order":1}`)}
	committed := func(f *fixture, id string) bool {
		f.t.Helper()
		ok, err := tx.Committed(f.ctx(), id)
		if err != nil {
			f.t.Fatalf("Committed(%s): %v", id, err)
		}
		return ok
	}

	for _, level := range tx.Levels {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			// At SERIALIZABLE a database may fail a transaction because of
			// another one on other keys (PostgreSQL tracks reads by page),
			// which the application must retry and which is not what these
			// tests are about: that level's cases run one at a time.
			serial := strings.EqualFold(level, "serializable")
			parallel := func(t *testing.T) {
				if !serial {
					t.Parallel()
				}
			}
			run := func(f *fixture, rec *idemstore.Record, id string, commit bool, between func()) error {
				return tx.Run(f.ctx(), level, txLease{key: rec.Key, token: rec.Token}, resp, id, commit, between)
			}

			t.Run("Commit", func(t *testing.T) {
				parallel(t)
				f := newFixture(t, s)
				rec := f.reserve(f.key("k"), leaseLive)
				id := f.scope + "-commit"
				lo, hi, got, err := f.during(rec.Key, func() error { return run(f, rec, id, true, nil) })
				if err != nil {
					t.Fatalf("CompleteTx and commit: %v", err)
				}
				if !committed(f, id) {
					t.Fatal("the business row did not commit")
				}
				requireWithin(t, "ExpiresAt", got.ExpiresAt, retainLive, lo, hi)
				want := *rec
				want.State, want.Response = idemstore.StateCompleted, resp
				want.ExpiresAt, want.UpdatedAt = got.ExpiresAt, got.UpdatedAt
				if d := diffRecord(got, &want); d != "" {
					t.Fatalf("after CompleteTx and commit: %s", d)
				}
			})

			t.Run("Rollback", func(t *testing.T) {
				parallel(t)
				f := newFixture(t, s)
				rec := f.reserve(f.key("k"), leaseLive)
				id := f.scope + "-rollback"
				if err := run(f, rec, id, false, nil); err != nil {
					t.Fatalf("CompleteTx then rollback: %v", err)
				}
				if committed(f, id) {
					t.Fatal("the business row committed though the transaction rolled back")
				}
				f.requireUnchanged(rec, "a rolled-back CompleteTx")
			})

			t.Run("LeaseLost", func(t *testing.T) {
				parallel(t)
				f := newFixture(t, s)
				rec := f.reserve(f.key("k"), leaseLive)
				stale := *rec
				stale.Token = newToken()
				id := f.scope + "-lost"
				err := run(f, &stale, id, true, nil)
				requireErrIs(t, err, idemstore.ErrLeaseLost, "CompleteTx with a stale token")
				if committed(f, id) {
					t.Fatal("the business row committed though CompleteTx lost the lease")
				}
				f.requireUnchanged(rec, "CompleteTx with a stale token")
			})

			t.Run("TakenOverDuringTheTransaction", func(t *testing.T) {
				parallel(t)
				f := newFixture(t, s)
				rec := f.reserve(f.key("k"), leaseExpired)
				id := f.scope + "-taken"
				var takeErr error
				err := run(f, rec, id, true, func() {
					takeErr = s.Takeover(context.WithoutCancel(f.ctx()), idemstore.TakeoverParams{Key: rec.Key, OldToken: rec.Token, NewToken: newToken(), Lease: leaseLive})
				})
				if takeErr != nil {
					t.Fatalf("Takeover during the business transaction: %v", takeErr)
				}
				requireErrIs(t, err, idemstore.ErrLeaseLost, "CompleteTx after a takeover")
				if committed(f, id) {
					t.Fatal("the business row committed though the lease was taken over")
				}
			})

			// A heartbeat and a waiting duplicate touch the record from
			// other connections while the business transaction is open;
			// the holder must still commit (no serialization failure).
			t.Run("HeartbeatAndWaiterDuringTheTransaction", func(t *testing.T) {
				parallel(t)
				f := newFixture(t, s)
				for round := range 3 {
					rec := f.reserve(f.key(fmt.Sprintf("k%d", round)), leaseLive)
					id := fmt.Sprintf("%s-hb%d", f.scope, round)
					var (
						extendErr error
						cancel    func()
					)
					err := run(f, rec, id, true, func() {
						ctx := context.WithoutCancel(f.ctx())
						extendErr = s.Extend(ctx, idemstore.ExtendParams{Key: rec.Key, Token: rec.Token, Lease: leaseLonger})
						if n, ok := s.(idemstore.Notifier); ok && s.Capabilities().Notify {
							_, c, err := n.Subscribe(ctx, rec.Key)
							if err != nil {
								t.Errorf("Subscribe during the business transaction: %v", err)
								return
							}
							cancel = c
						}
					})
					if cancel != nil {
						cancel()
					}
					if extendErr != nil {
						t.Fatalf("round %d: Extend during the business transaction: %v", round, extendErr)
					}
					if err != nil {
						t.Fatalf("round %d: CompleteTx and commit after a heartbeat and a waiter touched the record: %v", round, err)
					}
					if !committed(f, id) {
						t.Fatalf("round %d: the business row did not commit", round)
					}
					if got := f.get(rec.Key); got.State != idemstore.StateCompleted || got.Token != rec.Token {
						t.Fatalf("round %d: record %q token %q, want completed by the holder", round, got.State, got.Token)
					}
				}
			})
		})
	}
}
