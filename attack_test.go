package idem_test

// Attacks on the promise that an operation runs at most once per key, that
// every retry gets the first answer, and that no key is left stuck, under
// faults: lost replies, a store that blips or stays down, cancelled
// contexts, killed processes (emulated by abandoning a lease), heartbeats
// racing recovery, waiters racing a release, concurrent recoveries, and
// CompleteTx inside business transactions on SQLite.
//
// Tests that pass show a fault the code withstands. Tests that begin with
// t.Skip("finding N: …") failed against the code when they were written:
// each describes a weakness, and is kept to be unskipped once it is fixed.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// errDown is what an unreachable store reports.
var errDown = fmt.Errorf("dial tcp 127.0.0.1:1: connection refused: %w", idemstore.ErrUnavailable)

// faultStore wraps a store; each hook, when set, replaces the method (it may
// call the wrapped store itself).
type faultStore struct {
	idemstore.Store
	reserve  func(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error)
	get      func(context.Context, idemstore.Key) (*idemstore.Record, error)
	complete func(context.Context, idemstore.CompleteParams) error
	release  func(context.Context, idemstore.ReleaseParams) error
	escalate func(context.Context, idemstore.EscalateParams) error
	extend   func(context.Context, idemstore.ExtendParams) error
	takeover func(context.Context, idemstore.TakeoverParams) error
}

func (s *faultStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if s.reserve != nil {
		return s.reserve(ctx, p)
	}
	return s.Store.Reserve(ctx, p)
}

func (s *faultStore) Get(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
	if s.get != nil {
		return s.get(ctx, k)
	}
	return s.Store.Get(ctx, k)
}

func (s *faultStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if s.complete != nil {
		return s.complete(ctx, p)
	}
	return s.Store.Complete(ctx, p)
}

func (s *faultStore) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	if s.release != nil {
		return s.release(ctx, p)
	}
	return s.Store.Release(ctx, p)
}

func (s *faultStore) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	if s.escalate != nil {
		return s.escalate(ctx, p)
	}
	return s.Store.Escalate(ctx, p)
}

func (s *faultStore) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	if s.extend != nil {
		return s.extend(ctx, p)
	}
	return s.Store.Extend(ctx, p)
}

func (s *faultStore) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	if s.takeover != nil {
		return s.takeover(ctx, p)
	}
	return s.Store.Takeover(ctx, p)
}

// atkEngine returns an engine over st with a quiet logger and no lingering
// heartbeat goroutine.
func atkEngine(t testing.TB, st idemstore.Store, cfg idem.EngineConfig) *idem.Engine {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	e, err := idem.NewEngine(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	idem.SetHeartbeatLinger(e, 0)
	return e
}

// atkSQLite opens a SQLite store in t's temporary directory, on the store
// clock now (nil: time.Now).
func atkSQLite(t testing.TB, now func() time.Time) (*sql.DB, *idemsqlite.Store) {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := idemsqlite.New(db, idemsqlite.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return db, st
}

func atkBegin(t *testing.T, e *idem.Engine, r idem.Request, want idem.Outcome) idem.Result {
	t.Helper()
	res, err := e.Begin(context.Background(), r)
	if err != nil {
		t.Fatalf("Begin(%s): %v", r.Key.Key, err)
	}
	if res.Outcome != want {
		t.Fatalf("Begin(%s) outcome = %v, want %v", r.Key.Key, res.Outcome, want)
	}
	return res
}

// --- Recovery and resolution ---------------------------------------------

// Two instances run Recover with the same resolver, as idem serve does on
// every instance. The slow one asked the outside service about attempt 1;
// meanwhile the fast one released attempt 1 (it never happened), the client
// retried, attempt 2 ran (charged) and its outcome is unknown
// (needs_review again). The slow resolver's stale "not happened" must not
// release attempt 2's record: the next retry would charge again.
func TestAttackStaleResolverVerdictReleasesALaterAttempt(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	e := atkEngine(t, mem, idem.EngineConfig{})
	ctx := context.Background()
	r := req("charge") // External
	var charges atomic.Int32

	first := mustBegin(t, e, r, idem.Acquired)
	if err := first.Lease.Escalate(ctx, "crashed before calling the provider"); err != nil {
		t.Fatal(err)
	}
	notHappened := idem.ResolverFunc(func(context.Context, *idemstore.Record) (idem.Resolution, error) {
		return idem.Resolution{Verdict: idem.VerdictNotHappened, Reason: "provider has no charge for this key"}, nil
	})
	slow := idem.ResolverFunc(func(ctx context.Context, rec *idemstore.Record) (idem.Resolution, error) {
		// While this resolver waits for the provider, the other instance
		// settles attempt 1 and the client's retry runs attempt 2.
		if rep, err := e.Recover(ctx, idem.RecoverOptions{Resolver: notHappened}); err != nil || rep.Reopened != 1 {
			t.Errorf("fast Recover = %+v, %v", rep, err)
		}
		second := atkBegin(t, e, r, idem.Acquired)
		charges.Add(1)
		if err := second.Lease.Escalate(ctx, "provider timed out after the charge was sent"); err != nil {
			t.Error(err)
		}
		return idem.Resolution{Verdict: idem.VerdictNotHappened, Reason: "provider had no charge (asked before attempt 2)"}, nil
	})
	if _, err := e.Recover(ctx, idem.RecoverOptions{Resolver: slow}); err != nil {
		t.Fatal(err)
	}
	res, err := e.Begin(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome == idem.Acquired {
		charges.Add(1)
	}
	if res.Outcome != idem.NeedsReview || charges.Load() != 1 {
		t.Fatalf("after a stale verdict: outcome %v, charges %d; want needs_review and 1 charge", res.Outcome, charges.Load())
	}
}

// escalateReplyLost applies Escalate, then loses the reply once.
func escalateReplyLost(inner idemstore.Store) *faultStore {
	var lost atomic.Bool
	fs := &faultStore{Store: inner}
	fs.escalate = func(ctx context.Context, p idemstore.EscalateParams) error {
		if err := inner.Escalate(ctx, p); err != nil {
			return err
		}
		if lost.CompareAndSwap(false, true) {
			return fmt.Errorf("read tcp: connection reset by peer: %w", idemstore.ErrUnavailable)
		}
		return nil
	}
	return fs
}

// An escalation whose reply was lost still moved the key to review; the
// operator must hear of it (OnReview), or the key sits in needs_review with
// nobody told: neither Begin nor Recover ever escalates it again.
func TestAttackOnReviewWhenEscalateReplyLost(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"begin", "recover"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			mem := idemmem.MustNew(idemmem.Config{Now: clk.Now})
			t.Cleanup(func() { mem.Close() })
			var reviews atomic.Int32
			e := atkEngine(t, escalateReplyLost(mem), idem.EngineConfig{Lease: time.Second, Now: clk.Now,
				OnReview: func(context.Context, idem.Key, string) { reviews.Add(1) }})
			ctx := context.Background()
			r := req("k") // External
			atkBegin(t, e, r, idem.Acquired)
			clk.Advance(2 * time.Second) // the holder died
			if via == "begin" {
				_, _ = e.Begin(ctx, r) // escalates; the reply is lost
			} else {
				_, _ = e.Recover(ctx, idem.RecoverOptions{})
			}
			// Later retries and recoveries find the key in review.
			atkBegin(t, e, r, idem.NeedsReview)
			if _, err := e.Recover(ctx, idem.RecoverOptions{}); err != nil {
				t.Fatal(err)
			}
			if n := reviews.Load(); n != 1 {
				t.Fatalf("the key went to needs_review, OnReview was called %d times", n)
			}
		})
	}
}

