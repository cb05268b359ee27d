package idemproxy

import (
	"context"
	"net/http"
	"slices"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/replaygate"
	"github.com/idem-dev/idem/internal/urlpath"
)

// routes is the handler of one configuration: a route for every request,
// found by a ServeMux (nil when there are no routes: def takes them all).
type routes struct {
	cfg   Config
	mux   *http.ServeMux
	def   *route
	paths pathOptions
}

// route is one route's handler: it decides whether a request is
// protected, and what the proxy's edges do to it (refused paths and
// overrides, upgrades), before idem's middleware, which reads the body
// within the proxy's body budget.
type route struct {
	p        *Proxy
	label    string   // the route's match pattern, or default: its metrics label
	methods  []string // protected methods; nil: POST and PATCH
	disabled bool
	override MethodOverride
	next     http.Handler // the middleware around the forwarder, or the forwarder alone
	rpc      *rpcRoute    // gRPC, gRPC-Web and Connect calls (grpc.go)
}

// protects reports whether the route protects method (see idem's method
// rule: HEAD goes with GET).
func (rt *route) protects(method string) bool {
	if rt.disabled {
		return false
	}
	ms := rt.methods
	if ms == nil {
		return method == http.MethodPost || method == http.MethodPatch
	}
	return slices.Contains(ms, method) || (method == http.MethodHead && slices.Contains(ms, http.MethodGet))
}

// lookup returns the route that serves r as method, or nil when the mux
// answers r itself (a redirect to the path with a trailing slash).
func (rs *routes) lookup(r *http.Request, method string) *route {
	if rs.mux == nil {
		return rs.def
	}
	merge := !rs.paths.mergeSlashes && strings.Contains(r.URL.Path, "//")
	if method == r.Method && !merge {
		h, _ := rs.mux.Handler(r)
		rt, _ := h.(*route)
		return rt
	}
	probe := *r
	probe.Method = method
	if merge {
		// ServeMux would redirect to the merged path: route as it would,
		// and serve the path the upstream reads apart.
		u := *r.URL
		u.Path, u.RawPath = cleanSlashes(u.Path), ""
		probe.URL = &u
	}
	h, _ := rs.mux.Handler(&probe)
	rt, _ := h.(*route)
	return rt
}

func cleanSlashes(p string) string { return string(urlpath.MergeSlashes([]byte(p))) }

// serve routes r: its path normalised, its method checked, its overrides
// applied, then to its route (or to the mux's own answer).
func (rs *routes) serve(w http.ResponseWriter, r *http.Request) {
	p := rs.def.p
	switch path := r.URL.EscapedPath(); {
	case r.Method == http.MethodConnect: // authority-form, passed on as it was
	case path == "" && r.URL.Opaque == "":
		r = withPath(r, "/") // absolute-form without a path
	case path == "" || path[0] != '/': // "*", or opaque ("http:pay"), which goes out as it came
		p.refuse(w, r, "", idem.SituationInvalidPath, "The request-target is not a path (only OPTIONS may use \"*\"); it was not forwarded.")
		return
	default:
		r = withPath(r, normalizePath(path, rs.paths))
	}
	// The route is found by the method as sent, or, for a spelling of
	// another method (see idem's method rule), by that method upper-cased,
	// as an upstream that upper-cases it routes it; the route serves the
	// request as sent.
	method := r.Method
	if !upperToken(method) {
		if !validToken(method) {
			p.refuse(w, r, "", idem.SituationInvalidMethod, "The request's method is not an HTTP token (RFC 9110), so idem cannot tell whether it names a protected method; it was not forwarded.")
			return
		}
		method = strings.ToUpper(method)
		if rs.protects(r, method) {
			p.refuse(w, r, "", idem.SituationInvalidMethod, "HTTP methods are case-sensitive: send "+method+". The request was not forwarded.")
			return
		}
	}
	if _, ok := r.Header["Upgrade"]; ok && httpUpgrade(r.Header) {
		// A tunnel that speaks HTTP would carry requests past idem.
		dropUpgrade(r.Header)
	}
	if ov, present, err := overrideOf(r.Header); present {
		mode := rs.cfg.MethodOverride
		if rt := rs.lookup(r, method); rt != nil {
			mode = rt.override
		}
		switch {
		case mode == OverrideStrip:
			stripOverrides(r.Header)
		case mode == OverrideRefuse:
			p.refuse(w, r, "", idem.SituationInvalidMethod, "This route refuses method-override headers (X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override); send the method itself.")
			return
		case err != nil:
			p.refuse(w, r, "", idem.SituationInvalidMethod, "The request's method-override headers cannot be read: "+err.Error()+".")
			return
		case ov != "" && ov != method && rs.protects(r, ov):
			// Protected as the method the upstream may run it as;
			// forwarded as sent.
			r = r.WithContext(context.WithValue(r.Context(), sentMethodKey{}, r.Method))
			r.Method, method = ov, ov
		case ov != "" && ov != method && rs.protects(r, method):
			// A protected request that an upstream honouring the override
			// runs as a method idem leaves alone: keyed as sent, its key
			// would hold that method's answer for the protected one.
			p.refuse(w, r, "", idem.SituationInvalidMethod, "This "+method+" carries a method-override header naming "+ov+", which is not protected here; an upstream that honours it would run something other than what the key is kept for. Send the method itself.")
			return
		}
	}
	if why := rs.paths.pathRefusal(r.URL.EscapedPath()); why != "" && rs.protects(r, method) {
		p.refuse(w, r, "", idem.SituationInvalidPath, why)
		return
	}
	if rt := rs.lookup(r, method); rt != nil {
		rt.ServeHTTP(w, r)
		return
	}
	rs.mux.ServeHTTP(w, r) // the mux's own answer
}

