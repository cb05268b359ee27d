package idemproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"golang.org/x/net/idna"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// An operation of the proxy names everything that makes two requests
// different work for the upstream: the method, the path, the authority the
// client addressed (which the upstream reads as X-Forwarded-Host, and by
// which it may route tenants) and the upstream itself (two proxies in
// front of different APIs may share a store):
//
//	POST /orders host=shop-a.example upstream=orders.internal:9000
//
// Records stored by earlier versions are named by the method and path
// alone (legacyOperation); see Config.LegacyOperations.

// Operation-name fields after the method and path.
const (
	opHost     = " host="
	opUpstream = " upstream="
)

// AnyHost in HostAliases makes every host one: the operation names none.
const AnyHost = "*"

// maxHostLength is the longest authority the proxy names in an operation:
// a DNS name (253 bytes) with a port. Longer ones are refused (400).
const maxHostLength = 253 + len(":65535")

// identity names a route's operations.
type identity struct {
	upstream string            // the upstream's name
	aliases  map[string]string // a normalised host → the name it counts as
	anyHost  bool              // every host is one (AnyHost)
}

// newIdentity returns the naming of a route with merged settings s, in
// front of the upstream named upstream. s.HostAliases was checked.
func newIdentity(upstream string, s Settings) *identity {
	id := &identity{upstream: upstream}
	for i, h := range s.HostAliases {
		if h == AnyHost {
			id.anyHost = true
			break
		}
		n, _ := normalizeHost(h)
		if i == 0 {
			id.aliases = map[string]string{}
		}
		first, _ := normalizeHost(s.HostAliases[0])
		id.aliases[n] = first
	}
	return id
}

// opOverrideKey is the context key of the operation a request keeps, set
// when a record of an earlier version names it (see legacyLookup).
type opOverrideKey struct{}

// operation is the route's idem.Config.Operation.
func (id *identity) operation(r *http.Request) string {
	if op, ok := r.Context().Value(opOverrideKey{}).(string); ok && op == legacyOperation(r) {
		return op
	}
	host, _ := requestHost(r)
	return id.name(r.Method, r.URL.EscapedPath(), host)
}

// hostContext carries a protected request's authority, normalised once
// (route.ServeHTTP), to its operation's name and its X-Forwarded-Host.
type hostContext struct {
	context.Context
	raw, host string // r.Host, and normalizeHost's spelling of it
}

type hostKey struct{}

