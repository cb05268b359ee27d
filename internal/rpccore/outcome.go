package rpccore

import (
	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idem-dev/idem"
)

// Domain is the google.rpc.ErrorInfo domain of every error idem answers.
const Domain = "idem.github.com/idem-dev"

// Reasons, the google.rpc.ErrorInfo reason of each error idem answers.
// Clients switch on them (see idemgrpc.Reason); they are stable.
const (
	ReasonKeyMissing       = "KEY_MISSING"
	ReasonKeyInvalid       = "KEY_INVALID"
	ReasonKeyReused        = "KEY_REUSED"
	ReasonInFlight         = "IN_FLIGHT"
	ReasonNeedsReview      = "NEEDS_REVIEW"
	ReasonNotReplayable    = "NOT_REPLAYABLE"
	ReasonScopeMissing     = "SCOPE_MISSING"
	ReasonScopeDenied      = "SCOPE_DENIED"
	ReasonTooLong          = "SCOPE_TOO_LONG"
	ReasonStoreUnavailable = "STORE_UNAVAILABLE"
	ReasonAnswerSealed     = "ANSWER_SEALED"
)

// Row is how an RPC front door answers one of idem's situations.
type Row struct {
	// Situation is the row of idem's outcome table (its Name is the
	// event's outcome and the metric label).
	Situation idem.Situation
	// Code is the status code (google.rpc.Code; gRPC and Connect number
	// their codes alike).
	Code code.Code
	// Reason is the ErrorInfo reason.
	Reason string
	// Retry marks the errors that carry RetryInfo: retrying the same call
	// with the same key can succeed.
	Retry bool
	// Why is the reason for the code, as docs/grpc.md gives it.
	Why string
}

// Table is every situation an RPC front door answers itself, in the order
// docs/grpc.md lists them. The situations it leaves out are the handler's
// own answer (acquired, replayed), a call that runs unprotected (no_key,
// fail_open), or what only idem serve or the HTTP middleware answers (a
// request body or path, observe mode).
var Table = []Row{
	{idem.SituationMissingKey, code.Code_INVALID_ARGUMENT, ReasonKeyMissing, false,
		"the call is malformed whatever the state of the system: it lacks a key the method requires"},
	{idem.SituationInvalidKey, code.Code_INVALID_ARGUMENT, ReasonKeyInvalid, false,
		"the call is malformed whatever the state of the system: its key is empty, too long, not visible ASCII, not a UUID where a request_id must be one, given twice with different values, or its first_sent is missing, expired or in the future"},
	{idem.SituationMismatch, code.Code_FAILED_PRECONDITION, ReasonKeyReused, false,
		"the same call with a new key would run, so the arguments are not invalid in themselves; the key's state forbids it, and retrying cannot change that"},
	{idem.SituationInFlight, code.Code_ABORTED, ReasonInFlight, true,
		"a concurrency conflict: the first call still holds the key; retry the same call after the RetryInfo delay to get its answer"},
	{idem.SituationNeedsReview, code.Code_FAILED_PRECONDITION, ReasonNeedsReview, false,
		"the system is not in a state to answer until an operator or a resolver settles the key; an automatic retry cannot change that"},
	{idem.SituationNotReplayable, code.Code_ALREADY_EXISTS, ReasonNotReplayable, false,
		"the operation already ran and will not run again, but its answer was too large to keep"},
	{idem.SituationScopeMissing, code.Code_UNAUTHENTICATED, ReasonScopeMissing, false,
		"the call carries no credentials to scope its key, and keys without a scope could replay one client's answer to another"},
	{idem.SituationScopeDenied, code.Code_UNAUTHENTICATED, ReasonScopeDenied, false,
		"the call's credentials do not identify a client (a Scope function may answer another code, such as PERMISSION_DENIED, by returning a status)"},
	{idem.SituationTooLong, code.Code_INVALID_ARGUMENT, ReasonTooLong, false,
		"the scope taken from the call's credentials is longer than idem keeps"},
	{idem.SituationUnavailable, code.Code_UNAVAILABLE, ReasonStoreUnavailable, true,
		"the key could not be checked and nothing ran: the same call can be retried as it is"},
	{idem.SituationSealed, code.Code_INTERNAL, ReasonAnswerSealed, false,
		"the call ran before, and its stored answer cannot be opened with the keys configured: an invariant of the server is broken"},
}

// rowOf returns the row of the situation named name.
func rowOf(name string) *Row {
	for i := range Table {
		if Table[i].Situation.Name == name {
			return &Table[i]
		}
	}
	for i := range ProxyTable {
		if ProxyTable[i].Situation.Name == name {
			return &ProxyTable[i]
		}
	}
	panic("rpccore: no row for situation " + name)
}
