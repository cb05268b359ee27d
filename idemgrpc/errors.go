package idemgrpc

import (
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem/internal/rpccore"
)

// Domain is the google.rpc.ErrorInfo domain of the errors idem answers.
const Domain = rpccore.Domain

// The google.rpc.ErrorInfo reasons of the errors idem answers; docs/grpc.md
// gives each one's code and meaning.
const (
	ReasonKeyMissing       = rpccore.ReasonKeyMissing       // INVALID_ARGUMENT: the method requires a key
	ReasonKeyInvalid       = rpccore.ReasonKeyInvalid       // INVALID_ARGUMENT: the key is malformed, or given twice differently
	ReasonKeyReused        = rpccore.ReasonKeyReused        // FAILED_PRECONDITION: the key was used with another request
	ReasonInFlight         = rpccore.ReasonInFlight         // ABORTED + RetryInfo: a call with the key is still running
	ReasonNeedsReview      = rpccore.ReasonNeedsReview      // FAILED_PRECONDITION: an earlier call's outcome is unknown
	ReasonNotReplayable    = rpccore.ReasonNotReplayable    // ALREADY_EXISTS: the call ran, its answer was not kept
	ReasonScopeMissing     = rpccore.ReasonScopeMissing     // UNAUTHENTICATED: no credentials to scope the key
	ReasonScopeDenied      = rpccore.ReasonScopeDenied      // UNAUTHENTICATED: credentials that identify no client
	ReasonScopeTooLong     = rpccore.ReasonTooLong          // INVALID_ARGUMENT: a scope longer than idem keeps
	ReasonStoreUnavailable = rpccore.ReasonStoreUnavailable // UNAVAILABLE + RetryInfo: nothing ran
	ReasonAnswerSealed     = rpccore.ReasonAnswerSealed     // INTERNAL: the stored answer cannot be opened
	// FAILED_PRECONDITION: a key sent to a method the server does not protect
	ReasonMethodUnprotected = rpccore.ReasonMethodUnprotected
)

// HeaderReplayed is the header metadata of a replayed answer.
const HeaderReplayed = rpccore.HeaderReplayed

// Reason returns the ErrorInfo reason of err when idem answered it (one of
// the Reason constants), or "".
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok || st == nil {
		return ""
	}
	if info := rpccore.ErrorInfo(st.Proto().GetDetails()); info != nil {
		return info.Reason
	}
	return ""
}

// NeedsReview reports whether err says that an earlier call with the key
// ended with an unknown outcome and waits for an operator or a resolver.
// Do not retry with a new key: the operation may have run.
func NeedsReview(err error) bool { return Reason(err) == ReasonNeedsReview }

// RetryDelay returns the RetryInfo delay of err, if it has one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st == nil {
		return 0, false
	}
	return rpccore.RetryDelay(st.Proto().GetDetails())
}

// Replayed reports whether md, a call's header (or trailer) metadata,
// says that the answer is a replay of an earlier call's.
func Replayed(md metadata.MD) bool {
	vs := md.Get(HeaderReplayed)
	return len(vs) > 0 && vs[0] == "true"
}
