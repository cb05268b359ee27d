// Package storebench runs the store benchmarks of the SQL drivers the same
// way: reserve+complete pairs on fresh keys from a number of goroutines,
// reported as pairs/s, the p50 and p99 of one pair, and, when the store
// batches, how many calls each transaction carried.
package storebench

import (
	"context"
	"crypto/rand"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Response is the small JSON answer every pair stores.
var Response = &idemstore.Response{Status: 201, Body: []byte(`{"id":"ord_123","status":"paid"}`)}

// Pair is one reserve+complete on a fresh key k, with token tok.
type Pair func(ctx context.Context, k idemstore.Key, tok string) error

// StorePair is the pair made through s: Reserve (which must create) then
// Complete.
func StorePair(s idemstore.Store) Pair {
	return func(ctx context.Context, k idemstore.Key, tok string) error {
		_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: 30 * time.Second})
		if err == nil && !created {
			err = errNotCreated
		}
		if err != nil {
			return err
		}
		return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: Response, Retention: 24 * time.Hour})
	}
}

type benchError string

func (e benchError) Error() string { return string(e) }

const errNotCreated = benchError("storebench: a fresh key was not created")

// Run runs b.N pairs on workers goroutines, each on a fresh random key (as
// clients send them), and reports pairs/s and the p50 and p99 of a pair in
// microseconds. When batcher is not nil it also reports calls/batch: the
// mean number of calls per transaction, lone calls counting as batches of
// one (the Batcher's Stats over the run).
func Run(b *testing.B, workers int, batcher *groupcommit.Batcher, pair Pair) {
	ctx := b.Context()
	lat := make([]time.Duration, b.N)
	var (
		next   atomic.Int64
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
	)
	var before idemstore.BatchStats
	if batcher != nil {
		before = batcher.Stats()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				k := idemstore.Key{Scope: "bench", Operation: "POST /orders", Key: rand.Text()}
				start := time.Now()
				if err := pair(ctx, k, "tok-"+k.Key); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				lat[i] = time.Since(start)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
	if batcher != nil {
		st := batcher.Stats()
		alone := st.Alone - before.Alone
		calls := st.Batched - before.Batched + alone
		if txs := st.Batches - before.Batches + alone; txs > 0 {
			b.ReportMetric(float64(calls)/float64(txs), "calls/batch")
		}
	}
}
