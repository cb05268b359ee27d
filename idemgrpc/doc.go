// Package idemgrpc makes unary gRPC calls safe to retry: a server
// interceptor runs a call at most once per idempotency key and gives every
// retry the first answer, and a client interceptor gives each call one key
// and keeps it across every retry.
//
// On the server, add UnaryServerInterceptor over an idem.Engine:
//
//	// tenantOf says whose key a call carries (see ScopeFunc).
//	func tenantOf(ctx context.Context) (string, error) { ... }
//
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
//		auth, // first: tenantOf reads what it established
//		idemgrpc.UnaryServerInterceptor(engine, idemgrpc.Config{
//			Scope:   tenantOf,
//			Require: []string{paymentsv1.Payments_Charge_FullMethodName},
//		}),
//	))
//
// A call without a key runs unprotected unless its method is in
// Config.Require (then it gets INVALID_ARGUMENT, KEY_MISSING, and does not
// run): list there every method that must never run twice. A call that
// carries a key in its metadata to a method the configuration does not list
// is protected with Config.Policy (or refused, with
// Config.RefuseUnlistedKeys), never run unprotected in silence.
//
// A call's key comes from the idempotency-key metadata, from an AIP-155
// string request_id field, or from an AEP-155 idempotency_key field (key
// and first_sent). Every method whose request message has such a field is
// protected, and so is every method named in Config.Methods or
// Config.Require. The first call with a key runs; a retry with the same key
// and the same request gets the stored answer (message or status) with the
// idempotent-replayed: true header metadata; a different request under the
// key, a call still in flight, a key under review and a store that cannot
// be reached get a status with google.rpc.ErrorInfo (domain
// idem.github.com/idem-dev, reasons such as KEY_REUSED and IN_FLIGHT), plus
// RetryInfo where retrying helps. docs/grpc.md has the table.
//
// A handler's context carries its lease (idem.LeaseFrom), so that a
// handler whose data lives in the store's database completes the key
// inside its own transaction with the store's CompleteTx and Response.
// Returning an error marked idem.Retryable releases the key; idem.Ambiguous
// sends it to review, as do the codes whose effect is unknown
// (Policy.AmbiguousCodes: DEADLINE_EXCEEDED and CANCELLED).
//
// On the client, UnaryClientInterceptor gives each call of a protected
// method a key (in an empty request_id or idempotency_key field, or in the
// metadata) and retries UNAVAILABLE and IN_FLIGHT answers with it; grpc's
// own retry policy resends the same key too. WithKey sets the key of one
// call, WithCallInfo reports what happened to it, and NeedsReview and Reason
// read idem's errors.
//
// Streaming methods are not protected: configuring one is an error.
package idemgrpc
