package idem

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/lograte"
	"github.com/idem-dev/idem/internal/replaygate"
)

// EngineConfig configures an Engine. The zero value is usable.
type EngineConfig struct {
	// Lease is how long a reservation holds before another request may
	// decide its holder died. Holders renew it with Lease.Extend while they
	// work. Defaults to 30s.
	Lease time.Duration

	// Retention is how long a completed record is kept and replayed.
	// Defaults to 24h.
	Retention time.Duration

	// MaxResponseBody is the largest response body that is stored for
	// replay, in bytes. A larger answer completes the record as not
	// replayable: the operation never runs again, and retries are told the
	// answer was not kept. Defaults to 1 MiB; a negative value means no limit.
	MaxResponseBody int

	// PollInterval is the first pause of Begin's bounded wait for an
	// in-flight key; it doubles up to MaxPollInterval. Stores that notify
	// wake waiters sooner. Defaults to 10ms.
	PollInterval time.Duration

	// MaxPollInterval caps the pause between polls. Defaults to 250ms.
	MaxPollInterval time.Duration

	// SettleTimeout bounds how long Complete, Release and Escalate keep
	// trying when the store fails with a transient error (a blip, a lost
	// connection, a serialization failure). They run detached from the
	// caller's context, so that a client hanging up never cancels the write
	// that records what happened; this is their only bound. Defaults to 10s.
	SettleTimeout time.Duration

	// OnReview, if set, is called each time the engine moves a key to
	// needs_review (an escalated lease, an expired lease of an external
	// operation, recovery), with the reason: the place to alert an
	// operator. It runs on the goroutine that escalated, after the store
	// recorded it. The engine itself logs one warn line per such key,
	// "idem: key needs review", with the key, its scope, operation and
	// digest, its admin id and the reason: OnReview need not log it again.
	OnReview func(ctx context.Context, key Key, reason string)

	// Now is the local clock, used for local durations only (how long a
	// waiting duplicate waits). Whether a lease has expired is always
	// decided by the store's clock. Defaults to time.Now.
	Now func() time.Time

	// Logger receives the engine's structured logs. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// Sealer, if set, encrypts what records keep of clients' data before
	// it reaches the store (every answer's headers and body; the query and
	// body of Request.Info), and decrypts it when records are read back, on
	// every path: Complete, a store's CompleteTx, resolutions, replays,
	// CheckTx, Get, Recover. idemseal.Keyring implements it with
	// AES-256-GCM. A record that does not open is never replayed as it is,
	// nor run again: Begin and Get return ErrSealed. Records stored before
	// a Sealer was set stay readable. Defaults to nil: stored in clear.
	Sealer idemstore.Sealer

	// TracerProvider, if set, traces every store call as a span (a child
	// of the span in the caller's context, such as the middleware's):
	// idem.store.reserve, idem.store.complete, … Defaults to nil: no spans,
	// and no cost.
	TracerProvider trace.TracerProvider
}

