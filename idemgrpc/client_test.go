package idemgrpc_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/testenv"
)

// fakeSleep records the waits of the client's retries and returns at once,
// after calling each (a test's way to act while the client waits).
type fakeSleep struct {
	mu    sync.Mutex
	clock *testenv.Clock
	waits []time.Duration
	each  func(d time.Duration)
}

func (f *fakeSleep) sleep(_ context.Context, d time.Duration) error {
	f.mu.Lock()
	f.waits = append(f.waits, d)
	f.mu.Unlock()
	f.clock.Advance(d)
	if f.each != nil {
		f.each(d)
	}
	return nil
}

func clientWith(cfg idemgrpc.ClientConfig, f *fakeSleep) grpc.DialOption {
	idemgrpc.SetRetryClock(&cfg, f.clock.Now, f.sleep)
	return grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(cfg))
}

// TestClientKeepsKeyAcrossRetries: the client interceptor puts one key in
// the empty request_id of a copy of the request (the caller's is left as it
// is) and retries UNAVAILABLE with it, after a growing backoff; the server
// released the key each time, so the last attempt runs and completes.
func TestClientKeepsKeyAcrossRetries(t *testing.T) {
	t.Parallel()
	f := &fakeSleep{clock: testenv.NewClock(time.Unix(0, 0))}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{client: []grpc.DialOption{clientWith(idemgrpc.ClientConfig{}, f)}})
	ev.svc.charge = func(_ context.Context, _ *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		if run < 3 {
			return nil, status.Error(codes.Unavailable, "busy")
		}
		return &testpb.Payment{Run: run}, nil
	}
	req := &testpb.ChargeRequest{Account: "a", Amount: 1}
	var info idemgrpc.CallInfo
	p, err := ev.client.Charge(as("alice"), req, idemgrpc.WithCallInfo(&info))
	if err != nil || p.Run != 3 || info.Attempts != 3 || info.Replayed {
		t.Fatalf("%v %v %+v", p, err, info)
	}
	keys := ev.svc.seen()
	if len(keys) != 3 || keys[0] != info.Key || keys[1] != info.Key || keys[2] != info.Key || req.RequestId != "" {
		t.Fatalf("keys %q, info %q, caller's request_id %q", keys, info.Key, req.RequestId)
	}
	if len(f.waits) != 2 || f.waits[0] != 100*time.Millisecond || f.waits[1] != 200*time.Millisecond {
		t.Fatalf("waits %v", f.waits)
	}
	// A second call is a new operation: a new key.
	if _, err := ev.client.Charge(as("alice"), req, idemgrpc.WithCallInfo(&info)); err != nil || info.Key == keys[0] {
		t.Fatalf("second call: %v key %q", err, info.Key)
	}
}

// TestClientInFlight: a duplicate that finds the first call in flight gets
// ABORTED with RetryInfo; the client waits that long and retries with the
// key, and gets the first call's answer.
func TestClientInFlight(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	f := &fakeSleep{clock: testenv.NewClock(time.Unix(0, 0))}
	// The first wait lets the first call finish, and every wait lasts
	// until it has: the retry after it finds the answer stored (the fake
	// sleep returns at once, so without that the client could spend its
	// attempts before the first call stored its answer).
	var once sync.Once
	firstDone := make(chan struct{})
	f.each = func(time.Duration) {
		once.Do(func() { close(release) })
		<-firstDone
	}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{client: []grpc.DialOption{clientWith(idemgrpc.ClientConfig{}, f)}})
	ev.svc.charge = func(_ context.Context, _ *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		close(entered)
		<-release
		return &testpb.Payment{Run: run}, nil
	}
	first := make(chan error)
	go func() {
		_, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{RequestId: uuid(1)})
		close(firstDone)
		first <- err
	}()
	<-entered
	var info idemgrpc.CallInfo
	p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{RequestId: uuid(1)}, idemgrpc.WithCallInfo(&info))
	if err != nil || p.Run != 1 || !info.Replayed || info.Attempts != 2 {
		t.Fatalf("duplicate: %v %v %+v", p, err, info)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if f.waits[0] != time.Second { // RetryInfo: at least a second
		t.Fatalf("waits %v", f.waits)
	}
}

