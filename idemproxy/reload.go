package idemproxy

import (
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// reloadState is what Server.Reload changes in a running server.
type reloadState struct {
	mu    sync.Mutex
	proxy *Proxy
	cfg   Config
	log   *slog.Logger
	// certs are the listeners' TLS certificates (nil: cleartext), read
	// again by Reload.
	certs []*certSource
}

func (r *reloadState) start(p *Proxy, cfg Config, log *slog.Logger) {
	r.mu.Lock()
	r.proxy, r.cfg, r.log = p, cfg, log
	r.mu.Unlock()
}

func (r *reloadState) stop() {
	r.mu.Lock()
	r.proxy = nil
	r.mu.Unlock()
}

// ErrNotRunning is returned by Server.Reload when Run is not serving.
var ErrNotRunning = errors.New("idemproxy: the server is not running")

// Reload applies cfg to the running server without a restart: the routes
// and their policies (mode, keys, scopes, fingerprints, waits, leases,
// retention, statuses, limits, deadlines) and, with Server.LogLevel, the log
// level. The new routes serve the next request; a request in flight
// finishes under the routes it started with. A cfg that does not validate
// is refused whole and the running configuration kept. Settings that only
// a restart can change (listen, store, admin, files, listener and upstream
// timeouts, …) keep their running values; restart names them.
func (s *Server) Reload(cfg Config) (restart []string, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &s.running
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proxy == nil {
		return nil, ErrNotRunning
	}
	if err := reloadCerts(r.certs); err != nil {
		return nil, err
	}
	restart = restartFields(r.cfg, cfg)
	if cfg.LogLevel != r.cfg.LogLevel && s.LogLevel == nil {
		restart = append(restart, "log_level")
	}
	// Keep the running values of what cannot change now, so the next
	// reload compares with what runs.
	next := keepRestartFields(r.cfg, cfg)
	if s.LogLevel == nil {
		next.LogLevel = r.cfg.LogLevel
	}
	if err := r.proxy.Reload(next); err != nil {
		return nil, err
	}
	if s.LogLevel != nil {
		l, _ := ParseLevel(next.LogLevel) // validated
		s.LogLevel.Set(l)
	}
	r.cfg = next
	return restart, nil
}

// Reload swaps the proxy's routes for cfg's. Requests in flight finish on
// the routes they started with. cfg's upstream and transport settings are
// not used: they are the proxy's own from New.
func (p *Proxy) Reload(cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	rs, err := p.build(cfg)
	if err != nil {
		return err
	}
	p.handler.Store(rs)
	return nil
}

// reloadable are the top-level fields Reload applies (YAML names).
var reloadable = []string{"log_level", "routes", "cors_origins"}

// restartFields names the settings that differ between the running cfg
// and next and that only a restart applies.
func restartFields(running, next Config) []string {
	var out []string
	rv, nv := reflect.ValueOf(running), reflect.ValueOf(next)
	t := rv.Type()
	for i := range t.NumField() {
		name, opts, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if opts == "inline" || slices.Contains(reloadable, name) {
			continue
		}
		if !reflect.DeepEqual(rv.Field(i).Interface(), nv.Field(i).Interface()) {
			out = append(out, name)
		}
	}
	out = append(out, running.Protocols.restartFields(next.Protocols)...)
	// Resolvers are started with the server, per route.
	if !slices.Equal(resolverURLs(running), resolverURLs(next)) {
		out = append(out, "resolver_url")
	}
	return out
}

// keepRestartFields returns next with running's values of the settings
// only a restart applies.
func keepRestartFields(running, next Config) Config {
	out := running
	out.Settings, out.Routes, out.LogLevel, out.CORSOrigins = next.Settings, next.Routes, next.LogLevel, next.CORSOrigins
	// Resolver URLs stay as they run.
	out.ResolverURL = running.ResolverURL
	byPattern := make(map[string]string, len(running.Routes))
	for _, r := range running.Routes {
		byPattern[r.Match.Pattern] = r.ResolverURL
	}
	out.Routes = slices.Clone(next.Routes)
	for i := range out.Routes {
		out.Routes[i].ResolverURL = byPattern[out.Routes[i].Match.Pattern]
	}
	return out
}

// resolverURLs lists the resolvers of the defaults and of the routes.
func resolverURLs(c Config) []string {
	out := []string{c.ResolverURL}
	for _, r := range c.Routes {
		if r.ResolverURL != "" {
			out = append(out, r.Match.Pattern+"="+r.ResolverURL)
		}
	}
	slices.Sort(out[1:])
	return out
}
