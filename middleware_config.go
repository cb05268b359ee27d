package idem

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/internal/urlpath"
)

// ScopeFunc says whose key a request carries: a user ID, a tenant, a hash
// of the credential. Keys are unique per scope, so one client can never
// read another's answer. Return a *ScopeError to choose the status (401 or
// 403); any other error answers 401. An empty scope (or one of white space
// only) is a missing one: the request is answered as for ErrScopeMissing.
type ScopeFunc func(*http.Request) (string, error)

// GlobalScopeName is the scope GlobalScope gives every request. A job run
// by Do or DoTx shares one scope by naming one in its Key, such as this;
// an empty Key.Scope is refused with ErrScopeMissing.
const GlobalScopeName = "global"

// GlobalScope puts every request in one scope, GlobalScopeName. Choose it
// only when the service has a single client, or when keys are unguessable
// and answers hold nothing private: any client that knows a key gets its
// answer.
func GlobalScope(*http.Request) (string, error) { return GlobalScopeName, nil }

// ErrScopeMissing is returned by a ScopeFunc when the request carries none
// of the credentials its scope is derived from. The middleware answers 401
// with the scope-missing problem type and runs nothing: such requests must
// not share one scope, where one client's key would replay another's answer.
// A ScopeFunc that returns an empty scope gets the same answer, and
// Engine.Begin (so Do and DoTx too) returns an error wrapping it for a Key
// whose Scope is empty or white space only: sharing one scope is chosen by
// naming it (GlobalScope, GlobalScopeName), never by leaving it out.
var ErrScopeMissing = errors.New("idem: the request carries no credentials to scope its key")

// ScopeError is returned by a ScopeFunc to refuse a request.
type ScopeError struct {
	// Status is the HTTP status to answer: 401 or 403. Defaults to 401.
	Status int
	// Detail is shown to the client.
	Detail string
}

// Error describes the refusal.
func (e *ScopeError) Error() string { return "idem: scope refused: " + e.Detail }

// Policy is how a route is protected.
type Policy struct {
	// Disabled leaves the route unprotected.
	Disabled bool
	// KeyOptional lets a request without an Idempotency-Key through,
	// unprotected, instead of answering 400.
	KeyOptional bool
	// Observe runs the route in observe mode: every request reaches the
	// handler and every answer is the handler's, but keys are still
	// reserved and completed, and Event.Finding says what enforcement would
	// have done instead (see FindingMissingKey and the other findings).
	// Defaults to false: enforce.
	Observe bool
	// Kind decides what an expired lease means (see Kind). Defaults to
	// External. Choose Transactional for handlers that complete with a
	// store's CompleteTx inside their business transaction.
	Kind Kind
	// ExcludeFields are JSON Pointers of body members left out of the
	// fingerprint. Defaults to none.
	ExcludeFields []string
	// IncludeFields, if set, are the only JSON Pointers of body members
	// that count in the fingerprint (ExcludeFields still apply under them).
	// They apply, as ExcludeFields do, to bodies with a JSON Content-Type.
	// Defaults to none: the whole body counts.
	IncludeFields []string
	// KeepHeaders, if set, are the only headers of the handler's answer that
	// are stored and replayed, besides Content-Type, Content-Encoding and
	// Vary, which are always kept: without them the stored body cannot be
	// read, nor a retry's negotiation checked.
	// Headers that are never stored (Set-Cookie, Date, hop-by-hop headers,
	// credentials) cannot be kept. Defaults to every header but those.
	KeepHeaders []string
	// DropHeaders are headers of the handler's answer never stored nor
	// replayed, besides those never stored anyway: per-request ones such as
	// X-Request-Id or Server-Timing. Defaults to none.
	DropHeaders []string
	// MaxRequestBody bounds the request body read for the fingerprint;
	// larger requests get 413 and the handler does not run. Defaults to
	// 1 MiB.
	MaxRequestBody int64
	// Wait, when positive, makes a duplicate of an in-flight request wait up
	// to this long and then get the first answer, instead of 409.
	Wait time.Duration
	// Lease overrides EngineConfig.Lease when positive.
	Lease time.Duration
	// Retention overrides EngineConfig.Retention when positive.
	Retention time.Duration
	// BufferFlushes makes a handler's Flush a no-op while its answer is
	// buffered, so that handlers (and reverse proxies) that flush out of
	// habit stay replayable. Server-sent event streams (text/event-stream)
	// still stream. Defaults to false: a Flush streams the answer, which is
	// then recorded as not replayable.
	BufferFlushes bool
	// StoreRequestBody keeps the request body on the record (up to
	// MaxStoredRequestBody bytes), so that an operator settling a key in
	// review sees what was asked. Method, path and query are always kept.
	// Defaults to false: bodies may hold what an operator should not see.
	StoreRequestBody bool
	// ReleaseStatuses are the statuses that mean "nothing happened, try
	// again": the key is released instead of storing the answer. Defaults to
	// 429 and 503; an empty non-nil slice releases on none.
	ReleaseStatuses []int
}

