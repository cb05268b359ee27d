// Package rpccore is what idem's gRPC and Connect front doors (idemgrpc,
// idemconnect) share: both speak Google's error model (google.rpc.Status
// with ErrorInfo, RetryInfo and BadRequest), so the table that maps idem's
// situations to status codes, the key sources in request messages, the
// fingerprint of a message, the stored form of an answer and the server's
// flow around a handler are written once, here, and each front door only
// translates to its framework's types.
//
// It reaches the engine only through idem's public API (Engine.Begin, the
// Lease, FailureMark) and depends on protobuf and the googleapis rpc
// messages, never on grpc-go or connect-go, so that neither front door's
// module pulls in the other's framework.
package rpccore
