package idem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// TestMiddlewareMismatchSaysRawBytes: a body without a JSON Content-Type is
// compared byte for byte, and the 422 says so; a JSON one is canonical.
func TestMiddlewareMismatchSaysRawBytes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
	send := func(key, ct, body string) *httptest.ResponseRecorder {
		r := f.request(call{key: key, body: body})
		r.Header.Set("Content-Type", ct)
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w
	}
	send("form", "application/x-www-form-urlencoded", `{"a":1,"b":2}`)
	w := send("form", "application/x-www-form-urlencoded", `{"b":2,"a":1}`)
	if w.Code != 422 || !strings.Contains(w.Body.String(), "compared byte for byte") {
		t.Errorf("form body reordered: %d %s", w.Code, w.Body)
	}
	send("json", "application/json", `{"a":1,"b":2}`)
	if w := send("json", "application/json", `{"a":1,"b":3}`); w.Code != 422 || strings.Contains(w.Body.String(), "byte for byte") {
		t.Errorf("JSON body changed: %d %s", w.Code, w.Body)
	}
}

// TestMiddlewareObserve: in observe mode every request runs and gets the
// handler's own answer, keys are still reserved and completed, and the
// event says what enforcement would have done.
func TestMiddlewareObserve(t *testing.T) {
	t.Parallel()
	var events []idem.Event
	var mu sync.Mutex
	release := make(chan struct{})
	f := newFixture(t, idem.Config{
		Policy: idem.Policy{Observe: true, Wait: time.Minute, MaxRequestBody: 64},
		OnOutcome: func(ev idem.Event) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		},
	}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			<-release
		}
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "ran %d bytes", len(b))
	})
	last := func() idem.Event {
		mu.Lock()
		defer mu.Unlock()
		return events[len(events)-1]
	}
	check := func(what string, w *httptest.ResponseRecorder, outcome, finding string) {
		t.Helper()
		if w.Code != http.StatusCreated || !strings.HasPrefix(w.Body.String(), "ran ") {
			t.Errorf("%s: %d %s, want the handler's answer", what, w.Code, w.Body)
		}
		for _, h := range []string{"Idempotency-Outcome", "Idempotent-Replayed"} {
			if v := w.Header().Get(h); v != "" {
				t.Errorf("%s: %s: %s added in observe mode", what, h, v)
			}
		}
		if ev := last(); ev.Outcome != outcome || ev.Finding != finding {
			t.Errorf("%s: outcome %q finding %q, want %q %q", what, ev.Outcome, ev.Finding, outcome, finding)
		}
	}
	check("no key", f.do(call{noKey: true}), "observed", idem.FindingMissingKey)
	check("bad key", f.do(call{keys: []string{"a", "b"}}), "observed", idem.FindingInvalidKey)
	check("first", f.do(call{key: "k"}), "acquired", "")
	check("retry", f.do(call{key: "k"}), "observed", idem.FindingWouldReplay)
	check("other body", f.do(call{key: "k", body: `{"amount":1}`}), "observed", idem.FindingWouldConflict)
	check("no credentials", f.do(call{key: "k", user: "banned"}), "observed", idem.FindingWouldRefuse)
	big := f.do(call{key: "big", body: `{"pad":"` + strings.Repeat("x", 100) + `"}`})
	check("body over the limit", big, "observed", idem.FindingWouldRefuse)
	if !strings.Contains(big.Body.String(), "ran 110 bytes") {
		t.Errorf("a body over the limit reached the handler cut: %s", big.Body)
	}

	done := make(chan *httptest.ResponseRecorder)
	go func() {
		r := f.request(call{key: "slow", path: "/slow"})
		r.Header.Set("X-Block", "1")
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		done <- w
	}()
	for !reserved(t, f, "slow") {
		runtime.Gosched()
	}
	// Forwarded at once, though Policy.Wait is set.
	check("duplicate in flight", f.do(call{key: "slow", path: "/slow"}), "observed", idem.FindingWouldWait)
	close(release)
	check("first slow", <-done, "acquired", "")
	if got := f.runs.Load(); got != 9 {
		t.Errorf("the handler ran %d times, want every one of the 9 requests", got)
	}
	// The retry that would have been replayed left the stored answer alone.
	rec, err := f.e.Get(t.Context(), idem.Key{Scope: "user:alice", Operation: "POST /payments", Key: "k"})
	if err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != "ran 31 bytes" {
		t.Errorf("record of k: %+v %v", rec, err)
	}
}

// reserved reports whether key is pending for alice on POST path.
func reserved(t *testing.T, f *fixture, key string) bool {
	t.Helper()
	rec, err := f.e.Get(t.Context(), idem.Key{Scope: "user:alice", Operation: "POST /slow", Key: key})
	return err == nil && rec.State == idemstore.StatePending
}

