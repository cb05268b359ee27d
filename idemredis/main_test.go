package idemredis

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind, such as a
// subscription whose cancel did not stop it. Two go-redis v9.23 goroutines
// are not ours: a circuit-breaker cleanup loop per cluster node that Close
// does not stop, and the dial prober of a pool that could not connect (the
// Unavailable harness), which notices Close only after its 1s sleep.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/maintnotifications.(*CircuitBreakerManager).cleanupLoop"),
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
	)
}
