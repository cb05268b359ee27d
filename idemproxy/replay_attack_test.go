package idemproxy_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// replayRig is idem serve's handler behind an http.Server, on a memory
// store, in front of an upstream of the test's own that counts its runs,
// reached over raw TCP connections; events gets every protected request's
// event.
type replayRig struct {
	addr   string
	store  *idemmem.Store
	runs   atomic.Int32
	events chan idem.Event
}

func newReplayRig(t *testing.T, yaml string, ecfg idem.EngineConfig, up http.HandlerFunc) *replayRig {
	t.Helper()
	return newReplayRigWith(t, yaml, ecfg, up, nil)
}

// newReplayRigWith is newReplayRig with the engine's store wrapped by
// wrap, if set.
func newReplayRigWith(t *testing.T, yaml string, ecfg idem.EngineConfig, up http.HandlerFunc, wrap func(idemstore.Store) idemstore.Store) *replayRig {
	t.Helper()
	rr := &replayRig{events: make(chan idem.Event, 64)}
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rr.runs.Add(1)
		io.Copy(io.Discard, r.Body)
		up(w, r)
	}))
	t.Cleanup(us.Close)
	cfg, err := idemproxy.ParseConfig([]byte("upstream: " + us.URL + "\nanonymous: shared\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	rr.store = idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { rr.store.Close() })
	quiet := slog.New(slog.DiscardHandler)
	ecfg.Logger = quiet
	var store idemstore.Store = rr.store
	if wrap != nil {
		store = wrap(store)
	}
	engine, err := idem.NewEngine(store, ecfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := idemproxy.New(engine, cfg, idemproxy.Options{Logger: quiet, OnOutcome: func(ev idem.Event) { rr.events <- ev }})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(p)
	front.Config.ErrorLog = slog.NewLogLogger(quiet.Handler(), slog.LevelError)
	front.Start()
	t.Cleanup(front.Close)
	rr.addr = front.Listener.Addr().String()
	return rr
}

// ask sends a protected POST /pay with key and the headers given on a new
// connection and reads the answer whole.
func (rr *replayRig) ask(t *testing.T, key string, hdr ...string) answer {
	t.Helper()
	conn, br := rr.send(t, key, hdr...)
	defer conn.Close()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	rr.event(t)
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
}

// send writes a protected POST /pay with key and the headers given, as
// raw HTTP/1.1, on a new connection, and returns it unread.
func (rr *replayRig) send(t *testing.T, key string, hdr ...string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", rr.addr)
	if err != nil {
		t.Fatal(err)
	}
	// A guard against a hang, not a synchronisation.
	conn.SetDeadline(time.Now().Add(time.Minute))
	const body = `{"amount":100}`
	var b strings.Builder
	fmt.Fprintf(&b, "POST /pay HTTP/1.1\r\nHost: api.example\r\nIdempotency-Key: %s\r\n", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// event waits for the next protected request's event: its answer was
// written (or its client cut off).
func (rr *replayRig) event(t *testing.T) idem.Event {
	t.Helper()
	select {
	case ev := <-rr.events:
		return ev
	case <-time.After(time.Minute): // a guard against a hang
		t.Fatal("no event")
		return idem.Event{}
	}
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

func zlibbed(b []byte) []byte {
	var buf bytes.Buffer
	zw := zlib.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// codingUpstream answers 201 with plain, coded with coding when the
// request's Accept-Encoding names it (as a server that compresses does),
// with Vary: Accept-Encoding and a strong ETag.
func codingUpstream(coding string, encode func([]byte) []byte, plain []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Vary", "Accept-Encoding")
		w.Header().Set("ETag", `"v1"`)
		body := plain
		if strings.Contains(r.Header.Get("Accept-Encoding"), coding) {
			w.Header().Set("Content-Encoding", coding)
			body = encode(plain)
		}
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	}
}

// A charge first asked for with Accept-Encoding: gzip (or deflate) is
// stored coded; a retry that does not accept the coding gets the answer
// decoded, which it can read, and a retry that accepts it gets it as
// stored. The upstream ran once.
func TestReplayDecodesForARetryThatDoesNotAcceptTheCoding(t *testing.T) {
	t.Parallel()
	plain := []byte(`{"charge":"ch_1","amount":100}`)
	for _, c := range []struct {
		coding string
		encode func([]byte) []byte
	}{{"gzip", gzipped}, {"deflate", zlibbed}} {
		t.Run(c.coding, func(t *testing.T) {
			t.Parallel()
			rr := newReplayRig(t, "", idem.EngineConfig{}, codingUpstream(c.coding, c.encode, plain))
			first := rr.ask(t, "k", "Accept-Encoding", c.coding)
			if first.Status != http.StatusCreated || first.Header.Get("Content-Encoding") != c.coding || first.Body != string(c.encode(plain)) {
				t.Fatalf("first answer %v (Content-Encoding %q)", first, first.Header.Get("Content-Encoding"))
			}
			for _, ae := range [][]string{nil, {"Accept-Encoding", "identity"}, {"Accept-Encoding", c.coding + ";q=0, br"}, {"Accept-Encoding", "*;q=0"}} {
				got := rr.ask(t, "k", ae...)
				if got.Status != http.StatusCreated || got.Body != string(plain) || got.Header.Get("Content-Encoding") != "" ||
					got.Header.Get("Idempotent-Replayed") != "true" || got.Header.Get("Content-Length") != fmt.Sprint(len(plain)) {
					t.Errorf("retry with %q: %v (Content-Encoding %q, Content-Length %q); want the answer decoded",
						ae, got, got.Header.Get("Content-Encoding"), got.Header.Get("Content-Length"))
				}
				if etag := got.Header.Get("ETag"); etag != `W/"v1"` {
					t.Errorf("retry with %q: ETag %q, want the stored one made weak", ae, etag)
				}
			}
			for _, ae := range []string{c.coding, "*", "br;q=1, " + strings.ToUpper(c.coding) + ";q=0.5"} {
				got := rr.ask(t, "k", "Accept-Encoding", ae)
				if got.Status != http.StatusCreated || got.Body != string(c.encode(plain)) || got.Header.Get("Content-Encoding") != c.coding {
					t.Errorf("retry with Accept-Encoding %q: %v; want the answer as stored", ae, got)
				}
			}
			if n := rr.runs.Load(); n != 1 {
				t.Errorf("the upstream ran %d times, want 1", n)
			}
		})
	}
}

// problemOf decodes a problem document.
func problemOf(t *testing.T, a answer) idem.Problem {
	t.Helper()
	var p idem.Problem
	if err := json.Unmarshal([]byte(a.Body), &p); err != nil {
		t.Fatalf("%v: not a problem document: %v", a, err)
	}
	return p
}

// A stored answer coded in a way idem does not decode (br), or that
// decodes to more than max_decoded_replay (a zip bomb), or that does not
// decode, is never sent to a retry that does not accept the coding: it
// gets 406 not-acceptable naming the coding to accept; one that accepts
// it gets the stored answer. Nothing runs again.
func TestReplayOfAnUndecodableAnswerIsNotAcceptable(t *testing.T) {
	t.Parallel()
	bomb := gzipped(make([]byte, 8<<20))
	for _, c := range []struct {
		name, coding string
		body         []byte
		want         string
	}{
		{"br", "br", []byte("not really brotli"), "idem does not decode"},
		{"zip bomb", "gzip", bomb, "decodes to more than the 1048576 bytes"},
		{"corrupt", "gzip", []byte("\x1f\x8b\x08\x00garbage"), "does not decode"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rr := newReplayRig(t, "max_decoded_replay: 1048576\n", idem.EngineConfig{}, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Encoding", c.coding)
				w.WriteHeader(http.StatusCreated)
				w.Write(c.body)
			})
			if first := rr.ask(t, "k", "Accept-Encoding", c.coding); first.Status != http.StatusCreated || first.Body != string(c.body) {
				t.Fatalf("first answer %v", first)
			}
			got := rr.ask(t, "k")
			p := problemOf(t, got)
			if got.Status != http.StatusNotAcceptable || got.Header.Get("Idempotency-Outcome") != idem.SituationNotAcceptable.Name ||
				p.Type != idem.ProblemNotAcceptable || !strings.Contains(p.Detail, c.want) || !strings.Contains(p.Detail, "Accept-Encoding: "+c.coding) {
				t.Errorf("retry without Accept-Encoding: %v; want 406 not-acceptable saying %q and naming Accept-Encoding: %s", got, c.want, c.coding)
			}
			if again := rr.ask(t, "k", "Accept-Encoding", c.coding); again.Status != http.StatusCreated || again.Body != string(c.body) {
				t.Errorf("retry accepting %s: %v; want the stored answer", c.coding, again)
			}
			if n := rr.runs.Load(); n != 1 {
				t.Errorf("the upstream ran %d times, want 1", n)
			}
		})
	}
}

// An answer negotiated on a header other than Accept-Encoding (its Vary
// names Accept-Language) is replayed to a retry that sends the same value,
// and a retry that sends another, or none, gets 406 not-acceptable naming
// the header, never the French answer silently; the key stays completed
// and nothing runs again. Credentials and Origin named by Vary are not
// compared, and
// "Vary: *" replays the answer as stored.
func TestReplayRespectsVary(t *testing.T) {
	t.Parallel()
	rr := newReplayRig(t, "", idem.EngineConfig{}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		switch r.Header.Get("Idempotency-Key") {
		case "star":
			w.Header().Set("Vary", "*")
		case "cred":
			w.Header().Set("Vary", "Cookie, Authorization, Origin")
		default:
			w.Header().Add("Vary", "Accept-Encoding")
			w.Header().Add("Vary", "accept-language,  Accept")
		}
		w.WriteHeader(http.StatusCreated)
		if strings.HasPrefix(r.Header.Get("Accept-Language"), "fr") {
			io.WriteString(w, "paiement accepté")
			return
		}
		io.WriteString(w, "payment accepted")
	})
	if first := rr.ask(t, "k", "Accept-Language", "fr, en;q=0.5", "Accept", "text/plain"); first.Body != "paiement accepté" {
		t.Fatalf("first answer %v", first)
	}
	for _, h := range [][]string{
		{"Accept-Language", "fr,en;q=0.5", "Accept", "text/plain"},
		{"Accept-Language", "fr", "Accept-Language", "en;q=0.5", "Accept", "text/plain", "Accept-Encoding", "gzip"},
	} {
		if got := rr.ask(t, "k", h...); got.Status != http.StatusCreated || got.Body != "paiement accepté" || got.Header.Get("Idem-Request-Vary") != "" {
			t.Errorf("retry with %q: %v (Idem-Request-Vary %q); want the replay", h, got, got.Header.Get("Idem-Request-Vary"))
		}
	}
	for _, c := range []struct {
		hdr  []string
		want string
	}{
		{[]string{"Accept-Language", "en", "Accept", "text/plain"}, "Accept-Language"},
		{[]string{"Accept", "text/plain"}, "Accept-Language"},
		{[]string{"Accept-Language", "fr, en;q=0.5", "Accept", "application/json"}, "Accept"},
	} {
		got := rr.ask(t, "k", c.hdr...)
		p := problemOf(t, got)
		if got.Status != http.StatusNotAcceptable || got.Header.Get("Idempotency-Outcome") != "not_acceptable" ||
			p.Type != idem.ProblemNotAcceptable || !strings.Contains(p.Detail, "its "+c.want+" ") || p.Key != "k" {
			t.Errorf("retry with %q: %v; want 406 not-acceptable naming %s", c.hdr, got, c.want)
		}
	}
	rec, err := getRecord(context.Background(), rr.store, idemproxy.AnonymousScope, "POST /pay", "k")
	if err != nil || stateOf(rec) != "completed 201" {
		t.Errorf("record %v, %v; want it completed", rec, err)
	}

	rr.ask(t, "star", "Accept-Language", "fr")
	if got := rr.ask(t, "star", "Accept-Language", "en"); got.Status != http.StatusCreated || got.Body != "paiement accepté" {
		t.Errorf("Vary: * retry: %v; want the stored answer", got)
	}
	// Authorization scopes the key: only the cookie rotates.
	rr.ask(t, "cred", "Cookie", "session=a", "Authorization", "Bearer tok", "Origin", "https://a.example")
	if got := rr.ask(t, "cred", "Cookie", "session=b", "Authorization", "Bearer tok", "Origin", "https://b.example"); got.Status != http.StatusCreated || got.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry with a rotated cookie: %v; want the replay", got)
	}
	if n := rr.runs.Load(); n != 3 {
		t.Errorf("the upstream ran %d times, want 3 (one per key)", n)
	}
}

// Replays held by clients that do not read count against
// max_replay_memory: once it is full, a further replay gets 503 busy with
// Retry-After, unwritten, and its key is untouched; a client that takes
// its answer, and one cut off by client_write_timeout, give their share
// back, and the next retry is replayed. The answers are larger than what
// the kernel's socket buffers take, so a client that does not read holds
// its replay in the proxy. Reading a large answer from the store holds it
// twice (the store's bytes and the decoded answer) until the first copy is
// dropped, so two held replays and the read of a third take three answers'
// worth: the budget has room for the two held ones and one read.
func TestReplayMemoryIsBounded(t *testing.T) {
	t.Parallel()
	const size = 12 << 20
	big := bytes.Repeat([]byte("r"), size)
	rr := newReplayRig(t, fmt.Sprintf("max_replay_memory: %d\nclient_write_timeout: 15s\n", 3*size+1<<20),
		idem.EngineConfig{MaxResponseBody: size}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusCreated)
			w.Write(big)
		})
	if first := rr.ask(t, "k"); first.Status != http.StatusCreated || len(first.Body) != size {
		t.Fatalf("first answer: %d, %d bytes", first.Status, len(first.Body))
	}
	// Two clients ask and read only the status line and headers.
	var held []*bufio.Reader
	for range 2 {
		conn, br := rr.send(t, "k")
		defer conn.Close()
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("held replay: %v, %v", resp, err)
		}
		held = append(held, bufio.NewReader(resp.Body))
	}
	got := rr.ask(t, "k")
	if got.Status != http.StatusServiceUnavailable || got.Header.Get("Idempotency-Outcome") != "busy" ||
		got.Header.Get("Retry-After") == "" || problemOf(t, got).Type != idem.ProblemBusy {
		t.Fatalf("a third replay while two are held: %d (Idempotency-Outcome %q); want 503 busy with Retry-After", got.Status, got.Header.Get("Idempotency-Outcome"))
	}
	// The first held client reads its answer: its share comes back.
	if n, err := io.Copy(io.Discard, held[0]); err != nil || n != size {
		t.Fatalf("reading the held replay: %d bytes, %v", n, err)
	}
	if ev := rr.event(t); ev.Outcome != "replayed" {
		t.Fatalf("the read replay's event: %q", ev.Outcome)
	}
	if got := rr.ask(t, "k"); got.Status != http.StatusCreated || len(got.Body) != size {
		t.Fatalf("a replay after one was read: %d, %d bytes; want it replayed", got.Status, len(got.Body))
	}
	// The second never reads: client_write_timeout cuts it off, and its
	// share comes back too.
	if ev := rr.event(t); ev.Outcome != "replayed" {
		t.Fatalf("the cut replay's event: %q", ev.Outcome)
	}
	for range 2 {
		conn, br := rr.send(t, "k")
		defer conn.Close()
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("a replay after the slow client was cut off: %v, %v", resp, err)
		}
	}
	if n := rr.runs.Load(); n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}
}

