package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// ackLost is a store whose first Complete is applied and then reported
// failed, as when the reply of a commit is lost.
type ackLost struct {
	idemstore.Store
	once sync.Once
}

func (s *ackLost) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	err := s.Store.Complete(ctx, p)
	s.once.Do(func() {
		if err == nil {
			err = errBlip
		}
	})
	return err
}

// TestCompleteAckLost: the store applied the answer but its reply was
// lost. The interceptor reads the record back, finds its own answer, and
// counts the call as completed: the client gets its answer and the retry
// replays it.
func TestCompleteAckLost(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: &ackLost{Store: memStore(t)}})
	p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a", RequestId: uuid(1)})
	if err != nil || p.Run != 1 {
		t.Fatal(p, err)
	}
	if e := ev.event(); e.Settlement != "completed" {
		t.Fatalf("%+v", e)
	}
	var h metadata.MD
	again, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a", RequestId: uuid(1)}, grpc.Header(&h))
	if err != nil || !proto.Equal(p, again) || !idemgrpc.Replayed(h) {
		t.Fatalf("retry %v %v %v", again, err, h)
	}
}

// TestLargeMetadata: the metadata a handler sets is stored with its
// message, so it counts against EngineConfig.MaxResponseBody: over it,
// the call runs once and its retry is told the answer was not kept,
// instead of a record of any size. Large metadata sent by a client is
// neither stored nor part of the fingerprint.
func TestLargeMetadata(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	ev := newEnv(t, idemgrpc.Config{Methods: map[string]idemgrpc.Policy{refundMethod: {}}}, envOptions{engine: idem.EngineConfig{MaxResponseBody: limit}})
	ev.svc.charge = func(ctx context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		size := limit - 200
		if req.Account == "big" {
			size = limit + 1
		}
		grpc.SetHeader(ctx, metadata.Pairs("x-big", strings.Repeat("m", size)))
		return &testpb.Payment{Run: run}, nil
	}
	var h metadata.MD
	for i, account := range []string{"small", "big"} {
		p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: account, RequestId: uuid(i)}, grpc.Header(&h))
		if err != nil || len(h.Get("x-big")) != 1 || len(h.Get("x-big")[0]) < limit-200 {
			t.Fatalf("%s: %v %v, header of %d values", account, p, err, len(h.Get("x-big")))
		}
	}
	if p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "small", RequestId: uuid(0)}, grpc.Header(&h)); err != nil || p.Run != 1 || !idemgrpc.Replayed(h) || len(h.Get("x-big")[0]) != limit-200 {
		t.Fatalf("small: replay %v %v", p, err)
	}
	_, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "big", RequestId: uuid(1)})
	wantCode(t, err, codes.AlreadyExists, idemgrpc.ReasonNotReplayable)

	// A client's large metadata: the call runs once, and a retry without it
	// replays, without it.
	junk := metadata.AppendToOutgoingContext(as("alice", "refund-1"), "x-junk", strings.Repeat("j", 1<<20))
	if p, err := ev.client.Refund(junk, &testpb.RefundRequest{Charge: "c"}); err != nil || p.Run != 3 {
		t.Fatalf("refund: %v %v", p, err)
	}
	if p, err := ev.client.Refund(as("alice", "refund-1"), &testpb.RefundRequest{Charge: "c"}, grpc.Header(&h)); err != nil || p.Run != 3 || !idemgrpc.Replayed(h) || len(h.Get("x-junk")) != 0 {
		t.Fatalf("refund, retried: %v %v %v", p, err, len(h.Get("x-junk")))
	}
	if n := ev.svc.runs.Load(); n != 3 {
		t.Fatalf("runs %d, want 3", n)
	}
}

// TestResponseAtMaxSize: an answer of exactly EngineConfig.MaxResponseBody
// bytes is stored and replayed, one byte more is not kept; an answer of
// exactly the client's receive limit reaches it, first and replayed, and
// one byte more fails both times with RESOURCE_EXHAUSTED, without a second
// run.
func TestResponseAtMaxSize(t *testing.T) {
	t.Parallel()
	const stored, recv = 32 << 10, 48 << 10
	ev := newEnv(t, idemgrpc.Config{}, envOptions{
		engine: idem.EngineConfig{MaxResponseBody: stored},
		client: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(recv))},
		server: []grpc.ServerOption{grpc.MaxSendMsgSize(1 << 20)},
	})
	// Amount is the size the answer must have.
	ev.svc.charge = func(_ context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		p := &testpb.Payment{Run: run}
		p.Note = make([]byte, int(req.Amount)-proto.Size(p)-4)
		for proto.Size(p) < int(req.Amount) {
			p.Note = append(p.Note, 0)
		}
		if proto.Size(p) != int(req.Amount) {
			return nil, errors.New("no message of that size")
		}
		return p, nil
	}
	for i, tc := range []struct {
		size  int64
		retry codes.Code
	}{
		{stored, codes.OK},
		{stored + 1, codes.AlreadyExists}, // NOT_REPLAYABLE
	} {
		req := &testpb.ChargeRequest{Amount: tc.size, RequestId: uuid(i)}
		if _, err := ev.client.Charge(as("alice"), req); err != nil {
			t.Fatalf("%d bytes: %v", tc.size, err)
		}
		if p, err := ev.client.Charge(as("alice"), req); status.Code(err) != tc.retry || (err == nil && p.Run != 1) {
			t.Fatalf("%d bytes, retry: %v %v", tc.size, p, err)
		}
	}

	// The client's receive limit, with an engine that keeps answers that large.
	ev2 := newEnv(t, idemgrpc.Config{}, envOptions{
		engine: idem.EngineConfig{MaxResponseBody: 1 << 20},
		client: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(recv))},
	})
	ev2.svc.charge = ev.svc.charge
	for i, size := range []int64{recv, recv + 1} {
		req := &testpb.ChargeRequest{Amount: size, RequestId: uuid(10 + i)}
		for try := 0; try < 2; try++ {
			p, err := ev2.client.Charge(as("alice"), req)
			switch {
			case size == recv && (err != nil || p.Run != int64(1)):
				t.Fatalf("%d bytes, try %d: %v", size, try, err)
			case size > recv && status.Code(err) != codes.ResourceExhausted:
				t.Fatalf("%d bytes, try %d: %v, want RESOURCE_EXHAUSTED", size, try, err)
			}
		}
	}
	if n := ev2.svc.runs.Load(); n != 2 {
		t.Fatalf("runs %d, want 2", n)
	}
}
