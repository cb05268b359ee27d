package idemproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem"
)

// Config is the proxy's configuration, as read from a YAML file (see
// LoadConfig) and overridden by command-line flags. Zero fields take the
// defaults named on each.
type Config struct {
	// Upstream is the base URL of the API the proxy protects. Required.
	Upstream string `yaml:"upstream"`
	// UpstreamName names the upstream in every operation ("POST /orders
	// host=shop.example upstream=NAME"), so that proxies in front of
	// different APIs that share a store never take one's key for the
	// other's. Proxies in front of one API must give it one name: set it
	// when they reach it by different URLs. Visible ASCII without spaces,
	// at most 515 bytes (an upstream URL whose host and base path are
	// longer is refused without one). Defaults to the upstream URL's host
	// (lower-case, without a default port) and base path.
	UpstreamName string `yaml:"upstream_name"`
	// LegacyOperations makes a protected request look for a record that an
	// earlier version of idem stored under the operation's name of then
	// (method and path alone) and, if there is one, keep that name: a
	// retry across the upgrade replays, or waits for, the request it
	// retries, instead of running again. It costs one store read per new
	// key (a key the new name holds already reads nothing more); turn it
	// off once the longest retention has passed since every instance
	// sharing the store was upgraded. Defaults to true.
	LegacyOperations *bool `yaml:"legacy_operations"`
	// Listen is the proxy's address. Defaults to 127.0.0.1:8080.
	Listen string `yaml:"listen"`
	// Store is the store URL (see internal/storeurl). Defaults to
	// sqlite://idem.db.
	Store string `yaml:"store"`
	// Admin is the address of the admin listener (/healthz, /readyz,
	// /metrics). Defaults to off.
	Admin string `yaml:"admin"`
	// ShutdownTimeout bounds how long in-flight requests may finish after
	// SIGTERM. Defaults to 30s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// UpstreamTimeout bounds the wait for the upstream's response headers;
	// past it the outcome is unknown (504, needs review). Defaults to 60s.
	UpstreamTimeout Duration `yaml:"upstream_timeout"`
	// UpstreamIdleTimeout is how long an idle keep-alive connection to the
	// upstream is kept. Keep it below the upstream's own idle timeout, so
	// that the proxy, not the upstream, closes idle connections. Defaults
	// to 90s.
	UpstreamIdleTimeout Duration `yaml:"upstream_idle_timeout"`
	// RecoverInterval is how often expired leases are moved to
	// needs_review. Defaults to 1m.
	RecoverInterval Duration `yaml:"recover_interval"`
	// PurgeInterval is how often expired records are purged. Defaults to 5m.
	PurgeInterval Duration `yaml:"purge_interval"`
	// PurgeBatch is the most records one purge statement deletes. Defaults
	// to 500.
	PurgeBatch int `yaml:"purge_batch"`
	// LogFormat is "text" or "json". Defaults to text.
	LogFormat string `yaml:"log_format"`
	// LogLevel is debug, info, warn or error. Defaults to info.
	LogLevel string `yaml:"log_level"`
	// AdminTokenFile holds the admin tokens (see idemadmin.ParseTokens)
	// that open the admin API and the review page on the admin listener.
	// Defaults to none: the admin listener serves only /healthz, /readyz
	// and /metrics.
	AdminTokenFile string `yaml:"admin_token_file"`
	// AdminTrustedProxies are the load balancers in front of the admin
	// listener (addresses or CIDR prefixes): failed sign-ins through one
	// of them count against the client address it names in
	// X-Forwarded-For, not against the balancer's, which would let one
	// client's wrong tokens lock every operator out (see
	// idemadmin.Config.TrustedProxies). Defaults to none.
	AdminTrustedProxies []string `yaml:"admin_trusted_proxies"`
	// AdminSignInIPv6Prefix is the length of the IPv6 networks failed
	// sign-ins are counted by, 32 to 128 (see
	// idemadmin.Config.SignInIPv6Prefix). Defaults to 64.
	AdminSignInIPv6Prefix int `yaml:"admin_sign_in_ipv6_prefix"`
	// ReviewWebhook, if set, receives a POST for every key that goes to
	// review. Defaults to none.
	ReviewWebhook string `yaml:"review_webhook"`
	// ScopeSecretFile holds the secret (at least 16 bytes) that keys scopes
	// and fingerprints with HMAC-SHA-256, so that a copy of the store cannot
	// be matched against guessed credentials or bodies. Every instance
	// sharing a store needs the same secret. Defaults to none (or
	// IDEM_SCOPE_SECRET).
	ScopeSecretFile string `yaml:"scope_secret_file"`
	// EncryptionKeyFile holds the keys that seal stored answers and kept
	// requests at rest with AES-256-GCM (see idemseal): one [ID:]SECRET a
	// line, the first one sealing, the others still opening what they
	// sealed. Every instance sharing a store needs the same keys. Defaults
	// to none (or IDEM_ENCRYPTION_KEY): stored in clear.
	EncryptionKeyFile string `yaml:"encryption_key_file"`

	// ProblemBaseURL replaces the start of the type URIs of idem's problem
	// documents, so that they point at the operator's own API docs:
	// "https://api.example.com/errors#" gives
	// "https://api.example.com/errors#key-reused". Defaults to idem's
	// docs/problems.md.
	ProblemBaseURL string `yaml:"problem_base_url"`
	// CORSOrigins are the browser origins ("https://app.example.com", or
	// "*" for any) allowed to read idem's own answers (its problem
	// documents and replays) and the headers it adds. Defaults to none.
	CORSOrigins []string `yaml:"cors_origins"`

	// ReadHeaderTimeout bounds how long a client may take to send its
	// request headers. Defaults to 10s.
	ReadHeaderTimeout Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds how long a client may take to send its whole
	// request, body included: a client trickling its body is cut off, and
	// its key is never reserved (the body is read before). Defaults to 60s.
	ReadTimeout Duration `yaml:"read_timeout"`
	// IdleTimeout is how long an idle keep-alive client connection is kept.
	// Defaults to 120s.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes limits the size of a request's headers; larger get 431.
	// Defaults to 64 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// ClientWriteTimeout bounds each write of an answer to a client: a
	// client that does not take a write within it is cut off, and the
	// upstream's answer is read to its end without it (the key completes,
	// as not replayable when it was passing through). Defaults to 30s.
	ClientWriteTimeout Duration `yaml:"client_write_timeout"`
	// MaxBodyMemory bounds the bytes of protected request bodies held in
	// memory at once, across all requests. A body is charged as its bytes
	// arrive, never for the length it announces: its buffer starts at 512
	// bytes and doubles with what has arrived (never past its length and a
	// byte), and each step is taken before the buffer grows; its share is
	// given back when its request is done. A body that finds no room left
	// gets 503 with Retry-After (busy), and the connection is closed. It
	// must be more than every route's max_body. Defaults to 64 MiB.
	MaxBodyMemory int64 `yaml:"max_body_memory"`
	// MaxReplayMemory bounds the bytes of stored answers held in memory
	// while they are read from the store and written to clients
	// (replays), across all requests: a replay counts for its stored body
	// (and 128 KiB more when it is decoded for a client that does not
	// accept its Content-Encoding) until the client has taken it or was
	// cut off (ClientWriteTimeout), and, with a store that reads answers
	// apart from their records (every store of idem), an answer over 8 KiB
	// counts for twice its stored size while it is read (four times with
	// EncryptionKeyFile: sealed, then opened), before it is read. A replay that would go over gets 503 with Retry-After (busy),
	// unwritten and, on such a store, unread; its key is untouched. It
	// must be at least 2 MiB (the largest stored answer, 1 MiB, decoded).
	// Defaults to 64 MiB.
	MaxReplayMemory int64 `yaml:"max_replay_memory"`
	// MaxDecodedReplay bounds the size a stored answer with a
	// Content-Encoding (gzip, deflate) is decoded to for a retry that does
	// not accept the coding; past it the retry gets 406 not-acceptable,
	// naming the Accept-Encoding that reads the answer as stored. Decoding
	// streams: it holds the decoder's state, not the decoded body.
	// Defaults to 16 MiB.
	MaxDecodedReplay int64 `yaml:"max_decoded_replay"`
	// MaxConnections bounds the client connections open at once; more
	// wait in the listen queue until one closes. Size it from the memory
	// the host gives idem serve (see docs/capacity.md): each open
	// connection holds some 20 KiB of its own, on top of the request
	// bodies (MaxBodyMemory) and replays (MaxReplayMemory) it may hold;
	// on the Redis store a retry of a completed key also reads its stored
	// answer whole before either budget is asked.
	// Defaults to 0: no limit.
	MaxConnections int `yaml:"max_connections"`

	// MergeSlashes makes runs of '/' in a request's path one ("//pay" is
	// "/pay"), for the operation and for the upstream, as nginx and Go's
	// ServeMux read paths. Set it to false for an upstream to which "//"
	// means something. Defaults to true.
	MergeSlashes *bool `yaml:"merge_slashes"`
	// EscapedSlashes is what an encoded slash (%2F) in a path does: "keep"
	// it encoded, apart from '/', as RFC 3986 says; "decode" it to '/',
	// for upstreams that decode it before they route (most WSGI servers);
	// or "reject" protected requests that carry one (400). Defaults to
	// keep.
	EscapedSlashes EscapedSlashes `yaml:"escaped_slashes"`
	// PathParams is what a ';' in a path does (a matrix or path parameter,
	// "/pay;jsessionid=1"): "reject" protected requests that carry one
	// (400); "strip" each segment's parameters, as Java servlet containers
	// do before they route; or "keep" them as part of the path. Defaults
	// to reject.
	PathParams PathParams `yaml:"path_params"`

	// Protocols are the TLS, HTTP/2 and gRPC settings of the listeners
	// and the upstream.
	Protocols `yaml:",inline"`

	// Settings are the defaults of every route.
	Settings `yaml:",inline"`

	// Routes override Settings for the requests they match, in ServeMux
	// pattern syntax ("POST /payments/{id}/refund"). A request no route
	// matches gets Settings.
	Routes []Route `yaml:"routes"`
}