// answerCounter is a store that counts the answer bytes it hands out,
// whole in Reserve's records or read apart (ReadResponse).
type answerCounter struct {
	idemstore.Store
	handedOut atomic.Int64
}

func (s *answerCounter) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	rec, created, err := s.Store.Reserve(ctx, p)
	if rec != nil && rec.Response != nil {
		s.handedOut.Add(int64(len(rec.Response.Body)))
	}
	return rec, created, err
}

func (s *answerCounter) ReadResponse(ctx context.Context, key idemstore.Key, token string) (*idemstore.Response, error) {
	resp, err := idemstore.ReadResponse(ctx, s.Store, key, token)
	if resp != nil {
		s.handedOut.Add(int64(len(resp.Body)))
	}
	return resp, err
}

// A retry that max_replay_memory has no room for gets 503 busy without its
// stored answer ever being read from the store: the proxy reads a large
// answer only once the budget admitted it. Before, each retry read the
// answer whole (the store's reservation returned it) and only then was
// refused, so that 400 retries of a 1 MiB answer held 400 MiB.
func TestReplayRefusedBusyIsNotRead(t *testing.T) {
	t.Parallel()
	const size = 12 << 20
	big := bytes.Repeat([]byte("r"), size)
	counter := &answerCounter{}
	rr := newReplayRigWith(t, fmt.Sprintf("max_replay_memory: %d\n", 2*size+1<<20),
		idem.EngineConfig{MaxResponseBody: size}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusCreated)
			w.Write(big)
		}, func(s idemstore.Store) idemstore.Store { counter.Store = s; return counter })
	if first := rr.ask(t, "k"); first.Status != http.StatusCreated || len(first.Body) != size {
		t.Fatalf("first answer: %d, %d bytes", first.Status, len(first.Body))
	}
	counter.handedOut.Store(0)
	// One client asks and reads only the status line and headers: its
	// replay holds its answer.
	conn, br := rr.send(t, "k")
	defer conn.Close()
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("held replay: %v, %v", resp, err)
	}
	// A second: reading its answer would hold it twice more.
	got := rr.ask(t, "k")
	if got.Status != http.StatusServiceUnavailable || got.Header.Get("Idempotency-Outcome") != "busy" {
		t.Fatalf("a replay the budget has no room for: %d %q; want 503 busy", got.Status, got.Header.Get("Idempotency-Outcome"))
	}
	if n := counter.handedOut.Load(); n != size {
		t.Errorf("the store handed out %d bytes of answers to the held replay and the refused one; want %d, the held one's alone", n, size)
	}
	if n := rr.runs.Load(); n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}
}

