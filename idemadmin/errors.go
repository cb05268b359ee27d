package idemadmin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idem-dev/idem/idemstore"
)

// Stable error codes of the admin API, in the "code" member of its
// problem documents.
const (
	CodeBadRequest     = "bad_request"
	CodeUnauthorized   = "unauthorized"
	CodeNotFound       = "not_found"
	CodeNotNeedsReview = "not_needs_review"
	CodeNotCompleted   = "not_completed"
	CodeStaleAttempt   = "stale_attempt"
	// CodeAttemptRequired: a change that does not say which attempt of
	// the key it is about (428).
	CodeAttemptRequired = "attempt_required"
	CodeUnavailable     = "store_unavailable"
	CodeTooLarge        = "too_large"
	// CodeNotSupported: what the store cannot do, such as search keys by
	// their value (501).
	CodeNotSupported = "not_supported"
	// CodeAmbiguousID: a short ID that names several keys (409).
	CodeAmbiguousID = "ambiguous_id"
	// CodeRateLimited: too many wrong tokens from the client's address
	// (429, with Retry-After).
	CodeRateLimited = "rate_limited"
	CodeInternal    = "internal"
)

// Error is an admin API error: what the API answers (as an RFC 9457
// problem document with a code member) and what Client returns.
type Error struct {
	// Status is the HTTP status.
	Status int
	// Code is one of the Code constants.
	Code string
	// Detail says what is wrong, naming the key.
	Detail string
	// Err is the underlying error, if any (not sent over HTTP).
	Err error
}

// Error returns the detail.
func (e *Error) Error() string { return e.Detail }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// problem is the JSON form of an Error.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// writeError answers err as a problem document.
func writeError(w http.ResponseWriter, err error) {
	e := asError(err)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="idem admin"`)
	}
	w.WriteHeader(e.Status)
	b, _ := json.Marshal(problem{Type: "about:blank", Title: http.StatusText(e.Status), Status: e.Status, Detail: e.Detail, Code: e.Code})
	w.Write(append(b, '\n'))
}

// asError turns any error into an *Error: store errors get their status.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	switch {
	case errors.Is(err, idemstore.ErrBadCursor):
		return &Error{Status: http.StatusBadRequest, Code: CodeBadRequest, Detail: "invalid cursor: pass back the next_cursor of the previous page", Err: err}
	case errors.Is(err, idemstore.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: "the store is unavailable: " + err.Error(), Err: err}
	case errors.Is(err, idemstore.ErrRetryable):
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: "the store aborted the change on a conflict and nothing was changed; try again: " + err.Error(), Err: err}
	}
	return &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Detail: err.Error(), Err: err}
}

// keyError turns a store error about k into an *Error naming it. state is
// the record's state where known; with idemstore.ErrLeaseLost, the state
// the change wanted.
func keyError(k idemstore.Key, state idemstore.State, err error) error {
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Detail: "no " + describeKey(k) + " (it may have been released, deleted or purged)", Err: err}
	case errors.Is(err, idemstore.ErrNotNeedsReview):
		return &Error{Status: http.StatusConflict, Code: CodeNotNeedsReview, Detail: describeKey(k) + " does not need review" + stateNote(state) + "; someone may have settled it already", Err: err}
	case errors.Is(err, idemstore.ErrLeaseLost) && state == idemstore.StateCompleted:
		return &Error{Status: http.StatusConflict, Code: CodeStaleAttempt, Detail: describeKey(k) + " holds another answer than the one read (it was deleted or expired, and the operation ran again); look at it again before deleting it", Err: err}
	case errors.Is(err, idemstore.ErrLeaseLost):
		return &Error{Status: http.StatusConflict, Code: CodeStaleAttempt, Detail: describeKey(k) + " went to review again since it was read (a new attempt); look at it again before settling it", Err: err}
	case errors.Is(err, idemstore.ErrNotCompleted):
		return &Error{Status: http.StatusConflict, Code: CodeNotCompleted, Detail: describeKey(k) + " is not completed" + stateNote(state) + "; only a completed key can be deleted", Err: err}
	}
	e := asError(err)
	return &Error{Status: e.Status, Code: e.Code, Detail: describeKey(k) + ": " + e.Detail, Err: err}
}

func stateNote(s idemstore.State) string {
	if s == "" {
		return ""
	}
	return " (it is " + string(s) + ")"
}

// describeKey names k for messages: the key, its operation and the start
// of its scope, every part printable.
func describeKey(k idemstore.Key) string {
	return fmt.Sprintf("key %s (%s, scope %s)", quote(k.Key, 300), Visible(k.Operation), shortScope(k.Scope))
}

// shortScope abbreviates a long scope (a 64-hex credential hash) to its
// first 12 characters.
func shortScope(s string) string {
	if len(s) > 16 {
		return Visible(s[:12]) + "…"
	}
	return Visible(s)
}

// quote returns s in double quotes, printable, cut at max bytes.
func quote(s string, max int) string {
	if len(s) > max {
		return strconv.Quote(s[:max]) + "…"
	}
	return strconv.Quote(s)
}
