package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// clock is a settable test clock.
type clock = testenv.Clock

func newClock() *clock { return testenv.NewClock(time.Now().UTC().Truncate(time.Millisecond)) }

// newEngine returns an engine over a fresh memory store. A clock set in
// cfg.Now is the store's clock too: leases expire when it is advanced.
func newEngine(t testing.TB, cfg idem.EngineConfig) (*idem.Engine, *idemmem.Store) {
	t.Helper()
	st := idemmem.MustNew(idemmem.Config{Now: cfg.Now})
	t.Cleanup(func() { st.Close() })
	e, err := idem.NewEngine(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	idem.SetHeartbeatLinger(e, 0) // tests in synctest bubbles end with no goroutine
	return e, st
}

func req(key string) idem.Request {
	return idem.Request{Key: idem.Key{Scope: "user-1", Operation: "POST /payments", Key: key}, Fingerprint: "v1:aaa"}
}

func mustBegin(t *testing.T, e *idem.Engine, r idem.Request, want idem.Outcome) idem.Result {
	t.Helper()
	res, err := e.Begin(context.Background(), r)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if res.Outcome != want {
		t.Fatalf("Begin outcome = %v, want %v", res.Outcome, want)
	}
	return res
}

func TestBeginOutcomes(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, idem.EngineConfig{})
	ctx := context.Background()

	res := mustBegin(t, e, req("k1"), idem.Acquired)
	if res.Lease == nil || res.Lease.Key() != req("k1").Key {
		t.Fatalf("lease = %+v", res.Lease)
	}
	// A duplicate while the first runs is in flight, with a Retry-After.
	inf := mustBegin(t, e, req("k1"), idem.InFlight)
	if inf.RetryAfter != time.Second {
		t.Fatalf("RetryAfter of a fresh request = %v, want 1s", inf.RetryAfter)
	}
	// Another request under the same key is a mismatch, even while in flight.
	other := req("k1")
	other.Fingerprint = "v1:bbb"
	mustBegin(t, e, other, idem.Mismatch)

	resp := &idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"s=1"}, "Date": {"x"}}, Body: []byte(`{"id":"pay_1"}`)}
	if err := res.Lease.Complete(ctx, resp); err != nil {
		t.Fatal(err)
	}
	rep := mustBegin(t, e, req("k1"), idem.Replayed)
	if rep.Response.Status != 201 || string(rep.Response.Body) != `{"id":"pay_1"}` {
		t.Fatalf("replayed %+v", rep.Response)
	}
	if rep.Response.Header.Get("Set-Cookie") != "" || rep.Response.Header.Get("Date") != "" || rep.Response.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("stored headers %v", rep.Response.Header)
	}
	mustBegin(t, e, other, idem.Mismatch)

	// The same key in another scope or operation is independent.
	r2 := req("k1")
	r2.Key.Scope = "user-2"
	mustBegin(t, e, r2, idem.Acquired)
	r3 := req("k1")
	r3.Key.Operation = "POST /refunds"
	mustBegin(t, e, r3, idem.Acquired)
}

func TestBeginRejectsBadKey(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, idem.EngineConfig{})
	for _, k := range []string{"", "a b", string(make([]byte, 256))} {
		if _, err := e.Begin(context.Background(), req(k)); !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("Begin(%q) err = %v", k, err)
		}
	}
}

func TestBeginRejectsLongScopeOrOperation(t *testing.T) {
	t.Parallel()
	e, st := newEngine(t, idem.EngineConfig{})
	long := strings.Repeat("x", idem.MaxOperationLength+1)
	for _, k := range []idem.Key{
		{Scope: "user-1", Operation: "POST /" + long, Key: "k"},
		{Scope: long, Operation: "POST /payments", Key: "k"},
	} {
		r := idem.Request{Key: k, Fingerprint: "v1:aaa"}
		if _, err := e.Begin(context.Background(), r); !errors.Is(err, idem.ErrTooLong) {
			t.Errorf("Begin(scope %d bytes, operation %d bytes) err = %v, want ErrTooLong", len(k.Scope), len(k.Operation), err)
		}
		if _, err := st.Get(context.Background(), k); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("a refused key reached the store: Get = %v", err)
		}
	}
	// At the limits, both are kept.
	at := idem.Key{Scope: long[1:], Operation: long[1:], Key: "k"}
	mustBegin(t, e, idem.Request{Key: at, Fingerprint: "v1:aaa"}, idem.Acquired)
}

