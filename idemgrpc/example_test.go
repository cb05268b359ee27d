package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

type exampleServer struct {
	testpb.UnimplementedPaymentsServer
	runs int64
}

func (s *exampleServer) Charge(_ context.Context, req *testpb.ChargeRequest) (*testpb.Payment, error) {
	s.runs++
	return &testpb.Payment{Id: fmt.Sprintf("pay_%d", s.runs), Amount: req.Amount, Run: s.runs}, nil
}

// A server protects its methods with request_id fields; a client sends the
// same call twice with one key (WithKey), and the second gets the first
// answer, replayed.
func ExampleUnaryServerInterceptor() {
	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(engine, idemgrpc.Config{Scope: idemgrpc.GlobalScope})))
	testpb.RegisterPaymentsServer(srv, &exampleServer{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{})))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := testpb.NewPaymentsClient(conn)
	for i := 0; i < 2; i++ {
		var info idemgrpc.CallInfo
		p, err := client.Charge(context.Background(), &testpb.ChargeRequest{Account: "acc_1", Amount: 500},
			idemgrpc.WithKey("0190a0e0-0000-7000-8000-000000000001"), idemgrpc.WithCallInfo(&info))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(p.Id, "replayed:", info.Replayed)
	}
	// Output:
	// pay_1 replayed: false
	// pay_1 replayed: true
}
