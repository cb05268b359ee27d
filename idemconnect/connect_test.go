package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemconnect"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/rpctest/testpb/testpbconnect"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.VerifyNoLeaks(m, testenv.LeakGrace)) }

var quiet = slog.New(slog.DiscardHandler)

// userScope reads the X-User header through connect's CallInfo.
func userScope(ctx context.Context) (string, error) {
	info, ok := connect.CallInfoForHandlerContext(ctx)
	if !ok || info.RequestHeader().Get("X-User") == "" {
		return "", idem.ErrScopeMissing
	}
	return "user:" + info.RequestHeader().Get("X-User"), nil
}

type payments struct {
	testpbconnect.UnimplementedPaymentsHandler
	runs atomic.Int64
	fail atomic.Int64 // calls that fail with UNAVAILABLE first
}

func (p *payments) Charge(_ context.Context, req *connect.Request[testpb.ChargeRequest]) (*connect.Response[testpb.Payment], error) {
	run := p.runs.Add(1)
	if p.fail.Add(-1) >= 0 {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("busy"))
	}
	if req.Msg.Account == "dial-timeout" { // a downstream's dial timed out
		return nil, fmt.Errorf("dialing the ledger: %w", os.ErrDeadlineExceeded)
	}
	if req.Msg.Account == "wrapped" {
		ce := connect.NewError(connect.CodeFailedPrecondition, errors.New("card declined"))
		if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "DECLINED", Domain: "payments.example"}); err == nil {
			ce.AddDetail(d)
		}
		return nil, fmt.Errorf("charging %s: %w", req.Msg.Account, ce)
	}
	if req.Msg.Account == "declined" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("card declined"))
	}
	res := connect.NewResponse(&testpb.Payment{Id: fmt.Sprintf("pay_%d", run), Amount: req.Msg.Amount, Run: run})
	res.Header().Set("X-Charge-Id", res.Msg.Id)
	return res, nil
}

func (p *payments) Ship(_ context.Context, req *connect.Request[testpb.ShipRequest]) (*connect.Response[testpb.Shipment], error) {
	run := p.runs.Add(1)
	return connect.NewResponse(&testpb.Shipment{Id: fmt.Sprintf("ship_%d", run), Order: req.Msg.Order, Run: run}), nil
}

// GetPayment has no side effects (idempotency_level NO_SIDE_EFFECTS); it
// reports in the payment's account how the call came (GET or POST).
func (p *payments) GetPayment(_ context.Context, req *connect.Request[testpb.GetPaymentRequest]) (*connect.Response[testpb.Payment], error) {
	run := p.runs.Add(1)
	return connect.NewResponse(&testpb.Payment{Id: req.Msg.Id, Account: req.HTTPMethod(), Run: run}), nil
}

// server is a Connect handler over an engine, served over HTTP/2 (TLS) by
// httptest, so that gRPC clients reach it too.
func server(t *testing.T, cfg idemconnect.Config) (*payments, *httptest.Server) {
	t.Helper()
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Scope, cfg.Logger = userScope, quiet
	icpt, err := idemconnect.NewInterceptor(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	svc := &payments{}
	mux := http.NewServeMux()
	mux.Handle(testpbconnect.NewPaymentsHandler(svc, connect.WithInterceptors(icpt)))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return svc, srv
}

func charge(ctx context.Context, c testpbconnect.PaymentsClient, user, key string, msg *testpb.ChargeRequest) (*connect.Response[testpb.Payment], error) {
	req := connect.NewRequest(msg)
	req.Header().Set("X-User", user)
	if key != "" {
		req.Header().Set("Idempotency-Key", key)
	}
	return c.Charge(ctx, req)
}

// TestProtocols: Connect, gRPC and gRPC-Web clients of one handler get the
// same answers: the first run, its replay (with Idempotent-Replayed), a
// reused key, a replayed error, a missing key; and a key first used over
// one protocol is replayed over another.
func TestProtocols(t *testing.T) {
	t.Parallel()
	svc, srv := server(t, idemconnect.Config{Require: []string{testpbconnect.PaymentsChargeProcedure}})
	ctx := context.Background()
	for i, opt := range []connect.ClientOption{connect.WithProtoJSON(), connect.WithGRPC(), connect.WithGRPCWeb()} {
		c := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, opt)
		key := fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", i)
		first, err := charge(ctx, c, "alice", key, &testpb.ChargeRequest{Account: "a", Amount: 5, Labels: map[string]string{"a": "1", "b": "2"}})
		if err != nil {
			t.Fatalf("protocol %d: %v", i, err)
		}
		again, err := charge(ctx, c, "alice", key, &testpb.ChargeRequest{Account: "a", Amount: 5, Labels: map[string]string{"b": "2", "a": "1"}})
		if err != nil || !proto.Equal(first.Msg, again.Msg) || !idemconnect.Replayed(again.Header()) || idemconnect.Replayed(first.Header()) || again.Header().Get("X-Charge-Id") != first.Msg.Id {
			t.Fatalf("protocol %d: replay %v %v %v", i, again, err, again.Header())
		}
		_, err = charge(ctx, c, "alice", key, &testpb.ChargeRequest{Account: "a", Amount: 6})
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || idemconnect.Reason(err) != idemconnect.ReasonKeyReused {
			t.Fatalf("protocol %d: reuse %v", i, err)
		}
		_, err = charge(ctx, c, "alice", "", &testpb.ChargeRequest{})
		if connect.CodeOf(err) != connect.CodeInvalidArgument || idemconnect.Reason(err) != idemconnect.ReasonKeyMissing {
			t.Fatalf("protocol %d: missing %v", i, err)
		}
		for j := 0; j < 2; j++ {
			_, err = charge(ctx, c, "alice", key+"-declined", &testpb.ChargeRequest{Account: "declined"})
			if connect.CodeOf(err) != connect.CodeInvalidArgument || err.(*connect.Error).Message() != "card declined" {
				t.Fatalf("protocol %d: declined %v", i, err)
			}
		}
		if !idemconnect.Replayed(err.(*connect.Error).Meta()) {
			t.Fatalf("protocol %d: the replayed error has no Idempotent-Replayed: %v", i, err.(*connect.Error).Meta())
		}
	}
	// The key of the Connect call, replayed to a gRPC client.
	grpcClient := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, connect.WithGRPC())
	again, err := charge(ctx, grpcClient, "alice", "0190a0e0-0000-7000-8000-000000000000", &testpb.ChargeRequest{Account: "a", Amount: 5, Labels: map[string]string{"a": "1", "b": "2"}})
	if err != nil || again.Msg.Run != 1 || !idemconnect.Replayed(again.Header()) {
		t.Fatalf("across protocols: %v %v", again, err)
	}
	if n := svc.runs.Load(); n != 6 { // one charge and one declined per protocol
		t.Fatalf("runs %d, want 6", n)
	}
}

