package idemnats

import (
	"errors"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/msgdoor"
)

// Error is returned by Guard.Handle when it did not run the handler (the
// key is in flight, in review, used with other data, missing or malformed,
// its answer cannot be replayed, or the store failed), or when the handler
// failed and its key went to review.
//
// errors.Is matches the idem sentinel of the situation: idem.ErrInFlight,
// idem.ErrMismatch, idem.ErrNeedsReview, idem.ErrNotReplayable,
// idem.ErrNotAResult, idem.ErrMissingKey, idem.ErrInvalidKey,
// idem.ErrScopeMissing (Config.ScopeFunc gave no scope), idem.ErrSealed
// or the store's error; ErrDuplicateID when a produced message would be
// lost; ErrTerminatedBefore for a message terminated again; and, after a
// handler failure sent to review, the handler's own error as well.
type Error struct {
	// Situation is what happened, from idem's outcome table.
	Situation idem.Situation
	// RetryAfter is set with idem.SituationInFlight: about when the
	// running handling should be done.
	RetryAfter time.Duration
	// Reason says why; it is also the Term's reason. It never contains the
	// key.
	Reason string

	errs     []error
	poisoned bool
}

// Error describes the situation; it never contains the key.
func (e *Error) Error() string {
	if e.Reason == "" {
		return "idemnats: " + e.Situation.Name
	}
	return "idemnats: " + e.Situation.Name + ": " + e.Reason
}

// Unwrap returns the situation's sentinel and, after a handler failure, the
// handler's error.
func (e *Error) Unwrap() []error { return e.errs }

// Terminated reports whether the message was terminated (Term):
// no redelivery could help. The others were nakked with a delay.
func (e *Error) Terminated() bool { return e.poisoned }

// IsTerminated reports whether err holds an *Error whose message was
// terminated.
func IsTerminated(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Terminated()
}

func refused(r *msgdoor.Refusal) *Error {
	return &Error{Situation: r.Situation, RetryAfter: r.RetryAfter, Reason: r.Reason, errs: r.Errs, poisoned: r.Poison()}
}

// ErrTerminatedBefore is matched by the *Error of a message that the Guard
// terminated before and that was delivered again: it is terminated again,
// plainly, without looking it up.
var ErrTerminatedBefore = errors.New("idemnats: the message was terminated before")
