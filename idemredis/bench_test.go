package idemredis

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// The benchmarks below are what scripts/bench-redis.sh runs and compares
// with redis-benchmark's SET NX rate on the same servers, in the same run.
// Each runs a fixed number of goroutines (not GOMAXPROCS multiples), named
// in the benchmark: workers=50 is redis-benchmark's -c 50.

// pairWorkers are the worker counts of the throughput benchmarks.
var pairWorkers = []int{16, 50}

// latencyWorkers are the worker counts of BenchmarkEngine: a lone caller,
// and a busy server.
var latencyWorkers = []int{1, 32}

// topology is one Redis setup to benchmark. One client serves every
// worker: rueidis pipelines the concurrent calls on its connections.
type topology struct {
	name   string
	client func(testing.TB) rueidis.Client
}

var topologies = []topology{{"standalone", standaloneClient}, {"cluster", clusterClient}}

// BenchmarkReserveComplete measures the engine's common path at the store,
// a reserve followed by a complete of a fresh key (two scripts), from 16
// and 50 goroutines. pairs/s is the figure to compare with the native SET
// NX rate.
func BenchmarkReserveComplete(b *testing.B) {
	for _, topo := range topologies {
		for _, w := range pairWorkers {
			b.Run(fmt.Sprintf("%s/workers=%d", topo.name, w), func(b *testing.B) {
				benchReserveComplete(b, topo.client(b), w)
			})
		}
	}
}

// BenchmarkSetNX is the client-side baseline for BenchmarkReserveComplete:
// the client's own SET key v NX PX 60000 on fresh keys from 50 goroutines,
// auto-pipelined like the store's scripts.
func BenchmarkSetNX(b *testing.B) {
	const workers = 50
	for _, topo := range topologies {
		b.Run(fmt.Sprintf("%s/workers=%d", topo.name, workers), func(b *testing.B) {
			benchSetNX(b, topo.client(b), workers)
		})
	}
}

// BenchmarkEngine measures Begin and Lease.Complete of a fresh key through
// the engine on the Redis store, from one goroutine and from 32, and
// reports the latency of the pair (p50-µs, p99-µs) beside its rate.
func BenchmarkEngine(b *testing.B) {
	for _, topo := range topologies {
		for _, w := range latencyWorkers {
			b.Run(fmt.Sprintf("%s/workers=%d", topo.name, w), func(b *testing.B) {
				benchEngine(b, topo.client(b), w)
			})
		}
	}
}

// BenchmarkCheckPolicy measures a check of the nodes' maxmemory-policy,
// as New runs it and ListExpiredLeases and Purge run it before they scan:
// one CONFIG GET per node, after CLUSTER SLOTS on a Cluster (three
// masters and three replicas in the test Cluster). Nothing on the path of
// a request pays it.
func BenchmarkCheckPolicy(b *testing.B) {
	for _, topo := range topologies {
		b.Run(topo.name, func(b *testing.B) {
			s := benchStore(b, topo.client(b))
			b.ReportAllocs()
			for b.Loop() {
				if err := s.CheckPolicy(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchSetNX(b *testing.B, client rueidis.Client, workers int) {
	prefix := testPrefix()
	// The keys expire on their own; deleting them one by one on a Cluster
	// would take longer than the run.
	const ttl = time.Minute
	runWorkers(b, workers, "ops/s", func(ctx context.Context, n int64) error {
		key := fmt.Sprintf("%s:setnx:%d", prefix, n)
		err := client.Do(ctx, client.B().Set().Key(key).Value("v").Nx().Px(ttl).Build()).Error()
		if rueidis.IsRedisNil(err) {
			err = fmt.Errorf("SET NX %s: key exists", key)
		}
		return err
	})
}

// benchStore returns a store under a fresh prefix whose completed records
// (retention zero) live for RetentionGrace only, so a long run does not
// leave its keys behind.
func benchStore(b *testing.B, client rueidis.Client) *Store {
	s, err := New(client, Config{Prefix: testPrefix(), RetentionGrace: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deletePrefix(b, s) })
	return s
}

func benchReserveComplete(b *testing.B, client rueidis.Client, workers int) {
	s := benchStore(b, client)
	resp := &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}
	runWorkers(b, workers, "pairs/s", func(ctx context.Context, n int64) error {
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

func benchEngine(b *testing.B, client rueidis.Client, workers int) {
	eng, err := idem.NewEngine(benchStore(b, client), idem.EngineConfig{Retention: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	resp := &idem.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}
	lat := runWorkers(b, workers, "pairs/s", func(ctx context.Context, n int64) error {
		res, err := eng.Begin(ctx, idem.Request{
			Key:         idem.Key{Scope: "tenant", Operation: "POST /charges", Key: fmt.Sprintf("k-%d", n)},
			Fingerprint: "fp",
		})
		if err != nil || res.Outcome != idem.Acquired {
			return fmt.Errorf("Begin: %v, %v", res.Outcome, err)
		}
		return res.Lease.Complete(ctx, resp)
	})
	b.ReportMetric(float64(percentile(lat, 50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(lat, 99).Microseconds()), "p99-µs")
}

// runWorkers runs op b.N times from workers goroutines, passing each call a
// distinct sequence number starting at 1, reports the rate in unit and
// returns every call's latency.
func runWorkers(b *testing.B, workers int, unit string, op func(ctx context.Context, n int64) error) []time.Duration {
	var seq atomic.Int64
	lat := make([][]time.Duration, workers)
	ctx := b.Context()
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for n := seq.Add(1); n <= int64(b.N); n = seq.Add(1) {
				start := time.Now()
				if err := op(ctx, n); err != nil {
					b.Error(err)
					return
				}
				lat[w] = append(lat[w], time.Since(start))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
	return slices.Concat(lat...)
}

// percentile returns the p-th percentile of lat (nearest rank), sorting
// lat in place; 0 when lat is empty.
func percentile(lat []time.Duration, p int) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	i := (len(lat)*p + 99) / 100
	return lat[max(i, 1)-1]
}
