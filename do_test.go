package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
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
)

// receipt is a job's typed result.
type receipt struct {
	ID     string   `json:"id"`
	Amount int      `json:"amount"`
	Tags   []string `json:"tags"`
}

// doBackends are the stores Do is tested against.
var doBackends = []struct {
	name string
	open func(t *testing.T, cfg idem.EngineConfig) *idem.Engine
}{
	{"memory", func(t *testing.T, cfg idem.EngineConfig) *idem.Engine {
		e, _ := newEngine(t, quiet(cfg))
		return e
	}},
	{"sqlite", func(t *testing.T, cfg idem.EngineConfig) *idem.Engine {
		_, store, cleanup := openSQLite()
		t.Cleanup(cleanup)
		e, err := idem.NewEngine(store, quiet(cfg))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}},
}

// forEachDoBackend runs test against every store of doBackends.
func forEachDoBackend(t *testing.T, test func(t *testing.T, open func(idem.EngineConfig) *idem.Engine)) {
	t.Helper()
	for _, b := range doBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			test(t, func(cfg idem.EngineConfig) *idem.Engine { return b.open(t, cfg) })
		})
	}
}

func quiet(cfg idem.EngineConfig) idem.EngineConfig {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

func jobReq(key string, kind idem.Kind) idem.Request {
	return idem.Request{Key: idem.Key{Scope: "tenant-1", Operation: "charge-invoice", Key: key}, Fingerprint: "v1:job", Kind: kind}
}

func TestDoRunsOnceAndReplaysTypedResult(t *testing.T) {
	t.Parallel()
	forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
		e := open(idem.EngineConfig{})
		ctx := context.Background()
		var runs atomic.Int32
		fn := func(ctx context.Context) (receipt, error) {
			if idem.LeaseFrom(ctx) == nil {
				t.Error("fn's context carries no lease")
			}
			runs.Add(1)
			return receipt{ID: "rc_1", Amount: 500, Tags: []string{"a", "b"}}, nil
		}
		first, err := idem.Do(ctx, e, jobReq("inv-1", idem.External), fn)
		if err != nil {
			t.Fatal(err)
		}
		again, err := idem.Do(ctx, e, jobReq("inv-1", idem.External), fn)
		if err != nil {
			t.Fatal(err)
		}
		if runs.Load() != 1 {
			t.Fatalf("fn ran %d times", runs.Load())
		}
		if fmt.Sprint(first) != fmt.Sprint(again) || again.ID != "rc_1" || len(again.Tags) != 2 {
			t.Fatalf("first %+v, replay %+v", first, again)
		}
		rec, err := e.Get(ctx, jobReq("inv-1", idem.External).Key)
		if err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != `{"id":"rc_1","amount":500,"tags":["a","b"]}` {
			t.Fatalf("record %+v, %v", rec, err)
		}

		// A replay into another type that the JSON does not fit is an
		// error, not a second run.
		_, err = idem.Do(ctx, e, jobReq("inv-1", idem.External), func(context.Context) (int, error) {
			runs.Add(1)
			return 0, nil
		})
		var oe *idem.OutcomeError
		if !errors.As(err, &oe) || oe.Outcome != idem.Replayed || errors.Is(err, idem.ErrNotReplayable) || runs.Load() != 1 {
			t.Fatalf("replay into int: %v (runs %d)", err, runs.Load())
		}
	})
}

