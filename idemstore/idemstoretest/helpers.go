package idemstoretest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Durations the suite passes. The store adds them to its own clock, so a
// lease of leaseExpired has expired the moment it is granted, and a record
// completed with retainExpired may be purged at once: no test waits for time
// to pass. Live ones are far enough away for any test to finish first.
const (
	hour          = time.Hour
	leaseLive     = 1 * hour
	leaseLonger   = 3 * hour
	leaseExpired  = -1 * hour
	retainLive    = 3 * hour
	retainExpired = -1 * hour
)

// slack is the precision every store keeps at least: a millisecond.
const slack = time.Millisecond

// clockTolerance is how far a store's clock may be from this process's for
// the suite's sanity check of its times (which catches unit and time zone
// mistakes, not skew).
const clockTolerance = 10 * time.Minute

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// newScope returns a scope no other test uses.
func newScope() string { return "idemtest-" + randomHex(8) }

// newToken returns a fresh lease token.
func newToken() string { return "tok-" + randomHex(12) }

// fixture holds what one subtest needs: a store and a private scope.
type fixture struct {
	t     *testing.T
	s     idemstore.Store
	scope string
}

func newFixture(t *testing.T, s idemstore.Store) *fixture {
	return &fixture{t: t, s: s, scope: newScope()}
}

func (f *fixture) ctx() context.Context { return f.t.Context() }

// key returns a key in the fixture's scope.
func (f *fixture) key(name string) idemstore.Key {
	return idemstore.Key{Scope: f.scope, Operation: "POST /things", Key: name}
}

// reserve reserves k with a fresh token and the given lease, requires that
// it was created as asked, and returns the record as stored.
func (f *fixture) reserve(k idemstore.Key, lease time.Duration) *idemstore.Record {
	f.t.Helper()
	return f.reserveWith(idemstore.ReserveParams{Key: k, Fingerprint: "fp-" + k.Key, Token: newToken(), Lease: lease})
}

// reserveWith reserves p.Key as reserve does, with p as given.
func (f *fixture) reserveWith(p idemstore.ReserveParams) *idemstore.Record {
	f.t.Helper()
	rec, created, err := f.s.Reserve(f.ctx(), p)
	if err != nil {
		f.t.Fatalf("Reserve(%v): %v", p.Key, err)
	}
	if !created {
		f.t.Fatalf("Reserve(%v): created = false for a fresh key", p.Key)
	}
	if rec != nil {
		f.t.Fatalf("Reserve(%v): created, with a record %+v; want nil", p.Key, *rec)
	}
	rec = f.get(p.Key)
	if rec.Token != p.Token || rec.State != idemstore.StatePending || rec.Fingerprint != p.Fingerprint {
		f.t.Fatalf("Reserve(%v): stored token %q fingerprint %q in state %s, want %q %q pending", p.Key, rec.Token, rec.Fingerprint, rec.State, p.Token, p.Fingerprint)
	}
	// One now, taken by the store, makes CreatedAt, UpdatedAt and the
	// lease deadline.
	if d := rec.LeaseUntil.Sub(rec.CreatedAt); !near(d, p.Lease) {
		f.t.Fatalf("Reserve(%v) with Lease %v: LeaseUntil - CreatedAt = %v", p.Key, p.Lease, d)
	}
	if !sameInstant(rec.UpdatedAt, rec.CreatedAt) {
		f.t.Fatalf("Reserve(%v): UpdatedAt %v, want CreatedAt %v", p.Key, rec.UpdatedAt, rec.CreatedAt)
	}
	if rec.ReadAt.Before(rec.CreatedAt.Add(-slack)) {
		f.t.Fatalf("Reserve(%v): read at %v, before it was created at %v", p.Key, rec.ReadAt, rec.CreatedAt)
	}
	if off := time.Since(rec.CreatedAt); off > clockTolerance || off < -clockTolerance {
		f.t.Fatalf("Reserve(%v): CreatedAt %v is %v away from this process's clock (a unit or time zone mistake?)", p.Key, rec.CreatedAt, off)
	}
	if !rec.ExpiresAt.IsZero() || rec.Response != nil {
		f.t.Fatalf("Reserve(%v): pending record has ExpiresAt %v, response %s; want zero, nil", p.Key, rec.ExpiresAt, summary(rec.Response))
	}
	return rec
}