func TestReleaseAndReacquire(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, idem.EngineConfig{})
	ctx := context.Background()
	res := mustBegin(t, e, req("k"), idem.Acquired)
	if err := res.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	res2 := mustBegin(t, e, req("k"), idem.Acquired)
	// The first lease is dead; its Complete must not overwrite.
	if err := res.Lease.Complete(ctx, &idem.Response{Status: 200}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Complete err = %v", err)
	}
	if err := res2.Lease.Complete(ctx, &idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	// Release after Complete (a lost commit acknowledgement) leaves the answer.
	if err := res2.Lease.Release(ctx); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Release after Complete err = %v", err)
	}
	if got := mustBegin(t, e, req("k"), idem.Replayed); got.Response.Status != 201 {
		t.Fatalf("status %d", got.Response.Status)
	}
}

func TestExpiredLeaseTakeoverTransactional(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e, _ := newEngine(t, idem.EngineConfig{Lease: 10 * time.Second, Now: clk.Now})
	ctx := context.Background()
	r := req("k")
	r.Kind = idem.Transactional
	first := mustBegin(t, e, r, idem.Acquired)
	clk.Advance(5 * time.Second)
	if err := first.Lease.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	// Running for 5s, 10s of lease left: retry in about 5s.
	if got := mustBegin(t, e, r, idem.InFlight); got.RetryAfter != 5*time.Second {
		t.Fatalf("RetryAfter = %v, want 5s", got.RetryAfter)
	}
	clk.Advance(9 * time.Second) // alive thanks to Extend
	// Running for 14s with 1s of lease left: retry when the lease ends.
	if got := mustBegin(t, e, r, idem.InFlight); got.RetryAfter != time.Second {
		t.Fatalf("RetryAfter = %v, want 1s", got.RetryAfter)
	}
	clk.Advance(2 * time.Second)
	second := mustBegin(t, e, r, idem.Acquired)
	if !second.TookOver {
		t.Fatal("TookOver not reported")
	}
	if err := first.Lease.Complete(ctx, &idem.Response{Status: 200}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("old holder Complete err = %v", err)
	}
	if err := first.Lease.Extend(ctx); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("old holder Extend err = %v", err)
	}
	if err := second.Lease.Complete(ctx, &idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, e, r, idem.Replayed)
}

func TestExpiredLeaseExternalNeedsReview(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e, _ := newEngine(t, idem.EngineConfig{Lease: time.Second, Now: clk.Now})
	ctx := context.Background()
	r := req("k") // External is the default
	first := mustBegin(t, e, r, idem.Acquired)
	clk.Advance(2 * time.Second)
	res := mustBegin(t, e, r, idem.NeedsReview)
	if res.Record.Reason == "" {
		t.Fatal("no reason recorded")
	}
	mustBegin(t, e, r, idem.NeedsReview)
	if err := first.Lease.Complete(ctx, &idem.Response{Status: 200}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Complete after escalation err = %v", err)
	}
	// An operator completes it by hand; retries replay that.
	if err := e.ResolveRecord(ctx, r.Key, &idem.Response{Status: 202, Body: []byte("settled")}, "checked with the provider"); err != nil {
		t.Fatal(err)
	}
	if got := mustBegin(t, e, r, idem.Replayed); string(got.Response.Body) != "settled" {
		t.Fatalf("body %q", got.Response.Body)
	}
}

func TestEscalate(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, idem.EngineConfig{})
	ctx := context.Background()
	res := mustBegin(t, e, req("k"), idem.Acquired)
	if err := res.Lease.Escalate(ctx, "provider timed out"); err != nil {
		t.Fatal(err)
	}
	if !res.Lease.Ended() {
		t.Fatal("lease not ended")
	}
	got := mustBegin(t, e, req("k"), idem.NeedsReview)
	if got.Record.Reason != "provider timed out" {
		t.Fatalf("reason %q", got.Record.Reason)
	}
	if err := e.ResolveRecord(ctx, req("k").Key, nil, "never reached the provider"); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, e, req("k"), idem.Acquired)
}

