package idemstoretest

import (
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

func testReserve(t *testing.T, h Harness) {
	s := h.New(t)

	t.Run("LongestKey", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		pad := func(prefix string, n int) string { return prefix + strings.Repeat("z", n-len(prefix)) }
		k := idemstore.Key{
			Scope:     pad(f.scope, idemstore.MaxScopeLength),
			Operation: pad("POST /", idemstore.MaxOperationLength),
			Key:       pad("k", idemstore.MaxKeyLength),
		}
		rec := f.reserve(k, leaseLive)
		f.complete(rec, jsonResponse(`{"long":true}`), retainLive)
	})

	t.Run("NewRecord", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		k := f.key("new")
		// A lease with sub-millisecond parts survives at least to the
		// millisecond; the request is kept as given.
		p := idemstore.ReserveParams{
			Key:         k,
			Fingerprint: "v1:sha256:abc",
			Token:       newToken(),
			Lease:       leaseLive + 123*time.Millisecond + 400*time.Microsecond,
			Request:     &idemstore.Request{Method: "POST", Path: "/things", Query: "a=1&b=%20", Body: []byte(`{"amount":100}`)},
		}
		got := f.reserveWith(p)
		want := &idemstore.Record{
			Key:         k,
			Fingerprint: p.Fingerprint,
			State:       idemstore.StatePending,
			Token:       p.Token,
			LeaseUntil:  got.LeaseUntil, // checked against CreatedAt by reserveWith
			Request:     p.Request,
			CreatedAt:   got.CreatedAt,
			UpdatedAt:   got.CreatedAt,
		}
		if d := diffRecord(got, want); d != "" {
			t.Fatalf("Get after Reserve: %s", d)
		}
	})

	t.Run("ExistingPending", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		first := f.reserve(f.key("k"), leaseLive)
		rec, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{
			Key: first.Key, Fingerprint: "another", Token: newToken(), Lease: leaseLonger,
			Request: &idemstore.Request{Method: "POST", Path: "/other"},
		})
		if err != nil {
			t.Fatalf("second Reserve: %v", err)
		}
		if created {
			t.Fatal("second Reserve: created = true for an existing key")
		}
		checkUTC(t, rec)
		if d := diffRecord(rec, first); d != "" {
			t.Fatalf("second Reserve must return the existing record unchanged: %s", d)
		}
		if rec.ReadAt.Before(first.ReadAt) || rec.LeaseExpired() {
			t.Fatalf("second Reserve: the existing record was read at %v (first read at %v) with its live lease until %v judged expired",
				rec.ReadAt, first.ReadAt, rec.LeaseUntil)
		}
		f.requireUnchanged(first, "a second Reserve")
	})

	t.Run("ExistingExpiredIsNotReplaced", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		first := f.reserve(f.key("k"), leaseExpired)
		rec, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: first.Key, Fingerprint: first.Fingerprint, Token: newToken(), Lease: leaseLive})
		if err != nil || created {
			t.Fatalf("Reserve over an expired lease: created = %v, err = %v; want false, nil (only Takeover replaces a holder)", created, err)
		}
		if !rec.LeaseExpired() {
			t.Fatalf("Reserve returned the expired lease (until %v) read at %v: LeaseExpired = false", rec.LeaseUntil, rec.ReadAt)
		}
		f.requireUnchanged(first, "Reserve over an expired lease")
	})

	t.Run("ExistingCompleted", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		want := f.complete(rec, jsonResponse(`{"id":42}`), retainLive)
		got, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: rec.Key, Fingerprint: rec.Fingerprint, Token: newToken(), Lease: leaseLive})
		if err != nil || created {
			t.Fatalf("Reserve of a completed key: created = %v, err = %v; want false, nil", created, err)
		}
		checkUTC(t, got)
		if d := diffRecord(got, want); d != "" {
			t.Fatalf("Reserve of a completed key must return the stored answer: %s", d)
		}
		f.requireUnchanged(want, "Reserve of a completed key")
	})

	t.Run("ExistingNeedsReview", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		want := f.escalate(rec, "provider timed out")
		got, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: rec.Key, Fingerprint: rec.Fingerprint, Token: newToken(), Lease: leaseLive})
		if err != nil || created {
			t.Fatalf("Reserve of a needs_review key: created = %v, err = %v; want false, nil", created, err)
		}
		if d := diffRecord(got, want); d != "" {
			t.Fatalf("Reserve of a needs_review key: %s", d)
		}
	})

	t.Run("IndependentScopesAndOperations", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		other := newScope()
		keys := []idemstore.Key{
			{Scope: f.scope, Operation: "POST /a", Key: "same"},
			{Scope: other, Operation: "POST /a", Key: "same"},
			{Scope: f.scope, Operation: "POST /b", Key: "same"},
			{Scope: f.scope, Operation: "POST /a", Key: "Same"},
			{Scope: f.scope, Operation: "post /a", Key: "same"},
		}
		recs := make([]*idemstore.Record, len(keys))
		for i, k := range keys {
			recs[i] = f.reserve(k, leaseLive) // fails unless created
		}
		for _, r := range recs {
			f.requireUnchanged(r, "reserving the same key elsewhere")
		}
		// Finishing one leaves the others alone.
		f.complete(recs[0], jsonResponse(`{}`), retainLive)
		for _, r := range recs[1:] {
			f.requireUnchanged(r, "completing the same key in another scope or operation")
		}
	})
}
