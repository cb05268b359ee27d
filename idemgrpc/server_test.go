package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// TestKeySources protects a call by each way it can carry its key (an
// AIP-155 request_id, an AEP-155 idempotency_key, the metadata on a method
// named in the configuration): the first call runs, the retry gets the
// first answer with idempotent-replayed, and nothing runs twice.
func TestKeySources(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{Methods: map[string]idemgrpc.Policy{refundMethod: {}}}, envOptions{})
	now := timestamppb.Now()
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, opts ...grpc.CallOption) (proto.Message, error)
		ctx  context.Context
	}{
		{"request_id", func(ctx context.Context, opts ...grpc.CallOption) (proto.Message, error) {
			return ev.client.Charge(ctx, &testpb.ChargeRequest{Account: "acc", Amount: 5, RequestId: uuid(1)}, opts...)
		}, as("alice")},
		{"idempotency_key", func(ctx context.Context, opts ...grpc.CallOption) (proto.Message, error) {
			return ev.client.Ship(ctx, &testpb.ShipRequest{Order: "o1", IdempotencyKey: &testpb.IdempotencyKey{Key: "ship-1", FirstSent: now}}, opts...)
		}, as("alice")},
		{"metadata", func(ctx context.Context, opts ...grpc.CallOption) (proto.Message, error) {
			return ev.client.Refund(ctx, &testpb.RefundRequest{Charge: "pay_1", Amount: 5}, opts...)
		}, as("alice", "refund-1")},
	} {
		var first, again metadata.MD
		r1, err := tc.call(tc.ctx, grpc.Header(&first))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if e := ev.event(); e.Outcome != "acquired" || e.Settlement != "completed" {
			t.Fatalf("%s: first call %+v", tc.name, e)
		}
		r2, err := tc.call(tc.ctx, grpc.Header(&again))
		if err != nil {
			t.Fatalf("%s: retry: %v", tc.name, err)
		}
		if e := ev.event(); e.Outcome != "replayed" {
			t.Fatalf("%s: retry %+v", tc.name, e)
		}
		if !proto.Equal(r1, r2) || idemgrpc.Replayed(first) || !idemgrpc.Replayed(again) {
			t.Fatalf("%s: first %v (%v), retry %v (%v)", tc.name, r1, first, r2, again)
		}
	}
	if n := ev.svc.runs.Load(); n != 3 {
		t.Fatalf("handlers ran %d times, want 3", n)
	}
}

// TestMismatch: the same key with another request is KEY_REUSED, a
// FAILED_PRECONDITION with a PreconditionFailure; the same key on another
// method is another operation, which runs on its own and never gets the
// first method's answer.
func TestMismatch(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{Methods: map[string]idemgrpc.Policy{refundMethod: {}}}, envOptions{})
	ctx := as("alice", uuid(7))
	if _, err := ev.client.Charge(ctx, &testpb.ChargeRequest{Account: "acc", Amount: 5}); err != nil {
		t.Fatal(err)
	}
	_, err := ev.client.Charge(ctx, &testpb.ChargeRequest{Account: "acc", Amount: 6})
	wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	var pf *errdetails.PreconditionFailure
	for _, d := range status.Convert(err).Details() {
		if v, ok := d.(*errdetails.PreconditionFailure); ok {
			pf = v
		}
	}
	if pf == nil || pf.Violations[0].Type != idemgrpc.ReasonKeyReused {
		t.Fatalf("details %v", status.Convert(err).Details())
	}
	r, err := ev.client.Refund(ctx, &testpb.RefundRequest{Charge: "pay_1"})
	if err != nil || r.Run != 2 {
		t.Fatalf("same key on another method: %v %v", r, err)
	}
	// Another user's same key is another record.
	if _, err := ev.client.Charge(as("bob", uuid(7)), &testpb.ChargeRequest{Account: "acc", Amount: 6}); err != nil {
		t.Fatal(err)
	}
	if n := ev.svc.runs.Load(); n != 3 {
		t.Fatalf("runs %d, want 3", n)
	}
}

