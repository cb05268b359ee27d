package idemgrpc_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// lateStore commits the first Reserve and answers it only once the
// caller's context has ended: the key is reserved for a client that hung
// up before its handler could start.
type lateStore struct {
	idemstore.Store
	once     sync.Once
	reserved chan struct{}
}

func (s *lateStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	rec, created, err := s.Store.Reserve(ctx, p)
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.reserved)
		<-ctx.Done()
	}
	return rec, created, err
}

// TestHungUpBeforeHandler: a client that hangs up after its key was
// reserved and before its handler started gets CANCELLED and its key is
// released: nothing ran, so its retry runs the handler (once), instead of
// the key going to review because the handler, started for a call that
// was already over, answered CANCELLED.
func TestHungUpBeforeHandler(t *testing.T) {
	t.Parallel()
	s := &lateStore{Store: memStore(t), reserved: make(chan struct{})}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: s})
	ev.svc.charge = func(ctx context.Context, _ *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return &testpb.Payment{Run: run}, nil
	}
	req := &testpb.ChargeRequest{Account: "a", Amount: 5, RequestId: uuid(1)}
	chargeCancelled(t, ev, req, s.reserved)
	if e := ev.event(); e.Outcome != idem.SituationCanceled.Name || e.Settlement != "released" {
		t.Fatalf("hung-up call's event %+v, want canceled and released", e)
	}
	p, err := ev.client.Charge(as("alice"), req)
	if err != nil || p.Run != 1 {
		t.Fatalf("retry: %v %v, want the handler's first run", p, err)
	}
	if ev.svc.runs.Load() != 1 {
		t.Fatalf("runs %d", ev.svc.runs.Load())
	}
}
