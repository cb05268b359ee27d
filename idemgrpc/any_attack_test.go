package idemgrpc_test

import (
	"context"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// chargeBytes encodes a ChargeRequest of account with labels whose map
// entries come in the order given, as a client's encoder may write them.
func chargeBytes(account string, labels ...string) []byte {
	b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), account)
	for i := 0; i+1 < len(labels); i += 2 {
		var e []byte
		e = protowire.AppendString(protowire.AppendTag(e, 1, protowire.BytesType), labels[i])
		e = protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), labels[i+1])
		b = protowire.AppendBytes(protowire.AppendTag(b, 3, protowire.BytesType), e)
	}
	return b
}

func orderOf(id string, item []byte) *testpb.OrderRequest {
	return &testpb.OrderRequest{RequestId: id, Item: &anypb.Any{TypeUrl: "type.googleapis.com/idem.test.v1.ChargeRequest", Value: item}}
}

// TestAnyMapOrderOverGRPC: a retry whose Any holds the same message with
// its map entries in another order (a rebuilt request) replays.
func TestAnyMapOrderOverGRPC(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	for i, item := range [][]byte{chargeBytes("a", "x", "1", "y", "2", "z", "3"), chargeBytes("a", "z", "3", "x", "1", "y", "2")} {
		p, err := ev.client.Order(as("alice"), orderOf(uuid(951), item))
		if err != nil || p.Run != 1 {
			t.Fatalf("call %d: %v %v, want run 1", i, p, err)
		}
	}
	if p, err := ev.client.Order(as("alice"), orderOf(uuid(951), chargeBytes("a", "x", "1", "y", "2", "z", "4"))); err == nil {
		t.Fatalf("another label under the key: %v, want KEY_REUSED", p)
	}
}

// TestAnyRecordOfEarlierVersion: a record that an earlier version of idem
// reserved, when an Any counted by its bytes as they came, still replays
// to the same call sent again as it was.
func TestAnyRecordOfEarlierVersion(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	item := chargeBytes("a", "z", "3", "x", "1") // not in key order
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(orderOf("", item))
	if err != nil {
		t.Fatal(err)
	}
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "RPC", Operation: orderMethod, ContentType: "application/protobuf", Body: body}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := ev.engine.Begin(ctx, idem.Request{Key: idem.Key{Scope: "user:alice", Operation: orderMethod, Key: uuid(952)}, Fingerprint: fp})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("%v %v", res.Outcome, err)
	}
	resp, err := idemgrpc.Response(&testpb.Payment{Id: "order_old", Run: 41})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Lease.Complete(ctx, resp); err != nil {
		t.Fatal(err)
	}
	p, err := ev.client.Order(as("alice"), orderOf(uuid(952), item))
	if err != nil || p.Run != 41 {
		t.Fatalf("%v %v, want the stored answer (run 41)", p, err)
	}
	if n := ev.svc.runs.Load(); n != 0 {
		t.Fatalf("runs %d", n)
	}
}