// TestKeyRefused: hostile and malformed keys get INVALID_ARGUMENT
// (KEY_INVALID or KEY_MISSING) with a BadRequest naming the field, and
// nothing runs or is reserved.
func TestKeyRefused(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{Require: []string{chargeMethod, shipMethod}}, envOptions{})
	long := strings.Repeat("k", 10000)
	now := time.Now()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		req    proto.Message
		reason string
		field  string
	}{
		{"missing", as("alice"), &testpb.ChargeRequest{Account: "a"}, idemgrpc.ReasonKeyMissing, "request_id"},
		{"10000-byte key in metadata", as("alice", long), &testpb.ChargeRequest{Account: "a"}, idemgrpc.ReasonKeyInvalid, "idempotency-key"},
		{"10000-byte request_id", as("alice"), &testpb.ChargeRequest{Account: "a", RequestId: long}, idemgrpc.ReasonKeyInvalid, "request_id"},
		{"request_id not a UUID", as("alice"), &testpb.ChargeRequest{RequestId: "pay-1"}, idemgrpc.ReasonKeyInvalid, "request_id"},
		{"nil UUID", as("alice"), &testpb.ChargeRequest{RequestId: "00000000-0000-0000-0000-000000000000"}, idemgrpc.ReasonKeyInvalid, "request_id"},
		{"metadata and field differ", as("alice", uuid(2)), &testpb.ChargeRequest{RequestId: uuid(3)}, idemgrpc.ReasonKeyInvalid, "request_id"},
		{"two metadata values", as("alice", uuid(2), uuid(2)), &testpb.ChargeRequest{}, idemgrpc.ReasonKeyInvalid, "idempotency-key"},
		{"a space in the key", as("alice", "a b"), &testpb.ChargeRequest{}, idemgrpc.ReasonKeyInvalid, "idempotency-key"},
		{"idempotency_key without key", as("alice"), &testpb.ShipRequest{IdempotencyKey: &testpb.IdempotencyKey{FirstSent: timestamppb.Now()}}, idemgrpc.ReasonKeyInvalid, "idempotency_key.key"},
		{"no first_sent", as("alice"), &testpb.ShipRequest{IdempotencyKey: &testpb.IdempotencyKey{Key: "s"}}, idemgrpc.ReasonKeyInvalid, "idempotency_key.first_sent"},
		{"first_sent in the future", as("alice"), &testpb.ShipRequest{IdempotencyKey: &testpb.IdempotencyKey{Key: "s", FirstSent: timestamppb.New(now.Add(time.Hour))}}, idemgrpc.ReasonKeyInvalid, "idempotency_key.first_sent"},
		{"first_sent expired", as("alice"), &testpb.ShipRequest{IdempotencyKey: &testpb.IdempotencyKey{Key: "s", FirstSent: timestamppb.New(now.Add(-25 * time.Hour))}}, idemgrpc.ReasonKeyInvalid, "idempotency_key.first_sent"},
		{"first_sent out of range", as("alice"), &testpb.ShipRequest{IdempotencyKey: &testpb.IdempotencyKey{Key: "s", FirstSent: &timestamppb.Timestamp{Seconds: 1, Nanos: -1}}}, idemgrpc.ReasonKeyInvalid, "idempotency_key.first_sent"},
	} {
		var err error
		switch r := tc.req.(type) {
		case *testpb.ChargeRequest:
			_, err = ev.client.Charge(tc.ctx, r)
		case *testpb.ShipRequest:
			_, err = ev.client.Ship(tc.ctx, r)
		}
		if status.Code(err) != codes.InvalidArgument || idemgrpc.Reason(err) != tc.reason {
			t.Errorf("%s: %v, want INVALID_ARGUMENT %s", tc.name, err, tc.reason)
			continue
		}
		var br *errdetails.BadRequest
		for _, d := range status.Convert(err).Details() {
			if v, ok := d.(*errdetails.BadRequest); ok {
				br = v
			}
		}
		if br == nil || br.FieldViolations[0].Field != tc.field {
			t.Errorf("%s: BadRequest %v, want field %s", tc.name, br, tc.field)
		}
		if e := ev.event(); e.Outcome != strings.ToLower(strings.TrimPrefix(tc.reason, "KEY_"))+"_key" {
			t.Errorf("%s: outcome %q", tc.name, e.Outcome)
		}
	}
	if n := ev.svc.runs.Load(); n != 0 {
		t.Fatalf("handlers ran %d times", n)
	}
	// The same key in the metadata and in the field is one key.
	if _, err := ev.client.Charge(as("alice", uuid(4)), &testpb.ChargeRequest{RequestId: uuid(4)}); err != nil {
		t.Fatal(err)
	}
}

