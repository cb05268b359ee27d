package idemstoretest

import (
	"net/http"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

func testReview(t *testing.T, h Harness) {
	s := h.New(t)

	// escalated reserves a key and escalates it, returning the record as it
	// should now be stored.
	escalated := func(f *fixture, name string) *idemstore.Record {
		f.t.Helper()
		rec := f.reserve(f.key(name), leaseLong)
		f.escalate(rec, "payment provider timed out")
		want := *rec
		want.State = idemstore.StateNeedsReview
		want.Reason = "payment provider timed out"
		f.requireUnchanged(&want, "Escalate")
		if got := f.get(rec.Key); !got.ExpiresAt.IsZero() || got.Response != nil {
			f.t.Fatalf("needs_review record has ExpiresAt %v, response %s; want zero, nil", got.ExpiresAt, summary(got.Response))
		}
		return rec
	}

	t.Run("Escalate", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := escalated(f, "k")
		requireFencedOut(f, rec.Key, rec.Token, "after Escalate")
	})

	t.Run("ResolveComplete", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := escalated(f, "k")
		resp := &idemstore.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"charged":true}`)}
		err := s.Resolve(f.ctx(), idemstore.ResolveParams{
			Key: rec.Key, Action: idemstore.ResolveComplete, Response: resp,
			Reason: "provider confirms the charge", Now: f.base, ExpiresAt: f.base.Add(expireLater),
		})
		if err != nil {
			t.Fatalf("Resolve complete: %v", err)
		}
		got := f.get(rec.Key)
		want := f.expectCompleted(rec, resp, expireLater)
		want.Reason = "provider confirms the charge" // a Reason given replaces the escalation's
		if d := diffRecord(got, want); d != "" {
			t.Fatalf("after Resolve complete: %s", d)
		}
		err = s.Resolve(f.ctx(), idemstore.ResolveParams{Key: rec.Key, Action: idemstore.ResolveRelease, Now: f.base})
		requireErrIs(t, err, idemstore.ErrNotNeedsReview, "Resolve of a resolved record")
		f.requireUnchanged(got, "refused Resolve")
		requireFencedOut(f, rec.Key, rec.Token, "after Resolve")
	})

	t.Run("ResolveCompleteKeepsReason", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := escalated(f, "k")
		resp := &idemstore.Response{Status: http.StatusCreated, Body: []byte(`{}`)}
		err := s.Resolve(f.ctx(), idemstore.ResolveParams{
			Key: rec.Key, Action: idemstore.ResolveComplete, Response: resp,
			Now: f.base, ExpiresAt: f.base.Add(expireLater),
		})
		if err != nil {
			t.Fatalf("Resolve complete without a reason: %v", err)
		}
		if got := f.get(rec.Key); got.Reason != "payment provider timed out" {
			t.Fatalf("after Resolve without a reason, Reason = %q; want the escalation's %q", got.Reason, "payment provider timed out")
		}
	})

	t.Run("ResolveRelease", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := escalated(f, "k")
		err := s.Resolve(f.ctx(), idemstore.ResolveParams{Key: rec.Key, Action: idemstore.ResolveRelease, Reason: "provider has no charge", Now: f.base})
		if err != nil {
			t.Fatalf("Resolve release: %v", err)
		}
		f.requireGone(rec.Key)
		err = s.Resolve(f.ctx(), idemstore.ResolveParams{Key: rec.Key, Action: idemstore.ResolveRelease, Now: f.base})
		requireErrIs(t, err, idemstore.ErrNotFound, "Resolve of a released record")
		f.reserve(rec.Key, leaseLong) // the key can run again
	})

	t.Run("ResolveOtherStates", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		pending := f.reserve(f.key("pending"), leaseLong)
		done := f.reserve(f.key("done"), leaseLong)
		f.complete(done, jsonResponse(`{}`), expireLater)
		for _, k := range []idemstore.Key{pending.Key, done.Key} {
			before := f.get(k)
			for _, p := range []idemstore.ResolveParams{
				{Key: k, Action: idemstore.ResolveComplete, Response: jsonResponse(`{"resolved":true}`), Now: f.base, ExpiresAt: f.base.Add(expireLater)},
				{Key: k, Action: idemstore.ResolveRelease, Now: f.base},
			} {
				err := s.Resolve(f.ctx(), p)
				requireErrIs(t, err, idemstore.ErrNotNeedsReview, "Resolve of a "+string(before.State)+" record")
				f.requireUnchanged(before, "refused Resolve")
			}
		}
		missing := f.key("missing")
		for _, a := range []idemstore.ResolveAction{idemstore.ResolveComplete, idemstore.ResolveRelease} {
			err := s.Resolve(f.ctx(), idemstore.ResolveParams{Key: missing, Action: a, Response: jsonResponse(`{}`), Now: f.base, ExpiresAt: f.base.Add(expireLater)})
			requireErrIs(t, err, idemstore.ErrNotFound, "Resolve of a missing record")
			f.requireGone(missing)
		}
	})
}
