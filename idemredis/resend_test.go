package idemredis

import (
	"cmp"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/dropproxy"
)

// resentCallID is the call id of every call of a resending store.
const resentCallID = "resent call id.."

// resending returns a store on the standalone server whose calls all carry
// the same call id, as a script the store resends after a lost reply does:
// calling a method twice runs its script twice as one call.
func resending(t *testing.T) *Store {
	t.Helper()
	s := newTestStore(t, standaloneClient(t))
	s.callID = func() string { return resentCallID }
	return s
}

// reserve makes a pending record for name, leased for lease.
func reserve(t *testing.T, s *Store, name, token string, lease time.Duration) idemstore.Key {
	t.Helper()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: name}
	if rec, created, err := s.Reserve(t.Context(), idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: token, Lease: lease}); err != nil || !created {
		t.Fatalf("Reserve(%s) = %+v, created %v, %v", name, rec, created, err)
	}
	return k
}

// twice runs op as a call and its resend, both of which must succeed, then
// the same op as a new call (a fresh call id), which must fail with want.
func twice(t *testing.T, s *Store, name string, want error, op func() error) {
	t.Helper()
	for i := range 2 {
		if err := op(); err != nil {
			t.Fatalf("%s, run %d of one call: %v", name, i+1, err)
		}
	}
	s.callID = newCallID
	defer func() { s.callID = func() string { return resentCallID } }()
	if err := op(); !errors.Is(err, want) {
		t.Fatalf("%s as a new call after it applied: %v, want %v", name, err, want)
	}
}

func TestResentReserve(t *testing.T) {
	t.Parallel()
	s := resending(t)
	ctx := t.Context()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: "resent"}
	p := idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok-1", Lease: time.Minute}
	for i := range 2 {
		rec, created, err := s.Reserve(ctx, p)
		if err != nil || !created || rec != nil {
			t.Fatalf("Reserve run %d: created %v, record %+v, %v; want created", i+1, created, rec, err)
		}
	}
	// Another caller with another token still sees a conflict, and so does
	// one that reuses the token for another request.
	for _, other := range []idemstore.ReserveParams{
		{Key: k, Fingerprint: "fp", Token: "tok-2", Lease: time.Minute},
		{Key: k, Fingerprint: "other", Token: "tok-1", Lease: time.Minute},
	} {
		if rec, created, err := s.Reserve(ctx, other); err != nil || created || rec.Token != "tok-1" {
			t.Fatalf("Reserve(%q, %q) = created %v, %+v, %v; want the existing record", other.Token, other.Fingerprint, created, rec, err)
		}
	}
}

func TestResentTakeover(t *testing.T) {
	t.Parallel()
	s := resending(t)
	k := reserve(t, s, "takeover", "tok-1", -time.Second)
	twice(t, s, "Takeover", idemstore.ErrLeaseLost, func() error {
		return s.Takeover(t.Context(), idemstore.TakeoverParams{Key: k, OldToken: "tok-1", NewToken: "tok-2", Lease: time.Minute})
	})
	if rec, err := s.Get(t.Context(), k); err != nil || rec.Token != "tok-2" {
		t.Fatalf("Get = %+v, %v; want token tok-2", rec, err)
	}
}

func TestResentComplete(t *testing.T) {
	t.Parallel()
	s := resending(t)
	k := reserve(t, s, "complete", "tok", time.Minute)
	twice(t, s, "Complete", idemstore.ErrLeaseLost, func() error {
		return s.Complete(t.Context(), idemstore.CompleteParams{Key: k, Token: "tok", Response: &idemstore.Response{Status: 201}, Retention: time.Hour})
	})
	if rec, err := s.Get(t.Context(), k); err != nil || rec.State != idemstore.StateCompleted || rec.Response.Status != 201 {
		t.Fatalf("Get = %+v, %v; want completed with 201", rec, err)
	}
}

func TestResentRelease(t *testing.T) {
	t.Parallel()
	for _, ifExpired := range []bool{false, true} {
		s := resending(t)
		k := reserve(t, s, "release", "tok", -time.Second)
		twice(t, s, "Release", idemstore.ErrLeaseLost, func() error {
			return s.Release(t.Context(), idemstore.ReleaseParams{Key: k, Token: "tok", IfExpired: ifExpired})
		})
		if _, err := s.Get(t.Context(), k); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("IfExpired %v: Get after Release: %v, want ErrNotFound", ifExpired, err)
		}
	}
}