func TestMaxResponseBody(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, idem.EngineConfig{MaxResponseBody: 10})
	ctx := context.Background()
	res := mustBegin(t, e, req("k"), idem.Acquired)
	if err := res.Lease.Complete(ctx, &idem.Response{Status: 200, Body: []byte("01234567890")}); err != nil {
		t.Fatal(err)
	}
	got := mustBegin(t, e, req("k"), idem.Replayed)
	if got.Response.NotReplayable != idem.NotReplayableTooLarge || len(got.Response.Body) != 0 || got.Response.Status != 200 {
		t.Fatalf("stored %+v", got.Response)
	}
}

func TestWaitReplaysWhenFirstCompletes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, _ := newEngine(t, idem.EngineConfig{})
		ctx := context.Background()
		first := mustBegin(t, e, req("k"), idem.Acquired)
		done := make(chan idem.Result, 1)
		go func() {
			r := req("k")
			r.Wait = time.Minute
			res, err := e.Begin(ctx, r)
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		synctest.Wait() // the waiter is waiting
		if err := first.Lease.Complete(ctx, &idem.Response{Status: 201, Body: []byte("ok")}); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res.Outcome != idem.Replayed || string(res.Response.Body) != "ok" {
			t.Fatalf("waiter got %v %+v", res.Outcome, res.Response)
		}
	})
}

func TestWaitAcquiresWhenFirstReleases(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, _ := newEngine(t, idem.EngineConfig{})
		ctx := context.Background()
		first := mustBegin(t, e, req("k"), idem.Acquired)
		done := make(chan idem.Result, 1)
		go func() {
			r := req("k")
			r.Wait = time.Minute
			res, _ := e.Begin(ctx, r)
			done <- res
		}()
		synctest.Wait()
		if err := first.Lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if res := <-done; res.Outcome != idem.Acquired {
			t.Fatalf("waiter got %v", res.Outcome)
		}
	})
}

func TestWaitBoundedThenInFlight(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, _ := newEngine(t, idem.EngineConfig{})
		mustBegin(t, e, req("k"), idem.Acquired)
		r := req("k")
		r.Wait = 30 * time.Millisecond
		mustBegin(t, e, r, idem.InFlight)
	})
}

func TestWaitHonoursContext(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, _ := newEngine(t, idem.EngineConfig{})
		mustBegin(t, e, req("k"), idem.Acquired)
		ctx, cancel := context.WithCancel(context.Background())
		r := req("k")
		r.Wait = time.Hour
		errc := make(chan error, 1)
		go func() { _, err := e.Begin(ctx, r); errc <- err }()
		synctest.Wait() // waiting
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestBeginFailsClosed: when Begin cannot check the key (the caller's
// context ended, the store is down, or the store failed after committing the
// reservation), it returns the error, never Acquired, and leaves no
// reservation that nobody holds.
func TestBeginFailsClosed(t *testing.T) {
	t.Parallel()
	e, st := newEngine(t, idem.EngineConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := e.Begin(ctx, req("k"))
	if !errors.Is(err, context.Canceled) || res.Outcome == idem.Acquired || res.Lease != nil {
		t.Fatalf("cancelled Begin = %+v, %v", res, err)
	}

	// The reservation commits, then the reply is lost.
	lost, err := idem.NewEngine(replyLostOnReserve{st}, idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	res, err = lost.Begin(context.Background(), req("k"))
	if !errors.Is(err, idemstore.ErrUnavailable) || res.Outcome == idem.Acquired {
		t.Fatalf("Begin whose Reserve reply was lost = %+v, %v", res, err)
	}
	if _, err := st.Get(context.Background(), req("k").Key); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the orphaned reservation was not released: %v", err)
	}
	mustBegin(t, e, req("k"), idem.Acquired)

	st.Close()
	res, err = e.Begin(context.Background(), req("k2"))
	if !errors.Is(err, idemstore.ErrUnavailable) || res.Outcome == idem.Acquired {
		t.Fatalf("closed store Begin = %+v, %v", res, err)
	}
}

// replyLostOnReserve commits every reservation, then reports the store
// unreachable, as a lost reply would.
type replyLostOnReserve struct{ *idemmem.Store }

func (s replyLostOnReserve) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if _, _, err := s.Store.Reserve(ctx, p); err != nil {
		return nil, false, err
	}
	return nil, false, fmt.Errorf("read tcp: connection reset by peer: %w", idemstore.ErrUnavailable)
}

func TestConcurrentBeginExactlyOneAcquires(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, idem.EngineConfig{})
	ctx := context.Background()
	var acquired, inflight atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := e.Begin(ctx, req("hot"))
			if err != nil {
				t.Error(err)
				return
			}
			switch res.Outcome {
			case idem.Acquired:
				acquired.Add(1)
			case idem.InFlight:
				inflight.Add(1)
			default:
				t.Errorf("outcome %v", res.Outcome)
			}
		}()
	}
	close(start)
	wg.Wait()
	if acquired.Load() != 1 || inflight.Load() != 99 {
		t.Fatalf("acquired %d, in flight %d", acquired.Load(), inflight.Load())
	}
}

