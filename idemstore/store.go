package idemstore

import (
	"context"
	"time"
)

// Store keeps idempotency records. Implementations must be safe for
// concurrent use by many goroutines, and by many processes where the backing
// service is shared.
//
// Time belongs to the store. Callers pass durations (a lease, a retention),
// never deadlines; the store turns them into deadlines on its own clock
// (PostgreSQL and MySQL the server's, Redis the server's TIME, SQLite and
// memory the one host's), and decides whether a lease has expired on that
// same clock, inside the statement or script that acts on it. Processes with
// skewed clocks therefore agree on every lease, and an Extend that landed
// first always beats a Takeover, or a Release or Escalate with IfExpired.
//
// Every method that changes a pending record is fenced: it applies only while
// the record is pending and its token equals the one given, and returns
// ErrLeaseLost otherwise, changing nothing.
type Store interface {
	// Reserve inserts a pending record for p.Key, relying on a unique
	// constraint (or the backend's equivalent atomic insert) so that exactly
	// one of any number of concurrent callers can succeed. It is never a read
	// followed by an insert. The new record's CreatedAt and UpdatedAt are the
	// store's now, and its LeaseUntil is now + p.Lease.
	//
	// On success it returns a nil record and created == true: the new record
	// is what p describes, and the caller already has that (Get returns it
	// as stored, at the backend's time precision). If a record already
	// exists, it returns that record (with ReadAt set) and created == false,
	// changing nothing. If the existing record disappears between the failed
	// insert and the read, Reserve tries the insert again a bounded number
	// of times.
	//
	// A Reserve that returns an error may still have inserted the record
	// (the reply was lost after the commit). The caller must then release
	// p.Token, fenced, so that no reservation is left without an owner. A
	// store may also release it itself, on the caller's behalf (the SQL
	// stores do, for a batched Reserve whose caller left while its batch
	// ran); the caller's release then finds nothing. That release must not
	// be overtaken: a Reserve whose context ends while the backend still
	// works on it returns once the backend can no longer commit it, or has
	// committed it, unless the backend stays silent past a bound of the
	// store's, as with any lost reply.
	Reserve(ctx context.Context, p ReserveParams) (rec *Record, created bool, err error)

	// Get returns the record for key, with ReadAt set, or ErrNotFound.
	Get(ctx context.Context, key Key) (*Record, error)

	// Complete stores the response and moves the record to completed,
	// expiring p.Retention after the store's now. Fenced by p.Token; the
	// lease deadline is not checked, the token alone fences. The store must
	// not keep p.Response, its Header or its Body after the call returns: it
	// encodes or copies what it keeps (callers reuse their buffers). Nor may
	// it change them: a Header may be shared by many calls (the gRPC front
	// doors store one per message type).
	Complete(ctx context.Context, p CompleteParams) error

	// Release deletes the record if it is still pending under p.Token
	// ("release if pending"). A completed record is left alone and
	// ErrLeaseLost is returned. With p.IfExpired, only a record whose lease
	// expired by the store's clock is released.
	Release(ctx context.Context, p ReleaseParams) error

	// Escalate moves a pending record to needs_review with a reason. Fenced
	// by p.Token; with p.IfExpired, only a record whose lease expired by the
	// store's clock is escalated.
	Escalate(ctx context.Context, p EscalateParams) error

	// Extend moves the lease deadline of a pending record to the store's now
	// plus p.Lease. Fenced by p.Token. It does not look at the deadline: a
	// holder whose lease ran out but was not yet taken over keeps it.
	Extend(ctx context.Context, p ExtendParams) error

	// Takeover gives a pending record whose lease has expired by the store's
	// clock (LeaseUntil <= now) a new token and a lease of p.Lease from now.
	// Fenced by p.OldToken: of several concurrent takeovers of one record,
	// exactly one succeeds; the others get ErrLeaseLost. A record whose lease
	// is still alive is not taken over (ErrLeaseLost).
	Takeover(ctx context.Context, p TakeoverParams) error

	// Resolve settles a needs_review record: it completes it with p.Response
	// (which, as with Complete, the store must not keep), expiring
	// p.Retention after now, or deletes it (release). Records in any other
	// state are left alone and ErrNotNeedsReview (or ErrNotFound) is
	// returned. With p.Token set, only the record escalated under that token
	// is settled: one that was released and escalated again under another
	// token meanwhile is left alone and ErrLeaseLost is returned.
	Resolve(ctx context.Context, p ResolveParams) error

	// Delete removes a completed record before its retention ends, for an
	// operator who wants the next request with its key to run again. A
	// pending or needs_review record is left alone and ErrNotCompleted (or
	// ErrNotFound) is returned. With p.Token set, only the answer stored
	// under that token is deleted: a record that was deleted (or purged)
	// and completed again under another token meanwhile is left alone and
	// ErrLeaseLost is returned.
	Delete(ctx context.Context, p DeleteParams) error

	// ListExpiredLeases returns up to limit pending records whose lease
	// expired by the store's clock, oldest deadline first, for recovery.
	// limit follows PageLimit: zero or less means 100, and a store may
	// return at most 1000. Acting on them must go through the fenced,
	// expiry-checked Release, Escalate or Takeover: a lease listed here may
	// be extended before the caller acts.
	ListExpiredLeases(ctx context.Context, limit int) ([]*Record, error)

	// List pages through records for admin use, in p.Order, optionally
	// filtered by state and operation, and, on a store whose Capabilities
	// include Search, by the other fields of p; a store without Search
	// returns ErrSearchUnsupported for p that Searches. Pass the returned
	// NextCursor back, with the same p, to continue; an empty NextCursor
	// means the end.
	List(ctx context.Context, p ListParams) (ListPage, error)

	// Purge deletes completed records whose ExpiresAt is at or before the
	// store's now, in batches of at most p.BatchSize, until none are left
	// or ctx ends. It returns how many it deleted. Pending and needs_review
	// records are never purged.
	Purge(ctx context.Context, p PurgeParams) (int, error)

	// Capabilities tells the engine what the store can do beyond the
	// contract.
	Capabilities() Capabilities
}

