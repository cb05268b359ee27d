package idemproxy_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// legacyGets is a memory store that counts the reads of records under an
// earlier version's operation name (no " host="), and can fail them, or
// hold them until their context ends.
type legacyGets struct {
	*idemmem.Store
	reads atomic.Int64
	fail  atomic.Bool
	hold  chan struct{} // closed by the first held read, if set
	once  sync.Once
}

func (s *legacyGets) Get(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
	return s.read(ctx, k, func() (*idemstore.Record, error) { return s.Store.Get(ctx, k) })
}

// GetHead is the look-up's read (idemstore.HeadReader), held, failed and
// counted as Get is.
func (s *legacyGets) GetHead(ctx context.Context, k idemstore.Key, inline int) (*idemstore.Record, error) {
	return s.read(ctx, k, func() (*idemstore.Record, error) { return s.Store.GetHead(ctx, k, inline) })
}

// read counts, fails or holds a read of a record under an earlier
// operation name (one without " host="), and passes others to get.
func (s *legacyGets) read(ctx context.Context, k idemstore.Key, get func() (*idemstore.Record, error)) (*idemstore.Record, error) {
	if strings.Contains(k.Operation, " host=") {
		return get()
	}
	s.reads.Add(1)
	if s.fail.Load() {
		return nil, errors.New("connection reset")
	}
	if s.hold != nil {
		s.once.Do(func() { close(s.hold) })
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return get()
}

// legacyRig is an edgeRig over st, whose events go to onOutcome (if set),
// and the operation name of this version of POST /orders at host.
func legacyRig(t *testing.T, st *legacyGets, cfg idemproxy.Config, onOutcome func(idem.Event)) (*edgeRig, func(host string) string) {
	t.Helper()
	e, up := startEdgeRig(t, cfg, st.Store, st, idemproxy.Options{OnOutcome: onOutcome})
	name := func(host string) string {
		return "POST /orders host=" + host + " upstream=" + up
	}
	return e, name
}

func newLegacyGets(t *testing.T) *legacyGets {
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	return &legacyGets{Store: mem}
}

// storeEarlier completes key under the earlier version's operation name
// (POST /orders), as an earlier version's middleware did, with the answer
// 201 "old ran".
func storeEarlier(t *testing.T, st idemstore.Store, key, body string) {
	t.Helper()
	if code := earlier(t, st, key, body, nil, nil); code != http.StatusCreated {
		t.Fatalf("the earlier version answered %d", code)
	}
}

// earlier serves key through an earlier version's middleware, whose
// handler, if hold is set, closes started and waits for hold.
func earlier(t *testing.T, st idemstore.Store, key, body string, started, hold chan struct{}) int {
	engine, err := idem.NewEngine(st, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Error(err)
		return 0
	}
	old := idem.Middleware(engine, idem.Config{
		Scope:     idemproxy.NewScope(idemproxy.ScopeSources{}, nil, idemproxy.AnonymousShared),
		Operation: func(r *http.Request) string { return r.Method + " " + r.URL.EscapedPath() },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold != nil {
			close(started)
			<-hold
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "old ran")
	}))
	req := httptest.NewRequest("POST", "http://shop-a.example/orders", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	old.ServeHTTP(rec, req)
	return rec.Code
}

// TestLegacyLookupOnlyForNewKeys: the look-up of an earlier version's
// record costs a store read only when the proxy reserved a new key. A
// retry whose key the new name holds (replayed, or refused as a mismatch)
// and a request without a valid key read nothing under the earlier name.
func TestLegacyLookupOnlyForNewKeys(t *testing.T) {
	st := newLegacyGets(t)
	e, _ := legacyRig(t, st, idemproxy.Config{}, nil)
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`)); got.Body != "ran 1" {
		t.Fatalf("a new key: %v", got)
	}
	if n := st.reads.Load(); n != 1 {
		t.Fatalf("a new key read the earlier name %d times, want once", n)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`)); got.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a retry: %v, want replayed", got)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{"other":1}`)); got.Status != http.StatusUnprocessableEntity {
		t.Fatalf("another body: %v, want 422", got)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "", `{}`)); got.Status != http.StatusBadRequest {
		t.Fatalf("no key: %v, want 400", got)
	}
	if n := st.reads.Load(); n != 1 {
		t.Errorf("the earlier name was read %d times in all, want once: a key the new name holds needs no look-up", n)
	}
}

// TestLegacyLookupStoreBlip: the store fails the look-up of the earlier
// name after the new key was reserved. The request is not forwarded (a
// retry of a request that ran before the upgrade could run again), it gets
// 503 with Retry-After, and its new key is released, so that the retry
// once the store answers is forwarded, not refused as in flight.
func TestLegacyLookupStoreBlip(t *testing.T) {
	st := newLegacyGets(t)
	e, name := legacyRig(t, st, idemproxy.Config{}, nil)
	st.fail.Store(true)
	got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`))
	if got.Status != http.StatusServiceUnavailable || got.Header.Get("Retry-After") == "" || len(e.up.requests()) != 0 {
		t.Fatalf("the look-up failed: %v, the upstream ran %d times; want 503 with Retry-After, not forwarded", got, len(e.up.requests()))
	}
	if rec, err := st.Store.Get(t.Context(), idemstore.Key{Scope: idemproxy.AnonymousScope, Operation: name("shop-a.example"), Key: "k"}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the new key after the failed look-up: %v %v, want released", rec, err)
	}
	st.fail.Store(false)
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`)); got.Body != "ran 1" {
		t.Fatalf("the retry once the store answers: %v, want forwarded", got)
	}
}

