package idemadmin

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/idem-dev/idem/idemstore"
)

// AnyAttempt, given as a change's attempt, applies the change to whichever
// attempt holds the key when the change is made, without knowing which
// one the caller looked at: a key that was released, retried and sent to
// review again, or deleted and answered again, since the caller read it
// is changed all the same. Scripts that have just read the key and
// operators who accept that may pass it; the review page never does.
const AnyAttempt = "*"

// attemptLen is the length of an attempt as Item.Attempt shows it.
const attemptLen = 16

// retryConflicts bounds the tries of a change that the store aborted on a
// transient conflict (idemstore.ErrRetryable: nothing changed).
const retryConflicts = 3

// errAttemptRequired answers a change that does not say which attempt of
// the key it is about.
func errAttemptRequired(k idemstore.Key) error {
	return &Error{Status: http.StatusPreconditionRequired, Code: CodeAttemptRequired,
		Detail: fmt.Sprintf("say which attempt of %s this change is about: attempt is the attempt of the key you looked at "+
			"(GET /api/v1/keys/{id}, idem keys get), and the change is refused if the key changed since; "+
			"%q changes whichever attempt holds the key", describeKey(k), AnyAttempt)}
}

// checkAttempt checks an attempt as a change gives it: AnyAttempt, or an
// attempt as Item.Attempt shows it.
func checkAttempt(k idemstore.Key, attempt string) error {
	switch {
	case attempt == "":
		return errAttemptRequired(k)
	case attempt == AnyAttempt:
		return nil
	case len(attempt) != attemptLen:
		return badRequest("attempt %s is not an attempt: 16 hexadecimal digits, as the key shows it, or %q", quote(attempt, 40), AnyAttempt)
	}
	for i := 0; i < len(attempt); i++ {
		if c := attempt[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return badRequest("attempt %s is not an attempt: 16 hexadecimal digits, as the key shows it, or %q", quote(attempt, 40), AnyAttempt)
		}
	}
	return nil
}

// change is the one path of every change an operator makes to a key: a
// resolution, a deletion, one key of a bulk action. It reads the key,
// requires it to be in state want (else wrong) and to be the attempt the
// operator looked at (unless attempt is AnyAttempt), and runs apply with
// the record read; apply must fence its store call by rec.Token, so that
// whatever happens between the read and the change (another operator's
// change, a new attempt, a new answer) is never changed by it. A change
// the store aborted on a transient conflict changed nothing, and is tried
// again. It returns the record that was changed, as read.
func (k *Keys) change(ctx context.Context, key idemstore.Key, attempt string, want idemstore.State, wrong error, apply func(rec *idemstore.Record) error) (*idemstore.Record, error) {
	if err := checkAttempt(key, attempt); err != nil {
		return nil, err
	}
	if isSessionScope(key) {
		return nil, keyError(key, "", idemstore.ErrNotFound)
	}
	rec, err := k.Store.Get(ctx, key)
	if err != nil {
		return nil, keyError(key, "", err)
	}
	if rec.State != want {
		return nil, keyError(key, rec.State, wrong)
	}
	if attempt != AnyAttempt && attempt != attemptOf(rec.Token) {
		return nil, keyError(key, want, idemstore.ErrLeaseLost)
	}
	for try := 1; ; try++ {
		err = apply(rec)
		if !errors.Is(err, idemstore.ErrRetryable) || try == retryConflicts {
			break
		}
	}
	if err != nil {
		// Another operator, a resolver or a new request may have changed
		// the key since the read.
		var state idemstore.State
		if errors.Is(err, idemstore.ErrLeaseLost) {
			state = want
		}
		return nil, keyError(key, state, err)
	}
	return rec, nil
}
