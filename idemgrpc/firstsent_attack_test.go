package idemgrpc_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// restartedClient is a client as a process that restarted makes it: a new
// connection with a new client interceptor, whose retries fail fast.
func restartedClient(t *testing.T, ev *env) testpb.PaymentsClient {
	t.Helper()
	conn, err := grpc.NewClient(ev.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{MaxAttempts: 1})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return testpb.NewPaymentsClient(conn)
}

// TestRetryRecipeAcrossRestarts is the documented recipe: the key is made
// once per operation and passed with WithKey on every try, also by a
// client that restarted in between. On an AEP-155 method, each client
// stamps first_sent itself, so the tries carry different ones; first_sent
// says how old the key is, not what is asked, so every try replays the
// first answer (and never gets KEY_REUSED, which tells a client to use a
// new key and so runs the operation twice).
func TestRetryRecipeAcrossRestarts(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	for _, tc := range []struct {
		name string
		key  string
		call func(c testpb.PaymentsClient, opts ...grpc.CallOption) (proto.Message, error)
	}{
		{"idempotency_key", "ship-restart-1", func(c testpb.PaymentsClient, opts ...grpc.CallOption) (proto.Message, error) {
			return c.Ship(as("alice"), &testpb.ShipRequest{Order: "o"}, opts...)
		}},
		{"request_id", uuid(901), func(c testpb.PaymentsClient, opts ...grpc.CallOption) (proto.Message, error) {
			return c.Charge(as("alice"), &testpb.ChargeRequest{Account: "a", Amount: 5}, opts...)
		}},
	} {
		before := ev.svc.runs.Load()
		var first proto.Message
		for try := range 3 {
			var info idemgrpc.CallInfo
			got, err := tc.call(restartedClient(t, ev), idemgrpc.WithKey(tc.key), idemgrpc.WithCallInfo(&info))
			if err != nil {
				t.Fatalf("%s: try %d: %v", tc.name, try, err)
			}
			if e := ev.event(); try > 0 && e.Outcome != "replayed" {
				t.Fatalf("%s: try %d: %+v, want replayed", tc.name, try, e)
			}
			if try == 0 {
				first = got
			} else if !proto.Equal(got, first) || !info.Replayed {
				t.Fatalf("%s: try %d got %v (replayed %v), want %v", tc.name, try, got, info.Replayed, first)
			}
		}
		if n := ev.svc.runs.Load() - before; n != 1 {
			t.Fatalf("%s: the handler ran %d times, want 1", tc.name, n)
		}
	}
}

// TestAEPFirstSent: an AEP-155 key sent again with another first_sent is
// the same call (first_sent is not part of what is asked), while the same
// key with other arguments is still a reuse.
func TestAEPFirstSent(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	t0 := time.Now().Add(-time.Minute)
	ship := func(order string, at time.Time) (*testpb.Shipment, error) {
		return ev.client.Ship(as("alice"), &testpb.ShipRequest{Order: order, IdempotencyKey: &testpb.IdempotencyKey{Key: "s-1", FirstSent: timestamppb.New(at)}})
	}
	for _, at := range []time.Time{t0, t0, t0.Add(time.Second), t0.Add(-time.Second)} {
		if s, err := ship("o", at); err != nil || s.Run != 1 {
			t.Fatalf("first_sent %v: %v %v, want run 1", at, s, err)
		}
	}
	_, err := ship("other", t0)
	wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
}

// TestAEPKeyWithoutFirstSent: a caller that sets idempotency_key.key and
// leaves first_sent empty gets it filled in by the client interceptor
// (the server refuses a key without one).
func TestAEPKeyWithoutFirstSent(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	c := restartedClient(t, ev)
	req := &testpb.ShipRequest{Order: "o", IdempotencyKey: &testpb.IdempotencyKey{Key: "s-nofs"}}
	for try := range 2 {
		if s, err := c.Ship(as("alice"), req); err != nil || s.Run != 1 {
			t.Fatalf("try %d: %v %v", try, s, err)
		}
	}
	if req.IdempotencyKey.FirstSent != nil {
		t.Fatal("the caller's message was changed")
	}
}

// TestAEPRecordOfEarlierVersion: a record that an earlier version of idem
// reserved, when first_sent counted in the fingerprint, still replays to
// the same call sent again with its first_sent, after an upgrade.
func TestAEPRecordOfEarlierVersion(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	at := time.Now().Add(-time.Minute).UTC()
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(&testpb.ShipRequest{Order: "o"})
	if err != nil {
		t.Fatal(err)
	}
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "RPC", Operation: shipMethod, ContentType: "application/protobuf", Body: body,
		Query: "first_sent=" + strconv.FormatInt(at.UnixNano(), 10)}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := ev.engine.Begin(ctx, idem.Request{Key: idem.Key{Scope: "user:alice", Operation: shipMethod, Key: "s-old"}, Fingerprint: fp})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("%v %v", res.Outcome, err)
	}
	resp, err := idemgrpc.Response(&testpb.Shipment{Id: "ship_old", Order: "o", Run: 41})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Lease.Complete(ctx, resp); err != nil {
		t.Fatal(err)
	}
	s, err := ev.client.Ship(as("alice"), &testpb.ShipRequest{Order: "o", IdempotencyKey: &testpb.IdempotencyKey{Key: "s-old", FirstSent: timestamppb.New(at)}})
	if err != nil || s.Run != 41 {
		t.Fatalf("%v %v, want the stored answer (run 41)", s, err)
	}
	if e := ev.event(); e.Outcome != "replayed" {
		t.Fatalf("%+v", e)
	}
	_, err = ev.client.Ship(as("alice"), &testpb.ShipRequest{Order: "other", IdempotencyKey: &testpb.IdempotencyKey{Key: "s-old", FirstSent: timestamppb.New(at)}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("other arguments: %v, want KEY_REUSED", err)
	}
	if n := ev.svc.runs.Load(); n != 0 {
		t.Fatalf("runs %d", n)
	}
}
