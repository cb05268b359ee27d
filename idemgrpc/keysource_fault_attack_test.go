package idemgrpc_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// ksUUID is a UUID with letters among its digits, so that its cases differ.
const ksUUID = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"

// ksMixed is ksUUID in mixed case.
const ksMixed = "6Ba7B810-9dAd-11D1-80B4-00c04fD430C8"

// ksCharge sends a Charge as alice with md as the idempotency-key metadata
// (none when empty) and rid as its request_id; it returns the run the
// answer carries, whether it was replayed, and the error.
func ksCharge(ev *env, md, rid string) (int64, bool, error) {
	var keys []string
	if md != "" {
		keys = []string{md}
	}
	var h metadata.MD
	p, err := ev.client.Charge(as("alice", keys...), &testpb.ChargeRequest{Account: "a", Amount: 5, RequestId: rid}, grpc.Header(&h))
	return p.GetRun(), idemgrpc.Replayed(h), err
}

// ksField is the field a BadRequest in err names, or "".
func ksField(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.FieldViolations) > 0 {
			return br.FieldViolations[0].Field
		}
	}
	return ""
}

// TestShipUUIDCaseAcrossSources: an AEP-155 idempotency_key.key that is a
// UUID is one key in any case, alone or with the metadata beside it (with
// RFC 8941 quotes and whitespace); a different UUID beside it is refused
// naming the field and runs nothing.
func TestShipUUIDCaseAcrossSources(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	sent := timestamppb.New(time.Now().Add(-time.Minute))
	upper := strings.ToUpper(ksUUID)
	ship := func(md, key string) (int64, bool, error) {
		var keys []string
		if md != "" {
			keys = []string{md}
		}
		var h metadata.MD
		s, err := ev.client.Ship(as("alice", keys...), &testpb.ShipRequest{Order: "o", IdempotencyKey: &testpb.IdempotencyKey{Key: key, FirstSent: sent}}, grpc.Header(&h))
		return s.GetRun(), idemgrpc.Replayed(h), err
	}
	for i, tc := range []struct{ md, key string }{
		{"", upper},
		{"", ksUUID},
		{"", ksMixed},
		{upper, ksUUID},
		{ksUUID, upper},
		{` "` + ksMixed + `"  `, upper},
		{"  " + upper + " ", ksMixed},
	} {
		run, replayed, err := ship(tc.md, tc.key)
		if err != nil || run != 1 || replayed != (i > 0) {
			t.Fatalf("call %d (metadata %q, key %q): run %d, replayed %v, %v", i, tc.md, tc.key, run, replayed, err)
		}
	}
	other := "6ba7b810-9dad-11d1-80b4-00c04fd430c9"
	for _, tc := range []struct{ md, key string }{
		{upper, other},
		{strings.ToUpper(other), ksUUID},
		{`"` + ksMixed + `"`, strings.ToUpper(other)},
	} {
		_, _, err := ship(tc.md, tc.key)
		wantCode(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
		if f := ksField(err); f != "idempotency_key.key" {
			t.Fatalf("metadata %q, key %q: field %q", tc.md, tc.key, f)
		}
	}
	if n := ev.svc.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if got := ev.svc.seen(); len(got) != 1 || got[0] != upper {
		t.Fatalf("handler saw %q", got)
	}
}

// TestRequestIDCaseConflict: the metadata and request_id carry the same
// UUID in different cases: one key; different UUIDs (in any case) are
// refused naming request_id, and the handler does not run for them.
func TestRequestIDCaseConflict(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	other := uuid(77)
	for _, tc := range []struct{ md, rid string }{
		{ksUUID, other},
		{strings.ToUpper(ksUUID), strings.ToUpper(other)},
		{`"` + ksMixed + `"`, other},
		{other, ksMixed},
	} {
		_, _, err := ksCharge(ev, tc.md, tc.rid)
		wantCode(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
		if f := ksField(err); f != "request_id" {
			t.Fatalf("metadata %q, request_id %q: field %q", tc.md, tc.rid, f)
		}
	}
	if n := ev.svc.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times for conflicting keys", n)
	}
	if run, replayed, err := ksCharge(ev, " "+strings.ToUpper(ksUUID), ksMixed); err != nil || run != 1 || replayed {
		t.Fatalf("same UUID, two cases: run %d, replayed %v, %v", run, replayed, err)
	}
	if run, replayed, err := ksCharge(ev, "", ksUUID); err != nil || run != 1 || !replayed {
		t.Fatalf("retry in lower case: run %d, replayed %v, %v", run, replayed, err)
	}
}

// TestCaseRetryAfterCancelledReserve: the first attempt, with its
// request_id in upper case, is cancelled after the store committed its
// reservation; the retries come in lower case in the metadata, then mixed
// in the field. The handler runs once, on the first retry, and the next
// replays it: the released reservation was the canonical key's.
func TestCaseRetryAfterCancelledReserve(t *testing.T) {
	t.Parallel()
	s := &cancelStore{Store: memStore(t), reserved: make(chan struct{}), cancelReserve: true}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: s})
	chargeCancelled(t, ev, &testpb.ChargeRequest{Account: "a", Amount: 5, RequestId: strings.ToUpper(ksUUID)}, s.reserved)
	if e := ev.event(); e.Outcome != idem.SituationCanceled.Name {
		t.Fatalf("cancelled call's event %+v", e)
	}
	if run, replayed, err := ksCharge(ev, `"`+ksUUID+`"`, ""); err != nil || run != 1 || replayed {
		t.Fatalf("retry in the metadata: run %d, replayed %v, %v", run, replayed, err)
	}
	if run, replayed, err := ksCharge(ev, "", ksMixed); err != nil || run != 1 || !replayed {
		t.Fatalf("second retry: run %d, replayed %v, %v", run, replayed, err)
	}
	if n := ev.svc.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestCaseRetryAfterCancelledComplete: the handler ran and its answer is
