package idemproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/netutil"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemstore"
)

// Server runs a Proxy on its listener, the admin listener, and the
// background recovery and purge loops, until its context ends; then it
// shuts down gracefully.
type Server struct {
	// Config is the proxy configuration (defaults are filled by Run).
	Config Config
	// Store is the record store; Run does not close it.
	Store idemstore.Store
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Transport overrides the upstream transport (see Options.Transport).
	Transport http.RoundTripper
	// OnOutcome, if set, sees every protected request.
	OnOutcome func(idem.Event)
	// Ready, if set, is called once both listeners accept connections.
	Ready func(proxy, admin net.Addr)
	// AdminTokens are admin tokens by name, beside those of
	// Config.AdminTokenFile (idem serve passes IDEM_ADMIN_TOKEN's here).
	AdminTokens map[string]string
	// ScopeSecret keys scopes and fingerprints, when Config.ScopeSecretFile
	// names no file (idem serve passes IDEM_SCOPE_SECRET's here).
	ScopeSecret []byte
	// LogLevel, if set, is the level of Logger's handler, which Reload
	// changes to the new log_level. Unset, a new level needs a restart.
	LogLevel *slog.LevelVar
	// TracerProvider, if set, traces protected requests, store calls and
	// upstream calls (see Options.TracerProvider). idem serve sets it from
	// the OTEL_* environment variables. Defaults to nil: no spans.
	TracerProvider trace.TracerProvider
	// Now is the proxy's clock (see Options.Now). Defaults to time.Now.
	Now func() time.Time

	running reloadState // for Reload
	// EncryptionKeys seal stored answers, when Config.EncryptionKeyFile
	// names no file (idem serve passes IDEM_ENCRYPTION_KEY's here).
	EncryptionKeys *idemseal.Keyring
}

// readyKey is the sentinel record /readyz reads: cheap, and absent.
var readyKey = idemstore.Key{Scope: "idem", Operation: "readyz", Key: "readyz"}

// Run serves until ctx ends, then stops accepting, lets in-flight requests
// finish for up to Config.ShutdownTimeout, and returns.
func (s *Server) Run(ctx context.Context) error {
	cfg := s.Config.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	metrics := NewMetrics()
	if r, ok := s.Store.(idemstore.BatchReporter); ok {
		metrics.WatchBatches(r)
	}
	store := metrics.InstrumentStore(s.Store)
	tokens, err := adminTokens(cfg, s.AdminTokens)
	if err != nil {
		return err
	}
	secret := s.ScopeSecret
	if cfg.ScopeSecretFile != "" {
		if secret, err = ReadSecret(cfg.ScopeSecretFile); err != nil {
			return fmt.Errorf("scope secret file: %w", err)
		}
	}
	warnScopes(log, cfg, secret)
	keys := s.EncryptionKeys
	if cfg.EncryptionKeyFile != "" {
		if keys, err = idemseal.LoadKeyFile(cfg.EncryptionKeyFile); err != nil {
			return err
		}
	}
	if keys != nil {
		log.Info("stored answers are sealed", slog.String("key_id", keys.ID()), slog.Int("keys", len(keys.IDs())))
	}
	rv := newReview(cfg, store, metrics, log)
	if keys != nil {
		rv.sealer = keys // the review page opens what it shows
	}
	adminAPI, err := rv.adminHandler(cfg, tokens)
	if err != nil {
		return err
	}
	ecfg := idem.EngineConfig{Logger: log, OnReview: rv.onReview, TracerProvider: s.TracerProvider}
	if keys != nil {
		ecfg.Sealer = keys
	}
	if cfg.Lease != nil {
		ecfg.Lease = cfg.Lease.d()
	}
	if cfg.Retention != nil {
		ecfg.Retention = cfg.Retention.d()
	}
	engine, err := idem.NewEngine(store, ecfg)
	if err != nil {
		return err
	}
	proxy, err := New(engine, cfg, Options{Logger: log, Metrics: metrics, Transport: s.Transport, OnOutcome: s.OnOutcome, ScopeSecret: secret, TracerProvider: s.TracerProvider, Now: s.Now})
	if err != nil {
		return err
	}

	certs, adminCerts, err := loadCerts(cfg)
	if err != nil {
		return err
	}
	s.running.start(proxy, cfg, log)
	s.running.certs = []*certSource{certs, adminCerts}
	defer s.running.stop()

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	ln = limitConnections(ln, cfg.MaxConnections)
	metrics.watchProxy(proxy)
	srv := &http.Server{
		Handler:           metrics.inFlight(proxy),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout.d(),
		ReadTimeout:       cfg.ReadTimeout.d(),
		IdleTimeout:       cfg.IdleTimeout.d(),
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ln = serveProtocols(srv, ln, certs, cfg)
	var (
		adminLn  net.Listener
		adminSrv *http.Server
	)
	if cfg.Admin != "" {
		addr := AdminAddr(cfg.Admin)
		if adminLn, err = net.Listen("tcp", addr); err != nil {
			ln.Close()
			return fmt.Errorf("listen %s (admin): %w", addr, err)
		}
		adminSrv = &http.Server{
			Handler:           withProbes(adminHandler(store, metrics, adminAPI, log), proxy.Draining),
			ReadHeaderTimeout: cfg.ReadHeaderTimeout.d(),
			ReadTimeout:       cfg.ReadTimeout.d(),
			IdleTimeout:       cfg.IdleTimeout.d(),
			MaxHeaderBytes:    cfg.MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		adminLn = serveProtocols(adminSrv, adminLn, adminCerts, cfg)
	}

	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	attrs := []any{slog.String("proxy", ln.Addr().String()), slog.String("upstream", cfg.Upstream)}
	var adminAddr net.Addr
	if adminSrv != nil {
		adminAddr = adminLn.Addr()
		go func() { errc <- adminSrv.Serve(adminLn) }()
		attrs = append(attrs, slog.String("admin", adminAddr.String()))
	}
	log.Info("idem serve listening", attrs...)
	if s.Ready != nil {
		s.Ready(ln.Addr(), adminAddr)
	}

	loopCtx, stopLoops := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Add(2)
	loops.Go(func() { rv.run(loopCtx) })
	go func() {
		defer loops.Done()
		loop(loopCtx, cfg.RecoverInterval.d(), rv.recoverNow, minLoopGap, func() {
			rep, err := engine.Recover(loopCtx, rv.recoverOptions())
			switch {
			case err != nil && loopCtx.Err() == nil:
				log.Warn("recovering expired leases failed", slog.Any("error", err))
			case rep.Escalated > 0:
				log.Warn("expired leases moved to needs_review", slog.Int("count", rep.Escalated))
			}
			if rep.Completed+rep.Reopened > 0 {
				log.Info("the resolver settled keys in review", slog.Int("completed", rep.Completed), slog.Int("released", rep.Reopened), slog.Int("unknown", rep.Unknown))
			}
		})
	}()
	go func() {
		defer loops.Done()
		every(loopCtx, cfg.PurgeInterval.d(), func() {
			n, err := engine.Purge(loopCtx, cfg.PurgeBatch)
			switch {
			case err != nil && loopCtx.Err() == nil:
				log.Warn("purging expired records failed", slog.Any("error", err))
			case n > 0:
				log.Info("purged expired records", slog.Int("count", n))
			}
		})
	}()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	log.Info("shutting down", slog.Duration("timeout", cfg.ShutdownTimeout.d()))
	proxy.BeginShutdown()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.d())
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("in-flight requests did not finish in time", slog.Any("error", err))
		srv.Close()
	}
	if adminSrv != nil {
		adminSrv.Shutdown(sctx)
	}
	stopLoops()
	loops.Wait()
	log.Info("stopped")
	if runErr != nil && !errors.Is(runErr, http.ErrServerClosed) {
		return runErr
	}
	return nil
}

