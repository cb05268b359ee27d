package rpccore

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
)

// Retry is the client interceptors' retry policy: a call is sent again,
// with the same key, when it failed with UNAVAILABLE (after its RetryInfo
// delay, or an exponential backoff with full jitter) or with ABORTED and a
// RetryInfo (idem's IN_FLIGHT: after the delay), at most MaxAttempts times
// within MaxElapsed, and never past the context's deadline.
type Retry struct {
	MaxAttempts int
	MaxElapsed  time.Duration
	BaseDelay   time.Duration
	MaxDelay    time.Duration

	// Test hooks: fake time and a deterministic jitter.
	Now    func() time.Time
	Sleep  func(ctx context.Context, d time.Duration) error
	Jitter func(bound time.Duration) time.Duration
}

// The defaults of Retry, as idemclient.Transport has them.
const (
	DefaultMaxAttempts = 4
	DefaultMaxElapsed  = time.Minute
	DefaultBaseDelay   = 100 * time.Millisecond
	DefaultMaxDelay    = 10 * time.Second
)

// WithDefaults fills in the zero fields.
func (r Retry) WithDefaults() Retry {
	if r.MaxAttempts == 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.MaxElapsed == 0 {
		r.MaxElapsed = DefaultMaxElapsed
	}
	if r.BaseDelay == 0 {
		r.BaseDelay = DefaultBaseDelay
	}
	if r.MaxDelay == 0 {
		r.MaxDelay = DefaultMaxDelay
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Sleep == nil {
		r.Sleep = sleep
	}
	if r.Jitter == nil {
		r.Jitter = func(bound time.Duration) time.Duration { return rand.N(bound + 1) }
	}
	return r
}

// Validate refuses negative bounds.
func (r Retry) Validate() error {
	if r.MaxAttempts < 0 || r.MaxElapsed < 0 || r.BaseDelay < 0 || r.MaxDelay < 0 {
		return errors.New("ClientConfig.MaxAttempts, MaxElapsed, BaseDelay and MaxDelay must not be negative")
	}
	return nil
}

// Do sends the call until it succeeds, fails for good, or the retries run
// out; send makes one attempt and returns its error as a status (nil on
// success) with the error itself. It returns the last attempt's error and
// how many attempts were made.
func (r Retry) Do(ctx context.Context, send func() (*spb.Status, error)) (int, error) {
	start := r.Now()
	for n := 1; ; n++ {
		st, err := send()
		if err == nil || n >= r.MaxAttempts {
			return n, err
		}
		d, ok := r.delay(st, n)
		if !ok || r.Now().Add(d).Sub(start) > r.MaxElapsed {
			return n, err
		}
		if dl, ok := ctx.Deadline(); ok && r.Now().Add(d).After(dl) {
			return n, err
		}
		if r.Sleep(ctx, d) != nil {
			return n, err
		}
	}
}

// delay says whether a call that failed with st on attempt n is retried,
// and after how long.
func (r Retry) delay(st *spb.Status, n int) (time.Duration, bool) {
	if st == nil {
		return 0, false
	}
	d, hinted := RetryDelay(st.Details)
	switch code.Code(st.Code) {
	case code.Code_ABORTED:
		return d, hinted
	case code.Code_UNAVAILABLE:
		if hinted {
			return d, true
		}
		bound := r.BaseDelay
		for i := 1; i < n && bound < r.MaxDelay; i++ {
			bound *= 2
		}
		return r.Jitter(min(bound, r.MaxDelay)), true
	}
	return 0, false
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
