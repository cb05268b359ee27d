package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/idem-dev/idem/idemstore"
)

// Config configures a Batcher.
type Config struct {
	// Single runs op alone, as the store does without batching (an
	// autocommit statement), with ctx, and sets op's outcome. Required.
	Single func(ctx context.Context, op *Op)

	// Batch runs ops (two or more, sorted by key with same-key calls in
	// arrival order) in one transaction and sets every op's outcome. It
	// returns an error only when the transaction as a whole failed; every
	// member then gets that error (see the package documentation for which
	// one to return), or, when it wraps [Alone], runs alone through Single.
	// ctx ends when every member's context has ended. Required.
	Batch func(ctx context.Context, ops []*Op) error

	// Shards is the number of independent queues, each with at most one
	// transaction in flight; calls go to a shard by the hash of their key,
	// so all the calls of one key keep one queue. Defaults to 1.
	Shards int
}

// Batcher queues the calls of one store and runs them in batches. It is
// safe for concurrent use. It starts no goroutine of its own while idle, so
// it needs no Close.
type Batcher struct {
	cfg    Config
	shards []shard
	seed   maphash.Seed

	batches, batched, alone atomic.Uint64 // for Stats
	paused                  atomic.Pointer[pause]
}

type shard struct {
	mu      sync.Mutex
	running bool  // a call or batch is in flight, or the shard is paused
	queue   []*Op // what arrived meanwhile
	spare   []*Op // the previous batch's slice, for reuse
}

// New returns a Batcher. It panics if cfg lacks Single or Batch: that is a
// programming error in the store.
func New(cfg Config) *Batcher {
	if cfg.Single == nil || cfg.Batch == nil {
		panic("groupcommit: Config.Single and Config.Batch are required")
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 1
	}
	return &Batcher{cfg: cfg, shards: make([]shard, cfg.Shards), seed: maphash.MakeSeed()}
}

// aloneError marks a batch error after which every member runs alone.
type aloneError struct{ err error }

func (e aloneError) Error() string { return e.err.Error() }
func (e aloneError) Unwrap() error { return e.err }

// Alone wraps err, the error that failed a batch whose transaction surely
// rolled back, to say that it may be one member's fault (a value the
// database refused): every member then runs alone, through Single.
func Alone(err error) error { return aloneError{err} }

// IsAlone reports whether err was made by Alone.
func IsAlone(err error) bool {
	var a aloneError
	return errors.As(err, &a)
}

// Do runs op: at once and alone if its shard is idle, otherwise in the next
// batch, on copies of op's Request and Response (see Op.own). When Do
// returns nil, op's outcome (Record, Created, Err) is set.
// When ctx ends first, Do returns ctx's error and op must not be read any
// more: the call was taken out of the queue (nothing was written), or its
// batch had started and may still commit it. A Reserve that its batch
// commits after its caller left is released by the batch (see
// releaseLeft), before anything else runs on its shard.
func (b *Batcher) Do(ctx context.Context, op *Op) error {
	sh := b.shard(op)
	sh.mu.Lock()
	if !sh.running {
		sh.running = true
		sh.mu.Unlock()
		b.alone.Add(1)
		defer b.handOff(sh) // also if Single panics: the caller sees the panic
		b.cfg.Single(ctx, op)
		return nil
	}
	if err := ctx.Err(); err != nil {
		sh.mu.Unlock()
		return err
	}
	op.own()
	op.ctx, op.done, op.state = ctx, make(chan struct{}), queued
	sh.queue = append(sh.queue, op)
	sh.mu.Unlock()
	if p := b.paused.Load(); p != nil {
		p.arrived()
	}

	select {
	case <-op.done:
	case <-ctx.Done():
		sh.mu.Lock()
		switch op.state {
		case queued:
			op.state = abandoned // take skips it
		case taken:
			op.state = left // its batch releases what it reserved
		}
		state := op.state
		sh.mu.Unlock()
		if state != finished { // else the outcome is known, and ours
			return ctx.Err()
		}
	}
	if op.alone {
		op.alone = false
		b.cfg.Single(ctx, op)
	}
	return nil
}

// shard returns the queue of op's key.
func (b *Batcher) shard(op *Op) *shard {
	if len(b.shards) == 1 {
		return &b.shards[0]
	}
	var h maphash.Hash
	h.SetSeed(b.seed)
	h.WriteString(op.Key.Scope)
	h.WriteByte(0)
	h.WriteString(op.Key.Operation)
	h.WriteByte(0)
	h.WriteString(op.Key.Key)
	return &b.shards[h.Sum64()%uint64(len(b.shards))]
}

