package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// leftStore is a fake store whose Batch blocks until released and gives
// each Reserve the outcome outcomes[token]; Single records the Releases it
// runs, failing the first fails of them with ErrUnavailable.
type leftStore struct {
	mu       sync.Mutex
	released []string // tokens, in order of attempt
	fails    int
	started  chan struct{}
	unblock  chan struct{}
	outcomes map[string]func(op *Op)
	batchErr error
}

func (s *leftStore) config() Config {
	return Config{
		Single: func(ctx context.Context, op *Op) {
			if op.Kind != Release {
				op.Created = true // a lone Reserve that goes in
				return
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			s.released = append(s.released, op.Token)
			op.Err = nil
			if s.fails > 0 {
				s.fails--
				op.Err = fmt.Errorf("%w: blip", idemstore.ErrUnavailable)
			}
		},
		Batch: func(ctx context.Context, ops []*Op) error {
			close(s.started)
			<-s.unblock
			for _, op := range ops {
				if f := s.outcomes[op.Token]; f != nil {
					f(op)
				}
			}
			return s.batchErr
		},
	}
}

func (s *leftStore) releases() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.released...)
}

// runLeaving runs ops as one batch; the callers of ops[i] with leave[i]
// leave once the batch has started. It returns what each Do returned, the
// ones that stayed after the batch ended.
func runLeaving(t *testing.T, s *leftStore, ops []*Op, leave []bool) []error {
	t.Helper()
	s.started, s.unblock = make(chan struct{}), make(chan struct{})
	b := New(s.config())
	p := b.Pause()
	errs := make([]error, len(ops))
	var left, stayed sync.WaitGroup
	cancels := make([]context.CancelFunc, len(ops))
	for i, op := range ops {
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i] = cancel
		wg := &stayed
		if leave[i] {
			wg = &left
		}
		wg.Go(func() { errs[i] = b.Do(ctx, op) })
		p.Wait(i + 1)
	}
	p.Resume()
	<-s.started
	for i, c := range cancels {
		if leave[i] {
			c()
		}
	}
	left.Wait() // the callers that left have their answer while the batch still runs
	close(s.unblock)
	stayed.Wait()
	for _, c := range cancels {
		c()
	}
	return errs
}

func reserve(tok string) *Op { return &Op{Kind: Reserve, Key: key(tok), Token: tok} }

func created(op *Op) { op.Created = true }

func TestLeftReserveIsReleasedByItsBatch(t *testing.T) {
	s := &leftStore{outcomes: map[string]func(*Op){
		"left-created": created,
		"left-found":   func(op *Op) { op.Record = &idemstore.Record{Token: "other"} },
		"stayed":       created,
	}}
	ops := []*Op{reserve("left-created"), reserve("left-found"), reserve("stayed"), {Kind: Complete, Key: key("left-complete"), Token: "left-complete"}}
	errs := runLeaving(t, s, ops, []bool{true, true, false, true})
	for i, leave := range []bool{true, true, false, true} {
		if leave != errors.Is(errs[i], context.Canceled) {
			t.Fatalf("%s: Do returned %v", ops[i].Token, errs[i])
		}
	}
	// Released before the member that stayed heard back: runLeaving waits
	// for it, and the release happened by then.
	if got := s.releases(); len(got) != 1 || got[0] != "left-created" {
		t.Fatalf("released %q; want only the Reserve that went in and whose caller left", got)
	}
	if !ops[2].Created {
		t.Fatal("the member that stayed lost its outcome")
	}
}

func TestLeftReserveOfAFailedBatchIsReleased(t *testing.T) {
	// A batch whose commit may or may not have happened: its Reserves may
	// have gone in.
	s := &leftStore{batchErr: CommitUnknown("fake", 2, errors.New("reply lost"))}
	errs := runLeaving(t, s, []*Op{reserve("left"), reserve("stayed")}, []bool{true, false})
	if !errors.Is(errs[0], context.Canceled) || errs[1] != nil {
		t.Fatalf("Do: %v", errs)
	}
	if got := s.releases(); len(got) != 1 || got[0] != "left" {
		t.Fatalf("released %q; want the Reserve whose caller left", got)
	}

	// A batch that surely rolled back and has every member run alone: the
	// one that left runs nothing, so there is nothing to release.
	s = &leftStore{batchErr: Alone(errors.New("value refused"))}
	runLeaving(t, s, []*Op{reserve("left"), reserve("stayed")}, []bool{true, false})
	if got := s.releases(); len(got) != 0 {
		t.Fatalf("released %q after a batch whose members rerun alone", got)
	}
}

func TestLeftReleaseRetriesATransientFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &leftStore{fails: 2, outcomes: map[string]func(*Op){"left": created}}
		runLeaving(t, s, []*Op{reserve("left"), reserve("stayed")}, []bool{true, false})
		if got := s.releases(); len(got) != 3 {
			t.Fatalf("release attempts %q; want two failures and a success", got)
		}
	})
}

func TestLeftReleaseGivesUpAtItsBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &leftStore{fails: 1 << 30, outcomes: map[string]func(*Op){"left": created}}
		start := time.Now()
		runLeaving(t, s, []*Op{reserve("left"), reserve("stayed")}, []bool{true, false})
		if took := time.Since(start); took < leftReleaseTimeout || took > leftReleaseTimeout+time.Second {
			t.Fatalf("a release that keeps failing held the batch %v; want about %v", took, leftReleaseTimeout)
		}
	})
}

func TestCommitContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		ctx, cancel := context.WithCancel(context.WithValue(t.Context(), key{}, "v"))
		cctx, stop := CommitContext(ctx)
		defer stop()
		if cctx.Value(key{}) != "v" {
			t.Fatal("the commit's context lost the caller's values")
		}
		cancel()
		synctest.Wait()
		if cctx.Err() != nil {
			t.Fatal("the commit's context ended with its caller's")
		}
		time.Sleep(CommitGrace - time.Nanosecond)
		synctest.Wait()
		if cctx.Err() != nil {
			t.Fatal("the commit's context ended before CommitGrace")
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if !errors.Is(cctx.Err(), context.Canceled) {
			t.Fatalf("CommitGrace after its caller's end, the commit's context: %v", cctx.Err())
		}
	})
	synctest.Test(t, func(t *testing.T) {
		// Stopped before the caller leaves, or while the grace runs: no
		// goroutine or timer is left behind in the bubble.
		for _, leaveFirst := range []bool{false, true} {
			ctx, cancel := context.WithCancel(t.Context())
			cctx, stop := CommitContext(ctx)
			if leaveFirst {
				cancel()
				synctest.Wait()
			}
			stop()
			if cctx.Err() == nil {
				t.Fatal("the commit's context outlived its stop")
			}
			cancel()
		}
		cctx, stop := CommitContext(context.Background()) // never ends
		if cctx.Done() == nil || cctx.Err() != nil {
			t.Fatal("the commit's context of a caller that never ends")
		}
		stop()
	})
}