func (c EngineConfig) withDefaults() EngineConfig {
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.Retention == 0 {
		c.Retention = 24 * time.Hour
	}
	if c.MaxResponseBody == 0 {
		c.MaxResponseBody = 1 << 20
	}
	if c.PollInterval == 0 {
		c.PollInterval = 10 * time.Millisecond
	}
	if c.MaxPollInterval == 0 {
		c.MaxPollInterval = 250 * time.Millisecond
	}
	if c.SettleTimeout == 0 {
		c.SettleTimeout = 10 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c EngineConfig) validate() error {
	switch {
	case c.Lease < time.Millisecond:
		return fmt.Errorf("idem: EngineConfig.Lease %v is too short", c.Lease)
	case c.Retention < time.Second:
		return fmt.Errorf("idem: EngineConfig.Retention %v is too short", c.Retention)
	case c.SettleTimeout < time.Millisecond:
		return fmt.Errorf("idem: EngineConfig.SettleTimeout %v is too short", c.SettleTimeout)
	case c.PollInterval < 0 || c.MaxPollInterval < c.PollInterval:
		return fmt.Errorf("idem: EngineConfig.PollInterval %v must be positive and at most MaxPollInterval %v", c.PollInterval, c.MaxPollInterval)
	}
	return nil
}

// Engine runs the idempotency protocol over a store. It is safe for
// concurrent use; create one per store and share it.
type Engine struct {
	store    idemstore.Store // traced when cfg.TracerProvider is set
	given    idemstore.Store // as passed to NewEngine
	notifier idemstore.Notifier
	cfg      EngineConfig

	tokenPrefix uint64
	tokenSeq    atomic.Uint64
	hb          heartbeat
	// orphanTimeout bounds the release of a failed Reserve's reservation
	// (defaultOrphanTimeout; tests under load set it longer).
	orphanTimeout time.Duration

	resolveMu     sync.Mutex
	resolveCursor string // where Recover's next resolver pass starts

	storeDown lograte.Limiter // logStoreDown's lines
}

// NewEngine returns an engine over store. It fails on a nil store or an
// invalid configuration.
func NewEngine(store idemstore.Store, cfg EngineConfig) (*Engine, error) {
	if store == nil {
		return nil, errors.New("idem: NewEngine needs a store")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{store: store, given: store, cfg: cfg, orphanTimeout: defaultOrphanTimeout}
	e.storeDown = lograte.Limiter{Every: storeDownEvery, Now: cfg.Now}
	if cfg.TracerProvider != nil {
		e.store = traceStore(store, cfg.TracerProvider.Tracer(tracerName))
	}
	e.hb.e, e.hb.linger = e, heartbeatLinger
	if n, ok := store.(idemstore.Notifier); ok && store.Capabilities().Notify {
		e.notifier = n
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("idem: seeding lease tokens: %w", err)
	}
	e.tokenPrefix = binary.LittleEndian.Uint64(seed[:])
	return e, nil
}

// Store returns the engine's store, as passed to NewEngine.
func (e *Engine) Store() idemstore.Store { return e.given }

// Config returns the engine's configuration, defaults filled in.
func (e *Engine) Config() EngineConfig { return e.cfg }

// newToken returns a fencing token unique across processes: a random
// per-engine prefix and a counter.
func (e *Engine) newToken() string {
	var b [32]byte
	binary.BigEndian.PutUint64(b[16:], e.tokenPrefix)
	binary.BigEndian.PutUint64(b[24:], e.tokenSeq.Add(1))
	const hx = "0123456789abcdef"
	for i := 0; i < 16; i++ {
		v := b[16+i]
		b[2*i], b[2*i+1] = hx[v>>4], hx[v&0xf]
	}
	return string(b[:])
}

// Kind says what a retry may assume when a holder's lease expired.
type Kind int

const (
	// External operations act outside the store (a payment provider, an
	// email service): their effect may have happened even though the record
	// is still pending. An expired lease is never taken over blindly; the
	// record goes to needs_review for a Resolver or a human. This is the zero
	// value, because it is the one that never runs an operation twice.
	External Kind = iota
	// Transactional operations commit their effect together with the stored
	// answer (CompleteTx). A pending record whose lease expired means the
	// effect never committed, so a retry may take the key over.
	Transactional
)

// String returns "external" or "transactional".
func (k Kind) String() string {
	switch k {
	case External:
		return "external"
	case Transactional:
		return "transactional"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Request is one attempt at an operation.
type Request struct {
	Key Key
	// Fingerprint is the request's meaning (see Fingerprint). A retry with
	// the same key and another fingerprint is a Mismatch.
	Fingerprint string
	// FingerprintSource, if set, is what Fingerprint was made of. A record
	// whose fingerprint an earlier version of the algorithm made is then
	// compared by that version (see FingerprintSource.MatchesEarlier), so
	// that a retry across an upgrade of idem is not a Mismatch. Without it,
	// such a record is a Mismatch.
	FingerprintSource *FingerprintSource
	// Kind decides what happens to an expired lease. Defaults to External.
	Kind Kind
	// Lease overrides EngineConfig.Lease for this operation when positive.
	Lease time.Duration
	// Retention overrides EngineConfig.Retention for this operation when
	// positive.
	Retention time.Duration
	// Wait, when positive, makes Begin wait up to this long for an
	// in-flight duplicate to finish, and then replay its answer (or acquire
	// the key, if it was released). Zero answers InFlight at once.
	Wait time.Duration
	// Info, when set, is kept on the record for operators and resolvers:
	// what was asked (method, path, query, and the body where a route
	// allows it).
	Info *idemstore.Request
	// ScopeLabel, when set, is kept on a new record for operators: a
	// label that tells them whose key it is (an account or user ID the
	// caller trusts), which they can search by and read, since a keyed
	// scope cannot be read. It never decides anything, isolation least of
	// all: Key.Scope does. It is cleaned (idemstore.CleanScopeLabel: no
	// control characters, at most idemstore.MaxScopeLabelLength bytes)
	// and sealed with EngineConfig.Sealer; a Sealer that cannot seal
	// labels (idemstore.LabelSealer) drops it. Keep secrets and personal
	// data out of it: operators see it for the record's whole retention.
	ScopeLabel string

	// replays, when set (by the middleware, from the request's context),
	// bounds the stored answers read at once (see readReplay).
	replays replaygate.Gate
}

func (r *Request) leaseDuration(e *Engine) time.Duration {
	if r.Lease > 0 {
		return r.Lease
	}
	return e.cfg.Lease
}

func (r *Request) retention(e *Engine) time.Duration {
	if r.Retention > 0 {
		return r.Retention
	}
	return e.cfg.Retention
}

// Outcome is what Begin decided.
type Outcome int

// The outcomes of Begin.
const (
	// Acquired: this caller holds the key and must run the operation, then
	// Complete, Release or Escalate its Lease.
	Acquired Outcome = iota + 1
	// Replayed: the operation already completed; Result.Response is its
	// answer. Response.NotReplayable says when the answer was not kept.
	Replayed
	// Mismatch: the key was used with a different request (HTTP 422).
	Mismatch
	// InFlight: another caller holds the key and is still working (HTTP 409
	// with Result.RetryAfter).
	InFlight
	// NeedsReview: the outcome of an earlier attempt is unknown and waits for
	// a resolver or an operator (HTTP 409).
	NeedsReview
)

var outcomeNames = [...]string{"", "acquired", "replayed", "mismatch", "in_flight", "needs_review"}

// String returns the outcome's lower-case name, as used in logs and metrics.
func (o Outcome) String() string {
	if o > 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Result is what Begin returns.
type Result struct {
	Outcome Outcome
	// Lease is set when Outcome is Acquired.
	Lease *Lease
	// Response is set when Outcome is Replayed.
	Response *Response
	// RetryAfter is set when Outcome is InFlight: about as long as the
	// first request has been running, at least one second and at most until
	// its lease runs out.
	RetryAfter time.Duration
	// Record is the existing record for every outcome but Acquired.
	Record *idemstore.Record
	// TookOver reports, with Acquired, that an expired lease of a
	// transactional operation was taken over.
	TookOver bool

	// held is what a Replayed result holds of its request's replay gate
	// (readReplay), for the middleware to give back.
	held int64
	gate replaygate.Gate
}

// maxBeginRounds bounds Begin's loop when records change under it (released
// between the insert and the read, taken over concurrently).
const maxBeginRounds = 8

// Begin reserves req.Key, or reports why it cannot: the stored answer, a
// mismatch, a holder still at work, or a record that needs review.
//
// Only one caller can ever get Acquired for a key until it is released. A
// store error is returned as is (it wraps idemstore.ErrUnavailable when the
// store cannot be reached); Begin never reports Acquired on an error. The
// record of every other outcome is opened (see EngineConfig.Sealer); one
// that does not open is ErrSealed.
func (e *Engine) Begin(ctx context.Context, req Request) (Result, error) {
	if err := ValidateKey(req.Key.Key); err != nil {
		return Result{}, err
	}
	if err := checkKeyLengths(req.Key); err != nil {
		return Result{}, err
	}
	if err := checkScope(req.Key.Scope); err != nil {
		return Result{}, err
	}
	info, err := e.sealRequest(req.Key, req.Info)
	if err != nil {
		return Result{}, err
	}
	req.Info = info
	req.ScopeLabel = e.sealLabel(ctx, req.Key, req.ScopeLabel)
	var deadline time.Time
	if req.Wait > 0 {
		deadline = e.cfg.Now().Add(req.Wait)
	}
	var w *waiter
	defer func() {
		if w != nil {
			w.close()
		}
	}()
	for {
		res, err := e.try(ctx, req)
		if err != nil || res.Outcome != InFlight || req.Wait <= 0 {
			return e.opened(ctx, res, err)
		}
		if w == nil {
			w = e.newWaiter(ctx, req.Key)
		}
		// Wait until the record leaves the state we saw, then classify
		// again: a completed record replays, a released one may be ours.
		rec, err := w.waitChange(ctx, res.Record, deadline)
		if err != nil {
			return Result{}, err
		}
		if rec != nil {
			return e.opened(ctx, inFlight(rec), nil) // still in flight when the wait ran out
		}
	}
}

// try is one reservation attempt and the classification of what it found.
func (e *Engine) try(ctx context.Context, req Request) (Result, error) {
	for round := 0; round < maxBeginRounds; round++ {
		start := e.cfg.Now()
		token := e.newToken()
		d := req.leaseDuration(e)
		rec, created, err := e.store.Reserve(ctx, idemstore.ReserveParams{
			Key:         req.Key,
			Fingerprint: req.Fingerprint,
			Token:       token,
			Lease:       d,
			Request:     req.Info,
			ScopeLabel:  req.ScopeLabel,
			// Large answers are read once the replay gate admits them.
			InlineResponse: req.inlineResponse(),
		})
		if err != nil {
			// The insert may have committed before the error (a lost reply,
			// a context cancelled after the commit): release what may be
			// ours, so no reservation is left without an owner. A store
			// that was full wrote nothing.
			if !errors.Is(err, idemstore.ErrFull) {
				e.releaseOrphan(ctx, req.Key, token)
			}
			return Result{}, err
		}
		if created {
			return Result{Outcome: Acquired, Lease: e.newLease(req, token, start.Add(d))}, nil
		}
		res, retry, err := e.classify(ctx, req, rec)
		if err == nil && res.Outcome == Replayed && rec.ResponseSize > 0 {
			res, retry, err = e.readReplay(ctx, req, res)
		}
		if err != nil || !retry {
			return res, err
		}
	}
	return Result{}, fmt.Errorf("idem: key kept changing during Begin: %w", idemstore.ErrRetryable)
}

// classify decides what an existing record means for req. retry is true
// when the record changed under us and the reservation should be tried
// again. Lease expiry is judged on the store's clock (rec.ReadAt), and
// acted on only through store operations that check it again.
func (e *Engine) classify(ctx context.Context, req Request, rec *idemstore.Record) (res Result, retry bool, err error) {
	if rec.Fingerprint != req.Fingerprint && !req.FingerprintSource.MatchesEarlier(rec.Fingerprint) {
		return Result{Outcome: Mismatch, Record: rec}, false, nil
	}
	switch rec.State {
	case idemstore.StateCompleted:
		return Result{Outcome: Replayed, Response: rec.Response, Record: rec}, false, nil
	case idemstore.StateNeedsReview:
		return Result{Outcome: NeedsReview, Record: rec}, false, nil
	case idemstore.StatePending:
	default:
		return Result{}, false, fmt.Errorf("idem: record in unknown state %q", rec.State)
	}
	if !rec.LeaseExpired() {
		return inFlight(rec), false, nil
	}
	// The holder's lease expired by the store's clock. What follows is
	// fenced by the holder's token and checks the expiry again: a
	// heartbeat that landed first wins, and we classify again.
	if req.Kind == Transactional {
		start := e.cfg.Now()
		token := e.newToken()
		d := req.leaseDuration(e)
		err := e.store.Takeover(ctx, idemstore.TakeoverParams{Key: req.Key, OldToken: rec.Token, NewToken: token, Lease: d})
		switch {
		case err == nil:
			e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: took over an expired lease",
				digestAttr(req.Key), slog.Time("lease_until", rec.LeaseUntil))
			return Result{Outcome: Acquired, Lease: e.newLease(req, token, start.Add(d)), TookOver: true}, false, nil
		case errors.Is(err, idemstore.ErrLeaseLost):
			return Result{}, true, nil
		default:
			e.releaseOrphan(ctx, req.Key, token) // the takeover may have gone through
			return Result{}, false, err
		}
	}
	reason := "lease expired at " + rec.LeaseUntil.UTC().Format(time.RFC3339Nano) + " with the outcome of an external operation unknown"
	err = e.store.Escalate(ctx, idemstore.EscalateParams{Key: req.Key, Token: rec.Token, Reason: reason, IfExpired: true})
	if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) && e.escalatedUnder(ctx, req.Key, rec.Token) {
		err = nil // applied; the reply was lost
	}
	switch {
	case err == nil:
		e.reviewed(ctx, req.Key, reason)
		rec.State, rec.Reason = idemstore.StateNeedsReview, reason
		return Result{Outcome: NeedsReview, Record: rec}, false, nil
	case errors.Is(err, idemstore.ErrLeaseLost):
		return Result{}, true, nil
	default:
		return Result{}, false, err
	}
}

// reviewed logs that key went to needs_review, on the one line that
// carries the key itself (see KeyDigest), and tells OnReview.
func (e *Engine) reviewed(ctx context.Context, key Key, reason string) {
	e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: key needs review",
		append(reviewAttrs(key), slog.String("reason", reason))...)
	if e.cfg.OnReview != nil {
		e.cfg.OnReview(ctx, key, reason)
	}
}

// inFlight is the InFlight result for rec, a pending record whose lease is
// alive. It suggests a retry after about as long as the first request has
// been running (a quick operation is retried soon, a slow one less often),
// at least a second and at most until its lease would run out, all measured
// on the store's clock.
func inFlight(rec *idemstore.Record) Result {
	ra := rec.ReadAt.Sub(rec.CreatedAt)
	if left := rec.LeaseUntil.Sub(rec.ReadAt); ra > left {
		ra = left
	}
	ra = ra.Round(time.Second)
	if ra < time.Second {
		ra = time.Second
	}
	return Result{Outcome: InFlight, RetryAfter: ra, Record: rec}
}

// Get returns the record for key, opened (see EngineConfig.Sealer), or an
// error wrapping idemstore.ErrNotFound, or ErrSealed.
func (e *Engine) Get(ctx context.Context, key Key) (*idemstore.Record, error) {
	rec, err := e.store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	if err := e.open(ctx, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// Head returns the record for key as Get does, but with a stored answer
// longer than a few KiB left out (its Response nil and its ResponseSize
// set) when the store can (idemstore.HeadReader): for a caller that asks
// whether a key was used, or in what state, without holding its answer.
func (e *Engine) Head(ctx context.Context, key Key) (*idemstore.Record, error) {
	rec, err := idemstore.GetHead(ctx, e.store, key, inlineResponse)
	if err != nil {
		return nil, err
	}
	if err := e.open(ctx, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// Purge deletes completed records whose retention ended by the store's
// clock, in batches of batchSize (0 means the store's default), and reports
// how many it deleted.
func (e *Engine) Purge(ctx context.Context, batchSize int) (int, error) {
	return e.store.Purge(ctx, idemstore.PurgeParams{BatchSize: batchSize})
}
