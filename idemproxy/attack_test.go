package idemproxy_test

// Attacks on the proxy's fault handling, as a hostile reviewer would make
// them: clients that leave at the worst moment, odd HTTP/1.1 framing, and
// requests that make the reverse proxy fail before anything is sent. The
// proxy runs behind a real http.Server (ReverseProxy then aborts with
// http.ErrAbortHandler, as in production). Tests skipped with
// "finding N: …" failed against the code when they were written; the
// report that came with them says what and why.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
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
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// attackRig is a proxy on a memory store behind an http.Server, with an
// upstream of the test's, and a channel that gets every protected
// request's event once its key is settled.
type attackRig struct {
	front  *httptest.Server
	store  *idemmem.Store
	runs   atomic.Int32
	events chan idem.Event
}

func newAttackRig(t *testing.T, upstream http.HandlerFunc, cfg idemproxy.Config, ecfg idem.EngineConfig) *attackRig {
	t.Helper()
	r := &attackRig{events: make(chan idem.Event, 64)}
	if cfg.Upstream == "" {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r.runs.Add(1)
			upstream(w, req)
		}))
		t.Cleanup(up.Close)
		cfg.Upstream = up.URL
	}
	r.store = idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { r.store.Close() })
	quiet := slog.New(slog.DiscardHandler)
	ecfg.Logger = quiet
	engine, err := idem.NewEngine(r.store, ecfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Anonymous == "" {
		cfg.Anonymous = idemproxy.AnonymousShared // the tests' clients send no credentials
	}
	p, err := idemproxy.New(engine, cfg, idemproxy.Options{Logger: quiet, OnOutcome: func(ev idem.Event) { r.events <- ev }})
	if err != nil {
		t.Fatal(err)
	}
	r.front = httptest.NewUnstartedServer(p)
	r.front.Config.ErrorLog = slog.NewLogLogger(quiet.Handler(), slog.LevelError)
	r.front.Start()
	t.Cleanup(r.front.Close)
	return r
}

// event waits for the next protected request's event (its key settled).
func (r *attackRig) event(t *testing.T) idem.Event {
	t.Helper()
	select {
	case ev := <-r.events:
		return ev
	case <-time.After(20 * time.Second): // a guard against a hang, not a synchronisation
		t.Fatal("no protected request ended")
		return idem.Event{}
	}
}

