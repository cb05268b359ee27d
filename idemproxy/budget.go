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