// Settings is how a route is protected. Unset fields inherit from the
// global settings, then from the defaults.
type Settings struct {
	// Mode is enforce or observe (forward everything, count what
	// enforcement would do; see docs/adoption.md). Defaults to enforce.
	Mode Mode `yaml:"mode"`
	// OptionalKey lets a protected request without a key through,
	// unprotected, instead of 400. Defaults to false.
	OptionalKey *bool `yaml:"optional_key"`
	// ScopeHeader names the headers whose values scope keys (one name or
	// a list). Defaults to Authorization, unless ScopeCookie is set. A route
	// that sets either ScopeHeader or ScopeCookie replaces both.
	ScopeHeader Names `yaml:"scope_header"`
	// ScopeCookie names the cookies whose values scope keys (one name or a
	// list), after the headers. Defaults to none.
	ScopeCookie Names `yaml:"scope_cookie"`
	// HostAliases are host names that count as one in operations, for an
	// upstream that serves them as one API (api.example.com and
	// www.example.com): a request to any of them is named after the
	// first. "*" alone makes every host one, for an upstream that never
	// reads the Host. Names compare as hosts do: in any case, with or
	// without a trailing dot or a default port, an internationalised name
	// as Unicode or A-labels. A route that sets it replaces the global
	// one. Defaults to none: every host is an operation of its own.
	HostAliases []string `yaml:"host_aliases"`
	// ScopeLabelHeader names a request header whose values (joined with
	// ", ") label each new key for operators, as its scope label: shown by
	// the admin API, the review page and idem keys, and searched by
	// (label=), while the scope stays a digest nobody can read. It decides
	// nothing: a retry with another label is the same key, which keeps the
	// first one. Name a header your gateway sets, after it authenticated
	// the caller, to an opaque ID of theirs (X-Account-Id): clients can
	// send any value in it. Authorization, Proxy-Authorization, Cookie and
	// the scope headers are refused. A route that sets it replaces the
	// global one. Defaults to none: no label.
	ScopeLabelHeader string `yaml:"scope_label_header"`
	// Anonymous is what happens to a protected request that carries none of
	// the scope headers and cookies: "reject" (401, scope-missing) or
	// "shared" (one scope for all of them). Defaults to reject.
	Anonymous Anonymous `yaml:"anonymous"`
	// ExcludeFields are JSON Pointers of body members left out of the
	// fingerprint. Defaults to none.
	ExcludeFields []string `yaml:"exclude_fields"`
	// IncludeFields, if set, are the only JSON Pointers of body members
	// that count in the fingerprint. Defaults to none: the whole body.
	IncludeFields []string `yaml:"include_fields"`
	// KeepHeaders, if set, are the only headers of the upstream's answer
	// stored and replayed (Content-Type always is). Defaults to all but
	// those never stored (Set-Cookie, Date, hop-by-hop, credentials).
	KeepHeaders Names `yaml:"keep_headers"`
	// DropHeaders are headers of the upstream's answer never stored nor
	// replayed (X-Request-Id, Server-Timing). Defaults to none.
	DropHeaders Names `yaml:"drop_headers"`
	// Wait makes a duplicate of an in-flight request wait up to this long
	// and replay, instead of 409. Defaults to 0.
	Wait *Duration `yaml:"wait"`
	// Lease is the in-flight lease, renewed while the upstream works.
	// Defaults to 30s.
	Lease *Duration `yaml:"lease"`
	// Retention is how long a completed key is kept. Defaults to 24h.
	Retention *Duration `yaml:"retention"`
	// ReleaseStatuses are the upstream statuses that release the key
	// instead of storing the answer. Defaults to [429, 503].
	ReleaseStatuses []Status `yaml:"release_statuses"`
	// Ambiguous is what happens when the upstream failed after the request
	// was sent: "escalate" (needs_review) or "release" (only for upstreams
	// that are themselves idempotent on the forwarded key). Defaults to
	// escalate.
	Ambiguous Ambiguous `yaml:"ambiguous"`
	// MaxBody is the request body limit for fingerprinting; larger requests
	// get 413. Defaults to 1048576.
	MaxBody *int64 `yaml:"max_body"`
	// UpstreamDeadline bounds a protected request's whole upstream call,
	// its answer's body included; past it the client gets 504 and the key
	// goes to review (or is released, by Ambiguous). Defaults to 5m.
	UpstreamDeadline *Duration `yaml:"upstream_deadline"`
	// ResolverURL, if set, is asked what became of every key of the route
	// that goes to review or whose lease expired (see HTTPResolver).
	// Defaults to none: such keys wait for a person.
	ResolverURL string `yaml:"resolver_url"`
	// StoreRequest keeps the request body on the record (up to 64 KiB),
	// for the operator who settles a key in review. Defaults to false.
	StoreRequest *bool `yaml:"store_request"`
	// MethodOverride is what the method-override headers
	// (X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override) do on
	// requests whose own method routes them here: "protect" takes the
	// method they name as the request's, for protection, when it is
	// protected (the request is forwarded unchanged, override included);
	// "strip" removes them before forwarding; "refuse" answers 400.
	// Defaults to protect.
	MethodOverride MethodOverride `yaml:"method_override"`
	// NewKeysPerScope caps the new keys each scope may reserve per
	// interval (see NewKeyLimit): the global setting is one count per
	// scope shared by every route that does not set its own; a route
	// that sets it counts apart, and limit 0 there turns it off. Routes in
	// observe mode never refuse. Defaults to none: no cap.
	NewKeysPerScope *NewKeyLimit `yaml:"new_keys_per_scope"`
	// GRPCStreams is what the route does with streaming gRPC, gRPC-Web and
	// Connect calls, which idem never protects: pass them on, unbuffered
	// and unprotected, or refuse them (FAILED_PRECONDITION,
	// METHOD_UNPROTECTED). Either way a streaming call that carries a key
	// is logged and counted (idem_proxy_grpc_streaming_keys_total).
	// Defaults to pass.
	GRPCStreams GRPCStreams `yaml:"grpc_streams"`
}

