package idemproxy_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

func keyed(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", key)
}

// reasonOf is the reason of idem's ErrorInfo in err, or "".
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == "idem.github.com/idem-dev" {
			return info.GetReason()
		}
	}
	return ""
}

// TestGRPCReplaysTheWholeAnswer: a retry of a unary gRPC call gets what
// the first call got, headers, message and trailers, plus
// idempotent-replayed, and the upstream runs once; with descriptors and
// without.
func TestGRPCReplaysTheWholeAnswer(t *testing.T) {
	t.Parallel()
	for _, withDesc := range []bool{false, true} {
		t.Run(map[bool]string{false: "bytes", true: "descriptors"}[withDesc], func(t *testing.T) {
			t.Parallel()
			yaml := ""
			if withDesc {
				yaml = "proto_descriptor_set: " + descriptorSet(t) + "\n"
			}
			env := startRPC(t, yaml)
			c := env.grpcClient(t)
			call := func() (*testpb.Payment, metadata.MD, metadata.MD) {
				t.Helper()
				var hdr, tr metadata.MD
				p, err := c.Charge(keyed("k1"), &testpb.ChargeRequest{Account: "a", Amount: 5}, grpc.Header(&hdr), grpc.Trailer(&tr))
				if err != nil {
					t.Fatal(err)
				}
				return p, hdr, tr
			}
			p1, h1, t1 := call()
			p2, h2, t2 := call()
			if p1.GetRun() != 1 || p2.GetRun() != 1 || p2.GetId() != "p-a" {
				t.Errorf("answers %v then %v", p1, p2)
			}
			if len(h1["idempotent-replayed"]) != 0 || h2.Get("idempotent-replayed")[0] != "true" {
				t.Errorf("idempotent-replayed: first %v, retry %v", h1["idempotent-replayed"], h2["idempotent-replayed"])
			}
			if h2.Get("x-charge")[0] != "yes" || h1.Get("x-charge")[0] != "yes" {
				t.Errorf("header metadata: %v, %v", h1, h2)
			}
			if len(t1.Get("x-ledger")) != 1 || len(t2.Get("x-ledger")) != 1 || t1.Get("x-ledger")[0] != t2.Get("x-ledger")[0] {
				t.Errorf("trailers: first %v, retry %v", t1, t2)
			}
			if n := env.pay.runsOf("a"); n != 1 {
				t.Errorf("the upstream ran %d times", n)
			}
		})
	}
}

