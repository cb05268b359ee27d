package idemgrpc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// vanishStore runs gone once, after the first Reserve that finds a record
// with another fingerprint and before it answers: the record that made
// the call a mismatch is released (or expires) between two Begins.
type vanishStore struct {
	idemstore.Store
	once sync.Once
	gone func()
}

func (s *vanishStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	rec, created, err := s.Store.Reserve(ctx, p)
	if err == nil && !created && rec.Fingerprint != p.Fingerprint {
		s.once.Do(s.gone)
	}
	return rec, created, err
}

// TestEarlierFingerprintNeverAcquires: the look-up of a record of an
// earlier version of idem, after a mismatch, only matches a record that
// exists; when the mismatching record is gone by then, the call is
// reserved under today's fingerprint, not the earlier one, which counted
// first_sent: a retry from a client that restarted (another first_sent)
// replays, instead of getting KEY_REUSED and running the operation again
// under a new key.
func TestEarlierFingerprintNeverAcquires(t *testing.T) {
	t.Parallel()
	s := &vanishStore{Store: memStore(t)}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: s})
	ctx := context.Background()
	key := idem.Key{Scope: "user:alice", Operation: shipMethod, Key: "s-vanish"}
	res, err := ev.engine.Begin(ctx, idem.Request{Key: key, Fingerprint: "v2:another-request"})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("%v %v", res.Outcome, err)
	}
	s.gone = func() {
		if err := res.Lease.Release(ctx); err != nil {
			t.Error(err)
		}
	}
	t0 := time.Now().Add(-time.Minute)
	ship := func(c testpb.PaymentsClient, at time.Time) (*testpb.Shipment, error) {
		return c.Ship(as("alice"), &testpb.ShipRequest{Order: "o", IdempotencyKey: &testpb.IdempotencyKey{Key: "s-vanish", FirstSent: timestamppb.New(at)}})
	}
	if sh, err := ship(ev.client, t0); err != nil || sh.Run != 1 {
		t.Fatalf("first call: %v %v, want run 1", sh, err)
	}
	ev.event()
	sh, err := ship(restartedClient(t, ev), t0.Add(time.Second))
	if err != nil || sh.Run != 1 {
		t.Fatalf("retry with another first_sent: %v %v, want the first answer (run 1)", sh, err)
	}
	if n := ev.svc.runs.Load(); n != 1 {
		t.Fatalf("runs %d", n)
	}
}
