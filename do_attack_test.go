package idem_test

// Attacks on Do and DoTx: answers stored by someone other than Do, errors
// that mix Retryable and Ambiguous, results that no longer decode, stores
// that blip or lose a reply while the result is stored, and concurrent
// calls that disagree about the job.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// An operator (or a Resolver) settles a job's key in review as completed
// with a failure answer: a 502 and a problem document. Do's own results are
// always 200 JSON; a replay of another status must not come back as a
// successful zero value of T, and fn must not run.
func TestAttackDoReplayOfAnotherStatus(t *testing.T) {
	t.Parallel()
	forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
		e := open(idem.EngineConfig{})
		ctx := context.Background()
		r := jobReq("k", idem.External)
		type payout struct {
			ID string `json:"id"`
		}
		if _, err := idem.Do(ctx, e, r, func(context.Context) (payout, error) {
			return payout{}, idem.Ambiguous(errors.New("provider timed out"))
		}); err == nil {
			t.Fatal("Do of an ambiguous failure returned no error")
		}
		rec, err := e.Store().Get(ctx, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Store().Resolve(ctx, idemstore.ResolveParams{Key: r.Key, Action: idemstore.ResolveComplete, Token: rec.Token, Retention: time.Hour,
			Response: &idem.Response{Status: 502, Header: map[string][]string{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"title":"declined at the provider"}`)}}); err != nil {
			t.Fatal(err)
		}
		runs := 0
		v, err := idem.Do(ctx, e, r, func(context.Context) (payout, error) { runs++; return payout{ID: "po_2"}, nil })
		var oe *idem.OutcomeError
		if runs != 0 || !errors.As(err, &oe) || !errors.Is(err, idem.ErrNotAResult) || oe.Outcome != idem.Replayed || oe.Record == nil || oe.Record.Response.Status != 502 {
			t.Fatalf("Do = %+v, %v (ran %d times); want an OutcomeError with the stored 502", v, err, runs)
		}
		if !strings.Contains(err.Error(), "status 502") {
			t.Fatalf("message %q", err)
		}
		// A 200 stored the same way is a result like any other.
		r2 := jobReq("k2", idem.External)
		idem.Do(ctx, e, r2, func(context.Context) (payout, error) { return payout{}, idem.Ambiguous(errors.New("timeout")) })
		rec, _ = e.Store().Get(ctx, r2.Key)
		if err := e.Store().Resolve(ctx, idemstore.ResolveParams{Key: r2.Key, Action: idemstore.ResolveComplete, Token: rec.Token, Retention: time.Hour,
			Response: &idem.Response{Status: 200, Body: []byte(`{"id":"po_1"}`)}}); err != nil {
			t.Fatal(err)
		}
		if v, err := idem.Do(ctx, e, r2, func(context.Context) (payout, error) { runs++; return payout{}, nil }); err != nil || v.ID != "po_1" || runs != 0 {
			t.Fatalf("Do = %+v, %v (ran %d times)", v, err, runs)
		}
	})
}

// fn's error joins a Retryable failure with an Ambiguous one (two calls, one
// refused, one timed out): the key must go to review, whichever comes first.
func TestAttackDoJoinedFailures(t *testing.T) {
	t.Parallel()
	refused := idem.Retryable(errors.New("the bank refused: nothing happened"))
	timedOut := idem.Ambiguous(errors.New("the provider timed out"))
	for _, tc := range []struct {
		name     string
		err      error
		kind     idem.Kind
		released bool
	}{
		{"retryable then ambiguous", errors.Join(refused, timedOut), idem.Transactional, false},
		{"ambiguous then retryable", errors.Join(timedOut, refused), idem.Transactional, false},
		{"wrapped ambiguous", errors.Join(refused, fmt.Errorf("step 2: %w", timedOut)), idem.Transactional, false},
		{"retryable twice", errors.Join(refused, idem.Retryable(errors.New("again"))), idem.External, true},
		{"retryable and unmarked, external", errors.Join(refused, errors.New("the ledger call failed")), idem.External, false},
		{"retryable and unmarked, transactional", errors.Join(refused, errors.New("the ledger call failed")), idem.Transactional, true},
		{"wrapped retryable", fmt.Errorf("charging: %w", refused), idem.External, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, _ := newEngine(t, quiet(idem.EngineConfig{}))
			r := jobReq("k", tc.kind)
			if _, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { return 0, tc.err }); err != tc.err {
				t.Fatalf("Do = %v, want fn's very error", err)
			}
			runs := 0
			_, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { runs++; return 1, nil })
			if tc.released && (err != nil || runs != 1) {
				t.Fatalf("after a retryable failure: %v, ran %d times", err, runs)
			}
			if !tc.released && (!errors.Is(err, idem.ErrNeedsReview) || runs != 0) {
				t.Fatalf("after an ambiguous failure: %v, ran %d times", err, runs)
			}
		})
	}
}

// The result's type changed between deployments: the stored JSON does not
// decode into the new T. Do says so and does not run fn again.
func TestAttackDoReplayDoesNotDecode(t *testing.T) {
	t.Parallel()
	forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
		e := open(idem.EngineConfig{})
		ctx := context.Background()
		r := jobReq("k", idem.Transactional)
		if _, err := idem.Do(ctx, e, r, func(context.Context) (int, error) { return 42, nil }); err != nil {
			t.Fatal(err)
		}
		runs := 0
		_, err := idem.Do(ctx, e, r, func(context.Context) (struct{ ID string }, error) { runs++; return struct{ ID string }{"x"}, nil })
		var oe *idem.OutcomeError
		var je *json.UnmarshalTypeError
		if runs != 0 || !errors.As(err, &oe) || oe.Outcome != idem.Replayed || errors.Is(err, idem.ErrNotReplayable) || !errors.As(err, &je) {
			t.Fatalf("Do = %v (ran %d times)", err, runs)
		}
	})
}

// blipStore fails the first Complete: before applying it (lost=false), or
// after (lost=true: the reply was lost).
type blipStore struct {
	*idemmem.Store
	lost  bool
	blips atomic.Int32
}

func (s *blipStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if s.blips.Add(1) == 1 {
		if s.lost {
			if err := s.Store.Complete(ctx, p); err != nil {
				return err
			}
		}
		return fmt.Errorf("connection reset by peer: %w", idemstore.ErrUnavailable)
	}
	return s.Store.Complete(ctx, p)
}

// The store blips once while Do stores the result, or stores it and loses
// the reply: Do returns the result, and the next call replays it.
func TestAttackDoCompleteBlipsOnce(t *testing.T) {
	t.Parallel()
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprint("lost=", lost), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				st := &blipStore{Store: idemmem.MustNew(idemmem.Config{}), lost: lost}
				defer st.Close()
				e, err := idem.NewEngine(st, quiet(idem.EngineConfig{}))
				if err != nil {
					t.Fatal(err)
				}
				idem.SetHeartbeatLinger(e, 0)
				r := jobReq("k", idem.External)
				runs := 0
				fn := func(context.Context) (int, error) { runs++; return 7, nil }
				for range 2 {
					if v, err := idem.Do(context.Background(), e, r, fn); v != 7 || err != nil {
						t.Fatalf("Do = %v, %v", v, err)
					}
				}
				if runs != 1 || st.blips.Load() < 2 && !lost {
					t.Fatalf("fn ran %d times; Complete called %d times", runs, st.blips.Load())
				}
			})
		})
	}
}

// Concurrent calls with one key and two fingerprints: fn runs once; the
// others are told the key is in flight or was used for another job; once
// done, the other fingerprint gets ErrMismatch and the same one the result.
func TestAttackDoConcurrentFingerprints(t *testing.T) {
	t.Parallel()
	forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
		e := open(idem.EngineConfig{})
		ctx := context.Background()
		var runs atomic.Int32
		var winner atomic.Value
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				r := jobReq("k", idem.Transactional)
				r.Fingerprint = fmt.Sprint("v1:", i%2)
				v, err := idem.Do(ctx, e, r, func(context.Context) (string, error) {
					runs.Add(1)
					winner.Store(r.Fingerprint)
					return r.Fingerprint, nil
				})
				switch {
				case err == nil && v == r.Fingerprint:
				case errors.Is(err, idem.ErrInFlight), errors.Is(err, idem.ErrMismatch):
				default:
					t.Errorf("Do = %q, %v", v, err)
				}
			})
		}
		wg.Wait()
		if runs.Load() != 1 {
			t.Fatalf("fn ran %d times", runs.Load())
		}
		won := winner.Load().(string)
		for _, fp := range []string{"v1:0", "v1:1"} {
			r := jobReq("k", idem.Transactional)
			r.Fingerprint = fp
			v, err := idem.Do(ctx, e, r, func(context.Context) (string, error) { runs.Add(1); return "", nil })
			if fp == won && (err != nil || v != won) || fp != won && !errors.Is(err, idem.ErrMismatch) {
				t.Fatalf("fingerprint %s after %s won: %q, %v", fp, won, v, err)
			}
		}
		if runs.Load() != 1 {
			t.Fatalf("fn ran %d times", runs.Load())
		}
	})
}

// fn calls runtime.Goexit inside DoTx's transaction: nothing commits, the
// transactional key is released, and the next call runs it.
func TestAttackDoTxGoexit(t *testing.T) {
	t.Parallel()
	b := sqliteTxBackend(t)
	r := idem.Request{Key: idem.Key{Scope: "tenant-1", Operation: "payout", Key: "po_1"}, Fingerprint: "v1:po_1", Kind: idem.Transactional}
	done := make(chan bool)
	go func() {
		returned := false
		defer func() { done <- returned }()
		idem.DoTx(context.Background(), b.engine, r, b.inTx, func(ctx context.Context, tx *sql.Tx) (int, error) {
			if err := b.insert(ctx, tx); err != nil {
				return 0, err
			}
			runtime.Goexit()
			return 1, nil
		})
		returned = true
	}()
	if <-done {
		t.Fatal("DoTx returned from a goroutine that exited")
	}
	if n := b.rows(t); n != 0 {
		t.Fatalf("%d ledger rows committed by an exited job", n)
	}
	v, err := idem.DoTx(context.Background(), b.engine, r, b.inTx, func(ctx context.Context, tx *sql.Tx) (int, error) {
		return 2, b.insert(ctx, tx)
	})
	if v != 2 || err != nil || b.rows(t) != 1 {
		t.Fatalf("DoTx after the exit = %v, %v; %d rows", v, err, b.rows(t))
	}
}

// extendBlips fails the first n Extends, as a store that blips does.
type extendBlips struct {
	*idemmem.Store
	n atomic.Int32
}

func (s *extendBlips) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	if s.n.Add(-1) >= 0 {
		return fmt.Errorf("i/o timeout: %w", idemstore.ErrUnavailable)
	}
	return s.Store.Extend(ctx, p)
}

// The store blips on the first heartbeats of a job that runs for many
// leases (fake time): the heartbeat tries again within the lease, so a
// duplicate still finds the key in flight instead of taking it over.
func TestAttackDoHeartbeatThroughBlips(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		st := &extendBlips{Store: idemmem.MustNew(idemmem.Config{})}
		st.n.Store(2)
		defer st.Close()
		e, err := idem.NewEngine(st, quiet(idem.EngineConfig{Lease: 3 * time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		idem.SetHeartbeatLinger(e, 0)
		ctx := context.Background()
		r := jobReq("k", idem.Transactional)
		var probes []error
		v, err := idem.Do(ctx, e, r, func(context.Context) (int, error) {
			for range 5 {
				time.Sleep(4 * time.Second) // more than a lease each time
				_, err := idem.Do(ctx, e, r, func(context.Context) (int, error) { return 2, nil })
				probes = append(probes, err)
			}
			return 1, nil
		})
		if v != 1 || err != nil {
			t.Fatalf("Do = %v, %v", v, err)
		}
		for i, err := range probes {
			if !errors.Is(err, idem.ErrInFlight) {
				t.Fatalf("duplicate %d during a long job: %v", i, err)
			}
		}
		if st.n.Load() >= 0 {
			t.Fatal("the store never blipped")
		}
	})
}
