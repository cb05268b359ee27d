package idemproxy

import "sync/atomic"

// bodyBudget bounds the bytes of request bodies held in memory across all
// requests at once (Config.MaxBodyMemory). A request takes its share before
// its body is read and gives it back once it is done; one that does not
// fit is refused at once (503 busy), rather than queued: a client that
// holds its share while it trickles its body is bounded by read_timeout,
// not by the patience of the others.
type bodyBudget struct {
	max  int64
	used atomic.Int64
}

// acquire takes n bytes of the budget, or reports that they are not left.
func (b *bodyBudget) acquire(n int64) bool {
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

func (b *bodyBudget) release(n int64) { b.used.Add(-n) }

// replayBudget bounds the bytes of stored answers held while they are
// written to clients (Config.MaxReplayMemory): the middleware takes a
// replay's share before it writes it, through the request's context
// (replaygate), and gives it back once the client took it or was cut off.
// A replay that does not fit is refused at once (503 busy).
type replayBudget struct{ bodyBudget }

// Acquire implements replaygate.Gate. A replay larger than the whole
// budget (an engine whose MaxResponseBody is over it) takes all of it, so
// that it is written when it is alone rather than never.
func (b *replayBudget) Acquire(n int64) bool { return b.acquire(min(n, b.max)) }

// Release implements replaygate.Gate.
func (b *replayBudget) Release(n int64) { b.release(min(n, b.max)) }

// minReplayMemory is the least Config.MaxReplayMemory: the largest stored
// answer (idem's MaxResponseBody, 1 MiB) and what decoding it holds.
const minReplayMemory = 2 << 20
