package idemclient

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-dev/idem"
)

// maxErrorBody bounds what is read of an answer that becomes an *Error, or
// that is read to see whether a 409 is in flight.
const maxErrorBody = 64 << 10

// Error is an answer Transport does not retry and returns as an error,
// because retrying cannot change it: a 400 (the key is missing or
// malformed), a 422 (the key was used for another request), or a 409 that
// is not in flight (idem's needs-review: the first attempt's outcome is
// unknown, and it will not run again until someone settles it; or
// not-replayable), and a 409 still in flight when the attempts ran out. An
// http.Client returns it wrapped in a *url.Error; use errors.As.
type Error struct {
	// StatusCode is the answer's HTTP status.
	StatusCode int
	// Problem is the RFC 9457 problem document of the answer, when it was
	// one (Type is then set, except for a document of type about:blank);
	// otherwise Status and Title come from the status code.
	Problem idem.Problem
	// Key is the Idempotency-Key the request carried. Retry with it (see
	// WithKey), never with a new one: a key under review may have run.
	Key string
	// RetryAfter is the answer's Retry-After, or zero.
	RetryAfter time.Duration
	// Attempts is how many times the request was sent.
	Attempts int
	// Header is the answer's header.
	Header http.Header
	// Body is the answer's body, up to 64 KiB.
	Body []byte
}

// Error describes the answer: the status, the problem's title and detail.
func (e *Error) Error() string {
	s := "idemclient: " + strconv.Itoa(e.StatusCode)
	if e.Problem.Title != "" {
		s += " " + e.Problem.Title
	}
	if e.Problem.Detail != "" {
		s += ": " + e.Problem.Detail
	}
	return s
}

// NeedsReview reports whether the answer says that an earlier attempt with
// the key ended with an unknown outcome and waits for review (idem's
// needs-review problem type).
func (e *Error) NeedsReview() bool {
	return e.Problem.Type == idem.ProblemNeedsReview || e.Header.Get(headerOutcome) == idem.SituationNeedsReview.Name
}

// newError reads resp (up to maxErrorBody, then closes it) into an *Error.
// body, when not nil, is what was read of it already.
func newError(resp *http.Response, body []byte, key string, attempts int, now time.Time) *Error {
	if body == nil {
		body = readBody(resp)
	}
	e := &Error{StatusCode: resp.StatusCode, Key: key, Attempts: attempts, Header: resp.Header, Body: body}
	e.RetryAfter, _ = retryAfter(resp.Header, now)
	if p, ok := parseProblem(resp.Header, body); ok {
		e.Problem = p
	}
	if e.Problem.Status == 0 {
		e.Problem.Status = resp.StatusCode
	}
	if e.Problem.Title == "" {
		e.Problem.Title = http.StatusText(resp.StatusCode)
	}
	return e
}

// readBody reads up to maxErrorBody of resp's body and closes it. A body
// that fails midway gives what was read.
func readBody(resp *http.Response) []byte {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	return b
}

// parseProblem decodes an RFC 9457 problem document (application/problem+json,
// or plain JSON with a type or title).
func parseProblem(h http.Header, body []byte) (idem.Problem, bool) {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	if mt != "application/problem+json" && mt != "application/json" {
		return idem.Problem{}, false
	}
	var p idem.Problem
	if json.Unmarshal(body, &p) != nil || (mt == "application/json" && p.Type == "" && p.Title == "") {
		return idem.Problem{}, false
	}
	return p, true
}
