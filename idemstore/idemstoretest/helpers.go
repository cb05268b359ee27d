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

// Offsets from a test's base time. Every completed record expires in the
// future and every lease the suite calls expired still lies in the future of
// the wall clock: only the Now passed to the store says it has expired. This
// keeps stores with real TTLs honest.
const (
	hour        = time.Hour
	leaseShort  = 1 * hour // a lease the suite later treats as expired
	clockLater  = 2 * hour // the Now at which leaseShort has expired
	leaseLong   = 3 * hour // a lease still alive at clockLater
	expireSoon  = 1 * hour // ExpiresAt purged by Purge{Before: base+clockLater}
	expireLater = 3 * hour // ExpiresAt kept by that purge
)

// baseTime is the suite's clock: now, in UTC, at millisecond precision.
func baseTime() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

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

// fixture holds what one subtest needs: a store, a private scope and a base
// time.
type fixture struct {
	t     *testing.T
	s     idemstore.Store
	scope string
	base  time.Time
}

func newFixture(t *testing.T, s idemstore.Store) *fixture {
	return &fixture{t: t, s: s, scope: newScope(), base: baseTime()}
}

func (f *fixture) ctx() context.Context { return f.t.Context() }

// key returns a key in the fixture's scope.
func (f *fixture) key(name string) idemstore.Key {
	return idemstore.Key{Scope: f.scope, Operation: "POST /things", Key: name}
}

// reserve reserves k with a fresh token and a lease of base+lease, and
// requires that it was created.
func (f *fixture) reserve(k idemstore.Key, lease time.Duration) *idemstore.Record {
	f.t.Helper()
	p := idemstore.ReserveParams{
		Key:         k,
		Fingerprint: "fp-" + k.Key,
		Token:       newToken(),
		LeaseUntil:  f.base.Add(lease),
		Now:         f.base,
	}
	rec, created, err := f.s.Reserve(f.ctx(), p)
	if err != nil {
		f.t.Fatalf("Reserve(%v): %v", k, err)
	}
	if !created {
		f.t.Fatalf("Reserve(%v): created = false for a fresh key", k)
	}
	if rec != nil {
		f.t.Fatalf("Reserve(%v): created, with a record %+v; want nil", k, *rec)
	}
	rec = f.get(k)
	if rec.Token != p.Token || rec.State != idemstore.StatePending {
		f.t.Fatalf("Reserve(%v): stored token %q in state %s, want %q pending", k, rec.Token, rec.State, p.Token)
	}
	return rec
}

// complete completes rec (reserved by this fixture) with resp and
// ExpiresAt = base+expires.
func (f *fixture) complete(rec *idemstore.Record, resp *idemstore.Response, expires time.Duration) {
	f.t.Helper()
	err := f.s.Complete(f.ctx(), idemstore.CompleteParams{
		Key: rec.Key, Token: rec.Token, Response: resp, Now: f.base, ExpiresAt: f.base.Add(expires),
	})
	if err != nil {
		f.t.Fatalf("Complete(%v): %v", rec.Key, err)
	}
}

func (f *fixture) escalate(rec *idemstore.Record, reason string) {
	f.t.Helper()
	err := f.s.Escalate(f.ctx(), idemstore.EscalateParams{Key: rec.Key, Token: rec.Token, Reason: reason, Now: f.base})
	if err != nil {
		f.t.Fatalf("Escalate(%v): %v", rec.Key, err)
	}
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
	for name, tm := range map[string]time.Time{"LeaseUntil": rec.LeaseUntil, "CreatedAt": rec.CreatedAt, "ExpiresAt": rec.ExpiresAt} {
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
	if !sameInstant(got.ExpiresAt, want.ExpiresAt) {
		add("ExpiresAt %v, want %v", got.ExpiresAt, want.ExpiresAt)
	}
	if rd := diffResponse(got.Response, want.Response); rd != "" {
		add("Response: %s", rd)
	}
	return strings.Join(d, "; ")
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

// expectCompleted is what rec looks like after fixture.complete.
func (f *fixture) expectCompleted(rec *idemstore.Record, resp *idemstore.Response, expires time.Duration) *idemstore.Record {
	want := *rec
	want.State = idemstore.StateCompleted
	want.Response = resp
	want.ExpiresAt = f.base.Add(expires)
	return &want
}
