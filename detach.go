package idem

import (
	"context"
	"sync"
	"time"
)

// detached is the context settlement runs in: it keeps the caller's values
// but not its cancellation (a client that hangs up must not cancel the write
// that records what happened), and ends at its own deadline. It is
// context.WithTimeout(context.WithoutCancel(parent), d) in one allocation:
// its Done channel and timer are made only when a store asks for them, so a
// store that only checks Err (the memory store) pays for neither.
type detached struct {
	parent   context.Context
	deadline time.Time

	mu    sync.Mutex
	done  chan struct{}
	timer *time.Timer
}

// detach returns a context with parent's values, no cancellation, and a
// deadline d from now. Call stop when done with it.
func detach(parent context.Context, d time.Duration) *detached {
	return &detached{parent: parent, deadline: time.Now().Add(d)}
}

func (c *detached) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *detached) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if d := time.Until(c.deadline); d <= 0 {
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
	c.mu.Unlock()
	if done != nil {
		select {
		case <-done:
			return context.DeadlineExceeded
		default:
			return nil
		}
	}
	if time.Now().Before(c.deadline) {
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
	left := time.Until(c.deadline)
	if left <= 0 {
		return false
	}
	t := time.NewTimer(min(d, left))
	defer t.Stop()
	<-t.C
	return d < left
}
