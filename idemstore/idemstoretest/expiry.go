package idemstoretest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// testExpiry checks the changes that recovery makes to expired leases:
// Release and Escalate with IfExpired act only on a lease that has expired
// by the store's clock, and an Extend that lands first always wins.
func testExpiry(t *testing.T, h Harness) {
	s := h.New(t)

	releaseIfExpired := func(f *fixture, rec *idemstore.Record) error {
		return s.Release(f.ctx(), idemstore.ReleaseParams{Key: rec.Key, Token: rec.Token, IfExpired: true})
	}
	escalateIfExpired := func(f *fixture, rec *idemstore.Record) error {
		return s.Escalate(f.ctx(), idemstore.EscalateParams{Key: rec.Key, Token: rec.Token, Reason: "lease expired", IfExpired: true})
	}

	t.Run("RefusedWhileLeaseAlive", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		requireErrIs(t, releaseIfExpired(f, rec), idemstore.ErrLeaseLost, "Release IfExpired of a live lease")
		f.requireUnchanged(rec, "refused Release IfExpired")
		requireErrIs(t, escalateIfExpired(f, rec), idemstore.ErrLeaseLost, "Escalate IfExpired of a live lease")
		f.requireUnchanged(rec, "refused Escalate IfExpired")
	})

	t.Run("ReleaseAfterExpiry", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseExpired)
		if err := releaseIfExpired(f, rec); err != nil {
			t.Fatalf("Release IfExpired of an expired lease: %v", err)
		}
		f.requireGone(rec.Key)
	})

	t.Run("ReleaseAtDeadline", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		// A lease of zero ends as it is granted: LeaseUntil <= now.
		rec := f.reserve(f.key("k"), 0)
		if err := releaseIfExpired(f, rec); err != nil {
			t.Fatalf("Release IfExpired of a lease at its deadline: %v", err)
		}
		f.requireGone(rec.Key)
	})

	t.Run("EscalateAfterExpiry", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseExpired)
		lo, hi, got, err := f.during(rec.Key, func() error { return escalateIfExpired(f, rec) })
		if err != nil {
			t.Fatalf("Escalate IfExpired of an expired lease: %v", err)
		}
		requireWithin(t, "UpdatedAt", got.UpdatedAt, 0, lo, hi)
		if got.State != idemstore.StateNeedsReview || got.Reason != "lease expired" {
			t.Fatalf("after Escalate IfExpired: state %q reason %q, want needs_review, %q", got.State, got.Reason, "lease expired")
		}
	})

	t.Run("ExtendFirstWins", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		// Recovery saw the lease expired, then the holder's heartbeat
		// landed: recovery must change nothing.
		rec := f.reserve(f.key("k"), leaseExpired)
		listed := false
		for _, r := range listExpired(t, f) {
			listed = listed || r.Key == rec.Key
		}
		if !listed {
			t.Fatalf("ListExpiredLeases does not list the expired lease of %v", rec.Key)
		}
		rec = f.extend(rec, leaseLive)
		requireErrIs(t, releaseIfExpired(f, rec), idemstore.ErrLeaseLost, "Release IfExpired after the lease was extended")
		requireErrIs(t, escalateIfExpired(f, rec), idemstore.ErrLeaseLost, "Escalate IfExpired after the lease was extended")
		err := s.Takeover(f.ctx(), idemstore.TakeoverParams{Key: rec.Key, OldToken: rec.Token, NewToken: newToken(), Lease: leaseLive})
		requireErrIs(t, err, idemstore.ErrLeaseLost, "Takeover after the lease was extended")
		f.requireUnchanged(rec, "recovery after an Extend")
		for _, r := range listExpired(t, f) {
			if r.Key == rec.Key {
				t.Fatalf("ListExpiredLeases still lists %v after its lease was extended to %v", rec.Key, rec.LeaseUntil)
			}
		}
	})

	// Extend racing each recovery change on an expired lease: exactly one
	// of the two succeeds, and the record shows which.
	for _, rc := range []struct {
		name  string
		do    func(f *fixture, rec *idemstore.Record) error
		check func(t *testing.T, f *fixture, rec *idemstore.Record)
	}{
		{"ReleaseRacesExtend", releaseIfExpired, func(t *testing.T, f *fixture, rec *idemstore.Record) { f.requireGone(rec.Key) }},
		{"EscalateRacesExtend", escalateIfExpired, func(t *testing.T, f *fixture, rec *idemstore.Record) {
			if got := f.get(rec.Key); got.State != idemstore.StateNeedsReview {
				t.Fatalf("Escalate IfExpired won but the record is %q", got.State)
			}
		}},
		{"TakeoverRacesExtend", func(f *fixture, rec *idemstore.Record) error {
			return s.Takeover(f.ctx(), idemstore.TakeoverParams{Key: rec.Key, OldToken: rec.Token, NewToken: "taken-" + rec.Token, Lease: leaseLive})
		}, func(t *testing.T, f *fixture, rec *idemstore.Record) {
			if got := f.get(rec.Key); got.State != idemstore.StatePending || got.Token != "taken-"+rec.Token {
				t.Fatalf("Takeover won but the record is %q with token %q", got.State, got.Token)
			}
		}},
	} {
		t.Run(rc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, s)
			for round := range 10 {
				rec := f.reserve(f.key(fmt.Sprintf("k%d", round)), leaseExpired)
				var (
					wg                sync.WaitGroup
					start             = make(chan struct{})
					extendErr, recErr error
				)
				wg.Add(2)
				go func() {
					defer wg.Done()
					<-start
					extendErr = s.Extend(f.ctx(), idemstore.ExtendParams{Key: rec.Key, Token: rec.Token, Lease: leaseLive})
				}()
				go func() {
					defer wg.Done()
					<-start
					recErr = rc.do(f, rec)
				}()
				close(start)
				wg.Wait()
				for _, err := range []error{extendErr, recErr} {
					if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
						t.Fatalf("round %d: %v", round, err)
					}
				}
				switch {
				case extendErr == nil && recErr == nil:
					// An Extend that lands first makes the lease live, so
					// the recovery change is refused; one that lands second
					// finds the record changed. Never both.
					t.Fatalf("round %d: both Extend and %s succeeded", round, rc.name)
				case extendErr == nil:
					got := f.get(rec.Key)
					if got.State != idemstore.StatePending || got.Token != rec.Token || got.LeaseExpired() {
						t.Fatalf("round %d: Extend won but the record is %q, token %q, lease until %v read at %v", round, got.State, got.Token, got.LeaseUntil, got.ReadAt)
					}
				case recErr == nil:
					rc.check(t, f, rec)
				default:
					t.Fatalf("round %d: neither Extend nor %s succeeded", round, rc.name)
				}
			}
		})
	}
}

// listExpired returns every expired lease of the fixture's scope that
// ListExpiredLeases reports (at most 1000 from the whole store).
func listExpired(t *testing.T, f *fixture) []*idemstore.Record {
	t.Helper()
	recs, err := f.s.ListExpiredLeases(f.ctx(), 1000)
	if err != nil {
		t.Fatalf("ListExpiredLeases: %v", err)
	}
	var mine []*idemstore.Record
	for _, r := range recs {
		if r.Key.Scope == f.scope {
			mine = append(mine, r)
		}
	}
	return mine
}