func TestFingerprintIncludeFields(t *testing.T) {
	t.Parallel()
	fp := func(body string, include, exclude []string) string {
		t.Helper()
		s, err := idem.Fingerprint(idem.FingerprintInput{Method: "POST", Operation: "POST /p", Path: "/p", ContentType: "application/json", Body: []byte(body)},
			idem.FingerprintOptions{IncludeFields: include, ExcludeFields: exclude})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	inc := []string{"/amount", "/customer/id", "/items/1"}
	base := fp(`{"amount":1,"customer":{"id":"c1","name":"A"},"items":[1,2],"ts":5}`, inc, nil)
	for _, same := range []string{
		`{"ts":6,"amount":1,"customer":{"name":"B","id":"c1"},"items":[9,2]}`,
		`{"amount":1,"customer":{"id":"c1"},"items":[0,2],"note":{"x":1}}`,
	} {
		if got := fp(same, inc, nil); got != base {
			t.Errorf("%s: a change outside the included fields changed the fingerprint", same)
		}
	}
	for _, diff := range []string{
		`{"amount":2,"customer":{"id":"c1"},"items":[1,2]}`,
		`{"amount":1,"customer":{"id":"c2"},"items":[1,2]}`,
		`{"amount":1,"customer":{"id":"c1"},"items":[1,3]}`,
		`{"amount":1,"items":[1,2]}`,
	} {
		if got := fp(diff, inc, nil); got == base {
			t.Errorf("%s: a change inside the included fields kept the fingerprint", diff)
		}
	}
	// A scalar where an included member's parent should be counts: the
	// included member's reader reads it (and fails on it).
	if fp(`{"customer":5}`, []string{"/customer/id"}, nil) == fp(`{"customer":6}`, []string{"/customer/id"}, nil) {
		t.Error("a scalar on the way to an included pointer did not count")
	}
	// Excluded fields still apply under included ones.
	if fp(`{"c":{"id":1,"ts":1}}`, []string{"/c"}, []string{"/c/ts"}) != fp(`{"c":{"id":1,"ts":2}}`, []string{"/c"}, []string{"/c/ts"}) {
		t.Error("an excluded field under an included one counted")
	}
	if _, err := idem.Fingerprint(idem.FingerprintInput{ContentType: "application/json", Body: []byte(`{}`)}, idem.FingerprintOptions{IncludeFields: []string{"amount"}}); err == nil || !strings.Contains(err.Error(), `included field "amount" is not a JSON Pointer`) {
		t.Errorf("a malformed included pointer: %v", err)
	}
	// RFC 6901: "~" escapes only 0 and 1.
	for _, bad := range []string{"/a~2b", "/a~", "/~/x", "/ok/~a"} {
		if _, err := idem.Fingerprint(idem.FingerprintInput{ContentType: "application/json", Body: []byte(`{}`)}, idem.FingerprintOptions{ExcludeFields: []string{bad}}); err == nil || !strings.Contains(err.Error(), `must be followed by 0 or 1`) {
			t.Errorf("pointer %q: %v, want it refused", bad, err)
		}
	}
	// Escaped "~" and "/" name members with those characters.
	if fp(`{"a/b":1,"c~d":1,"e":1}`, nil, []string{"/a~1b", "/c~0d"}) != fp(`{"a/b":2,"c~d":2,"e":1}`, nil, []string{"/a~1b", "/c~0d"}) {
		t.Error(`"~1" and "~0" did not name the members "a/b" and "c~d"`)
	}
}

// TestMiddlewareKeepDropHeaders: the policy chooses which of the handler's
// headers are stored and replayed; the first answer has them all.
func TestMiddlewareKeepDropHeaders(t *testing.T) {
	t.Parallel()
	handler := func(_ *fixture, w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/payments/1")
		h.Set("X-Request-Id", "req-1")
		h.Set("X-Trace", "t")
		w.WriteHeader(http.StatusCreated)
	}
	for _, tt := range []struct {
		name   string
		policy idem.Policy
		kept   []string
		gone   []string
	}{
		{"default", idem.Policy{}, []string{"Content-Type", "Location", "X-Request-Id", "X-Trace"}, nil},
		{"drop", idem.Policy{DropHeaders: []string{"x-request-id", "X-Trace"}}, []string{"Content-Type", "Location"}, []string{"X-Request-Id", "X-Trace"}},
		{"keep", idem.Policy{KeepHeaders: []string{"location"}}, []string{"Content-Type", "Location"}, []string{"X-Request-Id", "X-Trace"}},
	} {
		f := newFixture(t, idem.Config{Policy: tt.policy}, idem.EngineConfig{}, handler)
		first := f.do(call{key: "k"})
		replay := f.do(call{key: "k"})
		if replay.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: no replay: %d", tt.name, replay.Code)
		}
		for _, h := range tt.kept {
			if replay.Header().Get(h) == "" {
				t.Errorf("%s: replay lacks %s", tt.name, h)
			}
		}
		for _, h := range tt.gone {
			if v := replay.Header().Get(h); v != "" {
				t.Errorf("%s: replay has %s: %s", tt.name, h, v)
			}
			if first.Header().Get(h) == "" {
				t.Errorf("%s: the first answer lost %s", tt.name, h)
			}
		}
	}
	for _, bad := range []idem.Policy{{KeepHeaders: []string{"set-cookie"}}, {DropHeaders: []string{"bad name"}}, {IncludeFields: []string{"x"}}} {
		if _, err := idem.NewMiddleware(newFixture(t, idem.Config{}, idem.EngineConfig{}, handler).e, idem.Config{Scope: idem.GlobalScope, Policy: bad}); err == nil {
			t.Errorf("NewMiddleware accepted %+v", bad)
		}
	}
}

func TestMiddlewareProblemBaseURL(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{ProblemBaseURL: "https://api.example.com/errors#"}, idem.EngineConfig{}, paymentHandler)
	w := f.do(call{noKey: true})
	if got := problemType(t, w); got != "https://api.example.com/errors#missing-key" {
		t.Errorf("type %q", got)
	}
	if w.Header().Get("Idempotency-Outcome") != "missing_key" {
		t.Errorf("Idempotency-Outcome %q", w.Header().Get("Idempotency-Outcome"))
	}
	for _, bad := range []string{"/errors#", "errors", "https://"} {
		if _, err := idem.NewMiddleware(f.e, idem.Config{Scope: idem.GlobalScope, ProblemBaseURL: bad}); err == nil {
			t.Errorf("ProblemBaseURL %q accepted", bad)
		}
	}
}