// Recover racing itself (two instances) never escalates or releases twice,
// and a resolver's completion reaches the retry.
func TestAttackConcurrentRecoverSettlesOnce(t *testing.T) {
	t.Parallel()
	clk := newClock()
	mem := idemmem.MustNew(idemmem.Config{Now: clk.Now})
	t.Cleanup(func() { mem.Close() })
	var reviews atomic.Int32
	e := atkEngine(t, mem, idem.EngineConfig{Lease: time.Second, Now: clk.Now,
		OnReview: func(context.Context, idem.Key, string) { reviews.Add(1) }})
	const n = 20
	kindOf := func(k idem.Key) idem.Kind {
		if strings.HasPrefix(k.Key, "tx") {
			return idem.Transactional
		}
		return idem.External
	}
	for i := 0; i < n; i++ {
		for _, p := range []string{"tx", "ext"} {
			r := req(fmt.Sprintf("%s-%d", p, i))
			r.Kind = kindOf(r.Key)
			atkBegin(t, e, r, idem.Acquired)
		}
	}
	clk.Advance(2 * time.Second)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total idem.RecoverReport
	)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := e.Recover(context.Background(), idem.RecoverOptions{KindOf: kindOf})
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total.Released += rep.Released
			total.Escalated += rep.Escalated
			mu.Unlock()
		}()
	}
	wg.Wait()
	if total.Released != n || total.Escalated != n || reviews.Load() != n {
		t.Fatalf("released %d, escalated %d, reviews %d; want %d each", total.Released, total.Escalated, reviews.Load(), n)
	}
}

// --- Orphans of a failed Reserve or Takeover ----------------------------------

// outageStore fails every call with errDown while down is set.
func outageStore(inner idemstore.Store, down *atomic.Bool) *faultStore {
	fs := &faultStore{Store: inner}
	fs.reserve = func(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
		if down.Load() {
			return nil, false, errDown
		}
		return inner.Reserve(ctx, p)
	}
	fs.get = func(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
		if down.Load() {
			return nil, errDown
		}
		return inner.Get(ctx, k)
	}
	fs.release = func(ctx context.Context, p idemstore.ReleaseParams) error {
		if down.Load() {
			return errDown
		}
		return inner.Release(ctx, p)
	}
	return fs
}

// The store is unreachable for a while, a little longer than settlement
// keeps trying, just when a release must be recorded: the release after a
// handler answered 503 ("nothing happened", by policy). Once the store is
// back, and before the lease ends, the release lands and the retry runs the
// operation; the key does not sit pending until recovery sends it to
// review.
func TestAttackReleaseLostToAShortOutage(t *testing.T) {
	t.Parallel()
	t.Run("release status", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mem := idemmem.MustNew(idemmem.Config{})
			defer mem.Close()
			var down atomic.Bool
			e := atkEngine(t, outageStore(mem, &down), idem.EngineConfig{Lease: 30 * time.Second}) // SettleTimeout 10s
			var runs atomic.Int32
			h := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					down.Store(true) // the outage that made the handler give up
					go func() {
						time.Sleep(15 * time.Second) // the bubble's time: fifteen seconds of outage
						down.Store(false)
					}()
					http.Error(w, "dependency down", http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			post := func() *httptest.ResponseRecorder {
				r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
				r.Header.Set(idem.HeaderName, "k")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			if w := post(); w.Code != http.StatusServiceUnavailable {
				t.Fatalf("first: %d", w.Code)
			}
			time.Sleep(time.Minute)
			if w := post(); w.Code != http.StatusCreated || runs.Load() != 2 {
				t.Fatalf("retry after a 503 (nothing happened): %d %s, runs %d", w.Code, w.Header().Get("Idempotency-Outcome"), runs.Load())
			}
		})
	})
}

