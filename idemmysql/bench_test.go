package idemmysql_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
)

// benchWorkers is the number of concurrent callers of the store-against-raw
// comparison, as mysqlslap --concurrency in bench/run.sh.
const benchWorkers = 16

var benchResp = &idemstore.Response{Status: 201, Body: []byte(`{"id":"ord_123","status":"paid"}`)}

// BenchmarkReserveComplete measures the store's hot path, a Reserve of a
// fresh key then its Complete, from 16 goroutines, with group commit on
// (store, the default) and off (store-nobatch), against the same INSERT and
// UPDATE sent through database/sql directly, one pair of autocommit
// statements at a time (raw), in the same run and on the same table. One op
// is one pair; compare the pairs/s.
func BenchmarkReserveComplete(b *testing.B) {
	db, _ := newDatabase(b, "")
	db.SetMaxOpenConns(benchWorkers)
	db.SetMaxIdleConns(benchWorkers)
	for _, mode := range []struct {
		name string
		cfg  idemmysql.Config
	}{{"store", idemmysql.Config{}}, {"store-nobatch", idemmysql.Config{DisableBatch: true}}} {
		b.Run(mode.name, func(b *testing.B) {
			s, err := idemmysql.New(db, mode.cfg)
			if err != nil {
				b.Fatal(err)
			}
			runPairs(b, benchWorkers, func(ctx context.Context, k idemstore.Key, tok string) error {
				if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: 30 * time.Second}); err != nil {
					return err
				}
				return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: benchResp, Retention: 24 * time.Hour})
			})
			reportBatches(b, s)
		})
	}
	// The statements the store sends, verbatim.
	const (
		now         = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)"
		insertSQL   = "INSERT INTO idem_records (scope, operation, `key`, fingerprint, state, token, lease_until, reason, request, created_at, updated_at) VALUES (?, ?, ?, ?, 'pending', ?, (" + now + " + ?), '', ?, " + now + ", " + now + ")"
		completeSQL = "UPDATE idem_records SET state = 'completed', response = ?, expires_at = (" + now + " + ?), updated_at = " + now + " WHERE scope = ? AND operation = ? AND `key` = ? AND state = 'pending' AND token = ?"
	)
	b.Run("raw", func(b *testing.B) {
		runPairs(b, benchWorkers, func(ctx context.Context, k idemstore.Key, tok string) error {
			if _, err := db.ExecContext(ctx, insertSQL, k.Scope, k.Operation, k.Key, "fp", tok, int64(30000), nil); err != nil {
				return err
			}
			res, err := db.ExecContext(ctx, completeSQL, idemstore.EncodeResponse(benchResp), int64(24*time.Hour/time.Millisecond), k.Scope, k.Operation, k.Key, tok)
			if err == nil {
				_, err = res.RowsAffected()
			}
			return err
		})
	})
}

// BenchmarkLatency runs the store's pairs from 1 and 32 goroutines with
// group commit on and off, and reports the pair's p50 and p99: a lone
// request must not get slower with batching on.
func BenchmarkLatency(b *testing.B) {
	db, _ := newDatabase(b, "")
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	for _, mode := range []struct {
		name string
		cfg  idemmysql.Config
	}{{"batch=on", idemmysql.Config{}}, {"batch=off", idemmysql.Config{DisableBatch: true}}} {
		for _, n := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/c=%d", mode.name, n), func(b *testing.B) {
				s, err := idemmysql.New(db, mode.cfg)
				if err != nil {
					b.Fatal(err)
				}
				lat := make([]time.Duration, b.N)
				var i atomic.Int64
				runPairs(b, n, func(ctx context.Context, k idemstore.Key, tok string) error {
					start := time.Now()
					if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: 30 * time.Second}); err != nil {
						return err
					}
					err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: benchResp, Retention: 24 * time.Hour})
					lat[i.Add(1)-1] = time.Since(start)
					return err
				})
				reportLatency(b, lat)
				reportBatches(b, s)
			})
		}
	}
}

// reportLatency adds the p50 and p99 of lat, in microseconds.
func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

// reportBatches adds the mean number of calls per transaction (lone calls
// that found the store idle count as batches of one), when s batches.
func reportBatches(b *testing.B, s *idemmysql.Store) {
	if bt := s.Batcher(); bt != nil {
		batches, calls := bt.Stats()
		if total := batches + uint64(2*b.N) - calls; total > 0 {
			b.ReportMetric(float64(2*b.N)/float64(total), "calls/batch")
		}
	}
}

// runPairs runs b.N pairs on workers goroutines, each pair on a fresh key,
// and reports pairs/s.
func runPairs(b *testing.B, workers int, pair func(ctx context.Context, k idemstore.Key, tok string) error) {
	ctx := b.Context()
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
				// Random keys, as clients send (and as mysqlslap.sql does).
				k := idemstore.Key{Scope: "bench", Operation: "POST /orders", Key: rand.Text()}
				if err := pair(ctx, k, "tok-"+k.Key); err != nil {
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
