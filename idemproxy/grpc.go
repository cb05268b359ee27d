package idemproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/bodyread"
	"github.com/idem-dev/idem/internal/rpccore"
)

// rpcRoute is how one route protects gRPC, gRPC-Web and Connect calls
// (see serveRPC).
type rpcRoute struct {
	p         *Proxy
	fwd       *forwarder
	label     string
	scope     idem.ScopeFunc
	operation func(*http.Request) string
	optional  bool
	observe   bool
	maxBody   int64
	wait      time.Duration
	lease     time.Duration
	retention time.Duration
	// ambiguousRelease: the route's ambiguous policy releases keys whose
	// outcome is unknown (the upstream deduplicates by the key itself).
	ambiguousRelease bool
	// refuseStreams: streaming calls are refused instead of passed on.
	refuseStreams bool
	// releaseStatuses are the route's release_statuses: an upstream (or a
	// gateway before it) that answers a call with one of these HTTP
	// statuses releases its key, as it does an HTTP request's.
	releaseStatuses []int
	policy          rpccore.Policy
}

// defaultReleaseStatuses are release_statuses when a route sets none.
var defaultReleaseStatuses = []int{http.StatusTooManyRequests, http.StatusServiceUnavailable}

func (p *Proxy) newRPCRoute(label string, s Settings, fwd *forwarder, scope idem.ScopeFunc, op func(*http.Request) string) *rpcRoute {
	pol := s.policy()
	release := pol.ReleaseStatuses
	if release == nil {
		release = defaultReleaseStatuses
	}
	return &rpcRoute{p: p, fwd: fwd, label: label, scope: scope, operation: op, optional: pol.KeyOptional,
		observe: s.Mode == ModeObserve, maxBody: pol.MaxRequestBody, wait: pol.Wait, lease: pol.Lease, retention: pol.Retention,
		ambiguousRelease: s.Ambiguous == AmbiguousRelease, refuseStreams: s.GRPCStreams == GRPCStreamsRefuse, releaseStatuses: release}
}

// GRPCStreams is what a route does with streaming gRPC calls
// (Settings.GRPCStreams).
type GRPCStreams string

// The values of GRPCStreams.
const (
	// GRPCStreamsPass forwards streaming calls unprotected and unbuffered.
	GRPCStreamsPass GRPCStreams = "pass"
	// GRPCStreamsRefuse refuses them (FAILED_PRECONDITION,
	// METHOD_UNPROTECTED): a route whose callers must never believe a
	// stream protected.
	GRPCStreamsRefuse GRPCStreams = "refuse"
)

func (g GRPCStreams) validate() error {
	switch g {
	case "", GRPCStreamsPass, GRPCStreamsRefuse:
		return nil
	}
	return errors.New("grpc_streams must be pass or refuse, got " + strconv.Quote(string(g)))
}