// near reports whether a and b are within slack of each other.
func near(a, b time.Duration) bool { return a-b <= slack && b-a <= slack }

// during runs change on the existing record for k and returns the window
// of the store's clock it ran in: the ReadAt of a read before and of a
// read after (which must find the record still there).
func (f *fixture) during(k idemstore.Key, change func() error) (lo, hi time.Time, after *idemstore.Record, err error) {
	f.t.Helper()
	lo = f.get(k).ReadAt
	err = change()
	after = f.get(k)
	return lo.Add(-slack), after.ReadAt.Add(slack), after, err
}

// requireWithin requires t - d to lie in [lo, hi]: a deadline the store
// computed as its now plus d during that window.
func requireWithin(tb testing.TB, what string, t time.Time, d time.Duration, lo, hi time.Time) {
	tb.Helper()
	if now := t.Add(-d); now.Before(lo) || now.After(hi) {
		tb.Fatalf("%s = %v: minus %v that is %v, outside the store's clock during the call [%v, %v]", what, t, d, now, lo, hi)
	}
}

// complete completes rec (reserved by this fixture) with resp and the given
// retention, requires the stored record to show it, and returns that
// record.
func (f *fixture) complete(rec *idemstore.Record, resp *idemstore.Response, retention time.Duration) *idemstore.Record {
	f.t.Helper()
	lo, hi, got, err := f.during(rec.Key, func() error {
		return f.s.Complete(f.ctx(), idemstore.CompleteParams{Key: rec.Key, Token: rec.Token, Response: resp, Retention: retention})
	})
	if err != nil {
		f.t.Fatalf("Complete(%v): %v", rec.Key, err)
	}
	requireWithin(f.t, "Complete: ExpiresAt", got.ExpiresAt, retention, lo, hi)
	requireWithin(f.t, "Complete: UpdatedAt", got.UpdatedAt, 0, lo, hi)
	want := *rec
	want.State = idemstore.StateCompleted
	want.Response = resp
	want.ExpiresAt, want.UpdatedAt = got.ExpiresAt, got.UpdatedAt
	if d := diffRecord(got, &want); d != "" {
		f.t.Fatalf("after Complete(%v): %s", rec.Key, d)
	}
	return got
}

// escalate escalates rec (reserved by this fixture) with reason and returns
// the stored record.
func (f *fixture) escalate(rec *idemstore.Record, reason string) *idemstore.Record {
	f.t.Helper()
	lo, hi, got, err := f.during(rec.Key, func() error {
		return f.s.Escalate(f.ctx(), idemstore.EscalateParams{Key: rec.Key, Token: rec.Token, Reason: reason})
	})
	if err != nil {
		f.t.Fatalf("Escalate(%v): %v", rec.Key, err)
	}
	requireWithin(f.t, "Escalate: UpdatedAt", got.UpdatedAt, 0, lo, hi)
	want := *rec
	want.State = idemstore.StateNeedsReview
	want.Reason = reason
	want.UpdatedAt = got.UpdatedAt
	if d := diffRecord(got, &want); d != "" {
		f.t.Fatalf("after Escalate(%v): %s", rec.Key, d)
	}
	if !got.ExpiresAt.IsZero() || got.Response != nil {
		f.t.Fatalf("needs_review record has ExpiresAt %v, response %s; want zero, nil", got.ExpiresAt, summary(got.Response))
	}
	return got
}