// Route is the settings of the requests matching one ServeMux pattern.
type Route struct {
	// Match is a ServeMux pattern: "POST /payments", "/webhooks/",
	// "PUT /items/{id}". With a method, that method is protected on the
	// route; without, POST and PATCH are.
	Match Pattern `yaml:"match"`
	// Disabled passes the route's requests through unprotected.
	Disabled bool `yaml:"disabled"`
	// Settings override the global settings.
	Settings `yaml:",inline"`
}

// Defaults.
const (
	DefaultListen      = "127.0.0.1:8080"
	DefaultStore       = "sqlite://idem.db"
	DefaultScopeHeader = "Authorization"
	// DefaultAdminHost is the host the admin listener binds when its
	// address names none (":9090").
	DefaultAdminHost = "127.0.0.1"
	// Listener defaults.
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxBody           = 1 << 20
	// DefaultClientWriteTimeout is Config.ClientWriteTimeout's default.
	DefaultClientWriteTimeout = 30 * time.Second
	// DefaultMaxBodyMemory is Config.MaxBodyMemory's default.
	DefaultMaxBodyMemory = 64 << 20
	// DefaultMaxReplayMemory is Config.MaxReplayMemory's default.
	DefaultMaxReplayMemory = 64 << 20
	// DefaultMaxDecodedReplay is Config.MaxDecodedReplay's default.
	DefaultMaxDecodedReplay = idem.DefaultMaxDecodedReplay
	// DefaultUpstreamDeadline is Settings.UpstreamDeadline's default.
	DefaultUpstreamDeadline = 5 * time.Minute
)

