// Package idemmem is an in-memory idemstore.Store for tests and for
// programs that run as a single process.
//
// Start with [New]:
//
//	store, err := idemmem.New(idemmem.Config{})
//	...
//	eng, err := idem.NewEngine(store, idem.EngineConfig{})
//
// Records live in a sharded map guarded by mutexes, so the at-most-once
// guarantee holds between goroutines of one process, and nowhere else: two
// processes each with their own memory store do not see each other's keys.
// Use idemsqlite, idempg, idemmysql or idemredis for that.
//
// The store copies records in and out, so callers cannot change what it
// keeps. A completed record keeps its answer encoded in one pointer-free
// block (idemstore.EncodeResponse), so that a store holding a day of answers
// costs the garbage collector little to scan.
//
// Completed records past their ExpiresAt are evicted without a background
// goroutine: a Reserve at time Now first evicts records of its shard that
// expired at or before Now, and treats an expired record for its own key as
// absent.
//
// The store is bounded: [Config.MaxRecords] and [Config.MaxBytes] (by
// default [DefaultMaxRecords] and [DefaultMaxBytes]) cap what it holds, the
// bytes counting keys, requests, and answers' headers and bodies. Over a
// bound, completed records are evicted, those whose retention ends soonest
// first (with one retention: the oldest). Pending and needs_review records
// are never evicted: when only they are left, a new key's Reserve fails
// with [ErrFull], which the engine answers with 503 and runs nothing. The
// bound is a trade-off: a completed record evicted before its retention
// ends no longer guards its key, so a retry arriving after that runs the
// operation again. Size the bounds for the retention window, and watch
// [Store.Usage].
//
// The store implements idemstore.Notifier: waiters on a key wake up when it
// is completed, released, escalated, resolved or taken over.
package idemmem
