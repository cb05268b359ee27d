package idemstoretest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// testDelete checks that an operator can delete a completed record, and
// nothing else; and that a deletion fenced by a token deletes the answer
// stored under that token only, never a later answer for the same key.
func testDelete(t *testing.T, h Harness) {
	s := h.New(t)

	t.Run("Completed", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		f.complete(rec, jsonResponse(`{"id":7}`), retainLive)
		if err := s.Delete(f.ctx(), idemstore.DeleteParams{Key: rec.Key, Token: rec.Token}); err != nil {
			t.Fatalf("Delete of a completed record with its token: %v", err)
		}
		f.requireGone(rec.Key)
		requireErrIs(t, s.Delete(f.ctx(), idemstore.DeleteParams{Key: rec.Key, Token: rec.Token}), idemstore.ErrNotFound, "second Delete")
		f.reserve(rec.Key, leaseLive) // the key runs again
	})

	t.Run("WithoutToken", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		f.complete(rec, jsonResponse(`{"id":7}`), retainLive)
		if err := s.Delete(f.ctx(), idemstore.DeleteParams{Key: rec.Key}); err != nil {
			t.Fatalf("Delete of a completed record without a token: %v", err)
		}
		f.requireGone(rec.Key)
		requireErrIs(t, s.Delete(f.ctx(), idemstore.DeleteParams{Key: rec.Key}), idemstore.ErrNotFound, "second Delete")
	})

	t.Run("OtherToken", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		done := f.complete(rec, jsonResponse(`{"id":7}`), retainLive)
		err := s.Delete(f.ctx(), idemstore.DeleteParams{Key: rec.Key, Token: newToken()})
		requireErrIs(t, err, idemstore.ErrLeaseLost, "Delete with a token the answer was not stored under")
		f.requireUnchanged(done, "refused Delete")
	})

	// An operator deletes an answer; the next request runs and stores a
	// new one; a second operator, who looked at the first answer (a stale
	// page), deletes: the new answer must stay, or the request after it
	// runs the operation a third time.
	t.Run("AnsweredAgain", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		k := f.key("k")
		first := f.reserve(k, leaseLive)
		f.complete(first, jsonResponse(`{"run":1}`), retainLive)
		if err := s.Delete(f.ctx(), idemstore.DeleteParams{Key: k, Token: first.Token}); err != nil {
			t.Fatalf("first operator's Delete: %v", err)
		}
		second := f.reserve(k, leaseLive)
		again := f.complete(second, jsonResponse(`{"run":2}`), retainLive)
		err := s.Delete(f.ctx(), idemstore.DeleteParams{Key: k, Token: first.Token})
		requireErrIs(t, err, idemstore.ErrLeaseLost, "second operator's Delete of the first answer, once a second is stored")
		f.requireUnchanged(again, "a Delete fenced by the first answer's token")
		if err := s.Delete(f.ctx(), idemstore.DeleteParams{Key: k, Token: second.Token}); err != nil {
			t.Fatalf("Delete of the second answer with its token: %v", err)
		}
		f.requireGone(k)
	})

	// A record that Resolve completed keeps the token it was escalated
	// under, which fences its deletion.
	t.Run("Resolved", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.escalate(f.reserve(f.key("k"), leaseLive), "check")
		err := s.Resolve(f.ctx(), idemstore.ResolveParams{Key: rec.Key, Action: idemstore.ResolveComplete, Token: rec.Token, Response: jsonResponse(`{}`), Retention: retainLive})
		if err != nil {
			t.Fatalf("Resolve complete: %v", err)
		}
		got := f.get(rec.Key)
		if got.Token != rec.Token {
			t.Fatalf("after Resolve complete, Token = %q; want the escalated attempt's %q", got.Token, rec.Token)
		}
		requireErrIs(t, s.Delete(f.ctx(), idemstore.DeleteParams{Key: rec.Key, Token: newToken()}), idemstore.ErrLeaseLost, "Delete with another token")
		f.requireUnchanged(got, "refused Delete")
		if err := s.Delete(f.ctx(), idemstore.DeleteParams{Key: rec.Key, Token: rec.Token}); err != nil {
			t.Fatalf("Delete of a resolved record with its token: %v", err)
		}
		f.requireGone(rec.Key)
	})

	t.Run("OtherStates", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		pending := f.reserve(f.key("pending"), leaseLive)
		review := f.escalate(f.reserve(f.key("review"), leaseLive), "check")
		for _, rec := range []*idemstore.Record{pending, review} {
			before := f.get(rec.Key)
			for _, tok := range []string{"", rec.Token, newToken()} {
				err := s.Delete(f.ctx(), idemstore.DeleteParams{Key: rec.Key, Token: tok})
				requireErrIs(t, err, idemstore.ErrNotCompleted, fmt.Sprintf("Delete of a %s record (token %q)", before.State, tok))
				f.requireUnchanged(before, "refused Delete")
			}
		}
		missing := f.key("missing")
		for _, tok := range []string{"", newToken()} {
			requireErrIs(t, s.Delete(f.ctx(), idemstore.DeleteParams{Key: missing, Token: tok}), idemstore.ErrNotFound, "Delete of a missing record")
		}
	})

	// Operators who all looked at one answer delete it at once, while the
	// next request with the key runs and stores a new answer: exactly one
	// deletion applies, and the new answer survives every other.
	t.Run("ConcurrentOldAndNew", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		const keys, operators = 8, 6
		var wg sync.WaitGroup
		for i := range keys {
			k := f.key(fmt.Sprintf("k%d", i))
			old := f.reserve(k, leaseLive)
			f.complete(old, jsonResponse(`{"run":1}`), retainLive)
			next := newToken()
			start, deleted := make(chan struct{}), make(chan struct{})
			errs := make([]error, operators)
			var ops sync.WaitGroup
			for j := range operators {
				ops.Go(func() {
					<-start
					// A deadlock's victim changed nothing, and tries again.
					for try := 0; try < 10; try++ {
						if errs[j] = s.Delete(f.ctx(), idemstore.DeleteParams{Key: k, Token: old.Token}); !errors.Is(errs[j], idemstore.ErrRetryable) {
							return
						}
					}
				})
			}
			var rerun error
			wg.Go(func() {
				// The next request: it runs once the first answer is
				// gone. Every operator has returned before its last try.
				<-start
				for last := false; ; {
					_, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: k, Fingerprint: "fp-next", Token: next, Lease: leaseLive})
					if errors.Is(err, idemstore.ErrRetryable) {
						continue
					}
					if err != nil || created {
						if err == nil {
							err = s.Complete(f.ctx(), idemstore.CompleteParams{Key: k, Token: next, Response: jsonResponse(`{"run":2}`), Retention: retainLive})
						}
						rerun = err
						return
					}
					if last {
						rerun = errors.New("the first answer was never deleted")
						return
					}
					select {
					case <-deleted:
						last = true
					default:
					}
				}
			})
			wg.Go(func() {
				ops.Wait()
				close(deleted)
			})
			close(start)
			wg.Wait()
			if rerun != nil {
				t.Fatalf("%v: the next request: %v", k, rerun)
			}
			won := 0
			for j, err := range errs {
				switch {
				case err == nil:
					won++
				case errors.Is(err, idemstore.ErrNotFound), errors.Is(err, idemstore.ErrLeaseLost), errors.Is(err, idemstore.ErrNotCompleted):
				default:
					t.Fatalf("%v: operator %d's Delete: %v", k, j, err)
				}
			}
			if won != 1 {
				t.Fatalf("%v: %d of %d Deletes of one answer applied; want exactly 1 (errors %v)", k, won, operators, errs)
			}
			got := f.get(k)
			if got.State != idemstore.StateCompleted || got.Token != next || string(got.Response.Body) != `{"run":2}` {
				t.Fatalf("%v: after the race the record is %s under %q with %s; want the second answer, completed under %q", k, got.State, got.Token, summary(got.Response), next)
			}
		}
	})
}