// TestOptionalKey: a method found by its key field runs a call without a
// key unprotected, every time, unless Require lists it.
func TestOptionalKey(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	for i := 1; i <= 2; i++ {
		p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a"})
		if err != nil || p.Run != int64(i) {
			t.Fatalf("call %d: %v %v", i, p, err)
		}
		if e := ev.event(); e.Outcome != "no_key" {
			t.Fatalf("outcome %q", e.Outcome)
		}
	}
	// Refund has no key field and is not configured: not protected
	// without a key; with one (its client believes it protected), it is.
	for i := 0; i < 2; i++ {
		if _, err := ev.client.Refund(as("alice"), &testpb.RefundRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ {
		if _, err := ev.client.Refund(as("alice", "r"), &testpb.RefundRequest{}); err != nil {
			t.Fatal(err)
		}
		if e := ev.event(); !e.Unlisted {
			t.Fatalf("%+v", e)
		}
	}
	if n := ev.svc.runs.Load(); n != 5 {
		t.Fatalf("runs %d", n)
	}
}

// TestScope: no credentials is UNAUTHENTICATED (SCOPE_MISSING) and a
// status from the Scope function is answered as it is; nothing runs.
func TestScope(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	_, err := ev.client.Charge(as("", uuid(1)), &testpb.ChargeRequest{})
	wantCode(t, err, codes.Unauthenticated, idemgrpc.ReasonScopeMissing)
	_, err = ev.client.Charge(as("banned", uuid(1)), &testpb.ChargeRequest{})
	wantCode(t, err, codes.PermissionDenied, "")
	ev2 := newEnv(t, idemgrpc.Config{Scope: func(context.Context) (string, error) { return "", errors.New("bad token") }}, envOptions{})
	_, err = ev2.client.Charge(as("alice", uuid(1)), &testpb.ChargeRequest{})
	wantCode(t, err, codes.Unauthenticated, idemgrpc.ReasonScopeDenied)
	if ev.svc.runs.Load()+ev2.svc.runs.Load() != 0 {
		t.Fatal("a handler ran")
	}
}

// TestEmptyScopeFromScopeFunc: a Scope function that returns an empty or
// white-space scope without an error has found no credentials: the call is
// UNAUTHENTICATED (SCOPE_MISSING), as for idem.ErrScopeMissing, never a
// store failure that FailOpen runs unprotected.
func TestEmptyScopeFromScopeFunc(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{"", " \t "} {
		for _, failOpen := range []bool{false, true} {
			ev := newEnv(t, idemgrpc.Config{FailOpen: failOpen, Scope: func(context.Context) (string, error) { return scope, nil }}, envOptions{})
			_, err := ev.client.Charge(as("alice", uuid(1)), &testpb.ChargeRequest{})
			wantCode(t, err, codes.Unauthenticated, idemgrpc.ReasonScopeMissing)
			if n := ev.svc.runs.Load(); n != 0 {
				t.Fatalf("scope %q, FailOpen %v: the handler ran %d times", scope, failOpen, n)
			}
		}
	}
}

// TestStoredStatus: a handler's error is an answer like any other: stored
// with its code, message and details, and replayed.
func TestStoredStatus(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	ev.svc.charge = func(context.Context, *testpb.ChargeRequest, int64) (*testpb.Payment, error) {
		st, _ := status.New(codes.InvalidArgument, "card declined").WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example.com"})
		return nil, st.Err()
	}
	var first, again metadata.MD
	_, err1 := ev.client.Charge(as("alice", uuid(1)), &testpb.ChargeRequest{}, grpc.Header(&first))
	_, err2 := ev.client.Charge(as("alice", uuid(1)), &testpb.ChargeRequest{}, grpc.Header(&again))
	if !proto.Equal(status.Convert(err1).Proto(), status.Convert(err2).Proto()) || status.Code(err2) != codes.InvalidArgument {
		t.Fatalf("first %v, replay %v", err1, err2)
	}
	if !idemgrpc.Replayed(again) || idemgrpc.Replayed(first) || ev.svc.runs.Load() != 1 {
		t.Fatalf("replayed %v, runs %d", again, ev.svc.runs.Load())
	}
}

// TestMetadataReplayed: the header and trailer metadata a handler set are
// stored and replayed (binary values included); grpc's own are not.
func TestMetadataReplayed(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{DropMetadata: []string{"X-Request-Id"}}, envOptions{})
	ev.svc.charge = func(ctx context.Context, _ *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		grpc.SetHeader(ctx, metadata.Pairs("x-charge-id", "ch_1", "x-request-id", "req-1"))
		grpc.SetTrailer(ctx, metadata.Pairs("x-cost-bin", "\x00\xff"))
		return &testpb.Payment{Run: run}, nil
	}
	var h, tr metadata.MD
	for i := 0; i < 2; i++ {
		if _, err := ev.client.Charge(as("alice", uuid(1)), &testpb.ChargeRequest{}, grpc.Header(&h), grpc.Trailer(&tr)); err != nil {
			t.Fatal(err)
		}
	}
	if !idemgrpc.Replayed(h) || h.Get("x-charge-id")[0] != "ch_1" || len(h.Get("x-request-id")) != 0 || tr.Get("x-cost-bin")[0] != "\x00\xff" {
		t.Fatalf("replayed header %v trailer %v", h, tr)
	}
}

// TestMarkedErrors: a handler error marked idem.Retryable releases the key
// (the retry runs), one marked idem.Ambiguous sends it to review (the retry
// gets NEEDS_REVIEW); an unmarked UNAVAILABLE, a release code, releases it
// too. The client gets the error without its mark.
func TestMarkedErrors(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	tries := map[string]int{} // the handler's runs per account
	var mu sync.Mutex
	ev.svc.charge = func(_ context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		mu.Lock()
		tries[req.Account]++
		n := tries[req.Account]
		mu.Unlock()
		switch {
		case n > 1:
			return &testpb.Payment{Run: run}, nil
		case req.Account == "retryable":
			return nil, idem.Retryable(status.Error(codes.FailedPrecondition, "provider refused"))
		case req.Account == "ambiguous":
			return nil, idem.Ambiguous(status.Error(codes.Unavailable, "provider timed out"))
		}
		return nil, status.Error(codes.Unavailable, "busy")
	}
	for i, tc := range []struct {
		account    string
		code       codes.Code
		settlement string
	}{
		{"retryable", codes.FailedPrecondition, "released"},
		{"retryable", codes.OK, "completed"},
		{"ambiguous", codes.Unavailable, "escalated"},
		{"unavailable", codes.Unavailable, "released"},
		{"unavailable", codes.OK, "completed"},
	} {
		_, err := ev.client.Charge(as("alice", "k-"+tc.account), &testpb.ChargeRequest{Account: tc.account})
		if status.Code(err) != tc.code || strings.Contains(status.Convert(err).Message(), "rpc error") {
			t.Fatalf("call %d: %v, want %v", i, err, tc.code)
		}
		if e := ev.event(); e.Settlement != tc.settlement {
			t.Fatalf("call %d: %+v, want settlement %s", i, e, tc.settlement)
		}
	}
	_, err := ev.client.Charge(as("alice", "k-ambiguous"), &testpb.ChargeRequest{Account: "ambiguous"})
	wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonNeedsReview)
	if !idemgrpc.NeedsReview(err) {
		t.Fatal("NeedsReview false")
	}
}

