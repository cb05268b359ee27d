package idemmem_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// allocatedBy returns the bytes the heap gave out while f ran, and what f
// returned. The tests that call it do not run in parallel, so no other
// test allocates meanwhile.
func allocatedBy(f func() (*idemmem.Store, error)) (uint64, *idemmem.Store, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, s, err
}

// TestNewPresizeBounded: New makes each shard's map for its share of
// MaxRecords, but at most a bounded number of records: a huge MaxRecords,
// no cap, many shards and the zero Config must each succeed and cost a
// bounded amount of memory before any record comes. The configurations
// with the fewest shards come first and the test stops at the first one
// over its bound: a hint left uncapped, or not divided among the shards,
// shows there at a few hundred MiB, before a configuration with many
// shards could ask for gigabytes.
func TestNewPresizeBounded(t *testing.T) {
	const mib = 1 << 20
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  idemmem.Config
		max  uint64
	}{
		{"one shard, a billion records", idemmem.Config{Shards: 1, MaxRecords: 1e9}, 8 * mib},
		{"one shard, MaxInt records", idemmem.Config{Shards: 1, MaxRecords: math.MaxInt, MaxBytes: -1}, 8 * mib},
		{"no cap, one shard", idemmem.Config{Shards: 1, MaxRecords: -1, MaxBytes: -1}, 8 * mib},
		{"no cap, MinInt", idemmem.Config{Shards: 1, MaxRecords: math.MinInt}, 8 * mib},
		{"shards rounded up", idemmem.Config{Shards: 3, MaxRecords: 10}, 8 * mib},
		{"zero Config", idemmem.Config{}, 8 * mib},
		{"no cap", idemmem.Config{MaxRecords: -1}, 8 * mib},
		{"fewer records than shards", idemmem.Config{Shards: 64, MaxRecords: 3}, 8 * mib},
		{"64 shards, a billion records", idemmem.Config{MaxRecords: 1e9}, 32 * mib},
		{"65536 shards, 100000 records", idemmem.Config{Shards: 65536, MaxRecords: 100_000}, 64 * mib},
	} {
		n, s, err := allocatedBy(func() (*idemmem.Store, error) { return idemmem.New(tc.cfg) })
		if err != nil {
			t.Fatalf("%s: New(%+v): %v", tc.name, tc.cfg, err)
		}
		t.Logf("%s: New(%+v) allocated %.1f MiB", tc.name, tc.cfg, float64(n)/mib)
		if n >= tc.max {
			s.Close()
			t.Fatalf("%s: New(%+v) allocated %.1f MiB, want < %d MiB", tc.name, tc.cfg, float64(n)/mib, tc.max/mib)
		}
		// The store works: a record in, found, counted.
		k := key(1)
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "t", Lease: time.Minute}); err != nil || !created {
			t.Fatalf("%s: Reserve: created %v, %v", tc.name, created, err)
		}
		if r, err := s.Get(ctx, k); err != nil || r.Key != k {
			t.Fatalf("%s: Get: %v, %v", tc.name, r, err)
		}
		if s.Len() != 1 {
			t.Fatalf("%s: Len %d, want 1", tc.name, s.Len())
		}
		s.Close()
	}
}

// TestNewPresizeTotalBounded: the cap on each shard's map (4096 records)
// alone does not bound what New allocates in all: with many shards, each
// made for its share of a large MaxRecords, an empty store would cost
// hundreds of MiB (Shards 4096 and MaxRecords 1e9: about 580 MiB; Shards
// 65536 and MaxRecords 1e9: about 9 GiB), where the shard array alone
// takes 16 MiB at 65536 shards. 64 MiB is four times that.
func TestNewPresizeTotalBounded(t *testing.T) {
	const mib = 1 << 20
	for _, cfg := range []idemmem.Config{
		{Shards: 1024, MaxRecords: 1024 * 4096},
		{Shards: 65536, MaxRecords: 65536 * 64},
	} {
		n, s, err := allocatedBy(func() (*idemmem.Store, error) { return idemmem.New(cfg) })
		if err != nil {
			t.Fatalf("New(%+v): %v", cfg, err)
		}
		s.Close()
		if n >= 64*mib {
			t.Fatalf("New(%+v) allocated %.1f MiB before any record, want < 64 MiB", cfg, float64(n)/mib)
		}
	}
}

