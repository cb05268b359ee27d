package idemproxy_test

// Raw-socket regression tests of idem serve's framing and header handling,
// against an upstream that records what it received: smuggling and desync
// attempts, odd line endings, keys and credentials where they do not
// belong, and request-targets that are not plain paths. Each case says
// what the client gets, what the upstream received, and how many times it
// ran.

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

func TestLockInFraming(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		req      string
		answers  []int  // statuses, in order
		upstream string // what the upstream ran: "METHOD target body" per request, joined by " | "
	}{
		{
			// Go reads the body by Transfer-Encoding and drops the
			// Content-Length; the upstream gets the body idem read, framed
			// anew, and what follows the chunked body is a request of its own,
			// checked by idem like any other (400: it has no key).
			name: "Content-Length and Transfer-Encoding",
			req: "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\r\nContent-Length: 45\r\nTransfer-Encoding: chunked\r\n\r\n" +
				"2\r\n{}\r\n0\r\n\r\nPOST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
			answers:  []int{http.StatusCreated, http.StatusBadRequest},
			upstream: "POST /pay {}",
		},
		{
			name:    "two different Content-Lengths",
			req:     "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: b\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x",
			answers: []int{http.StatusBadRequest},
		},
		{
			name:     "the same Content-Length twice",
			req:      "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: c\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
			answers:  []int{http.StatusCreated},
			upstream: "POST /pay {}",
		},
		{
			name:    "Transfer-Encoding: chunked, identity",
			req:     "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: d\r\nTransfer-Encoding: chunked, identity\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
			answers: []int{http.StatusNotImplemented},
		},
		{
			name:    "Transfer-Encoding: identity, chunked",
			req:     "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: d2\r\nTransfer-Encoding: identity, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
			answers: []int{http.StatusNotImplemented},
		},
		{
			name:    "a chunk size that overflows",
			req:     "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: e\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff2\r\n{}\r\n0\r\n\r\n",
			answers: []int{http.StatusBadRequest},
		},
		{
			name:     "an obs-folded header",
			req:      "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: f\r\nX-Note: a\r\n b\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
			answers:  []int{http.StatusCreated},
			upstream: "POST /pay {} X-Note=a b",
		},
		{
			name:    "an obs-folded key",
			req:     "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: g\r\n h\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
			answers: []int{http.StatusBadRequest},
		},
		{
			name:     "bare LF line endings, pipelined",
			req:      "POST /pay HTTP/1.1\nHost: x\nIdempotency-Key: i\nContent-Length: 2\n\n{}POST /pay HTTP/1.1\nHost: x\nIdempotency-Key: i\nContent-Length: 2\nConnection: close\n\n{}",
			answers:  []int{http.StatusCreated, http.StatusCreated},
			upstream: "POST /pay {}",
		},
		{
			name: "HTTP/1.0 keep-alive, pipelined",
			req: "POST /pay HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nIdempotency-Key: j\r\nContent-Length: 2\r\n\r\n{}" +
				"POST /pay HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nIdempotency-Key: j\r\nContent-Length: 2\r\n\r\n{}" +
				"POST /pay HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
			answers:  []int{http.StatusCreated, http.StatusCreated, http.StatusBadRequest},
			upstream: "POST /pay {}",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEdgeRig(t, idemproxy.Config{})
			got := e.raw(t, tc.req, len(tc.answers)+1)
			var statuses []int
			for _, a := range got {
				statuses = append(statuses, a.Status)
			}
			if len(statuses) != len(tc.answers) || !slices.Equal(statuses, tc.answers) {
				t.Fatalf("answers %v; want statuses %v", got, tc.answers)
			}
			if ran := describe(e.up.requests(), "X-Note"); ran != tc.upstream {
				t.Fatalf("the upstream ran %q; want %q", ran, tc.upstream)
			}
		})
	}
}

