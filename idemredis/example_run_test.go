package idemredis_test

import (
	"testing"

	"github.com/idem-dev/idem/internal/testenv"
)

// TestExample runs ExampleNew against the test Cluster and checks what it
// prints.
func TestExample(t *testing.T) {
	t.Setenv("REDIS_ADDRS", testenv.Getenv(t, "IDEM_TEST_REDIS_CLUSTER"))
	out := testenv.CaptureStdout(t, ExampleNew)
	if want := "acquired: charging\nreplayed: 201 {\"id\":\"pay_1\"}\n"; out != want {
		t.Fatalf("ExampleNew printed %q, want %q", out, want)
	}
}
