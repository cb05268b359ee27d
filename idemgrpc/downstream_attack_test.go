package idemgrpc_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// TestDownstreamCodes: a handler that answers a code from a downstream call
// while its own call is still alive settles the key by the code's class:
// "effect unknown" (DEADLINE_EXCEEDED, CANCELLED by default) goes to review
// in an External method, so that no retry runs it again and none is told a
// definite answer; it is released in a Transactional method, or with
// Ambiguous: release. "Nothing happened" (UNAVAILABLE, RESOURCE_EXHAUSTED)
// is released; every other code is stored and replayed. The classes are
// configurable per method.
func TestDownstreamCodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		pol  idemgrpc.Policy
		code codes.Code
		// what the retry gets: the handler again (released), NEEDS_REVIEW
		// (escalated), or the first answer (stored)
		settlement string
	}{
		{"deadline, external", idemgrpc.Policy{}, codes.DeadlineExceeded, "escalated"},
		{"cancelled, external", idemgrpc.Policy{}, codes.Canceled, "escalated"},
		{"deadline, transactional", idemgrpc.Policy{Kind: idem.Transactional}, codes.DeadlineExceeded, "released"},
		{"deadline, ambiguous release", idemgrpc.Policy{Ambiguous: idemgrpc.AmbiguousRelease}, codes.DeadlineExceeded, "released"},
		{"unavailable", idemgrpc.Policy{}, codes.Unavailable, "released"},
		{"resource exhausted", idemgrpc.Policy{}, codes.ResourceExhausted, "released"},
		{"internal", idemgrpc.Policy{}, codes.Internal, "completed"},
		{"unknown", idemgrpc.Policy{}, codes.Unknown, "completed"},
		{"internal, configured ambiguous", idemgrpc.Policy{AmbiguousCodes: []codes.Code{codes.Internal}}, codes.Internal, "escalated"},
		{"deadline, not configured ambiguous", idemgrpc.Policy{AmbiguousCodes: []codes.Code{codes.Internal}}, codes.DeadlineExceeded, "completed"},
		{"unavailable, configured ambiguous", idemgrpc.Policy{ReleaseCodes: []codes.Code{}, AmbiguousCodes: []codes.Code{codes.Unavailable}}, codes.Unavailable, "escalated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev := newEnv(t, idemgrpc.Config{Methods: map[string]idemgrpc.Policy{chargeMethod: tc.pol}}, envOptions{})
			ev.svc.charge = func(_ context.Context, _ *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
				if run == 1 {
					return nil, status.Error(tc.code, "downstream: "+tc.code.String())
				}
				return &testpb.Payment{Run: run}, nil
			}
			req := &testpb.ChargeRequest{Account: "a", Amount: 1, RequestId: uuid(1)}
			_, err := ev.client.Charge(as("alice"), req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), "downstream") {
				t.Fatalf("first call: %v, want the handler's %v", err, tc.code)
			}
			if e := ev.event(); e.Settlement != tc.settlement {
				t.Fatalf("settlement %+v, want %s", e, tc.settlement)
			}
			p, err := ev.client.Charge(as("alice"), req)
			switch tc.settlement {
			case "released":
				if err != nil || p.Run != 2 {
					t.Fatalf("retry: %v %v, want run 2", p, err)
				}
			case "escalated":
				wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonNeedsReview)
			default:
				if status.Code(err) != tc.code {
					t.Fatalf("retry: %v, want the stored %v", err, tc.code)
				}
				if e := ev.event(); e.Outcome != "replayed" {
					t.Fatalf("%+v", e)
				}
			}
		})
	}
}

// TestDownstreamCodesConfig: a code in both classes, or an unknown
// Ambiguous policy, fails at start.
func TestDownstreamCodesConfig(t *testing.T) {
	t.Parallel()
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, pol := range []idemgrpc.Policy{
		{AmbiguousCodes: []codes.Code{codes.Unavailable}},
		{ReleaseCodes: []codes.Code{codes.DeadlineExceeded}},
		{AmbiguousCodes: []codes.Code{codes.OK}},
		{Ambiguous: "ignore"},
	} {
		if _, err := idemgrpc.NewUnaryServerInterceptor(e, idemgrpc.Config{Scope: idemgrpc.GlobalScope, Policy: pol}); err == nil {
			t.Errorf("%+v: accepted", pol)
		}
		if _, err := idemgrpc.NewUnaryServerInterceptor(e, idemgrpc.Config{Scope: idemgrpc.GlobalScope, Methods: map[string]idemgrpc.Policy{chargeMethod: pol}}); err == nil {
			t.Errorf("method %+v: accepted", pol)
		}
	}
}
