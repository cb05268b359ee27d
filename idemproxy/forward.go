package idemproxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"

	"github.com/idem-dev/idem"
)

// forwarder sends one route's requests to the upstream. For a protected
// request it owns the outcome of the upstream call: when the call fails it
// settles the key itself, through the public Lease API, and answers with
// the proxy's own problem document, which the middleware then never stores
// (the lease has ended, or was abandoned).
type forwarder struct {
	p         *Proxy
	label     string // the route's match pattern, or default: its metrics label
	rp        *httputil.ReverseProxy
	ambiguous Ambiguous
	deadline  time.Duration
	observe   bool      // the route observes: forwarded during shutdown too
	cap       *routeCap // the route's new-key cap, or nil
	// endToEnd are the request headers that reach the upstream as the
	// client sent them, whatever its Connection header says (see rewrite).
	endToEnd []string
	// legacyNext is the route's middleware, which serves a request whose
	// key an earlier version holds (see legacyLookup); nil when
	// Config.LegacyOperations is off.
	legacyNext http.Handler
}

func (f *forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	lease := idem.LeaseFrom(r.Context())
	if lease == nil {
		if f.observe && r.Body != nil && r.Body != http.NoBody {
			// An observe-mode finding passes on the body the middleware
			// read, which goes back to its pool when the handler returns,
			// while the transport may still be sending it (after an early
			// answer): guarded as a protected request's is.
			gb := &guardedBody{r: r.Body}
			defer gb.end()
			r = r.WithContext(r.Context())
			r.Body = gb
		}
		f.rp.ServeHTTP(w, r)
		return
	}
	op, legacy := r.Context().Value(opOverrideKey{}).(string)
	if legacy && lease.Key().Operation == op && !f.observe {
		f.retryUnderNewName(w, r, lease)
		return
	}
	// Before the shutdown check: a retry that an earlier version's record
	// answers is replayed during shutdown, as one the new name answers is.
	if !legacy && f.legacyNext != nil && f.legacyLookup(w, r, lease) {
		return
	}
	if f.p.closing.Load() && !f.observe {
		f.refuse(w, r, lease)
		return
	}
	over, counted := f.overCap(w, r, lease)
	if over {
		return
	}
	// Detached from the client's cancellation, so that a client hanging up
	// does not abort a call whose answer will be stored; bounded by the
	// route's deadline instead, which counts against the upstream only
	// (see callDeadline).
	cause := deadlineCause{f.deadline}
	x, ctx := newExchange(context.WithoutCancel(r.Context()), f.deadline, f.p.clientGrace(), cause, clientOf(w))
	defer x.deadline.stop()
	defer x.endBody()
	hw := &x.out
	hw.w = w
	f.proxy(hw, r.WithContext(ctx), x)

	rtErr, bodyErr := x.errs()
	if rtErr == nil && bodyErr == nil {
		if x.refusedUnreadBody() && f.passUnstored(r, lease, hw.status) == settledReleased {
			f.refund(counted)
		}
		hw.commit() // an answer without a body
		return
	}
	timedOut := context.Cause(ctx) == cause
	f.fail(w, r, lease, x, rtErr, bodyErr, timedOut, hw.committed, counted)
}

// proxy runs the reverse proxy. A failure to read the upstream's body makes
// ReverseProxy panic with http.ErrAbortHandler inside an http.Server (and
// return quietly outside one); the exchange has noted it, and the caller
// settles it either way.
func (f *forwarder) proxy(w http.ResponseWriter, r *http.Request, x *exchange) {
	defer func() {
		if v := recover(); v != nil {
			if _, bodyErr := x.errs(); v == http.ErrAbortHandler && bodyErr != nil {
				return
			}
			panic(v)
		}
	}()
	f.rp.ServeHTTP(w, r)
}

// passUnstored settles the key of a request that the upstream refused as
// such (refusesRequest) before it had the whole body: it did not run the
// operation with this request, so its answer (a 417, a 413 from its own
// limit, a 401 on the headers alone) is not the operation's. The key is
// released and the answer passed through unstored: a retry is forwarded
// again. Any other answer given that early follows the route's policy: a
// 400, 409 or 422 may come after acting on the part of the body read, a
// 2xx or 3xx is the upstream acting on the headers alone, and a 5xx a
// failure whose effect is unknown.
func (f *forwarder) passUnstored(r *http.Request, lease *idem.Lease, status int) string {
	settlement := f.settle(r.Context(), lease, true, "")
	if f.p.metrics != nil {
		f.p.metrics.outcomes.WithLabelValues(f.label, idem.Acquired.String(), settlement).Inc()
	}
	f.p.log.LogAttrs(r.Context(), slog.LevelDebug, "upstream refused the request before taking its body; its answer is passed on unstored",
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("key_digest", idem.KeyDigest(lease.Key())),
		slog.Int("status", status), slog.String("settlement", settlement))
	return settlement
}