// TestPanic: a handler that panics escalates its key (its effect is
// unknown), and the panic goes on to the recovering interceptor outside;
// OnOutcome reports UNKNOWN, not OK.
func TestPanic(t *testing.T) {
	t.Parallel()
	recovery := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				err = status.Errorf(codes.Internal, "panic: %v", v)
			}
		}()
		return h(ctx, req)
	}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{outer: []grpc.UnaryServerInterceptor{recovery}})
	ev.svc.charge = func(context.Context, *testpb.ChargeRequest, int64) (*testpb.Payment, error) { panic("boom") }
	_, err := ev.client.Charge(as("alice", uuid(1)), &testpb.ChargeRequest{})
	wantCode(t, err, codes.Internal, "")
	if e := ev.event(); e.Settlement != "escalated" || e.Code != codes.Unknown {
		t.Fatalf("%+v, want escalated and UNKNOWN", e)
	}
	_, err = ev.client.Charge(as("alice", uuid(1)), &testpb.ChargeRequest{})
	wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonNeedsReview)
}

// TestStoreDown: a store that cannot be reached answers UNAVAILABLE
// (STORE_UNAVAILABLE, RetryInfo) and runs nothing; with FailOpen the
// handler runs unprotected.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	for _, failOpen := range []bool{false, true} {
		mem := newMem(t)
		f := &failing{Store: mem}
		f.reserve.Store(1 << 30)
		ev := newEnv(t, idemgrpc.Config{FailOpen: failOpen}, envOptions{store: f})
		_, err := ev.client.Charge(as("alice", uuid(1)), &testpb.ChargeRequest{})
		if failOpen {
			if err != nil || ev.svc.runs.Load() != 1 || ev.event().Outcome != "fail_open" {
				t.Fatalf("fail open: %v, runs %d", err, ev.svc.runs.Load())
			}
			continue
		}
		wantCode(t, err, codes.Unavailable, idemgrpc.ReasonStoreUnavailable)
		if d, ok := idemgrpc.RetryDelay(err); !ok || d != time.Second {
			t.Fatalf("RetryInfo %v %v", d, ok)
		}
		if ev.svc.runs.Load() != 0 {
			t.Fatal("the handler ran")
		}
	}
}

