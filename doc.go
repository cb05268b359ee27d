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
// Under faults: whether a lease has expired is decided by the store's clock,
// never the caller's, so instances with skewed clocks agree; Complete,
// Release and Escalate are detached from the caller's context and retry a
// store that blips (EngineConfig.SettleTimeout), recognising a change whose
// reply was lost; a Reserve that failed has its reservation released; and
// Engine.Recover settles what crashed holders left behind, asking a Resolver
// where the work went outside the database. EngineConfig.OnReview reports
// every key that goes to review.
//
// Middleware puts all of this in front of net/http handlers; it settles each
// request through the public Lease API (Lease.State, Abandon, CheckTx), which
// other front ends can use the same way. Do and DoTx are such a front end
// for queue jobs and other work that is not an HTTP request: fn runs at most
// once per key, and its result, stored as JSON, is replayed typed. Package
// idemclient is the other side of the wire: an http.RoundTripper that keeps
// one key across its retries.
//
// Fingerprint and CanonicalJSON give a request a stable meaning, so that a
// retry can be told apart from a different request under the same key;
// Request.FingerprintSource lets a record fingerprinted by an earlier
// version of the algorithm still match its retry.
// ParseKeyHeader reads the Idempotency-Key header as the IETF draft
// describes.
package idem
