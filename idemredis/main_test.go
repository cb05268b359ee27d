package idemredis

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind, such as a
// subscription whose cancel did not stop it, or a client a test did not
// close. One rueidis v1.0.79 goroutine is not ours: after a Cluster
// topology change (the failover test), the client closes the connections
// it dropped 5s later, from a goroutine that Close does not stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
	)
}
