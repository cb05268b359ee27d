package idemmysql_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// TestBatchFencedLocksOnlyItsRows: a batch of one live and two stale calls
// of each kind (their records are completed, so the optimistic try matches
// fewer rows and the locking rerun runs too) must not wait for a record it
// has no business with: a pending record of another scope whose row
// another transaction holds, by SELECT … FOR UPDATE or by an application's
// CompleteTx not yet committed. With few pending records MariaDB otherwise
// reads a batched Release, Extend or Escalate through the index on (state,
// lease_until), every pending record. The sessions' lock wait timeout is
// one second, so that a wait shows as an error rather than a hang.
func TestBatchFencedLocksOnlyItsRows(t *testing.T) {
	t.Parallel()
	for _, holder := range []string{"for-update", "completetx"} {
		for _, kind := range []string{"release", "extend", "escalate", "complete"} {
			t.Run(holder+"/"+kind, func(t *testing.T) {
				t.Parallel()
				s, db := newStoreDSN(t, "&innodb_lock_wait_timeout=1")
				ctx := t.Context()
				a := batchtest.Key("a")
				seed(t, s, a, "t-a")
				var done []idemstore.Key
				for _, name := range []string{"b", "c", "d"} {
					k := batchtest.Key(name)
					seed(t, s, k, "t-"+name)
					if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t-" + name, Response: &idemstore.Response{Status: 200}, Retention: time.Hour}); err != nil {
						t.Fatal(err)
					}
					done = append(done, k)
				}
				x := idemstore.Key{Scope: "someone else", Operation: "GET /x", Key: "x"}
				seed(t, s, x, "t-x")
				if _, err := db.Exec("ANALYZE TABLE idem_records"); err != nil {
					t.Fatal(err)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback() }()
				if holder == "completetx" {
					if err := s.CompleteTx(ctx, tx, txLease{key: x, token: "t-x", retention: time.Hour}, &idemstore.Response{Status: 200}); err != nil {
						t.Fatal(err)
					}
				} else {
					var one int
					if err := tx.QueryRow("SELECT 1 FROM idem_records WHERE scope = ? AND operation = ? AND `key` = ? FOR UPDATE", x.Scope, x.Operation, x.Key).Scan(&one); err != nil {
						t.Fatal(err)
					}
				}
				call := func(k idemstore.Key, tok string) func() batchtest.Result {
					return batchtest.Call(func() error {
						switch kind {
						case "release":
							return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: tok})
						case "extend":
							return s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: tok, Lease: time.Minute})
						case "escalate":
							return s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: "r"})
						}
						return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: &idemstore.Response{Status: 201}, Retention: time.Hour})
					})
				}
				got := batchtest.InOneBatch(t, s.Batcher(), call(a, "t-a"), call(done[0], "t-b"), call(done[1], "t-c"))
				if got[0].Err != nil {
					t.Errorf("live %s beside a row another transaction holds: %v", kind, got[0].Err)
				}
				for i, r := range got[1:] {
					if !errors.Is(r.Err, idemstore.ErrLeaseLost) {
						t.Errorf("stale %s %d: %v, want ErrLeaseLost", kind, i, r.Err)
					}
				}
				rec, err := s.Get(ctx, a)
				want := map[string]idemstore.State{"extend": idemstore.StatePending, "escalate": idemstore.StateNeedsReview, "complete": idemstore.StateCompleted}[kind]
				switch {
				case kind == "release" && !errors.Is(err, idemstore.ErrNotFound):
					t.Errorf("after the batched release: %+v, %v; want no record", rec, err)
				case kind != "release" && (err != nil || rec.State != want):
					t.Errorf("after the batched %s: %+v, %v; want %s", kind, rec, err, want)
				}
			})
		}
	}
}

// TestBatchCrossKindOrder: two stores (two processes) each batch a live
// Complete of one key with a stale Release of the other's key. The
// optimistic try takes its rows by kind of call (the Completes' statement,
// then the Releases'), so the two batches take k1 and k2 in opposite
// orders and the server kills one as a deadlock's victim; that batch must
// run again, locking in key order, and not fail its callers with
// ErrRetryable.
func TestBatchCrossKindOrder(t *testing.T) {
	t.Parallel()
	db, cfg := newDatabase(t, "")
	a, err := idemmysql.New(db, idemmysql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := idemmysql.New(openDB(t, cfg), idemmysql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for i := range 10 {
		k1, k2 := batchtest.Key(fmt.Sprintf("%d-1", i)), batchtest.Key(fmt.Sprintf("%d-2", i))
		seed(t, a, k1, "live1")
		seed(t, a, k2, "live2")
		var ra, rb []batchtest.Result
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			ra = batchtest.InOneBatch(t, a.Batcher(),
				batchtest.Complete(ctx, a, k1, "live1", time.Hour),
				batchtest.Call(func() error { return a.Release(ctx, idemstore.ReleaseParams{Key: k2, Token: "stale"}) }))
		})
		wg.Go(func() {
			<-start
			rb = batchtest.InOneBatch(t, b.Batcher(),
				batchtest.Complete(ctx, b, k2, "live2", time.Hour),
				batchtest.Call(func() error { return b.Release(ctx, idemstore.ReleaseParams{Key: k1, Token: "stale"}) }))
		})
		close(start)
		wg.Wait()
		for j, r := range []batchtest.Result{ra[0], rb[0]} {
			if r.Err != nil {
				t.Errorf("iteration %d: live Complete of k%d: %v", i, j+1, r.Err)
			}
		}
		for j, r := range []batchtest.Result{ra[1], rb[1]} {
			if !errors.Is(r.Err, idemstore.ErrLeaseLost) {
				t.Errorf("iteration %d: stale Release of k%d: %v, want ErrLeaseLost", i, 2-j, r.Err)
			}
		}
		for _, k := range []idemstore.Key{k1, k2} {
			if rec, err := a.Get(ctx, k); err != nil || rec.State != idemstore.StateCompleted {
				t.Errorf("iteration %d: %s after both batches: %+v, %v; want completed", i, k.Key, rec, err)
			}
		}
	}
}
