package idemclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
	"github.com/idem-dev/idem/idemproxy"
)

// app is an API that charges once per call: it counts its runs, and the
// first run waits for release before it answers (a second one, which a
// client that changes keys would cause, answers at once).
type app struct {
	runs    atomic.Int32
	started chan struct{} // closed when the first run starts
	release chan struct{}
}

func newApp() *app { return &app{started: make(chan struct{}), release: make(chan struct{})} }

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.runs.Add(1)
	if n == 1 {
		close(a.started)
		<-a.release
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"charge":%d}`, n)
}

// dropFirst is the front of a protected server whose first answer is lost:
// it hands the first request to next on its own, and once next is at work,
// closes the client's connection without a word. Later requests are served
// as usual. It records the key and body of every request.
type dropFirst struct {
	next    http.Handler
	started <-chan struct{} // closed when next is at work on the first request
	handled chan struct{}   // closed when next has finished the first request

	mu     sync.Mutex
	keys   []string
	bodies []string
}

func (d *dropFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	d.mu.Lock()
	d.keys = append(d.keys, r.Header.Get(idem.HeaderName))
	d.bodies = append(d.bodies, string(body))
	first := len(d.keys) == 1
	d.mu.Unlock()
	if !first {
		d.next.ServeHTTP(w, r)
		return
	}
	detached := r.Clone(context.WithoutCancel(r.Context()))
	detached.Body = io.NopCloser(bytes.NewReader(body))
	go func() {
		defer close(d.handled)
		d.next.ServeHTTP(httptest.NewRecorder(), detached)
	}()
	<-d.started
	drop(w, r)
}

// TestTransportKeepsItsKeyAgainstIdem sends one POST through a server that
// loses the first answer, then says the key is in flight (409, Retry-After),
// then replays: against idem's middleware and against idem serve's proxy.
// The operation runs once, the client gets the first answer, and every
// attempt carries the same key and body.
func TestTransportKeepsItsKeyAgainstIdem(t *testing.T) {
	t.Parallel()
	for _, front := range []struct {
		name    string
		protect func(t *testing.T, e *idem.Engine, a *app) http.Handler
	}{
		{"middleware", func(t *testing.T, e *idem.Engine, a *app) http.Handler {
			return idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(a)
		}},
		{"proxy", func(t *testing.T, e *idem.Engine, a *app) http.Handler {
			upstream := httptest.NewServer(a)
			t.Cleanup(upstream.Close)
			p, err := idemproxy.New(e, idemproxy.Config{Upstream: upstream.URL}, idemproxy.Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}},
	} {
		t.Run(front.name, func(t *testing.T) {
			t.Parallel()
			a := newApp()
			e := newEngine(t, idem.EngineConfig{})
			d := &dropFirst{next: front.protect(t, e, a), started: a.started, handled: make(chan struct{})}
			srv := httptest.NewServer(d)
			defer srv.Close()
			defer close(a.release) // also when the test fails early

			tr, ft := newTransport(t)
			ft.onSleep = func(_ context.Context, n int, _ time.Duration) error {
				if n == 2 { // after the 409: let the first run finish and store its answer
					a.release <- struct{}{}
					<-d.handled
				}
				return nil
			}
			client := &http.Client{Transport: tr}
			req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(`{"amount":500}`))
			req.Header.Set("Authorization", "Bearer sk_test") // the proxy's scope
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()

			if resp.StatusCode != http.StatusCreated || string(body) != `{"charge":1}` || !idemclient.Replayed(resp) {
				t.Fatalf("answer %d %q, replayed %v", resp.StatusCode, body, idemclient.Replayed(resp))
			}
			if a.runs.Load() != 1 {
				t.Fatalf("the operation ran %d times", a.runs.Load())
			}
			d.mu.Lock()
			keys, bodies := d.keys, d.bodies
			d.mu.Unlock()
			if len(keys) != 3 || !allSame(keys) || idemclient.KeyOf(resp) != keys[0] {
				t.Fatalf("keys %q, KeyOf %q", keys, idemclient.KeyOf(resp))
			}
			for _, b := range bodies {
				if b != `{"amount":500}` {
					t.Fatalf("bodies %q", bodies)
				}
			}
			// The lost answer was retried after the backoff, the 409 after
			// its Retry-After.
			if slept := ft.Slept(); len(slept) != 2 || slept[0] != 100*time.Millisecond || slept[1] != time.Second {
				t.Fatalf("waits %v, want [100ms 1s]", slept)
			}
			if req.Header.Get(idem.HeaderName) != "" {
				t.Fatal("the caller's request was modified")
			}
		})
	}
}

// idem's refusals come back as *Error, after one attempt, with the problem
// document: a malformed key, a key reused for another body, a key whose
// first attempt needs review, an answer that was not kept.
func TestTransportReturnsIdemRefusals(t *testing.T) {
	t.Parallel()
	e := newEngine(t, idem.EngineConfig{MaxResponseBody: 64})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("POST /unknown", func(w http.ResponseWriter, r *http.Request) {
		// The outcome is unknown: a timeout after the provider was called.
		if err := idem.LeaseFrom(r.Context()).Escalate(r.Context(), "provider timed out"); err != nil {
			panic(err)
		}
		w.WriteHeader(http.StatusGatewayTimeout)
	})
	mux.HandleFunc("POST /big", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strings.Repeat("x", 100))
	})
	srv := httptest.NewServer(idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(mux))
	defer srv.Close()

	tr, ft := newTransport(t)
	client := &http.Client{Transport: tr}
	post := func(path, key, body string) (*http.Response, error) {
		req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set(idem.HeaderName, key)
		}
		return client.Do(req)
	}
	mustPost := func(path, key, body string) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
		req.Header.Set(idem.HeaderName, key)
		resp, err := srv.Client().Do(req) // without the Transport: the 504 is not retried
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	mustPost("/charges", "k-reused", `{"amount":1}`)
	mustPost("/unknown", "k-review", `{}`)
	mustPost("/big", "k-big", `{}`)

	for _, tc := range []struct {
		name, path, key, body string
		status                int
		problem               string
	}{
		{"invalid key", "/charges", "a b", `{}`, 400, idem.ProblemInvalidKey},
		{"reused key", "/charges", "k-reused", `{"amount":2}`, 422, idem.ProblemMismatch},
		{"needs review", "/unknown", "k-review", `{}`, 409, idem.ProblemNeedsReview},
		{"not replayable", "/big", "k-big", `{}`, 409, idem.ProblemNotReplayable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := post(tc.path, tc.key, tc.body)
			var ie *idemclient.Error
			if !errors.As(err, &ie) {
				t.Fatalf("got %v, %v; want an *idemclient.Error", resp, err)
			}
			if ie.StatusCode != tc.status || ie.Problem.Type != tc.problem || ie.Problem.Status != tc.status || ie.Attempts != 1 || len(ie.Body) == 0 {
				t.Fatalf("error %+v", ie)
			}
			if tc.name == "needs review" && (!ie.NeedsReview() || ie.Key != tc.key || ie.Problem.Key != tc.key) {
				t.Fatalf("needs review: %v, key %q, problem key %q", ie.NeedsReview(), ie.Key, ie.Problem.Key)
			}
		})
	}
	if slept := ft.Slept(); len(slept) != 0 {
		t.Fatalf("refusals were retried: waits %v", slept)
	}
}
