package groupcommit

import (
	"runtime"
	"sync"
)

// Paused holds a Batcher's shards as if a call were in flight on each, so
// that calls made meanwhile queue up and run as one batch on Resume. It is
// for tests that need particular calls in one batch.
type Paused struct {
	b *Batcher
	p *pause
}

type pause struct {
	mu   sync.Mutex
	cond sync.Cond
	n    int
}

func (p *pause) arrived() {
	p.mu.Lock()
	p.n++
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Pause holds every shard of b, once the calls in flight on it (if any)
// have ended. It panics if b is already paused.
func (b *Batcher) Pause() *Paused {
	p := &pause{}
	p.cond.L = &p.mu
	if !b.paused.CompareAndSwap(nil, p) {
		panic("groupcommit: Pause of a paused Batcher")
	}
	for i := range b.shards {
		sh := &b.shards[i]
		for {
			sh.mu.Lock()
			busy := sh.running
			sh.running = true
			sh.mu.Unlock()
			if !busy {
				break
			}
			runtime.Gosched() // the batch in flight ends on its own
		}
	}
	return &Paused{b: b, p: p}
}

// Wait returns once n calls have queued since Pause.
func (p *Paused) Wait(n int) {
	p.p.mu.Lock()
	for p.p.n < n {
		p.p.cond.Wait()
	}
	p.p.mu.Unlock()
}

// Resume lets the queued calls run, as one batch per shard.
func (p *Paused) Resume() {
	p.b.paused.Store(nil)
	for i := range p.b.shards {
		p.b.handOff(&p.b.shards[i])
	}
}
