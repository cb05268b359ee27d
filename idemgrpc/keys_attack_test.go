package idemgrpc_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/testenv"
)

// TestFirstSentClockSkew: an AEP-155 first_sent is read on the client's
// clock, which may run ahead of the server's by up to MaxClockSkew, and
// the key's record expires on the store's. A retry that arrives after the
// store let the record go must be refused as expired, however far ahead
// the client's clock ran: accepted, it would run the call a second time.
func TestFirstSentClockSkew(t *testing.T) {
	t.Parallel()
	clk := testenv.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	mem := idemmem.MustNew(idemmem.Config{Now: clk.Now})
	t.Cleanup(func() { mem.Close() })
	cfg := idemgrpc.Config{} // MaxClockSkew: a minute
	idemgrpc.SetClock(&cfg, clk.Now)
	ev := newEnv(t, cfg, envOptions{store: mem, engine: idem.EngineConfig{Now: clk.Now, Retention: time.Hour}})
	ship := func(key string, firstSent time.Time) (*testpb.Shipment, error) {
		return ev.client.Ship(as("alice"), &testpb.ShipRequest{Order: "o", IdempotencyKey: &testpb.IdempotencyKey{Key: key, FirstSent: timestamppb.New(firstSent)}})
	}
	start := clk.Now()

	// Within the skew allowed, ahead or behind, a first_sent is accepted.
	ahead := start.Add(59 * time.Second)
	if s, err := ship("ahead", ahead); err != nil || s.Run != 1 {
		t.Fatalf("59s ahead: %v %v", s, err)
	}
	if s, err := ship("behind", start.Add(-10*time.Minute)); err != nil || s.Run != 2 {
		t.Fatalf("10min behind: %v %v", s, err)
	}
	_, err := ship("too far ahead", start.Add(61*time.Second))
	wantCode(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)

	// Before the record's retention ends, the retry replays.
	clk.Advance(time.Hour - 2*time.Minute)
	if s, err := ship("ahead", ahead); err != nil || s.Run != 1 {
		t.Fatalf("retry within the retention: %v %v", s, err)
	}
	// Past it on the store's clock, the record is gone; by the client's
	// first_sent, 59s ahead, the key is not an hour old yet.
	clk.Advance(2*time.Minute + 15*time.Second)
	if s, err := ship("ahead", ahead); status.Code(err) != codes.InvalidArgument || idemgrpc.Reason(err) != idemgrpc.ReasonKeyInvalid {
		t.Fatalf("retry after the store let the record go: %v %v, want KEY_INVALID (expired)", s, err)
	}
	if n := ev.svc.runs.Load(); n != 2 {
		t.Fatalf("runs %d, want 2", n)
	}
}

// TestFirstSentSkewConfig: a retention that MaxClockSkew would use up is
// refused at construction.
func TestFirstSentSkewConfig(t *testing.T) {
	t.Parallel()
	e, err := idem.NewEngine(newMem(t), idem.EngineConfig{Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemgrpc.NewUnaryServerInterceptor(e, idemgrpc.Config{Scope: userScope}); err == nil || !strings.Contains(err.Error(), "MaxClockSkew") {
		t.Fatalf("a one-minute retention with a one-minute skew: %v", err)
	}
	if _, err := idemgrpc.NewUnaryServerInterceptor(e, idemgrpc.Config{Scope: userScope, MaxClockSkew: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := idemgrpc.NewUnaryServerInterceptor(e, idemgrpc.Config{Scope: userScope, MaxClockSkew: time.Second,
		Methods: map[string]idemgrpc.Policy{shipMethod: {Retention: time.Second}}}); err == nil {
		t.Fatal("a method's retention equal to the skew was accepted")
	}
}

// TestKeyCaseAndWhitespace: a UUID is the same key whatever the case of
// its hexadecimal digits (RFC 9562), wherever it comes from; whitespace
// around a metadata value is not part of it (as on HTTP), and an RFC 8941
// string means its content. Inside a field, whitespace makes the key
// invalid. Keys that are not UUIDs are compared byte for byte.
func TestKeyCaseAndWhitespace(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{Methods: map[string]idemgrpc.Policy{refundMethod: {}}}, envOptions{})
	id := "0190a0e0-0000-7000-8000-00000000abcd"
	upper := strings.ToUpper(id)
	for _, tc := range []struct {
		name     string
		md       []string
		field    string
		replayed bool
		reason   string
	}{
		{"first call, lower case in the field", nil, id, false, ""},
		{"upper case in the field", nil, upper, true, ""},
		{"upper case in the metadata", []string{upper}, "", true, ""},
		{"upper case in the metadata, lower in the field", []string{upper}, id, true, ""},
		{"spaces around the metadata", []string{"  " + id + " "}, upper, true, ""},
		{"an RFC 8941 string in the metadata", []string{`"` + upper + `"`}, id, true, ""},
		{"a space in the field", nil, " " + id, false, idemgrpc.ReasonKeyInvalid},
		{"one digit apart", []string{id}, id[:35] + "e", false, idemgrpc.ReasonKeyInvalid},
	} {
		var h metadata.MD
		p, err := ev.client.Charge(as("alice", tc.md...), &testpb.ChargeRequest{Account: "a", RequestId: tc.field}, grpc.Header(&h))
		if tc.reason != "" {
			if idemgrpc.Reason(err) != tc.reason {
				t.Errorf("%s: %v, want %s", tc.name, err, tc.reason)
			}
			continue
		}
		if err != nil || p.Run != 1 || idemgrpc.Replayed(h) != tc.replayed {
			t.Errorf("%s: %v %v, replayed %v", tc.name, p, err, idemgrpc.Replayed(h))
		}
	}
	// Keys that are not UUIDs are opaque: another case is another key.
	for i, k := range []string{"Refund-A", "refund-a"} {
		if r, err := ev.client.Refund(as("alice", k), &testpb.RefundRequest{Charge: "c"}); err != nil || r.Run != int64(i+2) {
			t.Fatalf("%s: %v %v", k, r, err)
		}
	}
}

// TestClientKeyCase: the client interceptor reads the keys a call carries
// as the server does: the same UUID in another case in the metadata, or
// with spaces around it, is the key given with WithKey, not a second one.
func TestClientKeyCase(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{client: []grpc.DialOption{grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{MaxAttempts: 1}))}})
	id := "0190a0e0-0000-7000-8000-00000000abcd"
	for i, md := range []string{strings.ToUpper(id), " " + id + " ", `"` + id + `"`} {
		var h metadata.MD
		p, err := ev.client.Charge(as("alice", md), &testpb.ChargeRequest{Account: "a"}, idemgrpc.WithKey(id), grpc.Header(&h))
		if err != nil || p.Run != 1 || idemgrpc.Replayed(h) != (i > 0) {
			t.Fatalf("metadata %q: %v %v %v", md, p, err, h)
		}
	}
}
