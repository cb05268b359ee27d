package idemproxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem"
)

// Options are the collaborators of a Proxy.
type Options struct {
	// Logger receives the proxy's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics, if set, counts outcomes and times the upstream.
	Metrics *Metrics
	// Transport carries requests to the upstream. Defaults to
	// NewTransport(cfg.UpstreamTimeout) with cfg.UpstreamIdleTimeout.
	Transport http.RoundTripper
	// OnOutcome, if set, is called after every protected request, as
	// idem.Config.OnOutcome. A key the proxy settled itself after an
	// upstream failure reports Settlement "handler"; the metrics count it
	// under its situation instead (upstream_failed, …). So does the new
	// key of a request that a record of an earlier version answers (see
	// Config.LegacyOperations), which then reports a second event: the
	// outcome under the earlier name.
	OnOutcome func(idem.Event)
	// ScopeSecret, if set, keys scopes and fingerprints (see
	// Config.ScopeSecretFile and NewScope).
	ScopeSecret []byte
	// TracerProvider, if set, traces every protected request (the
	// middleware's idem.request span, with the outcome) and every upstream
	// call (idem.upstream), continues the W3C trace context a client sent,
	// and passes it on to the upstream. Give the engine the same provider
	// (idem.EngineConfig.TracerProvider) for the store calls' spans.
	// Defaults to nil: no spans.
	TracerProvider trace.TracerProvider
	// Now is the clock of the new-key caps' intervals
	// (Settings.NewKeysPerScope) and of the time a gRPC call spends in
	// idem before it is forwarded (taken off its grpc-timeout). Defaults
	// to time.Now.
	Now func() time.Time
}

// Proxy is the idempotency reverse proxy: an http.Handler that forwards to
// the upstream through idem's middleware, one middleware per configured
// route, all sharing one engine.
type Proxy struct {
	handler  atomic.Pointer[routes] // swapped whole by Reload
	upstream *url.URL
	// upstreamName names the upstream in operations (Config.UpstreamName),
	// and legacy is Config.LegacyOperations, both fixed at New.
	upstreamName string
	legacy       bool
	log          *slog.Logger
	metrics      *Metrics
	closing      atomic.Bool

	engine    *idem.Engine
	opts      Options
	transport http.RoundTripper // opts.Transport, watched
	pool      *bufferPool
	fpKey     []byte
	findings  *findingLog
	// problemBase is Config.ProblemBaseURL, fixed at New.
	problemBase string
	// writeTimeout is Config.ClientWriteTimeout, fixed at New.
	writeTimeout time.Duration
	// bodies bounds the request bodies held at once (Config.MaxBodyMemory),
	// shared by every route's middleware.
	bodies *idem.BodyBudget
	// replays bounds the stored answers held while clients read them
	// (Config.MaxReplayMemory).
	replays *idem.Budget
	// maxDecoded is Config.MaxDecodedReplay, fixed at New.
	maxDecoded int64
	// rpcDesc are Config.ProtoDescriptorSet's services (nil: none), and
	// rpcMetrics the gRPC calls' own metrics (grpc.go).
	rpcDesc    *rpcDescriptors
	rpcMetrics *rpcMetrics
}

// New returns a proxy for cfg (defaults filled, validated) over engine.
func New(engine *idem.Engine, cfg Config, opts Options) (*Proxy, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if mb := engine.Config().MaxResponseBody; int64(mb)+minReplayMemory/2 > cfg.MaxReplayMemory {
		return nil, fmt.Errorf("max_replay_memory %d is under the largest stored answer (%d bytes), decoded for a client: it could never be replayed", cfg.MaxReplayMemory, mb)
	}
	up, _ := url.Parse(cfg.Upstream)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Transport == nil {
		tr := NewTransport(cfg.UpstreamTimeout.d())
		tr.IdleConnTimeout = cfg.UpstreamIdleTimeout.d()
		if up.Scheme == SchemeH2C {
			useH2C(tr)
		}
		opts.Transport = tr
	}
	if opts.Metrics != nil {
		opts.Transport = opts.Metrics.instrumentTransport(opts.Transport)
	}
	if opts.TracerProvider != nil {
		opts.Transport = tracingTransport{next: opts.Transport, tracer: opts.TracerProvider.Tracer(tracerName)}
	}
	p := &Proxy{
		upstream: up, log: opts.Logger, metrics: opts.Metrics,
		engine: engine, opts: opts, transport: watchBodies{opts.Transport}, pool: newBufferPool(),
		fpKey: derive(opts.ScopeSecret, "fingerprint"), findings: newFindingLog(opts.Logger),
		problemBase: cfg.ProblemBaseURL, writeTimeout: cfg.ClientWriteTimeout.d(),
		bodies:       idem.NewBodyBudget(cfg.MaxBodyMemory),
		replays:      idem.NewBudget(cfg.MaxReplayMemory),
		maxDecoded:   cfg.MaxDecodedReplay,
		upstreamName: cfg.UpstreamName, legacy: *cfg.LegacyOperations,
	}
	if p.upstreamName == "" {
		p.upstreamName = upstreamName(up)
	}
	if err := p.setUpRPC(cfg, up); err != nil {
		return nil, err
	}
	rs, err := p.build(cfg)
	if err != nil {
		return nil, err
	}
	p.handler.Store(rs)
	return p, nil
}

