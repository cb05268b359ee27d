package idemredis

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

var topologies = []topology{{"standalone", benchClient(standaloneOption)}, {"cluster", benchClient(clusterOption)}}

// benchClient connects as idem serve does (internal/storeurl): without
// client-side caching, which the store never uses, and with a flush delay
// of 20µs, which lets a busy pipeline gather more scripts per write.
func benchClient(option func(testing.TB) rueidis.ClientOption) func(testing.TB) rueidis.Client {
	return func(t testing.TB) rueidis.Client {
		opt := option(t)
		opt.DisableCache = true
		opt.MaxFlushDelay = 20 * time.Microsecond
		return newClient(t, opt)
	}
}

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
	s, err := newStore(client, Config{})
	if err != nil {
		b.Fatal(err)
	}
	runWorkers(b, s, workers, "ops/s", func(ctx context.Context, n int64) error {
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

// A protected request as idem serve stores it: the scope is a credential's
// hex SHA-256, the fingerprint versioned, the request its method and path,
// the answer a small JSON body with its Content-Type.
var (
	benchScope       = strings.Repeat("a7", 32)
	benchFingerprint = "v2:" + strings.Repeat("f3", 32)
	benchRequest     = &idemstore.Request{Method: "POST", Path: "/charges"}
	benchHeader      = map[string][]string{"Content-Type": {"application/json"}}
)

func benchReserveComplete(b *testing.B, client rueidis.Client, workers int) {
	s := benchStore(b, client)
	resp := &idemstore.Response{Status: 201, Header: benchHeader, Body: []byte(`{"id":"ch_1","amount":1000,"currency":"usd"}`)}
	runWorkers(b, s, workers, "pairs/s", func(ctx context.Context, n int64) error {
		k := idemstore.Key{Scope: benchScope, Operation: "POST /charges", Key: fmt.Sprintf("k-%d", n)}
		tok := fmt.Sprintf("t-%d", n)
		_, created, err := s.Reserve(ctx, idemstore.ReserveParams{
			Key: k, Fingerprint: benchFingerprint, Token: tok, Lease: 30 * time.Second, Request: benchRequest,
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
	s := benchStore(b, client)
	eng, err := idem.NewEngine(s, idem.EngineConfig{Retention: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	resp := &idem.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}
	lat := runWorkers(b, s, workers, "pairs/s", func(ctx context.Context, n int64) error {
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
// the CPU time per call of the Redis servers behind s (server-µs/op, from
// INFO cpu of every master, so only while nothing else loads them) and of
// this process (client-µs/op), and returns every call's latency.
func runWorkers(b *testing.B, s *Store, workers int, unit string, op func(ctx context.Context, n int64) error) []time.Duration {
	var seq atomic.Int64
	lat := make([][]time.Duration, workers)
	ctx := b.Context()
	b.ReportAllocs()
	server0, client0, sys0 := serverCPU(b, s), processCPU(), processSyscalls()
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
	server, client, sys := serverCPU(b, s)-server0, processCPU()-client0, processSyscalls()-sys0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
	b.ReportMetric(float64(server.Microseconds())/float64(b.N), "server-µs/op")
	b.ReportMetric(float64(client.Microseconds())/float64(b.N), "client-µs/op")
	if sys0 >= 0 {
		b.ReportMetric(float64(sys)/float64(b.N), "client-rw/op")
	}
	return slices.Concat(lat...)
}

// serverCPU returns the CPU time (user and system) the masters behind s
// have used so far, by their INFO cpu.
func serverCPU(b *testing.B, s *Store) time.Duration {
	ctx := context.Background()
	nodes, err := s.masters(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, n := range nodes {
		info, err := n.client.Do(ctx, n.client.B().Info().Section("cpu").Build()).ToString()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(info) {
			name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if name == "used_cpu_user" || name == "used_cpu_sys" {
				secs, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatalf("INFO cpu: %q: %v", line, err)
				}
				total += time.Duration(secs * float64(time.Second))
			}
		}
	}
	return total
}

// processSyscalls returns how many read and write system calls this
// process has made so far (Linux's /proc/self/io), or -1 where it cannot
// tell.
func processSyscalls() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	var n int64
	for line := range strings.Lines(string(b)) {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
		if name == "syscr" || name == "syscw" {
			c, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return -1
			}
			n += c
		}
	}
	return n
}

// processCPU returns the CPU time (user and system) this process has used
// so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