// A failed Reserve's orphan release races a retry of the same key: it
// releases only its own token, never the retry's reservation, and between
// the two exactly one attempt runs.
func TestAttackOrphanReleaseRacingARetry(t *testing.T) {
	t.Parallel()
	for _, committed := range []bool{false, true} {
		t.Run(fmt.Sprintf("committed=%v", committed), func(t *testing.T) {
			t.Parallel()
			mem := idemmem.MustNew(idemmem.Config{})
			t.Cleanup(func() { mem.Close() })
			other := atkEngine(t, mem, idem.EngineConfig{}) // another instance
			r := req("k")
			r.Kind = idem.Transactional
			var retry idem.Result
			var once atomic.Bool
			fs := &faultStore{Store: mem}
			fs.reserve = func(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
				if !once.CompareAndSwap(false, true) {
					return mem.Reserve(ctx, p)
				}
				if committed {
					if _, _, err := mem.Reserve(ctx, p); err != nil {
						return nil, false, err
					}
				}
				// Before this instance hears back, the client's retry
				// reaches the other instance.
				res, err := other.Begin(ctx, r)
				if err != nil {
					t.Error(err)
				}
				retry = res
				return nil, false, errDown
			}
			e := atkEngine(t, fs, idem.EngineConfig{})
			if _, err := e.Begin(context.Background(), r); !errors.Is(err, idemstore.ErrUnavailable) {
				t.Fatalf("Begin: %v", err)
			}
			ctx := context.Background()
			if committed {
				// The retry found the orphan in flight; once it is
				// released, the next retry runs.
				if retry.Outcome != idem.InFlight {
					t.Fatalf("retry beside the orphan: %v", retry.Outcome)
				}
				retry = atkBegin(t, other, r, idem.Acquired)
			} else if retry.Outcome != idem.Acquired {
				t.Fatalf("retry: %v", retry.Outcome)
			}
			rec, err := mem.Get(ctx, r.Key)
			if err != nil || rec.Token != retry.Lease.Token() || rec.State != idemstore.StatePending {
				t.Fatalf("the retry's reservation: %+v, %v", rec, err)
			}
			if err := retry.Lease.Complete(ctx, &idem.Response{Status: 201}); err != nil {
				t.Fatal(err)
			}
			atkBegin(t, other, r, idem.Replayed)
		})
	}
}

// A Takeover that went through but whose reply was lost is released as an
// orphan: the old holder stays fenced out, and the next retry runs.
func TestAttackTakeoverReplyLost(t *testing.T) {
	t.Parallel()
	clk := newClock()
	mem := idemmem.MustNew(idemmem.Config{Now: clk.Now})
	t.Cleanup(func() { mem.Close() })
	var lost atomic.Bool
	fs := &faultStore{Store: mem}
	fs.takeover = func(ctx context.Context, p idemstore.TakeoverParams) error {
		if err := mem.Takeover(ctx, p); err != nil {
			return err
		}
		if lost.CompareAndSwap(false, true) {
			return errDown
		}
		return nil
	}
	e := atkEngine(t, fs, idem.EngineConfig{Lease: time.Second, Now: clk.Now})
	ctx := context.Background()
	r := req("k")
	r.Kind = idem.Transactional
	old := atkBegin(t, e, r, idem.Acquired)
	clk.Advance(2 * time.Second)
	if _, err := e.Begin(ctx, r); !errors.Is(err, idemstore.ErrUnavailable) {
		t.Fatalf("Begin whose Takeover reply was lost: %v", err)
	}
	if _, err := mem.Get(ctx, r.Key); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the taken-over reservation was left behind: %v", err)
	}
	if err := old.Lease.Complete(ctx, &idem.Response{Status: 200}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("old holder's Complete: %v", err)
	}
	next := atkBegin(t, e, r, idem.Acquired)
	if err := next.Lease.Complete(ctx, &idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if got := atkBegin(t, e, r, idem.Replayed); got.Response.Status != 201 {
		t.Fatalf("replayed %d", got.Response.Status)
	}
}

// --- Settlement retries ------------------------------------------------------

// A Release whose first attempt fails is retried; meanwhile the key may have
// been released (the reply was lost, or recovery released the expired
// lease) and reserved by the next request. The retried Release is fenced by
// its token: it never deletes the next holder's reservation, and a retried
// Complete never completes it.
func TestAttackRetriedSettlementSparesTheNextHolder(t *testing.T) {
	t.Parallel()
	for _, tc := range []string{"release reply lost", "release failed, recovery released", "complete failed, taken over"} {
		t.Run(tc, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			mem := idemmem.MustNew(idemmem.Config{Now: clk.Now})
			t.Cleanup(func() { mem.Close() })
			other := atkEngine(t, mem, idem.EngineConfig{Lease: time.Second, Now: clk.Now})
			r := req("k")
			r.Kind = idem.Transactional
			var next idem.Result
			var once atomic.Bool
			// Between the failed attempt and its retry, the key changes
			// hands.
			handOver := func(ctx context.Context, released bool) {
				if !released {
					clk.Advance(2 * time.Second)
					if rep, err := other.Recover(ctx, idem.RecoverOptions{KindOf: func(idem.Key) idem.Kind { return idem.Transactional }}); err != nil || rep.Released != 1 {
						t.Errorf("Recover = %+v, %v", rep, err)
					}
				}
				next = atkBegin(t, other, r, idem.Acquired)
			}
			fs := &faultStore{Store: mem}
			fs.release = func(ctx context.Context, p idemstore.ReleaseParams) error {
				if p.IfExpired || !once.CompareAndSwap(false, true) {
					return mem.Release(ctx, p)
				}
				if tc == "release reply lost" {
					if err := mem.Release(ctx, p); err != nil {
						return err
					}
					handOver(ctx, true)
				} else {
					handOver(ctx, false)
				}
				return errDown
			}
			fs.complete = func(ctx context.Context, p idemstore.CompleteParams) error {
				if !once.CompareAndSwap(false, true) {
					return mem.Complete(ctx, p)
				}
				clk.Advance(2 * time.Second)
				next = atkBegin(t, other, r, idem.Acquired) // a takeover
				return errDown
			}
			e := atkEngine(t, fs, idem.EngineConfig{Lease: time.Second, Now: clk.Now})
			ctx := context.Background()
			first := atkBegin(t, e, r, idem.Acquired)
			var err error
			if strings.HasPrefix(tc, "complete") {
				err = first.Lease.Complete(ctx, &idem.Response{Status: 200, Body: []byte("first")})
				if !errors.Is(err, idem.ErrLeaseLost) {
					t.Fatalf("Complete after a takeover: %v", err)
				}
			} else {
				err = first.Lease.Release(ctx)
				if err != nil && !errors.Is(err, idem.ErrLeaseLost) {
					t.Fatalf("Release: %v", err)
				}
			}
			rec, gerr := mem.Get(ctx, r.Key)
			if gerr != nil || rec.Token != next.Lease.Token() || rec.State != idemstore.StatePending {
				t.Fatalf("after the first holder's settlement (%v), the next holder's record: %+v, %v", err, rec, gerr)
			}
			if err := next.Lease.Complete(ctx, &idem.Response{Status: 201, Body: []byte("next")}); err != nil {
				t.Fatal(err)
			}
			if got := atkBegin(t, other, r, idem.Replayed); string(got.Response.Body) != "next" {
				t.Fatalf("replayed %q", got.Response.Body)
			}
		})
	}
}