// WithDefaults returns c with its zero fields filled in.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Store == "" {
		c.Store = DefaultStore
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = Duration(30 * time.Second)
	}
	if c.UpstreamTimeout == 0 {
		c.UpstreamTimeout = Duration(60 * time.Second)
	}
	if c.UpstreamIdleTimeout == 0 {
		c.UpstreamIdleTimeout = Duration(DefaultUpstreamIdleTimeout)
	}
	if c.RecoverInterval == 0 {
		c.RecoverInterval = Duration(time.Minute)
	}
	if c.PurgeInterval == 0 {
		c.PurgeInterval = Duration(5 * time.Minute)
	}
	if c.PurgeBatch == 0 {
		c.PurgeBatch = 500
	}
	if c.LogFormat == "" {
		c.LogFormat = "text"
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if len(c.ScopeHeader) == 0 && len(c.ScopeCookie) == 0 {
		c.ScopeHeader = Names{DefaultScopeHeader}
	}
	if c.Anonymous == "" {
		c.Anonymous = AnonymousReject
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = Duration(DefaultReadHeaderTimeout)
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = Duration(DefaultReadTimeout)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = Duration(DefaultIdleTimeout)
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.ClientWriteTimeout == 0 {
		c.ClientWriteTimeout = Duration(DefaultClientWriteTimeout)
	}
	if c.MaxBodyMemory == 0 {
		c.MaxBodyMemory = DefaultMaxBodyMemory
	}
	if c.MaxReplayMemory == 0 {
		c.MaxReplayMemory = DefaultMaxReplayMemory
	}
	if c.MaxDecodedReplay == 0 {
		c.MaxDecodedReplay = DefaultMaxDecodedReplay
	}
	if c.MergeSlashes == nil {
		c.MergeSlashes = new(true)
	}
	if c.EscapedSlashes == "" {
		c.EscapedSlashes = EscapedSlashesKeep
	}
	if c.PathParams == "" {
		c.PathParams = PathParamsReject
	}
	if c.MethodOverride == "" {
		c.MethodOverride = OverrideProtect
	}
	if c.LegacyOperations == nil {
		c.LegacyOperations = new(true)
	}
	return c
}

// Validate reports a configuration the proxy cannot start with.
func (c Config) Validate() error {
	if c.Upstream == "" {
		return errors.New("upstream is required (--upstream URL or upstream: in the config file)")
	}
	if err := checkUpstream(c.Upstream); err != nil {
		return err
	}
	if err := checkUpstreamName(c.UpstreamName); err != nil {
		return err
	}
	if err := c.Protocols.validate(); err != nil {
		return err
	}
	if c.UpstreamName == "" {
		if err := checkDefaultUpstreamName(c.Upstream); err != nil {
			return err
		}
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("log format %q must be text or json", c.LogFormat)
	}
	if _, err := ParseLevel(c.LogLevel); err != nil {
		return err
	}
	if c.UpstreamIdleTimeout < 0 {
		return fmt.Errorf("upstream_idle_timeout %v is negative", c.UpstreamIdleTimeout)
	}
	if c.PurgeBatch < 1 {
		return fmt.Errorf("purge_batch %d must be positive", c.PurgeBatch)
	}
	for _, p := range []struct {
		name string
		d    Duration
	}{{"read_header_timeout", c.ReadHeaderTimeout}, {"read_timeout", c.ReadTimeout}, {"idle_timeout", c.IdleTimeout}} {
		if p.d < 0 {
			return fmt.Errorf("%s %v is negative", p.name, p.d)
		}
	}
	if c.MaxHeaderBytes < 0 {
		return fmt.Errorf("max_header_bytes %d is negative", c.MaxHeaderBytes)
	}
	if c.ClientWriteTimeout < 0 {
		return fmt.Errorf("client_write_timeout %v is negative", c.ClientWriteTimeout)
	}
	if c.MaxConnections < 0 {
		return fmt.Errorf("max_connections %d is negative", c.MaxConnections)
	}
	if c.MaxReplayMemory < minReplayMemory {
		return fmt.Errorf("max_replay_memory %d is under %d: the largest stored answer, decoded for a client, could never be replayed", c.MaxReplayMemory, minReplayMemory)
	}
	if c.MaxDecodedReplay < 0 {
		return fmt.Errorf("max_decoded_replay %d is negative", c.MaxDecodedReplay)
	}
	if err := c.checkBodyMemory(); err != nil {
		return err
	}
	if err := c.EscapedSlashes.check(); err != nil {
		return err
	}
	if err := c.PathParams.check(); err != nil {
		return err
	}
	if err := c.Settings.validate(); err != nil {
		return err
	}
	if err := c.Settings.checkLabelNotScope(); err != nil {
		return err
	}
	if err := checkHookURL("review_webhook", c.ReviewWebhook); err != nil {
		return err
	}
	if err := checkOrigins(c.CORSOrigins); err != nil {
		return err
	}
	if err := checkProblemBase(c.ProblemBaseURL); err != nil {
		return err
	}
	if c.AdminTokenFile != "" && c.Admin == "" {
		return errAdminTokenFile
	}
	if _, err := c.adminTrustedProxies(); err != nil {
		return err
	}
	if p := c.AdminSignInIPv6Prefix; p != 0 && (p < 32 || p > 128) {
		return fmt.Errorf("admin_sign_in_ipv6_prefix (--admin-sign-in-ipv6-prefix) must be between 32 and 128, got %d", p)
	}
	for _, r := range c.Routes {
		if r.Match.Pattern == "" {
			return fmt.Errorf("line %d: a route needs match: (a ServeMux pattern such as \"POST /payments\")", r.Match.Line)
		}
		if err := r.Settings.validate(); err != nil {
			return fmt.Errorf("line %d: route %q: %w", r.Match.Line, r.Match.Pattern, err)
		}
		if err := checkRouteMethod(r.Match.Pattern); err != nil {
			return fmt.Errorf("line %d: route %q: %w", r.Match.Line, r.Match.Pattern, err)
		}
		if err := r.Settings.merge(c.Settings).checkLabelNotScope(); err != nil {
			return fmt.Errorf("line %d: route %q: %w", r.Match.Line, r.Match.Pattern, err)
		}
	}
	return checkRoutes(c.Routes)
}

func (s Settings) validate() error {
	if err := s.GRPCStreams.validate(); err != nil {
		return err
	}
	for _, names := range []Names{s.ScopeHeader, s.ScopeCookie} {
		for _, n := range names {
			if !validToken(n) {
				return fmt.Errorf("%q is not a header or cookie name", n)
			}
		}
	}
	if err := checkScopeHeaders(s.ScopeHeader); err != nil {
		return err
	}
	if err := checkHostAliases(s.HostAliases); err != nil {
		return err
	}
	if err := checkScopeLabelHeader(s.ScopeLabelHeader); err != nil {
		return err
	}
	if s.Anonymous != "" {
		if _, err := ParseAnonymous(string(s.Anonymous)); err != nil {
			return err
		}
	}
	if err := checkHookURL("resolver_url", s.ResolverURL); err != nil {
		return err
	}
	for _, n := range s.KeepHeaders {
		if idem.NeverStoredHeader(n) {
			return fmt.Errorf("keep_headers: %s is never stored", n)
		}
	}
	for _, f := range []struct {
		name string
		ptrs []string
	}{{"exclude_fields", s.ExcludeFields}, {"include_fields", s.IncludeFields}} {
		for _, p := range f.ptrs {
			if !strings.HasPrefix(p, "/") {
				return fmt.Errorf("%s: %q is not a JSON Pointer (it must start with /)", f.name, p)
			}
		}
	}
	if s.MaxBody != nil && *s.MaxBody < 0 {
		return fmt.Errorf("max_body %d is negative", *s.MaxBody)
	}
	for _, p := range []struct {
		name string
		d    *Duration
	}{{"wait", s.Wait}, {"lease", s.Lease}, {"retention", s.Retention}, {"upstream_deadline", s.UpstreamDeadline}} {
		if p.d != nil && *p.d < 0 {
			return fmt.Errorf("%s %v is negative", p.name, time.Duration(*p.d))
		}
	}
	if s.Lease != nil && *s.Lease != 0 && time.Duration(*s.Lease) < time.Second {
		return fmt.Errorf("lease %v is under a second", time.Duration(*s.Lease))
	}
	if s.Retention != nil && *s.Retention != 0 && time.Duration(*s.Retention) < time.Second {
		return fmt.Errorf("retention %v is under a second", time.Duration(*s.Retention))
	}
	if s.MethodOverride != "" {
		if _, err := ParseMethodOverride(string(s.MethodOverride)); err != nil {
			return err
		}
	}
	if s.NewKeysPerScope != nil {
		if err := s.NewKeysPerScope.check(); err != nil {
			return err
		}
	}
	return nil
}

// merge returns s with the unset fields taken from parent.
func (s Settings) merge(parent Settings) Settings {
	if s.Mode == "" {
		s.Mode = parent.Mode
	}
	if s.OptionalKey == nil {
		s.OptionalKey = parent.OptionalKey
	}
	if len(s.ScopeHeader) == 0 && len(s.ScopeCookie) == 0 {
		s.ScopeHeader, s.ScopeCookie = parent.ScopeHeader, parent.ScopeCookie
	}
	if s.ScopeLabelHeader == "" {
		s.ScopeLabelHeader = parent.ScopeLabelHeader
	}
	if s.HostAliases == nil {
		s.HostAliases = parent.HostAliases
	}
	if s.Anonymous == "" {
		s.Anonymous = parent.Anonymous
	}
	if s.ExcludeFields == nil {
		s.ExcludeFields = parent.ExcludeFields
	}
	if s.IncludeFields == nil {
		s.IncludeFields = parent.IncludeFields
	}
	if s.KeepHeaders == nil {
		s.KeepHeaders = parent.KeepHeaders
	}
	if s.DropHeaders == nil {
		s.DropHeaders = parent.DropHeaders
	}
	if s.Wait == nil {
		s.Wait = parent.Wait
	}
	if s.Lease == nil {
		s.Lease = parent.Lease
	}
	if s.Retention == nil {
		s.Retention = parent.Retention
	}
	if s.ReleaseStatuses == nil {
		s.ReleaseStatuses = parent.ReleaseStatuses
	}
	if s.Ambiguous == "" {
		s.Ambiguous = parent.Ambiguous
	}
	if s.MaxBody == nil {
		s.MaxBody = parent.MaxBody
	}
	if s.UpstreamDeadline == nil {
		s.UpstreamDeadline = parent.UpstreamDeadline
	}
	if s.ResolverURL == "" {
		s.ResolverURL = parent.ResolverURL
	}
	if s.StoreRequest == nil {
		s.StoreRequest = parent.StoreRequest
	}
	if s.MethodOverride == "" {
		s.MethodOverride = parent.MethodOverride
	}
	if s.NewKeysPerScope == nil {
		s.NewKeysPerScope = parent.NewKeysPerScope
	}
	if s.GRPCStreams == "" {
		s.GRPCStreams = parent.GRPCStreams
	}
	return s
}

// upstreamDeadline is the merged settings' upstream deadline.
func (s Settings) upstreamDeadline() time.Duration {
	if s.UpstreamDeadline == nil || *s.UpstreamDeadline == 0 {
		return DefaultUpstreamDeadline
	}
	return s.UpstreamDeadline.d()
}

// checkScopeLabelHeader refuses a scope label header that is not a header
// name, or that carries credentials: a label is shown to operators in
// clear, and kept for the record's whole retention.
func checkScopeLabelHeader(name string) error {
	if name == "" {
		return nil
	}
	if !validToken(name) {
		return fmt.Errorf("scope_label_header (--scope-label-header): %q is not a header name", name)
	}
	switch canon := http.CanonicalHeaderKey(name); canon {
	case "Authorization", "Proxy-Authorization", "Cookie":
		return fmt.Errorf("scope_label_header (--scope-label-header): %s carries credentials, and a scope label is shown to operators in clear; name a header your gateway sets to an opaque ID of the caller, such as X-Account-Id", canon)
	}
	return nil
}

// checkLabelNotScope refuses, in merged settings, a scope label header
// that is one of the scope headers: its value is the credential that
// scopes keys, which the scope keeps only as a digest.
func (s Settings) checkLabelNotScope() error {
	if s.ScopeLabelHeader == "" {
		return nil
	}
	canon := http.CanonicalHeaderKey(s.ScopeLabelHeader)
	headers := s.ScopeHeader
	if len(headers) == 0 && len(s.ScopeCookie) == 0 {
		headers = Names{DefaultScopeHeader}
	}
	for _, h := range headers {
		if http.CanonicalHeaderKey(h) == canon {
			return fmt.Errorf("scope_label_header (--scope-label-header): %s is a scope header: its value is the credential that scopes keys, kept only as a digest, and a scope label is shown to operators in clear; name a header your gateway sets to an opaque ID of the caller", canon)
		}
	}
	return nil
}

// scopeLabel is the merged settings' idem.Config.ScopeLabel, nil without a
// scope label header.
func (s Settings) scopeLabel() func(*http.Request) string {
	if s.ScopeLabelHeader == "" {
		return nil
	}
	return idem.HeaderScopeLabel(s.ScopeLabelHeader)
}

// scopeSources is the merged settings' scope sources.
func (s Settings) scopeSources() ScopeSources {
	return ScopeSources{Headers: s.ScopeHeader, Cookies: s.ScopeCookie}
}

// policy turns merged settings into the middleware's policy.
func (s Settings) policy() idem.Policy {
	// A ReverseProxy flushes every answer without a Content-Length as it
	// copies it; buffering those flushes keeps ordinary chunked answers
	// replayable (event streams still stream).
	p := idem.Policy{ExcludeFields: s.ExcludeFields, IncludeFields: s.IncludeFields, KeepHeaders: s.KeepHeaders, DropHeaders: s.DropHeaders,
		MaxRequestBody: DefaultMaxBody, BufferFlushes: true, Observe: s.Mode == ModeObserve}
	if s.OptionalKey != nil {
		p.KeyOptional = *s.OptionalKey
	}
	if s.Wait != nil {
		p.Wait = time.Duration(*s.Wait)
	}
	if s.Lease != nil {
		p.Lease = time.Duration(*s.Lease)
	}
	if s.Retention != nil {
		p.Retention = time.Duration(*s.Retention)
	}
	if s.MaxBody != nil {
		p.MaxRequestBody = *s.MaxBody
		if p.MaxRequestBody == 0 {
			p.MaxRequestBody = DefaultMaxBody
		}
	}
	if s.ReleaseStatuses != nil {
		p.ReleaseStatuses = make([]int, len(s.ReleaseStatuses))
		for i, st := range s.ReleaseStatuses {
			p.ReleaseStatuses[i] = int(st)
		}
	}
	if s.StoreRequest != nil {
		p.StoreRequestBody = *s.StoreRequest
	}
	return p
}

// LoadConfig reads a YAML configuration file. Unknown fields and invalid
// values are errors that name the file and line.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses a YAML configuration. It does not fill defaults nor
// validate cross-field rules; see Config.WithDefaults and Config.Validate.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, yamlError(err)
	}
	for i, r := range c.Routes {
		if err := r.Settings.validate(); err != nil {
			return Config{}, fmt.Errorf("line %d: route %q: %w", r.Match.Line, r.Match.Pattern, err)
		}
		if r.Match.Pattern == "" {
			return Config{}, fmt.Errorf("routes[%d]: a route needs match: (a ServeMux pattern such as \"POST /payments\")", i)
		}
	}
	if err := c.Settings.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Duration is a time.Duration written as "30s" or "24h" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: %q is not a duration (use e.g. 30s, 5m, 24h)", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

