package main_test

// End-to-end tests of upstream faults against the built binary: an upstream
// that resets after the request was sent while the store blips, one that
// stalls past --upstream-deadline, and answers cut short. Whatever happens,
// the proxy's own 502/504 is never stored as a key's answer, and an
// operation that may have run is never run again.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testenv"
)

// storeGate is a TCP forwarder to a store server that a test takes down
// (every connection dropped, new ones closed at once) and brings back.
type storeGate struct {
	ln      net.Listener
	target  string
	refused chan struct{} // a connection came while down
	mu      sync.Mutex
	down    bool
	conns   map[net.Conn]struct{}
}

func newStoreGate(t *testing.T, target string) *storeGate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &storeGate{ln: ln, target: target, refused: make(chan struct{}, 1), conns: map[net.Conn]struct{}{}}
	go g.serve()
	t.Cleanup(func() { ln.Close(); g.setDown(true) })
	return g
}

func (g *storeGate) serve() {
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		down := g.down
		g.mu.Unlock()
		if down {
			c.Close()
			select {
			case g.refused <- struct{}{}:
			default:
			}
			continue
		}
		s, err := net.Dial("tcp", g.target)
		if err != nil {
			c.Close()
			continue
		}
		g.mu.Lock()
		g.conns[c], g.conns[s] = struct{}{}, struct{}{}
		g.mu.Unlock()
		go func() { io.Copy(s, c); s.Close(); c.Close() }()
		go func() { io.Copy(c, s); s.Close(); c.Close() }()
	}
}

// setDown takes the store down (dropping every connection) or brings it back.
func (g *storeGate) setDown(down bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = down
	if down {
		for c := range g.conns {
			c.Close()
		}
		clear(g.conns)
	}
}

// faultUpstream is an upstream whose handler is the test's, counting runs.
func faultUpstream(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) *upstream {
	t.Helper()
	u := &upstream{count: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.inc(r.URL.Path)
		h(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// oneShot is a client that never reuses a connection, so that it never
// resends a request (Go's transport resends one that carries an
// Idempotency-Key when a reused connection breaks before any answer).
var oneShot = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// try sends one protected POST and returns the answer, or the error of a
// response the proxy aborted.
func try(t *testing.T, url, key string) (answer, error) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := oneShot.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}, err
}

// hangUp drops the connection under w with a TCP reset.
func hangUp(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
	}
}

// TestResetWhileStoreBlips: the upstream resets the connection after it got
// the request, and the store drops out at that moment. With a short blip
// (over once the proxy has found the store down) its Escalate gets through
// on a later attempt; with an outage
// longer than its settle timeout it gives up and leaves the key pending,
// storing nothing (not even trying to: no Complete reaches the store); once
// the lease expires the retry finds the key in review. In both, the client
// gets 502 upstream-failed, no retry ever replays it, and the upstream ran
// once.
func TestResetWhileStoreBlips(t *testing.T) {
	t.Parallel()
	redisURL := testenv.Getenv(t, "IDEM_TEST_REDIS_URL")
	for _, tc := range []struct {
		name       string
		outage     bool // the store stays down until the client has its answer
		settlement string
	}{
		{"blip", false, "escalated"},
		{"outage past the settle timeout", true, "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u, err := url.Parse(redisURL)
			if err != nil {
				t.Fatal(err)
			}
			gate := newStoreGate(t, u.Host)
			u.Host = gate.ln.Addr().String()
			q := u.Query()
			q.Set("prefix", fmt.Sprintf("e2e-faults-%d", time.Now().UnixNano())) // the server outlives this run
			u.RawQuery = q.Encode()

			up := faultUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				gate.setDown(true)
				hangUp(w)
				if !tc.outage {
					// Back once the proxy found it down after the reset.
					go func() { <-gate.refused; gate.setDown(false) }()
				}
			})
			p := startProxy(t, "--upstream", up.URL, "--store", u.String(), "--admin", "127.0.0.1:0", "--lease", "1s", "--wait", "30s")
			waitReady(t, p)
			base := "http://" + p.addr

			a := do(t, "POST", base+"/charge", "k", `{"amount":1}`)
			want(t, "status", a.status, http.StatusBadGateway)
			want(t, "problem", a.problemType(), "upstream-failed")
			want(t, "Idempotency-Outcome", a.header.Get("Idempotency-Outcome"), "upstream_failed")
			gate.setDown(false)

			metrics := do(t, "GET", "http://"+p.admin+"/metrics", "", "").body
			series := fmt.Sprintf(`idem_proxy_requests_total{outcome="upstream_failed",route="default",settlement=%q} 1`, tc.settlement)
			if !strings.Contains(metrics, series) {
				t.Errorf("metrics lack %s:\n%s", series, grepLines(metrics, "idem_proxy_requests_total"))
			}
			for _, series := range []string{`idem_store_duration_seconds_count{op="complete",result="ok"} 0`, `idem_store_duration_seconds_count{op="complete",result="error"} 0`} {
				if !strings.Contains(metrics, series) {
					t.Errorf("the proxy tried to store an answer:\n%s", grepLines(metrics, `_count{op="complete"`))
				}
			}
			// With --wait, the retry waits out a lease still alive, then
			// finds the key in review.
			for range 2 {
				a = do(t, "POST", base+"/charge", "k", `{"amount":1}`)
				want(t, "retry status", a.status, http.StatusConflict)
				want(t, "retry problem", a.problemType(), "needs-review")
			}
			want(t, "upstream runs", up.runs("/charge"), 1)
		})
	}
}