func (p Policy) withDefaults() Policy {
	p.KeepHeaders = canonicalNames(p.KeepHeaders)
	p.DropHeaders = canonicalNames(p.DropHeaders)
	if p.MaxRequestBody == 0 {
		p.MaxRequestBody = 1 << 20
	}
	if p.ReleaseStatuses == nil {
		p.ReleaseStatuses = []int{http.StatusTooManyRequests, http.StatusServiceUnavailable}
	}
	return p
}

// MaxStoredRequestBody is the largest request body Policy.StoreRequestBody
// keeps; a larger one is not kept.
const MaxStoredRequestBody = 64 << 10

// Event describes one protected request, for metrics and audit hooks.
type Event struct {
	Request *http.Request
	// Operation is the record's operation ("POST /payments").
	Operation string
	// Key is the request's Idempotency-Key, when it sent a valid one.
	Key string
	// Scope is the request's scope, once Config.Scope gave one. With
	// Operation and Key it makes KeyDigest, which names the key in logs.
	Scope string
	// Finding is set in observe mode (Policy.Observe) when enforcement
	// would have answered the request itself: FindingMissingKey,
	// FindingWouldReplay, … Outcome is then "observed" and the handler ran
	// unprotected.
	Finding string
	// Outcome is what happened: "acquired", "replayed", "mismatch",
	// "in_flight", "needs_review", "not_replayable", "missing_key",
	// "invalid_key", "scope_denied", "scope_missing", "too_long", "body_too_large", "body_unreadable",
	// "unavailable", "fail_open", "no_key" (an optional key not sent) or
	// "canceled" (the client left while the key was being checked; Status
	// is then 499 and nothing was written), or "observed" (observe mode ran
	// the handler unprotected; see Finding).
	Outcome string
	// Settlement says, after an acquired request, what became of its key:
	// "completed", "completed_tx", "not_replayable", "released",
	// "escalated", "handler" (the handler settled it itself), "lost"
	// (someone else settled it first: the lease was taken over or
	// recovered) or "failed" (the store refused; the key stays pending for
	// recovery).
	Settlement string
	// Status is the HTTP status the client got; 0 when the handler
	// panicked (net/http then drops the connection, unless a recovering
	// middleware outside this one answers).
	Status int
	// Duration is the time spent in the middleware and the handler.
	Duration time.Duration
}

