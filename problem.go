package idem

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemTypeBase prefixes the type URI of every problem document the
// middleware writes; the fragment names the situation. The URIs are stable:
// clients may switch on them.
const ProblemTypeBase = "https://github.com/idem-dev/idem/blob/main/docs/problems.md#"

// Problem type URIs, one per situation (RFC 9457).
const (
	ProblemMissingKey     = ProblemTypeBase + "missing-key"
	ProblemInvalidKey     = ProblemTypeBase + "invalid-key"
	ProblemMismatch       = ProblemTypeBase + "key-reused"
	ProblemInFlight       = ProblemTypeBase + "in-flight"
	ProblemNeedsReview    = ProblemTypeBase + "needs-review"
	ProblemNotReplayable  = ProblemTypeBase + "not-replayable"
	ProblemNotAcceptable  = ProblemTypeBase + "not-acceptable"
	ProblemBodyTooLarge   = ProblemTypeBase + "body-too-large"
	ProblemUnavailable    = ProblemTypeBase + "store-unavailable"
	ProblemScope          = ProblemTypeBase + "scope-denied"
	ProblemScopeMissing   = ProblemTypeBase + "scope-missing"
	ProblemTooLong        = ProblemTypeBase + "too-long"
	ProblemBodyUnreadable = ProblemTypeBase + "body-unreadable"
	ProblemSealed         = ProblemTypeBase + "answer-sealed"
	ProblemInvalidMethod  = ProblemTypeBase + "invalid-method"

	// Answers only idem serve gives.
	ProblemUpstreamUnreachable = ProblemTypeBase + "upstream-unreachable"
	ProblemUpstreamFailed      = ProblemTypeBase + "upstream-failed"
	ProblemUpstreamTimeout     = ProblemTypeBase + "upstream-timeout"
	ProblemShuttingDown        = ProblemTypeBase + "shutting-down"
	ProblemInvalidPath         = ProblemTypeBase + "invalid-path"
	ProblemBusy                = ProblemTypeBase + "busy"
	ProblemTooManyNewKeys      = ProblemTypeBase + "too-many-new-keys"
)

// Problem is an RFC 9457 problem document.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Key echoes the Idempotency-Key concerned, when there is a valid one.
	Key string `json:"idempotency_key,omitempty"`
}

// WriteProblem writes p as application/problem+json.
func WriteProblem(w http.ResponseWriter, p Problem) {
	b, err := json.Marshal(p)
	if err != nil {
		http.Error(w, p.Title, p.Status)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(b, '\n'))
}