// getCounter is answerCounter that also counts the answer bytes Get hands
// out.
type getCounter struct {
	answerCounter
	got atomic.Int64
}

func (s *getCounter) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	rec, err := s.Store.Get(ctx, key)
	if rec != nil && rec.Response != nil {
		s.got.Add(int64(len(rec.Response.Body)))
	}
	return rec, err
}

func (s *getCounter) GetHead(ctx context.Context, key idemstore.Key, inline int) (*idemstore.Record, error) {
	rec, err := idemstore.GetHead(ctx, s.Store, key, inline)
	if rec != nil && rec.Response != nil {
		s.got.Add(int64(len(rec.Response.Body)))
	}
	return rec, err
}

// The lookup of a record stored under an earlier version's operation name
// (legacy_operations) only asks whether there is one: it must not read a
// large stored answer whole, outside max_replay_memory, on every retry of
// the key. The retry then replays it through the budget.
func TestLegacyLookupDoesNotReadTheAnswer(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	big := bytes.Repeat([]byte("r"), size)
	counter := &getCounter{}
	rr := newReplayRigWith(t, "", idem.EngineConfig{}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		w.Write(big)
	}, func(s idemstore.Store) idemstore.Store { counter.Store = s; return counter })
	// A record an earlier version stored under "POST /pay", with a large
	// answer.
	k := idemstore.Key{Scope: idemproxy.AnonymousScope, Operation: "POST /pay", Key: "old"}
	rec, created, err := rr.store.Reserve(t.Context(), idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute})
	if err != nil || !created || rec != nil {
		t.Fatalf("Reserve: %v %v %v", rec, created, err)
	}
	if err := rr.store.Complete(t.Context(), idemstore.CompleteParams{Key: k, Token: "tok", Retention: time.Hour,
		Response: &idemstore.Response{Status: http.StatusCreated, Body: big}}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	// The retry is another request than the one stored (its fingerprint
	// differs): 422 says the lookup found the record and kept its name,
	// rather than running the key again under the new one.
	if got := rr.ask(t, "old"); got.Status != http.StatusUnprocessableEntity {
		t.Errorf("a retry of a key stored under its earlier operation name: %d; want 422 (found, another request)", got.Status)
	}
	if n := counter.got.Load(); n != 0 {
		t.Errorf("looking up the key under its earlier operation name read %d bytes of its answer; want none", n)
	}
}