// Calls that overlap on one key run fn once: while the first runs, the
// others are told it is in flight.
func TestDoConcurrentCallsRunOnce(t *testing.T) {
	t.Parallel()
	forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
		e := open(idem.EngineConfig{})
		ctx := context.Background()
		const n = 16
		var runs, inflight atomic.Int32
		var others sync.WaitGroup
		others.Add(n - 1)
		var wg sync.WaitGroup
		results := make(chan int, n)
		for range n {
			wg.Go(func() {
				v, err := idem.Do(ctx, e, jobReq("k", idem.External), func(context.Context) (int, error) {
					runs.Add(1)
					others.Wait() // hold the key until every other call has been answered
					return 42, nil
				})
				var oe *idem.OutcomeError
				switch {
				case err == nil:
					results <- v
				case errors.Is(err, idem.ErrInFlight) && errors.As(err, &oe) && oe.RetryAfter >= time.Second:
					inflight.Add(1)
					others.Done()
				default:
					t.Errorf("Do: %v", err)
					others.Done()
				}
			})
		}
		wg.Wait()
		close(results)
		if runs.Load() != 1 || inflight.Load() != n-1 || <-results != 42 {
			t.Fatalf("runs %d, in flight %d", runs.Load(), inflight.Load())
		}
		if v, err := idem.Do(ctx, e, jobReq("k", idem.External), func(context.Context) (int, error) { return 0, errors.New("ran again") }); v != 42 || err != nil {
			t.Fatalf("replay %v, %v", v, err)
		}
	})
}

// With Request.Wait, overlapping calls wait for the first and all get its
// result.
func TestDoConcurrentCallsWaitForTheResult(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, _ := newEngine(t, quiet(idem.EngineConfig{}))
		ctx := context.Background()
		release := make(chan struct{})
		var runs atomic.Int32
		r := jobReq("k", idem.External)
		r.Wait = time.Minute
		var wg sync.WaitGroup
		got := make([]receipt, 8)
		for i := range got {
			wg.Go(func() {
				v, err := idem.Do(ctx, e, r, func(context.Context) (receipt, error) {
					runs.Add(1)
					<-release
					return receipt{ID: "once"}, nil
				})
				if err != nil {
					t.Errorf("Do: %v", err)
				}
				got[i] = v
			})
		}
		synctest.Wait() // one runs fn, the others wait on the key
		close(release)
		wg.Wait()
		for i, v := range got {
			if v.ID != "once" {
				t.Fatalf("call %d got %+v", i, v)
			}
		}
		if runs.Load() != 1 {
			t.Fatalf("fn ran %d times", runs.Load())
		}
	})
}