// TestPresizeFillPastHint: a store whose shards are filled far past the
// records their maps were made for keeps every record, counts them,
// evicts at MaxRecords as before, refills after its records expire, and
// after Close refuses calls and holds nothing.
func TestPresizeFillPastHint(t *testing.T) {
	t.Parallel()
	for _, cfg := range []idemmem.Config{
		{Shards: 1, MaxRecords: 10_000},       // hint 4096, filled past it
		{Shards: 4, MaxRecords: 4 * 5000},     // hint 4096 a shard
		{Shards: 64, MaxRecords: 64 * 10},     // hint 10 a shard
		{Shards: 64, MaxRecords: 30},          // hint 0
		{Shards: 2, MaxRecords: -1},           // no cap, hint 0
		{Shards: 1, MaxRecords: 1e9},          // hint 4096, cap far away
		{Shards: 65536 / 64, MaxRecords: 500}, // hint 0, many shards
	} {
		s, clk := newStore(cfg)
		ctx := context.Background()
		fill := 12_000
		if cfg.MaxRecords > 0 && cfg.MaxRecords < fill {
			fill = cfg.MaxRecords
		}
		// Fill with completed records kept an hour.
		for i := range fill {
			rec, err := reserve(t, s, key(i))
			if err != nil {
				t.Fatalf("%+v: Reserve %d: %v", cfg, i, err)
			}
			complete(t, s, rec, &idemstore.Response{Status: 200, Body: []byte("ok")}, time.Hour)
		}
		if s.Len() != fill {
			t.Fatalf("%+v: Len %d, want %d", cfg, s.Len(), fill)
		}
		for i := range fill {
			r, err := s.Get(ctx, key(i))
			if err != nil || r.Key != key(i) || r.State != idemstore.StateCompleted || string(r.Response.Body) != "ok" {
				t.Fatalf("%+v: Get %d: %v, %v", cfg, i, r, err)
			}
		}
		if _, err := s.Get(ctx, key(fill)); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("%+v: Get of a key never reserved: %v", cfg, err)
		}
		// At the cap, a new key evicts one completed record; it stays
		// pending, and so takes one record's room from the refill.
		refill := fill
		if cfg.MaxRecords > 0 && cfg.MaxRecords == fill {
			refill--
			if _, err := reserve(t, s, key(fill)); err != nil {
				t.Fatalf("%+v: Reserve at the cap: %v", cfg, err)
			}
			if s.Len() != fill {
				t.Fatalf("%+v: Len at the cap %d, want %d", cfg, s.Len(), fill)
			}
		}
		// Past the records' retention, a second fill takes their place.
		clk.set(2 * time.Hour)
		for i := range refill {
			if _, err := reserve(t, s, key(fill+1+i)); err != nil {
				t.Fatalf("%+v: refill %d: %v", cfg, i, err)
			}
		}
		for i := range refill {
			if r, err := s.Get(ctx, key(fill+1+i)); err != nil || r.State != idemstore.StatePending {
				t.Fatalf("%+v: Get after the refill %d: %v, %v", cfg, i, r, err)
			}
		}
		for i := range fill {
			if _, err := s.Get(ctx, key(i)); !errors.Is(err, idemstore.ErrNotFound) {
				t.Fatalf("%+v: Get of an expired record %d after the refill: %v", cfg, i, err)
			}
		}
		if n := s.Len(); n < refill || (cfg.MaxRecords > 0 && n > cfg.MaxRecords) {
			t.Fatalf("%+v: Len after the refill %d, want %d..%d", cfg, n, refill, cfg.MaxRecords)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if s.Len() != 0 {
			t.Fatalf("%+v: Len after Close %d", cfg, s.Len())
		}
		if _, err := s.Get(ctx, key(fill+1)); !errors.Is(err, idemmem.ErrClosed) {
			t.Fatalf("%+v: Get after Close: %v", cfg, err)
		}
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key(0), Lease: time.Minute}); !errors.Is(err, idemmem.ErrClosed) {
			t.Fatalf("%+v: Reserve after Close: %v", cfg, err)
		}
	}
}