// A Complete that reports success must have stored its own answer.
// Lease.settle reads the record back after an error and counts "completed
// under this token" as its own completion; but a record completed under
// the token may hold another answer: the lease's earlier Complete, or an
// operator's resolution (Resolve keeps the token). The holder is then told
// its answer was stored when retries get another one.
func TestAttackCompleteClaimsAnAnswerItDidNotStore(t *testing.T) {
	t.Parallel()
	t.Run("second Complete", func(t *testing.T) {
		t.Parallel()
		e, _ := newEngine(t, idem.EngineConfig{})
		ctx := context.Background()
		res := mustBegin(t, e, req("k"), idem.Acquired)
		if err := res.Lease.Complete(ctx, &idem.Response{Status: 201, Body: []byte("first")}); err != nil {
			t.Fatal(err)
		}
		err := res.Lease.Complete(ctx, &idem.Response{Status: 500, Body: []byte("second")})
		got := mustBegin(t, e, req("k"), idem.Replayed)
		if err == nil && string(got.Response.Body) != "second" {
			t.Fatalf("second Complete returned nil, retries get %q", got.Response.Body)
		}
	})
	t.Run("second Escalate", func(t *testing.T) {
		t.Parallel()
		mem := idemmem.MustNew(idemmem.Config{})
		t.Cleanup(func() { mem.Close() })
		var reviews atomic.Int32
		e := atkEngine(t, mem, idem.EngineConfig{OnReview: func(context.Context, idem.Key, string) { reviews.Add(1) }})
		ctx := context.Background()
		res := atkBegin(t, e, req("k"), idem.Acquired)
		if err := res.Lease.Escalate(ctx, "provider timed out"); err != nil {
			t.Fatal(err)
		}
		err := res.Lease.Escalate(ctx, "provider timed out")
		if n := reviews.Load(); n != 1 {
			t.Fatalf("one key went to review once; OnReview was called %d times (second Escalate: %v)", n, err)
		}
	})
	t.Run("resolved meanwhile", func(t *testing.T) {
		t.Parallel()
		clk := newClock()
		mem := idemmem.MustNew(idemmem.Config{Now: clk.Now})
		t.Cleanup(func() { mem.Close() })
		var e *idem.Engine
		var once atomic.Bool
		fs := &faultStore{Store: mem}
		fs.complete = func(ctx context.Context, p idemstore.CompleteParams) error {
			if once.CompareAndSwap(false, true) {
				// The write fails; while the holder backs off, its lease
				// runs out, recovery escalates the key and an operator
				// resolves it with what the provider reports.
				clk.Advance(2 * time.Second)
				if _, err := e.Recover(ctx, idem.RecoverOptions{}); err != nil {
					t.Error(err)
				}
				if err := e.ResolveRecord(ctx, p.Key, &idem.Response{Status: 202, Body: []byte("operator")}, "checked the provider"); err != nil {
					t.Error(err)
				}
				return errDown
			}
			return mem.Complete(ctx, p)
		}
		e = atkEngine(t, fs, idem.EngineConfig{Lease: time.Second, Now: clk.Now})
		ctx := context.Background()
		res := atkBegin(t, e, req("k"), idem.Acquired)
		err := res.Lease.Complete(ctx, &idem.Response{Status: 201, Body: []byte("holder")})
		got := atkBegin(t, e, req("k"), idem.Replayed)
		if err == nil && string(got.Response.Body) != "holder" {
			t.Fatalf("Complete returned nil, retries get %q", got.Response.Body)
		}
	})
}

// --- Heartbeats ---------------------------------------------------------------

// One Extend hangs on a dead connection (the store itself stays healthy) and
// times out after a third of the lease. The heartbeat then waits another
// third before trying again, so its next Extend leaves exactly when the
// lease runs out: with any network latency at all, a recovery or a waiting
// duplicate gets there first. A holder that is alive, on a store that
// answered everything else, loses its key (an external one to review, its
// answer lost).
func TestAttackHeartbeatAfterOneHungExtend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		mem := idemmem.MustNew(idemmem.Config{}) // the bubble's clock
		defer mem.Close()
		var extends atomic.Int32
		fs := &faultStore{Store: mem}
		fs.extend = func(ctx context.Context, p idemstore.ExtendParams) error {
			if extends.Add(1) == 1 {
				<-ctx.Done() // a connection that hangs
				return ctx.Err()
			}
			time.Sleep(time.Millisecond) // a round trip on a healthy connection (bubble time)
			return mem.Extend(ctx, p)
		}
		e := atkEngine(t, fs, idem.EngineConfig{Lease: 30 * time.Second})
		res := atkBegin(t, e, req("k"), idem.Acquired)
		stop := res.Lease.Heartbeat()
		time.Sleep(30*time.Second + 500*time.Microsecond)
		rep, err := e.Recover(context.Background(), idem.RecoverOptions{})
		stop()
		time.Sleep(time.Second) // bubble time: an Extend still on its way lands
		if err != nil {
			t.Fatal(err)
		}
		if rep.Escalated != 0 {
			t.Fatalf("recovery escalated a live holder's key after one hung Extend (%d Extend calls)", extends.Load())
		}
	})
}

