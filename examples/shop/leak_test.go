package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: the
// provider's hanging charges, the payment timeouts and the recovery loop
// must all end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