// limitConnections bounds the connections ln has open at once to n (none
// when n is 0): past it, new connections wait in the listen queue.
func limitConnections(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return netutil.LimitListener(ln, n)
}

// AdminAddr is the address the admin listener binds for addr: addr itself
// when it names a host, else the loopback interface, so that an address
// such as ":9090" never exposes the admin API to the network by accident.
// Bind every interface by saying so: "0.0.0.0:9090" or "[::]:9090".
func AdminAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "" {
		return addr
	}
	return net.JoinHostPort(DefaultAdminHost, port)
}

// ScopeWarning marks the startup warnings about how keys are scoped, for a
// log handler that has already told its user (idem demo).
var ScopeWarning = slog.String("warning", "scope")

// warnScopes says at startup what a dump of the store reveals of clients'
// credentials, and which routes let requests without any share a scope.
func warnScopes(log *slog.Logger, cfg Config, secret []byte) {
	if len(secret) == 0 {
		log.Warn(noSecretWarning, ScopeWarning)
	}
	if cfg.Anonymous == AnonymousShared {
		log.Warn("requests without a scope header or cookie share one scope: a client that learns another's key gets the other's answer (--anonymous shared)", ScopeWarning)
	}
	for _, r := range cfg.Routes {
		if r.Anonymous == AnonymousShared && cfg.Anonymous != AnonymousShared {
			log.Warn("requests without a scope header or cookie share one scope on this route", slog.String("route", r.Match.Pattern), ScopeWarning)
		}
	}
}

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// adminHandler serves /healthz (the process answers), /readyz (the store
// answers; withProbes adds draining and /livez) and /metrics, and api (the admin API and review page) at the
// rest, when it is not nil.
func adminHandler(store idemstore.Store, m *Metrics, api http.Handler, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	if api != nil {
		mux.Handle("/", api)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		_, err := store.Get(ctx, readyKey)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err != nil && !errors.Is(err, idemstore.ErrNotFound) {
			// The error names the store's host and user: it goes to the log,
			// not to whoever can reach the admin listener.
			log.Warn("readyz: the store does not answer", slog.Any("error", err))
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: the store does not answer (the log says why)")
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", m.Handler())
	return mux
}
