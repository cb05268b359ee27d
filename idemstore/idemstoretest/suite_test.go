package idemstoretest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemstore/idemstoretest"
)

// The suite must pass a correct store and fail broken ones. The broken
// stores are idemmem wrapped with one bug each; each runs in a child
// process (this test binary, re-run), because a failing suite cannot be
// observed from inside the test that runs it.

const mutantEnv = "IDEMSTORETEST_MUTANT"

func newMem(t *testing.T) *idemmem.Store {
	s := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestSuitePassesMemoryStore(t *testing.T) {
	t.Parallel()
	idemstoretest.Exercise(t, idemstoretest.Harness{New: func(t *testing.T) idemstore.Store { return newMem(t) }})
}

// mutant is idemmem with one bug.
type mutant struct {
	*idemmem.Store
	bug string
}

func (m mutant) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	switch m.bug {
	case "ignores-context":
		ctx = context.Background()
	case "lease-in-seconds":
		p.Lease = p.Lease.Truncate(time.Second)
	case "joins-key-parts":
		p.Key = idemstore.Key{Scope: p.Key.Scope + "|" + p.Key.Operation, Key: p.Key.Key}
	}
	rec, created, err := m.Store.Reserve(ctx, p)
	if m.bug == "last-writer-wins" && err == nil && !created && rec.State == idemstore.StatePending {
		_ = m.Store.Release(ctx, idemstore.ReleaseParams{Key: p.Key, Token: rec.Token})
		return m.Store.Reserve(ctx, p)
	}
	if m.bug == "joins-key-parts" && rec != nil {
		scope, op, _ := strings.Cut(rec.Key.Scope, "|")
		rec.Key.Scope, rec.Key.Operation = scope, op
	}
	return rec, created, err
}

func (m mutant) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if m.bug == "complete-ignores-token" {
		if rec, err := m.Store.Get(ctx, p.Key); err == nil && rec.State == idemstore.StatePending {
			p.Token = rec.Token
		}
	}
	err := m.Store.Complete(ctx, p)
	if m.bug == "swallows-lease-lost" {
		return nil
	}
	return err
}

func (m mutant) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	if m.bug == "takeover-ignores-lease" {
		// Replace the holder, live or not.
		if err := m.Store.Release(ctx, idemstore.ReleaseParams{Key: p.Key, Token: p.OldToken}); err != nil {
			return err
		}
		_, _, err := m.Store.Reserve(ctx, idemstore.ReserveParams{Key: p.Key, Token: p.NewToken, Lease: p.Lease})
		return err
	}
	return m.Store.Takeover(ctx, p)
}

func (m mutant) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	if m.bug == "ignores-if-expired" {
		p.IfExpired = false
	}
	if m.bug == "release-any-state" {
		// Delete the record whatever its state.
		if rec, err := m.Store.Get(ctx, p.Key); err == nil && rec.Token == p.Token {
			switch rec.State {
			case idemstore.StateCompleted:
				return m.Store.Delete(ctx, idemstore.DeleteParams{Key: p.Key})
			case idemstore.StateNeedsReview:
				return m.Store.Resolve(ctx, idemstore.ResolveParams{Key: p.Key, Action: idemstore.ResolveRelease})
			}
		}
	}
	return m.Store.Release(ctx, p)
}

func (m mutant) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	if m.bug == "extend-resurrects" {
		// Bring a completed record back to pending.
		if rec, err := m.Store.Get(ctx, p.Key); err == nil && rec.State == idemstore.StateCompleted && rec.Token == p.Token {
			if err := m.Store.Delete(ctx, idemstore.DeleteParams{Key: p.Key}); err != nil {
				return err
			}
			_, _, err := m.Store.Reserve(ctx, idemstore.ReserveParams{Key: p.Key, Fingerprint: rec.Fingerprint, Token: p.Token, Lease: p.Lease})
			return err
		}
	}
	return m.Store.Extend(ctx, p)
}