// A heartbeat racing recovery on an expired lease: exactly one wins, on the
// store's clock, in one statement. Either the Extend landed first (recovery
// changes nothing) or recovery did (the Extend reports ErrLeaseLost); never
// both. Real goroutines, memory and SQLite.
func TestAttackHeartbeatRacesRecovery(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"memory", "sqlite"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			var st idemstore.Store
			if name == "memory" {
				mem := idemmem.MustNew(idemmem.Config{Now: clk.Now})
				t.Cleanup(func() { mem.Close() })
				st = mem
			} else {
				_, st = atkSQLite(t, clk.Now)
			}
			e := atkEngine(t, st, idem.EngineConfig{Lease: time.Second, Now: clk.Now})
			const n = 24
			leases := make([]*idem.Lease, n)
			for i := range leases {
				r := req(fmt.Sprintf("k%d", i))
				r.Kind = idem.Transactional
				leases[i] = atkBegin(t, e, r, idem.Acquired).Lease
			}
			clk.Advance(2 * time.Second)
			extended := make([]error, n)
			var rep idem.RecoverReport
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				for i := n - 1; i >= 0; i-- { // meet recovery in the middle
					extended[i] = leases[i].Extend(context.Background())
				}
			}()
			go func() {
				defer wg.Done()
				var err error
				rep, err = e.Recover(context.Background(), idem.RecoverOptions{KindOf: func(idem.Key) idem.Kind { return idem.Transactional }})
				if err != nil {
					t.Error(err)
				}
			}()
			wg.Wait()
			released := 0
			for i, l := range leases {
				_, gerr := st.Get(context.Background(), l.Key())
				switch {
				case extended[i] == nil && gerr == nil:
				case errors.Is(extended[i], idem.ErrLeaseLost) && errors.Is(gerr, idemstore.ErrNotFound):
					released++
				default:
					t.Fatalf("key %d: Extend %v, record %v", i, extended[i], gerr)
				}
			}
			if released != rep.Released {
				t.Fatalf("released %d, recovery reports %d", released, rep.Released)
			}
		})
	}
}

// --- Waiters ------------------------------------------------------------------

// Many duplicates wait (Request.Wait) on a key whose holder releases it:
// exactly one acquires and runs, and every other gets its answer.
func TestAttackWaitersRaceARelease(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, _ := newEngine(t, idem.EngineConfig{})
		ctx := context.Background()
		first := mustBegin(t, e, req("k"), idem.Acquired)
		const n = 8
		var acquired, replayed atomic.Int32
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := req("k")
				r.Wait = time.Minute
				res, err := e.Begin(ctx, r)
				switch {
				case err != nil:
					t.Error(err)
				case res.Outcome == idem.Acquired:
					acquired.Add(1)
					if err := res.Lease.Complete(ctx, &idem.Response{Status: 201, Body: []byte("ran")}); err != nil {
						t.Error(err)
					}
				case res.Outcome == idem.Replayed && string(res.Response.Body) == "ran":
					replayed.Add(1)
				default:
					t.Errorf("waiter got %v", res.Outcome)
				}
			}()
		}
		synctest.Wait() // every duplicate is waiting
		if err := first.Lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if acquired.Load() != 1 || replayed.Load() != n-1 {
			t.Fatalf("acquired %d, replayed %d", acquired.Load(), replayed.Load())
		}
	})
}

// --- Clocks -------------------------------------------------------------------

// Instances whose clocks are hours apart share one store: none takes over
// or escalates another's live lease, and a slow clock does not make a
// holder's lease look expired to the fast one. Only the store's clock
// judges leases.
func TestAttackSkewedInstancesKeepLiveLeases(t *testing.T) {
	t.Parallel()
	clk := newClock()
	mem := idemmem.MustNew(idemmem.Config{Now: clk.Now})
	t.Cleanup(func() { mem.Close() })
	ahead := atkEngine(t, mem, idem.EngineConfig{Lease: 10 * time.Second, Now: func() time.Time { return clk.Now().Add(3 * time.Hour) }})
	behind := atkEngine(t, mem, idem.EngineConfig{Lease: 10 * time.Second, Now: func() time.Time { return clk.Now().Add(-3 * time.Hour) }})
	ctx := context.Background()
	for _, kind := range []idem.Kind{idem.Transactional, idem.External} {
		for _, pair := range [][2]*idem.Engine{{behind, ahead}, {ahead, behind}} {
			holder, rival := pair[0], pair[1]
			r := req(fmt.Sprintf("%v-%p", kind, holder))
			r.Kind = kind
			res := atkBegin(t, holder, r, idem.Acquired)
			clk.Advance(9 * time.Second)
			got := atkBegin(t, rival, r, idem.InFlight)
			if got.RetryAfter <= 0 || got.RetryAfter > 10*time.Second {
				t.Fatalf("RetryAfter %v from a skewed instance", got.RetryAfter)
			}
			if rep, err := rival.Recover(ctx, idem.RecoverOptions{KindOf: func(idem.Key) idem.Kind { return kind }}); err != nil || rep != (idem.RecoverReport{}) {
				t.Fatalf("skewed Recover = %+v, %v", rep, err)
			}
			if err := res.Lease.Extend(ctx); err != nil {
				t.Fatal(err)
			}
			clk.Advance(9 * time.Second)
			atkBegin(t, rival, r, idem.InFlight)
			if err := res.Lease.Complete(ctx, &idem.Response{Status: 201}); err != nil {
				t.Fatal(err)
			}
			atkBegin(t, rival, r, idem.Replayed)
		}
	}
}

// --- Middleware -----------------------------------------------------------------

