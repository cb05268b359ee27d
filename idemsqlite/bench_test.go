package idemsqlite_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// benchConcurrency are the numbers of goroutines each benchmark runs at.
var benchConcurrency = []int{1, 8, 32}

// benchResponse is the small JSON answer stored by the write benchmarks.
var benchResponse = &idemstore.Response{
	Status: 201,
	Header: http.Header{"Content-Type": {"application/json"}},
	Body:   []byte(`{"id":"ch_1","amount":4200,"currency":"eur","status":"succeeded"}`),
}

// runConcurrent calls op b.N times in all, from n goroutines, with the
// iteration number, and fails b on the first error.
func runConcurrent(b *testing.B, n int, op func(i int) error) {
	b.Helper()
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := op(i); err != nil {
					errOnce.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

// benchKey is the i-th fresh key of a write benchmark.
func benchKey(i int) idemstore.Key {
	return idemstore.Key{Scope: "tenant-1", Operation: "POST /charges", Key: "key-" + strconv.Itoa(i)}
}

// reportPairs adds the rate of reserve+complete pairs per second.
func reportPairs(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}

// BenchmarkReserveComplete measures Store.Reserve followed by
// Store.Complete on a fresh key, the write path of every first request,
// with group commit on (the default) and off. With batching on it also
// reports the mean number of calls per batch.
func BenchmarkReserveComplete(b *testing.B) {
	for _, mode := range batchModes {
		for _, n := range benchConcurrency {
			b.Run(mode.name+"/c="+strconv.Itoa(n), func(b *testing.B) {
				s, _ := newStoreWith(b, mode.cfg)
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				runConcurrent(b, n, func(i int) error {
					k := benchKey(i)
					tok := "tok-" + strconv.Itoa(i)
					_, created, err := s.Reserve(ctx, idemstore.ReserveParams{
						Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute,
					})
					if err != nil {
						return err
					}
					if !created {
						return errors.New("fresh key not created")
					}
					return s.Complete(ctx, idemstore.CompleteParams{
						Key: k, Token: tok, Response: benchResponse, Retention: 24 * time.Hour,
					})
				})
				reportPairs(b)
				reportBatches(b, s)
			})
		}
	}
}

// BenchmarkRawInsertUpdate is the baseline for BenchmarkReserveComplete:
// the same INSERT … ON CONFLICT DO NOTHING and fenced UPDATE, with the same
// schema, database settings and concurrency, written as a plain
// database/sql loop with the response encoded once up front.
func BenchmarkRawInsertUpdate(b *testing.B) {
	blob := idemstore.EncodeResponse(benchResponse)
	for _, n := range benchConcurrency {
		b.Run("c="+strconv.Itoa(n), func(b *testing.B) {
			_, db := newStore(b)
			ctx := context.Background()
			now := time.Now().UTC()
			b.ReportAllocs()
			b.ResetTimer()
			runConcurrent(b, n, func(i int) error {
				k := benchKey(i)
				tok := "tok-" + strconv.Itoa(i)
				res, err := db.ExecContext(ctx, `INSERT INTO idem_records
					(scope, operation, "key", fingerprint, state, token, lease_until, created_at, updated_at, request)
					VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)
					ON CONFLICT (scope, operation, "key") DO NOTHING`,
					k.Scope, k.Operation, k.Key, "fp", tok, now.Add(time.Minute).UnixMilli(), now.UnixMilli(), now.UnixMilli(), nil)
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil || n != 1 {
					return errors.Join(errors.New("insert did not create"), err)
				}
				res, err = db.ExecContext(ctx, `UPDATE idem_records
					SET state = 'completed', response = ?, expires_at = ?, updated_at = ?
					WHERE scope = ? AND operation = ? AND "key" = ? AND state = 'pending' AND token = ?`,
					blob, now.Add(24*time.Hour).UnixMilli(), now.UnixMilli(), k.Scope, k.Operation, k.Key, tok)
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil || n != 1 {
					return errors.Join(errors.New("update matched no row"), err)
				}
				return nil
			})
			reportPairs(b)
		})
	}
}

// BenchmarkGetCompleted measures Store.Get of a completed record, the read
// behind every replay.
func BenchmarkGetCompleted(b *testing.B) {
	const keys = 1000
	for _, n := range benchConcurrency {
		b.Run("c="+strconv.Itoa(n), func(b *testing.B) {
			s, _ := newStore(b)
			ctx := context.Background()
			populate(b, s, keys)
			b.ReportAllocs()
			b.ResetTimer()
			runConcurrent(b, n, func(i int) error {
				rec, err := s.Get(ctx, benchKey(i%keys))
				if err != nil {
					return err
				}
				if rec.State != idemstore.StateCompleted || rec.Response == nil {
					return errors.New("record not completed")
				}
				return nil
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "gets/s")
		})
	}
}

// populate stores n completed records under benchKey(0..n-1).
func populate(b *testing.B, s *idemsqlite.Store, n int) {
	b.Helper()
	ctx := context.Background()
	for i := range n {
		tok := "tok-" + strconv.Itoa(i)
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: benchKey(i), Fingerprint: "fp", Token: tok,
			Lease: time.Minute}); err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: benchKey(i), Token: tok, Response: benchResponse,
			Retention: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
}

// reportBatches adds the mean number of calls per batch (lone calls that
// found the store idle count as batches of one), when s batches.
func reportBatches(b *testing.B, s *idemsqlite.Store) {
	if bt := s.Batcher(); bt != nil {
		batches, calls := bt.Stats()
		lone := uint64(2*b.N) - calls
		if total := batches + lone; total > 0 {
			b.ReportMetric(float64(2*b.N)/float64(total), "calls/batch")
		}
	}
}