// being stored when the client gives up; the retry, with the key in
// another case and another source, replays that answer.
func TestCaseRetryAfterCancelledComplete(t *testing.T) {
	t.Parallel()
	s := &cancelStore{Store: memStore(t), completing: make(chan struct{}), hold: make(chan struct{})}
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: s})
	chargeCancelled(t, ev, &testpb.ChargeRequest{Account: "a", Amount: 5, RequestId: ksMixed}, s.completing)
	close(s.hold)
	if e := ev.event(); e.Settlement != "completed" {
		t.Fatalf("settlement %+v", e)
	}
	for _, md := range []string{strings.ToUpper(ksUUID), ksUUID} {
		if run, replayed, err := ksCharge(ev, md, ""); err != nil || run != 1 || !replayed {
			t.Fatalf("retry with metadata %q: run %d, replayed %v, %v", md, run, replayed, err)
		}
	}
	if n := ev.svc.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestCaseRetryAfterReserveFails: Reserve fails once (store unavailable)
// on a first attempt keyed in upper case in the metadata; nothing runs.
// The retry in lower case in request_id runs the handler once, and a
// retry in the first attempt's form replays it.
func TestCaseRetryAfterReserveFails(t *testing.T) {
	t.Parallel()
	f := &failing{Store: memStore(t)}
	f.reserve.Store(1)
	ev := newEnv(t, idemgrpc.Config{}, envOptions{store: f})
	_, _, err := ksCharge(ev, strings.ToUpper(ksUUID), "")
	wantCode(t, err, codes.Unavailable, idemgrpc.ReasonStoreUnavailable)
	if n := ev.svc.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times on a failed Reserve", n)
	}
	if run, replayed, err := ksCharge(ev, "", ksUUID); err != nil || run != 1 || replayed {
		t.Fatalf("retry: run %d, replayed %v, %v", run, replayed, err)
	}
	for _, md := range []string{strings.ToUpper(ksUUID), `"` + ksMixed + `"`} {
		if run, replayed, err := ksCharge(ev, md, strings.ToUpper(ksUUID)); err != nil || run != 1 || !replayed {
			t.Fatalf("retry with metadata %q: run %d, replayed %v, %v", md, run, replayed, err)
		}
	}
	if n := ev.svc.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestCaseDuplicateClockJump: as TestEngineClockAheadDuplicate, but the
// duplicate carries the key in another case and source than the first
// call. It must be seen as the same key: with the clock ahead past the
// lease it escalates to review, behind it is in flight; it never runs.
// After the first call ends, a retry in a third form gets the first
// call's fate.
func TestCaseDuplicateClockJump(t *testing.T) {
	t.Parallel()
	for _, jump := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprint(jump), func(t *testing.T) {
			t.Parallel()
			ev, clk := clockEnv(t)
			entered, release := holdFirstRun(ev)
			first := make(chan error, 1)
			go func() {
				run, _, err := ksCharge(ev, "", strings.ToUpper(ksUUID))
				if err == nil && run != 1 {
					err = fmt.Errorf("run %d", run)
				}
				first <- err
			}()
			<-entered
			clk.Advance(jump)
			_, _, err := ksCharge(ev, ksUUID, "")
			if jump > 0 {
				wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonNeedsReview)
			} else {
				wantCode(t, err, codes.Aborted, idemgrpc.ReasonInFlight)
			}
			ev.event()
			close(release)
			if err := <-first; err != nil {
				t.Fatalf("first call: %v", err)
			}
			ev.event()
			run, replayed, err := ksCharge(ev, `"`+ksMixed+`"`, ksUUID)
			if jump > 0 {
				wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonNeedsReview)
			} else if err != nil || run != 1 || !replayed {
				t.Fatalf("retry after completion: run %d, replayed %v, %v", run, replayed, err)
			}
			if n := ev.svc.runs.Load(); n != 1 {
				t.Fatalf("runs %d", n)
			}
		})
	}
}