// TestLegacyLookupClientGone: the client hangs up while the earlier name
// is looked up. Nothing is forwarded, and the new key is released, not
// left pending (which would refuse the client's retry as in flight until
// the lease ran out, and send an external operation's key to review).
func TestLegacyLookupClientGone(t *testing.T) {
	st := newLegacyGets(t)
	st.hold = make(chan struct{})
	done := make(chan idem.Event, 1)
	e, name := legacyRig(t, st, idemproxy.Config{}, func(ev idem.Event) { done <- ev })
	conn, err := net.Dial("tcp", e.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(hostPost("HTTP/1.1", "shop-a.example", "k", `{}`))); err != nil {
		t.Fatal(err)
	}
	<-st.hold
	conn.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not end after its client left")
	}
	if n := len(e.up.requests()); n != 0 {
		t.Fatalf("the upstream ran %d times, want none", n)
	}
	if rec, err := st.Store.Get(context.Background(), idemstore.Key{Scope: idemproxy.AnonymousScope, Operation: name("shop-a.example"), Key: "k"}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the new key after its client left: %v %v, want released", rec, err)
	}
}

// TestLegacyConcurrentRetriesAcrossUpgrade: many retries at once of a key
// an earlier version holds, completed or in flight. None reaches the
// upstream; each gets the stored answer or 409; and no record is left
// under the new name, which each held only while it looked.
func TestLegacyConcurrentRetriesAcrossUpgrade(t *testing.T) {
	st := newLegacyGets(t)
	e, name := legacyRig(t, st, idemproxy.Config{}, nil)
	storeEarlier(t, st.Store, "done", `{}`)
	// A request in flight through the earlier version.
	started, hold, inFlight := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(inFlight)
		earlier(t, st.Store, "pending", `{}`, started, hold)
	}()
	<-started
	defer func() { close(hold); <-inFlight }()
	const n = 16
	answers := make(chan answer, 2*n)
	var wg sync.WaitGroup
	for i := range 2 * n {
		key := "done"
		if i%2 == 1 {
			key = "pending"
		}
		wg.Go(func() { answers <- e.one(t, hostPost("HTTP/1.1", "shop-a.example", key, `{}`)) })
	}
	wg.Wait()
	close(answers)
	replayed := 0
	for a := range answers {
		switch {
		case a.Status == http.StatusCreated && a.Body == "old ran" && a.Header.Get("Idempotent-Replayed") == "true":
			replayed++
		case a.Status == http.StatusConflict:
		default:
			t.Errorf("a concurrent retry across the upgrade: %v, want the earlier answer or 409", a)
		}
	}
	if len(e.up.requests()) != 0 {
		t.Fatalf("the upstream ran %d times, want none", len(e.up.requests()))
	}
	if replayed == 0 {
		t.Errorf("no retry of the completed key got its answer")
	}
	for _, k := range []string{"done", "pending"} {
		if rec, err := st.Store.Get(t.Context(), idemstore.Key{Scope: idemproxy.AnonymousScope, Operation: name("shop-a.example"), Key: k}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("key %s under the new name: %v %v, want none", k, rec, err)
		}
	}
}

// TestLegacyReplayIsNotANewKey: a retry answered from an earlier version's
// record reserves no key in the end, so the new-key cap does not count it.
func TestLegacyReplayIsNotANewKey(t *testing.T) {
	st := newLegacyGets(t)
	e, _ := legacyRig(t, st, idemproxy.Config{Settings: idemproxy.Settings{NewKeysPerScope: &idemproxy.NewKeyLimit{Limit: 1}}}, nil)
	storeEarlier(t, st.Store, "done", `{}`)
	for range 3 {
		if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "done", `{}`)); got.Body != "old ran" {
			t.Fatalf("a retry across the upgrade: %v, want the earlier answer", got)
		}
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "new-1", `{}`)); got.Body != "ran 1" {
		t.Fatalf("the scope's first new key after three replays: %v, want forwarded", got)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "new-2", `{}`)); got.Status != http.StatusTooManyRequests {
		t.Fatalf("the scope's second new key: %v, want 429", got)
	}
}

// TestLegacyReplayDuringShutdown: during shutdown the proxy forwards no
// new request, but a retry is still answered from its record, under the
// new name or an earlier version's alike.
func TestLegacyReplayDuringShutdown(t *testing.T) {
	st := newLegacyGets(t)
	e, _ := legacyRig(t, st, idemproxy.Config{}, nil)
	storeEarlier(t, st.Store, "done", `{}`)
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "now", `{}`)); got.Body != "ran 1" {
		t.Fatalf("a new key: %v", got)
	}
	e.proxy.BeginShutdown()
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "now", `{}`)); got.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a retry the new name answers, during shutdown: %v, want replayed", got)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "done", `{}`)); got.Body != "old ran" || got.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a retry an earlier version's record answers, during shutdown: %v, want replayed", got)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "new", `{}`)); got.Status != http.StatusServiceUnavailable {
		t.Errorf("a new key during shutdown: %v, want 503", got)
	}
	if n := len(e.up.requests()); n != 1 {
		t.Errorf("the upstream ran %d times, want once", n)
	}
}