func (c *hostContext) Value(key any) any {
	if key == (hostKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// withHost returns r with ctx, carrying host, the normalised spelling of
// r.Host.
func withHost(ctx context.Context, r *http.Request, host string) *http.Request {
	return r.WithContext(&hostContext{Context: ctx, raw: r.Host, host: host})
}

// requestHost returns normalizeHost(r.Host), as carried by r's context
// when it was normalised already.
func requestHost(r *http.Request) (string, bool) {
	if c, ok := r.Context().Value(hostKey{}).(*hostContext); ok && c.raw == r.Host {
		return c.host, true
	}
	return normalizeHost(r.Host)
}

// name is the operation of method on path at host (normalised).
func (id *identity) name(method, path, host string) string {
	switch {
	case id.anyHost:
		host = AnyHost
	case id.aliases != nil:
		if a, ok := id.aliases[host]; ok {
			host = a
		}
	}
	return method + " " + path + opHost + host + opUpstream + id.upstream
}

// legacyOperation is the operation of earlier versions: method and path,
// as escaped on the wire.
func legacyOperation(r *http.Request) string { return r.Method + " " + r.URL.EscapedPath() }

// splitOperation returns the method and path of an operation, of this
// version or an earlier one.
func splitOperation(op string) (method, path string) {
	method, rest, _ := strings.Cut(op, " ")
	path, _, _ = strings.Cut(rest, " ")
	return method, path
}

// operationHost returns the host an operation of this version names, ""
// for one of an earlier version.
func operationHost(op string) string {
	_, rest, ok := strings.Cut(op, opHost)
	if !ok {
		return ""
	}
	host, _, _ := strings.Cut(rest, opUpstream)
	return host
}

// normalizeHost returns the authority h as one spelling of it: ASCII
// lower-case, an internationalised name as its A-labels (IDNA), without a
// trailing dot, an IP address in its canonical form, a port without
// leading zeros, and without a default port (80, 443) or an empty one. ok
// is false for an authority longer than maxHostLength, or that is not one
// (white space, control characters, a comma: X-Forwarded-Host would carry
// it as a list).
// An empty h (an HTTP/1.0 request without Host) is "".
func normalizeHost(h string) (string, bool) {
	if normalHost(h) {
		return h, true
	}
	return canonicalHost(h)
}

// canonicalHost is normalizeHost without normalHost's shortcut.
func canonicalHost(h string) (string, bool) {
	if h == "" {
		return "", true
	}
	if len(h) > maxHostLength {
		return "", false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; c <= ' ' || c == 0x7f || c == '/' || c == '@' || c == ',' {
			return "", false
		}
	}
	host, port := h, ""
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.HasSuffix(h, "]") {
		if strings.Count(h, ":") > 1 && !strings.HasPrefix(h, "[") {
			host = h // a bare IPv6 address, no port
		} else {
			host, port = h[:i], h[i+1:]
		}
	}
	if t := strings.TrimLeft(port, "0"); t != port && strings.Trim(port, "0123456789") == "" {
		port = t // "0080" is port 80
		if port == "" {
			port = "0"
		}
	}
	if port == "80" || port == "443" {
		port = ""
	}
	host = strings.TrimPrefix(strings.TrimSuffix(host, "]"), "[")
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.String()
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
	} else {
		host = strings.TrimSuffix(host, ".")
		if ascii, err := idna.Lookup.ToASCII(host); err == nil {
			host = ascii
		} else {
			host = strings.ToLower(host) // not a DNS name: kept apart from every one
		}
	}
	if port != "" {
		host += ":" + port
	}
	if len(host) > maxHostLength {
		return "", false
	}
	return host, true
}

// normalHost reports whether h is its own normalizeHost spelling, by a
// check that costs no allocation: lower-case ASCII letters, digits, dots
// and hyphens, not ending in a dot nor holding an A-label, and a port, if any, of digits without
// a leading zero, other than 80 and 443. Such a name is its own A-labels,
// and an IPv4 address that netip parses is written so already (it
// refuses leading zeros).
func normalHost(h string) bool {
	if len(h) > maxHostLength {
		return false
	}
	host, port, hasPort := strings.Cut(h, ":")
	if host == "" || host[len(host)-1] == '.' || strings.Contains(host, "xn--") {
		return false // xn--: IDNA checks the label
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '.' && c != '-' {
			return false
		}
	}
	if !hasPort {
		return true
	}
	if port == "" || port[0] == '0' || port == "80" || port == "443" {
		return false
	}
	for i := 0; i < len(port); i++ {
		if c := port[i]; c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// upstreamName is the default name of the upstream u in operations: its
// host (normalised as a request's) and its base path, without a trailing
// slash. The scheme does not count: one API over http and https is one.
func upstreamName(u *url.URL) string {
	h, _ := normalizeHost(u.Host)
	return h + strings.TrimSuffix(u.EscapedPath(), "/")
}

// maxUpstreamName is the longest name of the upstream in operations, which
// leaves room in one (idem.MaxOperationLength) for the method, a path and
// the longest host.
const maxUpstreamName = maxHostLength + 256

// checkUpstreamName refuses an upstream name that cannot be read back out
// of an operation.
func checkUpstreamName(n string) error {
	if len(n) > maxUpstreamName {
		return fmt.Errorf("upstream_name (--upstream-name) is %d bytes; at most %d", len(n), maxUpstreamName)
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("upstream_name (--upstream-name) %q must be visible ASCII, without spaces", n)
		}
	}
	return nil
}

// checkDefaultUpstreamName refuses an upstream URL whose host and base
// path, its name in operations when upstream_name is not set, are too long
// to leave room in an operation for a path: every protected request would
// be refused (414).
func checkDefaultUpstreamName(upstream string) error {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil // checkUpstream said so
	}
	if _, ok := normalizeHost(u.Host); !ok {
		return fmt.Errorf("upstream %q: its host is not one idem can name operations by; set upstream_name (--upstream-name)", upstream)
	}
	if n := upstreamName(u); len(n) > maxUpstreamName {
		return fmt.Errorf("upstream: its host and base path, which name it in every operation, are %d bytes, and at most %d leave room for a path; set a shorter upstream_name (--upstream-name)", len(n), maxUpstreamName)
	}
	return nil
}

// checkHostAliases refuses aliases that are not host names, or "*" beside
// names.
func checkHostAliases(hs []string) error {
	for _, h := range hs {
		if h == AnyHost {
			if len(hs) > 1 {
				return errors.New(`host_aliases (--host-alias): "*" makes every host one; give it alone`)
			}
			continue
		}
		if _, ok := normalizeHost(h); !ok || h == "" {
			return fmt.Errorf("host_aliases (--host-alias): %q is not a host name", h)
		}
	}
	return nil
}

// notScopeHeaders are headers a proxy cannot scope by: the upstream never
// sees them as the client sent them. Go's server moves Host out of the
// header map; hop-by-hop headers are removed on the way (Proxy-Authorization
// included); the X-Forwarded-* headers and Forwarded are replaced by the
// proxy's own.
var notScopeHeaders = map[string]string{
	"Host":                "the authority is part of every operation already (see host_aliases), and is not a credential",
	"Connection":          "it is hop by hop: the upstream never sees it",
	"Proxy-Connection":    "it is hop by hop: the upstream never sees it",
	"Keep-Alive":          "it is hop by hop: the upstream never sees it",
	"Te":                  "it is hop by hop: the upstream never sees it",
	"Trailer":             "it is hop by hop: the upstream never sees it",
	"Transfer-Encoding":   "it is hop by hop: the upstream never sees it",
	"Upgrade":             "it is hop by hop: the upstream never sees it",
	"Proxy-Authorization": "it is hop by hop: the proxy removes it, so the upstream never sees it and cannot serve by it",
	"Content-Length":      "it is the body's framing, not a credential",
	"Forwarded":           "the proxy replaces it with its own",
	"X-Forwarded-For":     "the proxy replaces it with its own",
	"X-Forwarded-Host":    "the proxy replaces it with the request's Host, which is part of every operation already",
	"X-Forwarded-Proto":   "the proxy replaces it with its own",
}

// checkScopeHeaders refuses scope headers the proxy cannot scope by.
func checkScopeHeaders(names []string) error {
	for _, n := range names {
		if why, ok := notScopeHeaders[http.CanonicalHeaderKey(n)]; ok {
			return fmt.Errorf("scope_header (--scope-header) %s: %s; name the header that carries the client's credential", http.CanonicalHeaderKey(n), why)
		}
	}
	return nil
}

// legacyLookup runs after the middleware reserved a new key for r under
// the operation of this version (lease): it looks for a record that an
// earlier version stored under the operation of then (method and path),
// with the scope and key the middleware read. A retry across the upgrade
// is the same operation and keeps that name, so it never runs twice: the
// new key is released and r served again under the earlier name, which
// replays, waits, or answers 409 or 422 as for any record. A key the new
// name holds is answered by the middleware before any look-up, and a
// request without a valid key or scope never reserves one: the only cost
// is one store read per new key.
//
// It reports whether it answered r. When the store cannot say, the key is
// released and r answered 503 (observe mode forwards it, as it forwards
// what it cannot check).
func (f *forwarder) legacyLookup(w http.ResponseWriter, r *http.Request, lease *idem.Lease) (answered bool) {
	k := lease.Key()
	old := legacyOperation(r)
	// Whether there is one, without its answer: a large one is read, within
	// max_replay_memory, only when the retry replays it.
	_, err := f.p.engine.Head(r.Context(), idem.Key{Scope: k.Scope, Operation: old, Key: k.Key})
	switch {
	case errors.Is(err, idemstore.ErrNotFound), errors.Is(err, idem.ErrTooLong):
		return false
	case err == nil, errors.Is(err, idem.ErrSealed):
		// Served by the middleware under the earlier name, as a request
		// that carries no lease: the new one ends here.
		f.settle(r.Context(), lease, true, "")
		ctx := context.WithValue(idem.ContextWithLease(r.Context(), nil), opOverrideKey{}, old)
		f.legacyNext.ServeHTTP(w, r.WithContext(ctx))
		return true
	case f.observe && r.Context().Err() == nil:
		return false // observe mode forwards what it cannot check
	}
	settlement := f.settle(r.Context(), lease, true, "")
	f.p.count(f.label, idem.SituationUnavailable, settlement)
	if r.Context().Err() == nil {
		f.p.log.LogAttrs(r.Context(), slog.LevelWarn, "looking up a key stored under an earlier operation name failed; the request was not forwarded",
			slog.String("operation", old), slog.String("key_digest", idem.KeyDigest(k)), slog.String("settlement", settlement), slog.Any("error", err))
	}
	w.Header().Set("Retry-After", "1")
	f.p.writeProblem(w, idem.SituationUnavailable, "The idempotency store could not be reached; the request was not forwarded. Retry with the same key.", k.Key)
	return true
}
