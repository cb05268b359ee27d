package idem

import (
	"context"
	"sync"
	"time"
)

// detached is the context settlement runs in: it keeps the caller's values
// but not its cancellation (a client that hangs up must not cancel the write
// that records what happened), and ends at its own deadline. It is
// context.WithTimeout(context.WithoutCancel(parent), d) made cheap for the
// request path: the deadline is fixed when a store first looks at the
// context (its clock is read once), and the Done channel and timer are made
// only when a store asks for them, so a store that only checks Err (the
// memory store) pays for neither.
type detached struct {
	parent  context.Context
	timeout time.Duration

	mu       sync.Mutex
	deadline time.Time // zero until first asked for
	done     chan struct{}
	timer    *time.Timer
}

// detach returns a context with parent's values, no cancellation, and a
// deadline d from its first use. Call stop when done with it.
func detach(parent context.Context, d time.Duration) *detached {
	c := new(detached)
	c.reset(parent, d)
	return c
}

// reset makes c a fresh detached context, for reuse once stopped.
func (c *detached) reset(parent context.Context, d time.Duration) {
	c.parent, c.timeout = parent, d
	c.deadline, c.done, c.timer = time.Time{}, nil, nil
}

// deadlineLocked returns the deadline, fixing it on first use. The caller
// holds c.mu.
func (c *detached) deadlineLocked() (dl time.Time, fresh bool) {
	if c.deadline.IsZero() {
		c.deadline = time.Now().Add(c.timeout)
		return c.deadline, true
	}
	return c.deadline, false
}

func (c *detached) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dl, _ := c.deadlineLocked()
	return dl, true
}

func (c *detached) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		dl, _ := c.deadlineLocked()
		c.done = make(chan struct{})
		if d := time.Until(dl); d <= 0 {
			close(c.done)
		} else {
			done := c.done
			c.timer = time.AfterFunc(d, func() { close(done) })
		}
	}
	return c.done
}

// Err reports context.DeadlineExceeded once the deadline has passed (and,
// when Done was asked for, once it is closed, as the context contract
// requires).
func (c *detached) Err() error {
	c.mu.Lock()
	done := c.done
	dl, fresh := c.deadlineLocked()
	c.mu.Unlock()
	if done != nil {
		select {
		case <-done:
			return context.DeadlineExceeded
		default:
			return nil
		}
	}
	if fresh || time.Now().Before(dl) {
		return nil
	}
	return context.DeadlineExceeded
}

func (c *detached) Value(key any) any { return c.parent.Value(key) }

// stop releases the timer, if one was started.
func (c *detached) stop() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
}

// pause waits d, or until c's deadline; it reports whether the wait ended
// before the deadline.
func (c *detached) pause(d time.Duration) bool {
	dl, _ := c.Deadline()
	left := time.Until(dl)
	if left <= 0 {
		return false
	}
	t := time.NewTimer(min(d, left))
	defer t.Stop()
	<-t.C
	return d < left
}