// A client gives up; the handler notices (r.Context() is done) and returns
// without answering, the common Go idiom when nobody is left to answer.
// net/http would send an empty 200, and the middleware stores that: every
// retry then gets "200, empty, replayed", a success nobody saw, for an
// operation that stopped half-way.
func TestAttackClientGoneHandlerAnswersNothing(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		if f.runs.Load() == 1 {
			close(started)
			<-r.Context().Done()
			return // nobody to answer
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charged":true}`)
	})
	ctx, cancel := context.WithCancel(context.Background())
	r := f.request(call{key: "k"}).WithContext(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	<-started
	cancel()
	<-done
	w := f.do(call{key: "k"})
	if w.Header().Get("Idempotent-Replayed") == "true" && w.Code == http.StatusOK && w.Body.Len() == 0 {
		t.Fatalf("the retry got a stored empty 200 that no client ever saw (runs %d)", f.runs.Load())
	}
}

// A handler that ends the lease itself and then panics: the middleware
// stores nothing more, and what the handler recorded stands.
func TestAttackHandlerSettlesThenPanics(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		settle  func(ctx context.Context, l *idem.Lease) error
		outcome string // the retry's Idempotency-Outcome
		runs    int32
	}{
		{"complete", func(ctx context.Context, l *idem.Lease) error {
			return l.Complete(ctx, &idem.Response{Status: 201, Body: []byte("done")})
		}, "replayed", 1},
		{"release", func(ctx context.Context, l *idem.Lease) error { return l.Release(ctx) }, "acquired", 2},
		{"escalate", func(ctx context.Context, l *idem.Lease) error { return l.Escalate(ctx, "unknown") }, "needs_review", 1},
		{"abandon", func(ctx context.Context, l *idem.Lease) error { l.Abandon(); return nil }, "in_flight", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
				if f.runs.Load() > 1 {
					w.WriteHeader(http.StatusCreated)
					return
				}
				if err := tc.settle(r.Context(), idem.LeaseFrom(r.Context())); err != nil {
					t.Error(err)
				}
				panic("after settling")
			})
			func() {
				defer func() {
					if recover() == nil {
						t.Error("the panic was swallowed")
					}
				}()
				f.do(call{key: "k"})
			}()
			w := f.do(call{key: "k"})
			if got := w.Header().Get("Idempotency-Outcome"); got != tc.outcome || f.runs.Load() != tc.runs {
				t.Fatalf("retry: outcome %q (%d), runs %d; want %q, %d", got, w.Code, f.runs.Load(), tc.outcome, tc.runs)
			}
		})
	}
}

// --- CompleteTx on SQLite -----------------------------------------------------

// sqliteTxRoute is a route on SQLite whose handler inserts an order and
// completes its lease in the same transaction; then is told what to do
// next.
type sqliteTxRoute struct {
	db     *sql.DB
	st     *idemsqlite.Store
	h      http.Handler
	runs   atomic.Int32
	events chan idem.Event
}

func newSQLiteTxRoute(t *testing.T, kind idem.Kind, st idemstore.Store, db *sql.DB, sq *idemsqlite.Store, then func(rt *sqliteTxRoute, w http.ResponseWriter, r *http.Request, tx *sql.Tx)) *sqliteTxRoute {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	rt := &sqliteTxRoute{db: db, st: sq, events: make(chan idem.Event, 4)}
	e := atkEngine(t, st, idem.EngineConfig{})
	rt.h = idem.Middleware(e, idem.Config{Scope: idem.GlobalScope, Policy: idem.Policy{Kind: kind},
		OnOutcome: func(ev idem.Event) { rt.events <- ev }})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := rt.runs.Add(1)
			ctx := r.Context()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES ('book')`); err != nil {
				tx.Rollback()
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if err := sq.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), &idem.Response{Status: 201, Body: []byte("stored")}); err != nil {
				tx.Rollback()
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
			if n > 1 || then == nil {
				if err := tx.Commit(); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(201)
				io.WriteString(w, "stored")
				return
			}
			then(rt, w, r, tx)
		}))
	return rt
}

func (rt *sqliteTxRoute) post(ctx context.Context) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`)).WithContext(ctx)
	r.Header.Set(idem.HeaderName, "k")
	w := httptest.NewRecorder()
	rt.h.ServeHTTP(w, r)
	return w
}

func (rt *sqliteTxRoute) orders(t *testing.T) int {
	t.Helper()
	var n int
	if err := rt.db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The handler returns with its transaction still open and commits it
// afterwards (a deferred commit, a hand-off to another goroutine). CheckTx
// then reads the record while it still looks rolled back; the release (or
// escalation) that follows must not undo or hide the commit: it waits on
// SQLite's write lock and then finds the record completed.
func TestAttackCheckTxOnAStillOpenTransaction(t *testing.T) {
	t.Parallel()
	for _, kind := range []idem.Kind{idem.Transactional, idem.External} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			db, sq := atkSQLite(t, nil)
			checked := make(chan struct{})
			var once sync.Once
			fs := &faultStore{Store: sq}
			fs.get = func(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
				rec, err := sq.Get(ctx, k)
				once.Do(func() { close(checked) }) // CheckTx has read the record
				return rec, err
			}
			committed := make(chan error, 1)
			rt := newSQLiteTxRoute(t, kind, fs, db, sq, func(_ *sqliteTxRoute, w http.ResponseWriter, _ *http.Request, tx *sql.Tx) {
				go func() {
					<-checked
					committed <- tx.Commit()
				}()
				w.WriteHeader(201)
				io.WriteString(w, "stored")
			})
			rt.post(context.Background())
			if err := <-committed; err != nil {
				t.Fatalf("the late commit failed: %v", err)
			}
			ev := <-rt.events
			if ev.Settlement != "lost" { // CheckTx saw it open, the settlement found it committed
				t.Fatalf("settlement %q", ev.Settlement)
			}
			w := rt.post(context.Background())
			if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || rt.runs.Load() != 1 || rt.orders(t) != 1 {
				t.Fatalf("after a late commit (settlement %q): retry %d %v, runs %d, orders %d", ev.Settlement, w.Code, w.Header(), rt.runs.Load(), rt.orders(t))
			}
		})
	}
}