// TestStalledUpstreamHitsDeadline: an upstream that never finishes its
// answer, before or after sending its headers, is cut off at
// --upstream-deadline: the client gets 504 and the key goes to review,
// instead of the heartbeat keeping the lease (and every retry's 409) alive
// forever.
func TestStalledUpstreamHitsDeadline(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := faultUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/after-headers" {
			w.WriteHeader(http.StatusCreated)
			http.NewResponseController(w).Flush()
		}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // before the upstream closes
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--upstream-deadline", "300ms", "--upstream-idle-timeout", "20s")
	for _, path := range []string{"/before-headers", "/after-headers"} {
		a := do(t, "POST", "http://"+p.addr+path, "k", `{}`)
		want(t, path+": status", a.status, http.StatusGatewayTimeout)
		want(t, path+": problem", a.problemType(), "upstream-timeout")
		want(t, path+": Idempotency-Outcome", a.header.Get("Idempotency-Outcome"), "upstream_timeout")
		a = do(t, "POST", "http://"+p.addr+path, "k", `{}`)
		want(t, path+": retry status", a.status, http.StatusConflict)
		want(t, path+": retry problem", a.problemType(), "needs-review")
		// The proxy gave up on a request it had sent; the upstream, slow
		// as it may be, reads it all the same.
		waitRuns(t, up, path, 1)
		want(t, path+": upstream runs", up.runs(path), 1)
	}
}

// TestTruncatedAnswers: a chunked answer cut before any of its body gets a
// clean 502; one cut in the middle of its body aborts the client's response.
// Either way the key goes to review, or, on a route whose upstream
// deduplicates by the forwarded key (ambiguous: release), is released and
// the retry forwarded again.
func TestTruncatedAnswers(t *testing.T) {
	t.Parallel()
	up := faultUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		if strings.HasSuffix(r.URL.Path, "/mid-body") {
			io.WriteString(w, "first chunk")
		}
		http.NewResponseController(w).Flush()
		hangUp(w)
	})
	p := startProxy(t, "--config", writeConfig(t, fmt.Sprintf(`upstream: %s
store: %s
admin: 127.0.0.1:0
upstream_idle_timeout: 20s
routes:
  - match: POST /dedup/
    ambiguous: release
`, up.URL, sqliteStore(t))))
	base := "http://" + p.addr
	for _, tc := range []struct {
		path    string
		aborted bool
		runs    int // after the retry
	}{
		{"/before-body", false, 1},
		{"/mid-body", true, 1},
		{"/dedup/mid-body", true, 2},
	} {
		a, err := try(t, base+tc.path, "k")
		switch {
		case tc.aborted && err == nil:
			t.Errorf("%s: a cut answer reached the client whole: %d %q", tc.path, a.status, a.body)
		case !tc.aborted && err != nil:
			t.Errorf("%s: %v, want a 502", tc.path, err)
		case !tc.aborted:
			want(t, tc.path+": status", a.status, http.StatusBadGateway)
			want(t, tc.path+": problem", a.problemType(), "upstream-failed")
			want(t, tc.path+": upstream header", a.header.Get("X-Upstream"), "")
		}
		a, err = try(t, base+tc.path, "k")
		if tc.runs == 1 {
			if err != nil || a.status != http.StatusConflict || a.problemType() != "needs-review" {
				t.Errorf("%s: retry: %d %s %v, want 409 needs-review", tc.path, a.status, a.problemType(), err)
			}
		} else if err == nil && a.status == http.StatusConflict {
			t.Errorf("%s: retry of a released key: %d %s, want it forwarded", tc.path, a.status, a.body)
		}
		want(t, tc.path+": upstream runs", up.runs(tc.path), tc.runs)
	}
	metrics := do(t, "GET", "http://"+p.admin+"/metrics", "", "").body
	for _, series := range []string{
		`idem_proxy_requests_total{outcome="upstream_failed",route="default",settlement="escalated"} 2`,
		`idem_proxy_requests_total{outcome="upstream_failed",route="POST /dedup/",settlement="released"} 2`,
	} {
		if !strings.Contains(metrics, series) {
			t.Errorf("metrics lack %s:\n%s", series, grepLines(metrics, "idem_proxy_requests_total"))
		}
	}
}
