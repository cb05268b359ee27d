package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// ScopeFunc says whose key a request carries: a user ID, a tenant, a hash
// of the credential. Keys are unique per scope, so one client can never
// read another's answer. Return a *ScopeError to choose the status (401 or
// 403); any other error answers 401.
type ScopeFunc func(*http.Request) (string, error)

// GlobalScope puts every request in one scope. Choose it only when the
// service has a single client, or when keys are unguessable and answers
// hold nothing private: any client that knows a key gets its answer.
func GlobalScope(*http.Request) (string, error) { return "global", nil }

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
	// Kind decides what an expired lease means (see Kind). Defaults to
	// External. Choose Transactional for handlers that complete with a
	// store's CompleteTx inside their business transaction.
	Kind Kind
	// ExcludeFields are JSON Pointers of body members left out of the
	// fingerprint. Defaults to none.
	ExcludeFields []string
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
	// ReleaseStatuses are the statuses that mean "nothing happened, try
	// again": the key is released instead of storing the answer. Defaults to
	// 429 and 503; an empty non-nil slice releases on none.
	ReleaseStatuses []int
}

func (p Policy) withDefaults() Policy {
	if p.MaxRequestBody == 0 {
		p.MaxRequestBody = 1 << 20
	}
	if p.ReleaseStatuses == nil {
		p.ReleaseStatuses = []int{http.StatusTooManyRequests, http.StatusServiceUnavailable}
	}
	return p
}

