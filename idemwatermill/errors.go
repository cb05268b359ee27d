package idemwatermill

import (
	"errors"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/msgdoor"
)

// Error is returned by the middleware when it did not run the handler
// (the key is in flight, in review, used with another payload, missing or
// malformed, or its answer cannot be replayed), or when the handler failed
// and its key went to review. The router nacks it; IsPoison tells whether
// a redelivery could ever help.
//
// errors.Is matches the idem sentinel of the situation: idem.ErrInFlight,
// idem.ErrMismatch, idem.ErrNeedsReview, idem.ErrNotReplayable,
// idem.ErrNotAResult, idem.ErrMissingKey, idem.ErrInvalidKey,
// idem.ErrScopeMissing (Config.ScopeFunc gave no scope) or idem.ErrSealed;
// and, after a handler failure sent to review, the handler's own error as
// well (ErrDuplicateUUID among them when the handler produced two messages
// with one UUID).
type Error struct {
	// Situation is what happened, from idem's outcome table:
	// idem.SituationInFlight, SituationMismatch, SituationNeedsReview,
	// SituationNotReplayable, SituationMissingKey, SituationInvalidKey,
	// SituationSealed, or SituationUnavailable (the store failed; the
	// error wraps the store's).
	Situation idem.Situation
	// RetryAfter is set with SituationInFlight: about when the running
	// handling should be done.
	RetryAfter time.Duration
	// Reason says why, for logs and the poison queue's metadata. It never
	// contains the key.
	Reason string

	errs     []error
	poisoned bool
}

// Error describes the situation; it never contains the key.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("idemwatermill: ")
	b.WriteString(e.Situation.Name)
	if e.Reason != "" {
		b.WriteString(": ")
		b.WriteString(e.Reason)
	}
	return b.String()
}

// Unwrap returns the situation's sentinel and, after a handler failure, the
// handler's error.
func (e *Error) Unwrap() []error { return e.errs }

// Poison reports whether no redelivery can help: every situation but
// SituationInFlight (a later delivery gets past it once the running
// handling ends) and SituationUnavailable (the store failed).
func (e *Error) Poison() bool { return e.poisoned }

// IsPoison reports whether err holds an *Error that no redelivery can help:
// the message's key was used with another payload, is in review (also
// because the handler just failed with an outcome that is unknown), is
// missing or malformed, or its answer cannot be replayed. Pass it to
// Watermill's middleware.PoisonQueueWithFilter, so that such messages go
// to the poison queue, where an operator finds them, instead of coming
// back forever.
func IsPoison(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Poison()
}

func refused(r *msgdoor.Refusal) *Error {
	return &Error{Situation: r.Situation, RetryAfter: r.RetryAfter, Reason: r.Reason, errs: r.Errs, poisoned: r.Poison()}
}
