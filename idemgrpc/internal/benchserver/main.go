// Command benchserver serves the test Payments service for
// scripts/bench-grpc.sh: bare, or behind idemgrpc's interceptor over the
// memory store or PostgreSQL (IDEM_TEST_POSTGRES_URL). It listens on
// loopback only.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"sync/atomic"

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
	flag.Parse()
	var opts []grpc.ServerOption
	if *store != "none" {
		var st idemstore.Store
		switch *store {
		case "mem":
			st = idemmem.MustNew(idemmem.Config{MaxRecords: 10_000_000, MaxBytes: 8 << 30})
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
		default:
			log.Fatalf("unknown store %q", *store)
		}
		e, err := idem.NewEngine(st, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			log.Fatal(err)
		}
		opts = append(opts, grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(e, idemgrpc.Config{Scope: idemgrpc.GlobalScope})))
	}
	s := grpc.NewServer(opts...)
	testpb.RegisterPaymentsServer(s, &server{})
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening", lis.Addr())
	log.Fatal(s.Serve(lis))
}