// serveRPC serves a gRPC-family call on a route that protects POST: a
// unary call is protected with the key of its idempotency-key metadata
// (or of its request_id / idempotency_key field, with descriptors), and
// its whole answer (headers, message, trailers) stored and replayed; a
// streaming call passes through, unbuffered, or is refused.
func (rr *rpcRoute) serveRPC(w http.ResponseWriter, r *http.Request, c rpcCall) {
	arrived := rr.p.opts.Now()
	method := r.URL.Path
	keys := r.Header.Values(rpccore.MetadataKey)
	md := rr.p.rpcDesc.method(method)
	streaming := c.kind == rpcStream || (md != nil && (md.IsStreamingClient() || md.IsStreamingServer()))
	if streaming {
		rr.stream(w, r, c, method, keys)
		return
	}
	if rr.observe {
		rr.pass(w, r)
		return
	}
	if tp := rr.p.opts.TracerProvider; tp != nil {
		// The call's idem.request span, as the middleware gives an HTTP
		// request: its outcome and settlement are set where they are
		// counted (count).
		ctx, span := tp.Tracer(tracerName).Start(r.Context(), "idem.request", trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(idem.AttrOperation.String(rr.operation(r)), attribute.String("rpc.method", method)))
		defer span.End()
		r = r.WithContext(ctx)
	}
	if rr.p.closing.Load() {
		rr.answer(w, r, c, rpccore.Refusal{Row: rpccore.RowOf(idem.SituationShuttingDown.Name), Method: method, RetryAfter: time.Second,
			Message: "The proxy is shutting down and did not forward this call; retry it as it is."}.Status(), idem.SituationShuttingDown.Name, "")
		return
	}
	body, held, st, outcome := rr.readBody(r, c)
	defer rr.p.bodies.Release(held)
	if st != nil {
		rr.answer(w, r, c, st, outcome, "")
		return
	}
	timeout, hasTimeout := grpcTimeout(r.Header)
	msg, msgBytes, fields, st := rr.decode(c, body, md)
	if st != nil {
		rr.answer(w, r, c, st, idem.SituationInvalidKey.Name, "")
		return
	}
	var m protoreflect.Message
	if msg != nil {
		m = msg.ProtoReflect()
	}
	retention := rr.retention
	if retention <= 0 {
		retention = rr.p.engine.Config().Retention
	}
	k, missing, refused := rpccore.FindCallKey(keys, m, fields, false, arrived, retention, rpccore.DefaultMaxClockSkew)
	switch {
	case refused != nil:
		refused.Method = method
		rr.answer(w, r, c, refused.Status(), idem.SituationInvalidKey.Name, "")
		return
	case missing && rr.optional:
		// Its body was read: the upstream gets what was read.
		r.Body, r.ContentLength = nopCloser{bytes.NewReader(body)}, int64(len(body))
		rr.pass(w, r)
		return
	case missing:
		ref := rpccore.MissingKey(fields)
		ref.Method = method
		rr.answer(w, r, c, ref.Status(), idem.SituationMissingKey.Name, "")
		return
	}
	scope, err := rr.scope(r)
	if err != nil {
		name := idem.SituationScopeDenied.Name
		msg := "The call's credentials do not identify a client."
		if errors.Is(err, idem.ErrScopeMissing) {
			name, msg = idem.SituationScopeMissing.Name, "The call carries no credentials, so its key cannot be told from another client's."
		}
		rr.answer(w, r, c, rpccore.Refusal{Row: rpccore.RowOf(name), Key: k.Key(), Method: method, Field: k.Field(), Message: msg}.Status(), name, "")
		return
	}
	var fp string
	var src *idem.FingerprintSource
	if msg != nil {
		fp, src, err = rpccore.FingerprintCall(method, msg, fields, k, rr.p.fpKey, rr.p.rpcDesc.registry)
	} else {
		// Without descriptors, the message's bytes: a retry must send
		// the same bytes (docs/grpc.md).
		ct := "application/grpc+proto"
		switch {
		case c.json:
			ct = "application/json"
		case c.codec != "":
			ct = "application/grpc+" + c.codec
		}
		in := idem.FingerprintInput{Method: "RPC", Operation: method, ContentType: ct, Body: msgBytes}
		src = &idem.FingerprintSource{Input: in, Options: idem.FingerprintOptions{Key: rr.p.fpKey}}
		fp, err = idem.Fingerprint(in, src.Options)
	}
	if err != nil {
		rr.answer(w, r, c, &spb.Status{Code: int32(code.Code_INTERNAL), Message: "idem: fingerprinting the request: " + err.Error()}, "fingerprint_failed", "")
		return
	}
	wait := rr.wait
	if hasTimeout && wait > 0 {
		// End the wait while the caller can still hear about it.
		wait = max(min(wait, timeout-timeout/10), 0)
	}
	lease := rr.lease
	if hasTimeout {
		// The call ends by its deadline: a proxy that dies during it
		// leaves a lease that expires soon after, not a route's full one
		// (the heartbeat renews it while the call runs).
		if lease <= 0 {
			lease = rr.p.engine.Config().Lease
		}
		lease = min(lease, max(2*timeout, timeout+2*time.Second))
	}
	req := idem.Request{Key: idem.Key{Scope: scope, Operation: rr.operation(r), Key: k.Key()}, Fingerprint: fp, FingerprintSource: src,
		Kind: idem.External, Wait: wait, Lease: lease, Retention: rr.retention,
		Info: &idemstore.Request{Method: "RPC", Path: method}}
	ctx := r.Context()
	if hasTimeout {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	res, err := rr.p.engine.Begin(ctx, req)
	if err != nil {
		rr.beginFailed(w, r, c, k, method, err)
		return
	}
	ref := rpccore.Refusal{Key: k.Key(), Method: method, Field: k.Field()}
	switch res.Outcome {
	case idem.Acquired:
		counted, over := rr.overCap(w, r, c, res.Lease, method)
		if over {
			return
		}
		if hasTimeout {
			// The upstream gets what is left of the caller's deadline:
			// reading the call and reserving its key took some of it (none
			// by a clock that went back: never more than the caller gave).
			timeout -= max(rr.p.opts.Now().Sub(arrived), 0)
			if timeout <= 0 {
				rr.spent(w, r, c, res.Lease, method, counted)
				return
			}
		}
		rr.run(w, r, c, res.Lease, body, timeout, hasTimeout, md, counted)
		return
	case idem.Replayed:
		rr.replay(w, r, c, res.Response, k.Key(), method, md)
		return
	case idem.Mismatch:
		ref.Row, ref.Message = rpccore.RowOf(idem.SituationMismatch.Name), "This idempotency key was already used with a different request. Use a new key for a new request."
	case idem.InFlight:
		ref.Row, ref.RetryAfter, ref.Message = rpccore.RowOf(idem.SituationInFlight.Name), res.RetryAfter,
			"A call with this idempotency key is still being processed. Retry after the RetryInfo delay to get its answer."
	default:
		ref.Row, ref.Message = rpccore.RowOf(idem.SituationNeedsReview.Name),
			"An earlier call with this idempotency key ended with an unknown outcome and is being reviewed. It will not run again; retry later to get its answer."
	}
	rr.answer(w, r, c, ref.Status(), ref.Row.Situation.Name, "")
}

// spent answers a call whose deadline ran out before it was forwarded:
// sent with what is left, a token deadline, a slow upstream would run it,
// or not, while the proxy gave up on it and left its key for review.
// Nothing reached the upstream, so its key is released and refunded.
func (rr *rpcRoute) spent(w http.ResponseWriter, r *http.Request, c rpcCall, lease *idem.Lease, method string, counted *capWindow) {
	settlement := rr.fwd.settle(r.Context(), lease, true, "")
	if settlement == settledReleased {
		rr.fwd.refund(counted)
	}
	rr.answer(w, r, c, &spb.Status{Code: int32(code.Code_DEADLINE_EXCEEDED),
		Message: "The call's deadline ran out before it could be forwarded; it was not sent. Retry it as it is."},
		idem.SituationCanceled.Name, settlement)
	rr.p.log.LogAttrs(r.Context(), slog.LevelDebug, "rpc deadline spent before forwarding", slog.String("method", method), slog.String("settlement", settlement))
}

// overCap counts lease, a key just reserved, against its scope's
// new_keys_per_scope, as forwarder.overCap does for HTTP requests; over
// it, the key is released and the call answered RESOURCE_EXHAUSTED
// (TOO_MANY_NEW_KEYS) with RetryInfo, unforwarded. Otherwise it returns
// the window the key was counted in, for a refund should the key be
// released unrun.
func (rr *rpcRoute) overCap(w http.ResponseWriter, r *http.Request, c rpcCall, lease *idem.Lease, method string) (counted *capWindow, over bool) {
	rc := rr.fwd.cap
	if rc == nil {
		return nil, false
	}
	k := lease.Key()
	counted, wait, first, full := rc.cap.admit(k.Scope)
	if full {
		rr.p.log.LogAttrs(r.Context(), slog.LevelWarn, "new_keys_per_scope counts as many scopes as it may; the scopes whose interval started longest ago are forgotten, and start afresh",
			slog.String("route", rc.route), slog.Int("scopes", MaxCappedScopes))
	}
	if counted != nil {
		return counted, false
	}
	settlement := rr.fwd.settle(r.Context(), lease, true, "")
	if rc.refused != nil {
		rc.refused.Inc()
	}
	if first {
		rr.p.log.LogAttrs(context.WithoutCancel(r.Context()), slog.LevelWarn, "new key refused: the scope reached its new_keys_per_scope; refusing its new keys until its interval ends",
			slog.String("route", rc.route), slog.String("scope", k.Scope), slog.String("key_digest", idem.KeyDigest(k)),
			slog.Int("limit", rc.cap.limit), slog.Duration("interval", rc.cap.interval), slog.Duration("retry_after", wait))
	}
	msg := fmt.Sprintf("This client has reserved the %d new keys per %v the proxy allows it, so this call was not forwarded and its key was not kept. Retry with the same key after the RetryInfo delay.",
		rc.cap.limit, rc.cap.interval)
	if settlement == settledFailed {
		msg = fmt.Sprintf("This client has reserved the %d new keys per %v the proxy allows it, so this call was not forwarded, but its key could not be released: retries get ABORTED until the key is settled.",
			rc.cap.limit, rc.cap.interval)
	}
	ref := rpccore.Refusal{Row: rpccore.RowOf(idem.SituationTooManyNewKeys.Name), Key: k.Key, Method: method,
		RetryAfter: max(wait, time.Second), Message: msg}
	rr.answer(w, r, c, ref.Status(), idem.SituationTooManyNewKeys.Name, settlement)
	return nil, true
}

// beginFailed answers a call whose Begin failed.
func (rr *rpcRoute) beginFailed(w http.ResponseWriter, r *http.Request, c rpcCall, k rpccore.CallKey, method string, err error) {
	ref := rpccore.Refusal{Key: k.Key(), Method: method, Field: k.Field()}
	switch {
	case r.Context().Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		rr.answer(w, r, c, &spb.Status{Code: int32(code.Code_CANCELLED), Message: "the call ended while its key was checked"}, idem.SituationCanceled.Name, "")
		return
	case errors.Is(err, idem.ErrScopeMissing):
		ref.Row, ref.Message = rpccore.RowOf(idem.SituationScopeMissing.Name), "The call carries no credentials, so its key cannot be told from another client's."
	case errors.Is(err, idem.ErrTooLong):
		ref.Row, ref.Message = rpccore.RowOf(idem.SituationTooLong.Name), "The call's scope or operation is longer than idem keeps."
	case errors.Is(err, idem.ErrSealed):
		ref.Row, ref.Message = rpccore.RowOf(idem.SituationSealed.Name), "A call with this key was already processed, but its stored answer cannot be read. It will not run again; retry later with the same key."
	default:
		rr.p.log.LogAttrs(r.Context(), slog.LevelError, "store unavailable", slog.String("method", method), slog.Any("error", err))
		ref.Row, ref.RetryAfter, ref.Message = rpccore.RowOf(idem.SituationUnavailable.Name), time.Second,
			"The call was not processed because its idempotency key could not be checked; retry with the same key."
	}
	rr.answer(w, r, c, ref.Status(), ref.Row.Situation.Name, "")
}

// answer writes idem's own status st to a call, and counts it.
func (rr *rpcRoute) answer(w http.ResponseWriter, r *http.Request, c rpcCall, st *spb.Status, outcome, settlement string) {
	rr.count(r, outcome, settlement)
	w.Header().Set("Idempotency-Outcome", outcome)
	writeRPC(w, c, &rpcAnswer{st: st}, false)
}

// pass forwards a call unprotected, as it comes and as it is answered.
func (rr *rpcRoute) pass(w http.ResponseWriter, r *http.Request) { rr.fwd.rp.ServeHTTP(w, r) }

// stream passes on (or refuses) a streaming call. One that carries a key
// is logged and counted: its client may believe it protected.
func (rr *rpcRoute) stream(w http.ResponseWriter, r *http.Request, c rpcCall, method string, keys []string) {
	if len(keys) > 0 {
		digest := ""
		if k, err := idem.ParseKeyHeader(keys); err == nil {
			scope, _ := rr.scope(r)
			digest = idem.KeyDigest(idem.Key{Scope: scope, Operation: method, Key: k})
		}
		rr.p.log.LogAttrs(r.Context(), slog.LevelWarn, "a streaming call carries an idempotency key; idem protects unary calls only",
			slog.String("route", rr.label), slog.String("method", method), slog.String("key_digest", digest), slog.Bool("refused", rr.refuseStreams))
		if rr.p.rpcMetrics != nil {
			rr.p.rpcMetrics.streamKeys.WithLabelValues(rr.label).Inc()
		}
	}
	if rr.refuseStreams {
		rr.answer(w, r, c, rpccore.UnprotectedMethod(method, "This route refuses streaming calls: idem protects unary calls only, and a retried stream could run twice.").Status(),
			rpccore.SituationUnprotectedMethod.Name, "")
		return
	}
	rr.pass(w, r)
}

// readBody reads the call's body within the route's max_body and the
// proxy's body budget, with the middleware's reader: the buffer grows with
// what arrives, and each step of it is charged before it is read into.
func (rr *rpcRoute) readBody(r *http.Request, c rpcCall) (body []byte, held int64, st *spb.Status, outcome string) {
	var buf bytes.Buffer
	var budget bodyread.Budget
	if rr.p.bodies != nil {
		budget = rr.p.bodies
	}
	over, held, err := bodyread.Read(&buf, r.Body, r.ContentLength, rr.maxBody, budget)
	switch {
	case err == bodyread.ErrNoRoom:
		return nil, held, rpccore.Refusal{Row: rpccore.RowOf(idem.SituationBusy.Name), RetryAfter: time.Second,
			Message: "The proxy holds as many request bodies as max_body_memory allows; retry the call as it is."}.Status(), idem.SituationBusy.Name
	case err != nil:
		return nil, held, &spb.Status{Code: int32(code.Code_CANCELLED), Message: "the request body could not be read: " + err.Error()}, idem.SituationBodyUnreadable.Name
	case over:
		return nil, held, rpccore.Refusal{Row: rpccore.RowOf(idem.SituationBodyTooLarge.Name),
			Message: "The request message is larger than this route's max_body (" + strconv.FormatInt(rr.maxBody, 10) + " bytes); it was not forwarded."}.Status(), idem.SituationBodyTooLarge.Name
	}
	return buf.Bytes(), held, nil, ""
}

// decode reads the call's request message: decoded with the descriptors
// when the proxy has its method's, else only its bytes.
func (rr *rpcRoute) decode(c rpcCall, body []byte, md protoreflect.MethodDescriptor) (msg proto.Message, raw []byte, fields *rpccore.KeyFields, st *spb.Status) {
	bad := func(why string) *spb.Status {
		if why == errTooLarge.Error() {
			return rpccore.Refusal{Row: rpccore.RowOf(idem.SituationBodyTooLarge.Name),
				Message: "The request message is larger than this route's max_body once decompressed; it was not forwarded."}.Status()
		}
		return &spb.Status{Code: int32(code.Code_INVALID_ARGUMENT), Message: "idem: the request message cannot be read: " + why}
	}
	raw = body
	switch c.kind {
	case rpcConnect:
		// Connect unary: the body is the message; Content-Encoding was
		// the HTTP layer's (decompressed below when gzip).
	default:
		fs, err := frames(body)
		if err != nil {
			return nil, nil, nil, bad(err.Error())
		}
		if len(fs) != 1 {
			return nil, nil, nil, bad("a unary call carries exactly one message, this one " + strconv.Itoa(len(fs)))
		}
		raw = fs[0].payload
		if fs[0].flags&flagCompressed != 0 {
			enc := c.encoding
			if !strings.EqualFold(enc, "gzip") {
				return nil, nil, nil, &spb.Status{Code: int32(code.Code_UNIMPLEMENTED), Message: "idem serve reads compressed messages of protected calls in gzip only, not " + strconv.Quote(enc)}
			}
			if raw, err = gunzip(raw, rr.maxBody); err != nil {
				return nil, nil, nil, bad(err.Error())
			}
		}
	}
	if c.kind == rpcConnect && c.encoding != "" && !strings.EqualFold(c.encoding, "identity") {
		if !strings.EqualFold(c.encoding, "gzip") {
			return nil, nil, nil, &spb.Status{Code: int32(code.Code_UNIMPLEMENTED), Message: "idem serve reads compressed messages of protected calls in gzip only, not " + strconv.Quote(c.encoding)}
		}
		var err error
		if raw, err = gunzip(raw, rr.maxBody); err != nil {
			return nil, nil, nil, bad(err.Error())
		}
	}
	if md == nil || c.codec != "" {
		return nil, raw, nil, nil
	}
	m := dynamicpb.NewMessage(md.Input())
	var err error
	if c.json {
		err = protojson.UnmarshalOptions{DiscardUnknown: true, Resolver: rr.p.rpcDesc.types}.Unmarshal(raw, m)
	} else {
		err = proto.Unmarshal(raw, m)
	}
	if err != nil {
		return nil, nil, nil, bad(err.Error())
	}
	return m, raw, rpccore.KeyFieldsOf(md.Input()), nil
}

// grpcTimeout reads the grpc-timeout header (or Connect's
// Connect-Timeout-Ms).
func grpcTimeout(h http.Header) (time.Duration, bool) {
	if v := h.Get("Connect-Timeout-Ms"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > 1e10 {
			return 0, false
		}
		return time.Duration(n) * time.Millisecond, true
	}
	v := h.Get("Grpc-Timeout")
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	unit := map[byte]time.Duration{'H': time.Hour, 'M': time.Minute, 'S': time.Second, 'm': time.Millisecond, 'u': time.Microsecond, 'n': time.Nanosecond}[v[len(v)-1]]
	if unit == 0 {
		return 0, false
	}
	if n > math.MaxInt64/int64(unit) {
		// Longer than a time.Duration (eight digits of hours are): no
		// deadline idem can keep, and none the call will meet.
		return 0, false
	}
	return time.Duration(n) * unit, true
}

// formatTimeout writes d as a grpc-timeout value: at most eight digits,
// in the finest unit that holds them.
func formatTimeout(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	if ms < 1e8 {
		return strconv.FormatInt(ms, 10) + "m"
	}
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Second, "S"}, {time.Minute, "M"}} {
		if n := int64(d / u.d); n < 1e8 {
			return strconv.FormatInt(n, 10) + u.name
		}
	}
	return strconv.FormatInt(min(int64(d/time.Hour), 1e8-1), 10) + "H"
}
