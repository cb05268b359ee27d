// Package batchtest helps the SQL drivers' tests put chosen calls in one
// batch and read what each caller got.
package batchtest

import (
	"context"
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
