package idemstoretest

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

func testReview(t *testing.T, h Harness) {
	s := h.New(t)

	// escalated reserves a key and escalates it, returning the record as
	// stored.
	escalated := func(f *fixture, name string) *idemstore.Record {
		f.t.Helper()
		return f.escalate(f.reserve(f.key(name), leaseLive), "payment provider timed out")
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
		lo, hi, got, err := f.during(rec.Key, func() error {
			return s.Resolve(f.ctx(), idemstore.ResolveParams{
				Key: rec.Key, Action: idemstore.ResolveComplete, Response: resp,
				Reason: "provider confirms the charge", Retention: retainLive,
			})
		})
		if err != nil {
			t.Fatalf("Resolve complete: %v", err)
		}
		requireWithin(t, "ExpiresAt", got.ExpiresAt, retainLive, lo, hi)
		requireWithin(t, "UpdatedAt", got.UpdatedAt, 0, lo, hi)
		want := *rec
		want.State = idemstore.StateCompleted
		want.Response = resp
		want.Reason = "provider confirms the charge" // a Reason given replaces the escalation's
		want.ExpiresAt, want.UpdatedAt = got.ExpiresAt, got.UpdatedAt
		if d := diffRecord(got, &want); d != "" {
			t.Fatalf("after Resolve complete: %s", d)
		}
		err = s.Resolve(f.ctx(), idemstore.ResolveParams{Key: rec.Key, Action: idemstore.ResolveRelease})
		requireErrIs(t, err, idemstore.ErrNotNeedsReview, "Resolve of a resolved record")
		f.requireUnchanged(got, "refused Resolve")
		requireFencedOut(f, rec.Key, rec.Token, "after Resolve")
	})

	t.Run("ResolveCompleteKeepsReason", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := escalated(f, "k")
		resp := &idemstore.Response{Status: http.StatusCreated, Body: []byte(`{}`)}
		err := s.Resolve(f.ctx(), idemstore.ResolveParams{Key: rec.Key, Action: idemstore.ResolveComplete, Response: resp, Retention: retainLive})
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
		err := s.Resolve(f.ctx(), idemstore.ResolveParams{Key: rec.Key, Action: idemstore.ResolveRelease, Reason: "provider has no charge"})
		if err != nil {
			t.Fatalf("Resolve release: %v", err)
		}
		f.requireGone(rec.Key)
		err = s.Resolve(f.ctx(), idemstore.ResolveParams{Key: rec.Key, Action: idemstore.ResolveRelease})
		requireErrIs(t, err, idemstore.ErrNotFound, "Resolve of a released record")
		f.reserve(rec.Key, leaseLive) // the key can run again
	})

	// A verdict about an earlier attempt must not settle a later one: with
	// a Token, Resolve acts only on the attempt escalated under it.
	t.Run("ResolveFencedByToken", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		for _, action := range []idemstore.ResolveAction{idemstore.ResolveComplete, idemstore.ResolveRelease} {
			rec := escalated(f, fmt.Sprintf("k%d", action))
			stale := idemstore.ResolveParams{Key: rec.Key, Action: action, Token: newToken(), Response: jsonResponse(`{"stale":true}`), Retention: retainLive}
			requireErrIs(t, s.Resolve(f.ctx(), stale), idemstore.ErrLeaseLost, "Resolve with another attempt's token")
			f.requireUnchanged(rec, "Resolve with another attempt's token")
			ok := stale
			ok.Token = rec.Token
			if err := s.Resolve(f.ctx(), ok); err != nil {
				t.Fatalf("Resolve with the escalated attempt's token: %v", err)
			}
			if action == idemstore.ResolveRelease {
				f.requireGone(rec.Key)
			} else if got := f.get(rec.Key); got.State != idemstore.StateCompleted {
				t.Fatalf("after Resolve complete with the right token: %q", got.State)
			}
		}
	})

	t.Run("ResolveOtherStates", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		pending := f.reserve(f.key("pending"), leaseLive)
		expired := f.reserve(f.key("expired"), leaseExpired)
		done := f.reserve(f.key("done"), leaseLive)
		f.complete(done, jsonResponse(`{}`), retainLive)
		for _, k := range []idemstore.Key{pending.Key, expired.Key, done.Key} {
			before := f.get(k)
			for _, p := range []idemstore.ResolveParams{
				{Key: k, Action: idemstore.ResolveComplete, Response: jsonResponse(`{"resolved":true}`), Retention: retainLive},
				{Key: k, Action: idemstore.ResolveRelease},
			} {
				err := s.Resolve(f.ctx(), p)
				requireErrIs(t, err, idemstore.ErrNotNeedsReview, "Resolve of a "+string(before.State)+" record")
				f.requireUnchanged(before, "refused Resolve")
			}
		}
		missing := f.key("missing")
		for _, a := range []idemstore.ResolveAction{idemstore.ResolveComplete, idemstore.ResolveRelease} {
			err := s.Resolve(f.ctx(), idemstore.ResolveParams{Key: missing, Action: a, Response: jsonResponse(`{}`), Retention: retainLive})
			requireErrIs(t, err, idemstore.ErrNotFound, "Resolve of a missing record")
			f.requireGone(missing)
		}
	})
}