// extend extends rec's lease to lease from now and returns the stored
// record.
func (f *fixture) extend(rec *idemstore.Record, lease time.Duration) *idemstore.Record {
	f.t.Helper()
	lo, hi, got, err := f.during(rec.Key, func() error {
		return f.s.Extend(f.ctx(), idemstore.ExtendParams{Key: rec.Key, Token: rec.Token, Lease: lease})
	})
	if err != nil {
		f.t.Fatalf("Extend(%v): %v", rec.Key, err)
	}
	requireWithin(f.t, "Extend: LeaseUntil", got.LeaseUntil, lease, lo, hi)
	want := *rec
	want.LeaseUntil, want.UpdatedAt = got.LeaseUntil, got.UpdatedAt
	if d := diffRecord(got, &want); d != "" {
		f.t.Fatalf("after Extend(%v) (only LeaseUntil and UpdatedAt may move): %s", rec.Key, d)
	}
	return got
}

// get returns the stored record for k, failing the test on any error.
func (f *fixture) get(k idemstore.Key) *idemstore.Record {
	f.t.Helper()
	rec, err := f.s.Get(f.ctx(), k)
	if err != nil {
		f.t.Fatalf("Get(%v): %v", k, err)
	}
	if rec == nil {
		f.t.Fatalf("Get(%v): nil record and nil error", k)
	}
	checkUTC(f.t, rec)
	if rec.ReadAt.IsZero() {
		f.t.Fatalf("Get(%v): ReadAt is zero; stores set it to their clock at the read", k)
	}
	return rec
}

// requireGone requires that no record exists for k.
func (f *fixture) requireGone(k idemstore.Key) {
	f.t.Helper()
	rec, err := f.s.Get(f.ctx(), k)
	if !errors.Is(err, idemstore.ErrNotFound) {
		f.t.Fatalf("Get(%v) = %v, %v; want ErrNotFound", k, rec, err)
	}
}

// requireUnchanged requires that the stored record for want.Key still
// equals want.
func (f *fixture) requireUnchanged(want *idemstore.Record, after string) {
	f.t.Helper()
	got := f.get(want.Key)
	if d := diffRecord(got, want); d != "" {
		f.t.Fatalf("record changed after %s: %s", after, d)
	}
}

