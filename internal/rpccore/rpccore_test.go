package rpccore

import (
	"bytes"
	"net/http"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// TestTableCoversSituations: every situation idem answers with a problem
// document has a row, except those only an HTTP request's body or method, or
// HTTP content negotiation, causes.
func TestTableCoversSituations(t *testing.T) {
	t.Parallel()
	// An HTTP request's body or method, and HTTP content negotiation
	// (Vary, Content-Encoding); a gRPC call's are checked by grpc.
	httpOnly := []string{idem.SituationBodyTooLarge.Name, idem.SituationBodyUnreadable.Name, "invalid_method", idem.SituationNotAcceptable.Name}
	for _, s := range idem.Situations() {
		if s.Problem == "" || s.ProxyOnly || slices.Contains(httpOnly, s.Name) {
			continue
		}
		found := false
		for _, r := range Table {
			found = found || r.Situation.Name == s.Name
		}
		if !found {
			t.Errorf("situation %s has no gRPC row in Table", s.Name)
		}
	}
}

// TestFingerprintMapOrderAndUnknownFields: two encodings of one request
// whose map entries come in another order, and with unknown fields that
// differ, have one fingerprint; a change of a known field does not.
func TestFingerprintMapOrderAndUnknownFields(t *testing.T) {
	t.Parallel()
	entry := func(k, v string) []byte {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, v)
		var b []byte
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		return protowire.AppendBytes(b, e)
	}
	head := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "acc")
	unknown := func(v string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), v)
	}
	a := slices.Concat(head, entry("a", "1"), entry("b", "2"), unknown("x"))
	b := slices.Concat(head, entry("b", "2"), entry("a", "1"), unknown("y"))
	if bytes.Equal(a, b) {
		t.Fatal("the encodings should differ")
	}
	fp := func(raw []byte) string {
		var m testpb.ChargeRequest
		if err := proto.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		f := KeyFieldsOf(m.ProtoReflect().Descriptor())
		before := len(m.ProtoReflect().GetUnknown())
		s, _, err := Fingerprint("/m", &m, f, found{}, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.ProtoReflect().GetUnknown()) != before {
			t.Fatal("the unknown field was dropped from the caller's message")
		}
		return s
	}
	if fp(a) != fp(b) {
		t.Fatal("map order or unknown fields changed the fingerprint")
	}
	c := slices.Concat(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "acd"), entry("a", "1"), entry("b", "2"))
	if fp(a) == fp(c) {
		t.Fatal("another account has the same fingerprint")
	}
	// The key is left out.
	withKey := slices.Concat(a, protowire.AppendString(protowire.AppendTag(nil, 4, protowire.BytesType), "0190a0e0-0000-7000-8000-000000000001"))
	if fp(a) != fp(withKey) {
		t.Fatal("the request_id changed the fingerprint")
	}
}

// TestFingerprintNestedUnknownFields: unknown fields inside nested messages
// are left out too (here in the messages of a repeated field), while a
// message without message fields is checked at its top level only
// (KeyFields.nested).
func TestFingerprintNestedUnknownFields(t *testing.T) {
	t.Parallel()
	failure := func(unknown string) []byte {
		var v []byte
		v = protowire.AppendTag(v, 1, protowire.BytesType) // type
		v = protowire.AppendString(v, "STOCK")
		v = protowire.AppendTag(v, 99, protowire.BytesType)
		v = protowire.AppendString(v, unknown)
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), v) // violations
	}
	fp := func(raw []byte) string {
		var m errdetails.PreconditionFailure
		if err := proto.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		s, _, err := Fingerprint("/m", &m, KeyFieldsOf(m.ProtoReflect().Descriptor()), found{}, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if fp(failure("x")) != fp(failure("yy")) {
		t.Fatal("an unknown field inside a nested message changed the fingerprint")
	}
	if !KeyFieldsOf((&testpb.ShipRequest{}).ProtoReflect().Descriptor()).nested || KeyFieldsOf((&testpb.ChargeRequest{}).ProtoReflect().Descriptor()).nested {
		t.Fatal("nested: ShipRequest holds a message, ChargeRequest only a map of strings")
	}
}

// TestEncodeSharesTheHeaderOfPlainMessages: the stored header of a message
// answer without metadata is one map per message type on the settle path,
// so that storing an answer does not build it every time; an answer with
// metadata, a status, and every Response a caller of Encode gets (who may
// change it) have maps of their own.
func TestEncodeSharesTheHeaderOfPlainMessages(t *testing.T) {
	t.Parallel()
	same := func(a, b *idem.Response) bool {
		return reflect.ValueOf(a.Header).UnsafePointer() == reflect.ValueOf(b.Header).UnsafePointer()
	}
	enc := func(msg proto.Message, st *spb.Status, md MD, shared bool) *idem.Response {
		t.Helper()
		r, err := encode(msg, st, md, nil, func(string) bool { return true }, shared)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := enc(&testpb.Payment{Id: "a"}, nil, nil, true), enc(&testpb.Payment{Id: "b"}, nil, nil, true)
	if !same(a, b) {
		t.Error("two plain answers of one type have headers of their own")
	}
	want := http.Header{hdrStatus: {"0"}, hdrContentType: {"application/protobuf; proto=idem.test.v1.Payment"}}
	if !reflect.DeepEqual(a.Header, want) {
		t.Errorf("shared header %v, want %v", a.Header, want)
	}
	if c := enc(&testpb.ChargeRequest{}, nil, nil, true); same(a, c) || c.Header.Get(hdrContentType) != "application/protobuf; proto=idem.test.v1.ChargeRequest" {
		t.Errorf("another type's answer has header %v", c.Header)
	}
	for name, r := range map[string]*idem.Response{
		"with metadata": enc(&testpb.Payment{}, nil, MD{"x-a": {"1"}}, true),
		"a status":      enc(nil, &spb.Status{Code: 5}, nil, true),
		"from Encode":   enc(&testpb.Payment{}, nil, nil, false),
	} {
		if same(a, r) {
			t.Errorf("%s: the answer's header is the shared one", name)
		}
		r.Header.Set("X-Changed", "1")
	}
	if !reflect.DeepEqual(enc(&testpb.Payment{}, nil, nil, true).Header, want) {
		t.Error("changing another answer's header changed the shared one")
	}
}
