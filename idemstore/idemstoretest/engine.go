package idemstoretest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// testEngine runs idem's engine over the store, under the faults the store
// must let the engine survive: skewed clocks between instances, recovery
// racing a heartbeat, a reply lost after a commit, a context cancelled
// mid-write, a store that blips once.
//
// Each subtest has a store of its own: Recover acts on every expired lease in
// a store, not only its own scope's.
func testEngine(t *testing.T, h Harness) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	engine := func(t *testing.T, st idemstore.Store, skew time.Duration) *idem.Engine {
		t.Helper()
		e, err := idem.NewEngine(st, idem.EngineConfig{
			Lease:  leaseLive,
			Now:    func() time.Time { return time.Now().Add(skew) },
			Logger: quiet,
			// Settlement retries transient errors with short pauses; a
			// store that stays down still ends the test quickly.
			SettleTimeout: 5 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	request := func(f *fixture, name string, kind idem.Kind) idem.Request {
		return idem.Request{Key: f.key(name), Fingerprint: "fp-" + name, Kind: kind}
	}
	begin := func(t *testing.T, e *idem.Engine, req idem.Request, want idem.Outcome) idem.Result {
		t.Helper()
		res, err := e.Begin(t.Context(), req)
		if err != nil {
			t.Fatalf("Begin(%v): %v", req.Key, err)
		}
		if res.Outcome != want {
			t.Fatalf("Begin(%v) = %v, want %v", req.Key, res.Outcome, want)
		}
		return res
	}

	t.Run("SkewedClocks", func(t *testing.T) {
		t.Parallel()
		s := h.New(t)
		f := newFixture(t, s)
		// The holder's clock is behind; the others are hours ahead, far
		// past its lease by their own clocks. Only the store's clock
		// counts: they see the lease alive.
		holder := engine(t, s, -2*hour)
		ahead := engine(t, s, 3*hour)
		for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
			req := request(f, "k-"+kind.String(), kind)
			lease := begin(t, holder, req, idem.Acquired).Lease
			res := begin(t, ahead, req, idem.InFlight)
			if res.RetryAfter < time.Second || res.RetryAfter > leaseLive {
				t.Fatalf("%v: RetryAfter %v, want 1s..%v", kind, res.RetryAfter, leaseLive)
			}
			rep, err := ahead.Recover(t.Context(), idem.RecoverOptions{KindOf: func(idem.Key) idem.Kind { return kind }})
			if err != nil {
				t.Fatalf("Recover: %v", err)
			}
			if rep.Released+rep.Escalated != 0 {
				t.Fatalf("%v: a recovery whose clock runs ahead changed a live lease: %+v", kind, rep)
			}
			if err := lease.Complete(t.Context(), &idem.Response{Status: 201, Body: []byte(`{"ok":true}`)}); err != nil {
				t.Fatalf("%v: the holder's Complete: %v", kind, err)
			}
			begin(t, ahead, req, idem.Replayed)
		}
	})

	t.Run("ExpiredByTheStoresClock", func(t *testing.T) {
		t.Parallel()
		s := h.New(t)
		f := newFixture(t, s)
		// A holder died: its lease expired by the store's clock. An engine
		// whose clock is far behind still acts on it.
		behind := engine(t, s, -3*hour)
		for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
			req := request(f, "k-"+kind.String(), kind)
			f.reserveWith(idemstore.ReserveParams{Key: req.Key, Fingerprint: req.Fingerprint, Token: newToken(), Lease: leaseExpired})
			want := idem.NeedsReview
			if kind == idem.Transactional {
				want = idem.Acquired
			}
			res := begin(t, behind, req, want)
			if kind == idem.Transactional && !res.TookOver {
				t.Fatal("a transactional key acquired over an expired lease, without TookOver")
			}
		}
	})

	t.Run("RecoverRacesHeartbeat", func(t *testing.T) {
		t.Parallel()
		s := h.New(t)
		f := newFixture(t, s)
		for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
			rec := f.reserve(f.key("k-"+kind.String()), leaseExpired)
			// The holder's heartbeat lands between recovery's listing and
			// its change.
			hooked := &faultStore{Store: s, afterList: func() { f.extend(rec, leaseLive) }}
			rep, err := engine(t, hooked, 0).Recover(t.Context(), idem.RecoverOptions{KindOf: func(idem.Key) idem.Kind { return kind }})
			if err != nil {
				t.Fatalf("%v: Recover: %v", kind, err)
			}
			if rep.Released+rep.Escalated != 0 {
				t.Fatalf("%v: Recover acted on a lease extended after it listed it: %+v", kind, rep)
			}
			if got := f.get(rec.Key); got.State != idemstore.StatePending || got.Token != rec.Token || got.LeaseExpired() {
				t.Fatalf("%v: after Recover the record is %q token %q lease until %v", kind, got.State, got.Token, got.LeaseUntil)
			}
		}
	})

	t.Run("BeginRacesHeartbeat", func(t *testing.T) {
		t.Parallel()
		s := h.New(t)
		f := newFixture(t, s)
		for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
			req := request(f, "k-"+kind.String(), kind)
			rec := f.reserveWith(idemstore.ReserveParams{Key: req.Key, Fingerprint: req.Fingerprint, Token: newToken(), Lease: leaseExpired})
			// Begin finds the lease expired; the heartbeat lands before it
			// escalates or takes over. Begin must see the lease alive.
			hooked := &faultStore{Store: s}
			hooked.afterReserve = func() { hooked.afterReserve = nil; f.extend(rec, leaseLive) }
			begin(t, engine(t, hooked, 0), req, idem.InFlight)
		}
	})

	t.Run("ReserveReplyLost", func(t *testing.T) {
		t.Parallel()
		s := h.New(t)
		f := newFixture(t, s)
		// The insert commits; the reply does not arrive (or the client's
		// context ends right after the commit). Nobody holds the token: the
		// engine must release it, or the key would wait for its lease and
		// then, for an external operation, go to review though nothing ran.
		for i, fault := range []func(ctx context.Context, cancel func()) error{
			func(context.Context, func()) error { return fmt.Errorf("reply lost: %w", idemstore.ErrUnavailable) },
			func(ctx context.Context, cancel func()) error { cancel(); return ctx.Err() },
		} {
			req := request(f, fmt.Sprintf("k%d", i), idem.External)
			ctx, cancel := context.WithCancel(t.Context())
			hooked := &faultStore{Store: s, reserveErr: func(ctx context.Context) error { return fault(ctx, cancel) }}
			if _, err := engine(t, hooked, 0).Begin(ctx, req); err == nil {
				t.Fatalf("fault %d: Begin succeeded though Reserve failed", i)
			}
			cancel()
			f.requireGone(req.Key)
			begin(t, engine(t, s, 0), req, idem.Acquired) // and the retry runs
		}
	})

	t.Run("SettlementOutlivesTheClient", func(t *testing.T) {
		t.Parallel()
		s := h.New(t)
		f := newFixture(t, s)
		e := engine(t, s, 0)
		for i, settle := range []func(ctx context.Context, l *idem.Lease) error{
			func(ctx context.Context, l *idem.Lease) error { return l.Complete(ctx, &idem.Response{Status: 201}) },
			func(ctx context.Context, l *idem.Lease) error { return l.Escalate(ctx, "unknown") },
			func(ctx context.Context, l *idem.Lease) error { return l.Release(ctx) },
		} {
			req := request(f, fmt.Sprintf("k%d", i), idem.External)
			lease := begin(t, e, req, idem.Acquired).Lease
			ctx, cancel := context.WithCancel(t.Context())
			cancel() // the client hung up before settlement
			if err := settle(ctx, lease); err != nil {
				t.Fatalf("settlement %d with the client's context cancelled: %v", i, err)
			}
			want := []idem.Outcome{idem.Replayed, idem.NeedsReview, idem.Acquired}[i]
			begin(t, e, req, want)
		}
	})

	t.Run("SettlementSurvivesABlip", func(t *testing.T) {
		t.Parallel()
		s := h.New(t)
		f := newFixture(t, s)
		for i, mode := range []string{"fails before", "applied, reply lost"} {
			req := request(f, fmt.Sprintf("k%d", i), idem.External)
			hooked := &faultStore{Store: s}
			e := engine(t, hooked, 0)
			lease := begin(t, e, req, idem.Acquired).Lease
			hooked.blipCompleteOnce(mode == "applied, reply lost")
			if err := lease.Complete(t.Context(), &idem.Response{Status: 201, Body: []byte("first")}); err != nil {
				t.Fatalf("%s: Complete: %v", mode, err)
			}
			res := begin(t, e, req, idem.Replayed)
			if string(res.Response.Body) != "first" {
				t.Fatalf("%s: replayed %q", mode, res.Response.Body)
			}
		}
	})
}

