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
		rec := f.reserve(k, leaseLong)
		resp := jsonResponse(`{"long":true}`)
		f.complete(rec, resp, expireLater)
		if d := diffRecord(f.get(k), f.expectCompleted(rec, resp, expireLater)); d != "" {
			t.Fatalf("record with the longest key: %s", d)
		}
	})

	t.Run("NewRecord", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		k := f.key("new")
		// Sub-millisecond parts must survive at least to the millisecond.
		p := idemstore.ReserveParams{
			Key:         k,
			Fingerprint: "v1:sha256:abc",
			Token:       newToken(),
			LeaseUntil:  f.base.Add(leaseLong + 123*time.Millisecond + 400*time.Microsecond),
			Now:         f.base.Add(7*time.Millisecond + 300*time.Microsecond),
		}
		rec, created, err := s.Reserve(f.ctx(), p)
		if err != nil {
			t.Fatalf("Reserve: %v", err)
		}
		if !created || rec != nil {
			t.Fatalf("Reserve of a fresh key: created = %v, record %v; want true, nil", created, rec)
		}
		want := &idemstore.Record{
			Key:         k,
			Fingerprint: p.Fingerprint,
			State:       idemstore.StatePending,
			Token:       p.Token,
			LeaseUntil:  p.LeaseUntil,
			CreatedAt:   p.Now,
		}
		got := f.get(k)
		checkUTC(t, got)
		if d := diffRecord(got, want); d != "" {
			t.Fatalf("Get after Reserve: %s", d)
		}
		if !got.ExpiresAt.IsZero() || got.Response != nil {
			t.Errorf("Get: pending record has ExpiresAt %v, response %s; want zero, nil", got.ExpiresAt, summary(got.Response))
		}
	})

	t.Run("ExistingPending", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		first := f.reserve(f.key("k"), leaseLong)
		rec, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{
			Key: first.Key, Fingerprint: "another", Token: newToken(),
			LeaseUntil: f.base.Add(leaseLong + hour), Now: f.base.Add(time.Second),
		})
		if err != nil {
			t.Fatalf("second Reserve: %v", err)
		}
		if created {
			t.Fatal("second Reserve: created = true for an existing key")
		}
		if d := diffRecord(rec, first); d != "" {
			t.Fatalf("second Reserve must return the existing record unchanged: %s", d)
		}
		f.requireUnchanged(first, "a second Reserve")
	})

	t.Run("ExistingCompleted", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLong)
		resp := jsonResponse(`{"id":42}`)
		f.complete(rec, resp, expireLater)
		want := f.expectCompleted(rec, resp, expireLater)
		got, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{
			Key: rec.Key, Fingerprint: rec.Fingerprint, Token: newToken(),
			LeaseUntil: f.base.Add(leaseLong), Now: f.base.Add(time.Second),
		})
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
		rec := f.reserve(f.key("k"), leaseLong)
		f.escalate(rec, "provider timed out")
		want := *rec
		want.State = idemstore.StateNeedsReview
		want.Reason = "provider timed out"
		got, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{
			Key: rec.Key, Fingerprint: rec.Fingerprint, Token: newToken(),
			LeaseUntil: f.base.Add(leaseLong), Now: f.base.Add(time.Second),
		})
		if err != nil || created {
			t.Fatalf("Reserve of a needs_review key: created = %v, err = %v; want false, nil", created, err)
		}
		if d := diffRecord(got, &want); d != "" {
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
			recs[i] = f.reserve(k, leaseLong) // fails unless created
		}
		for _, r := range recs {
			f.requireUnchanged(r, "reserving the same key elsewhere")
		}
		// Finishing one leaves the others alone.
		f.complete(recs[0], jsonResponse(`{}`), expireLater)
		for _, r := range recs[1:] {
			f.requireUnchanged(r, "completing the same key in another scope or operation")
		}
	})
}
