package idemmem_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// benchRing is how many distinct keys one benchmark goroutine cycles
// through. Each record expires one tick after it is completed, so by the
// time a key comes round again its old record has expired and the Reserve
// creates a fresh one: the store stays small, and the measured path
// includes the lazy eviction a long-running store does.
const benchRing = 1 << 12

var benchResponse = &idemstore.Response{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}},
	Body:   []byte(`{"id":"pay_123","amount":1000}`),
}

var benchGoroutine atomic.Int64

func ringKeys() []idemstore.Key {
	g := strconv.FormatInt(benchGoroutine.Add(1), 10)
	keys := make([]idemstore.Key, benchRing)
	for i := range keys {
		keys[i] = idemstore.Key{Scope: "tenant-" + g, Operation: "POST /payments", Key: "key-" + strconv.Itoa(i)}
	}
	return keys
}

// reserveComplete runs Reserve then Complete on n keys of the ring, the
// store-level cost of one Begin + Complete in the engine.
func reserveComplete(tb testing.TB, s *idemmem.Store, keys []idemstore.Key, next func() bool) {
	ctx := context.Background()
	for i := 0; next(); i++ {
		k := keys[i%benchRing]
		_, created, err := s.Reserve(ctx, idemstore.ReserveParams{
			Key: k, Fingerprint: "v1:abc", Token: "token", Lease: 30 * time.Second,
		})
		if err != nil || !created {
			tb.Fatalf("Reserve: created = %v, err = %v", created, err)
		}
		err = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "token", Response: benchResponse, Retention: time.Millisecond})
		if err != nil {
			tb.Fatalf("Complete: %v", err)
		}
	}
}

func BenchmarkReserveComplete(b *testing.B) {
	b.Run("Serial", func(b *testing.B) {
		s := idemmem.MustNew(idemmem.Config{})
		keys := ringKeys()
		b.ReportAllocs()
		b.ResetTimer()
		n := 0
		reserveComplete(b, s, keys, func() bool { n++; return n <= b.N })
	})
	b.Run("Parallel", func(b *testing.B) {
		s := idemmem.MustNew(idemmem.Config{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			reserveComplete(b, s, ringKeys(), pb.Next)
		})
	})
}

// BenchmarkReserveCompleteAtBound is ReserveComplete on a store held at
// its MaxRecords: every key is new and kept for a day, so each Reserve
// evicts the oldest completed record to make room.
func BenchmarkReserveCompleteAtBound(b *testing.B) {
	s := idemmem.MustNew(idemmem.Config{MaxRecords: benchRing})
	ctx := context.Background()
	resp := benchResponse
	// Two rings of keys take turns: by the time a ring comes round again,
	// the other one has evicted all of its records.
	var rings [2][]idemstore.Key
	for r := range rings {
		for i := range benchRing {
			rings[r] = append(rings[r], idemstore.Key{Scope: "tenant-" + strconv.Itoa(r), Operation: "POST /payments", Key: "key-" + strconv.Itoa(i)})
		}
	}
	put := func(tb testing.TB, k idemstore.Key) {
		_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Token: "t", Lease: time.Minute})
		if err != nil || !created {
			tb.Fatalf("Reserve: created = %v, err = %v", created, err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t", Response: resp, Retention: 24 * time.Hour}); err != nil {
			tb.Fatal(err)
		}
	}
	for _, k := range rings[1] {
		put(b, k)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		put(b, rings[(i/benchRing)%2][i%benchRing])
	}
	if u := s.Usage(); u.Records > benchRing {
		b.Fatalf("usage %+v over %d records", u, benchRing)
	}
}

// BenchmarkReplayGet measures reading back a completed record: Reserve of
// a key that is already completed (what the engine does on every retry)
// and a plain Get.
func BenchmarkReplayGet(b *testing.B) {
	s := idemmem.MustNew(idemmem.Config{})
	ctx := context.Background()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /payments", Key: "replayed"}
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Token: "t", Lease: time.Minute}); err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t", Response: benchResponse, Retention: 24 * time.Hour}); err != nil {
		b.Fatal(err)
	}
	p := idemstore.ReserveParams{Key: k, Token: "other", Lease: time.Minute}
	replay := func(tb testing.TB) {
		rec, created, err := s.Reserve(ctx, p)
		if err != nil || created || rec.Response == nil {
			tb.Fatalf("replay: %v, %v, %v", rec, created, err)
		}
	}
	get := func(tb testing.TB) {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.Response == nil {
			tb.Fatalf("Get: %v, %v", rec, err)
		}
	}
	for _, c := range []struct {
		name string
		op   func(testing.TB)
	}{{"Reserve", replay}, {"Get", get}} {
		b.Run(c.name+"/Serial", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.op(b)
			}
		})
		b.Run(c.name+"/Parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.op(b)
				}
			})
		})
	}
}

// BenchmarkReserveCompleteRandomKeys is ReserveComplete with keys in a
// UUID's form, random rather than in order, on a store holding 100,000
// records: every Reserve inserts into the key index (a B-tree) at a random
// place, as the keys clients send do.
func BenchmarkReserveCompleteRandomKeys(b *testing.B) {
	const held = 100_000
	s := idemmem.MustNew(idemmem.Config{MaxRecords: held})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	key := func() idemstore.Key {
		return idemstore.Key{Scope: "tenant-1", Operation: "/pay.v1.Payments/Charge",
			Key: fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", rng.Uint32(), rng.Uint32()&0xffff, rng.Uint32()&0xfff, rng.Uint32()&0xffff, rng.Uint64()&0xffffffffffff)}
	}
	keys := make([]idemstore.Key, held+b.N)
	for i := range keys {
		keys[i] = key()
	}
	for _, k := range keys[:held] {
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "v1:abc", Token: "token", Lease: time.Hour}); err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "token", Response: benchResponse, Retention: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	defer reportCPU(b)()
	for _, k := range keys[held:] {
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "v1:abc", Token: "token", Lease: time.Hour}); err != nil || !created {
			b.Fatalf("Reserve: created = %v, err = %v", created, err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "token", Response: benchResponse, Retention: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
}

// reportCPU starts counting the process's CPU time, user and system; the
// function it returns reports it per op as cpu-µs/op, a figure that other
// processes' load on the machine changes far less than ns/op.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() { b.ReportMetric(float64(cpuTime()-start)/1e3/float64(b.N), "cpu-µs/op") }
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
