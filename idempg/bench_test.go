package idempg_test

import (
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// benchWorkers are the numbers of concurrent callers: one (a lone
// request, which batching must not slow down), and 16 and 32 (bench/run.sh
// runs pgbench at the same client counts).
var benchWorkers = []int{1, 16, 32}

// BenchmarkReserveComplete measures the store's hot path: reserve a fresh
// key, then complete it with a small answer, from 1, 16 and 32 goroutines
// at once, with group commit on (the default) and off. One op is one
// Reserve+Complete pair; the pairs/s metric is what bench/run.sh compares
// with pgbench running the same two statements, and calls/batch the mean
// number of calls each transaction carried.
//
// The notify=off variant shows what Config.DisableNotify buys: PostgreSQL
// serialises the commits of transactions that NOTIFY.
func BenchmarkReserveComplete(b *testing.B) {
	for _, mode := range batchModes {
		for _, n := range benchWorkers {
			b.Run(fmt.Sprintf("%s/c=%d", mode.name, n), func(b *testing.B) { benchReserveComplete(b, mode.cfg, n) })
		}
	}
	b.Run("notify=off/c=16", func(b *testing.B) { benchReserveComplete(b, idempg.Config{DisableNotify: true}, 16) })
}

func benchReserveComplete(b *testing.B, cfg idempg.Config, workers int) {
	pool := testPool(b, "")
	s := newStore(b, pool, cfg)
	ctx := b.Context()
	resp := &idemstore.Response{Status: 201, Body: []byte(`{"id":"ord_123","status":"paid"}`)}
	var next atomic.Int64
	var failed atomic.Pointer[error]
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				// Random keys, as clients send (and as pgbench.sql does).
				k := idemstore.Key{Scope: "bench", Operation: "POST /orders", Key: rand.Text()}
				tok := "tok-" + k.Key
				_, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: 30 * time.Second})
				if err == nil {
					err = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: resp, Retention: 24 * time.Hour})
				}
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	reportBatches(b, s)
}

// reportBatches adds the mean number of calls per transaction (lone calls
// that found the store idle count as batches of one), when s batches.
func reportBatches(b *testing.B, s *idempg.Store) {
	if bt := s.Batcher(); bt != nil {
		batches, calls := bt.Stats()
		if total := batches + uint64(2*b.N) - calls; total > 0 {
			b.ReportMetric(float64(2*b.N)/float64(total), "calls/batch")
		}
	}
}
