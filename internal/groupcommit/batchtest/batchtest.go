// Package batchtest helps the SQL drivers' tests put chosen calls in one
// batch and read what each caller got.
package batchtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Result is what one call returned.
type Result struct {
	Record  *idemstore.Record
	Created bool
	Err     error
}

// InOneBatch makes the calls, each from its own goroutine and each queued
// before the next starts, while b is paused, so that they all run in one
// batch; it returns what each got.
func InOneBatch(t testing.TB, b *groupcommit.Batcher, calls ...func() Result) []Result {
	t.Helper()
	p := b.Pause()
	out := make([]Result, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Go(func() { out[i] = call() })
		p.Wait(i + 1)
	}
	p.Resume()
	wg.Wait()
	return out
}

// Key is the key name of the tests' scope and operation.
func Key(name string) idemstore.Key {
	return idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: name}
}

// Reserve is a Reserve of k with token tok, fingerprint "fp-"+tok, and a
// request whose body is tok.
func Reserve(ctx context.Context, s idemstore.Store, k idemstore.Key, tok string, lease time.Duration) func() Result {
	return func() Result {
		rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp-" + tok, Token: tok, Lease: lease,
			Request: &idemstore.Request{Method: "POST", Path: "/x", Body: []byte(tok)}})
		return Result{rec, created, err}
	}
}

// Complete is a Complete of k under tok whose answer is 201 with body tok.
func Complete(ctx context.Context, s idemstore.Store, k idemstore.Key, tok string, retention time.Duration) func() Result {
	return func() Result {
		return Result{Err: s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok,
			Response: &idemstore.Response{Status: 201, Body: []byte(tok)}, Retention: retention})}
	}
}

// Call wraps a call that returns only an error.
func Call(f func() error) func() Result {
	return func() Result { return Result{Err: f()} }
}

// PoisonRunsAlone reserves keys a, poison and z in one batch of b and
// requires the poison's Reserve to fail with the database's own refusal
// (neither idemstore.ErrRetryable nor idemstore.ErrUnavailable) while the
// other two succeed: the batch reran its members alone. The caller makes
// the database refuse poison first.
func PoisonRunsAlone(t testing.TB, s idemstore.Store, b *groupcommit.Batcher, poison idemstore.Key) {
	t.Helper()
	ctx := t.Context()
	got := InOneBatch(t, b,
		Reserve(ctx, s, Key("a"), "a", time.Minute),
		Reserve(ctx, s, poison, "p", time.Minute),
		Reserve(ctx, s, Key("z"), "z", time.Minute),
	)
	if got[1].Err == nil || errors.Is(got[1].Err, idemstore.ErrRetryable) || errors.Is(got[1].Err, idemstore.ErrUnavailable) {
		t.Fatalf("poison Reserve: %+v, want the database's refusal", got[1])
	}
	for _, i := range []int{0, 2} {
		if got[i].Err != nil || !got[i].Created {
			t.Fatalf("Reserve %d beside the poison: %+v, want created", i, got[i])
		}
	}
}

// CommitUnknown requires what members of a batch whose commit reply was
// lost must see: each got idemstore.ErrUnavailable, never
// idemstore.ErrRetryable nor success, although the reservation of each key
// (under the matching token) is there; and the release by that token,
// which the contract then asks of the caller, removes it.
func CommitUnknown(t testing.TB, s idemstore.Store, got []Result, keys []idemstore.Key, tokens []string) {
	t.Helper()
	ctx := t.Context()
	for i, r := range got {
		if r.Err == nil || r.Created || !errors.Is(r.Err, idemstore.ErrUnavailable) || errors.Is(r.Err, idemstore.ErrRetryable) {
			t.Fatalf("member %d after a lost commit reply: %+v; want ErrUnavailable, never ErrRetryable", i, r)
		}
	}
	for i, k := range keys {
		if rec, err := s.Get(ctx, k); err != nil || rec.Token != tokens[i] {
			t.Fatalf("%s: %+v, %v; want the committed reservation", k.Key, rec, err)
		}
		if err := s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: tokens[i]}); err != nil {
			t.Fatalf("release of %s after the failed Reserve: %v", k.Key, err)
		}
	}
}

// LeaveThenRelease checks a Reserve whose context ends while its batch
// waits: it gets the context's error, the batch still commits the other
// member (a Complete), and releases the reservation of the one that left
// before it answers the other; the release the contract then asks of the
// caller, queued behind that batch, finds nothing or the reservation, and
// the key ends up free. It reserves a key under token "h" and calls block
// with it, which must make the next batch wait (hold that record's row
// lock, or the database's write lock) and return what lets it go on.
func LeaveThenRelease(t testing.TB, s idemstore.Store, b *groupcommit.Batcher, block func(held idemstore.Key) (unblock func())) {
	t.Helper()
	ctx := t.Context()
	held, left := Key("x-held"), Key("left")
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: held, Fingerprint: "fp", Token: "h", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	unblock := block(held)
	leaving, leave := context.WithCancel(ctx)
	p := b.Pause()
	results := make(chan Result, 2)
	go func() { results <- Reserve(leaving, s, left, "left", time.Minute)() }()
	p.Wait(1)
	go func() { results <- Complete(ctx, s, held, "h", time.Hour)() }()
	p.Wait(2)
	p.Resume() // both are taken; the batch waits
	leave()
	if r := <-results; !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("member that left: %+v, want context.Canceled", r)
	}
	released := make(chan error)
	go func() { released <- s.Release(ctx, idemstore.ReleaseParams{Key: left, Token: "left"}) }()
	unblock()
	if r := <-results; r.Err != nil {
		t.Fatalf("member that stayed: %+v", r)
	}
	if err := <-released; err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Release of the reservation whose Reserve failed: %v", err)
	}
	if _, err := s.Get(ctx, left); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("released key: %v", err)
	}
}
