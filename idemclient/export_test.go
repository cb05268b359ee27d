package idemclient

import (
	"context"
	"time"
)

// SetTime makes t read the clock from now and wait with sleep, so that
// tests run on fake time.
func SetTime(t *Transport, now func() time.Time, sleep func(ctx context.Context, d time.Duration) error) {
	t.now, t.sleep = now, sleep
}

// SetJitter makes t's backoff wait jitter(bound) instead of a random
// duration up to bound.
func SetJitter(t *Transport, jitter func(bound time.Duration) time.Duration) { t.jitter = jitter }

// RetryAfter exposes the Retry-After parser.
var RetryAfter = retryAfter
