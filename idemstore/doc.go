// Package idemstore is the contract between the idem engine and the places
// it keeps idempotency records.
//
// A record is identified by a [Key]: (scope, operation, key). The engine
// reserves a key by inserting a pending record against a unique constraint
// ([Store.Reserve]); only one caller can win that insert. Every later state
// change is fenced by the lease token the winner received, so a caller whose
// lease was taken over can no longer complete, release, escalate or extend
// the record.
//
// Drivers live in their own packages (idemmem, idemsqlite, idempg,
// idemmysql, idemredis) and assert the contract at compile time:
//
//	var _ idemstore.Store = (*Store)(nil)
//
// Every driver must pass the conformance suite in package idemstoretest.
// Third-party stores should run it too.
//
// Beyond the contract, a store may implement [Notifier] (waiters wake when
// a record changes), [BatchReporter] (group commit), and [ResponseReader]
// (a large stored answer is left out of the record Reserve returns and read
// apart, once the caller has room for it: the replay budget of idem serve
// then bounds the memory of many retries of a large answer), and
// [HeadReader] (a record read with its large answer left out, for callers
// that only need its state). A wrapper of stores implements ResponseReader
// with [ReadResponse] and HeadReader with [GetHead], which fall back to Get
// for a store that does not.
//
// Time belongs to the store. Callers pass durations (a lease, a retention),
// never deadlines or their own "now": the store adds them to its own clock
// (a database server's, Redis's TIME, or the one host's for SQLite and
// memory) and judges expiry on that clock in the same statement that acts,
// so processes whose clocks disagree still agree on every lease, and a
// heartbeat that lands first always wins over recovery. Records report
// ReadAt, the store's clock at the read, to judge their times against.
// Stores keep at least millisecond precision.
package idemstore
