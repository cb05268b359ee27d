package rpccore

import (
	"fmt"
	"math/rand/v2"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// orderSpec is what an OrderRequest of the property test means: equal
// specs are equal requests once every Any is unpacked.
type orderSpec struct {
	account string
	amount  int64
	labels  map[string]string
}

// build makes an OrderRequest of s the way a client might: map entries
// inserted in an order of rng's, Anys packed with protobuf's default
// (non-deterministic) marshalling, under a type URL prefix of rng's, and,
// when noisy, unknown fields inside the Anys (a newer client's fields).
func (s orderSpec) build(t *testing.T, rng *rand.Rand, noisy bool) *testpb.OrderRequest {
	t.Helper()
	labels := func() map[string]string {
		keys := make([]string, 0, len(s.labels))
		for k := range s.labels {
			keys = append(keys, k)
		}
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		m := make(map[string]string, len(keys))
		for _, k := range keys {
			m[k] = s.labels[k]
		}
		return m
	}
	pack := func(m proto.Message) *anypb.Any {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		if rng.IntN(2) == 0 {
			a.TypeUrl = "example.com/" + string(m.ProtoReflect().Descriptor().FullName())
		}
		if noisy {
			a.Value = protowire.AppendString(protowire.AppendTag(a.Value, 99, protowire.BytesType), fmt.Sprint("noise-", rng.Int()))
		}
		return a
	}
	charge := &testpb.ChargeRequest{Account: s.account, Amount: s.amount, Labels: labels()}
	// The Status holds a ChargeRequest in an Any: an Any inside an Any.
	nested := &spb.Status{Code: 3, Message: "nested", Details: []*anypb.Any{pack(&testpb.ChargeRequest{Account: s.account, Labels: labels()})}}
	return &testpb.OrderRequest{
		RequestId: "0190a0e0-0000-7000-8000-000000000001",
		Item:      pack(charge),
		Extras:    []*anypb.Any{pack(nested), pack(charge)},
		ByName:    map[string]*anypb.Any{"first": pack(charge), "second": pack(nested)},
	}
}

func fingerprintOf(t *testing.T, m proto.Message) string {
	t.Helper()
	fp, _, err := Fingerprint("/idem.test.v1.Orders/Order", m, KeyFieldsOf(m.ProtoReflect().Descriptor()), found{}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// TestFingerprintAnyProperty: requests that are equal once their Anys are
// unpacked have one fingerprint whatever carried them: protobuf binary,
// protobuf JSON (Connect's JSON codec), or a rebuild with the map entries
// in another order, another type URL prefix and unknown fields inside the
// Anys; a change of a field inside an Any, at any depth, changes it.
func TestFingerprintAnyProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 60 {
		spec := orderSpec{account: fmt.Sprint("acc_", i%5), amount: int64(i), labels: map[string]string{}}
		for j := range 1 + rng.IntN(12) {
			spec.labels[fmt.Sprint("k", j)] = fmt.Sprint("v", rng.IntN(3))
		}
		want := fingerprintOf(t, spec.build(t, rng, false))

		orig := spec.build(t, rng, true)
		bin, err := proto.Marshal(orig)
		if err != nil {
			t.Fatal(err)
		}
		fromBin := new(testpb.OrderRequest)
		if err := proto.Unmarshal(bin, fromBin); err != nil {
			t.Fatal(err)
		}
		// JSON cannot carry unknown fields: a clean rebuild goes over it.
		js, err := protojson.Marshal(spec.build(t, rng, false))
		if err != nil {
			t.Fatal(err)
		}
		fromJSON := new(testpb.OrderRequest)
		if err := protojson.Unmarshal(js, fromJSON); err != nil {
			t.Fatal(err)
		}
		for name, m := range map[string]proto.Message{"rebuilt": spec.build(t, rng, true), "binary": fromBin, "json": fromJSON} {
			if got := fingerprintOf(t, m); got != want {
				t.Fatalf("request %d over %s: fingerprint %s, want %s", i, name, got, want)
			}
		}

		other := spec
		other.labels = map[string]string{"k0": "changed"}
		for k, v := range spec.labels {
			if k != "k0" {
				other.labels[k] = v
			}
		}
		if fingerprintOf(t, other.build(t, rng, false)) == want {
			t.Fatalf("request %d: a label inside the Anys changed, the fingerprint did not", i)
		}
	}
}

// TestFingerprintAnyUnknownType: an Any of a type the server cannot
// resolve counts by its type URL and bytes.
func TestFingerprintAnyUnknownType(t *testing.T) {
	t.Parallel()
	req := func(url string, value []byte) *testpb.OrderRequest {
		return &testpb.OrderRequest{Item: &anypb.Any{TypeUrl: url, Value: value}}
	}
	base := fingerprintOf(t, req("type.googleapis.com/x.Unknown", []byte{0x08, 0x01}))
	if fingerprintOf(t, req("type.googleapis.com/x.Unknown", []byte{0x08, 0x01})) != base {
		t.Fatal("equal bytes, another fingerprint")
	}
	for _, r := range []*testpb.OrderRequest{
		req("type.googleapis.com/x.Unknown", []byte{0x08, 0x02}),
		req("type.googleapis.com/x.Other", []byte{0x08, 0x01}),
		req("type.googleapis.com/idem.test.v1.ChargeRequest", []byte{0xff}), // does not decode: by its bytes
	} {
		if fingerprintOf(t, r) == base {
			t.Fatalf("%v: same fingerprint", r)
		}
	}
}

// TestFingerprintAnyHostileNesting: Anys nested far deeper than
// maxAnyDepth, or many of them, are fingerprinted (the deeper ones by their
// bytes) without unbounded work, and a change at the bottom still counts.
func TestFingerprintAnyHostileNesting(t *testing.T) {
	t.Parallel()
	nest := func(depth int, leaf string) *testpb.OrderRequest {
		inner := &anypb.Any{TypeUrl: "type.googleapis.com/idem.test.v1.ChargeRequest",
			Value: protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), leaf)}
		for range depth {
			b, err := proto.Marshal(inner)
			if err != nil {
				t.Fatal(err)
			}
			inner = &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.Any", Value: b}
		}
		return &testpb.OrderRequest{Item: inner}
	}
	for _, depth := range []int{maxAnyDepth - 1, maxAnyDepth, maxAnyDepth + 1, 1000} {
		a, b := nest(depth, "a"), nest(depth, "b")
		if fingerprintOf(t, a) != fingerprintOf(t, proto.Clone(a)) || fingerprintOf(t, a) == fingerprintOf(t, b) {
			t.Fatalf("depth %d: the fingerprint does not tell the leaves apart, or is not stable", depth)
		}
	}
	many := &testpb.OrderRequest{}
	for i := range 5000 {
		many.Extras = append(many.Extras, nest(3, fmt.Sprint(i)).Item)
	}
	if fingerprintOf(t, many) == "" {
		t.Fatal("no fingerprint")
	}
}

// TestFingerprintAnyLeavesRequest: canonicalising works on a copy; the
// handler gets the request as it came.
func TestFingerprintAnyLeavesRequest(t *testing.T) {
	t.Parallel()
	a, err := anypb.New(&testpb.ChargeRequest{Account: "a", Labels: map[string]string{"x": "1", "y": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	a.TypeUrl = "example.com/idem.test.v1.ChargeRequest"
	req := &testpb.OrderRequest{Item: a}
	before := proto.Clone(req)
	fingerprintOf(t, req)
	if !proto.Equal(req, before) {
		t.Fatal("the request was changed")
	}
}