// record returns the record of key on "POST path" in the anonymous scope,
// or nil when there is none.
func (r *attackRig) record(t *testing.T, path, key string) *idemstore.Record {
	t.Helper()
	rec, err := getRecord(context.Background(), r.store, idemproxy.AnonymousScope, "POST "+path, key)
	if errors.Is(err, idemstore.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// post sends one protected POST on a connection of its own and returns
// the answer with its body read whole.
func (r *attackRig) post(t *testing.T, path, key, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(http.MethodPost, r.front.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "x" // as the raw requests say: the authority is part of the operation
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the answer: %v", path, err)
	}
	return resp, string(b)
}

// stateOf describes a record for messages: gone, pending, needs_review,
// or completed with its status (and why it is not replayable).
func stateOf(rec *idemstore.Record) string {
	switch {
	case rec == nil:
		return "gone"
	case rec.State == idemstore.StateCompleted && rec.Response != nil && rec.Response.NotReplayable != "":
		return fmt.Sprintf("completed %d (not replayable: %s)", rec.Response.Status, rec.Response.NotReplayable)
	case rec.State == idemstore.StateCompleted && rec.Response != nil:
		return fmt.Sprintf("completed %d", rec.Response.Status)
	}
	return fmt.Sprintf("%s (%s)", rec.State, rec.Reason)
}

// TestAttackClientLeavesStreamedAnswer: the upstream answers 200 and
// streams its body (an event stream, or an answer over the storable
// limit, which the middleware passes through instead of buffering), and
// the client hangs up after the first bytes. The upstream ran and
// answered: the outcome is known. The key must be completed as not
// replayable (a retry gets 409 not-replayable with the original status),
// not parked in needs_review for an operator, and the upstream must run
// once.
func TestAttackClientLeavesStreamedAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sse  bool
		max  int // EngineConfig.MaxResponseBody
	}{
		{name: "event stream", sse: true},
		{name: "answer over MaxResponseBody", max: 1 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clientGone := make(chan struct{})
			var once sync.Once
			chunk := bytes.Repeat([]byte("x"), 32<<10)
			r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
				if tc.sse {
					w.Header().Set("Content-Type", "text/event-stream")
				}
				w.WriteHeader(http.StatusOK)
				rc := http.NewResponseController(w)
				w.Write(chunk)
				rc.Flush()
				<-clientGone
				for range 64 { // 2 MiB more, until the proxy stops reading
					if _, err := w.Write(chunk); err != nil {
						return
					}
					rc.Flush()
				}
			}, idemproxy.Config{}, idem.EngineConfig{MaxResponseBody: tc.max})
			t.Cleanup(func() { once.Do(func() { close(clientGone) }) }) // before the upstream closes

			// The client reads the status line and a byte of body, then resets.
			conn, err := net.Dial("tcp", r.front.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /stream HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := resp.Body.Read(make([]byte, 1)); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("first answer: %d, %v", resp.StatusCode, err)
			}
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
			once.Do(func() { close(clientGone) })

			ev := r.event(t)
			rec := r.record(t, "/stream", "k")
			if rec == nil || rec.State != idemstore.StateCompleted || rec.Response == nil || rec.Response.NotReplayable == "" || rec.Response.Status != http.StatusOK {
				t.Fatalf("after the client left a 200 the upstream was streaming: record %s (settlement %q); want completed 200, not replayable",
					stateOf(rec), ev.Settlement)
			}
			retry, _ := r.post(t, "/stream", "k", "{}", "Content-Type", "application/json")
			if retry.StatusCode != http.StatusConflict || retry.Header.Get("Idempotency-Outcome") != "not_replayable" ||
				retry.Header.Get("Idempotency-Original-Status") != "200" {
				t.Fatalf("retry: %d %v; want 409 not_replayable, original status 200", retry.StatusCode, retry.Header)
			}
			if n := r.runs.Load(); n != 1 {
				t.Fatalf("upstream ran %d times, want 1", n)
			}
		})
	}
}

// TestAttackClientLeavesBeforeTheAnswer: the client hangs up while the
// upstream works; the call is detached from it, so the upstream's answer
// is stored when it comes and the retry replays it, without a second
// run. An answer over the storable limit cannot be stored, but the
// operation happened: the key is completed as not replayable.
func TestAttackClientLeavesBeforeTheAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		size int
	}{
		{name: "an answer that is stored", size: 100},
		{name: "an answer over MaxResponseBody", size: 2 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			arrived, clientGone := make(chan struct{}), make(chan struct{})
			var once sync.Once
			r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
				close(arrived)
				<-clientGone
				w.WriteHeader(http.StatusCreated)
				w.Write(bytes.Repeat([]byte("y"), tc.size))
			}, idemproxy.Config{}, idem.EngineConfig{MaxResponseBody: 1 << 20})
			t.Cleanup(func() { once.Do(func() { close(clientGone) }) }) // before the upstream closes

			conn, err := net.Dial("tcp", r.front.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /work HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}")
			<-arrived // the upstream has the request
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
			once.Do(func() { close(clientGone) })

			ev := r.event(t)
			rec := r.record(t, "/work", "k")
			if rec == nil || rec.State != idemstore.StateCompleted || rec.Response.Status != http.StatusCreated {
				t.Fatalf("the upstream answered 201 after the client left: record %s (settlement %q); want completed 201", stateOf(rec), ev.Settlement)
			}
			retry, body := r.post(t, "/work", "k", "{}")
			r.event(t)
			switch {
			case rec.Response.NotReplayable == "" && (retry.StatusCode != http.StatusCreated || len(body) != tc.size || retry.Header.Get("Idempotent-Replayed") != "true"):
				t.Fatalf("retry: %d, %d bytes, %v; want the stored 201 replayed", retry.StatusCode, len(body), retry.Header)
			case rec.Response.NotReplayable != "" && retry.Header.Get("Idempotency-Outcome") != "not_replayable":
				t.Fatalf("retry: %d %v; want 409 not_replayable", retry.StatusCode, retry.Header)
			}
			if n := r.runs.Load(); n != 1 {
				t.Fatalf("upstream ran %d times, want 1", n)
			}
		})
	}
}

