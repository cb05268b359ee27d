package idemstoretest

import (
	"context"
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
	// Tx, if set, runs the CompleteTx part of the suite: stores that offer
	// CompleteTx (the SQL drivers) return a TxHarness over a store made by
	// New and a business table in the same database.
	Tx func(t *testing.T) TxHarness
}

// TxHarness runs business transactions for the CompleteTx part of the
// suite. Each SQL driver implements it over its own transaction type.
type TxHarness struct {
	// Store is the store under test (made by Harness.New).
	Store idemstore.Store
	// Levels are the isolation levels the driver's CompleteTx must work
	// at, by name as Run receives them ("read committed", "repeatable
	// read", "serializable"). The suite runs every transactional test at
	// each.
	Levels []string
	// Run opens a transaction at level and starts it (a first statement,
	// so that a snapshot is taken where the database takes one then),
	// calls between (when not nil) while the transaction is open, inserts
	// the business row id, then calls the driver's CompleteTx with lease
	// and resp. If CompleteTx fails, Run rolls back and returns its error.
	// Otherwise it commits when commit is true (returning the commit's
	// error) and rolls back when it is false. between runs changes to the
	// record from other connections (a heartbeat, a waiter, a takeover);
	// a database with a single writer (SQLite) cannot let them run while
	// a write transaction is open, so its harness calls between after
	// BEGIN and before the transaction's first statement.
	Run func(ctx context.Context, level string, lease idemstore.TxLease, resp *idemstore.Response, id string, commit bool, between func()) error
	// Committed reports whether the business row id was committed.
	Committed func(ctx context.Context, id string) (bool, error)
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
		{"Expiry", testExpiry},
		{"Takeover", testTakeover},
		{"Review", testReview},
		{"Delete", testDelete},
		{"List", testList},
		{"Search", testSearch},
		{"Purge", testPurge},
		{"Payload", testPayload},
		{"ResponseNotKept", testResponseNotKept},
		{"ResponseReader", testResponseReader},
		{"Keys", testKeys},
		{"Errors", testErrors},
		{"Unavailable", testUnavailable},
		{"Notify", testNotify},
		{"Concurrency", testConcurrency},
		{"Engine", testEngine},
		{"CompleteTx", testCompleteTx},
		{"Linearizable", testLinearizable},
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
