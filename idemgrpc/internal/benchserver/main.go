// Command benchserver serves the test Payments service for
// scripts/bench-grpc.sh: bare, or behind idemgrpc's interceptor over the
// memory store or PostgreSQL (IDEM_TEST_POSTGRES_URL). It listens on
// loopback only. With -cpuprofile or -memprofile it writes the profiles
// when it gets SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

type server struct {
	testpb.UnimplementedPaymentsServer
	runs atomic.Int64
}

func (s *server) Charge(_ context.Context, req *testpb.ChargeRequest) (*testpb.Payment, error) {
	return &testpb.Payment{Id: "pay", Account: req.Account, Amount: req.Amount, Run: s.runs.Add(1)}, nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:50151", "loopback address")
	store := flag.String("store", "none", "none (no interceptor), mem or pg")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile here, until SIGINT or SIGTERM")
	memprofile := flag.String("memprofile", "", "write an allocation profile here at SIGINT or SIGTERM")
	maxRecords := flag.Int("maxrecords", 0, "the memory store's MaxRecords (0: its default)")
	retention := flag.Duration("retention", 24*time.Hour, "how long completed keys are kept")
	flag.Parse()
	if *memprofile != "" {
		runtime.MemProfileRate = 64 << 10
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
	}
	srv := &server{}
	var (
		st    idemstore.Store
		count func() (int64, error) // the records the store holds
	)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		// What the run did: handler runs, records, and for a store that
		// batches, how many calls each transaction carried. Every call
		// has a new key, so runs and records match the calls answered.
		fmt.Fprintf(os.Stderr, "runs %d", srv.runs.Load())
		if count != nil {
			n, err := count()
			fmt.Fprintf(os.Stderr, ", records %d (%v)", n, err)
		}
		if br, ok := st.(idemstore.BatchReporter); ok {
			if bs, ok := br.BatchStats(); ok && bs.Batches > 0 {
				fmt.Fprintf(os.Stderr, ", batches %d carrying %.1f calls each, %d calls alone", bs.Batches, float64(bs.Batched)/float64(bs.Batches), bs.Alone)
			}
		}
		fmt.Fprintf(os.Stderr, ", %s", gcSplit())
		fmt.Fprintln(os.Stderr)
		if *cpuprofile != "" {
			pprof.StopCPUProfile()
		}
		if *memprofile != "" {
			f, err := os.Create(*memprofile)
			if err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}
		os.Exit(0)
	}()

	var opts []grpc.ServerOption
	if *store != "none" {
		switch *store {
		case "mem":
			mem := idemmem.MustNew(idemmem.Config{MaxRecords: *maxRecords})
			st, count = mem, func() (int64, error) { return int64(mem.Len()), nil }
		case "pg":
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, os.Getenv("IDEM_TEST_POSTGRES_URL"))
			if err != nil {
				log.Fatal(err)
			}
			cfg := idempg.Config{Schema: "idem_bench_grpc"}
			if err := idempg.Migrate(ctx, pool, cfg); err != nil {
				log.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "TRUNCATE idem_bench_grpc.idem_records"); err != nil {
				log.Fatal(err)
			}
			if st, err = idempg.New(pool, cfg); err != nil {
				log.Fatal(err)
			}
			count = func() (n int64, err error) {
				err = pool.QueryRow(ctx, "SELECT count(*) FROM idem_bench_grpc.idem_records").Scan(&n)
				return n, err
			}
		default:
			log.Fatalf("unknown store %q", *store)
		}
		e, err := idem.NewEngine(st, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler), Retention: *retention})
		if err != nil {
			log.Fatal(err)
		}
		opts = append(opts, grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(e, idemgrpc.Config{Scope: idemgrpc.GlobalScope})))
	}
	s := grpc.NewServer(opts...)
	testpb.RegisterPaymentsServer(s, srv)
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening", lis.Addr())
	log.Fatal(s.Serve(lis))
}

// gcSplit reports, from runtime/metrics, how many collections ran and
// what share of the process's CPU (the runtime's estimate, idle excluded)
// went to the garbage collector, and the heap's live size at the last one.
func gcSplit() string {
	s := []metrics.Sample{
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/cpu/classes/gc/total:cpu-seconds"},
		{Name: "/cpu/classes/total:cpu-seconds"},
		{Name: "/cpu/classes/idle:cpu-seconds"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	busy := s[2].Value.Float64() - s[3].Value.Float64()
	return fmt.Sprintf("gc %d cycles, %.0f%% of busy CPU, live heap %d MB", s[0].Value.Uint64(), 100*s[1].Value.Float64()/max(busy, 1e-9), s[4].Value.Uint64()>>20)
}