func (m mutant) Get(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
	rec, err := m.Store.Get(ctx, k)
	if m.bug == "no-read-at" && rec != nil {
		rec.ReadAt = time.Time{}
	}
	return rec, err
}

func (m mutant) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	page, err := m.Store.List(ctx, p)
	if m.bug == "list-drops-page-end" && page.NextCursor != "" {
		page.Records = page.Records[:len(page.Records)-1]
	}
	return page, err
}

func (m mutant) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	if m.bug == "resolve-ignores-token" {
		p.Token = ""
	}
	err := m.Store.Resolve(ctx, p)
	if m.bug == "resolve-not-found" && err != nil {
		return idemstore.ErrNotFound
	}
	return err
}

func (m mutant) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	if m.bug == "delete-ignores-token" {
		p.Token = ""
	}
	return m.Store.Delete(ctx, p)
}

// TestMutantHelper runs the suite against the mutant named in the
// environment. It does nothing in a normal run.
func TestMutantHelper(t *testing.T) {
	bug := os.Getenv(mutantEnv)
	if bug == "" {
		t.Skip("runs only as a child of TestSuiteCatchesBugs")
	}
	idemstoretest.Exercise(t, idemstoretest.Harness{New: func(t *testing.T) idemstore.Store {
		return mutant{Store: newMem(t), bug: bug}
	}})
}

func TestSuiteCatchesBugs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts child processes")
	}
	cases := []struct {
		bug  string
		area string // the area to run
		fail string // a subtest that must fail
	}{
		{"last-writer-wins", "Concurrency", "Concurrency/OneKey"},
		{"last-writer-wins", "Reserve", "Reserve/ExistingPending"},
		{"swallows-lease-lost", "Fencing", "Fencing/StaleToken"},
		{"swallows-lease-lost", "Takeover", "Takeover/AcceptedAfterExpiry"},
		{"takeover-ignores-lease", "Takeover", "Takeover/RefusedWhileLeaseAlive"},
		{"lease-in-seconds", "Reserve", "Reserve/NewRecord"},
		{"ignores-if-expired", "Expiry", "Expiry/RefusedWhileLeaseAlive"},
		{"ignores-if-expired", "Engine", "Engine/RecoverRacesHeartbeat"},
		{"no-read-at", "Reserve", "Reserve/NewRecord"},
		{"ignores-context", "Errors", "Errors/CancelledReserve"},
		{"joins-key-parts", "Keys", "Keys/LookAlikesStayApart"},
		{"list-drops-page-end", "List", "List/Pages"},
		{"resolve-not-found", "Review", "Review/ResolveOtherStates"},
		{"complete-ignores-token", "Linearizable", "Linearizable"},
		{"release-any-state", "Linearizable", "Linearizable"},
		{"extend-resurrects", "Linearizable", "Linearizable"},
		{"takeover-ignores-lease", "Linearizable", "Linearizable"},
		{"swallows-lease-lost", "Linearizable", "Linearizable"},
		{"last-writer-wins", "Linearizable", "Linearizable"},
		{"resolve-ignores-token", "Review", "Review/ResolveFencedByToken"},
		{"resolve-ignores-token", "Linearizable", "Linearizable"},
		{"delete-ignores-token", "Delete", "Delete/AnsweredAgain"},
		{"delete-ignores-token", "Delete", "Delete/OtherToken"},
		{"delete-ignores-token", "Linearizable", "Linearizable"},
	}
	for _, c := range cases {
		t.Run(c.bug+"/"+c.area, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMutantHelper$/^"+c.area+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+c.bug)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store with bug %q:\n%s", c.bug, out)
			}
			if want := "--- FAIL: TestMutantHelper/" + c.fail + " "; !strings.Contains(string(out), want) {
				t.Fatalf("bug %q: want %q in the output:\n%s", c.bug, want, out)
			}
		})
	}
}