// clientGrace is how long the upstream may still take to deliver its
// answer once a client that did not take it was cut off at the deadline.
func (p *Proxy) clientGrace() time.Duration {
	if p.writeTimeout > 0 {
		return p.writeTimeout
	}
	return DefaultClientWriteTimeout
}

// onOutcome is the middleware's OnOutcome for the requests of route.
func (p *Proxy) onOutcome(route string) func(idem.Event) {
	return func(ev idem.Event) {
		// A key the forwarder settled itself was counted by its situation.
		if p.metrics != nil && ev.Settlement != settledByProxy {
			p.metrics.observeOutcome(route, ev)
		}
		if ev.Finding != "" {
			if p.metrics != nil {
				p.metrics.observeFinding(route, ev.Finding)
			}
			p.findings.note(route, ev)
		}
		if p.opts.OnOutcome != nil {
			p.opts.OnOutcome(ev)
		}
		if p.log.Enabled(context.Background(), slog.LevelDebug) {
			p.log.LogAttrs(context.Background(), slog.LevelDebug, "request",
				slog.String("operation", ev.Operation), keyDigest(ev), slog.String("outcome", ev.Outcome),
				slog.String("finding", ev.Finding), slog.String("settlement", ev.Settlement), slog.Int("status", ev.Status),
				slog.Duration("duration", ev.Duration))
		}
	}
}

// build returns the handler of cfg's routes.
func (p *Proxy) build(cfg Config) (*routes, error) {
	rs := &routes{cfg: cfg, paths: cfg.pathOptions()}
	global, caps := capsOf(cfg, p.opts.Now)
	def, err := p.buildRoute(DefaultRouteLabel, cfg.Settings, nil, false, global)
	if err != nil {
		return nil, err
	}
	rs.def = def
	if len(cfg.Routes) == 0 {
		return rs, nil
	}
	mux := http.NewServeMux()
	for i, r := range cfg.Routes {
		h, err := p.buildRoute(r.Match.Pattern, r.Settings.merge(cfg.Settings), patternMethods(r.Match.Pattern), r.Disabled, caps[i])
		if err != nil {
			return nil, fmt.Errorf("line %d: route %q: %w", r.Match.Line, r.Match.Pattern, err)
		}
		if err := handle(mux, r.Match.Pattern, h); err != nil {
			return nil, fmt.Errorf("line %d: route %q: %w", r.Match.Line, r.Match.Pattern, err)
		}
	}
	// The default route takes what no route matches. ServeMux refuses "/"
	// only beside a route that matches every request ("/", " /",
	// "/{rest...}"), which leaves the default nothing to take.
	_ = handle(mux, "/", def)
	rs.mux = mux
	return rs, nil
}

