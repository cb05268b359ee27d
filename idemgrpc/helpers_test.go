package idemgrpc_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/testenv"
)

// quiet drops the logs of the faults the tests make on purpose.
var quiet = slog.New(slog.DiscardHandler)

func TestMain(m *testing.M) { os.Exit(testenv.VerifyNoLeaks(m, testenv.LeakGrace)) }

// userScope scopes keys by the x-user metadata, as an auth interceptor
// would; "banned" is refused with PERMISSION_DENIED.
func userScope(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	switch u := md.Get("x-user"); {
	case len(u) == 0:
		return "", idem.ErrScopeMissing
	case u[0] == "banned":
		return "", status.Error(codes.PermissionDenied, "banned")
	default:
		return "user:" + u[0], nil
	}
}

// payments is the test service: each method counts its runs and answers
// with the run number, unless the test replaces it.
type payments struct {
	testpb.UnimplementedPaymentsServer
	runs   atomic.Int64
	mu     sync.Mutex
	keys   []string // the keys the handlers saw, in order
	charge func(ctx context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error)
	refund func(ctx context.Context, req *testpb.RefundRequest, run int64) (*testpb.RefundResult, error)
}

func (p *payments) saw(ctx context.Context, key string) int64 {
	if md, _ := metadata.FromIncomingContext(ctx); key == "" && len(md.Get("idempotency-key")) > 0 {
		key = md.Get("idempotency-key")[0]
	}
	p.mu.Lock()
	p.keys = append(p.keys, key)
	p.mu.Unlock()
	return p.runs.Add(1)
}

func (p *payments) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys...)
}

func (p *payments) Charge(ctx context.Context, req *testpb.ChargeRequest) (*testpb.Payment, error) {
	run := p.saw(ctx, req.GetRequestId())
	if p.charge != nil {
		return p.charge(ctx, req, run)
	}
	return &testpb.Payment{Id: fmt.Sprintf("pay_%d", run), Account: req.GetAccount(), Amount: req.GetAmount(), Run: run}, nil
}

func (p *payments) Ship(ctx context.Context, req *testpb.ShipRequest) (*testpb.Shipment, error) {
	run := p.saw(ctx, req.GetIdempotencyKey().GetKey())
	return &testpb.Shipment{Id: fmt.Sprintf("ship_%d", run), Order: req.GetOrder(), Run: run}, nil
}

func (p *payments) Refund(ctx context.Context, req *testpb.RefundRequest) (*testpb.RefundResult, error) {
	run := p.saw(ctx, "")
	if p.refund != nil {
		return p.refund(ctx, req, run)
	}
	return &testpb.RefundResult{Id: fmt.Sprintf("ref_%d", run), Run: run}, nil
}

func (p *payments) Order(ctx context.Context, req *testpb.OrderRequest) (*testpb.Payment, error) {
	run := p.saw(ctx, req.GetRequestId())
	return &testpb.Payment{Id: fmt.Sprintf("order_%d", run), Run: run}, nil
}

func (p *payments) GetPayment(ctx context.Context, req *testpb.GetPaymentRequest) (*testpb.Payment, error) {
	return &testpb.Payment{Id: req.GetId(), Run: p.saw(ctx, req.GetRequestId())}, nil
}

const (
	getMethod    = "/idem.test.v1.Payments/GetPayment"
	chargeMethod = "/idem.test.v1.Payments/Charge"
	shipMethod   = "/idem.test.v1.Payments/Ship"
	refundMethod = "/idem.test.v1.Payments/Refund"
	orderMethod  = "/idem.test.v1.Payments/Order"
	watchMethod  = "/idem.test.v1.Payments/Watch"
)

// env is a real gRPC server on loopback TCP, protected by the interceptor
// over an engine, and a client connected to it.
type env struct {
	t      *testing.T
	store  idemstore.Store
	engine *idem.Engine
	svc    *payments
	server *grpc.Server
	addr   string
	conn   *grpc.ClientConn
	client testpb.PaymentsClient
	events chan idemgrpc.Event
}

type envOptions struct {
	store  idemstore.Store // defaults to a memory store
	engine idem.EngineConfig
	server []grpc.ServerOption
	outer  []grpc.UnaryServerInterceptor // before idem's (recovery, kill switches)
	client []grpc.DialOption
}

func newEnv(t *testing.T, cfg idemgrpc.Config, o envOptions) *env {
	t.Helper()
	if o.store == nil {
		mem := idemmem.MustNew(idemmem.Config{})
		t.Cleanup(func() { mem.Close() })
		o.store = mem
	}
	if o.engine.Logger == nil {
		o.engine.Logger = quiet
	}
	e, err := idem.NewEngine(o.store, o.engine)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Scope == nil {
		cfg.Scope = userScope
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	ev := &env{t: t, store: o.store, engine: e, svc: &payments{}, events: make(chan idemgrpc.Event, 100)}
	on := cfg.OnOutcome
	cfg.OnOutcome = func(e idemgrpc.Event) {
		if on != nil {
			on(e)
		}
		ev.events <- e
	}
	icpt, err := idemgrpc.NewUnaryServerInterceptor(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ev.server = grpc.NewServer(append(o.server, grpc.ChainUnaryInterceptor(append(o.outer, icpt)...))...)
	testpb.RegisterPaymentsServer(ev.server, ev.svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ev.addr = lis.Addr().String()
	go ev.server.Serve(lis)
	t.Cleanup(ev.server.Stop)
	ev.conn, err = grpc.NewClient(ev.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, o.client...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.conn.Close() })
	ev.client = testpb.NewPaymentsClient(ev.conn)
	return ev
}

// event returns the next outcome the interceptor reported.
func (ev *env) event() idemgrpc.Event {
	ev.t.Helper()
	return <-ev.events
}

// as returns ctx with the x-user metadata of user, and the key in the
// idempotency-key metadata when it is not empty.
func as(user string, keys ...string) context.Context {
	md := metadata.MD{}
	if user != "" {
		md.Set("x-user", user)
	}
	if len(keys) > 0 {
		md["idempotency-key"] = keys
	}
	return metadata.NewOutgoingContext(context.Background(), md)
}

// wantCode fails unless err is a status with code c and, when reason is
// not empty, idem's ErrorInfo reason.
func wantCode(t *testing.T, err error, c codes.Code, reason string) {
	t.Helper()
	if got := status.Code(err); got != c {
		t.Fatalf("code %v (%v), want %v", got, err, c)
	}
	if got := idemgrpc.Reason(err); got != reason {
		t.Fatalf("reason %q (%v), want %q", got, err, reason)
	}
}

// uuid returns a fixed UUID per n, for request_id fields.
func uuid(n int) string { return fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", n) }

// failing is a store whose Reserve, Complete or Get fail while their
// switches are on (each turns off after failing once when onceOnly).
type failing struct {
	idemstore.Store
	reserve, complete atomic.Int32 // how many more calls fail
}

var errBlip = fmt.Errorf("blip: %w", idemstore.ErrUnavailable)

func (f *failing) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if f.reserve.Add(-1) >= 0 {
		return nil, false, errBlip
	}
	return f.Store.Reserve(ctx, p)
}

func (f *failing) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if f.complete.Add(-1) >= 0 {
		return errBlip
	}
	return f.Store.Complete(ctx, p)
}

func memStore(t *testing.T) *idemmem.Store {
	s := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { s.Close() })
	return s
}
