package idemgrpc

import (
	"context"
	"time"
)

// SetRetryClock gives cfg's retries a fake clock: sleep is called for each
// wait instead of a timer.
func SetRetryClock(cfg *ClientConfig, now func() time.Time, sleep func(ctx context.Context, d time.Duration) error) {
	cfg.retry.Now, cfg.retry.Sleep = now, sleep
	cfg.retry.Jitter = func(bound time.Duration) time.Duration { return bound }
}

// SetClock makes cfg's interceptor check AEP-155 first_sent times on now.
func SetClock(cfg *Config, now func() time.Time) { cfg.now = now }
