// Package idemstoretest is the conformance suite every idemstore.Store must
// pass. Drivers in this module run it from their tests, and third-party
// stores should too.
//
// Start with [Exercise]: give it a [Harness] whose New returns a fresh,
// isolated store, and it runs every area of the contract as parallel
// subtests (reserve, fencing, takeover, review, list, purge, payloads,
// errors, concurrency and, when the store says it can, notifications):
//
//	func TestConformance(t *testing.T) {
//		idemstoretest.Exercise(t, idemstoretest.Harness{
//			New: func(t *testing.T) idemstore.Store { return newTestStore(t) },
//		})
//	}
//
// [ExerciseConcurrency] runs only the concurrent-reservation tests, which
// is handy under -race or against a cluster.
//
// The suite follows the contract's time rule: it passes durations only, and
// checks every time a store reports against the store's own clock (the
// ReadAt of reads just before and after a change), never against this
// process's. It makes expired leases and purgeable records with negative
// durations, so no test waits for time to pass; a store with real TTLs
// (Redis) must keep such a record until Purge finds it. Each subtest uses its
// own random scope, and subtests that run recovery their own store, so a
// store shared by subtests cannot cross-talk.
//
// Besides the contract itself, the suite runs idem's engine over the store
// under faults (skewed engine clocks, recovery racing a heartbeat, a lost
// Reserve reply, settlement after the client left or through a blip) and,
// when Harness.Tx is set, CompleteTx inside business transactions at every
// isolation level the driver names.
//
// Last, the Linearizable area has a few goroutines per key make random calls
// of every kind (Reserve, Get, Complete, Release, Escalate, Extend, Takeover,
// Resolve, Delete) on a few keys, some through injected faults (a call
// refused, a reply lost after the store acted, a context cancelled before or
// during the call), and checks the recorded history with porcupine
// (github.com/anishathalye/porcupine) against a model of one record's state
// machine, key by key. A call that failed may or may not have taken effect,
// at any later moment, and the checker allows both. When the history is not
// linearizable, the failure shows each offending key's calls and writes
// porcupine's visualization to the test's artifact directory (kept with go
// test -artifacts).
package idemstoretest