// buildRoute returns the handler of one route: the middleware with s's
// policy around a forwarder, or the forwarder alone when disabled, behind
// the route's edges; c is the route's new-key cap, or nil.
func (p *Proxy) buildRoute(label string, s Settings, methods []string, disabled bool, c *keyCap) (*route, error) {
	fwd := &forwarder{p: p, ambiguous: s.Ambiguous, deadline: s.upstreamDeadline(), observe: s.Mode == ModeObserve,
		endToEnd: endToEndFields(s.scopeSources())}
	if !fwd.observe && !disabled {
		fwd.cap = p.routeCap(c, label)
	}
	fwd.rp = &httputil.ReverseProxy{
		Rewrite:      fwd.rewrite,
		Transport:    p.transport,
		BufferPool:   p.pool,
		ErrorHandler: fwd.upstreamError,
		ErrorLog:     slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	scope := NewScope(s.scopeSources(), p.opts.ScopeSecret, s.Anonymous)
	fwd.label = label
	rt := &route{p: p, label: label, methods: methods, disabled: disabled, override: s.MethodOverride, next: fwd}
	if rt.override == "" {
		rt.override = OverrideProtect
	}
	if disabled {
		return rt, nil
	}
	rt.rpc = p.newRPCRoute(label, s, fwd, scope, newIdentity(p.upstreamName, s).operation)
	pol := s.policy()
	if pol.Observe && p.metrics != nil {
		p.metrics.observeRoute(label)
	}
	mw, err := idem.NewMiddleware(p.engine, idem.Config{
		Scope:          scope,
		ScopeLabel:     s.scopeLabel(),
		FingerprintKey: p.fpKey,
		Methods:        methods,
		Operation:      newIdentity(p.upstreamName, s).operation,
		Policy:         pol,
		OnOutcome:      p.onOutcome(label),
		ProblemBaseURL: p.problemBase,
		TracerProvider: p.opts.TracerProvider,
		Logger:         p.log,
		BodyBudget:     p.bodies,
		// MaxDecodedReplay: decoding streams; the replay budget holds
		// its state (route.ServeHTTP passes it on).
		MaxDecodedReplay: p.maxDecoded,
	})
	if err != nil {
		return nil, err
	}
	rt.next = mw(fwd)
	if p.legacy {
		fwd.legacyNext = rt.next
	}
	return rt, nil
}

// patternMethods returns the method a ServeMux pattern names, or nil (the
// middleware's default, POST and PATCH) when it names none. It reads the
// pattern as ServeMux does: the method is what comes before the first
// space or tab, and a pattern that starts with one names no method.
func patternMethods(pattern string) []string {
	if i := strings.IndexAny(pattern, " \t"); i > 0 {
		return []string{pattern[:i]}
	}
	return nil
}

// ServeHTTP forwards r through the middleware.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt := p.handler.Load()
	if p.opts.TracerProvider != nil {
		// Continue the client's trace, if it sent one.
		r = r.WithContext(w3c.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
	}
	w = newClientWriter(w, p.writeTimeout)
	if o := corsFor(rt.cfg.CORSOrigins, r); o != "" {
		preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
		w = &corsWriter{ResponseWriter: w, origin: o, preflight: preflight}
	}
	rt.serve(w, r)
}

// BeginShutdown makes the proxy refuse to forward protected requests that
// were not forwarded yet: their keys are released and they get 503 with
// Retry-After, so a retry against another instance runs them. Routes in
// observe mode forward them still.
func (p *Proxy) BeginShutdown() { p.closing.Store(true) }

// Problem types of the proxy's own answers: aliases of idem's, kept for
// compatibility. The situations (idem.SituationUpstreamUnreachable, …) carry
// them with their status and Idempotency-Outcome value.
const (
	ProblemUpstreamUnreachable = idem.ProblemUpstreamUnreachable
	ProblemUpstreamFailed      = idem.ProblemUpstreamFailed
	ProblemUpstreamTimeout     = idem.ProblemUpstreamTimeout
	ProblemShuttingDown        = idem.ProblemShuttingDown
)

// writeProblem answers with s's problem document and its Idempotency-Outcome.
func (p *Proxy) writeProblem(w http.ResponseWriter, s idem.Situation, detail, key string) {
	w.Header().Set("Idempotency-Outcome", s.Name)
	doc := s.ProblemDoc(detail, key)
	doc.Type = idem.RebaseProblemType(doc.Type, p.problemBase)
	idem.WriteProblem(w, doc)
}

// count records an answer the proxy made itself, and what became of its
// key, in the outcome metric.
func (p *Proxy) count(route string, s idem.Situation, settlement string) {
	if p.metrics != nil {
		p.metrics.observeAnswer(route, s, settlement)
	}
}
