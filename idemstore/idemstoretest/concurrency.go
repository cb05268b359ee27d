package idemstoretest

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// reserveResult is what one racing goroutine saw.
type reserveResult struct {
	token   string // the token it offered
	rec     *idemstore.Record
	created bool
	err     error
}

// raceReserve starts n goroutines per key that all reserve at once, each
// with its own token, and returns what each saw, by key.
func raceReserve(f *fixture, keys []idemstore.Key, n int) map[idemstore.Key][]reserveResult {
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		ctx   = f.ctx()
		out   = make(map[idemstore.Key][]reserveResult, len(keys))
	)
	for _, k := range keys {
		out[k] = make([]reserveResult, n)
	}
	for i := range n {
		for _, k := range keys {
			res := &out[k][i]
			res.token = newToken()
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res.rec, res.created, res.err = f.s.Reserve(ctx, idemstore.ReserveParams{
					Key: k, Fingerprint: "fp-" + res.token, Token: res.token,
					Lease: leaseLive,
				})
			}()
		}
	}
	close(start)
	wg.Wait()
	return out
}

// checkOneWinner requires exactly one created reservation among results and
// that every loser got the winner's record without an error.
func checkOneWinner(f *fixture, k idemstore.Key, results []reserveResult) {
	f.t.Helper()
	var winner *reserveResult
	for i := range results {
		r := &results[i]
		if r.err != nil {
			f.t.Fatalf("%v: concurrent Reserve failed: %v", k, r.err)
		}
		if r.created != (r.rec == nil) {
			f.t.Fatalf("%v: concurrent Reserve returned created = %v with record %v", k, r.created, r.rec)
		}
		if r.created {
			if winner != nil {
				f.t.Fatalf("%v: two concurrent Reserves both created the record (tokens %q and %q)", k, winner.token, r.token)
			}
			winner = r
		}
	}
	if winner == nil {
		f.t.Fatalf("%v: none of %d concurrent Reserves created the record", k, len(results))
	}
	for _, r := range results {
		if r.created {
			continue
		}
		if r.rec.Token != winner.token || r.rec.Fingerprint != "fp-"+winner.token || r.rec.State != idemstore.StatePending || r.rec.Key != k {
			f.t.Fatalf("%v: a losing Reserve saw %+v, want the winner's pending record with token %q", k, *r.rec, winner.token)
		}
	}
	if got := f.get(k); got.Token != winner.token {
		f.t.Fatalf("%v: stored token %q, want the winner's %q", k, got.Token, winner.token)
	}
}

func testConcurrency(t *testing.T, h Harness) {
	t.Run("OneKey", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, h.New(t))
		k := f.key("contended")
		checkOneWinner(f, k, raceReserve(f, []idemstore.Key{k}, 100)[k])
	})

	t.Run("ManyKeys", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, h.New(t))
		// 200 keys over many scopes and operations, so hash-partitioned
		// stores (Redis Cluster slots) spread them widely.
		keys := make([]idemstore.Key, 200)
		for i := range keys {
			keys[i] = idemstore.Key{
				Scope:     fmt.Sprintf("%s-s%d", f.scope, i%17),
				Operation: fmt.Sprintf("POST /op%d", i%5),
				Key:       fmt.Sprintf("key-%d-%s", i, randomHex(4)),
			}
		}
		results := raceReserve(f, keys, 4)
		for _, k := range keys {
			checkOneWinner(f, k, results[k])
		}
	})

	t.Run("ReserveReleaseChurn", func(t *testing.T) {
		t.Parallel()
		churn(newFixture(t, h.New(t)), 8, 25)
	})
}

// churn has goroutines reserve one key and release it again as fast as they
// can. A Reserve that loses may find the winner's record already released:
// the store must then retry its insert (idemstore.MaxReserveAttempts)
// rather than report ErrNotFound, and at no moment may two goroutines hold
// the key.
func churn(f *fixture, goroutines, rounds int) {
	f.t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		holders int
		errs    []error
		start   = make(chan struct{})
		ctx     = f.ctx()
		k       = f.key("churn")
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range rounds {
				tok := newToken()
				rec, created, err := f.s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: leaseLive})
				switch {
				case errors.Is(err, idemstore.ErrRetryable):
					continue // allowed after MaxReserveAttempts of bad luck
				case err != nil:
					fail(fmt.Errorf("reserve: %w", err))
					return
				case created != (rec == nil):
					fail(fmt.Errorf("reserve: created = %v with record %v", created, rec))
					return
				case !created:
					if rec.Token == tok || rec.State != idemstore.StatePending {
						fail(fmt.Errorf("losing Reserve returned %+v", *rec))
						return
					}
					continue
				}
				mu.Lock()
				holders++
				n := holders
				mu.Unlock()
				if n > 1 {
					fail(errors.New("two goroutines held the key at once"))
				}
				runtime.Gosched() // widen the window in which a second holder would show
				mu.Lock()
				holders--
				mu.Unlock()
				// A second holder would also have overwritten this token,
				// and this Release would then fail.
				err = f.s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: tok})
				for i := 0; errors.Is(err, idemstore.ErrRetryable) && i < 5; i++ {
					err = f.s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: tok})
				}
				if err != nil {
					fail(fmt.Errorf("release by the holder: %w", err))
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		f.t.Fatalf("%d failures under reserve/release churn, first: %v", len(errs), errs[0])
	}
}