// Capabilities describes optional features of a store.
type Capabilities struct {
	// TransactionalComplete means the driver offers CompleteTx, which stores
	// the answer inside the caller's own database transaction.
	TransactionalComplete bool
	// Notify means the store implements [Notifier], so waiters wake up as
	// soon as a record changes instead of only polling.
	Notify bool
	// Search means the store keeps ReserveParams.ScopeLabel, and List
	// implements every field of ListParams (Key, KeyPrefix, ScopeLabels,
	// OlderThan, Reason, Order) through indexes that keep a search by key
	// or label fast among millions of records.
	Search bool
}

// BatchStats counts what a store's group commit has done since the store
// was opened, for the calls it batches (Reserve, Complete, Release,
// Escalate, Extend; not their IfExpired variants, Takeover or reads).
// Batched / Batches is the mean number of calls a batch carried; under light
// load most calls find the store idle and run Alone, at once, as they would
// without batching. A call counts once per attempt: a Reserve the store
// retries counts again, and a batch that failed in a way that made its
// members run alone still counts as a batch. The three are read one after
// another, not as one snapshot.
type BatchStats struct {
	// Batches is how many transactions carried calls that had queued
	// while the store was busy.
	Batches uint64
	// Batched is how many calls those transactions carried.
	Batched uint64
	// Alone is how many calls found the store idle and ran at once, alone.
	Alone uint64
}

// BatchReporter is implemented by stores that batch concurrent calls into
// shared transactions (group commit): the SQLite, PostgreSQL and MySQL
// stores. ok is false when batching is off, and, for a wrapper that
// implements it for any store, when the store behind it does not batch.
type BatchReporter interface {
	BatchStats() (stats BatchStats, ok bool)
}

