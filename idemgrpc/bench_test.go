package idemgrpc_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// benchStream stands for grpc's server stream: what grpc.SetHeader and
// grpc.SetTrailer reach in a handler's context.
type benchStream struct{ method string }

func (s *benchStream) Method() string                  { return s.method }
func (s *benchStream) SetHeader(metadata.MD) error     { return nil }
func (s *benchStream) SendHeader(metadata.MD) error    { return nil }
func (s *benchStream) SetTrailer(md metadata.MD) error { return nil }

// chargeDirect returns a call of Charge through the interceptor in alone,
// as grpc-go makes it, with a handler that answers at once; its context
// carries a stream, which grpc.SetHeader and grpc.SetTrailer reach.
func chargeDirect(in grpc.UnaryServerInterceptor) func(*testpb.ChargeRequest) (any, error) {
	info := &grpc.UnaryServerInfo{FullMethod: chargeMethod}
	ctx := grpc.NewContextWithServerTransportStream(context.Background(), &benchStream{method: chargeMethod})
	handler := func(_ context.Context, req any) (any, error) {
		r := req.(*testpb.ChargeRequest)
		return &testpb.Payment{Id: "pay", Account: r.Account, Amount: r.Amount, Run: 1}, nil
	}
	return func(req *testpb.ChargeRequest) (any, error) { return in(ctx, req, info, handler) }
}