// TestGRPCReplaysAnErrorWithDetails: an error answer is stored with its
// status details and trailers, and replayed as it was.
func TestGRPCReplaysAnErrorWithDetails(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	c := env.grpcClient(t)
	var errs [2]error
	var trs [2]metadata.MD
	for i := range errs {
		_, errs[i] = c.Charge(keyed("k-declined"), &testpb.ChargeRequest{Account: "declined"}, grpc.Trailer(&trs[i]))
	}
	for i, err := range errs {
		st := status.Convert(err)
		if st.Code() != codes.FailedPrecondition || st.Message() != "card declined" {
			t.Fatalf("call %d: %v", i, err)
		}
		var info *errdetails.ErrorInfo
		for _, d := range st.Details() {
			if e, ok := d.(*errdetails.ErrorInfo); ok {
				info = e
			}
		}
		if info.GetReason() != "DECLINED" {
			t.Errorf("call %d: details %v", i, st.Details())
		}
		if len(trs[i].Get("x-decline")) != 1 {
			t.Errorf("call %d: trailers %v", i, trs[i])
		}
	}
	if got := trs[1].Get("idempotent-replayed"); len(got) != 1 || got[0] != "true" {
		t.Errorf("a replayed error is not marked: %v", trs[1])
	}
	if n := env.pay.runsOf("declined"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCOutcomes: idem's own answers are gRPC statuses with the codes
// and reasons of idemgrpc's table.
func TestGRPCOutcomes(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "proto_descriptor_set: "+descriptorSet(t)+"\n")
	c := env.grpcClient(t)
	ctx := context.Background()

	if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "a"}); status.Code(err) != codes.InvalidArgument || reasonOf(err) != "KEY_MISSING" {
		t.Errorf("no key: %v (%s)", err, reasonOf(err))
	}
	if _, err := c.Charge(keyed("bad key"), &testpb.ChargeRequest{Account: "a"}); status.Code(err) != codes.InvalidArgument || reasonOf(err) != "KEY_INVALID" {
		t.Errorf("invalid key: %v", err)
	}
	if _, err := c.Charge(keyed("m1"), &testpb.ChargeRequest{Account: "a", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Charge(keyed("m1"), &testpb.ChargeRequest{Account: "a", Amount: 2}); status.Code(err) != codes.FailedPrecondition || reasonOf(err) != "KEY_REUSED" {
		t.Errorf("mismatch: %v", err)
	}
	// AIP-155: the key in request_id, with descriptors.
	rid := "0b0b8a52-9f1e-4c6b-9d59-6f0f3e0e1a11"
	p1, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "rid", RequestId: rid})
	if err != nil {
		t.Fatal(err)
	}
	var hdr metadata.MD
	p2, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "rid", RequestId: rid, Labels: map[string]string{}}, grpc.Header(&hdr))
	if err != nil || p1.GetRun() != 1 || p2.GetRun() != 1 || len(hdr.Get("idempotent-replayed")) != 1 {
		t.Errorf("request_id retry: %v %v %v %v", p1, p2, err, hdr)
	}
	// AEP-155 idempotency_key.
	for range 2 {
		if s, err := c.Ship(ctx, &testpb.ShipRequest{Order: "o", IdempotencyKey: &testpb.IdempotencyKey{Key: "ship-1", FirstSent: nowTS()}}); err != nil || s.GetRun() != 1 {
			t.Errorf("idempotency_key: %v %v", s, err)
		}
	}
	// Nothing happened (UNAVAILABLE): released, the retry runs.
	if _, err := c.Charge(keyed("f1"), &testpb.ChargeRequest{Account: "flaky"}); status.Code(err) != codes.Unavailable {
		t.Errorf("flaky first: %v", err)
	}
	if p, err := c.Charge(keyed("f1"), &testpb.ChargeRequest{Account: "flaky"}); err != nil || p.GetRun() != 2 {
		t.Errorf("flaky retry: %v %v", p, err)
	}
	// Effect unknown (DEADLINE_EXCEEDED): passed on, then review.
	if _, err := c.Charge(keyed("amb"), &testpb.ChargeRequest{Account: "ambiguous"}); status.Code(err) != codes.DeadlineExceeded || reasonOf(err) != "" {
		t.Errorf("ambiguous first: %v", err)
	}
	if _, err := c.Charge(keyed("amb"), &testpb.ChargeRequest{Account: "ambiguous"}); status.Code(err) != codes.FailedPrecondition || reasonOf(err) != "NEEDS_REVIEW" {
		t.Errorf("ambiguous retry: %v", err)
	}
	// The store is down: UNAVAILABLE with RetryInfo, nothing ran.
	env.down.Store(true)
	_, err = c.Charge(keyed("down"), &testpb.ChargeRequest{Account: "down"})
	env.down.Store(false)
	if status.Code(err) != codes.Unavailable || reasonOf(err) != "STORE_UNAVAILABLE" || !hasRetryInfo(err) || env.pay.runsOf("down") != 0 {
		t.Errorf("store down: %v", err)
	}
}

// TestGRPCOptionalKey: on a route with optional_key, a call without a key
// runs unprotected, with its message whole (idem read it to look for a
// key field).
func TestGRPCOptionalKey(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "optional_key: true\nproto_descriptor_set: "+descriptorSet(t)+"\n")
	c := env.grpcClient(t)
	for i := range 2 {
		p, err := c.Charge(context.Background(), &testpb.ChargeRequest{Account: "opt", Amount: 42})
		if err != nil || p.GetAmount() != 42 || p.GetRun() != int64(i+1) {
			t.Errorf("call %d without a key: %v %v", i, p, err)
		}
	}
}

func hasRetryInfo(err error) bool {
	for _, d := range status.Convert(err).Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			return true
		}
	}
	return false
}

