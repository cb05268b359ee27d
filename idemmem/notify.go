package idemmem

import (
	"context"
	"slices"

	"github.com/idem-dev/idem/idemstore"
)

// Subscribe returns a channel that is closed the next time the record for
// key is completed, released, escalated, resolved or taken over (or the
// store is closed). Call cancel when done waiting; it may be called more
// than once.
func (s *Store) Subscribe(ctx context.Context, key idemstore.Key) (<-chan struct{}, func(), error) {
	if err := s.check(ctx); err != nil {
		return nil, nil, err
	}
	ch := make(chan struct{})
	sh, _ := s.locate(key)
	sh.mu.Lock()
	if s.closed.Load() { // Close has woken, or will not see, this shard's waiters
		sh.mu.Unlock()
		return nil, nil, ErrClosed
	}
	if sh.waiters == nil {
		sh.waiters = make(map[idemstore.Key][]chan struct{})
	}
	sh.waiters[key] = append(sh.waiters[key], ch)
	sh.mu.Unlock()
	cancel := func() {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		ws := sh.waiters[key]
		if i := slices.Index(ws, ch); i >= 0 {
			ws = slices.Delete(ws, i, i+1)
			if len(ws) == 0 {
				delete(sh.waiters, key)
			} else {
				sh.waiters[key] = ws
			}
		}
	}
	return ch, cancel, nil
}

// wake closes and forgets every waiter on key. The caller holds sh.mu. A
// channel is closed only here, after being removed from the list, so it is
// closed exactly once.
func (sh *shard) wake(key idemstore.Key) {
	if len(sh.waiters) == 0 {
		return
	}
	ws, ok := sh.waiters[key]
	if !ok {
		return
	}
	delete(sh.waiters, key)
	for _, ch := range ws {
		close(ch)
	}
}
