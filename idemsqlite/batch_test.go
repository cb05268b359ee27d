package idemsqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// TestBatchSameKeyOneWinner: two Reserves of one key in one batch, as if
// one came after the other: the first wins, the second sees its pending
// record. Calls on other keys in the batch get their own outcomes.
func TestBatchSameKeyOneWinner(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	done := batchtest.Key("done")
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: done, Fingerprint: "fp", Token: "old", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	k := batchtest.Key("contended")
	got := batchtest.InOneBatch(t, s.Batcher(),
		batchtest.Reserve(ctx, s, k, "first", time.Minute),
		batchtest.Reserve(ctx, s, k, "second", time.Minute),
		batchtest.Complete(ctx, s, done, "old", time.Hour),
		batchtest.Complete(ctx, s, done, "stranger", time.Hour),
	)
	if got[0].Err != nil || !got[0].Created {
		t.Fatalf("first Reserve: %+v, want created", got[0])
	}
	if got[1].Err != nil || got[1].Created || got[1].Record == nil || got[1].Record.Token != "first" || got[1].Record.State != idemstore.StatePending {
		t.Fatalf("second Reserve: %+v, want the first's pending record", got[1])
	}
	if got[2].Err != nil {
		t.Fatalf("Complete by the holder: %v", got[2].Err)
	}
	if !errors.Is(got[3].Err, idemstore.ErrLeaseLost) {
		t.Fatalf("Complete by a stranger: %v, want ErrLeaseLost", got[3].Err)
	}
	if rec, err := s.Get(ctx, done); err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("completed key: %+v, %v", rec, err)
	}
	if st, ok := s.BatchStats(); !ok || st.Batches != 1 || st.Batched != 4 {
		t.Fatalf("BatchStats() = %+v, %v; want the four calls in one batch", st, ok)
	}
}

// TestBatchPoisonCallRunsAlone: a call the database refuses (here a
// trigger refuses one key) fails alone; the others in its batch succeed.
func TestBatchPoisonCallRunsAlone(t *testing.T) {
	t.Parallel()
	s, db := newStore(t)
	if _, err := db.ExecContext(t.Context(), `CREATE TRIGGER refuse_poison BEFORE INSERT ON idem_records
		WHEN NEW."key" = 'poison' BEGIN SELECT RAISE(ABORT, 'poison key refused'); END`); err != nil {
		t.Fatal(err)
	}
	batchtest.PoisonRunsAlone(t, s, s.Batcher(), batchtest.Key("poison"))
	if _, err := s.Get(t.Context(), batchtest.Key("poison")); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("poison key stored: %v", err)
	}
}

// TestBatchFailureFailsEveryMember: a batch that cannot take the write lock
// fails every member with ErrRetryable and writes nothing.
func TestBatchFailureFailsEveryMember(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), idemsqlite.OpenOptions{BusyTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	blocker, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: holds the write lock
	if err != nil {
		t.Fatal(err)
	}
	got := batchtest.InOneBatch(t, s.Batcher(), batchtest.Reserve(ctx, s, batchtest.Key("a"), "a", time.Minute), batchtest.Reserve(ctx, s, batchtest.Key("b"), "b", time.Minute))
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	for i, r := range got {
		if !errors.Is(r.Err, idemstore.ErrRetryable) || r.Created {
			t.Fatalf("member %d: %+v, want ErrRetryable and nothing created", i, r)
		}
	}
	for _, name := range []string{"a", "b"} {
		if _, err := s.Get(ctx, batchtest.Key(name)); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("key %s after the failed batch: %v", name, err)
		}
	}
}

// TestBatchMemberLeavesThenReleases: a Reserve whose context ends while its
// batch waits for the write lock (held by another transaction) returns the
// context's error; the batch still commits it, and the release that
// follows finds it.
func TestBatchMemberLeavesThenReleases(t *testing.T) {
	t.Parallel()
	s, db := newStore(t)
	batchtest.LeaveThenRelease(t, s, s.Batcher(), func(idemstore.Key) func() {
		blocker, err := db.BeginTx(t.Context(), nil) // BEGIN IMMEDIATE: holds the write lock
		if err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := blocker.Rollback(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestBatchCancelledWhileQueuedWritesNothing: a Reserve whose context ends
// before its batch starts is not written.
func TestBatchCancelledWhileQueuedWritesNothing(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx, cancel := context.WithCancel(t.Context())
	p := s.Batcher().Pause()
	res := make(chan batchtest.Result)
	go func() { res <- batchtest.Reserve(ctx, s, batchtest.Key("k"), "t", time.Minute)() }()
	p.Wait(1)
	cancel()
	if r := <-res; !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("Reserve: %+v, want context.Canceled", r)
	}
	p.Resume()
	if _, err := s.Get(t.Context(), batchtest.Key("k")); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("key after a Reserve cancelled while queued: %v", err)
	}
}

// TestBatchDisabled: with DisableBatch the store has no batcher.
func TestBatchDisabled(t *testing.T) {
	t.Parallel()
	s, _ := newStoreWith(t, idemsqlite.Config{DisableBatch: true})
	if s.Batcher() != nil {
		t.Fatal("DisableBatch: the store still batches")
	}
	if st, ok := s.BatchStats(); ok {
		t.Fatalf("DisableBatch: BatchStats() = %+v, true", st)
	}
}