func requireErrIs(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

// sameInstant compares times at millisecond precision.
func sameInstant(a, b time.Time) bool {
	return a.Truncate(time.Millisecond).Equal(b.Truncate(time.Millisecond))
}

// checkUTC requires every non-zero time of rec to be in UTC.
func checkUTC(t *testing.T, rec *idemstore.Record) {
	t.Helper()
	for name, tm := range map[string]time.Time{"LeaseUntil": rec.LeaseUntil, "CreatedAt": rec.CreatedAt, "UpdatedAt": rec.UpdatedAt, "ExpiresAt": rec.ExpiresAt, "ReadAt": rec.ReadAt} {
		if !tm.IsZero() && tm.Location() != time.UTC {
			t.Errorf("%v: %s = %v is in %v, want UTC", rec.Key, name, tm, tm.Location())
		}
	}
}

// diffRecord describes how got differs from want, or returns "" if they are
// equal (times at millisecond precision, nil and empty bodies and header
// maps alike). The contract says nothing about the token and lease deadline
// of a record that is no longer pending, so those are compared only when
// want is pending.
func diffRecord(got, want *idemstore.Record) string {
	var d []string
	add := func(format string, args ...any) { d = append(d, fmt.Sprintf(format, args...)) }
	if got.Key != want.Key {
		add("Key %q, want %q", got.Key, want.Key)
	}
	if got.Fingerprint != want.Fingerprint {
		add("Fingerprint %q, want %q", got.Fingerprint, want.Fingerprint)
	}
	if got.State != want.State {
		add("State %q, want %q", got.State, want.State)
	}
	if want.State == idemstore.StatePending {
		if got.Token != want.Token {
			add("Token %q, want %q", got.Token, want.Token)
		}
		if !sameInstant(got.LeaseUntil, want.LeaseUntil) {
			add("LeaseUntil %v, want %v", got.LeaseUntil, want.LeaseUntil)
		}
	}
	if got.Reason != want.Reason {
		add("Reason %q, want %q", got.Reason, want.Reason)
	}
	if !sameInstant(got.CreatedAt, want.CreatedAt) {
		add("CreatedAt %v, want %v", got.CreatedAt, want.CreatedAt)
	}
	if !sameInstant(got.UpdatedAt, want.UpdatedAt) {
		add("UpdatedAt %v, want %v", got.UpdatedAt, want.UpdatedAt)
	}
	if rd := diffRequest(got.Request, want.Request); rd != "" {
		add("Request: %s", rd)
	}
	if got.ScopeLabel != want.ScopeLabel {
		add("ScopeLabel %q, want %q", got.ScopeLabel, want.ScopeLabel)
	}
	if !sameInstant(got.ExpiresAt, want.ExpiresAt) {
		add("ExpiresAt %v, want %v", got.ExpiresAt, want.ExpiresAt)
	}
	if rd := diffResponse(got.Response, want.Response); rd != "" {
		add("Response: %s", rd)
	}
	return strings.Join(d, "; ")
}

// diffRequest describes how got differs from want, or returns "". A nil
// body equals an empty one.
func diffRequest(got, want *idemstore.Request) string {
	if got == nil || want == nil {
		if got != want {
			return fmt.Sprintf("got %+v, want %+v", got, want)
		}
		return ""
	}
	if got.Method != want.Method || got.Path != want.Path || got.Query != want.Query || !bytes.Equal(got.Body, want.Body) {
		return fmt.Sprintf("got %s %q ?%q (%d body bytes), want %s %q ?%q (%d body bytes)",
			got.Method, got.Path, got.Query, len(got.Body), want.Method, want.Path, want.Query, len(want.Body))
	}
	return ""
}

// diffResponse describes how got differs from want, or returns "". A nil
// body equals an empty one, and a nil header map an empty one.
func diffResponse(got, want *idemstore.Response) string {
	if got == nil || want == nil {
		if got != want {
			return fmt.Sprintf("got %v, want %v", summary(got), summary(want))
		}
		return ""
	}
	var d []string
	if got.Status != want.Status {
		d = append(d, fmt.Sprintf("Status %d, want %d", got.Status, want.Status))
	}
	if got.NotReplayable != want.NotReplayable {
		d = append(d, fmt.Sprintf("NotReplayable %q, want %q", got.NotReplayable, want.NotReplayable))
	}
	if !bytes.Equal(got.Body, want.Body) {
		d = append(d, fmt.Sprintf("Body (%d bytes) differs from want (%d bytes)%s", len(got.Body), len(want.Body), firstDiff(got.Body, want.Body)))
	}
	if hd := diffHeader(got.Header, want.Header); hd != "" {
		d = append(d, hd)
	}
	return strings.Join(d, "; ")
}

func firstDiff(a, b []byte) string {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return fmt.Sprintf(", first at offset %d: %#x vs %#x", i, a[i], b[i])
		}
	}
	return ""
}

func diffHeader(got, want http.Header) string {
	var d []string
	for name, w := range want {
		if g, ok := got[name]; !ok || !slices.Equal(g, w) {
			d = append(d, fmt.Sprintf("header %q = %q, want %q", name, g, w))
		}
	}
	for name, g := range got {
		if _, ok := want[name]; !ok {
			d = append(d, fmt.Sprintf("unexpected header %q = %q", name, g))
		}
	}
	slices.Sort(d)
	if len(d) > 5 {
		d = append(d[:5], fmt.Sprintf("and %d more", len(d)-5))
	}
	return strings.Join(d, ", ")
}

func summary(r *idemstore.Response) string {
	if r == nil {
		return "nil"
	}
	return fmt.Sprintf("&{Status:%d, %d headers, %d body bytes, NotReplayable:%q}", r.Status, len(r.Header), len(r.Body), r.NotReplayable)
}

// jsonResponse is a small typical answer.
func jsonResponse(body string) *idemstore.Response {
	return &idemstore.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(body),
	}
}
