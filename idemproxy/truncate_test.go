package idemproxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

// TestTruncatedAnswerWithoutServer calls the proxy's handler directly, with
// no http.Server around it (ReverseProxy then does not panic on a body it
// could not copy): an upstream answer shorter than it announced, or a
// chunked one cut off, must never be stored as the key's answer. The key
// goes to review (or is released, by the route's ambiguous policy). When
// nothing of the body had come yet the client gets 502; otherwise the
// handler aborts the response with http.ErrAbortHandler.
func TestTruncatedAnswerWithoutServer(t *testing.T) {
	t.Parallel()
	cut := func(w http.ResponseWriter, body string) {
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
		http.NewResponseController(w).Flush()
		resetConn(w)
	}
	for _, tc := range []struct {
		name      string
		upstream  http.HandlerFunc
		transport http.RoundTripper // instead of a real upstream
		ambiguous idemproxy.Ambiguous
		aborted   bool   // else a 502 upstream-failed
		state     string // of the record after the call
	}{
		{name: "shorter than Content-Length", upstream: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			cut(w, "0123456789")
		}, aborted: true, state: "needs_review"},
		{name: "chunked, cut before any body", upstream: func(w http.ResponseWriter, r *http.Request) {
			cut(w, "")
		}, state: "needs_review"},
		{name: "chunked, cut in the middle", upstream: func(w http.ResponseWriter, r *http.Request) {
			cut(w, "first chunk")
		}, aborted: true, state: "needs_review"},
		{name: "shorter than Content-Length, ambiguous release", upstream: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			cut(w, "0123456789")
		}, ambiguous: idemproxy.AmbiguousRelease, aborted: true, state: "gone"},
		{name: "a transport that does not check the length", transport: shortBody{"0123456789"}, aborted: true, state: "needs_review"},
		{name: "a transport that does not check the length, no body", transport: shortBody{""}, state: "needs_review"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs counter
			cfg := idemproxy.Config{Upstream: "http://upstream.invalid"}
			if tc.upstream != nil {
				cfg.Upstream = upstreamServer(t, runs.wrap(tc.upstream))
			}
			cfg.Ambiguous = tc.ambiguous
			r := newRig(t, cfg, idemproxy.Options{Transport: tc.transport})
			rec, panicked := r.call(t, "/pay", "k")
			switch {
			case tc.aborted && panicked != http.ErrAbortHandler:
				t.Fatalf("the handler answered %d %q (panic %v); want it to abort with http.ErrAbortHandler", rec.Code, rec.Body, panicked)
			case !tc.aborted && panicked != nil:
				t.Fatalf("the handler panicked: %v", panicked)
			case !tc.aborted:
				wantAnswer(t, "cut before any body", rec, http.StatusBadGateway, "upstream_failed", "upstream-failed")
				if rec.Header().Get("X-Upstream") != "" {
					t.Fatalf("the 502 carries the upstream's headers: %v", rec.Header())
				}
			}
			if got := r.state(t, "/pay", "k"); string(got) != tc.state {
				t.Fatalf("record: %s, want %s", got, tc.state)
			}
			settled := map[string]string{"needs_review": "escalated", "gone": "released"}[tc.state]
			if r.metric(t, "upstream_failed", settled) == "" {
				t.Errorf("metrics do not count an upstream_failed answer, %s", settled)
			}
			rec, panicked = r.call(t, "/pay", "k")
			if tc.state == "needs_review" {
				wantAnswer(t, "retry", rec, http.StatusConflict, "needs_review", "needs-review")
				if tc.upstream != nil && runs.n.Load() != 1 {
					t.Fatalf("upstream ran %d times, want 1", runs.n.Load())
				}
			} else if panicked != http.ErrAbortHandler || runs.n.Load() != 2 {
				t.Fatalf("retry of a released key: %d, panic %v, upstream runs %d; want it forwarded again", rec.Code, panicked, runs.n.Load())
			}
		})
	}
}

// shortBody answers every request with 201 and a Content-Length of 100,
// but only body, then a clean end of file: what a RoundTripper that does not
// check lengths could return.
type shortBody struct{ body string }

func (s shortBody) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{
		StatusCode: http.StatusCreated, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Length": {"100"}, "X-Upstream": {"yes"}},
		ContentLength: 100, Body: io.NopCloser(strings.NewReader(s.body)),
	}, nil
}

// TestAnswersWithoutBodyPass: holding the status back until the first byte
// of body does not lose answers that have none.
func TestAnswersWithoutBodyPass(t *testing.T) {
	t.Parallel()
	var runs counter
	up := upstreamServer(t, runs.wrap(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/items/1")
		w.WriteHeader(http.StatusNoContent)
	}))
	r := newRig(t, idemproxy.Config{Upstream: up}, idemproxy.Options{})
	for i, outcome := range []string{"acquired", "replayed"} {
		rec, panicked := r.call(t, "/items", "k")
		if panicked != nil || rec.Code != http.StatusNoContent || rec.Header().Get("Location") != "/items/1" || rec.Header().Get("Idempotency-Outcome") != outcome {
			t.Fatalf("call %d: %d %v (panic %v)", i+1, rec.Code, rec.Header(), panicked)
		}
	}
	if got := r.state(t, "/items", "k"); got != "completed 204" || runs.n.Load() != 1 {
		t.Fatalf("record %s, upstream runs %d", got, runs.n.Load())
	}
}
