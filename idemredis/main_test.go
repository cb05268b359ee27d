package idemredis

import (
	"os"
	"testing"

	"github.com/idem-dev/idem/internal/testenv"
)

// TestMain fails the run if a test leaves goroutines behind, such as a
// subscription whose cancel did not stop it, or a client a test did not
// close, allowing for rueidis's delayed close of dropped Cluster
// connections after the failover test (testenv.LeakGrace).
func TestMain(m *testing.M) { os.Exit(testenv.VerifyNoLeaks(m, testenv.LeakGrace)) }
