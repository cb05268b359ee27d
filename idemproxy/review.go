package idemproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

// review looks after the keys that go to review (the engine logs each one,
// with the key itself, for the operator to find): it tells the review webhook,
// keeps the review gauges current, settles what a resolver can, and serves
// the admin API and review page.
type review struct {
	store    idemstore.Store
	log      *slog.Logger
	keys     prometheus.Gauge
	oldest   prometheus.Gauge
	hook     *webhook         // nil without --review-webhook
	resolver idem.Resolver    // nil without any resolver URL
	sealer   idemstore.Sealer // opens sealed keys on the review page; nil: none

	// recoverNow asks the recovery loop to run soon (a key went to review
	// and a resolver may settle it); refreshNow asks for the gauges.
	recoverNow, refreshNow chan struct{}
	// refreshEvery is the gauges' period: the recovery interval.
	refreshEvery time.Duration
}

// Review gauges are refreshed every recovery interval and soon after every
// change, at most once per refreshGap (on Redis a listing scans the
// keyspace); each refresh reads at most reviewGaugePages pages of 1000
// keys.
const (
	reviewGaugePages = 10
	refreshGap       = 5 * time.Second
	// minLoopGap spaces recovery runs asked for by kicks, so that a burst
	// of keys going to review makes one run, not one per key.
	minLoopGap = time.Second
)

func newReview(cfg Config, store idemstore.Store, m *Metrics, log *slog.Logger) *review {
	rv := &review{
		store: store,
		log:   log,
		keys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idem_review_keys",
			Help: "Keys whose outcome is unknown and that wait in needs_review for a resolver or a person (counted up to 10000).",
		}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idem_review_oldest_age_seconds",
			Help: "How long the key that has waited longest in needs_review has waited, by the store's clock; 0 when none waits.",
		}),
		recoverNow:   make(chan struct{}, 1),
		refreshNow:   make(chan struct{}, 1),
		refreshEvery: cfg.WithDefaults().RecoverInterval.d(),
	}
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_resolver_calls_total",
		Help: "Calls to the resolver (--resolver-url) by outcome: completed, not_found, unknown, error.",
	}, []string{"outcome"})
	hooks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_review_webhook_events_total",
		Help: "Review webhook events (--review-webhook) by result: delivered, failed (after every attempt), dropped (queue full).",
	}, []string{"result"})
	for _, o := range []string{"completed", "not_found", "unknown", "error"} {
		calls.WithLabelValues(o)
	}
	m.Registry.MustRegister(rv.keys, rv.oldest, calls, hooks)
	if r := newRouteResolver(cfg, calls, log); r != nil {
		rv.resolver = r
	}
	if cfg.ReviewWebhook != "" {
		rv.hook = newWebhook(cfg.ReviewWebhook, hooks, log)
		for _, r := range []string{"delivered", "failed", "dropped"} {
			hooks.WithLabelValues(r)
		}
	}
	return rv
}

// onReview is the engine's OnReview: it runs on the request's goroutine,
// so it never waits (the webhook queues, the loops are kicked). The
// engine logs the key's one review line, with the key itself.
func (rv *review) onReview(ctx context.Context, key idem.Key, reason string) {
	id := idemadmin.KeyID(key)
	if rv.hook != nil {
		method, path := splitOperation(key.Operation)
		rv.hook.enqueue(reviewEvent{ID: id, Scope: key.Scope, Operation: key.Operation, Key: key.Key, Reason: reason,
			Method: method, Path: path, At: time.Now().UTC()})
	}
	kick(rv.refreshNow)
	if rv.resolver != nil {
		kick(rv.recoverNow)
	}
}

// recoverOptions are the recovery loop's: every proxied operation is
// external, and the resolver, if any, is asked about keys in review.
func (rv *review) recoverOptions() idem.RecoverOptions {
	return idem.RecoverOptions{KindOf: func(idem.Key) idem.Kind { return idem.External }, Resolver: rv.resolver}
}

// adminHandler is the admin API and review page, or nil without tokens.
func (rv *review) adminHandler(cfg Config, tokens map[string]string) (http.Handler, error) {
	if len(tokens) == 0 {
		return nil, nil
	}
	retention := 24 * time.Hour
	if cfg.Retention != nil && *cfg.Retention > 0 {
		retention = cfg.Retention.d()
	}
	trusted, err := cfg.adminTrustedProxies()
	if err != nil {
		return nil, err
	}
	return idemadmin.New(idemadmin.Config{Store: rv.store, Tokens: tokens, Retention: retention, Logger: rv.log,
		OnChange: func(idemadmin.Result) { kick(rv.refreshNow) }, Sealer: rv.sealer,
		TrustedProxies: trusted, SignInIPv6Prefix: cfg.AdminSignInIPv6Prefix})
}

// run delivers webhook events and keeps the gauges current until ctx
// ends.
func (rv *review) run(ctx context.Context) {
	var wg sync.WaitGroup
	if rv.hook != nil {
		wg.Go(func() { rv.hook.run(ctx) })
	}
	refresh := func() {
		if err := rv.refresh(ctx); err != nil && ctx.Err() == nil {
			rv.log.Debug("refreshing the review gauges failed", slog.Any("error", err))
		}
	}
	refresh()
	loop(ctx, rv.refreshEvery, rv.refreshNow, refreshGap, refresh)
	wg.Wait()
}