// How a failed or crashed fn leaves its key, by what it said and by the
// operation's kind: released (the next call runs fn) or needs review (the
// next call gets ErrNeedsReview, and fn never runs again).
func TestDoFailureSettlesByKind(t *testing.T) {
	t.Parallel()
	boom := errors.New("provider timed out")
	ways := []struct {
		name string
		// run calls Do with fn failing this way and returns Do's error
		// (nil when Do did not return).
		run func(e *idem.Engine, r idem.Request) error
	}{
		{"error", func(e *idem.Engine, r idem.Request) error {
			_, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { return 0, boom })
			return err
		}},
		{"retryable", func(e *idem.Engine, r idem.Request) error {
			_, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { return 0, idem.Retryable(boom) })
			return err
		}},
		{"ambiguous", func(e *idem.Engine, r idem.Request) error {
			_, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { return 0, idem.Ambiguous(boom) })
			return err
		}},
		{"cancelled", func(e *idem.Engine, r idem.Request) error {
			ctx, cancel := context.WithCancel(context.Background())
			_, err := idem.Do(ctx, e, r, func(ctx context.Context) (int, error) {
				cancel() // the worker is stopping
				<-ctx.Done()
				return 0, ctx.Err()
			})
			return err
		}},
		{"panic", func(e *idem.Engine, r idem.Request) (err error) {
			defer func() {
				if p := recover(); p != "boom" {
					err = fmt.Errorf("recovered %v, want the job's panic", p)
				}
			}()
			idem.Do(context.Background(), e, r, func(context.Context) (int, error) { panic("boom") })
			return errors.New("Do returned from a panicking fn")
		}},
		{"goexit", func(e *idem.Engine, r idem.Request) error {
			done := make(chan error)
			go func() {
				returned := false
				defer func() {
					if returned {
						done <- errors.New("Do returned from a goroutine that exited")
					}
					close(done)
				}()
				idem.Do(context.Background(), e, r, func(context.Context) (int, error) {
					runtime.Goexit()
					return 0, nil
				})
				returned = true
			}()
			return <-done
		}},
	}
	for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
		for _, way := range ways {
			// Retryable always releases, Ambiguous always escalates;
			// otherwise the kind decides.
			released := kind == idem.Transactional
			switch way.name {
			case "retryable":
				released = true
			case "ambiguous":
				released = false
			}
			t.Run(kind.String()+"/"+way.name, func(t *testing.T) {
				t.Parallel()
				forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
					e := open(idem.EngineConfig{})
					r := jobReq("k", kind)
					err := way.run(e, r)
					switch way.name {
					case "panic", "goexit":
						if err != nil {
							t.Fatal(err)
						}
					case "cancelled":
						if !errors.Is(err, context.Canceled) {
							t.Fatalf("Do = %v, want the context's error", err)
						}
					case "error":
						if err != boom {
							t.Fatalf("Do = %v, want fn's very error", err)
						}
					default:
						if !errors.Is(err, boom) {
							t.Fatalf("Do = %v, want fn's error", err)
						}
					}
					runs := 0
					v, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { runs++; return 7, nil })
					if released {
						if err != nil || v != 7 || runs != 1 {
							t.Fatalf("after a release: %v, %v, runs %d", v, err, runs)
						}
						return
					}
					var oe *idem.OutcomeError
					if !errors.Is(err, idem.ErrNeedsReview) || !errors.As(err, &oe) || oe.Record == nil || oe.Record.Reason == "" || runs != 0 {
						t.Fatalf("after an escalation: %v, runs %d", err, runs)
					}
					if way.name == "ambiguous" && !strings.Contains(err.Error(), boom.Error()) {
						t.Fatalf("the review reason does not carry the error: %v", err)
					}
				})
			})
		}
	}
}

// A holder that died (its process killed: no settlement, no heartbeat)
// leaves a pending key; once its lease expires a transactional job is taken
// over and runs, an external one goes to review.
func TestDoAfterHolderDied(t *testing.T) {
	t.Parallel()
	for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
				e := open(idem.EngineConfig{})
				dead := jobReq("k", kind)
				dead.Lease = time.Millisecond
				mustBegin(t, e, dead, idem.Acquired) // and never settled
				r := jobReq("k", kind)
				r.Wait = time.Minute // until the dead holder's lease expires
				runs := 0
				v, err := idem.Do(context.Background(), e, r, func(context.Context) (string, error) { runs++; return "ran", nil })
				if kind == idem.Transactional {
					if err != nil || v != "ran" || runs != 1 {
						t.Fatalf("takeover: %q, %v, runs %d", v, err, runs)
					}
					return
				}
				if !errors.Is(err, idem.ErrNeedsReview) || runs != 0 {
					t.Fatalf("external: %q, %v, runs %d", v, err, runs)
				}
			})
		})
	}
}

func TestDoMismatch(t *testing.T) {
	t.Parallel()
	forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
		e := open(idem.EngineConfig{})
		ctx := context.Background()
		if _, err := idem.Do(ctx, e, jobReq("k", idem.External), func(context.Context) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
		other := jobReq("k", idem.External)
		other.Fingerprint = "v1:other-arguments"
		_, err := idem.Do(ctx, e, other, func(context.Context) (int, error) { return 2, nil })
		var oe *idem.OutcomeError
		if !errors.Is(err, idem.ErrMismatch) || !errors.As(err, &oe) || oe.Outcome != idem.Mismatch || oe.Key != other.Key {
			t.Fatalf("Do = %v", err)
		}
	})
}