func TestRecover(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e, _ := newEngine(t, idem.EngineConfig{Lease: time.Second, Now: clk.Now})
	ctx := context.Background()
	keys := map[string]idem.Kind{"tx-1": idem.Transactional, "ext-done": idem.External, "ext-never": idem.External, "ext-unknown": idem.External}
	for k, kind := range keys {
		r := req(k)
		r.Kind = kind
		mustBegin(t, e, r, idem.Acquired)
	}
	alive := mustBegin(t, e, req("alive"), idem.Acquired)
	_ = alive
	clk.Advance(2 * time.Second)
	if err := alive.Lease.Extend(ctx); err != nil {
		t.Fatal(err)
	}
	resolver := idem.ResolverFunc(func(ctx context.Context, rec *idemstore.Record) (idem.Resolution, error) {
		switch rec.Key.Key {
		case "ext-done":
			return idem.Resolution{Verdict: idem.VerdictCompleted, Response: &idem.Response{Status: 201, Body: []byte("charged")}}, nil
		case "ext-never":
			return idem.Resolution{Verdict: idem.VerdictNotHappened}, nil
		}
		return idem.Resolution{}, errors.New("provider unreachable")
	})
	rep, err := e.Recover(ctx, idem.RecoverOptions{
		KindOf:   func(k idem.Key) idem.Kind { return keys[k.Key] },
		Resolver: resolver,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := idem.RecoverReport{Released: 1, Escalated: 3, Completed: 1, Reopened: 1, Unknown: 1}
	if rep != want {
		t.Fatalf("report %+v, want %+v", rep, want)
	}
	mustBegin(t, e, req("tx-1"), idem.Acquired)
	if got := mustBegin(t, e, req("ext-done"), idem.Replayed); string(got.Response.Body) != "charged" {
		t.Fatalf("body %q", got.Response.Body)
	}
	mustBegin(t, e, req("ext-never"), idem.Acquired)
	mustBegin(t, e, req("ext-unknown"), idem.NeedsReview)
	mustBegin(t, e, req("alive"), idem.InFlight)
}

func TestPurge(t *testing.T) {
	t.Parallel()
	clk := newClock()
	e, _ := newEngine(t, idem.EngineConfig{Retention: time.Hour, Now: clk.Now})
	ctx := context.Background()
	for i := 0; i < 7; i++ {
		res := mustBegin(t, e, req("k"+strconv.Itoa(i)), idem.Acquired)
		if err := res.Lease.Complete(ctx, &idem.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	mustBegin(t, e, req("pending"), idem.Acquired)
	clk.Advance(2 * time.Hour)
	n, err := e.Purge(ctx, 3)
	if err != nil || n != 7 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	mustBegin(t, e, req("k1"), idem.Acquired)
}

func TestNewEngineValidates(t *testing.T) {
	t.Parallel()
	if _, err := idem.NewEngine(nil, idem.EngineConfig{}); err == nil {
		t.Fatal("nil store accepted")
	}
	st := idemmem.MustNew(idemmem.Config{})
	defer st.Close()
	if _, err := idem.NewEngine(st, idem.EngineConfig{Lease: time.Nanosecond}); err == nil {
		t.Fatal("1ns lease accepted")
	}
}

func TestOutcomeAndKindStrings(t *testing.T) {
	t.Parallel()
	want := map[idem.Outcome]string{idem.Acquired: "acquired", idem.Replayed: "replayed", idem.Mismatch: "mismatch", idem.InFlight: "in_flight", idem.NeedsReview: "needs_review"}
	for o, s := range want {
		if o.String() != s {
			t.Errorf("%d.String() = %q", o, o.String())
		}
	}
	if idem.External.String() != "external" || idem.Transactional.String() != "transactional" {
		t.Error("Kind strings")
	}
}

func TestLeaseHeartbeat(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// Time is the bubble's: the heartbeat renews every 100ms of it.
		e, _ := newEngine(t, idem.EngineConfig{Lease: 300 * time.Millisecond})
		r := req("job")
		r.Kind = idem.Transactional
		res := mustBegin(t, e, r, idem.Acquired)
		stop := res.Lease.Heartbeat()
		time.Sleep(time.Second) // more than three lease durations, without a lapse
		mustBegin(t, e, r, idem.InFlight)
		stop()
		time.Sleep(700 * time.Millisecond) // the lease lapses (fake time)
		if got := mustBegin(t, e, r, idem.Acquired); !got.TookOver {
			t.Fatal("expected a takeover once the heartbeat stopped")
		}
	})
}

// lostReplyStore applies Complete and Escalate, then reports an error, as a
// store whose reply was lost after the commit would.
type lostReplyStore struct{ *idemmem.Store }

func (s lostReplyStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if err := s.Store.Complete(ctx, p); err != nil {
		return err
	}
	return fmt.Errorf("read tcp: connection reset by peer: %w", idemstore.ErrUnavailable)
}

func (s lostReplyStore) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	if err := s.Store.Escalate(ctx, p); err != nil {
		return err
	}
	return idemstore.ErrLeaseLost // as a resent command finds it done
}

func TestLostReplyCountsAsApplied(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	defer mem.Close()
	e, err := idem.NewEngine(lostReplyStore{mem}, idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res := mustBegin(t, e, req("a"), idem.Acquired)
	if err := res.Lease.Complete(ctx, &idem.Response{Status: 201}); err != nil {
		t.Fatalf("Complete whose reply was lost: %v", err)
	}
	res = mustBegin(t, e, req("b"), idem.Acquired)
	if err := res.Lease.Escalate(ctx, "unknown"); err != nil {
		t.Fatalf("Escalate whose reply was lost: %v", err)
	}
	// A Complete that really lost its lease still fails.
	stale := mustBegin(t, e, req("c"), idem.Acquired)
	if err := stale.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, e, req("c"), idem.Acquired)
	if err := stale.Lease.Complete(ctx, &idem.Response{Status: 200}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Complete err = %v", err)
	}
}

func TestContextWithLease(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, idem.EngineConfig{})
	if l := idem.LeaseFrom(context.Background()); l != nil {
		t.Fatalf("LeaseFrom(Background) = %v, want nil", l)
	}
	res := mustBegin(t, e, req("ctx"), idem.Acquired)
	ctx := idem.ContextWithLease(context.Background(), res.Lease)
	if l := idem.LeaseFrom(ctx); l != res.Lease {
		t.Fatalf("LeaseFrom = %p, want the lease %p", l, res.Lease)
	}
	if err := idem.LeaseFrom(ctx).Complete(ctx, &idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, e, req("ctx"), idem.Replayed)
}

