package idempg

import (
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Batcher returns the store's batcher, nil with Config.DisableBatch, for
// tests that pause it and benchmarks that read its Stats.
func (s *Store) Batcher() *groupcommit.Batcher { return s.batch }

// BatchSQL returns the multi-row statements of a batch's round, for tests
// that look at their plans: completeMany as a schema at migration 006
// runs it, and perRow as one at 005 does.
func (s *Store) BatchSQL() (reserveMany, completeMany, perRow string) {
	return s.q.reserveMany, s.q.completeManyAwaited, s.q.completeMany
}

// ChecksWaitersOnce reports whether s has found migration 006 and
// completes a batch's records with one check for waiters.
func (s *Store) ChecksWaitersOnce() bool { return s.awaited.Load() == awaitedYes }

// NotifyPayload is the payload of the notifications about k.
func NotifyPayload(k idemstore.Key) string { return notifyPayload(k) }

// SetStatementBytes sets how many bytes of values one multi-row statement
// of s carries at most, for tests that need a round cut in several.
func (s *Store) SetStatementBytes(n int) { s.statementBytes = n }