// A result too large to keep is returned to the first caller; later calls
// learn it completed without running fn again.
func TestDoNotReplayable(t *testing.T) {
	t.Parallel()
	forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
		e := open(idem.EngineConfig{MaxResponseBody: 16})
		ctx := context.Background()
		big := strings.Repeat("x", 64)
		if v, err := idem.Do(ctx, e, jobReq("k", idem.External), func(context.Context) (string, error) { return big, nil }); v != big || err != nil {
			t.Fatalf("first: %v", err)
		}
		_, err := idem.Do(ctx, e, jobReq("k", idem.External), func(context.Context) (string, error) { return "again", nil })
		if !errors.Is(err, idem.ErrNotReplayable) || !strings.Contains(err.Error(), idem.NotReplayableTooLarge) {
			t.Fatalf("replay: %v", err)
		}
	})
}

// fn ran but its result cannot be stored (it does not encode, or the store
// refuses the completion): the caller gets the value and an error, and the
// key goes to review so that fn never runs again blindly.
func TestDoResultNotStored(t *testing.T) {
	t.Parallel()
	t.Run("unencodable", func(t *testing.T) {
		t.Parallel()
		forEachDoBackend(t, func(t *testing.T, open func(idem.EngineConfig) *idem.Engine) {
			e := open(idem.EngineConfig{})
			r := jobReq("k", idem.Transactional)
			v, err := idem.Do(context.Background(), e, r, func(context.Context) (map[string]any, error) {
				return map[string]any{"ch": make(chan int)}, nil
			})
			if v == nil || err == nil || !strings.Contains(err.Error(), "JSON") {
				t.Fatalf("Do = %v, %v", v, err)
			}
			if _, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { return 0, nil }); !errors.Is(err, idem.ErrNeedsReview) {
				t.Fatalf("retry: %v", err)
			}
		})
	})
	t.Run("store refuses", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			st := idemmem.MustNew(idemmem.Config{})
			defer st.Close()
			e, err := idem.NewEngine(completeFails{st}, quiet(idem.EngineConfig{SettleTimeout: time.Second}))
			if err != nil {
				t.Fatal(err)
			}
			idem.SetHeartbeatLinger(e, 0)
			r := jobReq("k", idem.Transactional)
			v, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { return 9, nil })
			if v != 9 || !errors.Is(err, idemstore.ErrUnavailable) {
				t.Fatalf("Do = %v, %v", v, err)
			}
			if _, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { return 0, nil }); !errors.Is(err, idem.ErrNeedsReview) {
				t.Fatalf("retry: %v", err)
			}
		})
	})
}

// completeFails is a store that cannot complete.
type completeFails struct{ *idemmem.Store }

func (completeFails) Complete(context.Context, idemstore.CompleteParams) error {
	return fmt.Errorf("connection refused: %w", idemstore.ErrUnavailable)
}

// The heartbeat renews the lease while fn runs longer than it: a duplicate
// arriving after the lease would have expired still finds the key in flight
// rather than taking it over.
func TestDoHeartbeatKeepsTheKey(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e, _ := newEngine(t, quiet(idem.EngineConfig{Lease: 3 * time.Second}))
		ctx := context.Background()
		r := jobReq("k", idem.Transactional)
		probed := make(chan error, 1)
		v, err := idem.Do(ctx, e, r, func(context.Context) (int, error) {
			time.Sleep(10 * time.Second) // fake time: more than three leases
			_, err := idem.Do(ctx, e, r, func(context.Context) (int, error) { return 2, nil })
			probed <- err
			return 1, nil
		})
		if v != 1 || err != nil {
			t.Fatalf("Do = %v, %v", v, err)
		}
		if err := <-probed; !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("duplicate during a long job: %v", err)
		}
	})
}

