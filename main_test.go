package idem_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: the
// heartbeat loop, waiters and subscriptions must all end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
