package idemgrpc_test

import (
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// TestUUIDUpperFirst: a request_id sent first in upper case is stored in
// lower case, so that its retry in lower case, or in mixed case, or in
// the metadata, replays the first answer instead of running the handler
// again. (TestKeyCaseAndWhitespace sends lower case first.)
func TestUUIDUpperFirst(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	id := "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
	for i, tc := range []struct {
		md    []string
		field string
	}{
		{nil, strings.ToUpper(id)},
		{nil, id},
		{nil, "6Ba7B810-9dAd-11D1-80b4-00C04Fd430C8"},
		{[]string{id}, strings.ToUpper(id)},
		{[]string{strings.ToUpper(id)}, ""},
	} {
		var h metadata.MD
		p, err := ev.client.Charge(as("alice", tc.md...), &testpb.ChargeRequest{Account: "a", Amount: 5, RequestId: tc.field}, grpc.Header(&h))
		if err != nil || p.Run != 1 || idemgrpc.Replayed(h) != (i > 0) {
			t.Fatalf("call %d (metadata %q, request_id %q): %v %v, replayed %v", i, tc.md, tc.field, p, err, idemgrpc.Replayed(h))
		}
	}
	if n := ev.svc.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	// The handler saw the request_id as the first call sent it.
	if got := ev.svc.seen(); len(got) != 1 || got[0] != strings.ToUpper(id) {
		t.Fatalf("handler saw %q", got)
	}
}

// theseNotUUIDs are 36-byte request_ids that are not UUIDs: a hex digit
// out of range (in either case), a dash out of place, no dashes, and
// multi-byte runes that keep the length at 36 bytes.
var theseNotUUIDs = []string{
	"00000000-0000-0000-0000-000000000000",     // the nil UUID
	"0190a0e0-0000-7000-8000-00000000000g",     // g
	"0190A0E0-0000-7000-8000-00000000000G",     // G
	"0190a0e0-0000-7000-8000-00000000000@",     // 'A'-1
	"0190a0e0-0000-7000-8000-00000000000`",     // 'a'-1
	"0190a0e0-0000-7000-8000-00000000000:",     // '9'+1
	"0190a0e00-000-7000-8000-000000000001",     // a dash moved
	"0190a0e0000070008000000000000000001A",     // no dashes
	"0190a0e0-0000-7000-8000-0000000000\u00e9", // é: two bytes
	"0190a0e0\u2010000-7000-8000-00000000001",  // U+2010 HYPHEN for a dash
	"\uff10190a0e0-0000-7000-8000-0000000001",  // U+FF10 FULLWIDTH DIGIT ZERO
	"0190a0e0-0000-7000-8000-00000000\u00c9\u00c9",
}

// TestRequestIDNotUUID36: 36-byte request_ids that are not UUIDs get
// INVALID_ARGUMENT KEY_INVALID naming request_id, and the handler does
// not run.
func TestRequestIDNotUUID36(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	for _, id := range theseNotUUIDs {
		if len(id) != 36 {
			t.Fatalf("%q is %d bytes, want 36", id, len(id))
		}
		_, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a", RequestId: id})
		if status.Code(err) != codes.InvalidArgument || idemgrpc.Reason(err) != idemgrpc.ReasonKeyInvalid {
			t.Errorf("request_id %q: %v, want INVALID_ARGUMENT %s", id, err, idemgrpc.ReasonKeyInvalid)
			continue
		}
		var br *errdetails.BadRequest
		for _, d := range status.Convert(err).Details() {
			if v, ok := d.(*errdetails.BadRequest); ok {
				br = v
			}
		}
		if br == nil || br.FieldViolations[0].Field != "request_id" {
			t.Errorf("request_id %q: BadRequest %v, want the field request_id", id, br)
		}
	}
	if n := ev.svc.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times", n)
	}
}

// TestNotUUIDKeepsCase: with AnyRequestID, a request_id that is not a
// UUID is an opaque key, compared byte for byte: one that is a UUID but
// for one digit is not lower-cased, so its upper- and lower-case forms
// are two keys and each runs once; a true UUID's two cases are one key.
func TestNotUUIDKeepsCase(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{AnyRequestID: true}, envOptions{})
	charge := func(id string) (int64, bool) {
		t.Helper()
		var h metadata.MD
		p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a", RequestId: id}, grpc.Header(&h))
		if err != nil {
			t.Fatalf("request_id %q: %v", id, err)
		}
		return p.Run, idemgrpc.Replayed(h)
	}
	notUUID := "0190A0E0-0000-7000-8000-00000000000G"
	if run, replayed := charge(notUUID); run != 1 || replayed {
		t.Fatalf("%q: run %d, replayed %v", notUUID, run, replayed)
	}
	if run, replayed := charge(strings.ToLower(notUUID)); run != 2 || replayed {
		t.Fatalf("%q: run %d, replayed %v; want a second key", strings.ToLower(notUUID), run, replayed)
	}
	if run, replayed := charge(notUUID); run != 1 || !replayed {
		t.Fatalf("%q again: run %d, replayed %v", notUUID, run, replayed)
	}
	uuid := "0190A0E0-0000-7000-8000-00000000000F"
	if run, replayed := charge(uuid); run != 3 || replayed {
		t.Fatalf("%q: run %d, replayed %v", uuid, run, replayed)
	}
	if run, replayed := charge(strings.ToLower(uuid)); run != 3 || !replayed {
		t.Fatalf("%q: run %d, replayed %v; want the replay of run 3", strings.ToLower(uuid), run, replayed)
	}
	if n := ev.svc.runs.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
}