// TestLockInKeysAndCredentials: a key or credentials where idem does not
// read them (trailers), two key headers, and control bytes in a key.
func TestLockInKeysAndCredentials(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, idemproxy.Config{Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousReject}})
	chunked := func(key, trailers string) string {
		h := "POST /pay HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice\r\nTransfer-Encoding: chunked\r\nTrailer: Idempotency-Key, Authorization\r\nConnection: close\r\n"
		if key != "" {
			h += "Idempotency-Key: " + key + "\r\n"
		}
		return h + "\r\n2\r\n{}\r\n0\r\n" + trailers + "\r\n"
	}
	for i, tc := range []struct {
		name, req string
		status    int
		outcome   string
	}{
		// The key is the header's; a trailer's key counts for nothing.
		{"a key in the header and another in a trailer", chunked("k", "Idempotency-Key: other\r\n"), http.StatusCreated, "acquired"},
		{"the same, another trailer", chunked("k", "Idempotency-Key: third\r\nAuthorization: Bearer mallory\r\n"), http.StatusCreated, "replayed"},
		{"a key only in a trailer", chunked("", "Idempotency-Key: other\r\n"), http.StatusBadRequest, "missing_key"},
		// Credentials only in a trailer do not scope a key.
		{"credentials only in a trailer", "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\nAuthorization: Bearer alice\r\n\r\n",
			http.StatusUnauthorized, "scope_missing"},
		{"two key headers", post("POST", "/pay", "k", "{}", "Authorization", "Bearer alice", "idempotency-key", "k2"), http.StatusBadRequest, "invalid_key"},
		{"NUL in a key", post("POST", "/pay", "k\x00x", "{}", "Authorization", "Bearer alice"), http.StatusBadRequest, ""},
		{"a control byte in a key", post("POST", "/pay", "k\x01x", "{}", "Authorization", "Bearer alice"), http.StatusBadRequest, ""},
		{"DEL in a key", post("POST", "/pay", "k\x7fx", "{}", "Authorization", "Bearer alice"), http.StatusBadRequest, ""},
	} {
		a := e.raw(t, tc.req, 1)
		if len(a) != 1 || a[0].Status != tc.status || a[0].Header.Get("Idempotency-Outcome") != tc.outcome {
			t.Fatalf("%d, %s: %v; want %d %q", i, tc.name, a, tc.status, tc.outcome)
		}
	}
	got := e.up.requests()
	if len(got) != 1 {
		t.Fatalf("the upstream ran %d times, want once: %+v", len(got), got)
	}
	if s := got[0]; s.Header.Get("Idempotency-Key") != "k" || s.Body != "{}" || s.Header.Get("Authorization") != "Bearer alice" {
		t.Fatalf("the upstream got %+v", s)
	}
}

// TestLockInRequestTargets: an absolute-form target is its path's
// operation at its authority (which the upstream reads as
// X-Forwarded-Host, spelt as the operation names it, whatever the Host
// line says), forwarded to the
// upstream as that path; "*" is no path and
// is refused, as is a scheme followed by no "//" nor "/" ("http:pay"); CONNECT, never protected, reaches the upstream as it would
// without idem, once.
func TestLockInRequestTargets(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, idemproxy.Config{})
	for i, tc := range []struct {
		name, req string
		status    int
		outcome   string
	}{
		{"absolute-form", post("POST", "http://API.example/pay", "k", "{}"), http.StatusCreated, "acquired"},
		{"the same as origin-form", post("POST", "/pay", "k", "{}"), http.StatusCreated, "replayed"},
		{"absolute-form, the default port", post("POST", "https://api.example:443/p%61y", "k", "{}"), http.StatusCreated, "replayed"},
		{"absolute-form, another host", post("POST", "http://evil.example/pay", "k", "{}"), http.StatusCreated, "acquired"},
		{"POST *", post("POST", "*", "k2", "{}"), http.StatusBadRequest, "invalid_path"},
		// Opaque: the upstream would get "pay", keyed as "/" before.
		{"an opaque target", post("POST", "http:pay", "k4", "{}"), http.StatusBadRequest, "invalid_path"},
		{"an opaque target, another scheme", post("POST", "x:%2Fpay", "k4", "{}"), http.StatusBadRequest, "invalid_path"},
		{"PRI *", "PRI * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", http.StatusBadRequest, "invalid_path"},
		{"the HTTP/2 preface (h2c prior knowledge)", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", http.StatusBadRequest, "invalid_path"},
		{"CONNECT", "CONNECT upstream.example:443 HTTP/1.1\r\nHost: upstream.example:443\r\nIdempotency-Key: k3\r\nConnection: close\r\n\r\n", http.StatusCreated, ""},
	} {
		a := e.raw(t, tc.req, 1)
		if len(a) != 1 || a[0].Status != tc.status || a[0].Header.Get("Idempotency-Outcome") != tc.outcome {
			t.Fatalf("%d, %s: %v; want %d %q", i, tc.name, a, tc.status, tc.outcome)
		}
	}
	got := e.up.requests()
	if ran := describe(got, ""); ran != "POST /pay {} | POST /pay {} | CONNECT / " {
		t.Fatalf("the upstream ran %q", ran)
	}
	if h := got[0].Header.Get("X-Forwarded-Host"); h != "api.example" { // as the operation names it
		t.Errorf("X-Forwarded-Host %q", h)
	}
	if h := got[1].Header.Get("X-Forwarded-Host"); h != "evil.example" {
		t.Errorf("X-Forwarded-Host %q", h)
	}
	if st := e.state(t, "CONNECT ", "k3"); st != "gone" {
		t.Errorf("CONNECT left a record: %s", st)
	}
}

