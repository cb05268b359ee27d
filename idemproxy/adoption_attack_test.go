package idemproxy_test

// Attacks on the adoption features: observe mode, reloads and CORS.

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// observeProxy is a proxy on a memory store whose default route observes,
// recording every event.
type observeProxy struct {
	*testProxy
	mu     sync.Mutex
	events []idem.Event
}

func newObserveProxy(t *testing.T, cfg idemproxy.Config, api http.HandlerFunc) *observeProxy {
	t.Helper()
	op := &observeProxy{testProxy: &testProxy{runs: new(atomic.Int32)}}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op.runs.Add(1)
		api(w, r)
	}))
	t.Cleanup(upstream.Close)
	op.store = idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { op.store.Close() })
	engine, err := idem.NewEngine(op.store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Upstream = upstream.URL
	cfg.Anonymous = idemproxy.AnonymousShared
	if cfg.Mode == "" {
		cfg.Mode = idemproxy.ModeObserve
	}
	op.proxy, err = idemproxy.New(engine, cfg, idemproxy.Options{Logger: slog.New(slog.DiscardHandler), OnOutcome: func(ev idem.Event) {
		op.mu.Lock()
		op.events = append(op.events, ev)
		op.mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(op.proxy)
	t.Cleanup(front.Close)
	op.client = front.Client()
	op.url = front.URL
	return op
}

func (op *observeProxy) last(t *testing.T) idem.Event {
	t.Helper()
	op.mu.Lock()
	defer op.mu.Unlock()
	if len(op.events) == 0 {
		t.Fatal("no event")
	}
	return op.events[len(op.events)-1]
}

// TestObserveReplayRunsAgain: in observe mode a retry of a completed key
// runs the upstream again and gets the upstream's new answer; the stored
// answer stays the first one; a retry while the first is in flight is
// forwarded at once and counted would_wait; no key is left pending.
func TestObserveReplayRunsAgain(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	op := newObserveProxy(t, idemproxy.Config{}, func(w http.ResponseWriter, r *http.Request) {
		run := n.Add(1)
		w.Header().Set("Set-Cookie", fmt.Sprintf("session=%d", run))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d", run)
	})
	_, first := op.send(t, http.MethodPost, "/slow", "k", strings.NewReader("{}"))
	_, retry := op.send(t, http.MethodPost, "/slow", "k", strings.NewReader("{}"))
	if first != "run 1" || retry != "run 2" {
		t.Fatalf("first %q, retry %q: the retry must run the upstream again", first, retry)
	}
	if ev := op.last(t); ev.Finding != idem.FindingWouldReplay {
		t.Errorf("retry's finding %q, want would_replay", ev.Finding)
	}
	rec, err := getRecord(t.Context(), op.store, idemproxy.AnonymousScope, "POST /slow", "k")
	if err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != "run 1" {
		t.Fatalf("record after an observed retry: %+v %v, want the first answer", rec, err)
	}
	if _, ok := rec.Response.Header["Set-Cookie"]; ok {
		t.Errorf("Set-Cookie was stored: %v", rec.Response.Header)
	}
}

// TestObserveInFlightWouldWait: a retry that arrives while the first run
// of its key is still upstream is forwarded at once, answered by the
// upstream, and counted would_wait; the first run's answer is the one
// stored.
func TestObserveInFlightWouldWait(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan struct{}, 2)
	var n atomic.Int32
	op := newObserveProxy(t, idemproxy.Config{Settings: idemproxy.Settings{Wait: ptr(idemproxy.Duration(3600e9))}},
		func(w http.ResponseWriter, r *http.Request) {
			run := n.Add(1)
			arrived <- struct{}{}
			if run == 1 {
				<-release
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "run %d", run)
		})
	done := make(chan string)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, op.url+"/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := op.client.Do(req)
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	<-arrived
	resp, body := op.send(t, http.MethodPost, "/pay", "k", strings.NewReader("{}"))
	ev := op.last(t)
	close(release)
	if first := <-done; first != "run 1" {
		t.Errorf("first: %q", first)
	}
	if resp.StatusCode != http.StatusCreated || body != "run 2" || resp.Header.Get("Idempotency-Outcome") != "" {
		t.Errorf("retry in flight: %d %q %v, want the upstream's own answer", resp.StatusCode, body, resp.Header)
	}
	if ev.Finding != idem.FindingWouldWait {
		t.Errorf("retry in flight: finding %q, want would_wait", ev.Finding)
	}
	rec, err := getRecord(t.Context(), op.store, idemproxy.AnonymousScope, "POST /pay", "k")
	if err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != "run 1" {
		t.Fatalf("record: %+v %v, want the first run's answer", rec, err)
	}
}

// TestObserveShutdownForwards: observe mode forwards every request, also
// one that arrives while the server drains for shutdown: enforcement would
// refuse it with 503 so a retry goes elsewhere, but an observed route
// answers nothing itself.
func TestObserveShutdownForwards(t *testing.T) {
	t.Parallel()
	op := newObserveProxy(t, idemproxy.Config{}, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	})
	op.proxy.BeginShutdown()
	resp, body := op.send(t, http.MethodPost, "/pay", "k", strings.NewReader("{}"))
	if resp.StatusCode != http.StatusCreated || body != "done" || op.runs.Load() != 1 {
		t.Fatalf("observed POST during shutdown: %d %q (upstream runs %d), want the upstream's answer", resp.StatusCode, body, op.runs.Load())
	}
	if v := resp.Header.Get("Idempotency-Outcome"); v != "" {
		t.Errorf("Idempotency-Outcome %q in observe mode", v)
	}
	rec, err := getRecord(t.Context(), op.store, idemproxy.AnonymousScope, "POST /pay", "k")
	if err == nil && rec.State == idemstore.StatePending {
		t.Errorf("the key is left pending: %+v", rec)
	}
}

// TestObserveBodyReadError: a request body that fails mid-way (a
// malformed chunk) is not answered by idem in observe mode: it is
// forwarded as the client sent it, and counted would_refuse.
func TestObserveBodyReadError(t *testing.T) {
	t.Parallel()
	op := newObserveProxy(t, idemproxy.Config{}, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "read %q %v", b, err)
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(op.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A first chunk of 4 bytes, then a chunk size that is not hex.
	io.WriteString(conn, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\nzz\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The upstream call fails on the broken body, as it would without idem
	// (502); idem itself does not refuse it.
	if resp.StatusCode == http.StatusBadRequest || resp.Header.Get("Idempotency-Outcome") == idem.SituationBodyUnreadable.Name {
		t.Errorf("observe mode answered a broken body itself: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if ev := op.last(t); ev.Finding != idem.FindingWouldRefuse {
		t.Errorf("finding %q, want would_refuse", ev.Finding)
	}
}

// TestReloadUnderLoad: reloads that flip a route between observe and
// enforce while requests flow (run with -race): a request in flight
// finishes under the routes it started with, and the next request after a
// reload gets the new mode.
func TestReloadUnderLoad(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	tp := newTestProxyConfig(t, idemproxy.Config{Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared, Mode: idemproxy.ModeObserve}},
		func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				arrived <- struct{}{}
				<-release
			}
			w.WriteHeader(http.StatusCreated)
		})
	cfg := func(m idemproxy.Mode) idemproxy.Config {
		return idemproxy.Config{Upstream: "http://unused.invalid", Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared, Mode: m},
			Routes: []idemproxy.Route{{Match: idemproxy.Pattern{Pattern: "POST /slow"}}}}
	}
	post := func(path, key string) int {
		req, _ := http.NewRequest(http.MethodPost, tp.url+path, strings.NewReader("{}"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := tp.client.Do(req)
		if err != nil {
			return -1
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// A keyless request in flight under observe.
	slow := make(chan int)
	go func() { slow <- post("/slow", "") }()
	<-arrived
	if err := tp.proxy.Reload(cfg(idemproxy.ModeEnforce)); err != nil {
		t.Fatal(err)
	}
	if got := post("/pay", ""); got != http.StatusBadRequest {
		t.Errorf("keyless POST after the switch to enforce: %d, want 400", got)
	}
	close(release)
	if got := <-slow; got != http.StatusCreated {
		t.Errorf("keyless POST in flight across the reload: %d, want the observe answer 201", got)
	}

	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if got := post("/pay", ""); got != http.StatusCreated && got != http.StatusBadRequest {
					t.Errorf("keyless POST during reloads: %d", got)
					return
				}
			}
		})
	}
	var rw sync.WaitGroup
	for g := range 2 {
		rw.Go(func() {
			for i := range 50 {
				m := idemproxy.ModeObserve
				if (i+g)%2 == 0 {
					m = idemproxy.ModeEnforce
				}
				if err := tp.proxy.Reload(cfg(m)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	rw.Wait()
	close(stop)
	wg.Wait()
	if err := tp.proxy.Reload(cfg(idemproxy.ModeObserve)); err != nil {
		t.Fatal(err)
	}
	if got := post("/pay", ""); got != http.StatusCreated {
		t.Errorf("keyless POST after the last reload to observe: %d", got)
	}
	bad := cfg(idemproxy.ModeEnforce)
	bad.Routes = append(bad.Routes, bad.Routes[0])
	if err := tp.proxy.Reload(bad); err == nil {
		t.Error("a reload with conflicting routes was accepted")
	}
	if got := post("/pay", ""); got != http.StatusCreated {
		t.Errorf("after a refused reload: %d, want the running observe routes", got)
	}
}

// TestCORSReplayOtherOrigin: the upstream allowed origin A on its first
// answer; a replay asked from allowed origin B carries B's
// Access-Control-Allow-Origin, once, and Vary: Origin once; a replay asked
// from an origin idem does not allow gets no CORS header of idem's.
func TestCORSReplayOtherOrigin(t *testing.T) {
	t.Parallel()
	const a, b = "https://a.example.com", "https://b.example.com"
	tp := newTestProxyConfig(t, idemproxy.Config{CORSOrigins: []string{a, b}, Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared}},
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
			w.Header().Set("Access-Control-Allow-Credentials", "true")
			w.Header().Set("Vary", "Origin")
			w.WriteHeader(http.StatusCreated)
		})
	send := func(origin string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, tp.url+"/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k")
		req.Header.Set("Origin", origin)
		resp, err := tp.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	first := send(a)
	if got := first.Header.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != a {
		t.Fatalf("first answer: %v", first.Header)
	}
	replay := send(b)
	if replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("not a replay: %v", replay.Header)
	}
	if got := replay.Header.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != b {
		t.Errorf("replay to %s: Access-Control-Allow-Origin %v", b, got)
	}
	vary := strings.Join(replay.Header.Values("Vary"), ",")
	if strings.Count(strings.ToLower(vary), "origin") != 1 {
		t.Errorf("replay: Vary %q", vary)
	}
}
