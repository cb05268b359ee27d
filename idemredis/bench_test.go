package idemredis

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// benchWorkers is the number of concurrent callers, as in
// redis-benchmark -c 50 (see bench/run.sh).
const benchWorkers = 50

// BenchmarkReserveComplete measures the engine's common path, a reserve
// followed by a complete of a fresh key (two round trips), from 50
// concurrent goroutines. pairs/s is the figure to compare with the native
// SET NX rate.
func BenchmarkReserveComplete(b *testing.B) {
	b.Run("standalone", func(b *testing.B) {
		benchReserveComplete(b, standaloneClient(b, benchWorkers))
	})
	b.Run("cluster", func(b *testing.B) {
		benchReserveComplete(b, clusterClient(b, benchWorkers))
	})
}

// BenchmarkSetNX is the client-side baseline for BenchmarkReserveComplete:
// plain go-redis SET key v NX on fresh keys from the same 50 goroutines over
// the same pool. A pair is two round trips, so half of this rate is what any
// store built on go-redis could reach on this machine; bench/run.sh prints
// the store's rate against it as well as against redis-benchmark.
func BenchmarkSetNX(b *testing.B) {
	b.Run("standalone", func(b *testing.B) {
		benchSetNX(b, standaloneClient(b, benchWorkers))
	})
	b.Run("cluster", func(b *testing.B) {
		benchSetNX(b, clusterClient(b, benchWorkers))
	})
}

func benchSetNX(b *testing.B, client redis.UniversalClient) {
	prefix := testPrefix()
	// The keys expire on their own; deleting them one by one on a Cluster
	// would take longer than the run.
	const ttl = time.Minute
	runWorkers(b, "ops/s", func(ctx context.Context, n int64) error {
		key := fmt.Sprintf("%s:setnx:%d", prefix, n)
		ok, err := client.SetNX(ctx, key, "v", ttl).Result()
		if err == nil && !ok {
			err = fmt.Errorf("SET NX %s: key exists", key)
		}
		return err
	})
}

func benchReserveComplete(b *testing.B, client redis.UniversalClient) {
	// Completed records (retention zero) live for RetentionGrace only, so a
	// long run does not leave its keys behind.
	s, err := New(client, Config{Prefix: testPrefix(), RetentionGrace: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deletePrefix(b, s) })
	resp := &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}
	runWorkers(b, "pairs/s", func(ctx context.Context, n int64) error {
		k := idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: fmt.Sprintf("k-%d", n)}
		tok := fmt.Sprintf("t-%d", n)
		_, created, err := s.Reserve(ctx, idemstore.ReserveParams{
			Key: k, Fingerprint: "fp", Token: tok, Lease: 30 * time.Second,
		})
		if err != nil || !created {
			return fmt.Errorf("Reserve: created %v, %v", created, err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: resp}); err != nil {
			return fmt.Errorf("Complete: %w", err)
		}
		return nil
	})
}

// runWorkers runs op b.N times from benchWorkers goroutines, passing each
// call a distinct sequence number, and reports the rate in unit.
func runWorkers(b *testing.B, unit string, op func(ctx context.Context, n int64) error) {
	var seq atomic.Int64
	b.SetParallelism((benchWorkers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			if err := op(ctx, seq.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
}
