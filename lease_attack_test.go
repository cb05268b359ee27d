package idem_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// batchedCompletes is a memory store whose Complete goes through a group
// commit Batcher, as the SQL stores' does: a call whose context ends
// returns at once, while its batch may still be running with that context.
type batchedCompletes struct {
	*idemmem.Store
	b          *groupcommit.Batcher
	escalating chan struct{}
}

func (s *batchedCompletes) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	op := groupcommit.CompleteOp(p)
	if err := s.b.Do(ctx, op); err != nil {
		return err
	}
	return op.Err
}

func (s *batchedCompletes) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	select {
	case s.escalating <- struct{}{}:
	default:
	}
	return s.Store.Escalate(ctx, p)
}

// TestSettlementGivenUpKeepsItsContext: a Complete that the lease gave up
// on at SettleTimeout may still be running in its batch, with the context
// the lease gave it. The lease's next settlement (the escalation that
// follows a failed Complete) must not reuse that context: a context that
// ended stays ended for the call still holding it, and nothing rewrites it
// under that call.
func TestSettlementGivenUpKeepsItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := idemmem.MustNew(idemmem.Config{})
		defer mem.Close()
		entered := make(chan context.Context, 1)
		release := make(chan struct{})
		errAfter := make(chan error, 1)
		st := &batchedCompletes{Store: mem, escalating: make(chan struct{}, 1)}
		calls := groupcommit.Calls{Complete: mem.Complete}
		held := false
		st.b = groupcommit.New(groupcommit.Config{
			Single: func(ctx context.Context, op *groupcommit.Op) {
				if op.Kind == groupcommit.Complete && !held {
					held = true
					entered <- ctx
					<-release
					errAfter <- ctx.Err()
				}
				calls.Run(ctx, op)
			},
			Batch: func(ctx context.Context, ops []*groupcommit.Op) error {
				for _, op := range ops {
					calls.Run(ctx, op)
				}
				return nil
			},
		})
		e, err := idem.NewEngine(st, quiet(idem.EngineConfig{Lease: time.Hour, SettleTimeout: time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.Begin(t.Context(), idem.Request{Key: idem.Key{Scope: "s", Operation: "op", Key: "k"}, Fingerprint: "f"})
		if err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("Begin: %v %v", res.Outcome, err)
		}
		lease := res.Lease

		// The Complete queues behind a busy shard and runs in a batch.
		p := st.b.Pause()
		completed := make(chan error, 1)
		go func() {
			completed <- lease.Complete(context.Background(), &idem.Response{Status: 201, Body: []byte("ok")})
		}()
		p.Wait(1)
		p.Resume()
		ctx := <-entered
		<-ctx.Done() // SettleTimeout passed: the lease gives up on the call
		if err := <-completed; err == nil {
			t.Fatal("Complete succeeded though its call never returned")
		}

		// As the middleware does after a failed Complete.
		escalated := make(chan error, 1)
		go func() { escalated <- lease.Escalate(context.Background(), "storing the answer failed") }()
		<-st.escalating
		close(release)
		if err := <-errAfter; err == nil {
			t.Fatal("the context of the call the lease gave up on was reset under it by the next settlement: it no longer reports that it ended")
		}
		if err := <-escalated; err != nil {
			t.Fatalf("Escalate: %v", err)
		}
	})
}
