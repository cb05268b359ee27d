package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// failingSettle is a store that goes down between the reservation and the
// completion: Complete fails as an unreachable server would, and so does
// Escalate with escalateToo, until escalateUntil when that is set (the
// bubble's time).
type failingSettle struct {
	*idemmem.Store
	escalateToo   bool
	escalateUntil time.Time
}

func (failingSettle) Complete(context.Context, idemstore.CompleteParams) error {
	return fmt.Errorf("dial tcp 127.0.0.1:1: connection refused: %w", idemstore.ErrUnavailable)
}

func (s failingSettle) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	down := s.escalateToo && (s.escalateUntil.IsZero() || time.Now().Before(s.escalateUntil))
	if down && !p.IfExpired {
		return fmt.Errorf("dial tcp 127.0.0.1:1: connection refused: %w", idemstore.ErrUnavailable)
	}
	return s.Store.Escalate(ctx, p)
}

// TestMiddlewareCompleteFails: when the answer cannot be stored, the client
// still gets it and no retry runs the handler again, whatever the kind: a
// transactional handler may have committed its own change without
// CompleteTx, so the key is escalated, not left for a takeover. When the
// store refuses the escalation too for longer than SettleTimeout, it is
// tried again, after the answer went out, until the lease would expire; if
// the store is back by then the key is in review, else it stays pending and
// recovery's rules apply (an external key needs review).
func TestMiddlewareCompleteFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		kind          idem.Kind
		escalateToo   bool
		outage        time.Duration // of Escalate; 0 with escalateToo: for good
		settlement    string
		before, after string // the retry's outcome right after, and once the lease has passed
	}{
		{"external", idem.External, false, 0, "escalated", "needs_review", "needs_review"},
		{"transactional", idem.Transactional, false, 0, "escalated", "needs_review", "needs_review"},
		{"transactional, escalate refused for a while", idem.Transactional, true, 15 * time.Second, "escalated", "needs_review", "needs_review"},
		{"external, escalate refused for good", idem.External, true, 0, "failed", "needs_review", "needs_review"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				mem := idemmem.MustNew(idemmem.Config{}) // the bubble's clock
				t.Cleanup(func() { mem.Close() })
				st := failingSettle{Store: mem, escalateToo: tc.escalateToo}
				if tc.outage > 0 {
					st.escalateUntil = time.Now().Add(tc.outage)
				}
				e, err := idem.NewEngine(st, idem.EngineConfig{Lease: time.Minute, SettleTimeout: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				idem.SetHeartbeatLinger(e, 0)
				var (
					mu     sync.Mutex
					events []idem.Event
					runs   int
				)
				mw := idem.Middleware(e, idem.Config{Scope: userScope, Policy: idem.Policy{Kind: tc.kind}, OnOutcome: func(ev idem.Event) {
					mu.Lock()
					events = append(events, ev)
					mu.Unlock()
				}})
				h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					runs++
					mu.Unlock()
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, `{"charged":true}`)
				}))
				post := func() *httptest.ResponseRecorder {
					r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{}`))
					r.Header.Set("X-User", "alice")
					r.Header.Set(idem.HeaderName, "k")
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					return w
				}
				if w := post(); w.Code != http.StatusCreated || w.Body.String() != `{"charged":true}` {
					t.Fatalf("first: %d %s", w.Code, w.Body)
				}
				mu.Lock()
				if ev := events[0]; ev.Outcome != "acquired" || ev.Settlement != tc.settlement || ev.Status != http.StatusCreated {
					t.Errorf("event %+v, want acquired/%s/201", ev, tc.settlement)
				}
				mu.Unlock()
				if w := post(); w.Code != http.StatusConflict || w.Header().Get("Idempotency-Outcome") != tc.before {
					t.Fatalf("retry: %d %s, want %s", w.Code, w.Body, tc.before)
				}
				time.Sleep(2 * time.Minute)
				if w := post(); w.Code != http.StatusConflict || w.Header().Get("Idempotency-Outcome") != tc.after {
					t.Fatalf("retry after the lease: %d %s, want %s", w.Code, w.Body, tc.after)
				}
				mu.Lock()
				defer mu.Unlock()
				if runs != 1 {
					t.Fatalf("handler ran %d times", runs)
				}
			})
		})
	}
}

// TestMiddlewareSettlements checks Event.Settlement, which metrics count,
// for each way an acquired request ends.
func TestMiddlewareSettlements(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
		kind       idem.Kind
		handler    func(w http.ResponseWriter, r *http.Request)
	}{
		{"completed", "completed", idem.External, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }},
		{"released on 503", "released", idem.External, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }},
		{"streamed", "not_replayable", idem.External, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "chunk")
			w.(http.Flusher).Flush()
		}},
		{"handler settled it", "handler", idem.External, func(w http.ResponseWriter, r *http.Request) {
			if err := idem.LeaseFrom(r.Context()).Release(r.Context()); err != nil {
				panic(err)
			}
			w.WriteHeader(409)
		}},
		{"panic, external", "escalated", idem.External, func(w http.ResponseWriter, r *http.Request) { panic("boom") }},
		// Without CompleteTx nothing proves the transaction rolled back.
		{"panic, transactional", "escalated", idem.Transactional, func(w http.ResponseWriter, r *http.Request) { panic("boom") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			var mu sync.Mutex
			f := newFixture(t, idem.Config{Policy: idem.Policy{Kind: tc.kind}, OnOutcome: func(ev idem.Event) {
				mu.Lock()
				got = append(got, ev.Outcome+"/"+ev.Settlement)
				mu.Unlock()
			}}, idem.EngineConfig{}, func(_ *fixture, w http.ResponseWriter, r *http.Request) { tc.handler(w, r) })
			func() {
				defer func() { _ = recover() }()
				f.do(call{key: "k"})
			}()
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 || got[0] != "acquired/"+tc.want {
				t.Fatalf("events %v, want [acquired/%s]", got, tc.want)
			}
		})
	}
}

// TestMiddlewareClientGone: a client that gives up while the handler runs
// (a phone timing out) does not lose the answer: the handler finishes, the
// answer is stored, and the retry replays it without a second run.
func TestMiddlewareClientGone(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		if f.runs.Load() == 1 {
			close(started)
			<-r.Context().Done() // the client is gone; the charge goes through anyway
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
	select {
	case <-started:
	case <-done:
		t.Fatal("the handler did not run")
	}
	cancel()
	<-done
	w := f.do(call{key: "k"})
	if w.Code != http.StatusCreated || w.Body.String() != `{"charged":true}` || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the client left: %d %q %v", w.Code, w.Body, w.Header())
	}
	if n := f.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

// cancelDuringComplete cancels the request's context while Complete is in
// flight, then lets Complete run on the context it was given, as a client
// that times out mid-settlement would.
type cancelDuringComplete struct {
	*idemmem.Store
	cancel func()
}

func (s cancelDuringComplete) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	s.cancel()
	return s.Store.Complete(ctx, p)
}

// TestMiddlewareClientLeavesDuringSettlement: a client that times out while
// the answer is being stored cancels nothing: the store's Complete runs on a
// context detached from the request, and the retry replays the answer.
func TestMiddlewareClientLeavesDuringSettlement(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	e, err := idem.NewEngine(cancelDuringComplete{mem, cancel}, idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charged":true}`)
	}))
	post := func(ctx context.Context) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{}`)).WithContext(ctx)
		r.Header.Set(idem.HeaderName, "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	post(ctx)
	if ctx.Err() == nil {
		t.Fatal("test bug: the request's context was not cancelled during Complete")
	}
	w := post(context.Background())
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || runs != 1 {
		t.Fatalf("retry after the client left mid-settlement: %d %q, runs %d", w.Code, w.Body, runs)
	}
}

// TestMiddlewareWaiterLeaves: a duplicate waiting for the first request
// (Policy.Wait) whose client gives up is counted as canceled, gets nothing
// written, and changes nothing for the first request.
func TestMiddlewareWaiterLeaves(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		var (
			mu       sync.Mutex
			outcomes []string
		)
		f := newFixture(t, idem.Config{Policy: idem.Policy{Wait: time.Minute}, OnOutcome: func(ev idem.Event) {
			mu.Lock()
			outcomes = append(outcomes, fmt.Sprintf("%s/%d", ev.Outcome, ev.Status))
			mu.Unlock()
		}}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			w.WriteHeader(http.StatusCreated)
		})
		first := make(chan *httptest.ResponseRecorder)
		go func() { first <- f.do(call{key: "k"}) }()
		<-entered

		ctx, cancel := context.WithCancel(context.Background())
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100,"currency":"usd"}`)).WithContext(ctx)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-User", "alice")
		r.Header.Set(idem.HeaderName, "k")
		w := httptest.NewRecorder()
		waited := make(chan struct{})
		go func() {
			defer close(waited)
			f.h.ServeHTTP(w, r)
		}()
		synctest.Wait() // it waits
		cancel()
		<-waited
		if w.Body.Len() != 0 || len(w.Header()) != 0 {
			t.Fatalf("a waiter whose client left got an answer written: %d %v %q", w.Code, w.Header(), w.Body)
		}
		close(release)
		if got := <-first; got.Code != http.StatusCreated {
			t.Fatalf("first request: %d", got.Code)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(outcomes) != 2 || outcomes[0] != "canceled/499" || outcomes[1] != "acquired/201" {
			t.Fatalf("outcomes %v, want [canceled/499 acquired/201]", outcomes)
		}
		if n := f.runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times", n)
		}
	})
}
