package idemadmin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// SessionScope is the scope of the records by which signing out of the
// review page revokes a session for every instance that shares the store:
// one completed record per session signed out, under the operation
// "sign-out" and a digest of the session's ID, kept until the session
// would have expired. The admin listings, searches and counts never show
// them, and a key of this scope cannot be read or changed through the
// admin API. Do not give this scope to keys of your own.
const SessionScope = "idem.admin/sessions"

// revokedOperation is the operation of a revocation record.
const revokedOperation = "sign-out"

// maxRevokedCache bounds the revocations an instance remembers in memory
// (each is also in the store, where every instance finds it).
const maxRevokedCache = 10000

// revocations records and finds signed-out sessions in the shared store,
// and remembers those it has seen so that a revoked cookie costs no store
// read the second time. A session not found revoked is looked up in the
// store on every request: a sign-out on another instance counts at once.
type revocations struct {
	store idemstore.Store
	now   func() time.Time

	mu   sync.Mutex
	seen map[string]time.Time // revocation key → when the session expires
}

func newRevocations(store idemstore.Store, now func() time.Time) *revocations {
	return &revocations{store: store, now: now, seen: map[string]time.Time{}}
}

// isSessionScope reports whether k is a revocation record, which the
// admin API never shows nor changes.
func isSessionScope(k idemstore.Key) bool { return k.Scope == SessionScope }

func revocationRecord(s *session) idemstore.Key {
	return idemstore.Key{Scope: SessionScope, Operation: revokedOperation, Key: s.revocationKey()}
}

// revoke records that s has ended, for every instance. An error means
// other instances may still accept s until it expires.
func (rv *revocations) revoke(ctx context.Context, s *session) error {
	rv.remember(s)
	k := revocationRecord(s)
	tok := randomToken()
	_, created, err := rv.store.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "idem-admin-sign-out", Token: tok, Lease: time.Minute})
	if err != nil {
		rv.release(k, tok)
		return err
	}
	if !created {
		return nil // revoked already
	}
	// Kept a minute past the session's end, for instances whose clocks
	// run behind.
	keep := s.expires.Sub(rv.now()) + time.Minute
	for try := 1; ; try++ {
		err = rv.store.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Retention: keep,
			Response: &idemstore.Response{Status: 204}})
		if err == nil || !errors.Is(err, idemstore.ErrRetryable) || try == retryConflicts {
			break
		}
	}
	if err != nil {
		// A reservation left pending would be found by recovery; while it
		// stands, it revokes the session as well.
		rv.release(k, tok)
		return err
	}
	return nil
}

// release gives up a revocation that could not be completed, fenced.
func (rv *revocations) release(k idemstore.Key, tok string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rv.store.Release(ctx, idemstore.ReleaseParams{Key: k, Token: tok})
}

// revoked reports whether s was signed out, on any instance. A store that
// cannot answer is an error: the session is then refused.
func (rv *revocations) revoked(ctx context.Context, s *session) (bool, error) {
	rv.mu.Lock()
	_, seen := rv.seen[s.revocationKey()]
	rv.mu.Unlock()
	if seen {
		return true, nil
	}
	_, err := rv.store.Get(ctx, revocationRecord(s))
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("looking for the session's sign-out: %w", err)
	}
	rv.remember(s)
	return true, nil
}

// remember keeps s's revocation in memory until s expires.
func (rv *revocations) remember(s *session) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if len(rv.seen) >= maxRevokedCache {
		now := rv.now()
		for k, exp := range rv.seen {
			if !now.Before(exp) {
				delete(rv.seen, k)
			}
		}
		if len(rv.seen) >= maxRevokedCache {
			return // the store still has it
		}
	}
	rv.seen[s.revocationKey()] = s.expires
}