// benchEngine is an engine on a memory store of constant size, as in
// production where keys arrive at a steady rate and expire after the
// retention: the clock advances one second each time it is read (about
// three times a call), and a record is kept for ring seconds, so the
// store holds about ring/3 records. None is evicted for room.
func benchEngine(b *testing.B, ring int) *idem.Engine {
	var secs atomic.Int64
	secs.Store(time.Now().Unix())
	clock := func() time.Time { return time.Unix(secs.Add(1), 0) }
	store := idemmem.MustNew(idemmem.Config{Now: clock})
	b.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet, Retention: time.Duration(ring) * time.Second, Now: clock})
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkInterceptor measures the server interceptor alone, with a
// handler that answers at once: what idem adds to each call. acquire
// reserves and completes a new key per call (4096 keys cycle through a
// store of constant size: about 1 400 records, see benchEngine); replay
// answers a completed one; acquire-full reserves and completes a new key
// per call in a full store of default size; acquire-fill does so in a
// default store filling from empty, as in a server's first seconds.
// cpu-µs/op is the process's CPU time per call, which other processes'
// load on the machine changes less than ns/op.
func BenchmarkInterceptor(b *testing.B) {
	const ring = 4096
	keys := make([]string, ring)
	for i := range keys {
		keys[i] = fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", i+1)
	}
	reqs := make([]*testpb.ChargeRequest, ring)
	for i := range reqs {
		reqs[i] = &testpb.ChargeRequest{Account: "acc", Amount: 5, RequestId: keys[i]}
	}
	icpt := func(b *testing.B) func(*testpb.ChargeRequest) (any, error) {
		i, err := idemgrpc.NewUnaryServerInterceptor(benchEngine(b, ring), idemgrpc.Config{Scope: idemgrpc.GlobalScope, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		return chargeDirect(i)
	}
	b.Run("acquire", func(b *testing.B) {
		in := icpt(b)
		b.ReportAllocs()
		defer reportCPU(b)()
		for i := 0; b.Loop(); i++ {
			if _, err := in(reqs[i%ring]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("acquire-full", func(b *testing.B) {
		// The memory store with its defaults, full: every call evicts the
		// oldest record, and each collection marks 100 000 of them.
		in := chargeDirect(fullMemoryInterceptor(b))
		runtime.GC()
		b.ReportAllocs()
		defer reportCPU(b)()
		for i := 0; b.Loop(); i++ {
			req := &testpb.ChargeRequest{Account: "acc", Amount: 5, RequestId: fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", i)}
			if _, err := in(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("acquire-fill", func(b *testing.B) {
		// A server's first seconds: the memory store with its defaults
		// fills from empty, so every record is new heap and nothing is
		// evicted. A fresh store is made every fillCalls calls (outside
		// the timer).
		const fillCalls = idemmem.DefaultMaxRecords * 9 / 10
		var in func(*testpb.ChargeRequest) (any, error)
		b.ReportAllocs()
		defer reportCPU(b)()
		for i := 0; b.Loop(); i++ {
			if i%fillCalls == 0 {
				b.StopTimer()
				fresh, _ := freshMemoryInterceptor(b)
				in = chargeDirect(fresh)
				runtime.GC()
				b.StartTimer()
			}
			req := &testpb.ChargeRequest{Account: "acc", Amount: 5, RequestId: fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", i)}
			if _, err := in(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		in := icpt(b)
		for _, r := range reqs[:64] {
			if _, err := in(r); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		defer reportCPU(b)()
		for i := 0; b.Loop(); i++ {
			if _, err := in(reqs[i%64]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// cpuTime is the CPU time the process has used, user and system: a
// figure that other processes' load on the machine changes far less than
// the time per call.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHTTPMiddleware is the HTTP middleware on the same engine and
// store as BenchmarkInterceptor, with a handler that answers the same
// payment as JSON: what idem adds to an HTTP request, for comparison on the
// same machine at the same time (bare is the handler alone).
func BenchmarkHTTPMiddleware(b *testing.B) {
	const ring = 4096
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_ = body
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"pay","account":"acc","amount":5,"run":1}`))
	})
	reqs := make([]*http.Request, ring)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodPost, "/payments", nil)
		reqs[i].Header.Set("Content-Type", "application/json")
		reqs[i].Header.Set("Idempotency-Key", fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", i+1))
	}
	const body = `{"account":"acc","amount":5}`
	serve := func(b *testing.B, h http.Handler) {
		b.ReportAllocs()
		defer reportCPU(b)()
		for i := 0; b.Loop(); i++ {
			r := reqs[i%ring]
			r.Body = io.NopCloser(strings.NewReader(body))
			w := &benchWriter{h: http.Header{}}
			h.ServeHTTP(w, r)
			if w.status != http.StatusCreated {
				b.Fatalf("status %d", w.status)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { serve(b, handler) })
	b.Run("acquire", func(b *testing.B) {
		serve(b, idem.Middleware(benchEngine(b, ring), idem.Config{Scope: idem.GlobalScope})(handler))
	})
}

// benchWriter is a ResponseWriter that keeps the status only, as a
// server's writer costs the same with and without idem.
type benchWriter struct {
	h      http.Header
	status int
}

func (w *benchWriter) Header() http.Header { return w.h }
func (w *benchWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}
func (w *benchWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

// reportCPU starts counting the process's CPU time; the function it
// returns reports it per op.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() { b.ReportMetric(float64(cpuTime()-start)/1e3/float64(b.N), "cpu-µs/op") }
}

// BenchmarkUnaryLoopback measures whole calls to a real server on loopback
// TCP, 32 at a time over 4 connections as scripts/bench-grpc.sh sends
// them, each with a new request_id: bare, and behind the interceptor on the
// memory store and, when IDEM_TEST_POSTGRES_URL is set, on PostgreSQL
// (calls/batch is then the mean number of calls each group-commit
// transaction carried). Client and server share the process, so cpu-µs/op
// is what a call costs both; the difference is idem's.
//
// memory starts empty and grows through the run, as a server just
// started; memory-full is the memory store with its defaults (MaxRecords
// 100 000, a day's retention) filled to MaxRecords before the timer
// starts, so that every call evicts a record: a server that has run for a
// while.
func BenchmarkUnaryLoopback(b *testing.B) {
	for _, store := range []string{"bare", "memory", "memory-full", "postgres"} {
		b.Run(store, func(b *testing.B) {
			var opts []grpc.ServerOption
			var batches idemstore.BatchReporter
			switch store {
			case "memory":
				opts = append(opts, grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(benchEngine(b, 1<<20), idemgrpc.Config{Scope: idemgrpc.GlobalScope, Logger: quiet})))
			case "memory-full":
				opts = append(opts, grpc.UnaryInterceptor(fullMemoryInterceptor(b)))
			case "postgres":
				l := newPGLedger(b)
				e, err := idem.NewEngine(l.store, idem.EngineConfig{Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				batches = l.store
				opts = append(opts, grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(e, idemgrpc.Config{Scope: idemgrpc.GlobalScope, Logger: quiet})))
			}
			srv := grpc.NewServer(opts...)
			testpb.RegisterPaymentsServer(srv, &payments{})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go srv.Serve(lis)
			b.Cleanup(srv.Stop)
			var clients [4]testpb.PaymentsClient
			for i := range clients {
				conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { conn.Close() })
				clients[i] = testpb.NewPaymentsClient(conn)
			}
			var n, worker atomic.Int64
			b.SetParallelism(16) // 32 goroutines on 2 CPUs
			b.ReportAllocs()
			b.ResetTimer()
			defer reportCPU(b)()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				c := clients[worker.Add(1)%4]
				ctx := context.Background()
				for pb.Next() {
					id := fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", n.Add(1))
					if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "acc", Amount: 5, RequestId: id}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
			if batches != nil {
				if bs, ok := batches.BatchStats(); ok && bs.Batches > 0 {
					b.ReportMetric(float64(bs.Batched)/float64(bs.Batches), "calls/batch")
				}
			}
		})
	}
}

// fullMemoryInterceptor returns the interceptor on a memory store with
// its defaults, filled to its MaxRecords with the records calls to Charge
// leave.
func fullMemoryInterceptor(b *testing.B) grpc.UnaryServerInterceptor {
	in, store := freshMemoryInterceptor(b)
	charge := chargeDirect(in)
	for i := range idemmem.DefaultMaxRecords {
		req := &testpb.ChargeRequest{Account: "acc", Amount: 5, RequestId: fmt.Sprintf("0190a0e0-0000-7000-9000-%012d", i)}
		if _, err := charge(req); err != nil {
			b.Fatal(err)
		}
	}
	if n := store.Len(); n != idemmem.DefaultMaxRecords {
		b.Fatalf("the store holds %d records, not %d", n, idemmem.DefaultMaxRecords)
	}
	return in
}

// freshMemoryInterceptor is the interceptor on an engine with its defaults
// and an empty memory store with its defaults, and that store.
func freshMemoryInterceptor(b *testing.B) (grpc.UnaryServerInterceptor, *idemmem.Store) {
	store := idemmem.MustNew(idemmem.Config{})
	b.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	return idemgrpc.UnaryServerInterceptor(e, idemgrpc.Config{Scope: idemgrpc.GlobalScope, Logger: quiet}), store
}
