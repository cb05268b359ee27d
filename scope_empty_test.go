package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// TestEmptyScopeFailsClosed: a ScopeFunc that returns an empty scope (or
// white space) without an error is a missing scope, answered 401 with the
// handler not run, as the proxy answers a request without credentials;
// observe mode reports it and runs the handler.
func TestEmptyScopeFailsClosed(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	e, err := idem.NewEngine(mem, quiet(idem.EngineConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, scope := range []string{"", " ", "\t\n"} {
		for _, observe := range []bool{false, true} {
			var runs atomic.Int32
			var ev idem.Event
			h := idem.Middleware(e, idem.Config{
				Scope:     func(*http.Request) (string, error) { return scope, nil },
				Policy:    idem.Policy{Observe: observe},
				OnOutcome: func(e idem.Event) { ev = e },
			})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
			r.Header.Set(idem.HeaderName, "k-1")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			switch {
			case observe && (runs.Load() != 1 || ev.Finding != idem.FindingWouldRefuse):
				t.Errorf("scope %q, observe: %d runs, finding %q", scope, runs.Load(), ev.Finding)
			case !observe && (w.Code != http.StatusUnauthorized || runs.Load() != 0 || ev.Outcome != idem.SituationScopeMissing.Name ||
				!strings.Contains(w.Body.String(), idem.SituationScopeMissing.Problem)):
				t.Errorf("scope %q: status %d, %d runs, outcome %q: %s", scope, w.Code, runs.Load(), ev.Outcome, w.Body)
			}
		}
	}
}

// TestDoEmptyScope: Begin, and so Do, refuse a Key without a scope, and run
// nothing; sharing one scope is chosen by naming it.
func TestDoEmptyScope(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	e, err := idem.NewEngine(mem, quiet(idem.EngineConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	job := func(context.Context) (int, error) { runs++; return runs, nil }
	for _, scope := range []string{"", "  "} {
		req := idem.Request{Key: idem.Key{Scope: scope, Operation: "send-invoice", Key: "inv-1"}, Fingerprint: "f"}
		if _, err := idem.Do(t.Context(), e, req, job); !errors.Is(err, idem.ErrScopeMissing) {
			t.Errorf("Do with scope %q: %v, want ErrScopeMissing", scope, err)
		}
		if _, err := e.Begin(t.Context(), req); !errors.Is(err, idem.ErrScopeMissing) {
			t.Errorf("Begin with scope %q: %v, want ErrScopeMissing", scope, err)
		}
	}
	if runs != 0 {
		t.Fatalf("the job ran %d times without a scope", runs)
	}
	// Shared deliberately: two callers naming the same scope share the key.
	shared := idem.Request{Key: idem.Key{Scope: idem.GlobalScopeName, Operation: "send-invoice", Key: "inv-1"}, Fingerprint: "f"}
	a, err1 := idem.Do(t.Context(), e, shared, job)
	b, err2 := idem.Do(t.Context(), e, shared, job)
	if err1 != nil || err2 != nil || a != 1 || b != 1 || runs != 1 {
		t.Fatalf("GlobalScopeName: %d %d (%v %v), %d runs", a, b, err1, err2, runs)
	}
	if s, _ := idem.GlobalScope(nil); s != idem.GlobalScopeName {
		t.Fatalf("GlobalScope gives %q", s)
	}
}
