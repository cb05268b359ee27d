package idem_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// TestMethodSpellingsNeverRunUnprotected: a protected method spelt in
// another case, or a method that is not a token at all, is refused with
// 400 invalid-method and never reaches the handler: upstreams that
// upper-case the method (Werkzeug, strings.ToUpper) would run "post" as
// POST, unprotected, on every retry. Unicode that upper-cases to ASCII
// ('ſ' is 'S', 'ı' is 'I' to strings.ToUpper) is no token, so refused too.
func TestMethodSpellingsNeverRunUnprotected(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
	for _, tc := range []struct{ method, detail string }{
		{"post", "send POST"}, {"Post", "send POST"}, {"pOST", "send POST"}, {"patch", "send PATCH"}, {"Patch", "send PATCH"},
		{"POſT", "not an HTTP token"}, {"PATCH\x00", "not an HTTP token"}, {"PO ST", "not an HTTP token"}, {"PATCH,", "not an HTTP token"},
	} {
		for range 2 {
			r := f.request(call{key: "k-" + tc.method})
			r.Method = tc.method // httptest.NewRequest refuses what is no token
			w := httptest.NewRecorder()
			f.h.ServeHTTP(w, r)
			if w.Code != http.StatusBadRequest || problemType(t, w) != idem.ProblemInvalidMethod || w.Header().Get("Idempotency-Outcome") != "invalid_method" ||
				!strings.Contains(w.Body.String(), tc.detail) {
				t.Fatalf("method %q: %d %s; want 400 invalid-method saying %q", tc.method, w.Code, w.Body, tc.detail)
			}
		}
	}
	if n := f.runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for refused methods", n)
	}
	// Other methods, in any case, pass through unprotected.
	for _, m := range []string{"get", "GET", "Delete", "PUT", "put"} {
		r := f.request(call{noKey: true})
		r.Method = m
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("method %q: %d %s; want it passed through", m, w.Code, w.Body)
		}
	}
	// POST itself is protected as ever.
	for i, want := range []string{"", "true"} {
		if w := f.do(call{key: "k"}); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != want {
			t.Fatalf("POST %d: %d %v", i, w.Code, w.Header())
		}
	}
}

// TestMethodConfiguredSpellingIsCanonical: a protected method listed in
// another case than upper is compared byte for byte, and the upper-case
// spelling is then the refused one; two spellings of one method, or a
// method that is no token, fail at construction.
func TestMethodConfiguredSpellingIsCanonical(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{Methods: []string{"Charge"}}, idem.EngineConfig{}, paymentHandler)
	for _, tc := range []struct {
		method string
		want   int
	}{{"Charge", http.StatusCreated}, {"CHARGE", http.StatusBadRequest}, {"charge", http.StatusBadRequest}} {
		r := f.request(call{key: "k"})
		r.Method = tc.method
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s: %d %s; want %d", tc.method, w.Code, w.Body, tc.want)
		}
	}
	for _, bad := range [][]string{{"POST", "post"}, {"PO ST"}, {""}, {"POſT"}} {
		if _, err := idem.NewMiddleware(f.e, idem.Config{Scope: idem.GlobalScope, Methods: bad}); err == nil {
			t.Errorf("Methods %q: NewMiddleware accepted it", bad)
		}
	}
}

// TestHeadGoesWithGet: where GET is protected, HEAD is too (servers answer
// HEAD by running the GET handler), as the same operation: a HEAD with a
// key runs once and replays, a GET with the same key gets 422 rather than
// a second run, and a HEAD without a key gets 400. On a ServeMux route
// "GET /x", which ServeMux also routes HEAD to, the operation is the
// route's.
func TestHeadGoesWithGet(t *testing.T) {
	t.Parallel()
	var ops []string
	f := newFixture(t, idem.Config{Methods: []string{http.MethodGet}, OnOutcome: func(ev idem.Event) { ops = append(ops, ev.Operation) }},
		idem.EngineConfig{}, func(_ *fixture, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux := http.NewServeMux()
	mux.Handle("GET /report/{id}", f.h)
	do := func(method, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "/report/7", nil)
		r.Header.Set("X-User", "alice")
		if key != "" {
			r.Header.Set(idem.HeaderName, key)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	for i, want := range []string{"acquired", "replayed"} {
		if w := do(http.MethodHead, "k"); w.Code != http.StatusOK || w.Header().Get("Idempotency-Outcome") != want {
			t.Fatalf("HEAD %d: %d %v", i, w.Code, w.Header())
		}
	}
	if w := do(http.MethodGet, "k"); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("GET with the HEAD's key: %d %s; want 422", w.Code, w.Body)
	}
	if w := do(http.MethodHead, ""); w.Code != http.StatusBadRequest {
		t.Fatalf("HEAD without a key: %d; want 400", w.Code)
	}
	if n := f.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	for _, op := range ops {
		if op != "GET /report/{id}" {
			t.Fatalf("operations %q; want every one GET /report/{id}", ops)
		}
	}
}
