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
// Times are always passed in by the caller (the Now fields of the params), so
// that every process sharing a store judges lease expiry by the same rule and
// tests can control the clock. Stores keep at least millisecond precision.
package idemstore
