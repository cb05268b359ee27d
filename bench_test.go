package idem_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// benchStores are the stores the engine benchmarks run on.
var benchStores = []struct {
	name string
	new  func(b *testing.B) *idem.Engine
}{
	{"memory", func(b *testing.B) *idem.Engine { e, _ := newEngine(b, idem.EngineConfig{}); return e }},
	{"sqlite", func(b *testing.B) *idem.Engine {
		_, store, cleanup := openSQLite()
		b.Cleanup(cleanup)
		e, err := idem.NewEngine(store, idem.EngineConfig{})
		if err != nil {
			b.Fatal(err)
		}
		return e
	}},
}

// BenchmarkEngine measures, on each store, one Begin (acquire) and one
// Complete — the engine's cost per protected operation — and a Begin on a
// completed key (the replay path).
func BenchmarkEngine(b *testing.B) {
	for _, st := range benchStores {
		b.Run(st.name+"/begin-complete", func(b *testing.B) { benchBeginComplete(b, st.new(b), 0) })
		b.Run(st.name+"/replay", func(b *testing.B) { benchReplay(b, st.new(b)) })
	}
}

// BenchmarkEngineSteadyState measures begin-complete on a memory store of
// constant size, as in production where records arrive at a steady rate and
// expire after the retention window: 4096 keys cycle, the clock advances one
// second per operation and retention is 4096 seconds, so each key's old
// record has expired (and is evicted) when the key comes round again.
// BenchmarkEngine's begin-complete instead grows the store by one record per
// operation, and mostly measures a map of millions of entries and the
// garbage collector scanning it.
func BenchmarkEngineSteadyState(b *testing.B) {
	const ring = 4096
	// A lock-free clock, so that the benchmark measures the engine and not
	// a test clock's mutex.
	var secs atomic.Int64
	secs.Store(time.Now().Unix())
	tick := func() time.Time { return time.Unix(secs.Add(1), 0) }
	e, _ := newEngine(b, idem.EngineConfig{Now: tick, Retention: ring * time.Second})
	benchBeginComplete(b, e, ring)
}

// benchBeginComplete runs Begin+Complete b.N times, cycling through ring
// keys (the engine's clock must have expired a key's record before it comes
// round again); ring 0 means b.N distinct keys, so the store grows by one
// record per operation.
func benchBeginComplete(b *testing.B, e *idem.Engine, ring int) {
	ctx := context.Background()
	resp := &idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}
	if ring == 0 {
		ring = b.N
	}
	keys := make([]string, ring)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	r := req("")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.Key.Key = keys[i%ring]
		res, err := e.Begin(ctx, r)
		if err != nil || res.Outcome != idem.Acquired {
			b.Fatal(res.Outcome, err)
		}
		if err := res.Lease.Complete(ctx, resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBeginCompleteParallel is the memory store's begin-complete from
// GOMAXPROCS goroutines.
func BenchmarkBeginCompleteParallel(b *testing.B) {
	e, _ := newEngine(b, idem.EngineConfig{})
	ctx := context.Background()
	resp := &idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}
	var seq atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := req("")
		for pb.Next() {
			r.Key.Key = "key-" + strconv.FormatInt(seq.Add(1), 10)
			res, err := e.Begin(ctx, r)
			if err != nil || res.Outcome != idem.Acquired {
				b.Error(res.Outcome, err)
				return
			}
			if err := res.Lease.Complete(ctx, resp); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func benchReplay(b *testing.B, e *idem.Engine) {
	ctx := context.Background()
	res := mustBeginB(b, e, req("k"))
	if err := res.Lease.Complete(ctx, &idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}); err != nil {
		b.Fatal(err)
	}
	r := req("k")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := e.Begin(ctx, r)
		if err != nil || res.Outcome != idem.Replayed {
			b.Fatal(res.Outcome, err)
		}
	}
}

func mustBeginB(b *testing.B, e *idem.Engine, r idem.Request) idem.Result {
	res, err := e.Begin(context.Background(), r)
	if err != nil || res.Outcome != idem.Acquired {
		b.Fatal(res.Outcome, err)
	}
	return res
}

// BenchmarkFingerprintJSON measures fingerprinting a small JSON body.
func BenchmarkFingerprintJSON(b *testing.B) {
	in := idem.FingerprintInput{Method: "POST", Operation: "POST /payments", ContentType: "application/json",
		Body: []byte(`{"currency":"usd","amount":1000,"customer":"cus_123","metadata":{"order":"A-17","note":"gift"}}`)}
	b.ReportAllocs()
	b.SetBytes(int64(len(in.Body)))
	for i := 0; i < b.N; i++ {
		if _, err := idem.Fingerprint(in, idem.FingerprintOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
