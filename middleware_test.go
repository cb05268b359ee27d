package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
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
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// userScope scopes keys by the X-User header, as an auth middleware would.
func userScope(r *http.Request) (string, error) {
	u := r.Header.Get("X-User")
	switch u {
	case "":
		return "", errors.New("no user")
	case "banned":
		return "", &idem.ScopeError{Status: http.StatusForbidden, Detail: "banned"}
	}
	return "user:" + u, nil
}

type fixture struct {
	e     *idem.Engine
	store *idemmem.Store
	runs  atomic.Int32
	h     http.Handler
	logs  *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newFixture protects handler (which counts its runs) with cfg.
func newFixture(t *testing.T, cfg idem.Config, ecfg idem.EngineConfig, handler func(f *fixture, w http.ResponseWriter, r *http.Request)) *fixture {
	t.Helper()
	f := &fixture{logs: &syncBuffer{}}
	f.store = idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { f.store.Close() })
	ecfg.Logger = slog.New(slog.NewJSONHandler(f.logs, nil))
	var err error
	f.e, err = idem.NewEngine(f.store, ecfg)
	if err != nil {
		t.Fatal(err)
	}
	idem.SetHeartbeatLinger(f.e, 0) // tests in synctest bubbles end with no goroutine
	if cfg.Scope == nil {
		cfg.Scope = userScope
	}
	mw, err := idem.NewMiddleware(f.e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.runs.Add(1)
		handler(f, w, r)
	}))
	return f
}

