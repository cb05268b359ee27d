package idemclient_test

// Attacks on the promise that one logical request keeps one key whatever
// path its retries take, that retries are bounded and leave nothing behind,
// and that the caller's request is left as it was.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
)

// A node that is no longer the leader answers a retry with 307 to the new
// leader (Vault, Consul, Nomad and etcd's gateways do this), and both nodes
// share one store. The first attempt ran and its answer was lost; the retry
// is redirected. The redirected request must carry the same key, or the new
// leader runs the operation a second time.
func TestAttackRedirectKeepsTheKey(t *testing.T) {
	t.Parallel()
	e := newEngine(t, idem.EngineConfig{})
	var runs atomic.Int32
	protected := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, n)
	}))
	var mu sync.Mutex
	var keys []string
	seen := func(r *http.Request) (first bool) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get(idem.HeaderName))
		return len(keys) == 1
	}
	newLeader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen(r)
		protected.ServeHTTP(w, r)
	}))
	defer newLeader.Close()
	oldLeader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !seen(r) { // stepped down
			http.Redirect(w, r, newLeader.URL+r.URL.Path, http.StatusTemporaryRedirect)
			return
		}
		protected.ServeHTTP(httptest.NewRecorder(), r) // runs, then the answer is lost
		drop(w, r)
	}))
	defer oldLeader.Close()

	tr, _ := newTransport(t)
	resp, err := (&http.Client{Transport: tr}).Post(oldLeader.URL+"/charges", "application/json", strings.NewReader(`{"amount":500}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if runs.Load() != 1 || !allSame(keys) || len(keys) != 3 {
		t.Fatalf("the operation ran %d times; keys %q; answer %d %s", runs.Load(), keys, resp.StatusCode, body)
	}
	if !idemclient.Replayed(resp) || string(body) != `{"charge":1}` || idemclient.KeyOf(resp) != keys[0] {
		t.Fatalf("answer %s, replayed %v, KeyOf %q", body, idemclient.Replayed(resp), idemclient.KeyOf(resp))
	}
}

// A 303 (POST becomes GET) is a new, unprotected request: it carries no key.
func TestAttackSeeOtherCarriesNoKey(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			http.Redirect(w, r, "/result", http.StatusSeeOther)
			return
		}
		got.Store(r.Header.Get(idem.HeaderName))
	}))
	defer srv.Close()
	tr, _ := newTransport(t)
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if k := got.Load(); k != "" {
		t.Fatalf("the GET after 303 carried key %q", k)
	}
}

// Retry-After values a hostile or broken server may send: each is bounded
// by MaxAttempts and MaxElapsed, and every attempt carries the same key.
func TestAttackRetryAfterValues(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name, value string
		attempts    int
		slept       []time.Duration
	}{
		{"zero", "0", 3, []time.Duration{0, 0}},
		{"negative", "-1", 3, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}}, // ignored: backoff
		{"fraction", "1.5", 3, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
		{"huge", "99999999999999999999999", 1, nil},
		{"max int64", "9223372036854775807", 1, nil},
		{"past date", start.Add(-time.Hour).Format(http.TimeFormat), 3, []time.Duration{0, 0}},
		{"date past MaxElapsed", start.Add(2 * time.Minute).Format(http.TimeFormat), 1, nil},
		{"garbage", "soon", 3, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, srv := newScripted(t, status(503, "busy", "Retry-After", tc.value))
			tr, ft := newTransport(t)
			tr.MaxAttempts = 3
			resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			slept := ft.Slept()
			if resp.StatusCode != 503 || len(s.Keys()) != tc.attempts || !allSame(s.Keys()) || fmt.Sprint(slept) != fmt.Sprint(tc.slept) {
				t.Fatalf("status %d, keys %q, waits %v; want %d attempts, waits %v", resp.StatusCode, s.Keys(), slept, tc.attempts, tc.slept)
			}
		})
	}
}

// A 409 is retried as in flight unless idem says otherwise: no body, a
// text body, another server's problem type; idem's needs-review problem is
// not retried even without its Idempotency-Outcome header.
func TestAttack409Bodies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		answer      func(http.ResponseWriter, *http.Request)
		attempts    int
		needsReview bool
	}{
		{"no body", status(409, ""), 3, false},
		{"text", status(409, "busy", "Content-Type", "text/plain"), 3, false},
		{"broken json", status(409, `{"type":`, "Content-Type", "application/problem+json"), 3, false},
		{"other problem", status(409, `{"type":"https://example.com/dup","title":"Duplicate"}`, "Content-Type", "application/problem+json"), 3, false},
		{"idem in flight", status(409, `{"type":"`+idem.ProblemInFlight+`"}`, "Content-Type", "application/problem+json"), 3, false},
		{"idem needs review", status(409, `{"type":"`+idem.ProblemNeedsReview+`","title":"Needs review"}`, "Content-Type", "application/problem+json"), 1, true},
		{"needs review header", status(409, "", "Idempotency-Outcome", idem.SituationNeedsReview.Name), 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, srv := newScripted(t, tc.answer)
			tr, _ := newTransport(t)
			tr.MaxAttempts = 3
			_, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", strings.NewReader("x"))
			var ie *idemclient.Error
			if !errors.As(err, &ie) || ie.StatusCode != 409 || ie.Attempts != tc.attempts || ie.NeedsReview() != tc.needsReview {
				t.Fatalf("err %v (%+v), want a 409 *Error after %d attempts", err, ie, tc.attempts)
			}
			if len(s.Keys()) != tc.attempts || !allSame(s.Keys()) || ie.Key != s.Keys()[0] {
				t.Fatalf("keys %q, Error.Key %q", s.Keys(), ie.Key)
			}
		})
	}
}

// A context whose deadline comes before the server's Retry-After (or the
// backoff) ends the retries at once with the last answer: no wait that
// cannot end in time begins.
func TestAttackDeadlineBeforeRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		answer func(http.ResponseWriter, *http.Request)
	}{
		{"retry-after", status(503, "", "Retry-After", "7200")},
		{"backoff", status(502, "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, srv := newScripted(t, tc.answer)
			tr, ft := newTransport(t)
			ft.now = time.Now() // the context's deadline is on the real clock
			tr.BaseDelay, tr.MaxDelay, tr.MaxElapsed = 2*time.Hour, 2*time.Hour, 24*time.Hour
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("x"))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if len(s.Keys()) != 1 || len(ft.Slept()) != 0 {
				t.Fatalf("%d attempts, waits %v", len(s.Keys()), ft.Slept())
			}
		})
	}
}

// Bodies: http.NoBody is retried; a GetBody that fails ends the retries with
// its error and closes the answer retried past; the caller's request keeps
// its body, length and header.
func TestAttackBodies(t *testing.T) {
	t.Parallel()
	t.Run("NoBody", func(t *testing.T) {
		t.Parallel()
		s, srv := newScripted(t, status(502, ""), status(201, ""))
		tr, _ := newTransport(t)
		req, _ := http.NewRequest("POST", srv.URL, nil)
		req.Body, req.GetBody = http.NoBody, nil
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 || len(s.Keys()) != 2 || !allSame(s.Keys()) {
			t.Fatalf("status %d, keys %q", resp.StatusCode, s.Keys())
		}
	})
	t.Run("GetBody fails", func(t *testing.T) {
		t.Parallel()
		s, srv := newScripted(t, status(503, "busy"), status(201, ""))
		tr, _ := newTransport(t)
		bc := &bodyCounter{base: tr.Base}
		tr.Base = bc
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("x"))
		gone := errors.New("the file was removed")
		req.GetBody = func() (io.ReadCloser, error) { return nil, gone }
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, gone) || len(s.Keys()) != 1 || bc.opened.Load() != bc.closed.Load() {
			t.Fatalf("err %v, %d attempts, %d answers opened, %d closed", err, len(s.Keys()), bc.opened.Load(), bc.closed.Load())
		}
	})
	t.Run("caller's request", func(t *testing.T) {
		t.Parallel()
		s, srv := newScripted(t, drop, status(503, "", "Retry-After", "1"), status(201, ""))
		tr, _ := newTransport(t)
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{"amount":500}`))
		req.Header.Set("X-Trace", "t1")
		body, getBody, length := req.Body, req.GetBody, req.ContentLength
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if req.Body != body || req.ContentLength != length || fmt.Sprint(req.Header) != "map[X-Trace:[t1]]" || fmt.Sprintf("%p", req.GetBody) != fmt.Sprintf("%p", getBody) {
			t.Fatalf("the caller's request changed: %v", req.Header)
		}
		if fmt.Sprint(s.Bodies()) != `[{"amount":500} {"amount":500} {"amount":500}]` || !allSame(s.Keys()) {
			t.Fatalf("bodies %q, keys %q", s.Bodies(), s.Keys())
		}
	})
}