// handOff ends what was in flight on sh: if calls queued meanwhile, a
// goroutine runs them as the next batch; otherwise sh goes idle.
func (b *Batcher) handOff(sh *shard) {
	sh.mu.Lock()
	batch := sh.take()
	if len(batch) == 0 {
		sh.running = false
		sh.mu.Unlock()
		return
	}
	sh.mu.Unlock()
	go b.loop(sh, batch)
}

// loop runs batches on sh until its queue is empty.
func (b *Batcher) loop(sh *shard, batch []*Op) {
	for {
		b.run(sh, batch)
		clear(batch)
		// Let the members just woken run before the next batch is taken:
		// many of them make their next call at once (a Complete after a
		// Reserve), and it should join this next batch, not the one after.
		runtime.Gosched()
		sh.mu.Lock()
		sh.spare = batch[:0]
		batch = sh.take()
		if len(batch) == 0 {
			sh.running = false
			sh.mu.Unlock()
			return
		}
		sh.mu.Unlock()
	}
}

// take returns the queued calls that are still wanted, marked taken, and
// starts a new queue. sh.mu must be held.
func (sh *shard) take() []*Op {
	batch := sh.queue[:0]
	for _, op := range sh.queue {
		if op.state == abandoned {
			continue
		}
		if op.ctx.Err() != nil { // its caller is leaving: nothing written
			op.state = abandoned
			continue
		}
		op.state = taken
		batch = append(batch, op)
	}
	clear(sh.queue[len(batch):])
	sh.queue, sh.spare = sh.spare, nil
	return batch
}

// run runs one batch on sh and tells its members.
func (b *Batcher) run(sh *shard, batch []*Op) {
	defer b.finish(sh, batch)
	b.batches.Add(1)
	b.batched.Add(uint64(len(batch)))
	if len(batch) == 1 {
		op := batch[0]
		b.cfg.Single(op.ctx, op)
		return
	}
	slices.SortStableFunc(batch, func(x, y *Op) int { return CompareKeys(x.Key, y.Key) })
	ctx, stop := batchContext(batch)
	defer stop()
	err := b.runBatch(ctx, batch)
	if err == nil {
		return
	}
	alone := IsAlone(err)
	for _, op := range batch {
		if alone {
			op.alone = true
		} else {
			op.Record, op.Created, op.Err = nil, false, err
		}
	}
}

// finish hands each member of batch its outcome, except those whose caller
// left while it ran: their Reserves, if they may have gone in, are
// released first.
func (b *Batcher) finish(sh *shard, batch []*Op) {
	var gone []*Op
	sh.mu.Lock()
	for _, op := range batch {
		if op.state == left {
			gone = append(gone, op)
		} else {
			op.state = finished
		}
	}
	sh.mu.Unlock()
	for _, op := range gone {
		b.releaseLeft(op)
	}
	for _, op := range batch {
		close(op.done)
	}
}

// runBatch calls Batch, turning a panic into an error for its members: the
// batch runs on a goroutine of its own, where a panic would end the
// process.
func (b *Batcher) runBatch(ctx context.Context, batch []*Op) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("groupcommit: batch of %d calls panicked: %v", len(batch), r)
		}
	}()
	return b.cfg.Batch(ctx, batch)
}

// batchContext returns a context that ends when the contexts of all ops
// have ended, and a function that releases it.
func batchContext(ops []*Op) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(ops)))
	stops := make([]func() bool, 0, len(ops))
	for _, op := range ops {
		if op.ctx.Done() == nil { // never ends, nor does the batch
			for _, stop := range stops {
				stop()
			}
			return ctx, cancel
		}
		stops = append(stops, context.AfterFunc(op.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// Report is Stats for a store's idemstore.BatchReporter: ok is false for a
// nil Batcher (batching off).
func (b *Batcher) Report() (stats idemstore.BatchStats, ok bool) {
	if b == nil {
		return idemstore.BatchStats{}, false
	}
	return b.Stats(), true
}

// Stats returns how many batches ran and how many calls they held, and how
// many calls found their shard idle and ran alone (not counted as batches).
func (b *Batcher) Stats() idemstore.BatchStats {
	return idemstore.BatchStats{Batches: b.batches.Load(), Batched: b.batched.Load(), Alone: b.alone.Load()}
}
