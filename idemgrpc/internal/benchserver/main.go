// Command benchserver serves the test Payments service for
// scripts/bench-grpc.sh: bare, or behind idemgrpc's interceptor over the
// memory store or PostgreSQL (IDEM_TEST_POSTGRES_URL). It listens on
// loopback only. With -cpuprofile or -memprofile it writes the profiles
// when it gets SIGINT or SIGTERM. SIGUSR1 marks the start of a measured
// window: the collections and evictions it reports at exit count from the
// last mark.
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
		st      idemstore.Store
		count   func() (int64, error) // the records the store holds
		evicted func() int64          // the records the store evicted to make room
	)
	var opts []grpc.ServerOption
	if *store != "none" {
		switch *store {
		case "mem":
			mem := idemmem.MustNew(idemmem.Config{MaxRecords: *maxRecords})
			st, count = mem, func() (int64, error) { return int64(mem.Len()), nil }
			evicted = func() int64 { return mem.Usage().Evicted }
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
	// The signals are heard once the store is set up.
	// SIGUSR1 marks the start of the measured window (after a warm-up):
	// the collections and evictions reported at exit count from there.
	var mark atomic.Pointer[counters]
	mark.Store(&counters{})
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			mark.Store(counted(evicted))
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		// What the run did: handler runs (all of them, the warm-up's
		// too), records, and for a store that batches, how many calls
		// each transaction carried. Every call has a new key, so the
		// handler runs once per call.
		fmt.Fprintf(os.Stderr, "runs %d", srv.runs.Load())
		if count != nil {
			n, err := count()
			fmt.Fprintf(os.Stderr, ", records %d (%v)", n, err)
		}
		m, now := mark.Load(), counted(evicted)
		if evicted != nil {
			fmt.Fprintf(os.Stderr, ", %d evicted since the mark", now.evicted-m.evicted)
		}
		if br, ok := st.(idemstore.BatchReporter); ok {
			if bs, ok := br.BatchStats(); ok && bs.Batches > 0 {
				fmt.Fprintf(os.Stderr, ", batches %d carrying %.1f calls each, %d calls alone", bs.Batches, float64(bs.Batched)/float64(bs.Batches), bs.Alone)
			}
		}
		fmt.Fprintf(os.Stderr, ", %d collections since the mark, live heap %.1f MB", now.gcCycles-m.gcCycles, liveHeapMB())
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
	s := grpc.NewServer(opts...)
	testpb.RegisterPaymentsServer(s, srv)
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening", lis.Addr())
	log.Fatal(s.Serve(lis))
}

// counters are what the server had counted at the mark (SIGUSR1).
type counters struct {
	gcCycles uint64
	evicted  int64
}

// counted returns what the server has counted so far; evicted is the
// store's count of evictions, or nil.
func counted(evicted func() int64) *counters {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	c := &counters{gcCycles: s[0].Value.Uint64()}
	if evicted != nil {
		c.evicted = evicted()
	}
	return c
}

// liveHeapMB is the heap's live size at the last collection.
func liveHeapMB() float64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return float64(s[0].Value.Uint64()) / (1 << 20)
}
