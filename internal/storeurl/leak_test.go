package storeurl

import (
	"os"
	"testing"

	"github.com/idem-dev/idem/internal/testenv"
)

// TestMain fails the run on leaked goroutines, allowing for rueidis's
// delayed close of the connections a Cluster client's topology refresh
// dropped (testenv.LeakGrace).
func TestMain(m *testing.M) { os.Exit(testenv.VerifyNoLeaks(m, testenv.LeakGrace)) }
