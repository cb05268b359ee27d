package idemadmin

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem/idemstore"
)

// Item is one key as the admin API shows it.
type Item struct {
	// ID identifies the key in the API's URLs: opaque and URL-safe.
	ID string `json:"id"`
	// ShortID identifies the key too, in fewer characters: its key, '~'
	// and six hex digits (see ShortID). The API and the CLI take it
	// wherever they take an ID, on a store that searches by key.
	ShortID string `json:"short_id"`
	Scope   string `json:"scope"`
	// ScopeLabel is the operator's label of the scope (an account or user
	// ID the upstream sent, see idem serve --scope-label-header), opened
	// when it is sealed; empty when the record has none, or when it is
	// sealed and does not open here (Sealed then says so). It is only a
	// label: the scope alone says whose key it is.
	ScopeLabel string `json:"scope_label,omitempty"`
	Operation  string `json:"operation"`
	Key        string `json:"key"`
	// State is pending, completed or needs_review.
	State      string    `json:"state"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at,omitzero"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// ExpiresAt is when a completed key may be purged.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// ReadAt is the store's clock when the key was read: ages are
	// ReadAt minus CreatedAt or UpdatedAt, whatever the reader's clock.
	ReadAt time.Time `json:"read_at,omitzero"`
	// Reason says why the key needs review, or how it was resolved.
	Reason      string `json:"reason"`
	Fingerprint string `json:"fingerprint"`
	// Attempt identifies the attempt that holds the key (pending), went
	// to review, or stored the answer (completed): a resolution or a
	// deletion that names it changes that attempt only, never a later one
	// that went to review or stored an answer since it was read.
	Attempt string `json:"attempt,omitempty"`
	// Request is what was asked: method, path and query, and the body in
	// the detail of a key whose route stores it.
	Request *RequestInfo `json:"request,omitempty"`
	// Response is the stored answer of a completed key; its body only in
	// the detail.
	Response *ResponseInfo `json:"response,omitempty"`
	// Sealed, when set, says which parts are stored sealed and did not
	// open here (the key that sealed them is not configured), and so are
	// left out: an answer's headers and body, a request's query and body.
	Sealed string `json:"sealed,omitempty"`
}

// RequestInfo is what an operator needs to ask the provider about a key.
type RequestInfo struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Query  string `json:"query"`
	// Body is the request body when it is valid UTF-8, BodyBase64 when it
	// is not; both are empty unless the route stores bodies
	// (store_request) and this is the key's detail.
	Body       *string `json:"body,omitempty"`
	BodyBase64 string  `json:"body_base64,omitempty"`
	BodyBytes  int     `json:"body_bytes"`
}

// ResponseInfo is a completed key's stored answer.
type ResponseInfo struct {
	Status    int         `json:"status"`
	Headers   http.Header `json:"headers"`
	BodyBytes int         `json:"body_bytes"`
	// Body (valid UTF-8) or BodyBase64 (anything else), in the detail only.
	Body       *string `json:"body,omitempty"`
	BodyBase64 string  `json:"body_base64,omitempty"`
	// NotReplayable, when set, says why the answer was not kept.
	NotReplayable string `json:"not_replayable,omitempty"`
}

// Age is how long the key has been in its state by the store's clock: for
// a key in review, since it went there.
func (it *Item) Age() time.Duration {
	since := it.UpdatedAt
	if since.IsZero() || it.State != string(idemstore.StateNeedsReview) {
		since = it.CreatedAt
	}
	if it.ReadAt.IsZero() || since.IsZero() {
		return 0
	}
	return max(it.ReadAt.Sub(since), 0)
}

// KeyID is the admin API's ID of a key.
func KeyID(k idemstore.Key) string { return idemstore.EncodeKeyCursor(k) }

// ParseKeyID reverses KeyID.
func ParseKeyID(id string) (idemstore.Key, error) {
	k, err := idemstore.DecodeKeyCursor(id)
	if err != nil || k.Key == "" {
		return idemstore.Key{}, &Error{Status: http.StatusBadRequest, Code: CodeBadRequest, Detail: "malformed key id " + quote(id, 80) + " (use the id that a listing shows)"}
	}
	return k, nil
}

// newItem is the API's view of rec; detail adds the request and response
// bodies.
func newItem(rec *idemstore.Record, detail bool) Item {
	it := Item{
		ID:          KeyID(rec.Key),
		ShortID:     ShortID(rec.Key),
		Scope:       rec.Key.Scope,
		ScopeLabel:  rec.ScopeLabel,
		Operation:   rec.Key.Operation,
		Key:         rec.Key.Key,
		State:       string(rec.State),
		CreatedAt:   utc(rec.CreatedAt),
		UpdatedAt:   utc(rec.UpdatedAt),
		LeaseUntil:  utc(rec.LeaseUntil),
		ExpiresAt:   utc(rec.ExpiresAt),
		ReadAt:      utc(rec.ReadAt),
		Reason:      rec.Reason,
		Fingerprint: rec.Fingerprint,
	}
	if rec.State != idemstore.StatePending {
		it.LeaseUntil = time.Time{} // meaningless once the lease ended
	}
	it.Attempt = attemptOf(rec.Token)
	if q := rec.Request; q != nil {
		it.Request = &RequestInfo{Method: q.Method, Path: q.Path, Query: q.Query, BodyBytes: len(q.Body)}
		if detail && len(q.Body) > 0 {
			it.Request.Body, it.Request.BodyBase64 = encodeBody(q.Body)
		}
	}
	if r := rec.Response; r != nil && rec.State == idemstore.StateCompleted {
		it.Response = &ResponseInfo{Status: r.Status, Headers: r.Header, BodyBytes: len(r.Body), NotReplayable: r.NotReplayable}
		if it.Response.Headers == nil {
			it.Response.Headers = http.Header{}
		}
		if detail && len(r.Body) > 0 {
			it.Response.Body, it.Response.BodyBase64 = encodeBody(r.Body)
		}
	}
	return it
}

// attemptOf is the public name of a lease token: a digest, so that the
// token itself (which fences every change) is never shown.
func attemptOf(token string) string {
	if token == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:8])
}

// encodeBody returns b as a string when it is valid UTF-8, and in base64
// otherwise.
func encodeBody(b []byte) (*string, string) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, ""
	}
	return nil, base64.StdEncoding.EncodeToString(b)
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}