// faultStore wraps a store with injected faults and hooks.
type faultStore struct {
	idemstore.Store
	afterList    func()                          // after ListExpiredLeases returns
	afterReserve func()                          // after a Reserve that found a record
	reserveErr   func(ctx context.Context) error // after a Reserve that created one: fail with this
	completeBlip func(ctx context.Context, p idemstore.CompleteParams) error
}

func (s *faultStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	rec, created, err := s.Store.Reserve(ctx, p)
	if err == nil && created && s.reserveErr != nil {
		return nil, false, s.reserveErr(ctx)
	}
	if err == nil && !created && s.afterReserve != nil {
		s.afterReserve()
	}
	return rec, created, err
}

func (s *faultStore) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	recs, err := s.Store.ListExpiredLeases(ctx, limit)
	if s.afterList != nil {
		s.afterList()
	}
	return recs, err
}

// blipCompleteOnce makes the next Complete fail with ErrUnavailable, after
// applying it when applied is true.
func (s *faultStore) blipCompleteOnce(applied bool) {
	s.completeBlip = func(ctx context.Context, p idemstore.CompleteParams) error {
		s.completeBlip = nil
		if applied {
			if err := s.Store.Complete(ctx, p); err != nil {
				return err
			}
		}
		return fmt.Errorf("connection reset: %w", idemstore.ErrUnavailable)
	}
}

func (s *faultStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if blip := s.completeBlip; blip != nil {
		return blip(ctx, p)
	}
	return s.Store.Complete(ctx, p)
}
