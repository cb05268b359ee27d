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