// TestCaseRetryAfterClockMoves: the engine's and store's clock move ahead
// or behind between a first call keyed in upper case and its retries in
// other cases and sources, within the retention: every retry replays.
func TestCaseRetryAfterClockMoves(t *testing.T) {
	t.Parallel()
	for _, jump := range []time.Duration{23 * time.Hour, -23 * time.Hour} {
		t.Run(fmt.Sprint(jump), func(t *testing.T) {
			t.Parallel()
			ev, clk := clockEnv(t)
			if run, replayed, err := ksCharge(ev, "", strings.ToUpper(ksUUID)); err != nil || run != 1 || replayed {
				t.Fatalf("first call: run %d, replayed %v, %v", run, replayed, err)
			}
			clk.Advance(jump)
			for _, tc := range []struct{ md, rid string }{{ksUUID, ""}, {"", ksMixed}, {strings.ToUpper(ksUUID), ksUUID}} {
				if run, replayed, err := ksCharge(ev, tc.md, tc.rid); err != nil || run != 1 || !replayed {
					t.Fatalf("retry (metadata %q, request_id %q): run %d, replayed %v, %v", tc.md, tc.rid, run, replayed, err)
				}
			}
			if n := ev.svc.runs.Load(); n != 1 {
				t.Fatalf("runs %d", n)
			}
		})
	}
}

// TestAnyRequestIDStillValidated: with AnyRequestID, a request_id that is
// not a UUID must still be a valid key: whitespace, control bytes,
// non-ASCII and more than MaxKeyLength bytes are refused naming
// request_id, including 36-byte values shaped like a UUID, and nothing
// runs. A valid non-UUID key of MaxKeyLength bytes is accepted, and is
// compared byte for byte with the metadata: another case is two keys.
func TestAnyRequestIDStillValidated(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{AnyRequestID: true}, envOptions{})
	for _, rid := range []string{
		"has space",
		" leading",
		"6ba7b810-9dad-11d1-80b4-00c04fd430c ", // 36 bytes, a space for a digit
		"6ba7b810-9dad-11d1-80b4-00c04fd430c\t",
		"6ba7b810-9dad-11d1-80b4-00c04fd430c\x7f",
		"6ba7b810-9dad-11d1-80b4-00c04fd430\u00e9", // 36 bytes, é
		"6BA7B810 9DAD-11D1-80B4-00C04FD430C8",
		"clé-unique",
		strings.Repeat("A", idem.MaxKeyLength+1),
		strings.Repeat("a", 4096),
	} {
		_, _, err := ksCharge(ev, "", rid)
		if status.Code(err) != codes.InvalidArgument || idemgrpc.Reason(err) != idemgrpc.ReasonKeyInvalid || ksField(err) != "request_id" {
			t.Errorf("request_id %q: %v (field %q), want INVALID_ARGUMENT %s on request_id", rid, err, ksField(err), idemgrpc.ReasonKeyInvalid)
		}
	}
	if n := ev.svc.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times for invalid keys", n)
	}
	long := strings.Repeat("A", idem.MaxKeyLength)
	if run, replayed, err := ksCharge(ev, "", long); err != nil || run != 1 || replayed {
		t.Fatalf("a %d-byte request_id: run %d, replayed %v, %v", len(long), run, replayed, err)
	}
	if run, replayed, err := ksCharge(ev, "", strings.ToLower(long)); err != nil || run != 2 || replayed {
		t.Fatalf("its lower case: run %d, replayed %v, %v; want another key", run, replayed, err)
	}
	// Not a UUID ('G'), with upper-case hex: the metadata in lower case is
	// another key, refused beside it.
	notUUID := "6BA7B810-9DAD-11D1-80B4-00C04FD430CG"
	_, _, err := ksCharge(ev, strings.ToLower(notUUID), notUUID)
	wantCode(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
	if run, replayed, err := ksCharge(ev, notUUID, notUUID); err != nil || run != 3 || replayed {
		t.Fatalf("%q in both: run %d, replayed %v, %v", notUUID, run, replayed, err)
	}
	if run, replayed, err := ksCharge(ev, strings.ToLower(notUUID), ""); err != nil || run != 4 || replayed {
		t.Fatalf("%q in the metadata: run %d, replayed %v, %v; want another key", strings.ToLower(notUUID), run, replayed, err)
	}
	if n := ev.svc.runs.Load(); n != 4 {
		t.Fatalf("handler ran %d times, want 4", n)
	}
}