// Notifier is implemented by stores that can tell waiters that a record may
// have changed.
type Notifier interface {
	// Subscribe returns a channel that receives a value (or is closed) after
	// the record for key may have changed state. The caller must call cancel
	// when done. A notification is only a hint: the caller reads the record
	// again.
	Subscribe(ctx context.Context, key Key) (ch <-chan struct{}, cancel func(), err error)
}

// ReserveParams are the arguments of Store.Reserve.
type ReserveParams struct {
	Key         Key
	Fingerprint string
	Token       string
	// Lease is how long the reservation holds, from the store's now. The
	// engine always passes a positive duration; the conformance suite passes
	// zero or less to make a lease that has already expired.
	Lease time.Duration
	// Request, when set, describes the request for operators (see
	// Record.Request). Stores keep its fields as given, but must not keep
	// the pointer or its Body after the call returns: they encode or copy
	// it (callers reuse their buffers).
	Request *Request
	// ScopeLabel, when set, is kept as Record.ScopeLabel: an operator's
	// label of the scope, in clear (idemstore.CleanScopeLabel) or sealed
	// (IsSealedLabel), at most MaxStoredScopeLabelLength bytes. Stores
	// that search index ScopeLabelIndex of it. Stores without
	// Capabilities.Search may drop it.
	ScopeLabel string
	// InlineResponse, when positive, lets a store that implements
	// ResponseReader leave out of the record it returns a stored answer
	// longer than InlineResponse bytes as the store keeps it: the record
	// then has a nil Response and its ResponseSize set, and the caller
	// reads the answer with ReadResponse once it has room for it (see
	// ResponseReader). Zero, and a store without ResponseReader, return
	// every answer whole.
	InlineResponse int
}

// CompleteParams are the arguments of Store.Complete and of the drivers'
// CompleteTx.
type CompleteParams struct {
	Key      Key
	Token    string
	Response *Response
	// Retention is how long the completed record is kept, from the store's
	// now. Zero or less makes it purgeable at once.
	Retention time.Duration
}

// ReleaseParams are the arguments of Store.Release.
type ReleaseParams struct {
	Key   Key
	Token string
	// IfExpired releases the record only if its lease expired by the
	// store's clock, in the same statement, for recovery: a holder whose
	// heartbeat extended the lease first keeps it.
	IfExpired bool
}

// EscalateParams are the arguments of Store.Escalate.
type EscalateParams struct {
	Key    Key
	Token  string
	Reason string
	// IfExpired escalates the record only if its lease expired by the
	// store's clock (see ReleaseParams.IfExpired).
	IfExpired bool
}

// ExtendParams are the arguments of Store.Extend.
type ExtendParams struct {
	Key   Key
	Token string
	// Lease is the new lease, from the store's now.
	Lease time.Duration
}

// TakeoverParams are the arguments of Store.Takeover.
type TakeoverParams struct {
	Key      Key
	OldToken string
	NewToken string
	// Lease is the new holder's lease, from the store's now.
	Lease time.Duration
}

// ResolveAction says how Store.Resolve settles a record.
type ResolveAction int

const (
	// ResolveComplete stores the given response and completes the record.
	ResolveComplete ResolveAction = iota + 1
	// ResolveRelease deletes the record so a retry runs the operation again.
	ResolveRelease
)

// ResolveParams are the arguments of Store.Resolve.
type ResolveParams struct {
	Key    Key
	Action ResolveAction
	// Token, when not empty, fences the resolution to one attempt: the
	// record must still carry this token, the one it was escalated under.
	// A verdict about an earlier attempt (a resolver that was slow, an
	// operator looking at a stale page) must not settle a later attempt
	// that went to review under its own token. Empty settles whatever
	// attempt is in review.
	Token string
	// Response is required with ResolveComplete.
	Response *Response
	// Reason, when not empty, replaces the reason the record was escalated
	// with (for instance with how it was settled, and by whom); an empty
	// Reason keeps it.
	Reason string
	// Retention is how long a completed record is kept, from the store's
	// now (ResolveComplete only).
	Retention time.Duration
}

