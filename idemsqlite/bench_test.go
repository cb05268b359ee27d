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
	"github.com/idem-dev/idem/internal/tools/storebench"
)

// benchConcurrency are the numbers of goroutines each write benchmark runs
// at: one (a lone request, which batching must not slow down), and 16 to 50.
var benchConcurrency = []int{1, 16, 32, 50}

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

// benchKey is the i-th key of a read benchmark.
func benchKey(i int) idemstore.Key {
	return idemstore.Key{Scope: "tenant-1", Operation: "POST /charges", Key: "key-" + strconv.Itoa(i)}
}

// BenchmarkReserveComplete measures Store.Reserve followed by
// Store.Complete on a fresh random key, the write path of every first
// request, with group commit on (the default) and off, reporting pairs/s,
// the p50 and p99 of a pair, and (batching on) calls per transaction.
func BenchmarkReserveComplete(b *testing.B) {
	for _, mode := range batchModes {
		for _, n := range benchConcurrency {
			b.Run(mode.name+"/c="+strconv.Itoa(n), func(b *testing.B) {
				s, _ := newStoreWith(b, mode.cfg)
				storebench.Run(b, n, s.Batcher(), storebench.StorePair(s))
			})
		}
	}
}

// BenchmarkRawInsertUpdate is the baseline for BenchmarkReserveComplete:
// the same INSERT … ON CONFLICT DO NOTHING and fenced UPDATE, with the same
// schema, database settings, keys and concurrency, written as a plain
// database/sql loop, one pair of autocommit statements (two transactions)
// at a time, with the response encoded once up front.
func BenchmarkRawInsertUpdate(b *testing.B) {
	blob := idemstore.EncodeResponse(storebench.Response)
	for _, n := range benchConcurrency {
		b.Run("c="+strconv.Itoa(n), func(b *testing.B) {
			_, db := newStore(b)
			now := time.Now().UTC()
			storebench.Run(b, n, nil, func(ctx context.Context, k idemstore.Key, tok string) error {
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
		})
	}
}

// BenchmarkGetCompleted measures Store.Get of a completed record, the read
// behind every replay.
func BenchmarkGetCompleted(b *testing.B) {
	const keys = 1000
	for _, n := range []int{1, 8} {
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
