package idemstoretest

import (
	"context"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// fencedOp is one of the token-fenced changes, applied with a given token.
type fencedOp struct {
	name string
	do   func(ctx context.Context, s idemstore.Store, f *fixture, k idemstore.Key, token string) error
}

var fencedOps = []fencedOp{
	{"Complete", func(ctx context.Context, s idemstore.Store, f *fixture, k idemstore.Key, token string) error {
		return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: token, Response: jsonResponse(`{"stale":true}`), Now: f.base, ExpiresAt: f.base.Add(expireLater)})
	}},
	{"Release", func(ctx context.Context, s idemstore.Store, f *fixture, k idemstore.Key, token string) error {
		return s.Release(ctx, k, token)
	}},
	{"Escalate", func(ctx context.Context, s idemstore.Store, f *fixture, k idemstore.Key, token string) error {
		return s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: token, Reason: "stale", Now: f.base})
	}},
	{"Extend", func(ctx context.Context, s idemstore.Store, f *fixture, k idemstore.Key, token string) error {
		return s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: token, LeaseUntil: f.base.Add(leaseLong + hour), Now: f.base})
	}},
}

// requireFencedOut requires every fenced change with token to fail with
// ErrLeaseLost and to leave the record for k as it was.
func requireFencedOut(f *fixture, k idemstore.Key, token, why string) {
	f.t.Helper()
	before := f.get(k)
	for _, op := range fencedOps {
		err := op.do(f.ctx(), f.s, f, k, token)
		requireErrIs(f.t, err, idemstore.ErrLeaseLost, op.name+" "+why)
		f.requireUnchanged(before, op.name+" "+why)
	}
}

func testFencing(t *testing.T, h Harness) {
	s := h.New(t)

	t.Run("StaleToken", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLong)
		requireFencedOut(f, rec.Key, newToken(), "with a wrong token")
		requireFencedOut(f, rec.Key, "", "with an empty token")
	})

	t.Run("MissingRecord", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		k := f.key("never-reserved")
		for _, op := range fencedOps {
			err := op.do(f.ctx(), s, f, k, newToken())
			requireErrIs(t, err, idemstore.ErrLeaseLost, op.name+" of a missing record")
			f.requireGone(k)
		}
	})

	t.Run("Complete", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLong)
		resp := jsonResponse(`{"id":1}`)
		f.complete(rec, resp, expireLater)
		want := f.expectCompleted(rec, resp, expireLater)
		f.requireUnchanged(want, "Complete")

		// A second Complete with the same token is fenced out, and so is
		// every other change: the record stays completed with its answer.
		requireFencedOut(f, rec.Key, rec.Token, "after Complete")
		f.requireUnchanged(want, "changes after Complete")
	})

	t.Run("CompleteIgnoresLeaseDeadline", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseShort)
		resp := jsonResponse(`{"late":true}`)
		err := s.Complete(f.ctx(), idemstore.CompleteParams{
			Key: rec.Key, Token: rec.Token, Response: resp,
			Now: f.base.Add(clockLater), ExpiresAt: f.base.Add(expireLater),
		})
		if err != nil {
			t.Fatalf("Complete after the lease deadline, token still valid: %v (the token alone fences Complete)", err)
		}
		f.requireUnchanged(f.expectCompleted(rec, resp, expireLater), "late Complete")
	})

	t.Run("ReleaseAfterComplete", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLong)
		resp := jsonResponse(`{"id":2}`)
		f.complete(rec, resp, expireLater)
		err := s.Release(f.ctx(), rec.Key, rec.Token)
		requireErrIs(t, err, idemstore.ErrLeaseLost, "Release after Complete")
		f.requireUnchanged(f.expectCompleted(rec, resp, expireLater), "Release after Complete")
	})

	t.Run("Extend", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseShort)
		want := *rec
		for i, d := range []time.Duration{leaseLong, leaseLong + 30*time.Minute + 5*time.Millisecond} {
			want.LeaseUntil = f.base.Add(d)
			err := s.Extend(f.ctx(), idemstore.ExtendParams{Key: rec.Key, Token: rec.Token, LeaseUntil: want.LeaseUntil, Now: f.base.Add(time.Duration(i) * time.Minute)})
			if err != nil {
				t.Fatalf("Extend #%d: %v", i+1, err)
			}
			f.requireUnchanged(&want, "Extend (only LeaseUntil may move)")
		}
		// The extended lease is still the same lease: its token completes it.
		f.complete(rec, jsonResponse(`{}`), expireLater)
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLong)
		if err := s.Release(f.ctx(), rec.Key, rec.Token); err != nil {
			t.Fatalf("Release: %v", err)
		}
		f.requireGone(rec.Key)
		err := s.Release(f.ctx(), rec.Key, rec.Token)
		requireErrIs(t, err, idemstore.ErrLeaseLost, "second Release")

		// The key can be reserved again, and the released holder cannot
		// touch the new reservation.
		again := f.reserve(rec.Key, leaseLong)
		if again.Token == rec.Token {
			t.Fatal("test bug: tokens collide")
		}
		requireFencedOut(f, rec.Key, rec.Token, "with the token of a released reservation")
		f.complete(again, jsonResponse(`{"second":true}`), expireLater)
	})
}
