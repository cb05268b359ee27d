package idemgrpc_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// TestReplaysCarryTheirOwnMetadata: calls of different methods and
// message types run at once, some answering a plain message (whose stored
// header is shared per message type), some with header and trailer
// metadata, some with an error status and details. Every retry replays
// exactly its own first answer: the same message or status with its
// details, the same header and trailer metadata (none of another call's,
// method's or message type's), and the idempotent-replayed header, which
// no first call carries.
func TestReplaysCarryTheirOwnMetadata(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{Methods: map[string]idemgrpc.Policy{refundMethod: {}}}, envOptions{})
	ev.svc.charge = func(ctx context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		switch req.Account {
		case "meta":
			grpc.SetHeader(ctx, metadata.Pairs("x-h", req.RequestId))
			grpc.SetTrailer(ctx, metadata.Pairs("x-t", req.RequestId, "x-t", "second"))
		case "err":
			grpc.SetHeader(ctx, metadata.Pairs("x-h", "err-"+req.RequestId))
			st, _ := status.New(codes.FailedPrecondition, "no "+req.RequestId).WithDetails(&errdetails.ErrorInfo{Reason: "R", Domain: req.RequestId})
			return nil, st.Err()
		}
		return &testpb.Payment{Id: fmt.Sprint("pay_", run), Account: req.Account, Run: run}, nil
	}
	ev.svc.refund = func(ctx context.Context, req *testpb.RefundRequest, run int64) (*testpb.RefundResult, error) {
		if req.Charge != "plain" {
			grpc.SetHeader(ctx, metadata.Pairs("x-r", req.Charge))
			grpc.SetTrailer(ctx, metadata.Pairs("x-rt", req.Charge))
		}
		return &testpb.RefundResult{Id: fmt.Sprint("ref_", run), Run: run}, nil
	}

	type answer struct {
		msg             proto.Message
		st              *status.Status
		header, trailer metadata.MD
		replayed        bool
	}
	own := func(md metadata.MD) metadata.MD { // the handlers' own metadata
		out := metadata.MD{}
		for k, v := range md {
			if strings.HasPrefix(k, "x-") {
				out[k] = v
			}
		}
		return out
	}
	call := func(i int) answer {
		var h, tr metadata.MD
		var a answer
		var err error
		switch i % 5 {
		case 0, 1, 2:
			account := []string{"plain", "meta", "err"}[i%5]
			a.msg, err = ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: account, RequestId: uuid(i)}, grpc.Header(&h), grpc.Trailer(&tr))
		case 3:
			a.msg, err = ev.client.Refund(as("alice", fmt.Sprint("refund-", i)), &testpb.RefundRequest{Charge: fmt.Sprint("c", i)}, grpc.Header(&h), grpc.Trailer(&tr))
		default:
			a.msg, err = ev.client.Refund(as("alice", fmt.Sprint("refund-", i)), &testpb.RefundRequest{Charge: "plain"}, grpc.Header(&h), grpc.Trailer(&tr))
		}
		if err != nil {
			a.msg = nil
			a.st = status.Convert(err)
		}
		a.header, a.trailer, a.replayed = own(h), own(tr), idemgrpc.Replayed(h)
		return a
	}
	const calls = 30 // with their two retries each, fewer than the env's events buffer
	first := make([]answer, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { first[i] = call(i) })
	}
	wg.Wait()
	again := make([][2]answer, calls)
	for i := range calls {
		for j := range 2 {
			wg.Go(func() { again[i][j] = call(i) })
		}
	}
	wg.Wait()
	for i, f := range first {
		// The answers are what the handlers made: the test covers each kind.
		switch i % 5 {
		case 0, 4:
			if len(f.header) != 0 || len(f.trailer) != 0 || f.msg == nil {
				t.Errorf("call %d, a plain answer: %v, header %v trailer %v", i, f.msg, f.header, f.trailer)
			}
		case 1, 3:
			if len(f.header) != 1 || len(f.trailer) != 1 {
				t.Errorf("call %d, with metadata: header %v trailer %v", i, f.header, f.trailer)
			}
		case 2:
			if f.st.Code() != codes.FailedPrecondition || len(f.st.Details()) != 1 || len(f.header["x-h"]) != 1 {
				t.Errorf("call %d, an error: %v header %v", i, f.st, f.header)
			}
		}
		if f.replayed {
			t.Errorf("call %d: the first call says it was replayed", i)
		}
		for _, r := range again[i] {
			if !r.replayed {
				t.Errorf("call %d: a retry does not say it was replayed", i)
			}
			if !proto.Equal(f.msg, r.msg) || !proto.Equal(f.st.Proto(), r.st.Proto()) {
				t.Errorf("call %d: first %v %v, replayed %v %v", i, f.msg, f.st, r.msg, r.st)
			}
			if !maps.EqualFunc(f.header, r.header, slices.Equal) || !maps.EqualFunc(f.trailer, r.trailer, slices.Equal) {
				t.Errorf("call %d: first header %v trailer %v, replayed header %v trailer %v", i, f.header, f.trailer, r.header, r.trailer)
			}
		}
	}
	if n := ev.svc.runs.Load(); n != calls {
		t.Errorf("handlers ran %d times for %d keys", n, calls)
	}
}