func TestResentEscalate(t *testing.T) {
	t.Parallel()
	for _, ifExpired := range []bool{false, true} {
		s := resending(t)
		k := reserve(t, s, "escalate", "tok", -time.Second)
		twice(t, s, "Escalate", idemstore.ErrLeaseLost, func() error {
			return s.Escalate(t.Context(), idemstore.EscalateParams{Key: k, Token: "tok", Reason: "unknown", IfExpired: ifExpired})
		})
		if rec, err := s.Get(t.Context(), k); err != nil || rec.State != idemstore.StateNeedsReview {
			t.Fatalf("IfExpired %v: Get after Escalate = %+v, %v; want needs_review", ifExpired, rec, err)
		}
	}
}

func TestResentResolveAndDelete(t *testing.T) {
	t.Parallel()
	s := resending(t)
	ctx := t.Context()
	escalated := func(name string) idemstore.Key {
		k := reserve(t, s, name, "tok", time.Minute)
		s.callID = newCallID
		defer func() { s.callID = func() string { return resentCallID } }()
		if err := s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok", Reason: "unknown"}); err != nil {
			t.Fatal(err)
		}
		return k
	}
	k := escalated("resolve-complete")
	twice(t, s, "Resolve(complete)", idemstore.ErrNotNeedsReview, func() error {
		return s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveComplete, Response: &idemstore.Response{Status: 200}, Retention: time.Hour})
	})
	twice(t, s, "Delete", idemstore.ErrNotFound, func() error { return s.Delete(ctx, idemstore.DeleteParams{Key: k}) })

	k = escalated("resolve-release")
	twice(t, s, "Resolve(release)", idemstore.ErrNotFound, func() error {
		return s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveRelease})
	})
}

// TestResentAfterAnotherChange checks that a resend which finds the record
// changed again by someone else reports the lost lease: the tombstone of a
// release does not vouch for a record reserved anew.
func TestResentAfterAnotherChange(t *testing.T) {
	t.Parallel()
	s := resending(t)
	ctx := t.Context()
	k := reserve(t, s, "again", "tok", time.Minute)
	if err := s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	reserve(t, s, "again", "tok-2", time.Minute)
	if err := s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok"}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("resent Release after the key was reserved again: %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, k); err != nil || rec.Token != "tok-2" {
		t.Fatalf("Get = %+v, %v; want the new reservation", rec, err)
	}
}

// lostReplyOp is a call whose reply TestLostReplies drops: setup brings a
// fresh key to the state the call needs, call makes it, and check tells
// whether the change is in the store.
type lostReplyOp struct {
	name  string
	setup func(t *testing.T, s *Store, k idemstore.Key)
	call  func(ctx context.Context, s *Store, k idemstore.Key) error
	check func(t *testing.T, s *Store, k idemstore.Key)
}

