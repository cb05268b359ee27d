package idemstoretest

import (
	"context"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// fencedOp is one of the token-fenced changes, applied with a given token.
type fencedOp struct {
	name string
	do   func(ctx context.Context, s idemstore.Store, k idemstore.Key, token string) error
}

var fencedOps = []fencedOp{
	{"Complete", func(ctx context.Context, s idemstore.Store, k idemstore.Key, token string) error {
		return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: token, Response: jsonResponse(`{"stale":true}`), Retention: retainLive})
	}},
	{"Release", func(ctx context.Context, s idemstore.Store, k idemstore.Key, token string) error {
		return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: token})
	}},
	{"ReleaseIfExpired", func(ctx context.Context, s idemstore.Store, k idemstore.Key, token string) error {
		return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: token, IfExpired: true})
	}},
	{"Escalate", func(ctx context.Context, s idemstore.Store, k idemstore.Key, token string) error {
		return s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: token, Reason: "stale"})
	}},
	{"EscalateIfExpired", func(ctx context.Context, s idemstore.Store, k idemstore.Key, token string) error {
		return s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: token, Reason: "stale", IfExpired: true})
	}},
	{"Extend", func(ctx context.Context, s idemstore.Store, k idemstore.Key, token string) error {
		return s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: token, Lease: leaseLonger})
	}},
	{"Takeover", func(ctx context.Context, s idemstore.Store, k idemstore.Key, token string) error {
		return s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: token, NewToken: newToken(), Lease: leaseLive})
	}},
}

// requireFencedOut requires every fenced change with token to fail with
// ErrLeaseLost and to leave the record for k as it was.
func requireFencedOut(f *fixture, k idemstore.Key, token, why string) {
	f.t.Helper()
	before := f.get(k)
	for _, op := range fencedOps {
		err := op.do(f.ctx(), f.s, k, token)
		requireErrIs(f.t, err, idemstore.ErrLeaseLost, op.name+" "+why)
		f.requireUnchanged(before, op.name+" "+why)
	}
}

func testFencing(t *testing.T, h Harness) {
	s := h.New(t)

	t.Run("StaleToken", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseExpired) // expired, so only the token fences
		requireFencedOut(f, rec.Key, newToken(), "with a wrong token")
		requireFencedOut(f, rec.Key, "", "with an empty token")
	})

	t.Run("MissingRecord", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		k := f.key("never-reserved")
		for _, op := range fencedOps {
			err := op.do(f.ctx(), s, k, newToken())
			requireErrIs(t, err, idemstore.ErrLeaseLost, op.name+" of a missing record")
			f.requireGone(k)
		}
	})

	t.Run("Complete", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		want := f.complete(rec, jsonResponse(`{"id":1}`), retainLive)

		// A second Complete with the same token is fenced out, and so is
		// every other change: the record stays completed with its answer.
		requireFencedOut(f, rec.Key, rec.Token, "after Complete")
		f.requireUnchanged(want, "changes after Complete")
	})

	t.Run("CompleteIgnoresLeaseDeadline", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseExpired)
		// The token alone fences Complete: a holder whose lease ran out but
		// was not taken over still completes.
		f.complete(rec, jsonResponse(`{"late":true}`), retainLive)
	})

	t.Run("ReleaseAfterComplete", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		want := f.complete(rec, jsonResponse(`{"id":2}`), retainLive)
		err := s.Release(f.ctx(), idemstore.ReleaseParams{Key: rec.Key, Token: rec.Token})
		requireErrIs(t, err, idemstore.ErrLeaseLost, "Release after Complete")
		f.requireUnchanged(want, "Release after Complete")
	})

	t.Run("Extend", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseExpired)
		// Extend works on an expired lease not yet taken over, and moves
		// the deadline either way; only LeaseUntil and UpdatedAt change.
		rec = f.extend(rec, leaseLonger)
		rec = f.extend(rec, leaseLive)
		if rec.LeaseExpired() {
			t.Fatalf("after Extend to %v the lease until %v is expired at %v", leaseLive, rec.LeaseUntil, rec.ReadAt)
		}
		// The extended lease is still the same lease: its token completes it.
		f.complete(rec, jsonResponse(`{}`), retainLive)
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		if err := s.Release(f.ctx(), idemstore.ReleaseParams{Key: rec.Key, Token: rec.Token}); err != nil {
			t.Fatalf("Release: %v", err)
		}
		f.requireGone(rec.Key)
		err := s.Release(f.ctx(), idemstore.ReleaseParams{Key: rec.Key, Token: rec.Token})
		requireErrIs(t, err, idemstore.ErrLeaseLost, "second Release")

		// The key can be reserved again, and the released holder cannot
		// touch the new reservation.
		again := f.reserve(rec.Key, leaseLive)
		if again.Token == rec.Token {
			t.Fatal("test bug: tokens collide")
		}
		requireFencedOut(f, rec.Key, rec.Token, "with the token of a released reservation")
		f.complete(again, jsonResponse(`{"second":true}`), retainLive)
	})
}
