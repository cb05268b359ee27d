package idem_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// runLease begins key and runs fn under its lease with Lease.Run.
func runLease(t *testing.T, e *idem.Engine, key string, kind idem.Kind, fn func(ctx context.Context) (*idem.Response, error)) (*idem.Lease, *idem.Response, error) {
	t.Helper()
	res, err := e.Begin(context.Background(), jobReq(key, kind))
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Begin: %v, %v", res.Outcome, err)
	}
	resp, err := res.Lease.Run(context.Background(), fn)
	return res.Lease, resp, err
}

func answer(body string) *idem.Response {
	return &idem.Response{Status: http.StatusOK, Body: []byte(body)}
}

// Lease.Run settles the lease by how the work ended, as Do does: an answer
// is stored, Retryable releases, Ambiguous escalates, a plain error goes by
// kind, and a panic escalates whatever the kind (as the HTTP middleware
// does) and goes on.
func TestLeaseRunSettles(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name  string
		kind  idem.Kind
		fn    func(ctx context.Context) (*idem.Response, error)
		state idem.LeaseState
		rec   idemstore.State // "" when released
	}{
		{"answer", idem.External, func(ctx context.Context) (*idem.Response, error) {
			if idem.LeaseFrom(ctx) == nil {
				return nil, errors.New("no lease in the context")
			}
			return answer("done"), nil
		}, idem.LeaseCompleted, idemstore.StateCompleted},
		{"retryable", idem.External, func(context.Context) (*idem.Response, error) { return nil, idem.Retryable(boom) }, idem.LeaseReleased, ""},
		{"ambiguous", idem.Transactional, func(context.Context) (*idem.Response, error) { return nil, idem.Ambiguous(boom) }, idem.LeaseEscalated, idemstore.StateNeedsReview},
		{"plain external", idem.External, func(context.Context) (*idem.Response, error) { return nil, boom }, idem.LeaseEscalated, idemstore.StateNeedsReview},
		{"plain transactional", idem.Transactional, func(context.Context) (*idem.Response, error) { return nil, boom }, idem.LeaseReleased, ""},
		{"panic transactional", idem.Transactional, func(context.Context) (*idem.Response, error) { panic("kaboom") }, idem.LeaseEscalated, idemstore.StateNeedsReview},
		{"no answer", idem.External, func(context.Context) (*idem.Response, error) { return nil, nil }, idem.LeaseEscalated, idemstore.StateNeedsReview},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, store := newEngine(t, quiet(idem.EngineConfig{}))
			var lease *idem.Lease
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil && p != "kaboom" {
						t.Fatalf("panic %v", p)
					}
				}()
				lease, _, err = runLease(t, e, "k", tc.kind, tc.fn)
			}()
			if lease == nil { // it panicked: find the lease's state in the store
				rec, gerr := store.Get(context.Background(), jobReq("k", tc.kind).Key)
				if gerr != nil || rec.State != tc.rec {
					t.Fatalf("after the panic the record is %+v, %v; want %s", rec, gerr, tc.rec)
				}
				return
			}
			if got := lease.State(); got != tc.state {
				t.Fatalf("lease state %v, want %v (err %v)", got, tc.state, err)
			}
			if (tc.state == idem.LeaseCompleted) == (err != nil) {
				t.Fatalf("err = %v", err)
			}
			rec, gerr := store.Get(context.Background(), jobReq("k", tc.kind).Key)
			switch {
			case tc.rec == "" && !errors.Is(gerr, idemstore.ErrNotFound):
				t.Fatalf("record %+v, %v; want it released", rec, gerr)
			case tc.rec != "" && (gerr != nil || rec.State != tc.rec):
				t.Fatalf("record %+v, %v; want %s", rec, gerr, tc.rec)
			}
		})
	}
}

// A store that cannot complete: the work ran, so its key goes to review.
func TestLeaseRunCompleteFails(t *testing.T) {
	t.Parallel()
	_, store := newEngine(t, quiet(idem.EngineConfig{}))
	e, err := idem.NewEngine(completeFails{store}, quiet(idem.EngineConfig{SettleTimeout: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	lease, _, err := runLease(t, e, "k", idem.Transactional, func(context.Context) (*idem.Response, error) { return answer("x"), nil })
	if err == nil || lease.State() != idem.LeaseEscalated {
		t.Fatalf("err %v, state %v; want an error and the key escalated", err, lease.State())
	}
}

// fn completes the lease in its own transaction: committed returns what it
// stored; rolled back releases a transactional key and escalates an
// external one.
func TestLeaseRunCompleteTx(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		kind   idem.Kind
		commit bool
		state  idem.LeaseState
	}{
		{"committed", idem.Transactional, true, idem.LeaseCompleted},
		{"rolled back transactional", idem.Transactional, false, idem.LeaseReleased},
		{"rolled back external", idem.External, false, idem.LeaseEscalated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, store, cleanup := openSQLite()
			t.Cleanup(cleanup)
			e, err := idem.NewEngine(store, quiet(idem.EngineConfig{}))
			if err != nil {
				t.Fatal(err)
			}
			lease, resp, err := runLease(t, e, "k", tc.kind, func(ctx context.Context) (*idem.Response, error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return nil, err
				}
				defer tx.Rollback()
				if err := store.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), answer("in tx")); err != nil {
					return nil, err
				}
				if !tc.commit {
					return answer("not this"), nil // the deferred rollback undoes it
				}
				return answer("not this"), tx.Commit()
			})
			if got := lease.State(); got != tc.state {
				t.Fatalf("lease state %v, want %v (err %v)", got, tc.state, err)
			}
			if tc.commit && (err != nil || resp == nil || string(resp.Body) != "in tx") {
				t.Fatalf("Run = %+v, %v; want the answer stored in the transaction", resp, err)
			}
			if !tc.commit && err == nil {
				t.Fatal("a rolled-back transaction returned no error")
			}
		})
	}
}

// fn completes the lease in a transaction that commits, then calls
// CompleteTx again with another answer, in a second transaction that fails
// (a retry after a commit whose acknowledgement was lost, say): Run
// returns what committed, the answer every later call replays, not the
// last one fn tried to store.
func TestLeaseRunCompleteTxReturnsWhatCommitted(t *testing.T) {
	t.Parallel()
	db, store, cleanup := openSQLite()
	t.Cleanup(cleanup)
	e, err := idem.NewEngine(store, quiet(idem.EngineConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	complete := func(ctx context.Context, body string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := store.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), answer(body)); err != nil {
			return err
		}
		return tx.Commit()
	}
	lease, resp, err := runLease(t, e, "k", idem.Transactional, func(ctx context.Context) (*idem.Response, error) {
		if err := complete(ctx, "committed"); err != nil {
			return nil, err
		}
		return nil, complete(ctx, "tried again")
	})
	if err != nil || resp == nil || string(resp.Body) != "committed" || lease.State() != idem.LeaseCompleted {
		t.Fatalf("Run = %+v, %v (lease %v); want the answer that committed", resp, err, lease.State())
	}
}
