package idemredis

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind, such as a
// subscription whose cancel did not stop it. go-redis v9.23 starts a
// circuit-breaker cleanup goroutine per cluster node connection that
// Close does not stop; that one is not ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/maintnotifications.(*CircuitBreakerManager).cleanupLoop"))
}
