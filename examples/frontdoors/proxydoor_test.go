package frontdoors_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// upstreamPayments is a gRPC service with no idem of its own: idem serve
// protects it. Its ambiguous failure is DEADLINE_EXCEEDED, the code whose
// effect is unknown, as a service that timed out on a downstream call
// answers.
type upstreamPayments struct {
	testpb.UnimplementedPaymentsServer
	b *behaviour
}

func (p upstreamPayments) Charge(_ context.Context, req *testpb.ChargeRequest) (*testpb.Payment, error) {
	return rpcCharge(p.b, req, func(c codes.Code, msg string) error {
		if c == codes.Internal {
			c = codes.DeadlineExceeded
		}
		return status.Error(c, msg)
	})
}

// proxyDoor: idem serve in front of a plain gRPC server over h2c, called
// by a gRPC client over h2c.
func proxyDoor(t *testing.T) *door {
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	d := &door{name: "proxy", b: newBehaviour(), down: new(atomic.Bool)}
	s := grpc.NewServer()
	testpb.RegisterPaymentsServer(s, upstreamPayments{b: d.b})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	cfg, err := idemproxy.ParseConfig([]byte("upstream: h2c://" + lis.Addr().String() + "\nlisten: 127.0.0.1:0\nscope_header: X-User\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &idemproxy.Server{Config: cfg, Store: downStore{mem, d.down}, Logger: quiet}
	ready := make(chan net.Addr, 1)
	srv.Ready = func(p, _ net.Addr) { ready <- p }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := testpb.NewPaymentsClient(conn)
	d.call = func(key, account string, amount int64) string {
		var hdr metadata.MD
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "alice", "idempotency-key", key)
		_, err := c.Charge(ctx, &testpb.ChargeRequest{Account: account, Amount: amount}, grpc.Header(&hdr))
		_, retry := idemgrpc.RetryDelay(err)
		return rpcVerdict(status.Code(err), idemgrpc.Reason(err), retry, idemgrpc.Replayed(hdr))
	}
	return d
}
