package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// An operator settled a payout's key as failed (completed with a 502 after
// review). Its job is delivered again: the worker must cancel it, not let
// River retry an answer that can never change, and write nothing.
func TestPayoutSettledAsFailureIsCancelled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	args := PayoutArgs{PayoutID: "po_5", Account: "acct_42", Amount: 500}
	req, err := payoutRequest(args)
	if err != nil {
		t.Fatal(err)
	}
	store, err := idempg.New(f.pool, idempg.Config{Schema: f.schema})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Begin(ctx, req)
	if err != nil || res.Lease == nil {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	if err := res.Lease.Escalate(ctx, "the bank timed out"); err != nil {
		t.Fatal(err)
	}
	if err := store.Resolve(ctx, idemstore.ResolveParams{Key: req.Key, Action: idemstore.ResolveComplete, Token: res.Lease.Token(), Retention: time.Hour,
		Response: &idem.Response{Status: 502, Body: []byte(`{"title":"refunded by hand"}`)}}); err != nil {
		t.Fatal(err)
	}

	worker := startWorker(t, f.schema, "")
	job, err := f.river.Insert(ctx, args, nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the job is worked", func() bool {
		s := f.job(t, job.Job.ID).State
		return s == rivertype.JobStateCancelled || s == rivertype.JobStateRetryable || s == rivertype.JobStateCompleted
	})
	worker.stop(t)
	row := f.job(t, job.Job.ID)
	if row.State != rivertype.JobStateCancelled || len(row.Errors) == 0 || !strings.Contains(row.Errors[len(row.Errors)-1].Error, idem.ErrNotAResult.Error()) {
		t.Fatalf("job %s, errors %+v", row.State, row.Errors)
	}
	if n := f.ledgerRows(t, args.PayoutID); n != 0 {
		t.Fatalf("%d ledger rows", n)
	}
}
