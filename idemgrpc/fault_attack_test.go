package idemgrpc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/testenv"
)

// cancelStore commits the first Reserve and then waits for the caller's
// context to end before answering its error (a reply that never came
// back), and holds the first Complete until hold is closed.
type cancelStore struct {
	idemstore.Store
	reserveOnce, completeOnce sync.Once
	reserved                  chan struct{} // closed once the first Reserve committed
	completing                chan struct{} // closed once the first Complete started
	hold                      chan struct{} // the first Complete proceeds once closed
	cancelReserve             bool
}

func (s *cancelStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	rec, created, err := s.Store.Reserve(ctx, p)
	first := false
	s.reserveOnce.Do(func() { first = s.cancelReserve })
	if first {
		close(s.reserved)
		<-ctx.Done()
		return nil, false, ctx.Err()
	}
	return rec, created, err
}

func (s *cancelStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	first := false
	s.completeOnce.Do(func() { first = s.hold != nil })
	if first {
		close(s.completing)
		<-s.hold
	}
	return s.Store.Complete(ctx, p)
}

// chargeCancelled sends req as alice and cancels the call once at is
// closed; the call must answer CANCELLED.
func chargeCancelled(t *testing.T, ev *env, req *testpb.ChargeRequest, at <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(as("alice"))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := ev.client.Charge(ctx, req)
		done <- err
	}()
	<-at
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v", err)
	}
}

// TestCancelDuringReserve: the client gives up while Reserve is in flight,
// after the store committed the reservation. The call answers CANCELLED
// without running the handler, the orphaned reservation is released, and
// the retry with the same key runs the handler once.
func TestCancelDuringReserve(t *testing.T) {
	t.Parallel()
	s := &cancelStore{Store: memStore(t), reserved: make(chan struct{}), cancelReserve: true}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: s})
	req := &testpb.ChargeRequest{Account: "a", Amount: 5, RequestId: uuid(1)}
	chargeCancelled(t, ev, req, s.reserved)
	if e := ev.event(); e.Outcome != idem.SituationCanceled.Name {
		t.Fatalf("cancelled call's event %+v", e)
	}
	p, err := ev.client.Charge(as("alice"), req)
	if err != nil || p.Run != 1 {
		t.Fatalf("retry: %v %v", p, err)
	}
	again, err := ev.client.Charge(as("alice"), req)
	if err != nil || again.Run != 1 || ev.svc.runs.Load() != 1 {
		t.Fatalf("second retry: %v %v, runs %d", again, err, ev.svc.runs.Load())
	}
}

// TestCancelDuringComplete: the handler ran and Complete is in flight when
// the client gives up. The answer is still stored (settlement is detached
// from the call), and the retry replays it; the handler ran once.
func TestCancelDuringComplete(t *testing.T) {
	t.Parallel()
	s := &cancelStore{Store: memStore(t), completing: make(chan struct{}), hold: make(chan struct{})}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: s})
	req := &testpb.ChargeRequest{Account: "a", Amount: 5, RequestId: uuid(1)}
	chargeCancelled(t, ev, req, s.completing)
	close(s.hold)
	if e := ev.event(); e.Settlement != "completed" {
		t.Fatalf("settlement %+v", e)
	}
	p, err := ev.client.Charge(as("alice"), req)
	if err != nil || p.Run != 1 || ev.svc.runs.Load() != 1 {
		t.Fatalf("retry: %v %v, runs %d", p, err, ev.svc.runs.Load())
	}
}

// clockEnv is a server whose engine, interceptor and memory store read
// one fake clock, with a retention of a day.
func clockEnv(t *testing.T) (*env, *testenv.Clock) {
	t.Helper()
	clk := testenv.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	mem := idemmem.MustNew(idemmem.Config{Now: clk.Now})
	t.Cleanup(func() { mem.Close() })
	cfg := idemgrpc.Config{}
	idemgrpc.SetClock(&cfg, clk.Now)
	return newEnv(t, cfg, envOptions{store: mem, engine: idem.EngineConfig{Now: clk.Now, Retention: 24 * time.Hour}}), clk
}

