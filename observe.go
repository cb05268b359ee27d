package idem

import (
	"io"
	"net/http"
)

// Observe mode (Policy.Observe) lets a team see what enforcement would do to
// its live traffic before it turns enforcement on. Every request is passed
// to the handler unchanged, and every answer is the handler's: nothing is
// refused, replayed or held back, and no Idempotency-Outcome header is added.
// Keys are still reserved and completed, so that the findings are exact: a
// request with a new key is run under a lease and its answer stored; a
// request that enforcement would have answered itself is run unprotected,
// leaving the record as it was, and Event.Finding says what enforcement
// would have done.

// Findings, as reported in Event.Finding in observe mode.
const (
	// FindingMissingKey: the request carried no Idempotency-Key (400 under
	// enforcement, unless the key is optional).
	FindingMissingKey = "missing_key"
	// FindingInvalidKey: its Idempotency-Key was malformed (400).
	FindingInvalidKey = "invalid_key"
	// FindingWouldReplay: the key had completed; enforcement would have
	// replayed the stored answer instead of running the request again.
	FindingWouldReplay = "would_replay"
	// FindingWouldConflict: the key had been used with a different request
	// (422).
	FindingWouldConflict = "would_conflict"
	// FindingWouldWait: a request with the key was in flight (409, or a
	// wait for its answer with Policy.Wait).
	FindingWouldWait = "would_wait"
	// FindingWouldReview: the key was in review (409 needs-review).
	FindingWouldReview = "would_review"
	// FindingWouldRefuse: enforcement would have refused the request for
	// another reason: no credentials to scope the key (401), a body over
	// MaxRequestBody (413), a body that cannot be read (400), a path too
	// long to key (414), an answer stored sealed that does not open.
	FindingWouldRefuse = "would_refuse"
)

// Findings returns every finding, in the order of the constants.
func Findings() []string {
	return []string{FindingMissingKey, FindingInvalidKey, FindingWouldReplay, FindingWouldConflict,
		FindingWouldWait, FindingWouldReview, FindingWouldRefuse}
}

// findingOf maps what Begin found to the finding.
var findingOf = [...]string{
	Replayed:    FindingWouldReplay,
	Mismatch:    FindingWouldConflict,
	InFlight:    FindingWouldWait,
	NeedsReview: FindingWouldReview,
}

// observed runs the handler unprotected for a request that enforcement
// would have answered itself, and records the finding.
func (h *handler) observed(w http.ResponseWriter, r *http.Request, ev *Event, finding string) {
	ev.Outcome, ev.Finding = SituationObserved.Name, finding
	ev.Status = passThrough(h.next, w, r)
}

// readCloser is a request body read partly ahead: Reader gives what was
// read, then the rest; Closer closes the original.
type readCloser struct {
	io.Reader
	io.Closer
}

// errReader fails every read with err: the rest of a request body whose
// reading failed.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
