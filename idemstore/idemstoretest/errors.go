package idemstoretest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

func testErrors(t *testing.T, h Harness) {
	s := h.New(t)

	cancelled := func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}

	t.Run("CancelledReserve", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		k := f.key("k")
		rec, created, err := s.Reserve(cancelled(), idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: newToken(), Lease: leaseLive})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Reserve with a cancelled context: err = %v, want context.Canceled", err)
		}
		if created {
			t.Fatalf("Reserve with a cancelled context reported created (record %v)", rec)
		}
		f.requireGone(k)
	})

	t.Run("CancelledGet", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		_, err := s.Get(cancelled(), rec.Key)
		requireErrIs(t, err, context.Canceled, "Get with a cancelled context")
		_, err = s.Get(cancelled(), f.key("missing"))
		requireErrIs(t, err, context.Canceled, "Get of a missing key with a cancelled context")
	})

	t.Run("CancelledComplete", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		err := s.Complete(cancelled(), idemstore.CompleteParams{Key: rec.Key, Token: rec.Token, Response: jsonResponse(`{}`), Retention: retainLive})
		requireErrIs(t, err, context.Canceled, "Complete with a cancelled context")
		f.requireUnchanged(rec, "Complete with a cancelled context")
	})

	t.Run("DeadlineExceeded", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		k := f.key("k")
		_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: newToken(), Lease: leaseLive})
		if !errors.Is(err, context.DeadlineExceeded) || created {
			t.Fatalf("Reserve past its deadline: created = %v, err = %v; want false, context.DeadlineExceeded", created, err)
		}
		f.requireGone(k)
	})
}

func testUnavailable(t *testing.T, h Harness) {
	if h.Unavailable == nil {
		t.Skip("Harness.Unavailable is not set")
	}
	s := h.Unavailable(t)
	k := idemstore.Key{Scope: newScope(), Operation: "POST /things", Key: "k"}
	resp := jsonResponse(`{}`)
	calls := []struct {
		name string
		call func(t *testing.T, ctx context.Context) error
	}{
		{"Reserve", func(t *testing.T, ctx context.Context) error {
			rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: newToken(), Lease: leaseLive})
			if created {
				t.Errorf("Reserve on an unreachable store reported created (record %v)", rec)
			}
			return err
		}},
		{"Get", func(t *testing.T, ctx context.Context) error { _, err := s.Get(ctx, k); return err }},
		{"Complete", func(t *testing.T, ctx context.Context) error {
			return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t", Response: resp, Retention: retainLive})
		}},
		{"Release", func(t *testing.T, ctx context.Context) error {
			return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "t"})
		}},
		{"Escalate", func(t *testing.T, ctx context.Context) error {
			return s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "t", Reason: "r"})
		}},
		{"Extend", func(t *testing.T, ctx context.Context) error {
			return s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "t", Lease: leaseLive})
		}},
		{"Takeover", func(t *testing.T, ctx context.Context) error {
			return s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: "t", NewToken: "u", Lease: leaseLive})
		}},
		{"ResolveComplete", func(t *testing.T, ctx context.Context) error {
			return s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveComplete, Response: resp, Retention: retainLive})
		}},
		{"ResolveRelease", func(t *testing.T, ctx context.Context) error {
			return s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveRelease})
		}},
		{"Delete", func(t *testing.T, ctx context.Context) error { return s.Delete(ctx, idemstore.DeleteParams{Key: k}) }},
		{"ListExpiredLeases", func(t *testing.T, ctx context.Context) error {
			_, err := s.ListExpiredLeases(ctx, 10)
			return err
		}},
		{"List", func(t *testing.T, ctx context.Context) error {
			_, err := s.List(ctx, idemstore.ListParams{Limit: 10})
			return err
		}},
		{"Purge", func(t *testing.T, ctx context.Context) error {
			_, err := s.Purge(ctx, idemstore.PurgeParams{BatchSize: 10})
			return err
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// A generous bound so a store that hangs fails instead of
			// blocking the run; it is not a timing assertion.
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			err := c.call(t, ctx)
			if !errors.Is(err, idemstore.ErrUnavailable) {
				t.Fatalf("%s on an unreachable store: err = %v, want one wrapping idemstore.ErrUnavailable", c.name, err)
			}
		})
	}
}
