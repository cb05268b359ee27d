package idemstoretest

import (
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// Harness tells the suite how to make the stores it tests.
type Harness struct {
	// New returns a fresh, empty store isolated from every other test (own
	// schema, database file or key prefix). Cleanup is registered with
	// t.Cleanup.
	New func(t *testing.T) idemstore.Store
	// Unavailable, if set, returns a store whose backend cannot be reached
	// (closed pool, wrong port). Every call must fail with an error wrapping
	// idemstore.ErrUnavailable.
	Unavailable func(t *testing.T) idemstore.Store
}

// Exercise runs the whole conformance suite against the stores h makes.
// Every area is a parallel subtest, so one failing area does not hide the
// others.
func Exercise(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idemstoretest: Harness.New is nil")
	}
	areas := []struct {
		name string
		run  func(*testing.T, Harness)
	}{
		{"Reserve", testReserve},
		{"Fencing", testFencing},
		{"Takeover", testTakeover},
		{"Review", testReview},
		{"List", testList},
		{"Purge", testPurge},
		{"Payload", testPayload},
		{"ResponseNotKept", testResponseNotKept},
		{"Keys", testKeys},
		{"Errors", testErrors},
		{"Unavailable", testUnavailable},
		{"Notify", testNotify},
		{"Concurrency", testConcurrency},
	}
	for _, a := range areas {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			a.run(t, h)
		})
	}
}

// ExerciseConcurrency runs only the concurrent-reservation tests: many
// goroutines racing to reserve one key, and many keys raced at once.
func ExerciseConcurrency(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("idemstoretest: Harness.New is nil")
	}
	testConcurrency(t, h)
}