// DeleteParams are the arguments of Store.Delete.
type DeleteParams struct {
	Key Key
	// Token, when not empty, fences the deletion to one answer: the
	// record must still carry this token, the one it was completed under
	// (a completed record keeps the token of the lease that completed it,
	// or of the attempt a Resolve completed). An operator who looked at
	// one answer must not delete a later one, stored for the same key
	// after the first was deleted or purged: the next request would run
	// the operation again. Empty deletes whatever answer is stored.
	Token string
}

// ListParams are the arguments of Store.List. The fields after Operation
// search, and only stores whose Capabilities include Search implement
// them. Filters combine: a record is listed when it passes every one.
type ListParams struct {
	// State filters by state; empty means all states.
	State State
	// Operation filters by operation, exactly; empty means all.
	Operation string
	// Key selects the records whose key is exactly Key, byte for byte, in
	// every scope and operation; empty means all. A key no record can
	// have (too long, holding NUL or invalid UTF-8) finds none.
	Key string
	// KeyPrefix selects the records whose key starts with KeyPrefix, byte
	// for byte (no wildcard: '%' and '_' are characters); empty means all.
	KeyPrefix string
	// ScopeLabels selects the records whose ScopeLabelIndex of their
	// ScopeLabel is one of these (at most MaxScopeLabels): a label in
	// clear, or the digests of a sealed one (LabelSealer's
	// ScopeLabelIndexes). A sealed label is found by its exact value
	// only, never by a prefix. Empty means all.
	ScopeLabels []string
	// OlderThan, when positive, selects the records created at least
	// OlderThan before the store's now (CreatedAt <= now - OlderThan).
	OlderThan time.Duration
	// Reason selects the records whose reason contains Reason, ignoring
	// the case of ASCII letters; empty means all. It filters what the
	// other fields select, without an index: combine it with State.
	Reason string
	// Order is the order of the listing. Defaults to OrderKey.
	Order Order
	// Cursor continues a previous listing; empty starts at the beginning.
	Cursor string
	// Limit is the page size, as PageLimit reads it: zero or less means
	// 100, and stores cap it at 1000.
	Limit int
}

// ListPage is one page of Store.List.
type ListPage struct {
	Records    []*Record
	NextCursor string
}

// PurgeParams are the arguments of Store.Purge.
type PurgeParams struct {
	// BatchSize bounds the records deleted by one statement. Zero means 500.
	BatchSize int
	// Progress, when set, is called after every batch that deleted
	// records, with the number deleted so far by this call, so that a long
	// purge can report as it goes. It runs on the purging goroutine.
	Progress func(deleted int)
}

// Report calls p.Progress, if set, with the running total after a batch
// that deleted n records.
func (p PurgeParams) Report(n, total int) {
	if n > 0 && p.Progress != nil {
		p.Progress(total)
	}
}

// Normalize fills the defaults of p.
func (p ListParams) Normalize() ListParams {
	p.Limit = PageLimit(p.Limit)
	return p
}

// PageLimit is the contract's rule for the limit of List and
// ListExpiredLeases: zero or less means 100, more than 1000 means 1000.
func PageLimit(limit int) int {
	switch {
	case limit <= 0:
		return 100
	case limit > 1000:
		return 1000
	}
	return limit
}

// Normalize fills the defaults of p.
func (p PurgeParams) Normalize() PurgeParams {
	if p.BatchSize <= 0 {
		p.BatchSize = 500
	}
	return p
}

// TxLease is what a driver's CompleteTx needs from a lease. The engine's
// *idem.Lease implements it; drivers call PrepareTxComplete, run the fenced
// update inside the caller's transaction, and return ErrLeaseLost when it
// matched no row.
type TxLease interface {
	// PrepareTxComplete turns resp into the fenced completion to apply
	// (stripping unstorable headers, applying the size limit, setting the
	// retention) and notes that the lease is being completed in a
	// transaction.
	PrepareTxComplete(resp *Response) (CompleteParams, error)
}

// MaxReserveAttempts bounds Reserve's insert-then-read loop when a conflicting
// record vanishes between the two steps.
const MaxReserveAttempts = 5