// TestAttackStaleResolverVerdict: the resolver is asked about a key in
// review and takes its time; meanwhile an operator releases the key, the
// client's retry fails once more and the key goes back to review under a
// new attempt. The resolver's late "completed" is about the first attempt
// and must not complete the second, which waits for a person.
func TestAttackStaleResolverVerdict(t *testing.T) {
	t.Parallel()
	asked, answer := make(chan struct{}), make(chan struct{})
	resolver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		close(asked)
		<-answer
		io.WriteString(w, `{"outcome":"completed","status":201,"body":"charged, says the provider"}`)
	}))
	t.Cleanup(resolver.Close)
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	k := idem.Key{Scope: "tenant", Operation: "POST /pay", Key: "k"}
	review := func() {
		t.Helper()
		res, err := engine.Begin(context.Background(), idem.Request{Key: k, Fingerprint: "fp"})
		if err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("Begin: %v %v", res.Outcome, err)
		}
		if err := res.Lease.Escalate(context.Background(), "upstream failed after the request was sent"); err != nil {
			t.Fatal(err)
		}
	}
	review()
	recovered := make(chan error, 1)
	go func() {
		_, err := engine.Recover(context.Background(), idem.RecoverOptions{Resolver: &idemproxy.HTTPResolver{URL: resolver.URL, Logger: slog.New(slog.DiscardHandler)}})
		recovered <- err
	}()
	<-asked
	keys := &idemadmin.Keys{Store: store, Logger: slog.New(slog.DiscardHandler)}
	if _, err := keys.Resolve(context.Background(), idemadmin.KeyID(k), "ops", idemadmin.ResolveRequest{Action: idemadmin.ActionRelease, Attempt: idemadmin.AnyAttempt}); err != nil {
		t.Fatal(err)
	}
	review() // the retry failed again
	close(answer)
	if err := <-recovered; err != nil {
		t.Fatalf("Recover: %v", err)
	}
	rec, err := store.Get(context.Background(), k)
	if err != nil || rec.State != idemstore.StateNeedsReview {
		t.Fatalf("the second attempt after a stale verdict: %s, %v; want needs_review", stateOf(rec), err)
	}
}

