package idempg

import (
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// Batcher returns the store's batcher, nil with Config.DisableBatch, for
// tests that pause it and benchmarks that read its Stats.
func (s *Store) Batcher() *groupcommit.Batcher { return s.batch }

// BatchSQL returns the multi-row statements of a batch's round, for tests
// that look at their plans.
func (s *Store) BatchSQL() (reserveMany, completeMany string) {
	return s.q.reserveMany, s.q.completeMany
}

// NotifyPayload is the payload of the notifications about k.
func NotifyPayload(k idemstore.Key) string { return notifyPayload(k) }

// SetStatementBytes sets how many bytes of values one multi-row statement
// of s carries at most, for tests that need a round cut in several.
func (s *Store) SetStatementBytes(n int) { s.statementBytes = n }
