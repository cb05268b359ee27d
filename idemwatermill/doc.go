// Package idemwatermill makes Watermill handlers run once per message,
// however often the broker delivers it: a message delivered again after its
// handler succeeded (the consumer died between completion and ack, the ack
// was lost) does not run the handler again, and emits the very messages the
// first run produced, with the same UUIDs.
//
// Start with Middleware (or New, which returns configuration errors) over an
// idem.Engine, and add it to a router or a handler:
//
//	router.AddMiddleware(
//		middleware.PoisonQueueWithFilter(pub, "orders.poison", idemwatermill.IsPoison),
//		idemwatermill.Middleware(engine, idemwatermill.Config{Scope: "billing"}),
//	)
//
// Each message is keyed by its UUID (or Config.Key: a metadata field, a
// business ID), under the handler's name as the operation and
// Config.Scope, and fingerprinted by its payload and the metadata fields
// Config.FingerprintMetadata names. The outcomes map to Watermill's idiom:
//
//   - a new key runs the handler under a lease (with heartbeats); its
//     produced messages are stored as the answer, and returned;
//   - a completed key returns the stored messages without running the
//     handler: the router publishes them again, with their UUIDs, and acks;
//   - a key still held by a running handler, or a store that failed,
//     returns an *Error the router nacks, after a delay (Config.NackDelay),
//     so the message comes back;
//   - a key used with another payload, a key in review, a message without a
//     usable key: an *Error that IsPoison matches, for Watermill's
//     PoisonQueueWithFilter; the handler does not run;
//   - a handler error releases the key (idem.Retryable, or any error of a
//     Transactional operation: the redelivery runs again) or sends it to
//     review (idem.Ambiguous, or a plain error of an External operation:
//     the error is returned as an *Error that IsPoison matches, so the
//     message goes to the poison queue instead of looping).
//
// A handler whose effect is a change in the idem store's database completes
// the lease itself with CompleteTx inside its own transaction, so that the
// change, the messages it publishes to an outbox (watermill-sql) and idem's
// record commit together. docs/messages.md tells how to choose a key, what
// review means for a message, and how this compares with Watermill's
// Deduplicator.
package idemwatermill