// The client leaves while the handler is inside its transaction, after
// CompleteTx: database/sql rolls the transaction back and the handler's
// Commit fails. The middleware reads back that nothing committed and
// releases the key (transactional), so the retry runs once more and
// exactly one order exists.
func TestAttackClientLeavesInsideCompleteTxTransaction(t *testing.T) {
	t.Parallel()
	db, sq := atkSQLite(t, nil)
	inside := make(chan struct{})
	rt := newSQLiteTxRoute(t, idem.Transactional, sq, db, sq, func(_ *sqliteTxRoute, w http.ResponseWriter, r *http.Request, tx *sql.Tx) {
		close(inside)
		<-r.Context().Done()
		if err := tx.Commit(); err == nil {
			t.Error("the commit of a cancelled transaction succeeded")
		}
		http.Error(w, "client gone", http.StatusInternalServerError)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		rt.post(ctx)
	}()
	<-inside
	cancel()
	<-done
	if ev := <-rt.events; ev.Settlement != "released" {
		t.Fatalf("settlement %q", ev.Settlement)
	}
	w := rt.post(context.Background())
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") == "true" || rt.runs.Load() != 2 || rt.orders(t) != 1 {
		t.Fatalf("retry %d %v, runs %d, orders %d", w.Code, w.Header(), rt.runs.Load(), rt.orders(t))
	}
	if w := rt.post(context.Background()); w.Header().Get("Idempotent-Replayed") != "true" || rt.orders(t) != 1 {
		t.Fatalf("second retry %d %v, orders %d", w.Code, w.Header(), rt.orders(t))
	}
}

// The process dies (the lease is dropped) right after the business
// transaction committed with CompleteTx, or right before it: recovery and
// retries then follow what committed. Committed: recovery leaves the record
// alone and retries replay. Not committed: recovery releases it and the
// retry runs once.
func TestAttackKilledAroundCompleteTxCommit(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("committed=%v", commit), func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			db, sq := atkSQLite(t, clk.Now)
			if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			e := atkEngine(t, sq, idem.EngineConfig{Lease: time.Second, Now: clk.Now})
			ctx := context.Background()
			r := req("k")
			r.Kind = idem.Transactional
			runOnce := func(commit bool) {
				res := atkBegin(t, e, r, idem.Acquired)
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(`INSERT INTO orders DEFAULT VALUES`); err != nil {
					t.Fatal(err)
				}
				if err := sq.CompleteTx(ctx, tx, res.Lease, &idem.Response{Status: 201, Body: []byte("order")}); err != nil {
					t.Fatal(err)
				}
				if commit {
					err = tx.Commit()
				} else {
					err = tx.Rollback() // the process died: the database rolls back
				}
				if err != nil {
					t.Fatal(err)
				}
				// The process dies here: nothing settles the lease.
			}
			runOnce(commit)
			clk.Advance(2 * time.Second)
			rep, err := e.Recover(ctx, idem.RecoverOptions{KindOf: func(idem.Key) idem.Kind { return idem.Transactional }})
			if err != nil {
				t.Fatal(err)
			}
			if commit {
				if rep.Released != 0 {
					t.Fatalf("recovery released a committed key: %+v", rep)
				}
			} else {
				if rep.Released != 1 {
					t.Fatalf("recovery: %+v", rep)
				}
				runOnce(true)
			}
			if got := atkBegin(t, e, r, idem.Replayed); string(got.Response.Body) != "order" {
				t.Fatalf("replayed %q", got.Response.Body)
			}
			var n int
			if err := db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("orders %d, %v", n, err)
			}
		})
	}
}

// --- Cancelled contexts on SQLite -------------------------------------------

// A client's context is cancelled while its Begin runs on SQLite, at every
// point of the reservation (the race is real: cancel runs on another
// goroutine). Whatever Begin answers, no reservation is left that nobody
// holds: an error means no record, Acquired means a record pending under
// the lease's token. (An interrupted statement must not leave the
// connection interrupted for the orphan release that follows either.)
func TestAttackCancelledBeginLeavesNoOrphanOnSQLite(t *testing.T) {
	t.Parallel()
	_, sq := atkSQLite(t, nil)
	e := atkEngine(t, sq, idem.EngineConfig{})
	// The release is bounded by wall-clock time (250ms); on a loaded machine
	// a SQLite write can take longer, and the record would rightly wait for
	// recovery instead. What is checked here is that the release happens.
	idem.SetOrphanTimeout(e, 10*time.Second)
	bg := context.Background()
	var acquired, failed int
	for i := 0; i < 200; i++ {
		ctx, cancel := context.WithCancel(bg)
		r := req(fmt.Sprintf("k%d", i))
		go cancel() // races the reservation
		res, err := e.Begin(ctx, r)
		rec, gerr := sq.Get(bg, r.Key)
		switch {
		case err == nil && res.Outcome == idem.Acquired:
			acquired++
			if gerr != nil || rec.Token != res.Lease.Token() || rec.State != idemstore.StatePending {
				t.Fatalf("Acquired, but the record is %+v, %v", rec, gerr)
			}
		case err != nil:
			failed++
			if !errors.Is(gerr, idemstore.ErrNotFound) {
				t.Fatalf("Begin failed (%v) and left a record: %+v, %v", err, rec, gerr)
			}
		default:
			t.Fatalf("Begin on a fresh key: %v", res.Outcome)
		}
	}
	t.Logf("acquired %d, failed %d", acquired, failed)
}

// --- The Situation table ------------------------------------------------------