// holdFirstRun makes ev's Charge handler block in its first run: entered
// is closed once it started, and it answers once release is closed.
func holdFirstRun(ev *env) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	ev.svc.charge = func(_ context.Context, _ *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		if run == 1 {
			close(entered)
			<-release
		}
		return &testpb.Payment{Run: run}, nil
	}
	return entered, release
}

// TestEngineClockAheadDuplicate: the engine's and the store's clock jump
// ahead past the lease while the handler runs (or the lease looks expired
// early); a duplicate then arrives. An External call must not run again:
// the duplicate escalates the key to review; the first call still answers,
// and later retries are told the key is under review, never run. With the
// clock behind, the duplicate is simply in flight.
func TestEngineClockAheadDuplicate(t *testing.T) {
	t.Parallel()
	for _, jump := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprint(jump), func(t *testing.T) {
			t.Parallel()
			ev, clk := clockEnv(t)
			entered, release := holdFirstRun(ev)
			req := &testpb.ChargeRequest{Account: "a", RequestId: uuid(1)}
			first := make(chan error, 1)
			go func() {
				p, err := ev.client.Charge(as("alice"), req)
				if err == nil && p.Run != 1 {
					err = fmt.Errorf("run %d", p.Run)
				}
				first <- err
			}()
			<-entered
			clk.Advance(jump)
			_, err := ev.client.Charge(as("alice"), req)
			if jump > 0 {
				wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonNeedsReview)
			} else {
				wantCode(t, err, codes.Aborted, idemgrpc.ReasonInFlight)
			}
			ev.event()
			close(release)
			if err := <-first; err != nil {
				t.Fatalf("first call: %v", err)
			}
			e := ev.event()
			_, err = ev.client.Charge(as("alice"), req)
			if jump > 0 {
				if e.Settlement != "lost" {
					t.Fatalf("first call's settlement %+v", e)
				}
				wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonNeedsReview)
			} else if err != nil {
				t.Fatalf("retry after completion: %v", err)
			}
			if n := ev.svc.runs.Load(); n != 1 {
				t.Fatalf("runs %d", n)
			}
		})
	}
}

// TestConcurrentFingerprints: many calls at once with different requests,
// on different keys and on shared keys, through the pooled fingerprint
// buffers. Each call's answer is its own request's, every retry replays
// it, and a key reused with another request is a mismatch, never a replay
// of the other request's answer: no fingerprint is made of another call's
// bytes.
func TestConcurrentFingerprints(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	ev.svc.charge = func(_ context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		return &testpb.Payment{Account: req.Account, Amount: req.Amount, Run: run}, nil
	}
	stop, drained := make(chan struct{}), make(chan struct{})
	go func() { // drain the outcomes
		defer close(drained)
		for {
			select {
			case <-ev.events:
			case <-stop:
				return
			}
		}
	}()
	defer func() { close(stop); <-drained }()
	const keys, per = 40, 4
	big := func(i, j int) string { // requests of different sizes, so buffers grow and shrink
		return fmt.Sprintf("acct-%d-%d-%0*d", i, j, (i*7+j*13)%300, 0)
	}
	var wg sync.WaitGroup
	errs := make(chan error, keys*per*3)
	for round := 0; round < 2; round++ {
		for i := 0; i < keys; i++ {
			for j := 0; j < per; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := uuid(1000 + i)
					if i%2 == 0 {
						key = uuid(2000 + i*per + j) // a key of its own
					}
					req := &testpb.ChargeRequest{Account: big(i, j), Amount: int64(i*per + j), RequestId: key}
					p, err := ev.client.Charge(as("alice"), req)
					switch {
					case err == nil && (p.Account != req.Account || p.Amount != req.Amount):
						errs <- fmt.Errorf("key %s: answer %v for request %v", key, p, req)
					case err == nil:
					case i%2 == 0:
						errs <- fmt.Errorf("own key %s: %v", key, err)
					case idemgrpc.Reason(err) == idemgrpc.ReasonKeyReused, idemgrpc.Reason(err) == idemgrpc.ReasonInFlight:
					default:
						errs <- fmt.Errorf("shared key %s: %v", key, err)
					}
				}()
			}
		}
		wg.Wait()
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A key of its own ran once; a shared key ran at most once.
	if n, max := ev.svc.runs.Load(), int64(keys/2*per+keys/2); n > max {
		t.Fatalf("runs %d, more than %d", n, max)
	}
}
