package idemstore

import (
	"errors"
	"fmt"
)

// Sentinel errors returned by every store. Drivers wrap native errors so that
// callers can test them with errors.Is.
var (
	// ErrNotFound means no record exists for the key.
	ErrNotFound = errors.New("idem: record not found")

	// ErrLeaseLost means a fenced change matched no record: the record is no
	// longer pending under the given token (it was completed, released,
	// escalated or taken over). A caller inside a business transaction must
	// roll it back.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrNotNeedsReview means Resolve found the record in another state than
	// needs_review.
	ErrNotNeedsReview = errors.New("idem: record does not need review")

	// ErrNotCompleted means Delete found the record in another state than
	// completed.
	ErrNotCompleted = errors.New("idem: record is not completed")

	// ErrUnavailable means the store could not be reached or failed in a way
	// that says nothing about the record. Callers fail closed on it.
	ErrUnavailable = errors.New("idem: store unavailable")

	// ErrRetryable means the store aborted the change because of contention
	// (a serialization failure, a deadlock, a lock wait timeout). Nothing was
	// changed; the same call may be tried again.
	ErrRetryable = errors.New("idem: transient store conflict, retry")

	// ErrFull means the store refused a new reservation for want of room:
	// it holds all it is allowed to, and nothing it may evict (a bounded
	// in-memory store full of pending records, say). Nothing was written.
	// It wraps ErrUnavailable, so callers fail closed: idem's middleware
	// and proxy answer 503 and run nothing.
	ErrFull = fmt.Errorf("idem: store full: %w", ErrUnavailable)
)
