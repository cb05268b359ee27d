// Package testenv gives tests the URLs of the real servers they run
// against. scripts/services.sh starts the servers and prints the variables.
package testenv

import (
	"os"
	"testing"
)

// Getenv returns the environment variable name. When it is unset the test
// is skipped with a message saying how to set it, except when CI=true: a CI
// run must never pass by skipping, so the test fails instead.
func Getenv(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is not set and CI=true; run: eval \"$(scripts/services.sh)\"", name)
		}
		tb.Skipf("%s is not set; run: eval \"$(scripts/services.sh)\" to test against the real server", name)
	}
	return v
}