// refuse answers a protected request that arrives during shutdown: it was
// never forwarded, so its key is released and a retry (after a restart, or
// on another instance) runs it.
func (f *forwarder) refuse(w http.ResponseWriter, r *http.Request, lease *idem.Lease) {
	s := idem.SituationShuttingDown
	settlement := f.settle(r.Context(), lease, true, "")
	detail := "The proxy is shutting down and did not forward this request; retry with the same key."
	if settlement == settledFailed {
		detail = "The proxy is shutting down and did not forward this request, but could not release its key: retries get 409 until the key is settled."
	}
	f.p.count(f.label, s, settlement)
	w.Header().Set("Retry-After", "1")
	f.p.writeProblem(w, s, detail, lease.Key().Key)
}

// retryUnderNewName answers a request that reserved its key under the
// operation name of an earlier version (see legacyLookup): the record that
// name was kept for was released or expired, or its lease ran out, after
// the look-up found it. Nothing runs under that name: a concurrent retry
// that found no such record reserved the new name and may be running, and
// two names would let the key run twice. The key is released, and the
// client told to retry, which then finds its key under the new name.
// Observe mode forwards it, as it forwards every request.
func (f *forwarder) retryUnderNewName(w http.ResponseWriter, r *http.Request, lease *idem.Lease) {
	s := idem.SituationInFlight
	settlement := f.settle(r.Context(), lease, true, "")
	f.p.count(f.label, s, settlement)
	f.p.log.LogAttrs(r.Context(), slog.LevelInfo, "a key reserved under an earlier operation name was released unforwarded; its retry takes the new name",
		slog.String("operation", lease.Key().Operation), slog.String("key_digest", idem.KeyDigest(lease.Key())), slog.String("settlement", settlement))
	w.Header().Set("Retry-After", "1")
	f.p.writeProblem(w, s, "The record an earlier version kept for this Idempotency-Key changed while the request was checked; it was not forwarded. Retry with the same key.", lease.Key().Key)
}

// fail settles the key of a request whose upstream call failed and answers
// it. Nothing sent: the key is released (502 upstream-unreachable).
// Perhaps sent, or the answer cut short: the outcome is unknown, so the key
// goes to review, or is released when the route's ambiguous policy says the
// upstream deduplicates by the forwarded key (502 upstream-failed, or 504
// upstream-timeout past a timeout). When the settlement cannot be recorded
// the lease is abandoned: the key stays pending until recovery settles it,
// and the proxy's answer is never stored. committed means part of the
// upstream's answer was already passed on: there is then no answer left to
// give, and the response is aborted. A key released unsent is given back
// to its scope's new-key count (counted).
func (f *forwarder) fail(w http.ResponseWriter, r *http.Request, lease *idem.Lease, x *exchange, rtErr, bodyErr error, timedOut, committed bool, counted *capWindow) {
	err, sent := bodyErr, true // the upstream answered: it had the request
	if rtErr != nil {
		err, sent = rtErr, x.sent(rtErr)
	}
	s := idem.SituationUpstreamUnreachable
	detail := "The upstream could not be reached; the request was not sent."
	switch {
	case !sent:
	case timedOut || isTimeout(err):
		s, detail = idem.SituationUpstreamTimeout, "The upstream did not answer in time after the request was sent, so its outcome is unknown."
	case bodyErr != nil:
		s, detail = idem.SituationUpstreamFailed, "The upstream's answer was cut short, so its outcome is unknown."
	default:
		s, detail = idem.SituationUpstreamFailed, "The upstream failed after the request was sent, so its outcome is unknown."
	}
	release := !sent || f.ambiguous == AmbiguousRelease
	reason := "upstream failed after the request was sent: " + err.Error()
	switch {
	case timedOut:
		reason = deadlineCause{f.deadline}.Error()
	case bodyErr != nil:
		reason = "the upstream's answer was cut short: " + err.Error()
	}
	settlement := f.settle(r.Context(), lease, release, reason)
	if settlement == settledReleased && !sent {
		f.refund(counted)
	}
	key := lease.Key().Key
	switch {
	case settlement == settledReleased && !sent:
		detail += " Retry with the same key."
	case settlement == settledReleased:
		detail += " The key was released (the route's ambiguous policy): a retry is forwarded again."
	case settlement == settledEscalated:
		detail += " The key needs review: retries get 409 until an operator or a resolver settles it."
	case settlement == settledLost:
		detail += " The key was settled elsewhere meanwhile: retry with the same key to learn how."
	default:
		detail += " What happened could not be recorded: the key stays reserved, and retries get 409 until it is settled."
	}
	f.p.count(f.label, s, settlement)
	f.p.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream error",
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("key_digest", idem.KeyDigest(lease.Key())), slog.String("outcome", s.Name),
		slog.String("settlement", settlement), slog.Bool("sent", sent), slog.Bool("answer_started", committed),
		x.connAttrs(), slog.Any("error", err))
	if committed {
		// Part of the upstream's answer went out (or into the middleware's
		// buffer): there is no clean answer left to give.
		panic(http.ErrAbortHandler)
	}
	clear(w.Header()) // the upstream's headers, if it sent any
	f.p.writeProblem(w, s, detail, key)
}

