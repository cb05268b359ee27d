package rpccore

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Refusal is an error idem answers itself, before or instead of the
// handler: a row of Table, what to tell the client, and what to attach.
type Refusal struct {
	Row     *Row
	Message string
	// Key is the call's key, echoed in ErrorInfo when it was valid.
	Key string
	// Method is the call's full method name, in ErrorInfo.
	Method string
	// RetryAfter is the RetryInfo delay of a row with Retry.
	RetryAfter time.Duration
	// Field is the request field or metadata name at fault (BadRequest),
	// or the subject of a failed precondition.
	Field string
}

// Status returns the refusal as a google.rpc.Status with its details:
// ErrorInfo always, RetryInfo where a retry helps, BadRequest for a key
// that is missing or invalid, PreconditionFailure for a key whose state
// forbids the call.
func (r Refusal) Status() *spb.Status {
	meta := map[string]string{"situation": r.Row.Situation.Name}
	if r.Method != "" {
		meta["method"] = r.Method
	}
	if r.Key != "" {
		meta["idempotency_key"] = r.Key
	}
	if r.Row.Situation.Problem != "" {
		meta["problem_type"] = r.Row.Situation.Problem
	}
	details := []proto.Message{&errdetails.ErrorInfo{Reason: r.Row.Reason, Domain: Domain, Metadata: meta}}
	if r.Row.Retry {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(max(r.RetryAfter, time.Second))})
	}
	switch r.Row.Reason {
	case ReasonKeyMissing, ReasonKeyInvalid:
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: r.Field, Description: r.Message, Reason: r.Row.Reason},
		}})
	case ReasonKeyReused, ReasonNeedsReview:
		details = append(details, &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{
			{Type: r.Row.Reason, Subject: r.Field, Description: r.Message},
		}})
	}
	st := &spb.Status{Code: int32(r.Row.Code), Message: r.Message}
	for _, d := range details {
		a, err := anypb.New(d)
		if err != nil { // the details are well-formed messages
			panic(err)
		}
		st.Details = append(st.Details, a)
	}
	return st
}

// ErrorInfo returns the ErrorInfo of idem's domain among st's details, or
// nil: what a client reads to tell idem's answers apart.
func ErrorInfo(details []*anypb.Any) *errdetails.ErrorInfo {
	for _, a := range details {
		var info errdetails.ErrorInfo
		if a.MessageIs(&info) && a.UnmarshalTo(&info) == nil && info.Domain == Domain {
			return &info
		}
	}
	return nil
}

// RetryDelay returns the RetryInfo delay among details, if there is one.
func RetryDelay(details []*anypb.Any) (time.Duration, bool) {
	for _, a := range details {
		var ri errdetails.RetryInfo
		if a.MessageIs(&ri) && a.UnmarshalTo(&ri) == nil && ri.RetryDelay != nil {
			return max(ri.RetryDelay.AsDuration(), 0), true
		}
	}
	return 0, false
}