// refresh counts the keys in review and finds the oldest.
func (rv *review) refresh(ctx context.Context) error {
	n, oldest, err := countReview(ctx, rv.store, reviewGaugePages)
	if err != nil {
		return err
	}
	rv.keys.Set(float64(n))
	rv.oldest.Set(oldest.Seconds())
	return nil
}

// countReview counts the keys in review, reading at most pages pages of
// 1000, and returns how long the oldest has waited by the store's clock.
func countReview(ctx context.Context, store idemstore.Store, pages int) (int, time.Duration, error) {
	n, oldest, cursor := 0, time.Duration(0), ""
	for i := 0; i < pages; i++ {
		page, err := store.List(ctx, idemstore.ListParams{State: idemstore.StateNeedsReview, Cursor: cursor, Limit: 1000})
		if err != nil {
			return 0, 0, err
		}
		for _, rec := range page.Records {
			n++
			since := rec.UpdatedAt
			if since.IsZero() {
				since = rec.CreatedAt
			}
			oldest = max(oldest, rec.ReadAt.Sub(since))
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	return n, oldest, nil
}

// kick asks a loop to run, without waiting; asks made while one is
// pending merge.
func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// loop calls f every interval and soon after a kick (but not within
// minGap of its last run), until ctx ends.
func loop(ctx context.Context, interval time.Duration, kicked <-chan struct{}, minGap time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var (
		last time.Time
		due  <-chan time.Time // a kick waiting for minGap to pass
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-due:
		case <-kicked:
			if wait := minGap - time.Since(last); wait > 0 {
				if due == nil {
					due = time.After(wait)
				}
				continue
			}
		}
		due = nil
		f()
		last = time.Now()
	}
}

var errAdminTokenFile = errors.New("admin_token_file needs the admin listener (--admin ADDR), where the admin API and the review page are served")

// adminTokens are the admin tokens of cfg.AdminTokenFile and extra (from
// IDEM_ADMIN_TOKEN). A token file without an admin listener is an error
// (it would open nothing); extra tokens are then ignored, since the
// variable also serves the admin commands of the same shell.
func adminTokens(cfg Config, extra map[string]string) (map[string]string, error) {
	if cfg.Admin == "" {
		if cfg.AdminTokenFile != "" {
			return nil, errAdminTokenFile
		}
		return nil, nil
	}
	tokens := map[string]string{}
	if cfg.AdminTokenFile != "" {
		t, err := idemadmin.LoadTokenFile(cfg.AdminTokenFile)
		if err != nil {
			return nil, err
		}
		tokens = t
	}
	for name, tok := range extra {
		if _, dup := tokens[name]; dup {
			return nil, fmt.Errorf("admin token %q is given twice (in the token file and IDEM_ADMIN_TOKEN)", name)
		}
		tokens[name] = tok
	}
	return tokens, nil
}

// routeResolver picks the resolver of a key's route.
type routeResolver struct {
	def *HTTPResolver  // the global resolver_url's; nil without one
	mux *http.ServeMux // routes' patterns to resolverRoute; nil without routes
}

// resolverRoute is a route's resolver, as a ServeMux handler (never
// served).
type resolverRoute struct{ r *HTTPResolver }

func (resolverRoute) ServeHTTP(http.ResponseWriter, *http.Request) {}

// newRouteResolver returns the resolver of cfg's resolver URLs, or nil
// when neither the settings nor any route names one.
func newRouteResolver(cfg Config, calls *prometheus.CounterVec, log *slog.Logger) *routeResolver {
	byURL := map[string]*HTTPResolver{}
	get := func(u string) *HTTPResolver {
		if u == "" {
			return nil
		}
		if byURL[u] == nil {
			byURL[u] = &HTTPResolver{URL: u, Calls: calls, Logger: log}
		}
		return byURL[u]
	}
	rr := &routeResolver{def: get(cfg.ResolverURL)}
	if len(cfg.Routes) > 0 {
		rr.mux = http.NewServeMux()
		for _, r := range cfg.Routes {
			s := r.Settings.merge(cfg.Settings)
			var res *HTTPResolver
			if !r.Disabled {
				res = get(s.ResolverURL)
			}
			handle(rr.mux, r.Match.Pattern, resolverRoute{res})
		}
	}
	if len(byURL) == 0 {
		return nil
	}
	return rr
}

// Resolve asks the resolver of rec's route; a route without one leaves
// the key for a person.
func (rr *routeResolver) Resolve(ctx context.Context, rec *idemstore.Record) (idem.Resolution, error) {
	if r := rr.pick(rec); r != nil {
		return r.Resolve(ctx, rec)
	}
	return idem.Resolution{Verdict: idem.VerdictUnknown}, nil
}

func (rr *routeResolver) pick(rec *idemstore.Record) *HTTPResolver {
	if rr.mux == nil {
		return rr.def
	}
	method, path := splitOperation(rec.Key.Operation)
	if rec.Request != nil {
		method, path = rec.Request.Method, rec.Request.Path
	}
	h, _ := rr.mux.Handler(&http.Request{Method: method, URL: &url.URL{Path: path}, Header: http.Header{}})
	if route, ok := h.(resolverRoute); ok {
		return route.r
	}
	return rr.def
}

// checkHookURL checks a URL the proxy POSTs to (resolver_url,
// review_webhook): empty, or http(s) with a host.
func checkHookURL(name, u string) error {
	if u == "" {
		return nil
	}
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return fmt.Errorf("%s %q must be an http:// or https:// URL with a host", name, redactURL(u))
	}
	return nil
}