// Settlements the forwarder reports, as in idem.Event.Settlement.
const (
	settledReleased  = "released"
	settledEscalated = "escalated"
	settledLost      = "lost"
	settledFailed    = "failed"
	settledByProxy   = "handler" // the middleware's name for a lease its handler ended
)

// settle releases or escalates the lease. Lease.Release and Escalate run
// detached from ctx's cancellation and retry transient store errors; if
// they still fail the lease is abandoned, so that the middleware stores
// nothing and the record waits, pending, for recovery.
func (f *forwarder) settle(ctx context.Context, lease *idem.Lease, release bool, reason string) string {
	var err error
	if release {
		err = lease.Release(ctx)
	} else {
		err = lease.Escalate(ctx, reason)
	}
	switch {
	case err == nil && release:
		return settledReleased
	case err == nil:
		return settledEscalated
	}
	lease.Abandon()
	key := slog.String("key_digest", idem.KeyDigest(lease.Key()))
	if errors.Is(err, idem.ErrLeaseLost) {
		f.p.log.LogAttrs(ctx, slog.LevelWarn, "settling a key after an upstream error found it settled already", key, slog.Any("error", err))
		return settledLost
	}
	f.p.log.LogAttrs(ctx, slog.LevelError, "settling a key after an upstream error failed; it stays pending for recovery",
		key, slog.Bool("release", release), slog.Any("error", err))
	return settledFailed
}

// rewrite points the request at the upstream, with the client's authority
// in X-Forwarded-Host as operations name it (normalizeHost), and guards a
// protected request's body (guardedBody). What a protected request was matched and
// scoped by goes out even when the client's Connection header names it
// (which made ReverseProxy drop it as hop by hop): its key, Content-Type
// and Content-Encoding, the route's scope headers and, when it scopes by
// cookies, Cookie (see endToEndFields); and the method-override headers of
// one protected as their method. Dropped, they would leave the upstream
// to run a request other than the one its key was kept for: another body,
// or, without the credential, another tenant's (an upstream that takes a
// request without one for its default tenant).
//
// http.Transport re-sends a bodiless request that carries an
// Idempotency-Key (or X-Idempotency-Key) after a broken keep-alive
// connection, even when the first attempt may have been processed. A
// protected bodiless request keeps its framing (Content-Length: 0, never
// chunked, which some upstreams refuse), and its key header goes out under
// a map key the transport's check does not look at: header names are
// case-insensitive on the wire, so the upstream sees the same header.
func (f *forwarder) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(f.p.upstream)
	pr.SetXForwarded()
	if h, ok := requestHost(pr.In); ok && h != "" {
		// The upstream reads the authority as the operation names it:
		// spellings the proxy takes for one host ("Shop.Example.:80") are
		// one to an upstream that routes tenants by it byte for byte.
		pr.Out.Header.Set("X-Forwarded-Host", h)
	}
	dropForwardedAliases(pr.Out.Header)
	if m, ok := pr.In.Context().Value(sentMethodKey{}).(string); ok {
		pr.Out.Method = m // protected as its override's method, sent as it came
		// The override headers it was protected by go out with it, even
		// when Connection names them: dropped, the upstream would run it
		// as the method it was sent with, under a key kept for another.
		for name, v := range pr.In.Header {
			if isOverrideName(name) && pr.Out.Header[name] == nil {
				pr.Out.Header[name] = v
			}
		}
	}
	x := exchangeFrom(pr.Out.Context())
	if x != nil {
		// The key, the fields the fingerprint counts and the scope's
		// sources are end to end: naming them in Connection, which made
		// ReverseProxy drop them, does not keep them from the upstream.
		for _, name := range f.endToEnd {
			if v := pr.In.Header[name]; v != nil && pr.Out.Header[name] == nil {
				pr.Out.Header[name] = v
			}
		}
	}
	if x != nil {
		// The proxy has the whole body and sends it at once: Expect (and
		// the upstream's 100 Continue, or the transport's wait of up to
		// ExpectContinueTimeout for one) would serve nothing, and a 417
		// would answer a question the client no longer asks.
		pr.Out.Header.Del("Expect")
	}
	switch {
	case x == nil:
	case pr.Out.Body == nil || pr.Out.Body == http.NoBody:
		pr.Out.Body, pr.Out.ContentLength = http.NoBody, 0
		h := pr.Out.Header
		for _, name := range [...]string{"Idempotency-Key", "X-Idempotency-Key"} {
			if v, ok := h[name]; ok {
				delete(h, name)
				h[strings.ToLower(name)] = v
			}
		}
	case pr.Out.ContentLength > 0 && pr.Out.ContentLength <= inlineBody:
		// A copy of its own in a *bytes.Reader needs no guard, and
		// http.Transport sends a body it knows is in memory in the same
		// write as the headers, not in a second one.
		b, err := io.ReadAll(io.LimitReader(pr.Out.Body, pr.Out.ContentLength+1))
		if err != nil || int64(len(b)) != pr.Out.ContentLength {
			// Not what it announced (observe mode passes on a body that
			// failed mid-way): what was read, then the rest as it comes.
			pr.Out.Body = x.guard(io.NopCloser(io.MultiReader(bytes.NewReader(b), pr.Out.Body)), -1)
			return
		}
		pr.Out.Body = io.NopCloser(bytes.NewReader(b))
	default:
		size := pr.Out.ContentLength
		if l, ok := pr.Out.Body.(interface{ Len() int }); ok && size < 0 {
			size = int64(l.Len()) // a chunked body the middleware holds
		}
		pr.Out.Body = x.guard(pr.Out.Body, size)
	}
}