// describe lists what the upstream ran: "METHOD target body", with the
// value of header hdr when it has one, joined by " | ".
func describe(reqs []seen, hdr string) string {
	var out []string
	for _, s := range reqs {
		d := s.Method + " " + s.Target + " " + s.Body
		if v := s.Header.Get(hdr); hdr != "" && v != "" {
			d += " " + hdr + "=" + v
		}
		out = append(out, d)
	}
	return strings.Join(out, " | ")
}

// TestKeyIsNeverHopByHop: a protected request's key reaches the upstream
// even when the client's Connection header names it (which makes a header
// hop by hop, and ReverseProxy drop it): a route with ambiguous: release
// relies on the upstream deduplicating by the forwarded key.
func TestKeyIsNeverHopByHop(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, routesConfig(t, "ambiguous: release\n"))
	for _, req := range []string{
		post("POST", "/pay", "k1", `{}`, "Connection", "Idempotency-Key"),
		post("POST", "/pay", "k2", ``, "Connection", "idempotency-key, X-Trace"),
	} {
		if a := e.raw(t, req, 1); len(a) != 1 || a[0].Status != http.StatusCreated {
			t.Fatalf("%q: %v", req, a)
		}
	}
	if got := describe(e.up.requests(), "Idempotency-Key"); got != "POST /pay {} Idempotency-Key=k1 | POST /pay  Idempotency-Key=k2" {
		t.Fatalf("the upstream ran %q", got)
	}
}

// TestBodyMeaningIsNeverHopByHop: a protected request's Content-Type and
// Content-Encoding, which its fingerprint counts, reach the upstream even
// when the client's Connection header names them. Dropped, the upstream
// read the form as a body without a type while the key matched it by its
// type, so a retry without the Connection trick replayed an answer to
// another reading of the body.
func TestBodyMeaningIsNeverHopByHop(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, routesConfig(t, ""))
	req := post("POST", "/pay", "k1", `amount=5`, "Content-Type", "application/x-www-form-urlencoded",
		"Content-Encoding", "identity", "Connection", "Content-Type, content-encoding")
	if a := e.raw(t, req, 1); len(a) != 1 || a[0].Status != http.StatusCreated {
		t.Fatalf("%q: %v", req, a)
	}
	seen := e.up.requests()
	if len(seen) != 1 {
		t.Fatalf("the upstream ran %d requests", len(seen))
	}
	if ct, ce := seen[0].Header.Get("Content-Type"), seen[0].Header.Get("Content-Encoding"); ct != "application/x-www-form-urlencoded" || ce != "identity" {
		t.Fatalf("the upstream got Content-Type %q, Content-Encoding %q", ct, ce)
	}
}

// TestOverrideIsNeverHopByHop: a request protected as the method its
// override header names reaches the upstream with that header even when
// its Connection header names it. ReverseProxy dropped it, so the
// upstream ran a GET under the key of a POST, and the POST itself, sent
// next with that key, was answered with the GET's answer and never ran.
func TestOverrideIsNeverHopByHop(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, routesConfig(t, ""))
	body := `{"amount":1}`
	for _, name := range []string{"X-HTTP-Method-Override", "X_HTTP_METHOD_OVERRIDE"} {
		key := "k-" + name
		req := post("GET", "/pay", key, body, name, "POST", "Connection", name)
		if a := e.raw(t, req, 1); len(a) != 1 || a[0].Status != http.StatusCreated {
			t.Fatalf("%q: %v", req, a)
		}
		seen := e.up.requests()
		last := seen[len(seen)-1]
		if last.Method != http.MethodGet || last.Header.Get(name) != "POST" {
			t.Fatalf("%s: the upstream got %s with headers %v; want GET with %s: POST", name, last.Method, last.Header, name)
		}
	}
}

// TestOverrideToAnUnprotectedMethodIsRefused: a protected POST whose
// override names GET, which its route leaves alone, is refused (400
// invalid_method) and not forwarded: an upstream that honours the override
// ran a GET under the POST's key, and the plain POST sent next with that
// key got the GET's answer and never ran.
func TestOverrideToAnUnprotectedMethodIsRefused(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, routesConfig(t, ""))
	req := post("POST", "/pay", "k1", `{"amount":1}`, "X-HTTP-Method-Override", "GET")
	if a := e.raw(t, req, 1); len(a) != 1 || a[0].Status != http.StatusBadRequest || !strings.Contains(a[0].Body, "invalid-method") {
		t.Fatalf("%q: %v", req, a)
	}
	if n := len(e.up.requests()); n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}
	if a := e.raw(t, post("POST", "/pay", "k1", `{"amount":1}`), 1); len(a) != 1 || a[0].Status != http.StatusCreated || len(e.up.requests()) != 1 {
		t.Fatalf("the plain POST after it: %v, upstream ran %d", a, len(e.up.requests()))
	}
}
