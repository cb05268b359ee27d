package idemredis

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind, such as a
// subscription whose cancel did not stop it, or a client a test did not
// close. After a Cluster topology change (the failover test), rueidis
// v1.0.79 closes the connections it dropped 5s later, from a goroutine
// that Close does not stop; until then that goroutine and the dropped
// connections' readers and writers are alive. So the check looks again for
// up to leakGrace before it fails: a real leak outlives it.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := settledLeaks(leakGrace); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on a successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakGrace is how long TestMain waits for goroutines to end: longer than
// rueidis's delayed close of dropped Cluster connections.
const leakGrace = 10 * time.Second

// settledLeaks returns goleak's finding once no goroutine is left over, or
// the last finding when grace runs out first.
func settledLeaks(grace time.Duration) error {
	deadline := time.Now().Add(grace)
	for {
		err := goleak.Find()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}
