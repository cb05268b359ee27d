package idemstore

import (
	"context"
	"errors"
	"fmt"
)

// ReserveLoop is the retry loop the Reserve contract asks of SQL drivers.
// once makes one insert and, on conflict, one read of the existing record;
// it returns created == true when the insert went in, and a nil record,
// created == false and nil error when the existing record vanished before
// the read. ReserveLoop calls once again in that case, up to
// MaxReserveAttempts times, and after an ErrRetryable (a serialization
// failure or deadlock, which changed nothing) up to retries times. driver
// names the store in the error it returns when the key keeps vanishing.
func ReserveLoop(driver string, retries int, once func() (*Record, bool, error)) (*Record, bool, error) {
	retried := 0
	for attempt := 0; attempt < MaxReserveAttempts; {
		rec, created, err := once()
		switch {
		case err == nil && created:
			return nil, true, nil
		case err == nil && rec != nil:
			return rec, false, nil
		case err == nil: // conflict, then the record vanished: insert again
			attempt++
		case errors.Is(err, ErrRetryable) && retried < retries:
			retried++
		default:
			return nil, false, err
		}
	}
	return nil, false, fmt.Errorf("%w: %s: reserve: key kept vanishing after %d attempts", ErrRetryable, driver, MaxReserveAttempts)
}

// KeyPage turns the records a driver fetched for List — in key order, up
// to limit+1 of them, the extra one telling whether a next page exists —
// into a page with its cursor.
func KeyPage(recs []*Record, limit int) ListPage {
	var page ListPage
	if len(recs) > limit {
		recs = recs[:limit]
		page.NextCursor = EncodeKeyCursor(recs[len(recs)-1].Key)
	}
	page.Records = recs
	return page
}

// PurgeBatches is the batching Purge asks of every driver: it calls
// deleteBatch, which deletes at most p.BatchSize expired records in one
// short statement and says how many, until a batch deletes fewer than
// p.BatchSize or ctx ends, reports each batch to p.Progress, and returns the
// total. p must be normalized.
func PurgeBatches(ctx context.Context, p PurgeParams, deleteBatch func() (int, error)) (int, error) {
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := deleteBatch()
		total += n
		p.Report(n, total)
		if err != nil || n < p.BatchSize {
			return total, err
		}
	}
}

// Unmatched says why a change conditioned on a record's state (want) and,
// when wantToken is not empty, its token matched no record, given the
// state and token the driver read back right after: ErrLeaseLost for the
// wanted state under another token (another attempt), ErrRetryable when the
// record is as wanted again (it changed between the two statements), and
// wrong for any other state. A record that is gone is the driver's
// ErrNotFound, before this is asked.
func Unmatched(state State, token string, want State, wantToken string, wrong error) error {
	switch {
	case state != want:
		return wrong
	case wantToken != "" && token != wantToken:
		return ErrLeaseLost
	}
	return ErrRetryable
}