// TestGRPCConcurrentDuplicatesRunOnce: 16 calls with one key at once; the
// upstream runs one, every caller gets its answer.
func TestGRPCConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	c := env.grpcClient(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			p, err := c.Charge(keyed("dup"), &testpb.ChargeRequest{Account: "block"})
			if err == nil && p.GetRun() != 1 {
				err = errors.New("another run's answer")
			}
			errs <- err
		})
	}
	<-env.pay.entered
	close(env.pay.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := env.pay.runsOf("block"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCResetAfterHeadersGoesToReview: an upstream that had the call and
// reset its stream after the headers, before any trailers: the outcome is
// unknown, so the key waits for review, and the retry does not run it.
func TestGRPCResetAfterHeadersGoesToReview(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	c := env.grpcClient(t)
	ctx := metadata.AppendToOutgoingContext(keyed("r1"), "x-test-reset", "1")
	_, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "x"})
	if status.Code(err) != codes.Unknown || reasonOf(err) != "UPSTREAM_FAILED" {
		t.Errorf("reset: %v (%s)", err, reasonOf(err))
	}
	_, err = c.Charge(ctx, &testpb.ChargeRequest{Account: "x"})
	if status.Code(err) != codes.FailedPrecondition || reasonOf(err) != "NEEDS_REVIEW" {
		t.Errorf("retry after a reset: %v", err)
	}
	if n := env.pay.runsOf("reset"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCStreamingPassesThrough: a server-streaming call passes through
// unbuffered and unprotected; one with a key is counted; a route with
// grpc_streams: refuse refuses it.
func TestGRPCStreamingPassesThrough(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "proto_descriptor_set: "+descriptorSet(t)+"\n")
	c := env.grpcClient(t)
	for range 2 {
		s, err := c.Watch(keyed("w1"), &testpb.WatchRequest{Account: "e"})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			if _, err := s.Recv(); err != nil {
				break
			}
			n++
		}
		if n != 3 {
			t.Errorf("%d events, want 3", n)
		}
	}
	if n := env.pay.runsOf("watch"); n != 2 {
		t.Errorf("the stream ran %d times, want 2 (streams are not protected)", n)
	}
	if got := env.metric(t, "idem_proxy_grpc_streaming_keys_total"); got != 2 {
		t.Errorf("streaming calls with a key counted %v times", got)
	}

	refusing := startRPC(t, "proto_descriptor_set: "+descriptorSet(t)+"\ngrpc_streams: refuse\n")
	s, err := refusing.grpcClient(t).Watch(keyed("w1"), &testpb.WatchRequest{Account: "e"})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition || reasonOf(err) != "METHOD_UNPROTECTED" || refusing.pay.runsOf("watch") != 0 {
		t.Errorf("refused stream: %v", err)
	}
}

// TestConnectAndGRPCWebOverHTTP1: Connect unary and gRPC-Web calls from
// HTTP/1.1 clients are protected and replayed, trailers included; with
// descriptors, a retry in another protocol or codec gets the first answer
// in its own.
func TestConnectAndGRPCWebOverHTTP1(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "proto_descriptor_set: "+descriptorSet(t)+"\n")
	clients := map[string]func() (*testpb.Payment, string, string, error){}
	for name, opts := range map[string][]connect.ClientOption{
		"connect":      nil,
		"connect-json": {connect.WithProtoJSON()},
		"grpc-web":     {connect.WithGRPCWeb()},
	} {
		c := env.connectClient(t, opts...)
		clients[name] = func() (*testpb.Payment, string, string, error) {
			req := connect.NewRequest(&testpb.ChargeRequest{Account: "web", Amount: 7})
			req.Header().Set("Idempotency-Key", "web-1")
			res, err := c.Charge(context.Background(), req)
			if err != nil {
				return nil, "", "", err
			}
			return res.Msg, res.Header().Get("Idempotent-Replayed"), res.Trailer().Get("X-Ledger"), nil
		}
	}
	first, replayed, ledger, err := clients["connect"]()
	if err != nil || first.GetRun() != 1 || replayed != "" || ledger != "entry-1" {
		t.Fatalf("first Connect call: %v %q %q %v", first, replayed, ledger, err)
	}
	for _, name := range []string{"connect", "connect-json", "grpc-web"} {
		p, replayed, ledger, err := clients[name]()
		if err != nil || p.GetRun() != 1 || p.GetAmount() != 7 || replayed != "true" || ledger != "entry-1" {
			t.Errorf("%s retry: %v replayed %q trailer %q, %v", name, p, replayed, ledger, err)
		}
	}
	if n := env.pay.runsOf("web"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
	// A Connect error answer: its code and details as the client sees them.
	c := env.connectClient(t)
	for range 2 {
		req := connect.NewRequest(&testpb.ChargeRequest{Account: "declined"})
		req.Header().Set("Idempotency-Key", "web-declined")
		_, err := c.Charge(context.Background(), req)
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition || len(ce.Details()) != 1 || ce.Meta().Get("X-Decline") != "card" {
			t.Errorf("Connect error: %v", err)
		}
	}
	if n := env.pay.runsOf("declined"); n != 1 {
		t.Errorf("the declined call ran %d times", n)
	}
}

func nowTS() *timestamppb.Timestamp { return timestamppb.Now() }
