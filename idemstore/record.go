package idemstore

import (
	"net/http"
	"time"
)

// Key identifies one idempotency record.
//
// Scope says whose key it is (a user, a tenant, a credential hash); it is
// never the client's string alone, so one user cannot read another's answer.
// Operation says what is being done ("POST /payments", a job name). Key is
// the client's Idempotency-Key value.
type Key struct {
	Scope     string
	Operation string
	Key       string
}

// The longest Key parts, in bytes, that every store must keep (the
// conformance suite stores a key with all three at their limits). idem's
// engine refuses longer ones before they reach a store.
const (
	MaxScopeLength     = 1024
	MaxOperationLength = 1024
	MaxKeyLength       = 255
)

// State is the lifecycle state of a record.
type State string

// The states a record can be in. A released record is deleted, so it has no
// state of its own.
const (
	// StatePending means the key is reserved and the work is under way (or
	// its holder died; see LeaseUntil).
	StatePending State = "pending"
	// StateCompleted means the answer is stored and every retry replays it.
	StateCompleted State = "completed"
	// StateNeedsReview means the outcome is unknown: the work may have had an
	// effect outside the store. An operator or a resolver decides.
	StateNeedsReview State = "needs_review"
)

// Valid reports whether s is one of the defined states.
func (s State) Valid() bool {
	switch s {
	case StatePending, StateCompleted, StateNeedsReview:
		return true
	}
	return false
}

// Record is one stored idempotency record.
type Record struct {
	Key Key
	// Fingerprint is the versioned digest of the request's meaning; a retry
	// with another fingerprint is a mismatch.
	Fingerprint string
	State       State
	// Token is the fencing token of the current lease holder. Every state
	// change is conditioned on it. A completed record keeps the token it
	// was completed under, which fences its deletion (DeleteParams.Token).
	Token string
	// LeaseUntil is when the current lease expires by the store's clock,
	// unless it is extended.
	LeaseUntil time.Time
	// Response is the stored answer of a completed record; nil otherwise,
	// and nil when ResponseSize is set.
	Response *Response
	// ResponseSize, when positive, says that the record is completed and
	// its answer was left out of it (ReserveParams.InlineResponse): the
	// answer is ResponseSize bytes as the store keeps it (encoded, and
	// sealed where the engine seals), and ResponseReader.ReadResponse reads
	// it. Zero otherwise.
	ResponseSize int64
	// Reason says why a record needs review, or how it was resolved.
	Reason string
	// Request describes the request that reserved the key, for operators
	// and resolvers; nil when the caller gave none.
	Request *Request
	// ScopeLabel is the operator's label of the scope given at Reserve
	// (ReserveParams.ScopeLabel), as stored: in clear, or sealed
	// (IsSealedLabel). Empty when none was given. It never changes after
	// Reserve, and never decides anything.
	ScopeLabel string
	// CreatedAt is when the key was reserved, and UpdatedAt when the record
	// last changed (state, token or lease), both by the store's clock.
	CreatedAt time.Time
	UpdatedAt time.Time
	// ExpiresAt is when a completed record may be purged. It is zero while
	// the record is pending or needs review.
	ExpiresAt time.Time
	// ReadAt is the store's clock when the record was read. It is not
	// stored: it lets a reader judge LeaseUntil and CreatedAt on the clock
	// they were written with (the lease has expired when ReadAt is not
	// before LeaseUntil), whatever its own clock says.
	ReadAt time.Time
}

// LeaseExpired reports whether the record's lease had expired by the
// store's clock when it was read.
func (r *Record) LeaseExpired() bool { return !r.ReadAt.Before(r.LeaseUntil) }

// Request describes the request that reserved a key: what an operator or a
// resolver needs to find out what became of it. Body is kept only where the
// route allows it.
type Request struct {
	Method string
	Path   string
	Query  string
	Body   []byte
}

// Response is a stored answer.
//
// Header holds only what may be replayed: the engine strips Set-Cookie,
// hop-by-hop headers and Date before a response reaches a store. A response
// whose NotReplayable field is set records that the operation completed but
// its answer could not be kept (a body over the size limit, a streamed or
// hijacked response); retries are told so instead of running again.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// NotReplayable, when not empty, is the reason the answer was not kept.
	NotReplayable string
}
