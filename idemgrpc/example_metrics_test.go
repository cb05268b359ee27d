package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// Config.OnOutcome feeds metrics: here a Prometheus counter of protected
// calls by method, outcome, settlement and the code the client got, and a
// histogram of their duration by method. (The HTTP middleware's OnOutcome
// and idem serve's idem_proxy_requests_total use the same outcome and
// settlement names; idemconnect.Config.OnOutcome is the same hook, with
// Procedure for Method.)
func ExampleUnaryServerInterceptor_metrics() {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_idempotency_calls_total",
		Help: "Protected unary calls by method, idempotency outcome, settlement and status code.",
	}, []string{"method", "outcome", "settlement", "code"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "payments_idempotency_call_duration_seconds",
		Help: "Time spent in the idempotency interceptor and the handler, by method.",
	}, []string{"method"})
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(calls, duration)

	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(engine, idemgrpc.Config{
		Scope:   idemgrpc.GlobalScope,
		Require: []string{testpb.Payments_Charge_FullMethodName},
		OnOutcome: func(ev idemgrpc.Event) {
			calls.WithLabelValues(ev.Method, ev.Outcome, ev.Settlement, ev.Code.String()).Inc()
			duration.WithLabelValues(ev.Method).Observe(ev.Duration.Seconds())
		},
	})))
	testpb.RegisterPaymentsServer(srv, &exampleServer{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := testpb.NewPaymentsClient(conn)

	for _, id := range []string{"0190a0e0-0000-7000-8000-000000000001", "0190a0e0-0000-7000-8000-000000000001", ""} {
		_, _ = client.Charge(context.Background(), &testpb.ChargeRequest{Account: "acc_1", Amount: 500, RequestId: id})
	}
	const m = testpb.Payments_Charge_FullMethodName
	fmt.Println("acquired and completed:", testutil.ToFloat64(calls.WithLabelValues(m, "acquired", "completed", "OK")))
	fmt.Println("replayed:", testutil.ToFloat64(calls.WithLabelValues(m, "replayed", "", "OK")))
	fmt.Println("missing key:", testutil.ToFloat64(calls.WithLabelValues(m, "missing_key", "", "InvalidArgument")))
	// Output:
	// acquired and completed: 1
	// replayed: 1
	// missing key: 1
}