// TestAttackEarlyHintsDoNotLeak: the upstream sends 103 Early Hints with
// a Link header, clears it, and answers 201 without it. The first answer
// must be the upstream's final answer, byte for byte what a retry
// replays: the hint's headers belong to the 103 only.
func TestAttackEarlyHintsDoNotLeak(t *testing.T) {
	t.Parallel()
	r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
		h := w.Header()
		h.Set("Link", "</style.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		clear(h)
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1}`)
	}, idemproxy.Config{}, idem.EngineConfig{})
	first, body1 := r.post(t, "/hints", "k", "{}")
	r.event(t)
	replay, body2 := r.post(t, "/hints", "k", "{}")
	r.event(t)
	if first.StatusCode != 201 || replay.StatusCode != 201 || body1 != body2 || replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %q, replay %d %q %v", first.StatusCode, body1, replay.StatusCode, body2, replay.Header)
	}
	if l := first.Header.Get("Link"); l != "" {
		t.Errorf("the first final answer carries the 103's Link %q; the upstream's final answer had none, and the replay has none", l)
	}
	for name := range first.Header {
		switch name {
		case "Date", "Idempotency-Outcome", "Content-Length":
			continue
		}
		if replay.Header.Get(name) != first.Header.Get(name) {
			t.Errorf("header %s: first %q, replay %q", name, first.Header.Get(name), replay.Header.Get(name))
		}
	}
}

// TestAttackTrailersReplay: the upstream answers with a trailer (a
// checksum). The first answer and its replay must be the same: an answer
// is buffered before it is sent, so its trailers go out as headers, in
// both (docs/proxy.md says so).
func TestAttackTrailersReplay(t *testing.T) {
	t.Parallel()
	r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body")
		w.Header().Set("X-Sum", "abc")
	}, idemproxy.Config{}, idem.EngineConfig{})
	var got [2]*http.Response
	for i := range got {
		req, err := http.NewRequest(http.MethodPost, r.front.URL+"/sum", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body) // the trailer comes after the body
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(b) != "body" {
			t.Fatalf("call %d: %d %q", i+1, resp.StatusCode, b)
		}
		got[i] = resp
		r.event(t)
	}
	first, replay := got[0], got[1]
	if first.Header.Get("X-Sum") != "abc" {
		t.Errorf("the first answer's X-Sum header is %q, want the trailer's value as a header", first.Header.Get("X-Sum"))
	}
	if a, b := first.Trailer.Get("X-Sum"), replay.Trailer.Get("X-Sum"); a != b {
		t.Errorf("trailer X-Sum: first %q, replay %q", a, b)
	}
	if a, b := first.Header.Get("X-Sum"), replay.Header.Get("X-Sum"); a != b {
		t.Errorf("header X-Sum: first %q, replay %q", a, b)
	}
}

// TestAttackBodilessPostFraming: a POST without a body reaches the
// upstream as the client sent it, with Content-Length: 0. An upstream
// (or a load balancer before it) that refuses chunked requests without a
// length answers 411, and the proxy would store and replay that 411 for
// a request that, sent directly, succeeds.
func TestAttackBodilessPostFraming(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		saw []string
	)
	r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		saw = append(saw, fmt.Sprintf("Content-Length %d, Transfer-Encoding %q", req.ContentLength, req.TransferEncoding))
		mu.Unlock()
		if req.ContentLength < 0 {
			http.Error(w, "length required", http.StatusLengthRequired)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	}, idemproxy.Config{}, idem.EngineConfig{})
	resp, body := r.post(t, "/ping", "k", "")
	r.event(t)
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("a bodiless POST: %d %q; the upstream saw %v", resp.StatusCode, body, saw)
	}
}

// TestAttackEncodedSlashIsAnotherRequest: /acct/a%2Fb/charge and
// /acct/a/b/charge are different resources to the upstream (it gets the
// path as sent), so they are different operations, whose keys are apart:
// the second runs for its own resource, never gets the other's answer.
func TestAttackEncodedSlashIsAnotherRequest(t *testing.T) {
	t.Parallel()
	r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charged %s", req.URL.EscapedPath())
	}, idemproxy.Config{}, idem.EngineConfig{})
	first, body1 := r.post(t, "/acct/a%2Fb/charge", "k", `{"amount":1}`, "Content-Type", "application/json")
	r.event(t)
	if first.StatusCode != http.StatusCreated || body1 != "charged /acct/a%2Fb/charge" {
		t.Fatalf("first: %d %q", first.StatusCode, body1)
	}
	second, body2 := r.post(t, "/acct/a/b/charge", "k", `{"amount":1}`, "Content-Type", "application/json")
	r.event(t)
	if second.StatusCode != http.StatusCreated || body2 != "charged /acct/a/b/charge" || second.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the same key on another resource: %d %q (Idempotency-Outcome %q); want its own answer",
			second.StatusCode, body2, second.Header.Get("Idempotency-Outcome"))
	}
}

// TestAttackUnsendableUpgradeIsDropped: a client sends Connection:
// Upgrade with an Upgrade value ReverseProxy refuses to forward (a tab in
// it). On a protected request the proxy drops the upgrade before the
// reverse proxy sees it (a protected request never becomes a tunnel), so
// the request goes out as a plain POST, once, without Upgrade or
// Connection, and its answer is stored.
func TestAttackUnsendableUpgradeIsDropped(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
		got.Store(fmt.Sprintf("Upgrade %q, Connection %q", req.Header.Values("Upgrade"), req.Header.Values("Connection")))
		io.WriteString(w, "ran")
	}, idemproxy.Config{}, idem.EngineConfig{})
	resp, body := r.post(t, "/pay", "k", `{}`, "Connection", "Upgrade", "Upgrade", "proto\tcol")
	ev := r.event(t)
	if n := r.runs.Load(); n != 1 || resp.StatusCode != http.StatusOK || body != "ran" {
		t.Fatalf("answer %d %q, upstream runs %d; want the POST forwarded once", resp.StatusCode, body, n)
	}
	if g := got.Load(); g != `Upgrade [], Connection []` {
		t.Errorf("the upstream got %v; want no upgrade", g)
	}
	if rec := r.record(t, "/pay", "k"); rec == nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("record %s (settlement %q); want completed", stateOf(rec), ev.Settlement)
	}
}

// TestAttackClientLeavesMidUpload: a client that hangs up in the middle
// of its request body leaves no record and runs nothing; its retry with
// the whole body runs once and is replayed after.
func TestAttackClientLeavesMidUpload(t *testing.T) {
	t.Parallel()
	r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "got %d bytes", len(b))
	}, idemproxy.Config{}, idem.EngineConfig{})
	body := `{"pad":"` + strings.Repeat("x", 1000) + `"}`
	conn, err := net.Dial("tcp", r.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:100])
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
	if ev := r.event(t); ev.Outcome != idem.SituationBodyUnreadable.Name {
		t.Fatalf("a body cut short: outcome %q, want %q", ev.Outcome, idem.SituationBodyUnreadable.Name)
	}
	if rec := r.record(t, "/upload", "k"); rec != nil || r.runs.Load() != 0 {
		t.Fatalf("after a cut upload: record %s, upstream runs %d; want none", stateOf(rec), r.runs.Load())
	}
	for i, want := range []string{"acquired", "replayed"} {
		resp, got := r.post(t, "/upload", "k", body, "Content-Type", "application/json")
		r.event(t)
		if resp.StatusCode != http.StatusCreated || got != fmt.Sprintf("got %d bytes", len(body)) || resp.Header.Get("Idempotency-Outcome") != want {
			t.Fatalf("retry %d: %d %q %v", i+1, resp.StatusCode, got, resp.Header)
		}
	}
	if n := r.runs.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

// TestAttackRequestFraming: Expect: 100-continue, a chunked request body
// with trailers, and a chunked body over the fingerprint limit. The
// first two are forwarded once, whole, and replayed; the third is
// refused with 413 before anything is stored or sent.
func TestAttackRequestFraming(t *testing.T) {
	t.Parallel()
	r := newAttackRig(t, func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "%s %q", req.URL.Path, b)
	}, idemproxy.Config{Settings: idemproxy.Settings{MaxBody: ptr(int64(64))}}, idem.EngineConfig{})
	raw := func(req string) *http.Response {
		t.Helper()
		conn, err := net.Dial("tcp", r.front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		head, body, expect := req, "", strings.Contains(req, "Expect: 100-continue")
		if expect {
			head, body, _ = strings.Cut(req, "\r\n\r\n")
			head += "\r\n\r\n"
		}
		io.WriteString(conn, head)
		if expect {
			cont, err := http.ReadResponse(br, nil)
			if err != nil || cont.StatusCode != http.StatusContinue {
				t.Fatalf("no 100 Continue: %v %v", cont, err)
			}
			io.WriteString(conn, body)
		}
		resp, err := http.ReadResponse(br, nil)
		for err == nil && resp.StatusCode < 200 { // the upstream's own 100 Continue is passed on too
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return resp
	}
	read := func(resp *http.Response) string { b, _ := io.ReadAll(resp.Body); return string(b) }

	expect := "POST /expect HTTP/1.1\r\nHost: x\r\nIdempotency-Key: e\r\nExpect: 100-continue\r\nContent-Length: 7\r\n\r\n{\"a\":1}"
	chunked := "POST /chunked HTTP/1.1\r\nHost: x\r\nIdempotency-Key: c\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\nX-Sum: 1\r\n\r\n"
	for _, tc := range []struct{ name, req, want string }{
		{"Expect: 100-continue", expect, `/expect "{\"a\":1}"`},
		{"a chunked body with trailers", chunked, `/chunked "{\"a\":1}"`},
	} {
		for i, outcome := range []string{"acquired", "replayed"} {
			resp := raw(tc.req)
			r.event(t)
			if got := read(resp); resp.StatusCode != http.StatusCreated || got != tc.want || resp.Header.Get("Idempotency-Outcome") != outcome {
				t.Fatalf("%s, call %d: %d %q %v", tc.name, i+1, resp.StatusCode, got, resp.Header)
			}
		}
	}
	big := "POST /big HTTP/1.1\r\nHost: x\r\nIdempotency-Key: b\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"40\r\n" + strings.Repeat("x", 64) + "\r\n1\r\nx\r\n0\r\n\r\n"
	if resp := raw(big); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a chunked body over the limit: %d %s", resp.StatusCode, read(resp))
	}
	r.event(t)
	if rec := r.record(t, "/big", "b"); rec != nil {
		t.Fatalf("a 413 left a record: %s", stateOf(rec))
	}
	if n := r.runs.Load(); n != 2 {
		t.Fatalf("upstream ran %d times, want 2", n)
	}
}

func ptr[T any](v T) *T { return &v }
