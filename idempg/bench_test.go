package idempg_test

import (
	"crypto/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// benchWorkers is the number of concurrent callers, as pgbench -c 16 in
// bench/run.sh.
const benchWorkers = 16

// BenchmarkReserveComplete measures the store's hot path: reserve a fresh
// key, then complete it with a small answer, from 16 goroutines at once.
// One op is one Reserve+Complete pair; the pairs/s metric is what
// bench/run.sh compares with pgbench running the same two statements.
//
// The notify=off variant shows what Config.DisableNotify buys: PostgreSQL
// serialises the commits of transactions that NOTIFY.
func BenchmarkReserveComplete(b *testing.B) {
	b.Run("notify=on", func(b *testing.B) { benchReserveComplete(b, idempg.Config{}) })
	b.Run("notify=off", func(b *testing.B) { benchReserveComplete(b, idempg.Config{DisableNotify: true}) })
}

func benchReserveComplete(b *testing.B, cfg idempg.Config) {
	pool := testPool(b, "")
	s := newStore(b, pool, cfg)
	ctx := b.Context()
	resp := &idemstore.Response{Status: 201, Body: []byte(`{"id":"ord_123","status":"paid"}`)}
	var next atomic.Int64
	var failed atomic.Pointer[error]
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range benchWorkers {
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
}
