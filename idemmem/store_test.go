package idemmem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

var base = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// clock is a fake store clock, starting at base.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// set moves the clock to base+d.
func (c *clock) set(d time.Duration) {
	c.mu.Lock()
	c.t = base.Add(d)
	c.mu.Unlock()
}

// newStore returns a store on a fake clock.
func newStore(cfg idemmem.Config) (*idemmem.Store, *clock) {
	c := &clock{t: base}
	cfg.Now = c.Now
	return idemmem.MustNew(cfg), c
}

func reserve(t *testing.T, s *idemmem.Store, k idemstore.Key) (*idemstore.Record, error) {
	t.Helper()
	rec, created, err := s.Reserve(context.Background(), idemstore.ReserveParams{
		Key: k, Fingerprint: "fp", Token: "tok-" + k.Key, Lease: time.Minute,
	})
	if err != nil {
		return nil, err
	}
	if !created || rec != nil {
		t.Fatalf("Reserve(%v): created = %v, record %v; want true, nil", k, created, rec)
	}
	return s.Get(context.Background(), k)
}

func complete(t *testing.T, s *idemmem.Store, rec *idemstore.Record, resp *idemstore.Response, retention time.Duration) {
	t.Helper()
	err := s.Complete(context.Background(), idemstore.CompleteParams{Key: rec.Key, Token: rec.Token, Response: resp, Retention: retention})
	if err != nil {
		t.Fatalf("Complete(%v): %v", rec.Key, err)
	}
}

func key(i int) idemstore.Key { return idemstore.Key{Scope: "s", Operation: "op", Key: fmt.Sprint(i)} }

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []idemmem.Config{{Shards: -1}, {Shards: 1 << 20}, {MaxBytes: 100}} {
		if _, err := idemmem.New(cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
	for _, cfg := range []idemmem.Config{{Shards: 3, MaxRecords: 10}, {MaxRecords: -1, MaxBytes: -1}, {MaxBytes: 1 << 20}} {
		if _, err := idemmem.New(cfg); err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
		}
	}
}

func TestReadersGetCopies(t *testing.T) {
	t.Parallel()
	s, _ := newStore(idemmem.Config{})
	ctx := context.Background()
	rec, err := reserve(t, s, key(1))
	if err != nil {
		t.Fatal(err)
	}
	rec.Token = "mutated" // the caller's copy, not the stored record
	got, err := s.Get(ctx, key(1))
	if err != nil || got.Token != "tok-1" {
		t.Fatalf("Get after mutating Get's record: %v, %v", got, err)
	}
	complete(t, s, got, &idemstore.Response{Status: 200, Header: http.Header{"A": {"1"}}, Body: []byte("body")}, time.Hour)

	for _, read := range []func() *idemstore.Record{
		func() *idemstore.Record { r, _ := s.Get(ctx, key(1)); return r },
		func() *idemstore.Record {
			r, _, _ := s.Reserve(ctx, idemstore.ReserveParams{Key: key(1)})
			return r
		},
		func() *idemstore.Record {
			p, _ := s.List(ctx, idemstore.ListParams{})
			return p.Records[0]
		},
	} {
		r := read()
		r.Response.Body[0] = 'X'
		r.Response.Header["A"][0] = "mutated"
		r.Response.Header.Set("B", "new")
		r.Response.Status = 500
	}
	got, _ = s.Get(ctx, key(1))
	if string(got.Response.Body) != "body" || got.Response.Header.Get("A") != "1" || got.Response.Header.Get("B") != "" || got.Response.Status != 200 {
		t.Fatalf("stored response changed through a returned copy: %+v", got.Response)
	}
}

