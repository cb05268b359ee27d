package idemproxy_test

import (
	"bufio"
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
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// seen is one request as the upstream received it.
type seen struct {
	Method, Target  string // the request line's method and request-target
	Header, Trailer http.Header
	Body            string
}

// recordingUpstream answers every request 201 "ran N" and records what it
// received: how many times it ran, and with what.
type recordingUpstream struct {
	mu   sync.Mutex
	seen []seen
}

func (u *recordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.seen = append(u.seen, seen{Method: r.Method, Target: r.RequestURI, Header: r.Header.Clone(), Trailer: r.Trailer.Clone(), Body: string(b)})
	n := len(u.seen)
	u.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "ran %d", n)
}

// requests returns what the upstream received, in order.
func (u *recordingUpstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.seen...)
}

// edgeRig is idem serve's handler behind an http.Server, on a memory store,
// in front of a recordingUpstream, reached over raw TCP connections.
type edgeRig struct {
	proxy *idemproxy.Proxy
	front *httptest.Server
	store *idemmem.Store
	up    *recordingUpstream
}

// newEdgeRig starts the rig with cfg (its upstream set here); requests
// without credentials share one scope unless cfg says otherwise.
func newEdgeRig(t *testing.T, cfg idemproxy.Config) *edgeRig {
	t.Helper()
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	e, _ := startEdgeRig(t, cfg, mem, mem, idemproxy.Options{})
	return e
}

// startEdgeRig is newEdgeRig with the engine on st, a store over mem (the
// rig's store), and the proxy given opts (its logger set here). It also
// returns the upstream's address.
func startEdgeRig(t *testing.T, cfg idemproxy.Config, mem *idemmem.Store, st idemstore.Store, opts idemproxy.Options) (*edgeRig, string) {
	t.Helper()
	e := &edgeRig{up: &recordingUpstream{}, store: mem}
	up := httptest.NewServer(e.up)
	t.Cleanup(up.Close)
	cfg.Upstream = up.URL
	if cfg.Anonymous == "" {
		cfg.Anonymous = idemproxy.AnonymousShared
	}
	quiet := slog.New(slog.DiscardHandler)
	engine, err := idem.NewEngine(st, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	opts.Logger = quiet
	p, err := idemproxy.New(engine, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	e.proxy = p
	e.front = httptest.NewUnstartedServer(p)
	e.front.Config.ErrorLog = slog.NewLogLogger(quiet.Handler(), slog.LevelError)
	e.front.Start()
	t.Cleanup(e.front.Close)
	return e, strings.TrimPrefix(up.URL, "http://")
}

// answer is one response read off a raw connection, its body read whole.
type answer struct {
	Status int
	Header http.Header
	Body   string
}

func (a answer) String() string {
	return fmt.Sprintf("%d (Idempotency-Outcome %q) %q", a.Status, a.Header.Get("Idempotency-Outcome"), a.Body)
}

// raw writes req, as it is, on a new connection to the proxy, and reads
// want answers off it (fewer if the proxy closes the connection first).
func (e *edgeRig) raw(t *testing.T, req string, want int) []answer {
	t.Helper()
	conn, err := net.Dial("tcp", e.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A guard against a hang, not a synchronisation.
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	var out []answer
	for len(out) < want {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return out
			}
			t.Fatalf("reading answer %d: %v", len(out)+1, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out = append(out, answer{Status: resp.StatusCode, Header: resp.Header, Body: string(b)})
	}
	return out
}

// state returns the state of the record of (operation, key) in the
// anonymous scope: "gone", a state, or "completed STATUS".
func (e *edgeRig) state(t *testing.T, operation, key string) string {
	t.Helper()
	rec, err := getRecord(context.Background(), e.store, idemproxy.AnonymousScope, operation, key)
	if errors.Is(err, idemstore.ErrNotFound) {
		return "gone"
	}
	if err != nil {
		t.Fatal(err)
	}
	return stateOf(rec)
}

// post is a raw POST with a key and a JSON body, closing the connection.
func post(method, target, key, body string, hdr ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: api.example\r\n", method, target)
	if key != "" {
		fmt.Fprintf(&b, "Idempotency-Key: %s\r\n", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	return b.String()
}