// Config configures Middleware.
type Config struct {
	// Scope says whose key a request carries. Required: NewMiddleware fails
	// without it. Use GlobalScope to choose a single scope deliberately.
	Scope ScopeFunc

	// ScopeLabel, if set, labels each new key for operators: it is called
	// once the request's scope is known, and its result is kept on the
	// record as Request.ScopeLabel (cleaned of control characters and
	// invalid UTF-8, cut to idemstore.MaxScopeLabelLength bytes, sealed
	// with EngineConfig.Sealer). It tells operators whose key it is, which
	// a keyed scope cannot; they see it on the review page and in idem
	// keys, and search by it. It never decides anything: it is not part of
	// the scope nor of the key, a retry with another label is the same key
	// (the record keeps the first request's), and no label fails a
	// request. HeaderScopeLabel reads one from a header. Keep secrets and
	// personal data out of it. Defaults to none.
	ScopeLabel func(*http.Request) string

	// Methods are the protected methods, each a token compared byte for
	// byte. HEAD is protected with GET, and a protected method spelt in
	// another case ("post") is refused with 400, never passed on
	// unprotected (see SituationInvalidMethod). Defaults to POST and PATCH.
	Methods []string

	// Operation names the operation of a request. Defaults to the method and
	// the route pattern (r.Pattern, set by http.ServeMux when the middleware
	// wraps a routed handler), or the method and URL path when there is no
	// pattern.
	//
	// Routers that fill in r.Pattern as they route, such as chi, give the
	// pattern routed so far: with chi, middleware added with With on a route
	// sees the route's pattern ("POST /orders/{id}"), in a subrouter's Use
	// the mount ("POST /v1/*", one operation for every route below it), and
	// on the root router nothing yet (the method and path). Every placement
	// runs a handler at most once per key; they differ only in which
	// requests count as the same operation.
	Operation func(*http.Request) string

	// Policy is the protection of every route not in Routes.
	Policy Policy

	// Routes overrides Policy per operation, keyed by the Operation value
	// ("POST /payments/{id}/refund"). A route's policy replaces the default
	// whole; its zero fields take the defaults.
	Routes map[string]Policy

	// FailOpen runs the handler unprotected when the store cannot be reached,
	// instead of answering 503. Defaults to false (fail closed): without the
	// store, idem cannot promise at-most-once. A key the store was read to
	// have completed, whose answer could not then be read, still gets 503:
	// running it again would be a certain duplicate.
	FailOpen bool

	// OnOutcome, if set, is called once per protected request, after the
	// answer was written.
	OnOutcome func(Event)

	// FingerprintKey, if set, keys request fingerprints with HMAC-SHA-256
	// (see FingerprintOptions.Key), so that a store dump does not let anyone
	// confirm guesses of low-entropy request bodies. Every instance sharing
	// a store needs the same key. Defaults to none (plain SHA-256).
	FingerprintKey []byte

	// ProblemBaseURL, if set, replaces ProblemTypeBase at the start of the
	// type URI of every problem document the middleware writes, so that
	// types point at the operator's API documentation: with
	// "https://api.example.com/errors#", a reused key is
	// "https://api.example.com/errors#key-reused". It must be an absolute
	// URL. Defaults to ProblemTypeBase (docs/problems.md in idem's
	// repository).
	ProblemBaseURL string

	// MaxDecodedReplay bounds the body a coded stored answer (Content-Encoding
	// gzip or deflate) is decoded to for a retry that does not accept its
	// coding: it is decoded as it is written, holding only the decoder's
	// state, but a body that decodes to more (a zip bomb) gets 406
	// not-acceptable, naming the coding to accept. Defaults to
	// DefaultMaxDecodedReplay (16 MiB).
	MaxDecodedReplay int64

	// TracerProvider, if set, makes the middleware start a span per
	// protected request ("idem.request", attributes idem.operation,
	// idem.outcome, idem.settlement, idem.finding and the status), the
	// parent of the engine's store spans (EngineConfig.TracerProvider) and
	// of the handler's. Defaults to nil: no spans, and no cost.
	TracerProvider trace.TracerProvider

	// Logger receives structured logs; keys appear only as short hashes.
	// Defaults to the engine's logger.
	Logger *slog.Logger

	// BodyBudget, if set, bounds the memory that the bodies being read for
	// fingerprints hold at once, charged as their bytes arrive; a body that
	// finds no room left gets 503 busy with Retry-After (see BodyBudget).
	// Share one among the middlewares of a process. idem serve sets one
	// from max_body_memory. Defaults to nil: each body is bounded by its
	// Policy.MaxRequestBody alone.
	BodyBudget *BodyBudget
}

// Middleware returns net/http middleware that makes the protected methods
// safe to retry. It panics on an invalid configuration; use NewMiddleware to
// get the error instead.
func Middleware(e *Engine, cfg Config) func(http.Handler) http.Handler {
	mw, err := NewMiddleware(e, cfg)
	if err != nil {
		panic(err)
	}
	return mw
}