// Every answer the middleware gives is a row of the Situation table: the
// Idempotency-Outcome header (where idem writes one) and Event.Outcome name
// the same situation, Event.Status is what the client got, and a situation
// with a status answers with it (scope_denied and too_long have documented
// variants).
func TestAttackOutcomesFollowTheSituationTable(t *testing.T) {
	t.Parallel()
	byName := map[string]idem.Situation{}
	for _, s := range idem.Situations() {
		byName[s.Name] = s
	}
	var (
		mu     sync.Mutex
		events []idem.Event
	)
	f := newFixture(t, idem.Config{OnOutcome: func(ev idem.Event) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}}, idem.EngineConfig{MaxResponseBody: 16}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		if r.Header.Get(idem.HeaderName) == "big" {
			io.WriteString(w, strings.Repeat("x", 32))
		}
	})
	// A holder that the middleware does not see: the same request, begun
	// directly on the engine.
	body := `{"amount":100,"currency":"usd"}`
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "POST", Operation: "POST /payments", Path: "/payments",
		ContentType: "application/json", Body: []byte(body)}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := f.e.Begin(context.Background(), idem.Request{Key: idem.Key{Scope: "user:alice", Operation: "POST /payments", Key: "held"}, Fingerprint: fp})
	if err != nil || held.Outcome != idem.Acquired {
		t.Fatalf("holder: %v, %v", held.Outcome, err)
	}
	steps := []struct {
		c    call
		want string
		then func()
	}{
		{c: call{noKey: true}, want: "missing_key"},
		{c: call{keys: []string{"a", "b"}}, want: "invalid_key"},
		{c: call{key: "k", user: "banned"}, want: "scope_denied"},
		{c: call{key: "k", body: strings.Repeat(" ", 1<<20+1)}, want: "body_too_large"},
		{c: call{key: "k"}, want: "acquired"},
		{c: call{key: "k"}, want: "replayed"},
		{c: call{key: "k", body: `{"amount":200}`}, want: "mismatch"},
		{c: call{key: "big"}, want: "acquired"},
		{c: call{key: "big"}, want: "not_replayable"},
		{c: call{key: "held"}, want: "in_flight", then: func() {
			if err := held.Lease.Escalate(context.Background(), "unknown"); err != nil {
				t.Fatal(err)
			}
		}},
		{c: call{key: "held"}, want: "needs_review", then: func() { f.store.Close() }},
		{c: call{key: "down"}, want: "unavailable"},
	}
	for i, st := range steps {
		w := f.do(st.c)
		mu.Lock()
		if len(events) != i+1 {
			mu.Unlock()
			t.Fatalf("step %d (%s): %d events", i, st.want, len(events))
		}
		ev := events[i]
		mu.Unlock()
		s, ok := byName[ev.Outcome]
		switch {
		case !ok:
			t.Errorf("step %d: Event.Outcome %q is not a situation", i, ev.Outcome)
		case ev.Outcome != st.want:
			t.Errorf("step %d: Event.Outcome %q, want %q", i, ev.Outcome, st.want)
		case ev.Status != w.Code:
			t.Errorf("step %d (%s): Event.Status %d, client got %d", i, ev.Outcome, ev.Status, w.Code)
		case w.Header().Get("Idempotency-Outcome") != ev.Outcome:
			t.Errorf("step %d (%s): Idempotency-Outcome %q", i, ev.Outcome, w.Header().Get("Idempotency-Outcome"))
		case s.Status != 0 && s.Status != w.Code && s.Name != "scope_denied":
			t.Errorf("step %d (%s): status %d, the table says %d", i, ev.Outcome, w.Code, s.Status)
		case s.Problem != "" && problemType(t, w) != s.Problem:
			t.Errorf("step %d (%s): problem type %q, the table says %q", i, ev.Outcome, problemType(t, w), s.Problem)
		}
		if st.then != nil {
			st.then()
		}
	}
}

// Event.Settlement takes the values its documentation lists: "completed",
// "completed_tx", "not_replayable", "released", "escalated", "handler",
// "lost" or "failed". A lease lost before the answer could be stored
// (recovery escalated it behind the handler's back) is reported as "lost".
func TestAttackSettlementsAreDocumented(t *testing.T) {
	t.Parallel()
	documented := map[string]bool{"completed": true, "completed_tx": true, "not_replayable": true, "released": true,
		"escalated": true, "handler": true, "lost": true, "failed": true}
	var (
		mu   sync.Mutex
		seen []string
	)
	f := newFixture(t, idem.Config{OnOutcome: func(ev idem.Event) {
		mu.Lock()
		seen = append(seen, ev.Settlement)
		mu.Unlock()
	}}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		// Recovery escalates the key behind the handler's back (its lease
		// was judged expired).
		l := idem.LeaseFrom(r.Context())
		if err := f.store.Escalate(r.Context(), idemstore.EscalateParams{Key: l.Key(), Token: l.Token(), Reason: "expired"}); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusCreated)
	})
	f.do(call{key: "k"})
	mu.Lock()
	defer mu.Unlock()
	for _, s := range seen {
		if !documented[s] {
			t.Fatalf("Event.Settlement %q is not documented", s)
		}
	}
	if len(seen) != 1 || seen[0] != "lost" {
		t.Fatalf("settlements %v, want [lost]", seen)
	}
}

// Requests that pass through unprotected (an optional key not sent, or a
// store that is down with FailOpen) are reported too; Event.Status is "the
// HTTP status the client got", whatever the situation.
func TestAttackPassThroughEventsCarryTheStatus(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"no_key", "fail_open"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			evs := make(chan idem.Event, 1)
			cfg := idem.Config{OnOutcome: func(ev idem.Event) { evs <- ev }}
			c := call{key: "k"}
			if name == "no_key" {
				cfg.Policy.KeyOptional = true
				c = call{noKey: true}
			} else {
				cfg.FailOpen = true
			}
			f := newFixture(t, cfg, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
			})
			if name == "fail_open" {
				f.store.Close()
			}
			w := f.do(c)
			ev := <-evs
			if ev.Outcome != name || ev.Status != w.Code {
				t.Fatalf("Event %q status %d; the client got %d", ev.Outcome, ev.Status, w.Code)
			}
		})
	}
}
