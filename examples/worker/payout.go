package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/idem-dev/idem"
)

// PayoutArgs asks for money to be paid out to an account. PayoutID names the
// payout: whoever enqueues it picks it once, so that the payout is the same
// however often the job is enqueued or delivered.
type PayoutArgs struct {
	PayoutID string `json:"payout_id"`
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
}

// Kind is the River job kind, and the idem operation.
func (PayoutArgs) Kind() string { return "payout" }

// LedgerEntry is what a payout job stores as its result: the ledger row it
// wrote. Every later delivery of the job gets it back instead of writing
// another.
type LedgerEntry struct {
	ID       int64  `json:"id"`
	PayoutID string `json:"payout_id"`
}

// PayoutWorker writes a payout to the ledger, exactly once per payout. River
// delivers a job at least once: again after an error, and again after a
// worker died mid-job (its rescuer finds the job stuck). idem.DoTx makes the
// ledger row and the stored result commit in one transaction, so a delivery
// after the commit replays the result and writes nothing.
type PayoutWorker struct {
	river.WorkerDefaults[PayoutArgs]

	Engine *idem.Engine
	Pool   *pgxpool.Pool
	// Schema holds the ledger table.
	Schema string
	Logger *slog.Logger

	// Crash points for the tests: called inside the transaction after the
	// ledger row was written, and after the transaction committed but
	// before River hears the job is done.
	inTx, committed func(PayoutArgs)
}

// Work pays job's payout out once.
func (w *PayoutWorker) Work(ctx context.Context, job *river.Job[PayoutArgs]) error {
	args := job.Args
	req, err := payoutRequest(args)
	if err != nil {
		return river.JobCancel(err)
	}
	inTx := func(ctx context.Context, f func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, w.Pool, f) }
	entry, err := idem.DoTx(ctx, w.Engine, req, inTx, func(ctx context.Context, tx pgx.Tx) (LedgerEntry, error) {
		e := LedgerEntry{PayoutID: args.PayoutID}
		err := tx.QueryRow(ctx, `INSERT INTO `+pgx.Identifier{w.Schema, "ledger"}.Sanitize()+` (payout_id, account, amount)
			VALUES ($1, $2, $3) RETURNING id`, args.PayoutID, args.Account, args.Amount).Scan(&e.ID)
		if err == nil && w.inTx != nil {
			w.inTx(args)
		}
		return e, err
	})
	var oe *idem.OutcomeError
	switch {
	case errors.As(err, &oe) && oe.Outcome == idem.InFlight:
		// Another worker holds the payout (or held it, and died: its lease
		// runs out soon). Look again once it should be done.
		return river.JobSnooze(oe.RetryAfter)
	case errors.As(err, &oe):
		// The payout ID was reused for other arguments (ErrMismatch), an
		// operator must decide (ErrNeedsReview) or settled it as failed
		// (ErrNotAResult), or its result no longer decodes: no retry can
		// help.
		return river.JobCancel(err)
	case err != nil:
		return err // rolled back and released: River retries
	}
	if w.committed != nil {
		w.committed(args)
	}
	w.Logger.LogAttrs(ctx, slog.LevelInfo, "payout recorded", slog.String("payout_id", args.PayoutID),
		slog.Int64("ledger_id", entry.ID), slog.Int("attempt", job.Attempt))
	return nil
}

// payoutRequest is the idem request of a payout: keyed by its payout ID,
// fingerprinted by its arguments, and transactional (its only effect is the
// ledger row, inside DoTx's transaction).
func payoutRequest(args PayoutArgs) (idem.Request, error) {
	if args.PayoutID == "" {
		return idem.Request{}, errors.New("payout: no payout_id")
	}
	body, err := json.Marshal(args)
	if err != nil {
		return idem.Request{}, err
	}
	src := &idem.FingerprintSource{Input: idem.FingerprintInput{Operation: PayoutArgs{}.Kind(), ContentType: "application/json", Body: body}}
	fp, err := idem.Fingerprint(src.Input, src.Options)
	if err != nil {
		return idem.Request{}, fmt.Errorf("payout: fingerprint: %w", err)
	}
	return idem.Request{
		Key:         idem.Key{Scope: "payouts", Operation: PayoutArgs{}.Kind(), Key: args.PayoutID},
		Fingerprint: fp,
		// A job stored by an earlier version of idem still matches.
		FingerprintSource: src,
		Kind:              idem.Transactional,
		Retention:         7 * 24 * time.Hour, // far longer than River takes to redeliver a job whose worker died
	}, nil
}
