// Package idem makes non-idempotent operations (create, add, send, charge)
// safe to retry: with an Idempotency-Key, an operation runs at most once per
// key, and every retry gets the first answer back.
//
// Start with NewEngine over a store (idemsqlite for an embedded database,
// idemmem for tests, idempg, idemmysql or idemredis for shared servers).
// Engine.Begin reserves a key by inserting a pending record against a unique
// constraint; only one caller can win. The winner gets a Lease, does the
// work, and stores the answer with Lease.Complete — or, on a SQL store, with
// the store's CompleteTx inside its own business transaction, so the change
// and the answer commit together. Every other caller gets the stored answer
// (Replayed), a Mismatch when the key was used for another request, InFlight
// while the first is still running, or NeedsReview when an earlier attempt's
// outcome is unknown.
//
// Keys are scoped: Key.Scope names whose key it is (a user, a tenant, a
// credential hash), so one client's answer never reaches another.
//
// Fingerprint and CanonicalJSON give a request a stable meaning, so that a
// retry can be told apart from a different request under the same key.
// ParseKeyHeader reads the Idempotency-Key header as the IETF draft
// describes.
package idem