// TestClientInterceptor: the client interceptor gives the call one key,
// in the Idempotency-Key header, and retries UNAVAILABLE with it: the
// handler released the key, and runs again under the same one.
func TestClientInterceptor(t *testing.T) {
	t.Parallel()
	svc, srv := server(t, idemconnect.Config{})
	svc.fail.Store(2)
	ci, err := idemconnect.NewClientInterceptor(idemconnect.ClientConfig{BaseDelay: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, connect.WithInterceptors(ci))
	var info idemconnect.CallInfo
	ctx := idemconnect.WithCallInfo(context.Background(), &info)
	res, err := charge(ctx, c, "alice", "", &testpb.ChargeRequest{Account: "a"})
	if err != nil || res.Msg.Run != 3 || info.Attempts != 3 || info.Key == "" {
		t.Fatalf("%v %v %+v", res, err, info)
	}
	res, err = charge(idemconnect.WithKey(ctx, info.Key), c, "alice", "", &testpb.ChargeRequest{Account: "a"})
	if err != nil || res.Msg.Run != 3 || !info.Replayed {
		t.Fatalf("again: %v %v %+v", res, err, info)
	}
}

// TestReplayOfWrappedError: a handler's *connect.Error wrapped in its own
// text is replayed as the client first got it, over every protocol: the
// code, the message and the details.
func TestReplayOfWrappedError(t *testing.T) {
	t.Parallel()
	svc, srv := server(t, idemconnect.Config{Require: []string{testpbconnect.PaymentsChargeProcedure}})
	ctx := context.Background()
	for i, opt := range []connect.ClientOption{connect.WithProtoJSON(), connect.WithGRPC(), connect.WithGRPCWeb()} {
		c := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, opt)
		key := fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", 800+i)
		var got [2]*connect.Error
		for try := range got {
			_, err := charge(ctx, c, "alice", key, &testpb.ChargeRequest{Account: "wrapped"})
			if !errors.As(err, &got[try]) {
				t.Fatalf("%d: try %d: %v", i, try, err)
			}
		}
		a, b := got[0], got[1]
		if a.Code() != b.Code() || a.Message() != b.Message() || len(a.Details()) != 1 || len(b.Details()) != 1 ||
			a.Details()[0].Type() != b.Details()[0].Type() || string(a.Details()[0].Bytes()) != string(b.Details()[0].Bytes()) {
			t.Fatalf("%d: first %v %v, replay %v %v", i, a, a.Details(), b, b.Details())
		}
		if !idemconnect.Replayed(b.Meta()) {
			t.Fatalf("%d: the second answer is not a replay", i)
		}
	}
	if n := svc.runs.Load(); n != 3 {
		t.Fatalf("runs %d, want 3", n)
	}
}

// TestDownstreamDeadline: a handler that fails with a downstream's net
// deadline (os.ErrDeadlineExceeded, as a dial returns it) is answered
// DEADLINE_EXCEEDED by connect, an outcome that is unknown: the key goes
// to review, and the retry gets NEEDS_REVIEW rather than a stored UNKNOWN
// the client never saw.
func TestDownstreamDeadline(t *testing.T) {
	t.Parallel()
	svc, srv := server(t, idemconnect.Config{})
	c := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL)
	key := "0190a0e0-0000-7000-8000-000000000900"
	_, err := charge(context.Background(), c, "alice", key, &testpb.ChargeRequest{Account: "dial-timeout"})
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("first call: %v", err)
	}
	_, err = charge(context.Background(), c, "alice", key, &testpb.ChargeRequest{Account: "dial-timeout"})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !idemconnect.NeedsReview(err) {
		t.Fatalf("retry: %v, want NEEDS_REVIEW", err)
	}
	if n := svc.runs.Load(); n != 1 {
		t.Fatalf("runs %d", n)
	}
}
