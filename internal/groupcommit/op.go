package groupcommit

import (
	"bytes"
	"cmp"
	"context"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Kind is the store call an Op stands for.
type Kind uint8

// The calls a Batcher takes. Takeover, Resolve, Delete, the IfExpired
// variants of Release and Escalate, and reads are rare or need a
// transaction of their own, and stay unbatched.
const (
	Reserve Kind = iota + 1
	Complete
	Release
	Escalate
	Extend
)

// String names the kind of call, for logs and errors.
func (k Kind) String() string {
	switch k {
	case Reserve:
		return "reserve"
	case Complete:
		return "complete"
	case Release:
		return "release"
	case Escalate:
		return "escalate"
	case Extend:
		return "extend"
	}
	return "unknown"
}

// Op is one store call: its arguments, which the caller fills, and its
// outcome, which Single or Batch sets.
type Op struct {
	Kind  Kind
	Key   idemstore.Key
	Token string
	// Fingerprint, Request and ScopeLabel: Reserve.
	Fingerprint string
	Request     *idemstore.Request
	ScopeLabel  string
	// InlineResponse: Reserve (idemstore.ReserveParams.InlineResponse).
	InlineResponse int
	// Lease: Reserve and Extend.
	Lease time.Duration
	// Response and Retention: Complete.
	Response  *idemstore.Response
	Retention time.Duration
	// Reason: Escalate.
	Reason string

	// Record and Created are Reserve's outcome: the existing record
	// (created false) or none (created true).
	Record  *idemstore.Record
	Created bool
	// Err is the call's own error (idemstore.ErrLeaseLost for a fenced
	// change that matched nothing), or the failed batch's.
	Err error

	// Set by Batcher.Do, guarded by the shard's mutex.
	ctx   context.Context
	done  chan struct{}
	state opState
	alone bool
}

type opState uint8

const (
	queued    opState = iota
	taken             // in a batch that runs
	abandoned         // its caller left before its batch was taken
	left              // its caller left while its batch ran
	finished          // its batch is over and its outcome set
)

// ReserveOp returns the Op of Store.Reserve(p).
func ReserveOp(p idemstore.ReserveParams) *Op {
	return &Op{Kind: Reserve, Key: p.Key, Token: p.Token, Fingerprint: p.Fingerprint, Lease: p.Lease, Request: p.Request, ScopeLabel: p.ScopeLabel, InlineResponse: p.InlineResponse}
}

// CompleteOp returns the Op of Store.Complete(p).
func CompleteOp(p idemstore.CompleteParams) *Op {
	return &Op{Kind: Complete, Key: p.Key, Token: p.Token, Response: p.Response, Retention: p.Retention}
}

// ReleaseOp returns the Op of Store.Release(p), which must not have
// IfExpired set.
func ReleaseOp(p idemstore.ReleaseParams) *Op {
	return &Op{Kind: Release, Key: p.Key, Token: p.Token}
}

// EscalateOp returns the Op of Store.Escalate(p), which must not have
// IfExpired set.
func EscalateOp(p idemstore.EscalateParams) *Op {
	return &Op{Kind: Escalate, Key: p.Key, Token: p.Token, Reason: p.Reason}
}

// ExtendOp returns the Op of Store.Extend(p).
func ExtendOp(p idemstore.ExtendParams) *Op {
	return &Op{Kind: Extend, Key: p.Key, Token: p.Token, Lease: p.Lease}
}

// CompareKeys orders keys by scope, operation, then key: the order a batch
// runs its calls in, so that concurrent batches (from other processes, or
// other shards) lock rows in one order. A store whose statements go by kind
// of call first (one for the Completes, one for the Releases, …) can still
// take two batches' rows in opposite orders; idemmysql runs a batch that a
// deadlock rolled back again, locking in key order.
func CompareKeys(a, b idemstore.Key) int {
	if c := cmp.Compare(a.Scope, b.Scope); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Operation, b.Operation); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// ReserveParams returns the arguments of the Reserve op stands for.
func (op *Op) ReserveParams() idemstore.ReserveParams {
	return idemstore.ReserveParams{Key: op.Key, Fingerprint: op.Fingerprint, Token: op.Token, Lease: op.Lease, Request: op.Request, ScopeLabel: op.ScopeLabel, InlineResponse: op.InlineResponse}
}

// CompleteParams returns the arguments of the Complete op stands for.
func (op *Op) CompleteParams() idemstore.CompleteParams {
	return idemstore.CompleteParams{Key: op.Key, Token: op.Token, Response: op.Response, Retention: op.Retention}
}

// own gives op copies of its caller's Request and Response. A queued call
// can be left by its caller (its context ended) while its batch runs and
// still reads them, and the caller may by then reuse their memory (the
// middleware pools request bodies, captured answers and header maps).
func (op *Op) own() {
	if r := op.Request; r != nil {
		c := *r
		c.Body = bytes.Clone(r.Body)
		op.Request = &c
	}
	if r := op.Response; r != nil {
		c := *r
		c.Header = r.Header.Clone()
		c.Body = bytes.Clone(r.Body)
		op.Response = &c
	}
}

// ReleaseParams returns the arguments of the Release op stands for.
func (op *Op) ReleaseParams() idemstore.ReleaseParams {
	return idemstore.ReleaseParams{Key: op.Key, Token: op.Token}
}

// EscalateParams returns the arguments of the Escalate op stands for.
func (op *Op) EscalateParams() idemstore.EscalateParams {
	return idemstore.EscalateParams{Key: op.Key, Token: op.Token, Reason: op.Reason}
}

// ExtendParams returns the arguments of the Extend op stands for.
func (op *Op) ExtendParams() idemstore.ExtendParams {
	return idemstore.ExtendParams{Key: op.Key, Token: op.Token, Lease: op.Lease}
}

// Rounds splits ops, sorted by key as Batch receives them, into rounds in
// which every key appears at most once: round i holds the i-th call of each
// key. Running the rounds one after another keeps each key's calls in
// order, while the calls of one round, all on different keys, may be sent
// together in multi-row statements.
func Rounds(ops []*Op) [][]*Op {
	var rounds [][]*Op
	for i := 0; i < len(ops); {
		j := i + 1
		for j < len(ops) && ops[j].Key == ops[i].Key {
			j++
		}
		for r, op := range ops[i:j] {
			if r == len(rounds) {
				rounds = append(rounds, nil)
			}
			rounds[r] = append(rounds[r], op)
		}
		i = j
	}
	return rounds
}

// Calls are a store's calls as it makes them alone, one per kind of Op.
type Calls struct {
	Reserve  func(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error)
	Complete func(context.Context, idemstore.CompleteParams) error
	Release  func(context.Context, idemstore.ReleaseParams) error
	Escalate func(context.Context, idemstore.EscalateParams) error
	Extend   func(context.Context, idemstore.ExtendParams) error
}

// Run makes the call op stands for and sets its outcome: a Config.Single.
func (c Calls) Run(ctx context.Context, op *Op) {
	switch op.Kind {
	case Reserve:
		op.Record, op.Created, op.Err = c.Reserve(ctx, op.ReserveParams())
	case Complete:
		op.Err = c.Complete(ctx, op.CompleteParams())
	case Release:
		op.Err = c.Release(ctx, op.ReleaseParams())
	case Escalate:
		op.Err = c.Escalate(ctx, op.EscalateParams())
	case Extend:
		op.Err = c.Extend(ctx, op.ExtendParams())
	}
}

// Chunks cuts ops, in order, into runs of at most maxOps calls (no bound
// when maxOps is 0) whose sizes add up to at most maxBytes, except that a
// run holds one call at least, however large: what a store sends as one
// multi-row statement. size may be nil, when only maxOps bounds a run.
func Chunks(ops []*Op, maxOps, maxBytes int, size func(*Op) int) [][]*Op {
	var out [][]*Op
	start, bytes := 0, 0
	for i, op := range ops {
		n := 0
		if size != nil {
			n = size(op)
		}
		if i > start && (i-start == maxOps || bytes+n > maxBytes) {
			out = append(out, ops[start:i])
			start, bytes = i, 0
		}
		bytes += n
	}
	if start < len(ops) {
		out = append(out, ops[start:])
	}
	return out
}
