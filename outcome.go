package idem

import (
	"net/http"
	"strconv"
)

// Situation is one thing that can happen to a protected request, as clients,
// logs and metrics see it. Every front end (the middleware, idem serve)
// answers from this one table, and docs/problems.md documents it row by row.
type Situation struct {
	// Name is the Idempotency-Outcome header value, Event.Outcome, and the
	// metric label ("in_flight").
	Name string
	// Status is the HTTP status idem answers with, or 0 when the answer is
	// the handler's (or the stored one).
	Status int
	// Problem is the RFC 9457 problem type URI, or "" when idem writes no
	// problem document.
	Problem string
	// Title is the problem document's title.
	Title string
	// ProxyOnly marks what only idem serve answers.
	ProxyOnly bool
}

// ProblemDoc returns the problem document for s with detail, echoing key when
// it is not empty.
func (s Situation) ProblemDoc(detail, key string) Problem {
	return Problem{Type: s.Problem, Title: s.Title, Status: s.Status, Detail: detail, Key: key}
}

// The situations. Those with a Problem answer with a problem document of
// that type; the others pass the handler's answer, or the stored one.
var (
	SituationAcquired       = Situation{Name: "acquired"}
	SituationReplayed       = Situation{Name: "replayed"}
	SituationNoKey          = Situation{Name: "no_key"}
	SituationFailOpen       = Situation{Name: "fail_open"}
	SituationCanceled       = Situation{Name: "canceled", Status: 499}
	SituationObserved       = Situation{Name: "observed"}
	SituationMissingKey     = Situation{Name: "missing_key", Status: http.StatusBadRequest, Problem: ProblemMissingKey, Title: "Idempotency-Key required"}
	SituationInvalidKey     = Situation{Name: "invalid_key", Status: http.StatusBadRequest, Problem: ProblemInvalidKey, Title: "Invalid Idempotency-Key"}
	SituationInvalidMethod  = Situation{Name: "invalid_method", Status: http.StatusBadRequest, Problem: ProblemInvalidMethod, Title: "Method not accepted"}
	SituationMismatch       = Situation{Name: "mismatch", Status: http.StatusUnprocessableEntity, Problem: ProblemMismatch, Title: "Idempotency-Key reused"}
	SituationInFlight       = Situation{Name: "in_flight", Status: http.StatusConflict, Problem: ProblemInFlight, Title: "Request in progress"}
	SituationNeedsReview    = Situation{Name: "needs_review", Status: http.StatusConflict, Problem: ProblemNeedsReview, Title: "Request outcome under review"}
	SituationNotReplayable  = Situation{Name: "not_replayable", Status: http.StatusConflict, Problem: ProblemNotReplayable, Title: "Answer not kept"}
	SituationNotAcceptable  = Situation{Name: "not_acceptable", Status: http.StatusNotAcceptable, Problem: ProblemNotAcceptable, Title: "Stored answer not acceptable"}
	SituationTooLong        = Situation{Name: "too_long", Status: http.StatusRequestURITooLong, Problem: ProblemTooLong, Title: "Request path too long"}
	SituationBodyTooLarge   = Situation{Name: "body_too_large", Status: http.StatusRequestEntityTooLarge, Problem: ProblemBodyTooLarge, Title: "Request body too large"}
	SituationBodyUnreadable = Situation{Name: "body_unreadable", Status: http.StatusBadRequest, Problem: ProblemBodyUnreadable, Title: "Unreadable request body"}
	SituationScopeDenied    = Situation{Name: "scope_denied", Status: http.StatusUnauthorized, Problem: ProblemScope, Title: "Unauthorized"}
	SituationScopeMissing   = Situation{Name: "scope_missing", Status: http.StatusUnauthorized, Problem: ProblemScopeMissing, Title: "Credentials required"}
	SituationUnavailable    = Situation{Name: "unavailable", Status: http.StatusServiceUnavailable, Problem: ProblemUnavailable, Title: "Idempotency store unavailable"}
	SituationSealed         = Situation{Name: "sealed", Status: http.StatusInternalServerError, Problem: ProblemSealed, Title: "Stored answer cannot be opened"}

	SituationUpstreamUnreachable = Situation{Name: "upstream_unreachable", Status: http.StatusBadGateway, Problem: ProblemUpstreamUnreachable, Title: "Upstream unreachable", ProxyOnly: true}
	SituationUpstreamFailed      = Situation{Name: "upstream_failed", Status: http.StatusBadGateway, Problem: ProblemUpstreamFailed, Title: "Upstream failed", ProxyOnly: true}
	SituationUpstreamTimeout     = Situation{Name: "upstream_timeout", Status: http.StatusGatewayTimeout, Problem: ProblemUpstreamTimeout, Title: "Upstream timeout", ProxyOnly: true}
	SituationShuttingDown        = Situation{Name: "shutting_down", Status: http.StatusServiceUnavailable, Problem: ProblemShuttingDown, Title: "Proxy shutting down", ProxyOnly: true}
	SituationInvalidPath         = Situation{Name: "invalid_path", Status: http.StatusBadRequest, Problem: ProblemInvalidPath, Title: "Request path not accepted", ProxyOnly: true}
	SituationBusy                = Situation{Name: "busy", Status: http.StatusServiceUnavailable, Problem: ProblemBusy, Title: "Proxy busy", ProxyOnly: true}
	SituationTooManyNewKeys      = Situation{Name: "too_many_new_keys", Status: http.StatusTooManyRequests, Problem: ProblemTooManyNewKeys, Title: "Too many new keys", ProxyOnly: true}
)

// Situations returns every situation, in the order docs/problems.md lists
// those with a problem document.
func Situations() []Situation {
	return []Situation{
		SituationAcquired, SituationReplayed, SituationNoKey, SituationFailOpen, SituationCanceled, SituationObserved,
		SituationMissingKey, SituationInvalidKey, SituationInvalidMethod, SituationMismatch, SituationInFlight, SituationNeedsReview,
		SituationNotReplayable, SituationNotAcceptable, SituationTooLong, SituationBodyTooLarge, SituationBodyUnreadable,
		SituationScopeDenied, SituationScopeMissing, SituationUnavailable, SituationSealed,
		SituationUpstreamUnreachable, SituationUpstreamFailed, SituationUpstreamTimeout, SituationShuttingDown,
		SituationInvalidPath, SituationBusy, SituationTooManyNewKeys,
	}
}

// String returns s.Name.
func (s Situation) String() string {
	if s.Status == 0 {
		return s.Name
	}
	return s.Name + " (" + strconv.Itoa(s.Status) + ")"
}
