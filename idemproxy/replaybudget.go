package idemproxy

import "sync/atomic"

// replayBudget bounds the bytes of stored answers held while they are
// written to clients (Config.MaxReplayMemory): the middleware takes a
// replay's share before it writes it, through the request's context
// (replaygate), and gives it back once the client took it or was cut off.
// A replay that does not fit is refused at once (503 busy), rather than
// queued.
type replayBudget struct {
	max  int64
	used atomic.Int64
}

// acquire takes n bytes of the budget, or reports that they are not left.
func (b *replayBudget) acquire(n int64) bool {
	for {
		used := b.used.Load()
		if used+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// Acquire implements replaygate.Gate. A replay larger than the whole
// budget (an engine whose MaxResponseBody is over it) takes all of it, so
// that it is written when it is alone rather than never.
func (b *replayBudget) Acquire(n int64) bool { return b.acquire(min(n, b.max)) }

// Release implements replaygate.Gate.
func (b *replayBudget) Release(n int64) { b.used.Add(-min(n, b.max)) }

// minReplayMemory is the least Config.MaxReplayMemory: the largest stored
// answer (idem's MaxResponseBody, 1 MiB) and what decoding it holds.
const minReplayMemory = 2 << 20