// TestClientGRPCRetryPolicy: with grpc's own retry policy (a service
// config) and no retries of the interceptor's, every attempt grpc makes
// carries the key the interceptor gave the call.
func TestClientGRPCRetryPolicy(t *testing.T) {
	t.Parallel()
	const serviceConfig = `{"methodConfig": [{"name": [{"service": "idem.test.v1.Payments"}],
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	ev := newEnv(t, idemgrpc.Config{Methods: map[string]idemgrpc.Policy{refundMethod: {}}}, envOptions{client: []grpc.DialOption{
		grpc.WithDefaultServiceConfig(serviceConfig),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{MaxAttempts: 1, Methods: []string{refundMethod}})),
	}})
	ev.svc.refund = func(_ context.Context, _ *testpb.RefundRequest, run int64) (*testpb.RefundResult, error) {
		if run < 3 {
			return nil, status.Error(codes.Unavailable, "busy")
		}
		return &testpb.RefundResult{Run: run}, nil
	}
	var info idemgrpc.CallInfo
	r, err := ev.client.Refund(as("alice"), &testpb.RefundRequest{Charge: "pay_1"}, idemgrpc.WithCallInfo(&info))
	if err != nil || r.Run != 3 || info.Attempts != 1 {
		t.Fatalf("%v %v %+v", r, err, info)
	}
	keys := ev.svc.seen()
	if len(keys) != 3 || keys[0] != info.Key || keys[1] != info.Key || keys[2] != info.Key {
		t.Fatalf("keys %q, want %q thrice", keys, info.Key)
	}
}

// TestClientKeyPlacement: WithKey, a key already in the field or in the
// metadata, and conflicts between them.
func TestClientKeyPlacement(t *testing.T) {
	t.Parallel()
	f := &fakeSleep{clock: testenv.NewClock(time.Unix(0, 0))}
	ev := newEnv(t, idemgrpc.Config{Methods: map[string]idemgrpc.Policy{refundMethod: {}}}, envOptions{client: []grpc.DialOption{clientWith(idemgrpc.ClientConfig{Methods: []string{refundMethod}}, f)}})
	var info idemgrpc.CallInfo
	call := func(ctx context.Context, req *testpb.ChargeRequest, opts ...grpc.CallOption) error {
		_, err := ev.client.Charge(ctx, req, append(opts, idemgrpc.WithCallInfo(&info))...)
		return err
	}
	if err := call(as("alice"), &testpb.ChargeRequest{}, idemgrpc.WithKey(uuid(1))); err != nil || info.Key != uuid(1) {
		t.Fatalf("WithKey: %v %+v", err, info)
	}
	if err := call(as("alice"), &testpb.ChargeRequest{RequestId: uuid(2)}); err != nil || info.Key != uuid(2) {
		t.Fatalf("key in the field: %v %+v", err, info)
	}
	if err := call(as("alice", uuid(3)), &testpb.ChargeRequest{}); err != nil || info.Key != uuid(3) {
		t.Fatalf("key in the metadata: %v %+v", err, info)
	}
	err := call(as("alice"), &testpb.ChargeRequest{RequestId: uuid(2)}, idemgrpc.WithKey(uuid(4)))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "two different keys") {
		t.Fatalf("conflict: %v", err)
	}
	if err := call(as("alice"), &testpb.ChargeRequest{}, idemgrpc.WithKey(strings.Repeat("k", 10000))); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("10000-byte key: %v", err)
	}
	// A method without a key field gets the key in the metadata.
	var hdr metadata.MD
	if _, err := ev.client.Refund(as("alice"), &testpb.RefundRequest{}, idemgrpc.WithCallInfo(&info), grpc.Header(&hdr)); err != nil || info.Key == "" {
		t.Fatalf("refund: %v %+v", err, info)
	}
	if k := ev.svc.seen(); k[len(k)-1] != info.Key {
		t.Fatalf("server saw %q, want %q", k[len(k)-1], info.Key)
	}
	// An AEP-155 key field is filled in, first_sent included.
	s, err := ev.client.Ship(as("alice"), &testpb.ShipRequest{Order: "o"}, idemgrpc.WithCallInfo(&info))
	if err != nil || info.Key == "" || s.Run == 0 {
		t.Fatalf("ship: %v %v %+v", s, err, info)
	}
	if n := ev.svc.runs.Load(); n != 5 {
		t.Fatalf("runs %d", n)
	}
}