// Event describes one protected request, for metrics and audit hooks.
type Event struct {
	Request *http.Request
	// Operation is the record's operation ("POST /payments").
	Operation string
	// Outcome is what happened: "acquired", "replayed", "mismatch",
	// "in_flight", "needs_review", "not_replayable", "missing_key",
	// "invalid_key", "scope_denied", "too_long", "body_too_large", "body_unreadable",
	// "unavailable", "fail_open", "no_key" (an optional key not sent) or
	// "canceled" (the client left while the key was being checked; Status
	// is then 499 and nothing was written).
	Outcome string
	// Settlement says, after an acquired request, what became of its key:
	// "completed", "completed_tx", "not_replayable", "released",
	// "escalated", "handler" (the handler settled it itself) or "failed".
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

	// Methods are the protected methods. Defaults to POST and PATCH.
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
	// store, idem cannot promise at-most-once.
	FailOpen bool

	// OnOutcome, if set, is called once per protected request, after the
	// answer was written.
	OnOutcome func(Event)

	// Logger receives structured logs; keys appear only as short hashes.
	// Defaults to the engine's logger.
	Logger *slog.Logger
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
	if cfg.Methods == nil {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if cfg.Operation == nil {
		cfg.Operation = DefaultOperation
	}
	if cfg.Logger == nil {
		cfg.Logger = e.cfg.Logger
	}
	m := &middleware{e: e, cfg: cfg, policy: cfg.Policy.withDefaults()}
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
	for _, ptr := range p.ExcludeFields {
		if _, err := parsePointer(ptr); err != nil {
			return err
		}
	}
	return nil
}

// DefaultOperation is the default Config.Operation: the method and route
// pattern, or the method and path when the request was not routed by a
// pattern.
func DefaultOperation(r *http.Request) string {
	if r.Pattern != "" {
		// A pattern may already start with its method ("POST /payments").
		if len(r.Pattern) > len(r.Method) && r.Pattern[len(r.Method)] == ' ' && r.Pattern[:len(r.Method)] == r.Method {
			return r.Pattern
		}
		return r.Method + " " + r.Pattern
	}
	return r.Method + " " + r.URL.Path
}

type middleware struct {
	e      *Engine
	cfg    Config
	policy Policy
	routes map[string]*Policy
}

type handler struct {
	m    *middleware
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if !slices.Contains(m.cfg.Methods, r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	op := m.cfg.Operation(r)
	pol := &m.policy
	if p, ok := m.routes[op]; ok {
		pol = p
	}
	if pol.Disabled {
		h.next.ServeHTTP(w, r)
		return
	}
	ev := Event{Request: r, Operation: op}
	if m.cfg.OnOutcome != nil {
		start := time.Now()
		defer func() {
			ev.Duration = time.Since(start)
			m.cfg.OnOutcome(ev)
		}()
	}

	key, err := ParseKeyHeader(r.Header[HeaderName]) // HeaderName is canonical
	if err != nil {
		if errors.Is(err, ErrMissingKey) && pol.KeyOptional {
			ev.Outcome = "no_key"
			h.next.ServeHTTP(w, r)
			return
		}
		var ke *KeyError
		errors.As(err, &ke)
		p := Problem{Type: ProblemInvalidKey, Title: "Invalid Idempotency-Key", Status: http.StatusBadRequest, Detail: ke.Reason}
		ev.Outcome = "invalid_key"
		if errors.Is(err, ErrMissingKey) {
			p.Type, p.Title, ev.Outcome = ProblemMissingKey, "Idempotency-Key required", "missing_key"
			p.Detail = "This operation requires an Idempotency-Key header; send a unique value (such as a UUID) and reuse it when you retry."
		}
		ev.Status = m.problem(w, ev.Outcome, p)
		return
	}

	scope, err := m.cfg.Scope(r)
	if err != nil {
		p := Problem{Type: ProblemScope, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: "The request's credentials do not identify a client."}
		var se *ScopeError
		if errors.As(err, &se) {
			if se.Status != 0 {
				p.Status = se.Status
			}
			if se.Detail != "" {
				p.Detail = se.Detail
			}
			p.Title = http.StatusText(p.Status)
		}
		ev.Outcome = "scope_denied"
		ev.Status = m.problem(w, ev.Outcome, p)
		return
	}

	// Read the body for the fingerprint; the handler reads it again.
	st := getState()
	defer putState(st)
	if r.ContentLength > pol.MaxRequestBody {
		ev.Outcome = "body_too_large"
		ev.Status = m.problem(w, ev.Outcome, tooLarge(pol.MaxRequestBody, key))
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		over, err := readLimited(&st.reqBuf, r.Body, pol.MaxRequestBody)
		if err != nil {
			ev.Outcome = "body_unreadable"
			ev.Status = m.problem(w, ev.Outcome, Problem{Type: ProblemTypeBase + "body-unreadable", Title: "Unreadable request body", Status: http.StatusBadRequest, Detail: "The request body could not be read: " + err.Error()})
			return
		}
		if over {
			ev.Outcome = "body_too_large"
			ev.Status = m.problem(w, ev.Outcome, tooLarge(pol.MaxRequestBody, key))
			return
		}
		st.body.Reset(st.reqBuf.Bytes())
		r.Body = &st.body
	}
	buf := &st.reqBuf
	fp, err := Fingerprint(FingerprintInput{
		Method: r.Method, Operation: op, Path: r.URL.Path, Query: r.URL.RawQuery,
		ContentType: firstValue(r.Header["Content-Type"]), Body: buf.Bytes(),
	}, FingerprintOptions{ExcludeFields: pol.ExcludeFields})
	if err != nil { // validated at construction; kept for safety
		panic(err)
	}

	res, err := m.e.Begin(r.Context(), Request{
		Key: Key{Scope: scope, Operation: op, Key: key}, Fingerprint: fp,
		Kind: pol.Kind, Wait: pol.Wait, Lease: pol.Lease, Retention: pol.Retention,
	})
	if err != nil {
		if r.Context().Err() != nil {
			ev.Outcome, ev.Status = "canceled", 499
			return // the client is gone; nobody to answer
		}
		if errors.Is(err, ErrTooLong) {
			// A long operation comes from a long path (414); a long scope
			// from whatever Config.Scope reads off the request.
			p := Problem{Type: ProblemTooLong, Title: "Request path too long", Status: http.StatusRequestURITooLong, Key: key,
				Detail: fmt.Sprintf("The request path is longer than the %d bytes idem keeps for an operation.", MaxOperationLength)}
			if len(op) <= MaxOperationLength {
				p.Title, p.Status = "Scope too long", http.StatusBadRequest
				p.Detail = fmt.Sprintf("The request's scope is longer than the %d bytes idem keeps.", MaxScopeLength)
			}
			ev.Outcome = "too_long"
			ev.Status = m.problem(w, ev.Outcome, p)
			return
		}
		m.cfg.Logger.LogAttrs(r.Context(), slog.LevelError, "idem: store unavailable",
			slog.String("operation", op), slog.Any("error", err), slog.Bool("fail_open", m.cfg.FailOpen))
		if m.cfg.FailOpen {
			ev.Outcome = "fail_open"
			h.next.ServeHTTP(w, r)
			return
		}
		ev.Outcome = "unavailable"
		w.Header().Set("Retry-After", "1")
		ev.Status = m.problem(w, ev.Outcome, Problem{Type: ProblemUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The request was not processed because its idempotency key could not be checked; retry with the same key."})
		return
	}
	ev.Outcome = res.Outcome.String()
	switch res.Outcome {
	case Acquired:
		h.run(w, r, res.Lease, pol, st, &ev)
	case Replayed:
		ev.Status = m.replay(w, res.Response, key)
		if res.Response.NotReplayable != "" {
			ev.Outcome = "not_replayable"
		}
	case Mismatch:
		ev.Status = m.problem(w, ev.Outcome, Problem{Type: ProblemMismatch, Title: "Idempotency-Key reused", Status: http.StatusUnprocessableEntity, Key: key,
			Detail: "This Idempotency-Key was already used with a different request. Use a new key for a new request."})
	case InFlight:
		w.Header().Set("Retry-After", strconv.Itoa(int(res.RetryAfter/time.Second)))
		ev.Status = m.problem(w, ev.Outcome, Problem{Type: ProblemInFlight, Title: "Request in progress", Status: http.StatusConflict, Key: key,
			Detail: "A request with this Idempotency-Key is still being processed. Retry after the time in Retry-After to get its answer."})
	case NeedsReview:
		ev.Status = m.problem(w, ev.Outcome, Problem{Type: ProblemNeedsReview, Title: "Request outcome under review", Status: http.StatusConflict, Key: key,
			Detail: "An earlier request with this Idempotency-Key ended with an unknown outcome and is being reviewed. It will not run again; retry later to get its answer."})
	}
}

func firstValue(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

func tooLarge(limit int64, key string) Problem {
	return Problem{Type: ProblemBodyTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge, Key: key,
		Detail: "The request body is over the " + strconv.FormatInt(limit, 10) + "-byte limit for idempotent requests."}
}

func (m *middleware) problem(w http.ResponseWriter, outcome string, p Problem) int {
	w.Header().Set(outcomeHeader, outcome)
	WriteProblem(w, p)
	return p.Status
}

// replay writes a stored answer.
func (m *middleware) replay(w http.ResponseWriter, resp *Response, key string) int {
	if resp.NotReplayable != "" {
		w.Header().Set("Idempotency-Original-Status", strconv.Itoa(resp.Status))
		return m.problem(w, "not_replayable", Problem{Type: ProblemNotReplayable, Title: "Answer not kept", Status: http.StatusConflict, Key: key,
			Detail: fmt.Sprintf("The request with this Idempotency-Key completed with status %d, but its answer was not kept (%s), so it cannot be replayed. It will not run again.", resp.Status, resp.NotReplayable)})
	}
	h := w.Header()
	for name, values := range resp.Header {
		h[name] = values
	}
	h["Idempotent-Replayed"] = valTrue
	h[outcomeHeader] = valReplayed
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
	return resp.Status
}

// run calls the handler under the lease, then stores, releases or escalates.
// It records the status and the settlement in ev, also when the handler
// panics.
func (h *handler) run(w http.ResponseWriter, r *http.Request, lease *Lease, pol *Policy, st *reqState, ev *Event) {
	m := h.m
	st.cw.w, st.cw.limit, st.cw.buf = w, m.e.cfg.MaxResponseBody, &st.respBuf
	st.cw.bufferFlushes = pol.BufferFlushes
	cw := &st.cw
	ctx := r.Context()
	// The heartbeat stops once, on whichever way the handler leaves: before
	// the answer is stored, or before a panic settles the key.
	m.e.hb.start(lease)

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		// A panic: release a transactional key (nothing committed), escalate
		// an external one (something may have happened), then re-panic.
		v := recover()
		m.e.hb.stop(lease)
		sctx := context.WithoutCancel(ctx)
		if lease.Ended() {
			ev.Settlement = "handler"
			panic(v)
		}
		if lease.Kind() == Transactional {
			ev.Settlement = "released"
			if err := lease.Release(sctx); err != nil && !errors.Is(err, ErrLeaseLost) {
				ev.Settlement = "failed"
				m.cfg.Logger.LogAttrs(sctx, slog.LevelError, "idem: releasing after a panic failed", slog.String("key", redact(lease.Key())), slog.Any("error", err))
			}
		} else {
			ev.Settlement = "escalated"
			if err := lease.Escalate(sctx, fmt.Sprintf("handler panicked: %v", v)); err != nil && !errors.Is(err, ErrLeaseLost) {
				ev.Settlement = "failed"
				m.cfg.Logger.LogAttrs(sctx, slog.LevelError, "idem: escalating after a panic failed", slog.String("key", redact(lease.Key())), slog.Any("error", err))
			}
		}
		panic(v)
	}()
	h.next.ServeHTTP(cw, r.WithContext(lease.context(ctx)))
	panicked = false
	m.e.hb.stop(lease)

	if ctx.Err() != nil {
		// The client left; the answer must still be stored.
		ctx = context.WithoutCancel(ctx)
	}
	ev.Settlement = m.settle(ctx, cw, lease, pol)
	cw.finish()
	ev.Status = cw.finalStatus()
}

// readLimited reads body into buf, up to limit bytes. over reports a body
// longer than limit.
func readLimited(buf *bytes.Buffer, body io.Reader, limit int64) (over bool, err error) {
	for {
		if int64(buf.Len()) > limit {
			return true, nil
		}
		buf.Grow(512)
		b := buf.AvailableBuffer()
		b = b[:min(int64(cap(b)), limit+1-int64(buf.Len()))]
		n, err := body.Read(b)
		buf.Write(b[:n])
		if err == io.EOF {
			return int64(buf.Len()) > limit, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// settle stores the handler's answer, or releases or escalates the key.
func (m *middleware) settle(ctx context.Context, cw *captureWriter, lease *Lease, pol *Policy) string {
	log := m.cfg.Logger
	if txResp, ok := lease.txPrepared(); ok {
		return m.checkTx(ctx, cw, lease, txResp)
	}
	if lease.Ended() {
		return "handler"
	}
	resp := cw.response()
	if slices.Contains(pol.ReleaseStatuses, resp.Status) {
		if err := lease.Release(ctx); err != nil {
			log.LogAttrs(ctx, slog.LevelError, "idem: releasing the key failed", slog.String("key", redact(lease.Key())), slog.Any("error", err))
			return "failed"
		}
		return "released"
	}
	if err := lease.Complete(ctx, resp); err != nil {
		// The operation ran; its answer could not be stored. The client
		// still gets it. The record stays pending until its lease expires.
		log.LogAttrs(ctx, slog.LevelError, "idem: storing the answer failed", slog.String("key", redact(lease.Key())),
			slog.Int("status", resp.Status), slog.Any("error", err))
		return "failed"
	}
	if resp.NotReplayable != "" {
		return "not_replayable"
	}
	return "completed"
}

// checkTx verifies, after a handler called a store's CompleteTx, that what
// committed is what the handler answered.
func (m *middleware) checkTx(ctx context.Context, cw *captureWriter, lease *Lease, txResp *Response) string {
	log := m.cfg.Logger
	rec, err := m.e.store.Get(ctx, lease.Key())
	switch {
	case err != nil && !errors.Is(err, idemstore.ErrNotFound):
		log.LogAttrs(ctx, slog.LevelError, "idem: checking a transactional completion failed", slog.String("key", redact(lease.Key())), slog.Any("error", err))
		return "failed"
	case err == nil && rec.State == idemstore.StateCompleted && rec.Token == lease.Token():
		got := cw.response()
		if rec.Response == nil || rec.Response.Status != got.Status || !bytes.Equal(rec.Response.Body, got.Body) || rec.Response.NotReplayable != got.NotReplayable {
			log.LogAttrs(ctx, slog.LevelError, "idem: the handler answered differently from what it stored with CompleteTx; retries will get the stored answer",
				slog.String("key", redact(lease.Key())), slog.Int("written_status", got.Status), slog.Int("stored_status", txResp.Status))
		}
		return "completed_tx"
	case err == nil && rec.State == idemstore.StatePending && rec.Token == lease.Token():
		// The business transaction rolled back: nothing committed.
		if err := lease.Release(ctx); err != nil && !errors.Is(err, ErrLeaseLost) {
			log.LogAttrs(ctx, slog.LevelError, "idem: releasing after a rolled-back transaction failed", slog.String("key", redact(lease.Key())), slog.Any("error", err))
			return "failed"
		}
		if cw.status >= 200 && cw.status < 300 {
			log.LogAttrs(ctx, slog.LevelWarn, "idem: the handler answered success but its transaction did not commit; the key was released",
				slog.String("key", redact(lease.Key())), slog.Int("status", cw.status))
		}
		return "released"
	default:
		log.LogAttrs(ctx, slog.LevelError, "idem: the lease was lost during a transactional completion", slog.String("key", redact(lease.Key())))
		return "failed"
	}
}
