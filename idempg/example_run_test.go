package idempg_test

import (
	"regexp"
	"testing"

	"github.com/idem-dev/idem/internal/testenv"
)

// TestExample runs Example against the test server: the purchase is made
// once and the retry replays the same order.
func TestExample(t *testing.T) {
	t.Setenv("DATABASE_URL", testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL"))
	out := testenv.CaptureStdout(t, Example)
	m := regexp.MustCompile(`^201  \{"order":(\d+)\}\n201 true \{"order":(\d+)\}\n$`).FindStringSubmatch(out)
	if m == nil || m[1] != m[2] {
		t.Fatalf("Example printed %q; want a 201 and its replay, with the same order", out)
	}
}
