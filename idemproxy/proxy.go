package idemproxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/idem-dev/idem"
)

// AnonymousScope is the scope of requests without the scope header.
const AnonymousScope = "anonymous"

// Options are the collaborators of a Proxy.
type Options struct {
	// Logger receives the proxy's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics, if set, counts outcomes and times the upstream.
	Metrics *Metrics
	// Transport carries requests to the upstream. Defaults to
	// NewTransport(cfg.UpstreamTimeout).
	Transport http.RoundTripper
	// OnOutcome, if set, is called after every protected request, as
	// idem.Config.OnOutcome.
	OnOutcome func(idem.Event)
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
		opts.Transport = NewTransport(cfg.UpstreamTimeout.d())
	}
	if opts.Metrics != nil {
		opts.Transport = opts.Metrics.instrumentTransport(opts.Transport)
	}
	p := &Proxy{upstream: up, log: opts.Logger, metrics: opts.Metrics}
	onOutcome := func(ev idem.Event) {
		if opts.Metrics != nil {
			opts.Metrics.observeOutcome(ev)
		}
		if opts.OnOutcome != nil {
			opts.OnOutcome(ev)
		}
		if p.log.Enabled(context.Background(), slog.LevelDebug) {
			p.log.LogAttrs(context.Background(), slog.LevelDebug, "request",
				slog.String("operation", ev.Operation), slog.String("outcome", ev.Outcome),
				slog.String("settlement", ev.Settlement), slog.Int("status", ev.Status), slog.Duration("duration", ev.Duration))
		}
	}
	pool := newBufferPool()
	build := func(s Settings, methods []string, disabled bool) (http.Handler, error) {
		fwd := &forwarder{p: p, ambiguous: s.Ambiguous}
		fwd.rp = &httputil.ReverseProxy{
			Rewrite:      fwd.rewrite,
			Transport:    opts.Transport,
			BufferPool:   pool,
			ErrorHandler: fwd.upstreamError,
			ErrorLog:     slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
		}
		if disabled {
			return fwd, nil
		}
		mw, err := idem.NewMiddleware(engine, idem.Config{
			Scope:     ScopeFromHeader(s.ScopeHeader),
			Methods:   methods,
			Operation: operation,
			Policy:    s.policy(),
			OnOutcome: onOutcome,
			Logger:    p.log,
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

func handle(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	mux.Handle(pattern, h)
	return nil
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

// operation is the record's operation: method and path.
func operation(r *http.Request) string { return r.Method + " " + r.URL.Path }

// ScopeFromHeader scopes keys by the SHA-256 (hex) of the named header's
// value, so the credential itself is never stored. Requests without the
// header share AnonymousScope.
func ScopeFromHeader(name string) idem.ScopeFunc {
	return func(r *http.Request) (string, error) {
		vs := r.Header.Values(name)
		if len(vs) == 0 {
			return AnonymousScope, nil
		}
		h := sha256.New()
		for i, v := range vs {
			if i > 0 {
				h.Write([]byte{'\n'})
			}
			io.WriteString(h, v)
		}
		var sum [sha256.Size]byte
		return hex.EncodeToString(h.Sum(sum[:0])), nil
	}
}

// forwarder sends one route's requests to the upstream.
type forwarder struct {
	p         *Proxy
	rp        *httputil.ReverseProxy
	ambiguous Ambiguous
}

func (f *forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	lease := idem.LeaseFrom(r.Context())
	if lease == nil {
		f.rp.ServeHTTP(w, r)
		return
	}
	if f.p.closing.Load() {
		// Shutting down: this request was never forwarded, so its key is
		// released and a retry (here after a restart, or elsewhere) runs it.
		if err := lease.Release(context.WithoutCancel(r.Context())); err != nil {
			f.p.log.Error("releasing a key during shutdown failed", slog.Any("error", err))
		}
		w.Header().Set("Retry-After", "1")
		idem.WriteProblem(w, idem.Problem{Type: ProblemShuttingDown, Title: "Proxy shutting down", Status: http.StatusServiceUnavailable,
			Detail: "The proxy is shutting down and did not forward this request; retry with the same key."})
		return
	}
	f.rp.ServeHTTP(w, r)
}

// rewrite points the request at the upstream. A protected request is
// detached from the client's cancellation, so that a client hanging up does
// not abort an upstream call whose answer will be stored; and it never goes
// out without a body reader, so that http.Transport, which re-sends
// bodiless requests carrying an Idempotency-Key after a broken keep-alive
// connection, never sends it twice.
func (f *forwarder) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(f.p.upstream)
	pr.SetXForwarded()
	if idem.LeaseFrom(pr.In.Context()) != nil {
		pr.Out = pr.Out.WithContext(context.WithoutCancel(pr.Out.Context()))
		if pr.Out.Body == nil || pr.Out.Body == http.NoBody {
			pr.Out.Body = emptyBody{}
			pr.Out.ContentLength = 0
		}
	}
}

type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }

// Problem types of the proxy's own answers.
const (
	ProblemUpstreamUnreachable = idem.ProblemTypeBase + "upstream-unreachable"
	ProblemUpstreamFailed      = idem.ProblemTypeBase + "upstream-failed"
	ProblemUpstreamTimeout     = idem.ProblemTypeBase + "upstream-timeout"
	ProblemShuttingDown        = idem.ProblemTypeBase + "shutting-down"
)

// upstreamError answers a failed upstream call and settles its key: released
// when nothing was sent, escalated (or released, by the route's ambiguous
// policy) when the request may have reached the upstream.
func (f *forwarder) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	ctx := context.WithoutCancel(r.Context())
	sent := !NotSent(err)
	prob := idem.Problem{Type: ProblemUpstreamUnreachable, Title: "Upstream unreachable", Status: http.StatusBadGateway,
		Detail: "The upstream could not be reached; the request was not sent. Retry with the same key."}
	if sent {
		prob = idem.Problem{Type: ProblemUpstreamFailed, Title: "Upstream failed", Status: http.StatusBadGateway,
			Detail: "The upstream failed after the request was sent, so its outcome is unknown."}
		if isTimeout(err) {
			prob.Type, prob.Title, prob.Status = ProblemUpstreamTimeout, "Upstream timeout", http.StatusGatewayTimeout
		}
	}
	settled := ""
	if lease := idem.LeaseFrom(r.Context()); lease != nil {
		var serr error
		if !sent || f.ambiguous == AmbiguousRelease {
			settled, serr = "released", lease.Release(ctx)
			if sent {
				prob.Detail += " The key was released (the route's ambiguous policy): a retry is forwarded again."
			}
		} else {
			settled, serr = "escalated", lease.Escalate(ctx, "upstream failed after the request was sent: "+err.Error())
			prob.Detail += " The key needs review: retries get 409 until an operator resolves it."
		}
		if serr != nil {
			settled = "failed"
			f.p.log.Error("settling a key after an upstream error failed", slog.Any("error", serr))
		}
	}
	f.p.log.LogAttrs(ctx, slog.LevelWarn, "upstream error", slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Bool("sent", sent), slog.String("key", settled), slog.Int("status", prob.Status), slog.Any("error", err))
	w.Header().Set("Idempotency-Outcome", "upstream_error")
	idem.WriteProblem(w, prob)
}