// TestLostReplies runs every script through a TCP proxy that lets the
// script reach the server and drops the connection instead of the reply
// (internal/dropproxy). The store sends the script again on a new
// connection, and the script recognises its own earlier run: the call
// succeeds and the change is made once. With Resends -1 the same call
// fails with ErrUnavailable, and the change is in the store all the same.
func TestLostReplies(t *testing.T) {
	t.Parallel()
	opt := rueidis.MustParseURL(requireEnv(t, "IDEM_TEST_REDIS_URL"))
	proxy := dropproxy.New(t, opt.InitAddress[0])
	opt.InitAddress = []string{proxy.Addr()}
	opt.ForceSingleClient = true
	client := newClient(t, opt)

	reserved := func(lease time.Duration) func(t *testing.T, s *Store, k idemstore.Key) {
		return func(t *testing.T, s *Store, k idemstore.Key) { reserve(t, s, k.Key, "tok", lease) }
	}
	then := func(first func(*testing.T, *Store, idemstore.Key), next func(context.Context, *Store, idemstore.Key) error) func(*testing.T, *Store, idemstore.Key) {
		return func(t *testing.T, s *Store, k idemstore.Key) {
			first(t, s, k)
			if err := next(t.Context(), s, k); err != nil {
				t.Fatal(err)
			}
		}
	}
	state := func(want idemstore.State, token string) func(*testing.T, *Store, idemstore.Key) {
		return func(t *testing.T, s *Store, k idemstore.Key) {
			t.Helper()
			rec, err := s.Get(t.Context(), k)
			if err != nil || rec.State != want || rec.Token != token {
				t.Fatalf("Get = %+v, %v; want %s under %s", rec, err, want, token)
			}
		}
	}
	gone := func(t *testing.T, s *Store, k idemstore.Key) {
		t.Helper()
		if rec, err := s.Get(t.Context(), k); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("Get = %+v, %v; want ErrNotFound", rec, err)
		}
	}
	complete := func(ctx context.Context, s *Store, k idemstore.Key) error {
		return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: &idemstore.Response{Status: 201}, Retention: time.Hour})
	}
	escalate := func(ctx context.Context, s *Store, k idemstore.Key) error {
		return s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok", Reason: "unknown"})
	}
	ops := []lostReplyOp{
		{"Reserve", func(*testing.T, *Store, idemstore.Key) {}, func(ctx context.Context, s *Store, k idemstore.Key) error {
			_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute})
			if err == nil && !created {
				err = errors.New("not created")
			}
			return err
		}, state(idemstore.StatePending, "tok")},
		{"Complete", reserved(time.Minute), complete, state(idemstore.StateCompleted, "tok")},
		{"Release", reserved(time.Minute), func(ctx context.Context, s *Store, k idemstore.Key) error {
			return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok"})
		}, gone},
		{"Escalate", reserved(time.Minute), escalate, state(idemstore.StateNeedsReview, "tok")},
		{"Extend", reserved(time.Minute), func(ctx context.Context, s *Store, k idemstore.Key) error {
			return s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok", Lease: 24 * time.Hour})
		}, func(t *testing.T, s *Store, k idemstore.Key) {
			if rec, err := s.Get(t.Context(), k); err != nil || rec.LeaseUntil.Sub(rec.ReadAt) < time.Hour {
				t.Fatalf("Get = %+v, %v; want the lease extended by a day", rec, err)
			}
		}},
		{"Takeover", reserved(-time.Second), func(ctx context.Context, s *Store, k idemstore.Key) error {
			return s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: "tok", NewToken: "tok-2", Lease: time.Minute})
		}, state(idemstore.StatePending, "tok-2")},
		{"ResolveComplete", then(reserved(time.Minute), escalate), func(ctx context.Context, s *Store, k idemstore.Key) error {
			return s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveComplete, Response: &idemstore.Response{Status: 200}, Retention: time.Hour})
		}, state(idemstore.StateCompleted, "tok")},
		{"ResolveRelease", then(reserved(time.Minute), escalate), func(ctx context.Context, s *Store, k idemstore.Key) error {
			return s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveRelease})
		}, gone},
		{"Delete", then(reserved(time.Minute), complete), func(ctx context.Context, s *Store, k idemstore.Key) error {
			return s.Delete(ctx, idemstore.DeleteParams{Key: k})
		}, gone},
	}
	// The first pass drops nothing: it checks the calls and gets every
	// script cached on the server, so that the dropped command is the
	// script's EVALSHA and not a NOSCRIPT reply.
	for _, mode := range []struct {
		name    string
		drop    bool
		resends int
	}{{"no drop", false, 0}, {"resent", true, 0}, {"not resent", true, -1}} {
		s := newTestStore(t, client)
		s.cfg.Resends = cmp.Or(mode.resends, s.cfg.Resends)
		for _, op := range ops {
			k := idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: op.name}
			op.setup(t, s, k)
			if mode.drop {
				proxy.DropNext([]byte("EVALSHA"))
			}
			err := op.call(t.Context(), s, k)
			if proxy.Armed() {
				t.Fatalf("%s, %s: the proxy dropped no reply", mode.name, op.name)
			}
			if mode.resends == -1 {
				if !errors.Is(err, idemstore.ErrUnavailable) {
					t.Fatalf("%s, %s: %v, want ErrUnavailable", mode.name, op.name, err)
				}
			} else if err != nil {
				t.Fatalf("%s, %s: %v", mode.name, op.name, err)
			}
			op.check(t, s, k)
		}
	}
}
