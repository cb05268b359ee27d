package idem

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// waiter waits for an in-flight record to change: it polls with backoff
// and, when the store can notify, wakes as soon as a notification comes.
type waiter struct {
	e      *Engine
	key    Key
	notify <-chan struct{}
	cancel func()
	pause  time.Duration
}

func (e *Engine) newWaiter(ctx context.Context, key Key) *waiter {
	w := &waiter{e: e, key: key, pause: e.cfg.PollInterval}
	if e.notifier != nil {
		ch, cancel, err := e.notifier.Subscribe(ctx, key)
		if err == nil {
			w.notify, w.cancel = ch, cancel
		}
		// Without a subscription, polling alone still works.
	}
	return w
}

func (w *waiter) close() {
	if w.cancel != nil {
		w.cancel()
	}
}

// waitInline is the InlineResponse of a waiter's reads
// (idemstore.GetHead): every stored answer is longer, so none is read.
const waitInline = 1

// waitChange returns (nil, nil) once the record is no longer the pending
// record seen (completed, released, escalated, taken over), or the record
// still pending when deadline passes.
func (w *waiter) waitChange(ctx context.Context, seen *idemstore.Record, deadline time.Time) (*idemstore.Record, error) {
	e := w.e
	for {
		left := deadline.Sub(e.cfg.Now())
		if left <= 0 {
			return seen, nil
		}
		// Jitter spreads the polls of many waiters on one key. It applies
		// before the bound, so the last pause reaches the deadline rather
		// than rounding down to nothing.
		pause := w.pause/2 + rand.N(w.pause/2+1)
		pause = min(pause, left)
		w.pause = min(2*w.pause, e.cfg.MaxPollInterval)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case _, ok := <-w.notify:
			t.Stop()
			if !ok {
				w.notify = nil // the subscription ended; keep polling
			}
		case <-t.C:
		}
		// Only the record's state matters here: an answer it completed
		// with is left out (the retry reads it within the replay budget),
		// so that many waiters do not each hold it.
		rec, err := idemstore.GetHead(ctx, e.store, w.key, waitInline)
		if errors.Is(err, idemstore.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if rec.State != idemstore.StatePending || rec.Token != seen.Token {
			return nil, nil
		}
		if rec.LeaseExpired() {
			return nil, nil // expired by the store's clock: let classify decide
		}
		seen = rec
	}
}
