package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// countingStore counts Release calls.
type countingStore struct {
	idemstore.Store
	releases atomic.Int32
}

func (s *countingStore) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	s.releases.Add(1)
	return s.Store.Release(ctx, p)
}

// A bounded memory store: a completed record evicted for room leaves its
// key new again; once only pending records are left, Begin fails with
// ErrFull (no orphan to release: nothing was written) and the middleware
// answers 503 without running the handler.
func TestBoundedMemoryStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := &countingStore{Store: idemmem.MustNew(idemmem.Config{MaxRecords: 2})}
	e, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	done := mustBegin(t, e, req("done"), idem.Acquired)
	if err := done.Lease.Complete(ctx, &idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, e, req("running-1"), idem.Acquired)
	// The completed record makes room for a new key...
	mustBegin(t, e, req("running-2"), idem.Acquired)
	// ...and its key is new again: the at-most-once caveat of a bound.
	res, err := e.Begin(ctx, req("done"))
	if !errors.Is(err, idemstore.ErrFull) || !errors.Is(err, idemstore.ErrUnavailable) || res.Lease != nil {
		t.Fatalf("Begin with only pending records: %+v, %v; want ErrFull", res, err)
	}
	if n := store.releases.Load(); n != 0 {
		t.Fatalf("%d Release calls after ErrFull; nothing was written to release", n)
	}
	mw := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})
	runs := 0
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs++ }))
	r := httptest.NewRequest(http.MethodPost, "/payments", nil)
	r.Header.Set(idem.HeaderName, "new-key")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable || problemType(t, w) != idem.ProblemUnavailable || runs != 0 {
		t.Fatalf("middleware on a full store: %d %s, %d runs", w.Code, w.Body, runs)
	}
	if u := store.Store.(*idemmem.Store).Usage(); u.Evicted != 1 || u.Records != 2 {
		t.Fatalf("usage %+v", u)
	}
	// Once a pending record is settled, the key that was evicted runs again.
	if err := store.Store.Release(ctx, idemstore.ReleaseParams{Key: req("running-1").Key, Token: mustGet(t, store, "running-1").Token}); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, e, req("done"), idem.Acquired)
}

func mustGet(t *testing.T, s idemstore.Store, key string) *idemstore.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), req(key).Key)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