// protects reports whether r is protected as method: on its route, or,
// when its path carries what path_params or escaped_slashes reject, on
// the route of the path as an upstream that strips the parameters or
// decodes %2F reads it ("PUT /items;x/5" is a servlet's "PUT /items/5").
func (rs *routes) protects(r *http.Request, method string) bool {
	if rt := rs.lookup(r, method); rt != nil && rt.protects(method) {
		return true
	}
	if alt := rs.paths.otherReading(r.URL.EscapedPath()); alt != "" {
		rt := rs.lookup(withPath(r, alt), method)
		return rt != nil && rt.protects(method)
	}
	return false
}

// httpUpgrade reports whether h asks to upgrade to HTTP itself (h2c, or
// any HTTP/ version), a protocol in which requests would pass unseen.
func httpUpgrade(h http.Header) bool {
	for _, v := range h["Upgrade"] {
		for f := range strings.SplitSeq(v, ",") {
			f = strings.ToLower(strings.TrimSpace(f))
			if f == "h2c" || f == "h2" || strings.HasPrefix(f, "http/") {
				return true
			}
		}
	}
	return false
}

// sentMethodKey is the context key of the method a request was sent with,
// when the proxy protects it as the method its override names.
type sentMethodKey struct{}

// upperToken reports whether m is a token without lower-case letters: the
// usual spelling of a method, checked first.
func upperToken(m string) bool {
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 'A' || c > 'Z' {
			return validToken(m) && strings.ToUpper(m) == m
		}
	}
	return m != ""
}

// ServeHTTP applies the route's edges to r, then passes it on.
func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !rt.protects(r.Method) {
		rt.next.ServeHTTP(w, r)
		return
	}
	// A protected request never becomes a tunnel: an upgrade is hop by
	// hop, and a server may ignore it (RFC 9110 §7.8), so it is dropped.
	if _, ok := r.Header["Upgrade"]; ok {
		dropUpgrade(r.Header)
	}
	host, ok := normalizeHost(r.Host)
	if !ok {
		rt.p.refuse(w, r, rt.label, idem.SituationInvalidPath, "The request's Host is not an authority idem can name an operation by (too long, or not a host); it was not forwarded.")
		return
	}
	if c := rpcOf(r); c.kind != rpcNone && rt.rpc != nil {
		rt.rpc.serveRPC(w, withHost(r.Context(), r, host), c)
		return
	}
	// A replay is written from the stored answer, held until the client
	// takes it: it counts against max_replay_memory.
	r = withHost(replaygate.With(r.Context(), rt.p.replays), r, host)
	rt.next.ServeHTTP(w, r)
}

// dropUpgrade removes an upgrade from h, and "upgrade" from its Connection.
func dropUpgrade(h http.Header) {
	delete(h, "Upgrade")
	var keep []string
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" && !strings.EqualFold(f, "upgrade") {
				keep = append(keep, f)
			}
		}
	}
	if keep == nil {
		delete(h, "Connection")
		return
	}
	h["Connection"] = []string{strings.Join(keep, ", ")}
}

// refuse answers r with s's problem document: a request the proxy's edges
// refuse, before any key is read or reserved.
// route is the metrics label of the route that refused it, "" when none
// was chosen yet.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, route string, s idem.Situation, detail string) {
	p.count(route, s, "")
	key, err := idem.ParseKeyHeader(r.Header[idem.HeaderName])
	if err != nil {
		key = ""
	}
	p.writeProblem(w, s, detail, key)
}
