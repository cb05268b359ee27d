package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// spyStore signals each Reserve that found its key taken, so that a test
// knows a duplicate reached the store; it keeps the memory store's
// notifications (Begin's wait is woken by them).
type spyStore struct {
	*idemmem.Store
	conflicts chan struct{}
}

func (s *spyStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	rec, created, err := s.Store.Reserve(ctx, p)
	if err == nil && !created {
		s.conflicts <- struct{}{}
	}
	return rec, created, err
}

// TestHedgedCalls: a hedging client (gRPC's hedgingPolicy, which grpc-java
// and grpc-core implement; grpc-go ignores it) sends the same call again
// while the first still runs, with the same key. The second never runs the
// handler: without Policy.Wait it gets ABORTED (IN_FLIGHT) with RetryInfo
// at once; with it, it waits and gets the first call's answer, replayed;
// cancelled while it waits (the hedge that lost), it ends CANCELLED and
// leaves the first alone. The IN_FLIGHT answer carries the delay in
// grpc-retry-pushback-ms too, which grpc's own retry policy reads.
func TestHedgedCalls(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		wait   time.Duration
		cancel bool
	}{{"no wait", 0, false}, {"wait", time.Hour, false}, {"wait, then cancelled", time.Hour, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := memStore(t)
			spy := &spyStore{Store: mem, conflicts: make(chan struct{}, 10)}
			ev := newEnv(t, idemgrpc.Config{Policy: idemgrpc.Policy{Wait: tc.wait}}, envOptions{store: spy})
			entered, release := make(chan struct{}), make(chan struct{})
			ev.svc.charge = func(_ context.Context, _ *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
				if run == 1 {
					close(entered)
					<-release
				}
				return &testpb.Payment{Id: "pay_1", Run: run}, nil
			}
			req := &testpb.ChargeRequest{Account: "a", Amount: 5, RequestId: uuid(1)}
			first := make(chan error, 1)
			go func() {
				_, err := ev.client.Charge(as("alice"), req)
				first <- err
			}()
			<-entered
			ctx, cancel := context.WithCancel(as("alice"))
			defer cancel()
			type answer struct {
				p     *testpb.Payment
				h, tr metadata.MD
				err   error
			}
			second := make(chan answer, 1)
			go func() {
				var a answer
				a.p, a.err = ev.client.Charge(ctx, req, grpc.Header(&a.h), grpc.Trailer(&a.tr))
				second <- a
			}()
			<-spy.conflicts // the hedge reached the store, and found the key taken
			if tc.cancel {
				cancel()
				if a := <-second; status.Code(a.err) != codes.Canceled {
					t.Fatalf("cancelled hedge: %v %v", a.p, a.err)
				}
			}
			if tc.wait == 0 {
				a := <-second
				wantCode(t, a.err, codes.Aborted, idemgrpc.ReasonInFlight)
				if d, ok := idemgrpc.RetryDelay(a.err); !ok || d < time.Second {
					t.Fatalf("RetryInfo %v %v", d, ok)
				}
				// grpc's own retry policy (which does not read RetryInfo)
				// waits as long.
				if p := a.tr.Get("grpc-retry-pushback-ms"); len(p) != 1 || p[0] != "1000" {
					t.Fatalf("pushback trailer %v", a.tr)
				}
			}
			close(release)
			if err := <-first; err != nil {
				t.Fatalf("first: %v", err)
			}
			if tc.wait > 0 && !tc.cancel {
				if a := <-second; a.err != nil || a.p.Run != 1 || !idemgrpc.Replayed(a.h) {
					t.Fatalf("waiting hedge: %v %v %v", a.p, a.err, a.h)
				}
			}
			again, err := ev.client.Charge(as("alice"), req)
			if err != nil || again.Run != 1 || ev.svc.runs.Load() != 1 {
				t.Fatalf("after: %v %v, runs %d", again, err, ev.svc.runs.Load())
			}
		})
	}
}