// NewMiddleware is Middleware, returning configuration errors.
func NewMiddleware(e *Engine, cfg Config) (func(http.Handler) http.Handler, error) {
	if e == nil {
		return nil, errors.New("idem: Middleware needs an engine")
	}
	if cfg.Scope == nil {
		return nil, errors.New("idem: Config.Scope is required (use idem.GlobalScope to put every request in one scope deliberately)")
	}
	if err := checkScopeLabel(cfg.ScopeLabel); err != nil {
		return nil, err
	}
	if cfg.Methods == nil {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if err := checkMethods(cfg.Methods); err != nil {
		return nil, err
	}
	if cfg.Operation == nil {
		cfg.Operation = newOpCache().operation // DefaultOperation
	}
	cfg.FingerprintKey = bytes.Clone(cfg.FingerprintKey)
	if err := checkProblemBase(cfg.ProblemBaseURL); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = e.cfg.Logger
	}
	if cfg.MaxDecodedReplay < 0 {
		return nil, fmt.Errorf("idem: Config.MaxDecodedReplay %d is negative", cfg.MaxDecodedReplay)
	}
	if cfg.MaxDecodedReplay == 0 {
		cfg.MaxDecodedReplay = DefaultMaxDecodedReplay
	}
	m := &middleware{e: e, cfg: cfg, policy: cfg.Policy.withDefaults(), maxBody: e.Config().MaxResponseBody, maxDecoded: cfg.MaxDecodedReplay}
	if cfg.TracerProvider != nil {
		m.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	if err := m.policy.validate(); err != nil {
		return nil, err
	}
	if len(cfg.Routes) > 0 {
		m.routes = make(map[string]*Policy, len(cfg.Routes))
		for op, p := range cfg.Routes {
			p = p.withDefaults()
			if err := p.validate(); err != nil {
				return nil, fmt.Errorf("route %q: %w", op, err)
			}
			m.routes[op] = &p
		}
	}
	return func(next http.Handler) http.Handler {
		return &handler{m: m, next: next}
	}, nil
}

func (p Policy) validate() error {
	if p.MaxRequestBody < 0 {
		return fmt.Errorf("idem: Policy.MaxRequestBody %d is negative", p.MaxRequestBody)
	}
	if p.Kind != External && p.Kind != Transactional {
		return fmt.Errorf("idem: Policy.Kind %v is unknown", p.Kind)
	}
	if _, err := parsePointers("excluded", p.ExcludeFields); err != nil {
		return err
	}
	if _, err := parsePointers("included", p.IncludeFields); err != nil {
		return err
	}
	for _, n := range p.KeepHeaders {
		if unstored(n) {
			return fmt.Errorf("idem: Policy.KeepHeaders: %s is never stored", n)
		}
	}
	for _, n := range slices.Concat(p.KeepHeaders, p.DropHeaders) {
		if !validHeaderName(n) {
			return fmt.Errorf("idem: %q is not a header name", n)
		}
	}
	return nil
}

// DefaultOperation is the default Config.Operation: the method and route
// pattern, or the method and path when the request was not routed by a
// pattern. The path is the escaped one, normalised as a server reads it
// (RFC 3986 §6.2.2): escapes of unreserved characters decoded ("/%70ay"
// is "/pay"), runs of '/' merged and dot segments removed, as ServeMux
// does before it routes; %2F stays apart from '/', so that /a%2Fb and /a/b
// differ.
func DefaultOperation(r *http.Request) string {
	if r.Pattern != "" {
		// A pattern may already start with its method ("POST /payments").
		if len(r.Pattern) > len(r.Method) && r.Pattern[len(r.Method)] == ' ' && r.Pattern[:len(r.Method)] == r.Method {
			return r.Pattern
		}
		return r.Method + " " + r.Pattern
	}
	return r.Method + " " + urlpath.Normalize(r.URL.EscapedPath(), urlpath.Options{MergeSlashes: true})
}

type middleware struct {
	e          *Engine // used through its public API only
	cfg        Config
	policy     Policy
	routes     map[string]*Policy
	maxBody    int          // EngineConfig.MaxResponseBody
	maxDecoded int64        // Config.MaxDecodedReplay
	tracer     trace.Tracer // nil: no spans
}

type handler struct {
	m    *middleware
	next http.Handler
}
