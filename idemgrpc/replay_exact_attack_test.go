package idemgrpc_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// TestReplayOfWrappedError: a handler that returns a status wrapped in
// its own text (fmt.Errorf("…: %w", st.Err())) is answered by grpc-go with
// the whole text; the replay carries exactly what the first call got: the
// code, the message and the details.
func TestReplayOfWrappedError(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	st, err := status.New(codes.FailedPrecondition, "card declined").WithDetails(&errdetails.ErrorInfo{Reason: "DECLINED", Domain: "payments.example"})
	if err != nil {
		t.Fatal(err)
	}
	for i, handlerErr := range []error{
		fmt.Errorf("charging acc_1: %w", st.Err()),
		fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", st.Err())),
		st.Err(),
		fmt.Errorf("plain failure"),
		fmt.Errorf("charging: %w", context.DeadlineExceeded), // the call is alive: a downstream's
	} {
		ev.svc.charge = func(context.Context, *testpb.ChargeRequest, int64) (*testpb.Payment, error) { return nil, handlerErr }
		req := &testpb.ChargeRequest{Account: "a", Amount: 1, RequestId: uuid(700 + i)}
		_, first := ev.client.Charge(as("alice"), req)
		if e := ev.event(); e.Outcome != "acquired" {
			t.Fatalf("%d: %+v", i, e)
		}
		_, again := ev.client.Charge(as("alice"), req)
		if e := ev.event(); e.Outcome != "replayed" {
			// the ambiguous codes settle otherwise (TestDownstreamCodes)
			continue
		}
		if !proto.Equal(status.Convert(first).Proto(), status.Convert(again).Proto()) {
			t.Fatalf("%d: first %v, replay %v", i, status.Convert(first).Proto(), status.Convert(again).Proto())
		}
	}
	if n := ev.svc.runs.Load(); n < 4 {
		t.Fatalf("runs %d", n)
	}
}

// TestReplayOfMarkedError: a mark of idem.Retryable or idem.Ambiguous
// does not change what the client is told: the status inside, with the
// text of the wrappers around it.
func TestReplayOfMarkedError(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	st := status.New(codes.Internal, "provider timed out")
	ev.svc.charge = func(context.Context, *testpb.ChargeRequest, int64) (*testpb.Payment, error) {
		return nil, idem.Ambiguous(st.Err())
	}
	_, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a", RequestId: uuid(720)})
	if !proto.Equal(status.Convert(err).Proto(), st.Proto()) {
		t.Fatalf("got %v, want %v", status.Convert(err).Proto(), st.Proto())
	}
	if e := ev.event(); e.Settlement != "escalated" {
		t.Fatalf("%+v", e)
	}
}