// TestRecoverPagesThroughTheReviewQueue: keys a resolver cannot settle do
// not keep it from the keys behind them; each pass takes the next page.
func TestRecoverPagesThroughTheReviewQueue(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, idem.EngineConfig{})
	ctx := context.Background()
	for _, k := range []string{"a-unknown", "b-unknown", "c-done", "d-done"} {
		res := mustBegin(t, e, req(k), idem.Acquired)
		if err := res.Lease.Escalate(ctx, "check"); err != nil {
			t.Fatal(err)
		}
	}
	resolver := idem.ResolverFunc(func(ctx context.Context, rec *idemstore.Record) (idem.Resolution, error) {
		if strings.HasSuffix(rec.Key.Key, "-unknown") {
			return idem.Resolution{Verdict: idem.VerdictUnknown}, nil
		}
		return idem.Resolution{Verdict: idem.VerdictCompleted, Response: &idem.Response{Status: 201}}, nil
	})
	completed := 0
	for range 4 { // two pages of two; the second pass reaches c and d
		rep, err := e.Recover(ctx, idem.RecoverOptions{Resolver: resolver, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		completed += rep.Completed
	}
	if completed != 2 {
		t.Fatalf("completed %d of the 2 keys the resolver can settle", completed)
	}
	mustBegin(t, e, req("c-done"), idem.Replayed)
	mustBegin(t, e, req("d-done"), idem.Replayed)
}