// TestStoreBlipsOnce: a Complete that fails once is tried again (the
// answer is stored, the retry replays it); a Reserve that fails once
// answers UNAVAILABLE, which the client interceptor retries with the same
// key: the handler runs once.
func TestStoreBlipsOnce(t *testing.T) {
	t.Parallel()
	f := &failing{Store: newMem(t)}
	f.complete.Store(1)
	f.reserve.Store(1)
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: f, client: []grpc.DialOption{grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{BaseDelay: time.Millisecond}))}})
	var info idemgrpc.CallInfo
	p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a"}, idemgrpc.WithCallInfo(&info))
	if err != nil || info.Attempts != 2 {
		t.Fatalf("%v %v %+v", p, err, info)
	}
	if e := ev.event(); e.Outcome != "unavailable" {
		t.Fatalf("first attempt %+v", e)
	}
	if e := ev.event(); e.Settlement != "completed" {
		t.Fatalf("second attempt %+v", e)
	}
	again, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a"}, idemgrpc.WithKey(info.Key), idemgrpc.WithCallInfo(&info))
	if err != nil || !info.Replayed || !proto.Equal(p, again) || ev.svc.runs.Load() != 1 {
		t.Fatalf("retry %v %v %+v runs %d", again, err, info, ev.svc.runs.Load())
	}
}

// TestConfigErrors: misconfiguration fails at construction.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	e, err := idem.NewEngine(newMem(t), idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  idemgrpc.Config
		want string
	}{
		{idemgrpc.Config{}, "Scope is required"},
		{idemgrpc.Config{Scope: userScope, Methods: map[string]idemgrpc.Policy{watchMethod: {}}}, "streams"},
		{idemgrpc.Config{Scope: userScope, Require: []string{watchMethod}}, "streams"},
		{idemgrpc.Config{Scope: userScope, Methods: map[string]idemgrpc.Policy{"/idem.test.v1.Payments/Chrage": {}}}, "has no method"},
		{idemgrpc.Config{Scope: userScope, Methods: map[string]idemgrpc.Policy{"/nope.Service/M": {}}}, "not in the protobuf registry"},
		{idemgrpc.Config{Scope: userScope, Methods: map[string]idemgrpc.Policy{"Charge": {}}}, "not a full method name"},
		{idemgrpc.Config{Scope: userScope, Policy: idemgrpc.Policy{Wait: -1}}, "negative"},
		{idemgrpc.Config{Scope: userScope, Methods: map[string]idemgrpc.Policy{chargeMethod: {Kind: 7}}}, "Kind"},
		{idemgrpc.Config{Scope: userScope, Policy: idemgrpc.Policy{ReleaseCodes: []codes.Code{codes.OK}}}, "OK"},
	} {
		_, err := idemgrpc.NewUnaryServerInterceptor(e, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := idemgrpc.NewUnaryServerInterceptor(nil, idemgrpc.Config{Scope: userScope}); err == nil {
		t.Error("no engine accepted")
	}
}

// newMem returns a memory store closed at the end of the test.
func newMem(t *testing.T) idemstore.Store {
	s := memStore(t)
	return s
}
