package storeurl

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run on leaked goroutines. One rueidis v1.0.79
// goroutine is not ours: a Cluster client closes the connections its
// topology refresh dropped 5s later, from a goroutine Close does not stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}
