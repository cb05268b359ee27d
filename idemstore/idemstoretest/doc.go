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
// The suite follows the contract's time rule: every time it passes is based
// on the wall clock truncated to the millisecond and stays within a few
// hours of it, and completed records always expire in the future, so stores
// that apply real TTLs (Redis) keep what the suite expects them to keep.
// Each subtest uses its own random scope, so a store shared by subtests
// cannot cross-talk.
package idemstoretest