// One Transport serves many goroutines at once, each with its own key
// across its own retries.
func TestAttackConcurrentRequests(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string][]string{} // X-Request → keys
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request")
		mu.Lock()
		seen[id] = append(seen[id], r.Header.Get(idem.HeaderName))
		n := len(seen[id])
		mu.Unlock()
		if n < 3 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tr, _ := newTransport(t)
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("x"))
			req.Header.Set("X-Request", fmt.Sprint(i))
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 201 {
				t.Errorf("request %d: status %d", i, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	all := map[string]bool{}
	for id, keys := range seen {
		if len(keys) != 3 || !allSame(keys) || all[keys[0]] {
			t.Fatalf("request %s: keys %q (shared with another request: %v)", id, keys, all[keys[0]])
		}
		all[keys[0]] = true
	}
}

// No goroutine (and so no connection) outlives a request whose answers were
// retried past, refused, or lost: every answer's body is closed. Not
// parallel, so that goleak sees only this test's goroutines.
func TestAttackNoLeaks(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	_, srv := newScripted(t,
		status(503, strings.Repeat("b", 100<<10), "Retry-After", "0"), // larger than what is drained
		drop,
		status(409, "in flight"),
		status(502, "bad gateway"),
		status(201, "created"),
	)
	tr, _ := newTransport(t)
	tr.MaxAttempts = 5
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	_, refusal := newScripted(t, status(409, "", "Idempotency-Outcome", idem.SituationNeedsReview.Name))
	if _, err := (&http.Client{Transport: tr}).Post(refusal.URL, "text/plain", strings.NewReader("x")); err == nil {
		t.Fatal("needs review came back as an answer")
	}
	srv.Close()
	refusal.Close()
	tr.Base.(*http.Transport).CloseIdleConnections()
}
