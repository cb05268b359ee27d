package groupcommit

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

// Failed says what a batch's members get when one of its calls failed
// with err (already turned into the store's sentinels) and the transaction
// surely rolled back: err itself when it would fail every member alike (a
// conflict, an unreachable store, the batch's context ending), so that each
// caller retries as it would after its own call failed; otherwise Alone(err),
// since err may be that one call's fault (a value the database refused),
// and each member runs alone to get its own outcome.
func Failed(err error) error {
	if errors.Is(err, idemstore.ErrRetryable) || errors.Is(err, idemstore.ErrUnavailable) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return Alone(err)
}

// CommitUnknown is the error of a batch whose commit may or may not have
// happened (the commit failed, the connection broke after it was sent):
// idemstore.ErrUnavailable, which says nothing about the records, with
// err's text but never its idemstore.ErrRetryable, which would claim that
// nothing changed. Each member then treats its call as a lost reply.
func CommitUnknown(driver string, n int, err error) error {
	return fmt.Errorf("%w: %s: the commit of a batch of %d calls may or may not have happened: %v", idemstore.ErrUnavailable, driver, n, err)
}
