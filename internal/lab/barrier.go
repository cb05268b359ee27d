package lab

import (
	"context"
	"sync"
	"time"
)

// barrier holds the workers of a round until all of them have arrived, so
// that every check happens before any insert. It opens by itself after a
// bound, so that a worker blocked before it (by a lock the lab did not
// expect) cannot hold the others forever, and the round goes on unforced.
type barrier struct {
	mu      sync.Mutex
	waiting int
	open    chan struct{}
}

// barrierBound is how long a barrier waits for the last worker.
const barrierBound = 5 * time.Second

func newBarrier(n int) *barrier {
	b := &barrier{waiting: n, open: make(chan struct{})}
	if n <= 0 {
		close(b.open)
	}
	return b
}

// arrive marks one worker as arrived and waits for the others. It returns
// false when the bound passed first, and ctx's error when it ended first.
// Every worker calls it exactly once, also when its check failed.
func (b *barrier) arrive(ctx context.Context) (bool, error) {
	b.mu.Lock()
	b.waiting--
	if b.waiting == 0 {
		close(b.open)
	}
	b.mu.Unlock()
	t := time.NewTimer(barrierBound)
	defer t.Stop()
	select {
	case <-b.open:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}
