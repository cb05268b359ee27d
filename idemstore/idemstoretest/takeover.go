package idemstoretest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

func testTakeover(t *testing.T, h Harness) {
	s := h.New(t)

	takeover := func(f *fixture, k idemstore.Key, oldToken string) (string, error) {
		newTok := newToken()
		err := s.Takeover(f.ctx(), idemstore.TakeoverParams{Key: k, OldToken: oldToken, NewToken: newTok, Lease: leaseLonger})
		return newTok, err
	}

	t.Run("RefusedWhileLeaseAlive", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		_, err := takeover(f, rec.Key, rec.Token)
		requireErrIs(t, err, idemstore.ErrLeaseLost, "Takeover of a live lease")
		f.requireUnchanged(rec, "refused Takeover")
	})

	t.Run("RefusedWithWrongToken", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseExpired)
		_, err := takeover(f, rec.Key, newToken())
		requireErrIs(t, err, idemstore.ErrLeaseLost, "Takeover with a wrong old token")
		f.requireUnchanged(rec, "refused Takeover")
	})

	t.Run("RefusedWhenMissing", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		k := f.key("missing")
		_, err := takeover(f, k, newToken())
		requireErrIs(t, err, idemstore.ErrLeaseLost, "Takeover of a missing record")
		f.requireGone(k)
	})

	t.Run("RefusedWhenCompletedOrNeedsReview", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		done := f.reserve(f.key("done"), leaseExpired)
		f.complete(done, jsonResponse(`{}`), retainLive)
		review := f.reserve(f.key("review"), leaseExpired)
		f.escalate(review, "unknown outcome")
		for _, rec := range []*idemstore.Record{done, review} {
			before := f.get(rec.Key)
			_, err := takeover(f, rec.Key, rec.Token)
			requireErrIs(t, err, idemstore.ErrLeaseLost, "Takeover of a "+string(before.State)+" record")
			f.requireUnchanged(before, "refused Takeover")
		}
	})

	t.Run("AcceptedAfterExpiry", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseExpired)
		var newTok string
		lo, hi, got, err := f.during(rec.Key, func() (err error) {
			newTok, err = takeover(f, rec.Key, rec.Token)
			return err
		})
		if err != nil {
			t.Fatalf("Takeover of an expired lease: %v", err)
		}
		requireWithin(t, "LeaseUntil", got.LeaseUntil, leaseLonger, lo, hi)
		requireWithin(t, "UpdatedAt", got.UpdatedAt, 0, lo, hi)
		want := *rec
		want.Token = newTok
		want.LeaseUntil, want.UpdatedAt = got.LeaseUntil, got.UpdatedAt
		f.requireUnchanged(&want, "Takeover (only Token, LeaseUntil and UpdatedAt may change)")

		// The old holder is fenced out of everything, the new one is not.
		requireFencedOut(f, rec.Key, rec.Token, "with the token that was taken over")
		next := f.extend(&want, leaseLonger)
		f.complete(next, jsonResponse(`{"by":"new holder"}`), retainLive)
	})

	t.Run("AcceptedAtDeadline", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		// A lease of zero ends as it is granted: LeaseUntil <= now.
		rec := f.reserve(f.key("k"), 0)
		newTok, err := takeover(f, rec.Key, rec.Token)
		if err != nil {
			t.Fatalf("Takeover of a lease at its deadline: %v", err)
		}
		if got := f.get(rec.Key); got.Token != newTok {
			t.Fatalf("after Takeover token = %q, want %q", got.Token, newTok)
		}
	})

	t.Run("RacesComplete", func(t *testing.T) {
		t.Parallel()
		testTakeoverRacesComplete(t, s)
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseExpired)
		const n = 20
		var (
			wg     sync.WaitGroup
			start  = make(chan struct{})
			tokens = make([]string, n)
			errs   = make([]error, n)
			ctx    = f.ctx()
		)
		for i := range n {
			tokens[i] = newToken()
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = s.Takeover(ctx, idemstore.TakeoverParams{Key: rec.Key, OldToken: rec.Token, NewToken: tokens[i], Lease: leaseLive})
			}()
		}
		close(start)
		wg.Wait()
		winner := ""
		for i, err := range errs {
			switch {
			case err == nil:
				if winner != "" {
					t.Fatalf("two concurrent takeovers succeeded (%s and %s)", winner, tokens[i])
				}
				winner = tokens[i]
			case !errors.Is(err, idemstore.ErrLeaseLost):
				t.Errorf("losing Takeover: err = %v, want ErrLeaseLost", err)
			}
		}
		if winner == "" {
			t.Fatal("no concurrent Takeover succeeded")
		}
		if got := f.get(rec.Key); got.Token != winner || got.State != idemstore.StatePending {
			t.Fatalf("after concurrent takeovers: state %q token %q, want pending with the winner's %q", got.State, got.Token, winner)
		}
	})
}

// testTakeoverRacesComplete races the old holder's Complete (which ignores
// the lease deadline) against takeovers of its expired lease: exactly one
// change wins, and the record shows that one.
func testTakeoverRacesComplete(t *testing.T, s idemstore.Store) {
	f := newFixture(t, s)
	for round := range 5 {
		rec := f.reserve(f.key(fmt.Sprintf("k%d", round)), leaseExpired)
		const n = 4
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			tokens   = make([]string, n)
			errs     = make([]error, n)
			complErr error
			ctx      = f.ctx()
			resp     = jsonResponse(`{"by":"old holder"}`)
		)
		wg.Add(n + 1)
		go func() {
			defer wg.Done()
			<-start
			complErr = s.Complete(ctx, idemstore.CompleteParams{Key: rec.Key, Token: rec.Token, Response: resp, Retention: retainLive})
		}()
		for i := range n {
			tokens[i] = newToken()
			go func() {
				defer wg.Done()
				<-start
				errs[i] = s.Takeover(ctx, idemstore.TakeoverParams{Key: rec.Key, OldToken: rec.Token, NewToken: tokens[i], Lease: leaseLive})
			}()
		}
		close(start)
		wg.Wait()
		winners := 0
		winner := ""
		if complErr == nil {
			winners++
		} else if !errors.Is(complErr, idemstore.ErrLeaseLost) {
			t.Fatalf("round %d: Complete racing takeovers: %v", round, complErr)
		}
		for i, err := range errs {
			if err == nil {
				winners++
				winner = tokens[i]
			} else if !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("round %d: Takeover racing Complete: %v", round, err)
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d of Complete and %d takeovers succeeded, want exactly 1", round, winners, n)
		}
		got := f.get(rec.Key)
		if complErr == nil {
			if got.State != idemstore.StateCompleted || got.Token != rec.Token {
				t.Fatalf("round %d: Complete won but the record is %q with token %q", round, got.State, got.Token)
			}
			if d := diffResponse(got.Response, resp); d != "" {
				t.Fatalf("round %d: Complete won but the response is: %s", round, d)
			}
		} else if got.State != idemstore.StatePending || got.Token != winner {
			t.Fatalf("round %d: a takeover won but the record is %q with token %q, want pending with %q", round, got.State, got.Token, winner)
		}
	}
}