func TestDoRefusesBadInput(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, quiet(idem.EngineConfig{}))
	ctx := context.Background()
	fn := func(context.Context) (int, error) { t.Error("fn ran"); return 0, nil }
	bad := jobReq("k", idem.Kind(7))
	for name, call := range map[string]func() error{
		"nil engine": func() error { _, err := idem.Do(ctx, nil, jobReq("k", idem.External), fn); return err },
		"nil fn":     func() error { _, err := idem.Do[int](ctx, e, jobReq("k", idem.External), nil); return err },
		"bad kind":   func() error { _, err := idem.Do(ctx, e, bad, fn); return err },
		"bad key":    func() error { _, err := idem.Do(ctx, e, jobReq("a b", idem.External), fn); return err },
		"long operation": func() error {
			r := jobReq("k", idem.External)
			r.Key.Operation = strings.Repeat("o", idem.MaxOperationLength+1)
			_, err := idem.Do(ctx, e, r, fn)
			return err
		},
		"cancelled context": func() error {
			c, cancel := context.WithCancel(ctx)
			cancel()
			_, err := idem.Do(c, e, jobReq("k", idem.External), fn)
			return err
		},
	} {
		if err := call(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestOutcomeErrorMessages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  *idem.OutcomeError
		want string
		is   error
	}{
		{&idem.OutcomeError{Outcome: idem.InFlight, RetryAfter: 3 * time.Second}, "still running (retry after 3s)", idem.ErrInFlight},
		{&idem.OutcomeError{Outcome: idem.Mismatch}, "different request", idem.ErrMismatch},
		{&idem.OutcomeError{Outcome: idem.NeedsReview, Record: &idemstore.Record{Reason: "lease expired"}}, "needs review: lease expired", idem.ErrNeedsReview},
		{&idem.OutcomeError{Outcome: idem.Replayed, Record: &idemstore.Record{Response: &idem.Response{NotReplayable: "body_too_large"}}}, "not kept (body_too_large)", idem.ErrNotReplayable},
		{&idem.OutcomeError{Outcome: idem.Acquired}, "outcome acquired", nil},
	} {
		if got := tc.err.Error(); !strings.Contains(got, tc.want) {
			t.Errorf("%v: Error() = %q, want %q in it", tc.err.Outcome, got, tc.want)
		}
		if tc.is != nil && !errors.Is(tc.err, tc.is) {
			t.Errorf("%v: not %v", tc.err.Outcome, tc.is)
		}
	}
	if idem.Retryable(nil) != nil || idem.Ambiguous(nil) != nil {
		t.Fatal("marking a nil error made one")
	}
}

// BenchmarkDo measures what Do adds to driving the lease by hand (Begin,
// Heartbeat, Complete with a JSON body), on the memory store: "by hand" is
// the baseline, "do" the same work through Do, "replay" a later call.
// Each runs on a fresh store.
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	result := receipt{ID: "rc_1", Amount: 500, Tags: []string{"a"}}
	// Every call takes a fresh key, also across the runs of a sub-benchmark.
	n := 0
	key := func() string { n++; return strconv.Itoa(n) }
	b.Run("by hand", func(b *testing.B) {
		e, _ := newEngine(b, quiet(idem.EngineConfig{}))
		b.ReportAllocs()
		for b.Loop() {
			res, err := e.Begin(ctx, jobReq(key(), idem.Transactional))
			if err != nil {
				b.Fatal(err)
			}
			stop := res.Lease.Heartbeat()
			body, _ := json.Marshal(result)
			stop()
			if err := res.Lease.Complete(ctx, &idem.Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("do", func(b *testing.B) {
		e, _ := newEngine(b, quiet(idem.EngineConfig{}))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := idem.Do(ctx, e, jobReq(key(), idem.Transactional), func(context.Context) (receipt, error) { return result, nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		e, _ := newEngine(b, quiet(idem.EngineConfig{}))
		b.ReportAllocs()
		r := jobReq("replayed", idem.Transactional)
		fn := func(context.Context) (receipt, error) { return result, nil }
		if _, err := idem.Do(ctx, e, r, fn); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := idem.Do(ctx, e, r, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
}
