package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/internal/storeurl"
)

func init() { extraCommands = append(extraCommands, newServeCmd) }

// serveFlags are the flags of idem serve; set ones override the file.
type serveFlags struct {
	config                                           string
	upstream, listen, store, admin                   string
	retention, lease, wait, shutdownTimeout, timeout time.Duration
	maxBody                                          int64
	optionalKey                                      bool
	logFormat, logLevel                              string
	scopeHeaders, scopeCookies                       []string
	scopeLabelHeader                                 string
	upstreamName                                     string
	hostAliases                                      []string
	legacyOperations                                 bool
	anonymous, scopeSecretFile, encryptionKeyFile    string
	readHeaderTimeout, readTimeout, idleTimeout      time.Duration
	maxHeaderBytes                                   int
	upstreamDeadline, upstreamIdleTimeout            time.Duration
	adminTokenFile, resolverURL, reviewWebhook       string
	storeRequest                                     bool
	mode, problemBaseURL                             string
	corsOrigins                                      []string
	adminTrustedProxies                              []string
	adminSignInIPv6Prefix                            int
	clientWriteTimeout                               time.Duration
	maxBodyMemory                                    int64
	maxConnections                                   int
	maxReplayMemory, maxDecodedReplay                int64
	mergeSlashes                                     bool
	escapedSlashes, pathParams, methodOverride       string
	newKeysPerScope                                  string
	protocols                                        protocolFlags // serve_grpc.go
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve --upstream URL",
		Short: "Run the idempotency reverse proxy in front of an HTTP API",
		Long: `serve runs a reverse proxy that makes the upstream's POST and PATCH requests
safe to retry: the first request with an Idempotency-Key is forwarded, and
every retry with the same key gets the stored answer (Idempotent-Replayed:
true). Other methods pass through untouched.

Keys are unique per scope, operation (method and path) and key. The scope is a
digest of the client's credentials: the --scope-header and --scope-cookie values
(Authorization by default), keyed with HMAC-SHA-256 when --scope-secret-file or
IDEM_SCOPE_SECRET gives a secret. A protected request that carries none of them
gets 401 and is not forwarded, unless --anonymous shared. A retry with a different body gets 422; one that
arrives while the first is in flight gets 409 with Retry-After (or, with
--wait, the first answer once it is ready).

The store may be unreachable at start: the proxy starts anyway, protected
requests get 503 until the store answers, and /readyz on --admin says so.
IDEM_STORE_FILE names a file holding the store URL (a mounted secret), in
place of --store. Under systemd (Type=notify) serve sends READY=1 once it
listens and STOPPING=1 when it starts draining.

--admin serves /livez, /healthz, /readyz and /metrics. The admin API and the review
page are mounted there only with a token (--admin-token-file or
IDEM_ADMIN_TOKEN); without one they are off.

Request bodies are compared as JSON (member order and whitespace do not
matter, --config's exclude_fields apply) only when their Content-Type is JSON
(application/json or +json); any other body is compared byte for byte.`,
		Example: `  # In front of a local API, keys in ./idem.db
  idem serve --upstream http://127.0.0.1:3000

  # Shared PostgreSQL store, admin API and metrics on :9090
  idem serve --upstream http://api.internal:8080 --listen :8080 \
    --store 'postgres://idem:secret@db:5432/idem' --admin 127.0.0.1:9090

  # Settings and per-route policies from a file, the listen address from a flag
  idem serve --config idem.yaml --listen 127.0.0.1:8081`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// SIGHUP reloads the configuration; caught from the start, so
			// that it never ends the process.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			cfg, err := f.resolve(cmd.Flags())
			if err != nil {
				return usageError{err}
			}
			level := new(slog.LevelVar)
			log, err := idemproxy.NewLevelLogger(cmd.ErrOrStderr(), cfg.LogFormat, cfg.LogLevel, level)
			if err != nil {
				return usageError{err}
			}
			routeOTelErrors(log)
			tp, shutdownTracing, err := tracingFromEnv(ctx, os.Getenv)
			if err != nil {
				return usageError{err}
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				if err := shutdownTracing(sctx); err != nil {
					log.Warn("tracing: the last spans were not exported", slog.Any("error", err))
				}
			}()
			logTracing(log, tp)
			return runServe(ctx, cfg, log, func(s *idemproxy.Server) {
				s.LogLevel = level
				s.TracerProvider = tp
				go reloadOnHUP(ctx, hup, s, log, func() (idemproxy.Config, error) { return f.resolve(cmd.Flags()) })
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "YAML configuration file; flags override it")
	fl.StringVar(&f.upstream, "upstream", "", "the API the proxy protects (required, here or in the config file)")
	fl.StringVar(&f.upstreamName, "upstream-name", "", "the upstream's name in operations; proxies in front of one API reached by different URLs must share it (default: the upstream URL's host and base path)")
	fl.StringArrayVar(&f.hostAliases, "host-alias", nil, "host name that counts as one with the others given (repeatable; operations are named after the first), or * alone: every host is one (default: every host is an operation of its own)")
	fl.BoolVar(&f.legacyOperations, "legacy-operations", true, "look for a record stored under an earlier version's operation name (method and path) and keep it; one store read per new key; --legacy-operations=false once a retention has passed since the upgrade")
	fl.StringVar(&f.listen, "listen", idemproxy.DefaultListen, "where the proxy listens (port 0 picks a free port; the address is logged)")
	fl.StringVar(&f.store, "store", idemproxy.DefaultStore, "store URL: sqlite://PATH, memory://, postgres://…, mysql://user:pass@tcp(host:port)/db, redis://host:port/N, redis+cluster://h1:p1,h2:p2")
	fl.StringVar(&f.admin, "admin", "", "admin listener for /healthz, /readyz and /metrics, and with a token the admin API and review page (default off)")
	fl.StringVar(&f.adminTokenFile, "admin-token-file", "", "file of admin tokens (NAME:TOKEN per line) for the admin API and review page; or IDEM_ADMIN_TOKEN")
	fl.StringArrayVar(&f.adminTrustedProxies, "admin-trusted-proxy", nil, "a load balancer in front of the admin listener (address or CIDR; repeat for more): failed sign-ins through it count against the X-Forwarded-For client, not the balancer")
	fl.IntVar(&f.adminSignInIPv6Prefix, "admin-sign-in-ipv6-prefix", 64, "length of the IPv6 networks failed admin sign-ins are counted by (32-128)")
	fl.StringVar(&f.resolverURL, "resolver-url", "", "POSTed every key that goes to review or whose lease expired, to settle it (see docs/proxy.md)")
	fl.StringVar(&f.reviewWebhook, "review-webhook", "", "POSTed every key that goes to review, to alert a person")
	fl.BoolVar(&f.storeRequest, "store-request", false, "keep request bodies (up to 64 KiB) on the record for operators")
	fl.DurationVar(&f.retention, "retention", 24*time.Hour, "how long a completed key is kept and replayed")
	fl.DurationVar(&f.lease, "lease", 30*time.Second, "in-flight lease, renewed while the upstream works")
	fl.Int64Var(&f.maxBody, "max-body", idemproxy.DefaultMaxBody, "request body limit in bytes for fingerprinting; larger requests get 413")
	fl.StringVar(&f.mode, "mode", string(idemproxy.ModeEnforce), "enforce, or observe: forward every request and answer unchanged, and count what enforcement would do in idem_observe_findings_total (see docs/adoption.md); mode: per route in --config")
	fl.StringVar(&f.problemBaseURL, "problem-base-url", "", "base of the type URIs of idem's problem documents, e.g. https://api.example.com/problems# (default: idem's docs/problems.md)")
	fl.StringArrayVar(&f.corsOrigins, "cors-origin", nil, "browser origin (https://app.example.com, or *) allowed to read idem's own answers and headers (repeatable); preflights still go to the upstream")
	fl.BoolVar(&f.optionalKey, "optional-key", false, "let protected requests without a key through instead of 400")
	fl.StringArrayVar(&f.scopeHeaders, "scope-header", nil, "header whose value scopes keys (repeatable; default Authorization unless --scope-cookie is set)")
	fl.StringArrayVar(&f.scopeCookies, "scope-cookie", nil, "cookie whose value scopes keys (repeatable), after the scope headers")
	fl.StringVar(&f.scopeLabelHeader, "scope-label-header", "", "header whose value labels each new key for operators (an account ID your gateway sets): shown and searchable in the admin API, never part of the scope")
	fl.StringVar(&f.anonymous, "anonymous", string(idemproxy.AnonymousReject), "a protected request with no scope header or cookie: reject (401) or shared (one scope for all such requests)")
	fl.StringVar(&f.scopeSecretFile, "scope-secret-file", "", "file holding the secret (16+ bytes) that keys scopes and fingerprints with HMAC; or IDEM_SCOPE_SECRET")
	fl.StringVar(&f.encryptionKeyFile, "encryption-key-file", "", "file of AES-256 keys ([ID:]SECRET per line, the first sealing) that seal stored answers at rest; or IDEM_ENCRYPTION_KEY")
	fl.DurationVar(&f.readHeaderTimeout, "read-header-timeout", idemproxy.DefaultReadHeaderTimeout, "longest a client may take to send its request headers")
	fl.DurationVar(&f.readTimeout, "read-timeout", idemproxy.DefaultReadTimeout, "longest a client may take to send its whole request, body included")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", idemproxy.DefaultIdleTimeout, "how long an idle keep-alive client connection is kept")
	fl.IntVar(&f.maxHeaderBytes, "max-header-bytes", idemproxy.DefaultMaxHeaderBytes, "largest request headers accepted (larger get 431)")
	fl.DurationVar(&f.wait, "wait", 0, "0: a concurrent duplicate gets 409 at once; >0: it waits up to this long, then replays")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long in-flight requests may finish after SIGTERM")
	fl.DurationVar(&f.timeout, "upstream-timeout", 60*time.Second, "longest wait for the upstream's response headers (then 504, key needs review)")
	fl.DurationVar(&f.upstreamDeadline, "upstream-deadline", idemproxy.DefaultUpstreamDeadline, "longest protected upstream call, answer body included (then 504, key needs review)")
	fl.DurationVar(&f.upstreamIdleTimeout, "upstream-idle-timeout", idemproxy.DefaultUpstreamIdleTimeout, "how long idle keep-alive connections to the upstream are kept; keep it below the upstream's own")
	fl.DurationVar(&f.clientWriteTimeout, "client-write-timeout", idemproxy.DefaultClientWriteTimeout, "longest a client may take to accept 32 KiB of its answer; then it is cut off and the key completes without it")
	fl.Int64Var(&f.maxBodyMemory, "max-body-memory", idemproxy.DefaultMaxBodyMemory, "bytes of protected request bodies held in memory at once, charged as they arrive (never at an announced length); no room left, 503 busy")
	fl.Int64Var(&f.maxReplayMemory, "max-replay-memory", idemproxy.DefaultMaxReplayMemory, "bytes of stored answers held in memory at once while clients read their replays; past it, 503 busy")
	fl.Int64Var(&f.maxDecodedReplay, "max-decoded-replay", idemproxy.DefaultMaxDecodedReplay, "largest size a gzip- or deflate-coded stored answer is decoded to for a retry that does not accept its coding; past it, 406")
	fl.IntVar(&f.maxConnections, "max-connections", 0, "client connections open at once; more wait in the listen queue (default 0: no limit)")
	fl.BoolVar(&f.mergeSlashes, "merge-slashes", true, "read runs of '/' in paths as one (//pay is /pay); --merge-slashes=false for upstreams to which // means something")
	fl.StringVar(&f.escapedSlashes, "escaped-slashes", string(idemproxy.EscapedSlashesKeep), "%2F in paths: keep (apart from /), decode (to /, as WSGI servers do) or reject (400 on protected requests)")
	fl.StringVar(&f.pathParams, "path-params", string(idemproxy.PathParamsReject), "';' parameters in paths: reject (400 on protected requests), strip (as servlet containers do) or keep")
	fl.StringVar(&f.methodOverride, "method-override", string(idemproxy.OverrideProtect), "X-HTTP-Method-Override and its kin: protect (as the method they name), strip, or refuse (400); method_override: per route in --config")
	fl.StringVar(&f.newKeysPerScope, "new-keys-per-scope", "off", "cap on the new keys each scope (client) may reserve: LIMIT/INTERVAL such as 100/1m; over it, 429 and nothing forwarded (replays never count); new_keys_per_scope: per route in --config")
	f.protocols.add(fl)
	fl.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug (one line per protected request), info, warn or error")
	return cmd
}

// resolve merges the config file and the flags that were set.
func (f *serveFlags) resolve(fl *pflag.FlagSet) (idemproxy.Config, error) {
	var cfg idemproxy.Config
	if f.config != "" {
		c, err := idemproxy.LoadConfig(f.config)
		if err != nil {
			return cfg, err
		}
		cfg = c
	}
	set := func(name string) bool { return fl.Changed(name) || f.config == "" }
	if set("upstream") {
		cfg.Upstream = f.upstream
	}
	f.protocols.apply(&cfg, fl)
	if set("listen") {
		cfg.Listen = f.listen
	}
	if set("store") {
		cfg.Store = f.store
	}
	if err := storeFromFile(&cfg.Store, fl.Changed("store")); err != nil {
		return cfg, err
	}
	if set("admin-token-file") {
		cfg.AdminTokenFile = f.adminTokenFile
	}
	if set("admin-trusted-proxy") {
		cfg.AdminTrustedProxies = f.adminTrustedProxies
	}
	if set("admin-sign-in-ipv6-prefix") {
		cfg.AdminSignInIPv6Prefix = f.adminSignInIPv6Prefix
	}
	if set("resolver-url") {
		cfg.ResolverURL = f.resolverURL
	}
	if set("review-webhook") {
		cfg.ReviewWebhook = f.reviewWebhook
	}
	if set("store-request") {
		cfg.StoreRequest = &f.storeRequest
	}
	if set("admin") {
		cfg.Admin = f.admin
	}
	dur := func(d time.Duration) *idemproxy.Duration { v := idemproxy.Duration(d); return &v }
	if set("retention") {
		cfg.Retention = dur(f.retention)
	}
	if set("lease") {
		cfg.Lease = dur(f.lease)
	}
	if set("wait") {
		cfg.Wait = dur(f.wait)
	}
	if set("max-body") {
		cfg.MaxBody = &f.maxBody
	}
	if set("mode") {
		m, err := idemproxy.ParseMode(f.mode)
		if err != nil {
			return cfg, fmt.Errorf("--mode: %w", err)
		}
		cfg.Mode = m
	}
	if set("problem-base-url") {
		cfg.ProblemBaseURL = f.problemBaseURL
	}
	if fl.Changed("cors-origin") {
		cfg.CORSOrigins = f.corsOrigins
	}
	if set("optional-key") {
		cfg.OptionalKey = &f.optionalKey
	}
	if fl.Changed("scope-header") || fl.Changed("scope-cookie") {
		cfg.ScopeHeader, cfg.ScopeCookie = f.scopeHeaders, f.scopeCookies
	}
	if set("upstream-name") {
		cfg.UpstreamName = f.upstreamName
	}
	if fl.Changed("host-alias") {
		cfg.HostAliases = f.hostAliases
	}
	if set("legacy-operations") {
		cfg.LegacyOperations = &f.legacyOperations
	}
	if set("scope-label-header") {
		cfg.ScopeLabelHeader = f.scopeLabelHeader
	}
	if set("anonymous") {
		a, err := idemproxy.ParseAnonymous(f.anonymous)
		if err != nil {
			return cfg, fmt.Errorf("--anonymous: %w", err)
		}
		cfg.Anonymous = a
	}
	if set("scope-secret-file") {
		cfg.ScopeSecretFile = f.scopeSecretFile
	}
	if set("encryption-key-file") {
		cfg.EncryptionKeyFile = f.encryptionKeyFile
	}
	if set("read-header-timeout") {
		cfg.ReadHeaderTimeout = idemproxy.Duration(f.readHeaderTimeout)
	}
	if set("read-timeout") {
		cfg.ReadTimeout = idemproxy.Duration(f.readTimeout)
	}
	if set("idle-timeout") {
		cfg.IdleTimeout = idemproxy.Duration(f.idleTimeout)
	}
	if set("max-header-bytes") {
		cfg.MaxHeaderBytes = f.maxHeaderBytes
	}
	if set("shutdown-timeout") {
		cfg.ShutdownTimeout = idemproxy.Duration(f.shutdownTimeout)
	}
	if set("upstream-timeout") {
		cfg.UpstreamTimeout = idemproxy.Duration(f.timeout)
	}
	if set("upstream-deadline") {
		cfg.UpstreamDeadline = dur(f.upstreamDeadline)
	}
	if set("upstream-idle-timeout") {
		cfg.UpstreamIdleTimeout = idemproxy.Duration(f.upstreamIdleTimeout)
	}
	if set("client-write-timeout") {
		cfg.ClientWriteTimeout = idemproxy.Duration(f.clientWriteTimeout)
	}
	if set("max-body-memory") {
		cfg.MaxBodyMemory = f.maxBodyMemory
	}
	if set("max-connections") {
		cfg.MaxConnections = f.maxConnections
	}
	if set("max-replay-memory") {
		cfg.MaxReplayMemory = f.maxReplayMemory
	}
	if set("max-decoded-replay") {
		cfg.MaxDecodedReplay = f.maxDecodedReplay
	}
	if set("merge-slashes") {
		cfg.MergeSlashes = &f.mergeSlashes
	}
	if set("escaped-slashes") {
		cfg.EscapedSlashes = idemproxy.EscapedSlashes(f.escapedSlashes)
	}
	if set("path-params") {
		cfg.PathParams = idemproxy.PathParams(f.pathParams)
	}
	if set("method-override") {
		m, err := idemproxy.ParseMethodOverride(f.methodOverride)
		if err != nil {
			return cfg, fmt.Errorf("--method-override: %w", err)
		}
		cfg.MethodOverride = m
	}
	if set("new-keys-per-scope") {
		l, err := idemproxy.ParseNewKeyLimit(f.newKeysPerScope)
		if err != nil {
			return cfg, fmt.Errorf("--new-keys-per-scope: %w", err)
		}
		cfg.NewKeysPerScope = &l
	}
	if set("log-format") {
		cfg.LogFormat = f.logFormat
	}
	if set("log-level") {
		cfg.LogLevel = f.logLevel
	}
	cfg = cfg.WithDefaults()
	return cfg, cfg.Validate()
}

// runServe opens the store lazily (the proxy starts even when it is down)
// and runs the proxy until ctx ends.
func runServe(ctx context.Context, cfg idemproxy.Config, log *slog.Logger, tweak func(*idemproxy.Server)) error {
	// The variables and files are checked before the store is opened,
	// which creates a SQLite file: a mistake in them leaves nothing behind.
	srv := &idemproxy.Server{Config: cfg, Logger: log}
	var err error
	if env := os.Getenv("IDEM_SCOPE_SECRET"); env != "" {
		if cfg.ScopeSecretFile != "" {
			return usageError{errors.New("both IDEM_SCOPE_SECRET and a scope secret file are set; keep one")}
		}
		if srv.ScopeSecret, err = idemproxy.ParseSecret([]byte(env)); err != nil {
			return usageError{fmt.Errorf("IDEM_SCOPE_SECRET: %w", err)}
		}
	}
	if env := os.Getenv("IDEM_ENCRYPTION_KEY"); env != "" {
		if cfg.EncryptionKeyFile != "" {
			return usageError{errors.New("both IDEM_ENCRYPTION_KEY and an encryption key file are set; keep one")}
		}
		if srv.EncryptionKeys, err = idemseal.ParseKeys(env); err != nil {
			return usageError{fmt.Errorf("IDEM_ENCRYPTION_KEY: %w", err)}
		}
	}
	if env := os.Getenv("IDEM_ADMIN_TOKEN"); env != "" {
		if srv.AdminTokens, err = idemadmin.ParseTokens(env); err != nil {
			return usageError{fmt.Errorf("IDEM_ADMIN_TOKEN: %w", err)}
		}
	}
	if err := checkServeFiles(cfg); err != nil {
		return err
	}
	store, closeStore, err := storeurl.Open(ctx, cfg.Store, storeurl.Options{Lazy: true, Migrate: true, Logger: log})
	if err != nil {
		return usageError{err}
	}
	defer closeStore()
	log.Info("store", slog.String("url", storeurl.Redact(cfg.Store)))
	srv.Store = store
	if tweak != nil {
		tweak(srv)
	}
	summary, ready := newStartupSummary(cfg, srv.AdminTokens), srv.Ready
	sd := newNotifier(log)
	defer sd.stoppingOn(ctx)()
	srv.Ready = func(proxy, admin net.Addr) {
		summary.log(log, admin)
		sd.notify("READY=1\nSTATUS=listening on " + proxy.String())
		if ready != nil {
			ready(proxy, admin)
		}
	}
	return srv.Run(ctx)
}

// checkServeFiles reads the secret, key and token files cfg names, to
// report one that is missing or malformed before the store is opened
// (Server.Run reads them again).
func checkServeFiles(cfg idemproxy.Config) error {
	if cfg.ScopeSecretFile != "" {
		if _, err := idemproxy.ReadSecret(cfg.ScopeSecretFile); err != nil {
			return fmt.Errorf("scope secret file: %w", err)
		}
	}
	if cfg.EncryptionKeyFile != "" {
		if _, err := idemseal.LoadKeyFile(cfg.EncryptionKeyFile); err != nil {
			return err
		}
	}
	if cfg.AdminTokenFile != "" {
		if _, err := idemadmin.LoadTokenFile(cfg.AdminTokenFile); err != nil {
			return err
		}
	}
	return nil
}
