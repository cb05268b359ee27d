package idem

import (
	"fmt"
	"sync/atomic"
)

// Budget bounds the bytes that requests hold in memory at once, across
// every request that shares it: a request takes its share with TryAcquire
// before it holds the bytes, and gives it back with Release once it no
// longer does. A request that finds no room left is refused at once (idem
// answers 503 busy with Retry-After), never queued: a client that holds
// its share while it trickles is bounded by a timeout of the server's, not
// by the patience of the others.
//
// The middleware charges one for the request bodies it reads
// (Config.BodyBudget, see BodyBudget), and idem serve one for the stored
// answers it replays (max_replay_memory).
//
// A Budget is safe for concurrent use.
type Budget struct {
	max  int64
	used atomic.Int64
}

// NewBudget returns a budget of max bytes. It panics unless max is
// positive.
func NewBudget(max int64) *Budget {
	if max <= 0 {
		panic(fmt.Sprintf("idem: budget of %d bytes", max))
	}
	return &Budget{max: max}
}

// Max returns the budget's size in bytes.
func (b *Budget) Max() int64 { return b.max }

// Used returns the bytes held now.
func (b *Budget) Used() int64 { return b.used.Load() }

// TryAcquire takes n bytes of the budget and reports true, or reports
// false, taking nothing, when they are not left.
func (b *Budget) TryAcquire(n int64) bool {
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

// Release gives back n bytes that TryAcquire took.
func (b *Budget) Release(n int64) { b.used.Add(-n) }
