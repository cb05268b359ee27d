package groupcommit

import (
	"context"
	"errors"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// A caller whose context ends while its batch runs gets the context's
// error at once, and the batch goes on for the others. For a Reserve, the
// contract then has the caller release its token, and that release queues
// behind the batch on the same shard. But the caller's release is bounded
// (the engine gives it a fraction of a second, since its own caller waits
// for the answer), and a batch can wait far longer for a lock: the release
// gives up, queued, and finds nothing when it reads the record back, and
// then the batch commits the reservation under a token that nobody holds.
// So the batch itself releases the Reserves whose callers left, once its
// outcome is known and before its members are told or the next batch
// starts; the caller's own release, if it still runs, then finds nothing.

// leftReleaseTimeout bounds the release of a Reserve whose caller left
// while its batch ran, retries included.
const leftReleaseTimeout = 5 * time.Second

// leftReleasePause is the first pause between attempts at that release.
const leftReleasePause = 10 * time.Millisecond

// releaseLeft releases, fenced by its token, the reservation that op may
// have made for a caller that has left. It does nothing when op is not a
// Reserve, or surely wrote nothing: it found the key taken, or its batch
// rolled back and each member was to run alone.
func (b *Batcher) releaseLeft(op *Op) {
	if op.Kind != Reserve || op.alone || op.Err == nil && !op.Created {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(op.ctx), leftReleaseTimeout)
	defer cancel()
	release := &Op{Kind: Release, Key: op.Key, Token: op.Token}
	for pause := leftReleasePause; ; pause *= 2 {
		b.cfg.Single(ctx, release)
		err := release.Err
		if err == nil || !errors.Is(err, idemstore.ErrUnavailable) && !errors.Is(err, idemstore.ErrRetryable) {
			return // released, or nothing of ours there (ErrLeaseLost)
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}
