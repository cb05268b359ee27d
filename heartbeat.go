package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// heartbeat renews the leases of running operations: each is extended when
// a third of its duration has passed since it was taken or last renewed. One
// goroutine per engine serves every lease, and exits once none has been left
// for heartbeatLinger, so a short request costs no timer and no goroutine of
// its own, and an idle engine holds no goroutine.
type heartbeat struct {
	e       *Engine
	mu      sync.Mutex
	leases  map[*Lease]struct{}
	running bool
	next    time.Time // when the loop plans to wake
	wake    chan struct{}
	linger  time.Duration
}

// heartbeatLinger is how long the loop stays after the last lease left, so
// that requests arriving one after another do not each start a goroutine.
const heartbeatLinger = 100 * time.Millisecond

// start begins renewing l until stop(l).
func (h *heartbeat) start(l *Lease) {
	every := l.lease / 3
	if every <= 0 {
		return
	}
	now := time.Now()
	h.mu.Lock()
	if h.leases == nil {
		h.leases = make(map[*Lease]struct{})
		h.wake = make(chan struct{}, 1)
	}
	l.renewAt = now.Add(every)
	h.leases[l] = struct{}{}
	switch {
	case !h.running:
		h.running = true
		h.next = l.renewAt
		go h.loop()
	case l.renewAt.Before(h.next):
		h.next = l.renewAt
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	h.mu.Unlock()
}

// stop ends the renewal of l.
func (h *heartbeat) stop(l *Lease) {
	h.mu.Lock()
	delete(h.leases, l)
	// With nothing left, make sure the loop wakes within the linger time to
	// exit; it is already planned to when h.next is that close.
	idle := len(h.leases) == 0 && h.running && time.Until(h.next) > h.linger
	h.mu.Unlock()
	if idle {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}

func (h *heartbeat) loop() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var idleSince time.Time
	for {
		now := time.Now()
		h.mu.Lock()
		if len(h.leases) == 0 {
			if idleSince.IsZero() {
				idleSince = now
			}
			if now.Sub(idleSince) >= h.linger {
				h.running = false
				h.mu.Unlock()
				return
			}
			h.next = idleSince.Add(h.linger)
			h.mu.Unlock()
			t.Reset(h.next.Sub(now))
			select {
			case <-t.C:
			case <-h.wake:
			}
			continue
		}
		idleSince = time.Time{}
		next := now.Add(time.Hour)
		for l := range h.leases {
			switch {
			case l.renewing:
			case !now.Before(l.renewAt):
				l.renewing = true
				go h.renew(l)
			case l.renewAt.Before(next):
				next = l.renewAt
			}
		}
		h.next = next
		h.mu.Unlock()
		t.Reset(next.Sub(now))
		select {
		case <-t.C:
		case <-h.wake:
		}
	}
}

// renew extends l once. A renewal that fails (a store that hangs or blips)
// must not use up the lease: each attempt is bounded by a sixth of the
// lease, and a failed one is tried again after a twelfth, so a holder whose
// store recovers within the lease keeps its key.
func (h *heartbeat) renew(l *Lease) {
	every := l.lease / 3
	ctx, cancel := context.WithTimeout(context.Background(), every/2)
	err := l.Extend(ctx)
	cancel()
	next := every
	if err != nil && !l.Ended() {
		next = every / 4
		h.e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: extending the lease failed",
			digestAttr(l.Key()), slog.Any("error", err))
	}
	h.mu.Lock()
	l.renewing = false
	l.renewAt = time.Now().Add(next)
	if errors.Is(err, ErrLeaseLost) {
		delete(h.leases, l) // nothing left to renew
	}
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Heartbeat keeps the lease alive while the operation runs: it is extended
// every third of its duration until stop is called. The middleware does this
// for every handler; call it around long jobs run with Begin directly.
func (l *Lease) Heartbeat() (stop func()) {
	l.e.hb.start(l)
	return func() { l.e.hb.stop(l) }
}