func paymentHandler(_ *fixture, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	http.SetCookie(w, &http.Cookie{Name: "session", Value: "secret"})
	w.Header().Set("X-Request-Body", string(body))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"pay_%d"}`, time.Now().UnixNano())
}

type call struct {
	method, path, key, user, body string
	keys                          []string // several Idempotency-Key lines
	noKey                         bool
}

func (f *fixture) do(c call) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, f.request(c))
	return w
}

// request builds the request do sends for c.
func (f *fixture) request(c call) *http.Request {
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.path == "" {
		c.path = "/payments"
	}
	if c.user == "" {
		c.user = "alice"
	}
	if c.body == "" {
		c.body = `{"amount":100,"currency":"usd"}`
	}
	r := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-User", c.user)
	switch {
	case c.keys != nil:
		r.Header[idem.HeaderName] = c.keys
	case !c.noKey:
		r.Header.Set(idem.HeaderName, c.key)
	}
	return r
}

func problemType(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, body %s", ct, w.Body)
	}
	var p idem.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Status != w.Code || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem %+v for status %d", p, w.Code)
	}
	return p.Type
}

func TestMiddlewareKeyValidation(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 256)
	cases := []struct {
		name    string
		c       call
		status  int
		problem string
		runs    int32
	}{
		{"missing", call{noKey: true}, 400, idem.ProblemMissingKey, 0},
		{"empty", call{key: ""}, 400, idem.ProblemInvalidKey, 0},
		{"256 bytes", call{key: long}, 400, idem.ProblemInvalidKey, 0},
		{"control character", call{key: "abc\x01def"}, 400, idem.ProblemInvalidKey, 0},
		{"non-ASCII", call{key: "clé-1"}, 400, idem.ProblemInvalidKey, 0},
		{"two headers", call{keys: []string{"a", "b"}}, 400, idem.ProblemInvalidKey, 0},
		{"list in one header", call{key: "a, b"}, 400, idem.ProblemInvalidKey, 0},
		{"bad escape in quoted string", call{key: `"a\qb"`}, 400, idem.ProblemInvalidKey, 0},
		{"quoted string with escapes", call{key: `"a\"b\\c"`}, 201, "", 1},
		{"255 bytes", call{key: long[:255]}, 201, "", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
			w := f.do(tc.c)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			if tc.problem != "" {
				if got := problemType(t, w); got != tc.problem {
					t.Fatalf("problem type %q, want %q", got, tc.problem)
				}
			}
			if f.runs.Load() != tc.runs {
				t.Fatalf("handler ran %d times, want %d", f.runs.Load(), tc.runs)
			}
		})
	}
}

func TestMiddlewareReplay(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
	first := f.do(call{key: "k1"})
	if first.Code != 201 || first.Header().Get("Idempotency-Outcome") != "acquired" || first.Header().Get("Set-Cookie") == "" {
		t.Fatalf("first: %d %v", first.Code, first.Header())
	}
	second := f.do(call{key: "k1", body: `{ "currency":"usd", "amount":100 }`})
	if second.Code != 201 || second.Body.String() != first.Body.String() {
		t.Fatalf("replay %d %q, want %q", second.Code, second.Body, first.Body)
	}
	h := second.Header()
	if h.Get("Idempotent-Replayed") != "true" || h.Get("Idempotency-Outcome") != "replayed" {
		t.Fatalf("replay headers %v", h)
	}
	if h.Get("Set-Cookie") != "" {
		t.Fatal("Set-Cookie replayed")
	}
	if h.Get("Content-Type") != "application/json" || h.Get("X-Request-Body") != first.Header().Get("X-Request-Body") {
		t.Fatalf("stored headers lost: %v", h)
	}
	if f.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", f.runs.Load())
	}
	// The handler read the whole body although the middleware read it first.
	if first.Header().Get("X-Request-Body") != `{"amount":100,"currency":"usd"}` {
		t.Fatalf("handler saw body %q", first.Header().Get("X-Request-Body"))
	}
}

func TestMiddlewareScopes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
	a := f.do(call{key: "shared", user: "alice"})
	b := f.do(call{key: "shared", user: "bob"})
	if a.Code != 201 || b.Code != 201 || a.Body.String() == b.Body.String() {
		t.Fatalf("alice %d %s, bob %d %s", a.Code, a.Body, b.Code, b.Body)
	}
	if b.Header().Get("Idempotent-Replayed") != "" || f.runs.Load() != 2 {
		t.Fatal("bob got alice's answer")
	}
	// Scope errors: 401 by default, or what the ScopeFunc says.
	r := httptest.NewRequest("POST", "/payments", strings.NewReader("{}"))
	r.Header.Set(idem.HeaderName, "k")
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	if w.Code != 401 || problemType(t, w) != idem.ProblemScope {
		t.Fatalf("no user: %d", w.Code)
	}
	if w := f.do(call{key: "k", user: "banned"}); w.Code != 403 {
		t.Fatalf("banned: %d", w.Code)
	}
	if f.runs.Load() != 2 {
		t.Fatal("handler ran for a refused scope")
	}
}

func TestMiddlewareMismatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
	f.do(call{key: "k"})
	for _, c := range []call{
		{key: "k", body: `{"amount":200,"currency":"usd"}`},
		{key: "k", path: "/payments?expand=customer"},
	} {
		w := f.do(c)
		if w.Code != 422 || problemType(t, w) != idem.ProblemMismatch {
			t.Fatalf("%+v: %d %s", c, w.Code, w.Body)
		}
	}
	if f.runs.Load() != 1 {
		t.Fatalf("runs %d", f.runs.Load())
	}
}

func TestMiddlewareInFlight(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(201)
	})
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- f.do(call{key: "k"}) }()
	<-entered
	w := f.do(call{key: "k"})
	if w.Code != 409 || problemType(t, w) != idem.ProblemInFlight || w.Header().Get("Retry-After") == "" {
		t.Fatalf("duplicate: %d %v %s", w.Code, w.Header(), w.Body)
	}
	close(release)
	if first := <-done; first.Code != 201 {
		t.Fatalf("first %d", first.Code)
	}
	if w := f.do(call{key: "k"}); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after: %d", w.Code)
	}
}

func TestMiddlewareWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		f := newFixture(t, idem.Config{Policy: idem.Policy{Wait: time.Minute}}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
			if f.runs.Load() == 1 {
				close(entered)
				<-release
			}
			w.WriteHeader(201)
			io.WriteString(w, "first")
		})
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- f.do(call{key: "k"}) }()
		<-entered
		waiter := make(chan *httptest.ResponseRecorder)
		go func() { waiter <- f.do(call{key: "k"}) }()
		synctest.Wait() // the duplicate is waiting
		close(release)
		<-done
		w := <-waiter
		if w.Code != 201 || w.Body.String() != "first" || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("waiter got %d %q", w.Code, w.Body)
		}
		if f.runs.Load() != 1 {
			t.Fatalf("runs %d", f.runs.Load())
		}
	})
}

func TestMiddlewareNeedsReviewAndPanic(t *testing.T) {
	t.Parallel()
	for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, idem.Config{Policy: idem.Policy{Kind: kind}}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
				if f.runs.Load() == 1 {
					panic("boom")
				}
				w.WriteHeader(201)
			})
			func() {
				defer func() {
					if v := recover(); v != "boom" {
						t.Fatalf("recovered %v, want the handler's panic", v)
					}
				}()
				f.do(call{key: "k"})
			}()
			// The outcome is unknown whatever the kind: a transactional
			// handler that panicked without completing in a transaction
			// may have committed its own change. Never run again; review.
			w := f.do(call{key: "k"})
			if w.Code != 409 || problemType(t, w) != idem.ProblemNeedsReview || f.runs.Load() != 1 {
				t.Fatalf("after panic: %d, runs %d", w.Code, f.runs.Load())
			}
		})
	}
}

func TestMiddlewareStatusPolicy(t *testing.T) {
	t.Parallel()
	statuses := []int{429, 503, 500, 400}
	for _, status := range statuses {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
				if f.runs.Load() == 1 {
					w.WriteHeader(status)
					io.WriteString(w, "first")
					return
				}
				w.WriteHeader(201)
			})
			if w := f.do(call{key: "k"}); w.Code != status {
				t.Fatalf("first %d", w.Code)
			}
			w := f.do(call{key: "k"})
			released := status == 429 || status == 503
			if released && (w.Code != 201 || f.runs.Load() != 2) {
				t.Fatalf("%d should release: got %d, runs %d", status, w.Code, f.runs.Load())
			}
			if !released && (w.Code != status || w.Body.String() != "first" || f.runs.Load() != 1) {
				t.Fatalf("%d should replay: got %d %q, runs %d", status, w.Code, w.Body, f.runs.Load())
			}
		})
	}
	// Configurable per route.
	f := newFixture(t, idem.Config{Routes: map[string]idem.Policy{"POST /payments": {ReleaseStatuses: []int{}}}}, idem.EngineConfig{},
		func(f *fixture, w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) })
	f.do(call{key: "k"})
	if w := f.do(call{key: "k"}); w.Code != 503 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("route without release statuses: %d", w.Code)
	}
}

func TestMiddlewareStreaming(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		io.WriteString(w, "chunk 1\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			panic(err)
		}
		io.WriteString(w, "chunk 2\n")
	})
	w := f.do(call{key: "k"})
	if w.Code != 200 || w.Body.String() != "chunk 1\nchunk 2\n" || !w.Flushed {
		t.Fatalf("stream: %d %q flushed=%v", w.Code, w.Body, w.Flushed)
	}
	w = f.do(call{key: "k"})
	if w.Code != 409 || problemType(t, w) != idem.ProblemNotReplayable || w.Header().Get("Idempotency-Original-Status") != "200" {
		t.Fatalf("retry of a stream: %d %s", w.Code, w.Body)
	}
	if f.runs.Load() != 1 {
		t.Fatalf("runs %d", f.runs.Load())
	}
}

func TestMiddlewareLargeResponseNotReplayable(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 100)
	f := newFixture(t, idem.Config{}, idem.EngineConfig{MaxResponseBody: 64}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, big[:50])
		io.WriteString(w, big[50:])
	})
	if w := f.do(call{key: "k"}); w.Code != 200 || w.Body.String() != big {
		t.Fatalf("first: %d %d bytes", w.Code, w.Body.Len())
	}
	if w := f.do(call{key: "k"}); w.Code != 409 || problemType(t, w) != idem.ProblemNotReplayable {
		t.Fatalf("retry: %d", w.Code)
	}
	if f.runs.Load() != 1 {
		t.Fatalf("runs %d", f.runs.Load())
	}
}

func TestMiddlewareBodyTooLarge(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{Policy: idem.Policy{MaxRequestBody: 16}}, idem.EngineConfig{}, paymentHandler)
	if w := f.do(call{key: "k", body: strings.Repeat("a", 17)}); w.Code != 413 || problemType(t, w) != idem.ProblemBodyTooLarge {
		t.Fatalf("Content-Length over: %d", w.Code)
	}
	// Without a Content-Length (chunked), the limit holds while reading.
	r := httptest.NewRequest("POST", "/payments", io.MultiReader(strings.NewReader(strings.Repeat("a", 10)), strings.NewReader(strings.Repeat("b", 10))))
	r.ContentLength = -1
	r.Header.Set(idem.HeaderName, "k2")
	r.Header.Set("X-User", "alice")
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	if w.Code != 413 {
		t.Fatalf("chunked over: %d", w.Code)
	}
	if w := f.do(call{key: "k3", body: strings.Repeat("a", 16)}); w.Code != 201 {
		t.Fatalf("at the limit: %d", w.Code)
	}
	if f.runs.Load() != 1 {
		t.Fatalf("runs %d", f.runs.Load())
	}
}

func TestMiddlewareTooLong(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
	long := "/payments/" + strings.Repeat("p", idem.MaxOperationLength)
	w := f.do(call{key: "k", path: long})
	if w.Code != http.StatusRequestURITooLong || problemType(t, w) != idem.ProblemTooLong {
		t.Fatalf("long path: %d %s", w.Code, w.Body)
	}
	if w.Header().Get("Idempotency-Outcome") != "too_long" {
		t.Fatalf("Idempotency-Outcome %q", w.Header().Get("Idempotency-Outcome"))
	}
	w = f.do(call{key: "k", user: strings.Repeat("u", idem.MaxScopeLength+1)})
	if w.Code != http.StatusBadRequest || problemType(t, w) != idem.ProblemTooLong {
		t.Fatalf("long scope: %d %s", w.Code, w.Body)
	}
	if f.runs.Load() != 0 {
		t.Fatalf("the handler ran %d times for refused requests", f.runs.Load())
	}
	// An unprotected method passes through whatever its path.
	if w := f.do(call{method: http.MethodGet, path: long}); w.Code != http.StatusCreated || f.runs.Load() != 1 {
		t.Fatalf("GET with a long path: %d, runs %d", w.Code, f.runs.Load())
	}
	// FailOpen is for an unreachable store, not for a request idem refuses.
	open := newFixture(t, idem.Config{FailOpen: true}, idem.EngineConfig{}, paymentHandler)
	if w := open.do(call{key: "k", path: long}); w.Code != http.StatusRequestURITooLong || open.runs.Load() != 0 {
		t.Fatalf("long path with FailOpen: %d, runs %d", w.Code, open.runs.Load())
	}
}

// failingStore fails every call as an unreachable server would.
type failingStore struct{ idemstore.Store }

func (failingStore) Reserve(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	return nil, false, fmt.Errorf("dial tcp 127.0.0.1:1: connection refused: %w", idemstore.ErrUnavailable)
}

func TestMiddlewareStoreUnavailable(t *testing.T) {
	t.Parallel()
	for _, failOpen := range []bool{false, true} {
		mem := idemmem.MustNew(idemmem.Config{})
		defer mem.Close()
		e, err := idem.NewEngine(failingStore{mem}, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		h := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope, FailOpen: failOpen})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(201)
		}))
		r := httptest.NewRequest("POST", "/payments", strings.NewReader("{}"))
		r.Header.Set(idem.HeaderName, "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if !failOpen && (w.Code != 503 || problemType(t, w) != idem.ProblemUnavailable || runs.Load() != 0) {
			t.Fatalf("fail closed: %d, runs %d", w.Code, runs.Load())
		}
		if failOpen && (w.Code != 201 || runs.Load() != 1) {
			t.Fatalf("fail open: %d, runs %d", w.Code, runs.Load())
		}
	}
}

func TestMiddlewarePassThrough(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{Routes: map[string]idem.Policy{"POST /optional": {KeyOptional: true}, "POST /off": {Disabled: true}}}, idem.EngineConfig{}, paymentHandler)
	for _, c := range []call{
		{method: "GET", noKey: true},
		{method: "PUT", noKey: true},
		{path: "/optional", noKey: true},
		{path: "/off", noKey: true},
	} {
		w := f.do(c)
		if w.Code != 201 || w.Header().Get("Idempotency-Outcome") != "" {
			t.Fatalf("%+v: %d %v", c, w.Code, w.Header())
		}
	}
	if f.runs.Load() != 4 {
		t.Fatalf("runs %d", f.runs.Load())
	}
}

func TestMiddlewareOperationFromPattern(t *testing.T) {
	t.Parallel()
	st := idemmem.MustNew(idemmem.Config{})
	defer st.Close()
	e, _ := idem.NewEngine(st, idem.EngineConfig{})
	var ops []string
	var mu sync.Mutex
	mw := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope, OnOutcome: func(ev idem.Event) {
		mu.Lock()
		ops = append(ops, ev.Operation+" "+ev.Outcome)
		mu.Unlock()
	}})
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}/refund", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(202) })))
	for _, path := range []string{"/orders/1/refund", "/orders/2/refund", "/orders/2/refund"} {
		r := httptest.NewRequest("POST", path, nil)
		r.Header.Set(idem.HeaderName, "same-key")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
	}
	// The operation names the route; the path is part of the request's
	// meaning, so the same key sent for another order is a mismatch.
	want := []string{"POST /orders/{id}/refund acquired", "POST /orders/{id}/refund mismatch", "POST /orders/{id}/refund mismatch"}
	if fmt.Sprint(ops) != fmt.Sprint(want) {
		t.Fatalf("events %v, want %v", ops, want)
	}
}

func TestMiddlewareConfigErrors(t *testing.T) {
	t.Parallel()
	st := idemmem.MustNew(idemmem.Config{})
	defer st.Close()
	e, _ := idem.NewEngine(st, idem.EngineConfig{})
	if _, err := idem.NewMiddleware(e, idem.Config{}); err == nil || !strings.Contains(err.Error(), "GlobalScope") {
		t.Fatalf("missing scope: %v", err)
	}
	if _, err := idem.NewMiddleware(e, idem.Config{Scope: idem.GlobalScope, Policy: idem.Policy{ExcludeFields: []string{"nope"}}}); err == nil {
		t.Fatal("bad pointer accepted")
	}
	if _, err := idem.NewMiddleware(nil, idem.Config{Scope: idem.GlobalScope}); err == nil {
		t.Fatal("nil engine accepted")
	}
}

func TestMiddlewareHandlerSettlesLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		lease := idem.LeaseFrom(r.Context())
		if lease == nil {
			panic("no lease in context")
		}
		// A handler that knows nothing happened may release the key itself.
		if err := lease.Release(r.Context()); err != nil {
			panic(err)
		}
		w.WriteHeader(502)
	})
	f.do(call{key: "k"})
	f.do(call{key: "k"})
	if f.runs.Load() != 2 {
		t.Fatalf("runs %d", f.runs.Load())
	}
}

func TestMiddlewareHeartbeat(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		f := newFixture(t, idem.Config{Policy: idem.Policy{Kind: idem.Transactional}}, idem.EngineConfig{Lease: 300 * time.Millisecond}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
			if f.runs.Load() == 1 {
				close(entered)
				<-release
			}
			w.WriteHeader(201)
		})
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- f.do(call{key: "k"}) }()
		<-entered
		// Well past the lease, in the bubble's time: without the heartbeat a
		// duplicate would take the key over and run the handler a second time.
		time.Sleep(time.Second)
		if w := f.do(call{key: "k"}); w.Code != 409 {
			t.Fatalf("duplicate during a long handler: %d", w.Code)
		}
		close(release)
		<-done
		if f.runs.Load() != 1 {
			t.Fatalf("runs %d", f.runs.Load())
		}
	})
}

// TestMiddlewareLogsRedactKeys: what idem logs about a key names it by a
// short hash, never by the client's value. A failed settlement logs at
// error and the escalation at warn, both about the key.
func TestMiddlewareLogsRedactKeys(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	e, err := idem.NewEngine(failingSettle{Store: mem}, idem.EngineConfig{
		SettleTimeout: 50 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
	}))
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
	r.Header.Set(idem.HeaderName, "very-secret-key-123")
	h.ServeHTTP(httptest.NewRecorder(), r)
	out := logs.String()
	if !strings.Contains(out, "storing the answer failed") || !strings.Contains(out, "key needs review") {
		t.Fatalf("the failed settlement was not logged: %q", out)
	}
	// The key itself is on the one review line only (see idem.KeyDigest);
	// every line names it by its digest.
	digest := idem.KeyDigest(idem.Key{Scope: "global", Operation: "POST /payments", Key: "very-secret-key-123"})
	reviewLines := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		review := strings.Contains(line, `"msg":"idem: key needs review"`)
		if review {
			reviewLines++
		}
		if strings.Contains(line, "very-secret-key-123") != review {
			t.Errorf("the key on a line that is not the review line, or missing from it: %s", line)
		}
		if !strings.Contains(line, `"key_digest":"`+digest+`"`) {
			t.Errorf("a line without the key's digest: %s", line)
		}
	}
	if reviewLines != 1 {
		t.Errorf("%d review lines, want 1:\n%s", reviewLines, out)
	}
}

func TestMiddlewareConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	st := idemmem.MustNew(idemmem.Config{})
	defer st.Close()
	e, _ := idem.NewEngine(st, idem.EngineConfig{})
	var runs atomic.Int32
	srv := httptest.NewServer(idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		time.Sleep(5 * time.Millisecond)
		w.WriteHeader(201)
		io.WriteString(w, "charged once")
	})))
	defer srv.Close()
	const n = 200
	var wg sync.WaitGroup
	codes := make([]int, n)
	bodies := make([]string, n)
	start := make(chan struct{})
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			r, _ := http.NewRequest("POST", srv.URL+"/charge", strings.NewReader(`{"amount":1}`))
			r.Header.Set(idem.HeaderName, "one-key")
			resp, err := client.Do(r)
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			codes[i], bodies[i] = resp.StatusCode, string(b)
		}(i)
	}
	close(start)
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times", runs.Load())
	}
	for i := range codes {
		ok := (codes[i] == 201 && bodies[i] == "charged once") || codes[i] == 409
		if !ok {
			t.Fatalf("answer %d: %d %q", i, codes[i], bodies[i])
		}
	}
}

func TestMiddlewareBufferFlushes(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"application/json", "text/event-stream"} {
		f := newFixture(t, idem.Config{Policy: idem.Policy{BufferFlushes: true}}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ct)
			io.WriteString(w, "part 1;")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part 2")
		})
		first := f.do(call{key: "k"})
		again := f.do(call{key: "k"})
		if first.Body.String() != "part 1;part 2" {
			t.Fatalf("%s: first body %q", ct, first.Body)
		}
		if ct == "text/event-stream" {
			// An event stream streams, and cannot be replayed.
			if !first.Flushed || again.Code != 409 || problemType(t, again) != idem.ProblemNotReplayable {
				t.Fatalf("event stream: flushed=%v, retry %d", first.Flushed, again.Code)
			}
			continue
		}
		if first.Flushed || again.Code != 200 || again.Body.String() != "part 1;part 2" || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("buffered flushes: flushed=%v, retry %d %q", first.Flushed, again.Code, again.Body)
		}
		if f.runs.Load() != 1 {
			t.Fatalf("runs %d", f.runs.Load())
		}
	}
}

// TestMiddlewareFiltersHeadersInAnyCase: headers a handler sets straight
// into the map, in a case net/http would not, are filtered as their
// canonical names are: cookies, credentials, Date and hop-by-hop headers
// (also those named in Connection) are never stored or replayed.
func TestMiddlewareFiltersHeadersInAnyCase(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(_ *fixture, w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["set-cookie"] = []string{"session=secret"}
		h["SET-COOKIE"] = []string{"other=secret"}
		h["authorization"] = []string{"Bearer secret"}
		h["date"] = []string{"Mon, 30 Nov 2026 12:00:00 GMT"}
		h["connection"] = []string{"x-hop"}
		h["x-hop"] = []string{"one connection only"}
		h["x-kept"] = []string{"kept"}
		h["content-type"] = []string{"application/json"}
		w.WriteHeader(201)
		io.WriteString(w, `{"ok":true}`)
	})
	f.do(call{key: "k"})
	rec, err := f.store.Get(context.Background(), idem.Key{Scope: "user:alice", Operation: "POST /payments", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	for name := range rec.Response.Header {
		switch http.CanonicalHeaderKey(name) {
		case "Set-Cookie", "Authorization", "Date", "Connection", "X-Hop":
			t.Errorf("stored header %q = %q", name, rec.Response.Header[name])
		}
	}
	//lint:ignore SA1008 the handler set these names in lower case on purpose
	if rec.Response.Header["x-kept"] == nil || rec.Response.Header["content-type"] == nil {
		t.Errorf("headers to keep were dropped: %v", rec.Response.Header)
	}
	w := f.do(call{key: "k"})
	for name := range w.Header() {
		if c := http.CanonicalHeaderKey(name); c == "Set-Cookie" || c == "Authorization" {
			t.Errorf("replayed header %q", name)
		}
	}
	if w.Body.String() != `{"ok":true}` || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %q", w.Code, w.Body)
	}
}

func TestMiddlewareScopeMissing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{Scope: func(r *http.Request) (string, error) {
		if u := r.Header.Get("X-User"); u != "nobody" {
			return u, nil
		}
		return "", fmt.Errorf("session: %w", idem.ErrScopeMissing)
	}}, idem.EngineConfig{}, paymentHandler)
	w := f.do(call{key: "k", user: "nobody"})
	if w.Code != 401 || problemType(t, w) != idem.ProblemScopeMissing || w.Header().Get("Idempotency-Outcome") != "scope_missing" {
		t.Fatalf("no credentials: %d %s %s", w.Code, w.Header(), w.Body)
	}
	if f.runs.Load() != 0 {
		t.Fatal("the handler ran for a request without credentials")
	}
	if w := f.do(call{key: "k"}); w.Code != 201 {
		t.Fatalf("alice: %d", w.Code)
	}
}

func TestMiddlewareFingerprintKey(t *testing.T) {
	t.Parallel()
	key := []byte("fingerprint secret")
	f := newFixture(t, idem.Config{FingerprintKey: key}, idem.EngineConfig{}, paymentHandler)
	key[0] = 'X' // the middleware keeps its own copy
	if w := f.do(call{key: "k"}); w.Code != 201 {
		t.Fatalf("first: %d", w.Code)
	}
	rec, err := f.store.Get(t.Context(), idemstore.Key{Scope: "user:alice", Operation: "POST /payments", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := idem.Fingerprint(idem.FingerprintInput{Method: "POST", Operation: "POST /payments", Path: "/payments", ContentType: "application/json", Body: []byte(`{"amount":100,"currency":"usd"}`)}, idem.FingerprintOptions{Key: []byte("fingerprint secret")})
	if rec.Fingerprint != want {
		t.Fatalf("stored fingerprint %q, want the keyed %q", rec.Fingerprint, want)
	}
	if w := f.do(call{key: "k"}); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s", w.Code, w.Header())
	}
	if w := f.do(call{key: "k", body: `{"amount":1}`}); w.Code != 422 {
		t.Fatalf("changed body: %d", w.Code)
	}
}
