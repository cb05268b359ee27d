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
