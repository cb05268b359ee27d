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
	// under its situation instead (upstream_failed, …).
	OnOutcome func(idem.Event)
	// ScopeSecret, if set, keys scopes and fingerprints (see
	// Config.ScopeSecretFile and NewScope).
	ScopeSecret []byte
}

// Proxy is the idempotency reverse proxy: an http.Handler that forwards to
// the upstream through idem's middleware, one middleware per configured
// route, all sharing one engine.
type Proxy struct {
	handler  http.Handler
	upstream *url.URL
	log      *slog.Logger
	metrics  *Metrics
	closing  atomic.Bool
}

// New returns a proxy for cfg (defaults filled, validated) over engine.
func New(engine *idem.Engine, cfg Config, opts Options) (*Proxy, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	up, _ := url.Parse(cfg.Upstream)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Transport == nil {
		tr := NewTransport(cfg.UpstreamTimeout.d())
		tr.IdleConnTimeout = cfg.UpstreamIdleTimeout.d()
		opts.Transport = tr
	}
	if opts.Metrics != nil {
		opts.Transport = opts.Metrics.instrumentTransport(opts.Transport)
	}
	p := &Proxy{upstream: up, log: opts.Logger, metrics: opts.Metrics}
	onOutcome := func(ev idem.Event) {
		// A key the forwarder settled itself was counted by its situation.
		if opts.Metrics != nil && ev.Settlement != settledByProxy {
			opts.Metrics.observeOutcome(ev)
		}
		if opts.OnOutcome != nil {
			opts.OnOutcome(ev)
		}
		if p.log.Enabled(context.Background(), slog.LevelDebug) {
			p.log.LogAttrs(context.Background(), slog.LevelDebug, "request",
				slog.String("operation", ev.Operation), slog.String("key", ev.Key), slog.String("outcome", ev.Outcome),
				slog.String("settlement", ev.Settlement), slog.Int("status", ev.Status), slog.Duration("duration", ev.Duration))
		}
	}
	fpKey := derive(opts.ScopeSecret, "fingerprint")
	pool := newBufferPool()
	transport := watchBodies{opts.Transport}
	build := func(s Settings, methods []string, disabled bool) (http.Handler, error) {
		fwd := &forwarder{p: p, ambiguous: s.Ambiguous, deadline: s.upstreamDeadline()}
		fwd.rp = &httputil.ReverseProxy{
			Rewrite:      fwd.rewrite,
			Transport:    transport,
			BufferPool:   pool,
			ErrorHandler: fwd.upstreamError,
			ErrorLog:     slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
		}
		if disabled {
			return fwd, nil
		}
		mw, err := idem.NewMiddleware(engine, idem.Config{
			Scope:          NewScope(s.scopeSources(), opts.ScopeSecret, s.Anonymous),
			FingerprintKey: fpKey,
			Methods:        methods,
			Operation:      operation,
			Policy:         s.policy(),
			OnOutcome:      onOutcome,
			Logger:         p.log,
		})
		if err != nil {
			return nil, err
		}
		return mw(fwd), nil
	}
	def, err := build(cfg.Settings, nil, false)
	if err != nil {
		return nil, err
	}
	if len(cfg.Routes) == 0 {
		p.handler = def
		return p, nil
	}
	mux := http.NewServeMux()
	hasRoot := false
	for _, r := range cfg.Routes {
		h, err := build(r.Settings.merge(cfg.Settings), patternMethods(r.Match.Pattern), r.Disabled)
		if err != nil {
			return nil, fmt.Errorf("line %d: route %q: %w", r.Match.Line, r.Match.Pattern, err)
		}
		if err := handle(mux, r.Match.Pattern, h); err != nil {
			return nil, fmt.Errorf("line %d: route %q: %w", r.Match.Line, r.Match.Pattern, err)
		}
		hasRoot = hasRoot || r.Match.Pattern == "/"
	}
	if !hasRoot {
		mux.Handle("/", def)
	}
	p.handler = mux
	return p, nil
}

// patternMethods returns the method a ServeMux pattern names, or nil (the
// middleware's default, POST and PATCH) when it names none.
func patternMethods(pattern string) []string {
	if m, rest, ok := strings.Cut(pattern, " "); ok && !strings.Contains(m, "/") && strings.TrimSpace(rest) != "" {
		return []string{m}
	}
	return nil
}

// ServeHTTP forwards r through the middleware.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.handler.ServeHTTP(w, r) }

// BeginShutdown makes the proxy refuse to forward protected requests that
// were not forwarded yet: their keys are released and they get 503 with
// Retry-After, so a retry against another instance runs them.
func (p *Proxy) BeginShutdown() { p.closing.Store(true) }

// operation is the record's operation: method and path, as escaped on the
// wire, so that /a%2Fb and /a/b, which the upstream gets as different
// paths, are different operations.
func operation(r *http.Request) string { return r.Method + " " + r.URL.EscapedPath() }

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
	idem.WriteProblem(w, s.ProblemDoc(detail, key))
}

// count records an answer the proxy made itself, and what became of its
// key, in the outcome metric.
func (p *Proxy) count(s idem.Situation, settlement string) {
	if p.metrics != nil {
		p.metrics.observeAnswer(s, settlement)
	}
}
