package idemgrpc_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
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

// earlierShipFingerprint is the fingerprint an earlier version of idem
// gave a Ship of order sent first at firstSent: first_sent counted.
func earlierShipFingerprint(t *testing.T, order string, firstSent time.Time) string {
	t.Helper()
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(&testpb.ShipRequest{Order: order})
	if err != nil {
		t.Fatal(err)
	}
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "RPC", Operation: shipMethod, ContentType: "application/protobuf", Body: body,
		Query: "first_sent=" + strconv.FormatInt(firstSent.UnixNano(), 10)}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// TestEarlierFingerprintNeverAcquires: the look-up of a record of an
// earlier version of idem, after a mismatch, only matches a record that
// exists; when that record is gone by then (released, expired), the call is
// reserved under today's fingerprint, not the earlier one, which counted
// first_sent: a retry from a client that restarted (another first_sent)
// replays, instead of getting KEY_REUSED and running the operation again
// under a new key.
func TestEarlierFingerprintNeverAcquires(t *testing.T) {
	t.Parallel()
	s := &vanishStore{Store: memStore(t)}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: s})
	ctx := context.Background()
	t0 := time.Now().Add(-time.Minute).UTC()
	// The call's record as an earlier version reserved it, still pending.
	key := idem.Key{Scope: "user:alice", Operation: shipMethod, Key: "s-vanish"}
	res, err := ev.engine.Begin(ctx, idem.Request{Key: key, Fingerprint: earlierShipFingerprint(t, "o", t0)})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("%v %v", res.Outcome, err)
	}
	s.gone = func() {
		if err := res.Lease.Release(ctx); err != nil {
			t.Error(err)
		}
	}
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

// countingStore counts Reserves.
type countingStore struct {
	idemstore.Store
	reserves atomic.Int64
}

func (s *countingStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	s.reserves.Add(1)
	return s.Store.Reserve(ctx, p)
}

// TestMismatchOneReserve: a key reused with other arguments costs the
// store one Reserve, as any call does: the record the mismatch found is
// looked up again under the earlier version's fingerprint only when it is
// that fingerprint, so reused keys (a client's bug, or a hostile one) do
// not double the store's load.
func TestMismatchOneReserve(t *testing.T) {
	t.Parallel()
	s := &countingStore{Store: memStore(t)}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: s})
	t0 := time.Now().Add(-time.Minute)
	ship := func(order string) error {
		_, err := ev.client.Ship(as("alice"), &testpb.ShipRequest{Order: order, IdempotencyKey: &testpb.IdempotencyKey{Key: "s-count", FirstSent: timestamppb.New(t0)}})
		return err
	}
	if err := ship("o"); err != nil {
		t.Fatal(err)
	}
	before := s.reserves.Load()
	wantCode(t, ship("other"), codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	if n := s.reserves.Load() - before; n != 1 {
		t.Fatalf("a mismatch cost %d Reserves, want 1", n)
	}
}
