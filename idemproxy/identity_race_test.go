package idemproxy_test

import (
	"context"
	"log/slog"
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

// pauseLegacyGet is a store that holds the first look-up which finds a
// record under an earlier version's operation name (no " host="), after
// it has found it, until resume is closed.
type pauseLegacyGet struct {
	idemstore.Store
	once           sync.Once
	looked, resume chan struct{}
}

func (s *pauseLegacyGet) Get(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
	rec, err := s.Store.Get(ctx, k)
	if err == nil && !strings.Contains(k.Operation, " host=") {
		s.once.Do(func() {
			close(s.looked)
			<-s.resume
		})
	}
	return rec, err
}

// TestLegacyRecordReleasedMeanwhile: a retry finds its key held under the
// earlier version's name, and keeps that name; the holder then releases
// the key (its upstream answered 503), and a second retry, finding
// nothing under the earlier name, reserves the new one and runs. The
// first must not reserve the earlier name afresh and run too: the key
// would run twice, under two names. It is told to retry, and gets the
// second's answer.
func TestLegacyRecordReleasedMeanwhile(t *testing.T) {
	up := &recordingUpstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	st := &pauseLegacyGet{Store: mem, looked: make(chan struct{}), resume: make(chan struct{})}
	quiet := slog.New(slog.DiscardHandler)
	engine, err := idem.NewEngine(st, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := idemproxy.New(engine, idemproxy.Config{Upstream: srv.URL, Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared}},
		idemproxy.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e := &edgeRig{proxy: p, front: httptest.NewServer(p), up: up}
	t.Cleanup(e.front.Close)

	// The earlier version's request, in flight.
	old := idemstore.Key{Scope: idemproxy.AnonymousScope, Operation: "POST /orders", Key: "k"}
	if _, created, err := mem.Reserve(t.Context(), idemstore.ReserveParams{Key: old, Fingerprint: "earlier", Token: "old", Lease: time.Hour}); err != nil || !created {
		t.Fatalf("reserving the earlier version's key: %v %v", created, err)
	}
	first := make(chan answer, 1)
	go func() { first <- e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`)) }()
	<-st.looked
	if err := mem.Release(t.Context(), idemstore.ReleaseParams{Key: old, Token: "old"}); err != nil {
		t.Fatal(err)
	}
	second := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`))
	close(st.resume)
	a := <-first
	if n := len(up.requests()); n != 1 {
		t.Fatalf("the upstream ran %d times (first retry %v, second %v); want once", n, a, second)
	}
	if second.Body != "ran 1" || a.Status != http.StatusConflict || a.Header.Get("Retry-After") == "" {
		t.Fatalf("first retry %v, second %v; want the second run and the first told to retry", a, second)
	}
	if got := e.one(t, hostPost("HTTP/1.1", "shop-a.example", "k", `{}`)); got.Body != "ran 1" || got.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the first's retry: %v, want the second's answer replayed", got)
	}
	if _, err := mem.Get(t.Context(), old); err == nil {
		t.Errorf("a record is left under the earlier name")
	}
}
