package idem_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idem-dev/idem"
)

// The middleware's replays negotiate as the proxy's do: a header whose
// name ends with another's is its own (Vary: X-Accept, Accept compares
// both), a first answer's header map is not changed by the digests stored
// with it, keep_headers keeps Content-Encoding and Vary, and an empty coded
// body (a 204) is replayed as it is, with nothing to decode.
func TestMiddlewareReplayNegotiates(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{Policy: idem.Policy{KeepHeaders: []string{"X-Kept"}}}, idem.EngineConfig{},
		func(_ *fixture, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Vary", "X-Accept, Accept")
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusNoContent)
		})
	ask := func(key, accept, xAccept string) *http.Response {
		r := f.request(call{key: key})
		r.Header.Set("Accept", accept)
		r.Header.Set("X-Accept", xAccept)
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w.Result()
	}
	first := ask("k", "a", "x")
	if first.StatusCode != http.StatusNoContent || first.Header.Get("Idem-Request-Vary") != "" {
		t.Fatalf("first answer %d, Idem-Request-Vary %q", first.StatusCode, first.Header.Get("Idem-Request-Vary"))
	}
	if got := ask("k", "a", "x"); got.StatusCode != http.StatusNoContent || got.Header.Get("Content-Encoding") != "gzip" || got.Header.Get("Vary") == "" {
		t.Errorf("same negotiation: %d, Content-Encoding %q, Vary %q; want the 204 as stored", got.StatusCode, got.Header.Get("Content-Encoding"), got.Header.Get("Vary"))
	}
	for _, c := range [][2]string{{"a", "y"}, {"b", "x"}} {
		if got := ask("k", c[0], c[1]); got.StatusCode != http.StatusNotAcceptable || got.Header.Get("Idempotency-Outcome") != idem.SituationNotAcceptable.Name {
			t.Errorf("Accept %q, X-Accept %q: %d; want 406", c[0], c[1], got.StatusCode)
		}
	}
	if n := f.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}

// A Vary header set under a name that is not in canonical form is read as
// Vary, and a handler's own Idem-Request-Vary, in any spelling, is never
// stored: only the digests the middleware takes decide a replay.
func TestMiddlewareReplayVaryAnySpelling(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{},
		func(_ *fixture, w http.ResponseWriter, r *http.Request) {
			w.Header()["vary"] = []string{"Accept"}
			w.Header()["idem-request-vary"] = []string{"Accept=forged"}
			w.WriteHeader(http.StatusCreated)
		})
	spoofOnly := newFixture(t, idem.Config{}, idem.EngineConfig{},
		func(_ *fixture, w http.ResponseWriter, r *http.Request) {
			w.Header()["IDEM-REQUEST-VARY"] = []string{"Accept=forged"}
			w.WriteHeader(http.StatusCreated)
		})
	ask := func(f *fixture, accept string) *http.Response {
		r := f.request(call{key: "k"})
		r.Header.Set("Accept", accept)
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w.Result()
	}
	if got := ask(f, "a"); got.StatusCode != http.StatusCreated {
		t.Fatalf("first answer %d", got.StatusCode)
	}
	if got := ask(f, "a"); got.StatusCode != http.StatusCreated {
		t.Errorf("same Accept: %d, want the 201 replayed", got.StatusCode)
	}
	if got := ask(f, "b"); got.StatusCode != http.StatusNotAcceptable {
		t.Errorf("another Accept: %d, want 406", got.StatusCode)
	}
	for _, accept := range []string{"a", "b"} {
		if got := ask(spoofOnly, accept); got.StatusCode != http.StatusCreated {
			t.Errorf("handler's own Idem-Request-Vary, Accept %q: %d, want 201", accept, got.StatusCode)
		}
		for name := range ask(spoofOnly, accept).Header {
			if http.CanonicalHeaderKey(name) == "Idem-Request-Vary" {
				t.Errorf("the replay carries the handler's %s", name)
			}
		}
	}
}
