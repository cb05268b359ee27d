package main

import "time"

// clock is the shop's time: order timestamps, the SQLite store's lease
// deadlines and the payment provider's timeout all read it, so that tests
// can move time by hand instead of sleeping.
type clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed; stop
	// cancels the call if it has not started.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// wallClock is the real clock.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}
