package groupcommit

import (
	"context"
	"time"
)

// A claim (a Reserve, or a batch holding Reserves) gives a record a token
// that only its caller knows. If the caller leaves while the server still
// runs the claim, and the server commits it afterwards, the record stays
// pending under a token that nobody holds: the engine's release of that
// token, which it makes when a Reserve fails, may already have run and
// found nothing. So the SQL stores write a claim in a transaction of its
// own and commit it only once its statements have answered:
//
//   - while a statement runs, the caller's context governs it; when it
//     ends, the driver drops the connection, and the server, which cannot
//     have received COMMIT, rolls the transaction back whenever it notices
//     (however long the statement still waits for a lock);
//   - the COMMIT itself runs in CommitContext, so that a caller leaving
//     then does not cut it off: the claim returns once the server has
//     answered whether it committed, and what the caller does next (the
//     engine's release) reaches the server after it.

// CommitGrace bounds how long a commit goes on once its caller's context
// has ended. A server that answers nothing for that long is treated as
// unreachable: the commit is dropped, as any lost reply.
const CommitGrace = 5 * time.Second

// CommitContext returns the context a store commits a claim in: ctx's
// values, not its cancellation, and an end CommitGrace after ctx ends. Call
// the returned function when the commit is over.
func CommitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if ctx.Done() == nil {
		return cctx, cancel
	}
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(CommitGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-cctx.Done():
		}
	})
	return cctx, func() {
		stop()
		cancel()
	}
}