func (d Duration) d() time.Duration { return time.Duration(d) }

// String formats d as time.Duration does.
func (d Duration) String() string { return time.Duration(d).String() }

// Status is an HTTP status code between 100 and 599.
type Status int

// UnmarshalYAML parses and checks a status code.
func (s *Status) UnmarshalYAML(n *yaml.Node) error {
	var v int
	if err := n.Decode(&v); err != nil || v < 100 || v > 599 {
		return fmt.Errorf("line %d: %q is not an HTTP status code (100-599)", n.Line, n.Value)
	}
	*s = Status(v)
	return nil
}

// Ambiguous is the policy for an upstream that failed after the request
// was sent: the operation may or may not have happened.
type Ambiguous string

// The ambiguous-outcome policies.
const (
	// AmbiguousEscalate moves the key to needs_review: retries get 409
	// until an operator or a resolver decides. The default.
	AmbiguousEscalate Ambiguous = "escalate"
	// AmbiguousRelease releases the key, so a retry is forwarded again.
	// Choose it only for upstreams that are themselves idempotent on the
	// forwarded Idempotency-Key.
	AmbiguousRelease Ambiguous = "release"
)

// UnmarshalYAML checks the policy name.
func (a *Ambiguous) UnmarshalYAML(n *yaml.Node) error {
	switch v := Ambiguous(n.Value); v {
	case AmbiguousEscalate, AmbiguousRelease:
		*a = v
		return nil
	}
	return fmt.Errorf("line %d: ambiguous must be escalate or release, got %q", n.Line, n.Value)
}

// Pattern is a ServeMux pattern with the line it was read from.
type Pattern struct {
	Pattern string
	Line    int
}

// UnmarshalYAML checks the pattern with a ServeMux.
func (p *Pattern) UnmarshalYAML(n *yaml.Node) error {
	p.Pattern, p.Line = n.Value, n.Line
	if err := checkPattern(n.Value); err != nil {
		return fmt.Errorf("line %d: match %q: %v", n.Line, n.Value, err)
	}
	return nil
}

// checkPattern reports whether ServeMux accepts pattern.
func checkPattern(pattern string) error {
	if pattern == "" {
		return errors.New("empty pattern")
	}
	if err := checkRouteMethod(pattern); err != nil {
		return err
	}
	return handle(http.NewServeMux(), pattern, http.NotFoundHandler())
}

// adminTrustedProxies parses AdminTrustedProxies: each an address (one
// host) or a CIDR prefix.
func (c Config) adminTrustedProxies() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.AdminTrustedProxies {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("admin_trusted_proxies (--admin-trusted-proxy): %q is neither an address nor a CIDR prefix (such as 10.0.0.0/8)", s)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