// dropForwardedAliases removes the client's forwarding headers spelt with
// underscores (X_Forwarded_Host), which ReverseProxy leaves: an upstream
// behind CGI, WSGI or Rack reads them as the same variable as the proxy's
// own (HTTP_X_FORWARDED_HOST), and could route by a host other than the
// one the operation names.
func dropForwardedAliases(h http.Header) {
	for name := range h {
		if strings.IndexByte(name, '_') < 0 {
			continue
		}
		switch strings.ToLower(strings.ReplaceAll(name, "_", "-")) {
		case "x-forwarded-host", "x-forwarded-for", "x-forwarded-proto", "forwarded":
			delete(h, name)
		}
	}
}

// endToEndFields are the fields of a protected request that always reach
// the upstream as the client sent them: its key, what the fingerprint reads
// of its body's meaning, and the scope's sources (its headers, and Cookie
// when it scopes by cookies). Proxy-Authorization, which the proxy never
// forwards, cannot be a scope header (checkScopeHeaders).
func endToEndFields(src ScopeSources) []string {
	names := []string{idem.HeaderName, "Content-Type", "Content-Encoding"}
	headers := src.Headers
	if len(headers) == 0 && len(src.Cookies) == 0 {
		headers = []string{DefaultScopeHeader}
	}
	for _, h := range headers {
		names = append(names, http.CanonicalHeaderKey(h))
	}
	if len(src.Cookies) > 0 {
		names = append(names, "Cookie")
	}
	return names
}

// inlineBody is the largest protected request body copied for the
// transport (see rewrite): small enough to join the headers in the
// transport's 4 KiB write buffer.
const inlineBody = 2 << 10

// upstreamError is the ReverseProxy's ErrorHandler. For a protected
// request it only notes the error: the forwarder settles and answers once
// the reverse proxy returns. An unprotected request gets the problem
// document at once.
func (f *forwarder) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if x := exchangeFrom(r.Context()); x != nil {
		x.setRoundTripErr(err)
		return
	}
	s, detail := idem.SituationUpstreamUnreachable, "The upstream could not be reached."
	switch {
	case NotSent(err):
	case isTimeout(err):
		s, detail = idem.SituationUpstreamTimeout, "The upstream did not answer in time."
	default:
		s, detail = idem.SituationUpstreamFailed, "The upstream failed before it answered."
	}
	// An unprotected request may still carry a key (a disabled route, an
	// optional key): the problem echoes it, as for a protected one.
	key, kerr := idem.ParseKeyHeader(r.Header[idem.HeaderName])
	if kerr != nil {
		key = ""
	}
	f.p.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream error", slog.String("method", r.Method), slog.String("path", r.URL.Path),
		keyDigest(idem.Event{Operation: r.Method + " " + r.URL.Path, Key: key}), slog.String("outcome", s.Name), slog.Any("error", err))
	f.p.writeProblem(w, s, detail, key)
}
