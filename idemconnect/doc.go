// Package idemconnect makes unary Connect calls safe to retry, as idemgrpc
// does for grpc-go: a connect.Interceptor that, on a handler, runs a call
// at most once per idempotency key and replays its answer to every retry,
// and, on a client, gives each call one key and keeps it across retries.
// One handler serves Connect, gRPC and gRPC-Web clients alike, and they
// all get the same answers.
//
//	interceptor, err := idemconnect.NewInterceptor(engine, idemconnect.Config{
//		Scope:   tenantOf, // func(ctx context.Context) (string, error): whose key it is
//		Require: []string{paymentsv1connect.PaymentsChargeProcedure},
//	})
//	path, handler := paymentsv1connect.NewPaymentsHandler(svc, connect.WithInterceptors(interceptor))
//
// A call without a key runs unprotected unless its procedure is in
// Config.Require (then it gets INVALID_ARGUMENT and does not run). A call
// with an Idempotency-Key header to a procedure the configuration does not
// list is protected with Config.Policy, or refused with
// Config.RefuseUnlistedKeys; never run unprotected in silence.
//
// A call's key comes from the Idempotency-Key header, an AIP-155 string
// request_id field, or an AEP-155 idempotency_key field; answers, errors
// (with google.rpc.ErrorInfo, RetryInfo and BadRequest details) and the
// Idempotent-Replayed header are those of idemgrpc, and docs/grpc.md
// describes them. Records are shared: a key first used through idemgrpc is
// replayed through idemconnect, and the other way round, when both run over
// one store.
//
// A handler's context carries its lease (idem.LeaseFrom), for a store's
// CompleteTx with Response; an error marked idem.Retryable releases the
// key, one marked idem.Ambiguous sends it to review. Streaming procedures
// are not protected.
package idemconnect