func TestExpiredRecordsAreEvicted(t *testing.T) {
	t.Parallel()
	s, clk := newStore(idemmem.Config{Shards: 1})
	ctx := context.Background()
	for i := range 10 {
		rec, err := reserve(t, s, key(i))
		if err != nil {
			t.Fatal(err)
		}
		complete(t, s, rec, &idemstore.Response{Status: 200}, time.Duration(i+1)*time.Minute)
	}
	pending, err := reserve(t, s, key(100)) // never evicted
	if err != nil {
		t.Fatal(err)
	}
	if n := s.Len(); n != 11 {
		t.Fatalf("Len = %d, want 11", n)
	}

	// A Reserve at base+5m evicts the five records that expired by then.
	clk.set(5 * time.Minute)

	if _, err := reserve(t, s, key(200)); err != nil {
		t.Fatal(err)
	}
	if n := s.Len(); n != 7 {
		t.Fatalf("Len after a Reserve at +5m = %d, want 7 (5 live completed, 1 pending, 1 new)", n)
	}
	for i := range 10 {
		_, err := s.Get(ctx, key(i))
		if gone := errors.Is(err, idemstore.ErrNotFound); gone != (i < 5) {
			t.Errorf("key %d: Get err = %v, evicted = %v, want %v", i, err, gone, i < 5)
		}
	}

	// An expired record of the reserved key itself counts as absent, even
	// in a shard the sweep has not reached.
	s2, clk2 := newStore(idemmem.Config{})
	rec, _ := reserve(t, s2, key(1))
	complete(t, s2, rec, &idemstore.Response{Status: 200}, time.Minute)
	clk2.set(time.Minute)

	if _, err := reserve(t, s2, key(1)); err != nil {
		t.Fatalf("Reserve of an expired key: %v", err)
	}

	// The pending record outlives everything.
	clk.set(24 * time.Hour)

	if _, err := reserve(t, s, key(300)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, pending.Key)
	if err != nil || got.State != idemstore.StatePending {
		t.Fatalf("pending record after a late Reserve: %v, %v", got, err)
	}
	if n := s.Len(); n != 3 {
		t.Fatalf("Len after a Reserve at +24h = %d, want 3 (the three pending records)", n)
	}
}

func TestCloseWakesWaitersAndRefusesCalls(t *testing.T) {
	t.Parallel()
	s, _ := newStore(idemmem.Config{})
	ctx := context.Background()
	if _, err := reserve(t, s, key(1)); err != nil {
		t.Fatal(err)
	}
	ch, cancel, err := s.Subscribe(ctx, key(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("Close did not wake a waiter")
	}
	if _, err := s.Get(ctx, key(1)); !errors.Is(err, idemmem.ErrClosed) || !errors.Is(err, idemstore.ErrUnavailable) {
		t.Fatalf("Get after Close: %v", err)
	}
	if _, _, err := s.Subscribe(ctx, key(1)); !errors.Is(err, idemmem.ErrClosed) {
		t.Fatalf("Subscribe after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestSubscribeCancel(t *testing.T) {
	t.Parallel()
	s, _ := newStore(idemmem.Config{})
	ctx := context.Background()
	rec, err := reserve(t, s, key(1))
	if err != nil {
		t.Fatal(err)
	}
	ch1, cancel1, _ := s.Subscribe(ctx, key(1))
	ch2, cancel2, _ := s.Subscribe(ctx, key(1))
	defer cancel2()
	cancel1()
	cancel1()
	// Extend changes nothing a waiter cares about.
	if err := s.Extend(ctx, idemstore.ExtendParams{Key: key(1), Token: rec.Token, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch2:
		t.Fatal("Extend woke a waiter")
	default:
	}
	complete(t, s, rec, &idemstore.Response{Status: 200}, time.Hour)
	select {
	case <-ch2:
	default:
		t.Fatal("Complete did not wake the remaining waiter")
	}
	select {
	case <-ch1:
		t.Fatal("a cancelled subscription was woken")
	default:
	}
}

func TestListRejectsBadCursor(t *testing.T) {
	t.Parallel()
	s, _ := newStore(idemmem.Config{})
	if _, err := s.List(context.Background(), idemstore.ListParams{Cursor: "!!not a cursor"}); err == nil {
		t.Fatal("List with a malformed cursor: no error")
	}
}
