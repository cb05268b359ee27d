package idemproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/rpccore"
)

// run forwards an acquired call, settles its key by the answer, and
// passes the answer on:
//
//   - the upstream could not be reached, nothing sent: released,
//     UNAVAILABLE (upstream_unreachable), retry as it is;
//   - (before run, in spent) the caller's deadline ran out before the
//     call was forwarded, nothing sent: released, DEADLINE_EXCEEDED
//     (canceled);
//   - sent, then the call failed (a reset stream, a GOAWAY, a lost
//     connection, an answer cut short before its grpc-status): the
//     outcome is unknown, the key goes to review (or is released by the
//     route's ambiguous policy), UNKNOWN (upstream_failed), or
//     DEADLINE_EXCEEDED (upstream_timeout) past the deadline;
//   - an answer whose code means nothing happened (UNAVAILABLE,
//     RESOURCE_EXHAUSTED; an HTTP 503 or 429): released, passed on;
//   - an answer whose code leaves the effect unknown (DEADLINE_EXCEEDED,
//     CANCELLED): escalated (or released by the ambiguous policy), passed on;
//   - any other answer: stored whole (metadata, message, status with
//     its details, trailers) and passed on.
//
// counted is the window of new_keys_per_scope the key was counted in: a
// key released unrun (nothing sent) is refunded.
func (rr *rpcRoute) run(w http.ResponseWriter, r *http.Request, c rpcCall, lease *idem.Lease, body []byte, timeout time.Duration, hasTimeout bool, md protoreflect.MethodDescriptor, counted *capWindow) {
	stop := lease.Heartbeat()
	defer stop()
	deadline := rr.fwd.deadline
	if hasTimeout && (deadline <= 0 || timeout < deadline) {
		deadline = timeout
	}
	cause := deadlineCause{deadline}
	x, ctx := newExchange(context.WithoutCancel(r.Context()), deadline, rr.p.clientGrace(), cause, nil)
	defer x.deadline.stop()
	defer x.endBody()
	out := r.WithContext(ctx)
	out.Body, out.ContentLength = nopCloser{bytes.NewReader(body)}, int64(len(body))
	out.Header = r.Header.Clone()
	if hasTimeout {
		out.Header.Set("Grpc-Timeout", formatTimeout(timeout))
		out.Header.Del("Connect-Timeout-Ms")
		if c.kind == rpcConnect {
			out.Header.Del("Grpc-Timeout")
			out.Header.Set("Connect-Timeout-Ms", strconv.FormatInt(max(timeout.Milliseconds(), 1), 10))
		}
	}
	// The answer is stored uncompressed: the upstream is asked for none,
	// neither of its messages nor of the HTTP body (a browser's gRPC-Web
	// call asks for gzip, which an upstream may apply to the whole body).
	out.Header.Del("Grpc-Accept-Encoding")
	out.Header.Set("Accept-Encoding", "identity")
	limit := int64(rr.p.engine.Config().MaxResponseBody)
	cw := &captureWriter{h: http.Header{}, limit: limit, client: w, framed: c.kind != rpcConnect}
	rr.fwd.proxy(cw, out, x)

	rtErr, bodyErr := x.errs()
	method := r.URL.Path
	if cw.streamed {
		rr.streamedAnswer(r, lease, rtErr, bodyErr)
		return
	}
	if rtErr != nil || bodyErr != nil {
		rr.failed(w, r, c, lease, x, rtErr, bodyErr, context.Cause(ctx) == cause, deadline, cw.over, counted)
		return
	}
	if cw.over {
		if c.kind == rpcGRPC && !statusTrailed(w.Header()) {
			// Passed on whole but ended without grpc-status: what ran
			// is unknown, as for an answer small enough to read.
			rr.failed(w, r, c, lease, x, nil, errNoStatus, false, deadline, true, nil)
			return
		}
		// Too large to keep: the key is completed as not replayable, and
		// the client got what the upstream sent.
		settlement := rr.complete(ctx, lease, &idem.Response{Status: http.StatusOK, NotReplayable: idem.NotReplayableTooLarge})
		rr.count(r, idem.Acquired.String(), settlement)
		return
	}
	status, header, trailer := cw.result()
	a, err := parseRPCAnswer(c, status, header, cw.body.Bytes(), trailer, limit)
	if err != nil {
		// No status (trailers lost to a reset after the headers), or an
		// answer that is not a unary one: what ran is unknown.
		rr.failed(w, r, c, lease, x, nil, fmt.Errorf("the upstream's answer cannot be read as a unary gRPC answer: %w", err), false, deadline, false, nil)
		return
	}
	cd := code.Code(a.st.GetCode())
	settlement := ""
	how := rr.policy.Settle(cd)
	switch {
	case a.httpStatus == 0:
	case slices.Contains(rr.releaseStatuses, a.httpStatus):
		how = rpccore.Release // the route's release_statuses
	case a.httpStatus == http.StatusBadGateway || a.httpStatus == http.StatusGatewayTimeout:
		how = rpccore.Ambiguous // a gateway's failure: the call may have run
	default:
		how = rpccore.Store
	}
	switch how {
	case rpccore.Release:
		settlement = rr.fwd.settle(ctx, lease, true, "")
	case rpccore.Ambiguous:
		settlement = rr.fwd.settle(ctx, lease, rr.ambiguousRelease, "the upstream answered "+cd.String()+", whose effect is unknown: "+a.st.GetMessage())
	default:
		resp, err := encodeRPCAnswer(a)
		if err == nil && limit >= 0 && storedSize(resp) > limit {
			// The metadata counts against the bound on stored answers, as
			// the gRPC front doors count it.
			resp = &idem.Response{Status: resp.Status, NotReplayable: rpccore.NotReplayableMetadata}
		}
		if err == nil {
			settlement = rr.complete(ctx, lease, resp)
		} else {
			settlement = rr.fwd.settle(ctx, lease, false, "the upstream's answer could not be stored: "+err.Error())
		}
	}
	rr.count(r, idem.Acquired.String(), settlement)
	rr.p.log.LogAttrs(r.Context(), slog.LevelDebug, "rpc", slog.String("method", method), slog.String("code", cd.String()), slog.String("settlement", settlement))
	writeRPC(w, c, a, false)
}

// statusTrailed reports whether the client's header h, of an answer
// passed on as it came, holds a grpc-status trailer (set under
// http.TrailerPrefix, or announced).
func statusTrailed(h http.Header) bool {
	return len(h[http.TrailerPrefix+"Grpc-Status"]) > 0 || len(h["Grpc-Status"]) > 0
}

// count counts a call's outcome and settlement, and sets them on its
// idem.request span when it is traced.
func (rr *rpcRoute) count(r *http.Request, outcome, settlement string) {
	if rr.p.metrics != nil {
		rr.p.metrics.outcomes.WithLabelValues(rr.label, outcome, settlement).Inc()
	}
	if rr.p.opts.TracerProvider == nil {
		return
	}
	span := trace.SpanFromContext(r.Context())
	span.SetAttributes(idem.AttrOutcome.String(outcome))
	if settlement != "" {
		span.SetAttributes(idem.AttrSettlement.String(settlement))
	}
	switch outcome {
	case idem.SituationUnavailable.Name, idem.SituationUpstreamFailed.Name, idem.SituationUpstreamTimeout.Name, idem.SituationUpstreamUnreachable.Name:
		span.SetStatus(otelcodes.Error, outcome)
	}
	if settlement == settledFailed {
		span.SetStatus(otelcodes.Error, settlement)
	}
}

// complete stores resp as the key's answer; a store that refuses it sends
// the key to review (the call ran).
func (rr *rpcRoute) complete(ctx context.Context, lease *idem.Lease, resp *idem.Response) string {
	err := lease.Complete(ctx, resp)
	switch {
	case err == nil && resp.NotReplayable != "":
		return "not_replayable"
	case err == nil:
		return "completed"
	case errors.Is(err, idem.ErrLeaseLost):
		rr.p.log.LogAttrs(ctx, slog.LevelError, "the lease was lost before the answer could be stored", slog.String("key_digest", idem.KeyDigest(lease.Key())), slog.Any("error", err))
		return settledLost
	}
	return rr.fwd.settle(ctx, lease, false, "the upstream answered but storing the answer failed: "+err.Error())
}

// failed settles the key of a call whose upstream call failed, and
// answers it with idem's status.
func (rr *rpcRoute) failed(w http.ResponseWriter, r *http.Request, c rpcCall, lease *idem.Lease, x *exchange, rtErr, bodyErr error, timedOut bool, deadline time.Duration, committed bool, counted *capWindow) {
	err, sent := bodyErr, true
	if rtErr != nil {
		err, sent = rtErr, x.sent(rtErr)
	}
	s := idem.SituationUpstreamUnreachable
	msg := "The upstream could not be reached; the call was not sent. Retry it as it is."
	switch {
	case !sent:
	case timedOut || isTimeout(err):
		s, msg = idem.SituationUpstreamTimeout, "The upstream did not answer in time after the call was sent, so its outcome is unknown."
	default:
		s, msg = idem.SituationUpstreamFailed, "The upstream failed after the call was sent, so its outcome is unknown."
	}
	reason := "upstream failed after the call was sent: " + err.Error()
	if timedOut {
		reason = deadlineCause{deadline}.Error()
	}
	release := !sent || rr.ambiguousRelease
	settlement := rr.fwd.settle(r.Context(), lease, release, reason)
	if settlement == settledReleased && !sent {
		rr.fwd.refund(counted)
	}
	switch {
	case settlement == settledEscalated:
		msg += " The key needs review: retries get FAILED_PRECONDITION (NEEDS_REVIEW) until an operator or a resolver settles it."
	case settlement == settledReleased && sent:
		msg += " The key was released (the route's ambiguous policy): a retry is forwarded again."
	}
	rr.p.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream error", slog.String("method", r.URL.Path), slog.String("key_digest", idem.KeyDigest(lease.Key())),
		slog.String("outcome", s.Name), slog.String("settlement", settlement), slog.Bool("sent", sent), x.connAttrs(), slog.Any("error", err))
	if committed {
		// Part of the answer went out: there is no status left to give.
		rr.count(r, s.Name, settlement)
		panic(http.ErrAbortHandler)
	}
	ref := rpccore.Refusal{Row: rpccore.RowOf(s.Name), Key: lease.Key().Key, Method: r.URL.Path, RetryAfter: time.Second, Message: msg}
	rr.answer(w, r, c, ref.Status(), s.Name, settlement)
}

// replay answers a call with the stored answer of its key.
func (rr *rpcRoute) replay(w http.ResponseWriter, r *http.Request, c rpcCall, resp *idem.Response, key, method string, md protoreflect.MethodDescriptor) {
	if resp.NotReplayable != "" {
		ref := rpccore.Refusal{Row: rpccore.RowOf(idem.SituationNotReplayable.Name), Key: key, Method: method,
			Message: fmt.Sprintf("The call with this idempotency key completed, but its answer was not kept (%s), so it cannot be replayed. It will not run again.", resp.NotReplayable)}
		rr.answer(w, r, c, ref.Status(), idem.SituationNotReplayable.Name, "")
		return
	}
	a, err := decodeRPCAnswer(resp)
	if err == nil && a.hasMsg && a.json != c.json {
		err = rr.p.rpcDesc.transcode(a, md, c.json)
	}
	if err != nil {
		rr.p.log.LogAttrs(context.Background(), slog.LevelError, "a stored answer cannot be replayed to this call", slog.String("method", method), slog.Any("error", err))
		ref := rpccore.Refusal{Row: rpccore.RowOf(idem.SituationSealed.Name), Key: key, Method: method,
			Message: "A call with this key was already processed, but its stored answer cannot be sent in this call's protocol or codec. It will not run again."}
		rr.answer(w, r, c, ref.Status(), idem.SituationSealed.Name, "")
		return
	}
	rr.count(r, idem.Replayed.String(), "")
	w.Header().Set("Idempotency-Outcome", idem.SituationReplayed.Name)
	writeRPC(w, c, a, true)
}

// The stored form of an RPC answer is the gRPC front doors' (see
// rpccore.Encode), so that the review page and the admin API show one
// form: Grpc-Status, the message (code 0) or the google.rpc.Status in
// protobuf's binary form as the body, metadata under Grpc-Metadata- and
// Grpc-Trailer- (their -bin values in base64, as they travel), and the
// HTTP status Google's mapping gives the code. Content-Type says the
// codec of the message (application/grpc+proto, application/grpc+json);
// Idem-Grpc-No-Message marks an OK answer without a message.
const (
	storedNoMessage = "Idem-Grpc-No-Message"
	storedMetadata  = "Grpc-Metadata-"
	storedTrailer   = "Grpc-Trailer-"
)

func encodeRPCAnswer(a *rpcAnswer) (*idem.Response, error) {
	c := code.Code(a.st.GetCode())
	h := http.Header{"Grpc-Status": {strconv.Itoa(int(c))}}
	if a.json {
		h.Set("Content-Type", "application/grpc+json")
	} else {
		h.Set("Content-Type", "application/grpc+proto")
	}
	for k, vs := range a.header {
		h[storedMetadata+k] = vs
	}
	for k, vs := range a.trailer {
		h[storedTrailer+k] = vs
	}
	var body []byte
	switch {
	case c != code.Code_OK:
		b, err := proto.Marshal(a.st)
		if err != nil {
			return nil, err
		}
		body = b
	case a.hasMsg:
		body = a.msg
	default:
		h.Set(storedNoMessage, "1")
	}
	return &idem.Response{Status: rpccore.HTTPStatus(c), Header: h, Body: body}, nil
}

// decodeRPCAnswer reads a stored answer. One stored by an operator or a
// resolver (no Grpc-Status) is read as an HTTP answer: a 2xx is the
// response message in its body (protobuf, or JSON when its Content-Type
// says so), any other status the code Google's mapping gives it, its body
// the message.
func decodeRPCAnswer(resp *idem.Response) (*rpcAnswer, error) {
	a := &rpcAnswer{header: http.Header{}, trailer: http.Header{}}
	ct := strings.ToLower(resp.Header.Get("Content-Type"))
	a.json = strings.Contains(ct, "json")
	sv := resp.Header.Get("Grpc-Status")
	if sv == "" {
		if resp.Status < 200 || resp.Status > 299 {
			msg := strings.TrimSpace(string(resp.Body))
			if len(msg) > 1024 {
				msg = msg[:1024]
			}
			a.st = &spb.Status{Code: int32(rpccore.CodeOf(resp.Status)), Message: msg}
			return a, nil
		}
		a.st, a.msg, a.hasMsg = &spb.Status{}, resp.Body, true
		return a, nil
	}
	n, err := strconv.ParseUint(sv, 10, 31)
	if err != nil {
		return nil, fmt.Errorf("stored grpc-status %q: %w", sv, err)
	}
	for k, vs := range resp.Header {
		switch {
		case len(k) > len(storedMetadata) && strings.EqualFold(k[:len(storedMetadata)], storedMetadata):
			a.header[http.CanonicalHeaderKey(k[len(storedMetadata):])] = vs
		case len(k) > len(storedTrailer) && strings.EqualFold(k[:len(storedTrailer)], storedTrailer):
			a.trailer[http.CanonicalHeaderKey(k[len(storedTrailer):])] = vs
		}
	}
	if n != 0 {
		a.st = new(spb.Status)
		if err := proto.Unmarshal(resp.Body, a.st); err != nil {
			return nil, fmt.Errorf("decoding the stored status: %w", err)
		}
		a.st.Code = int32(n)
		return a, nil
	}
	a.st = &spb.Status{}
	if resp.Header.Get(storedNoMessage) == "" {
		a.msg, a.hasMsg = resp.Body, true
	}
	if strings.Contains(ct, "application/protobuf") {
		a.json = false // stored by idemgrpc or idemconnect: binary
	}
	return a, nil
}

// transcode turns a's message into JSON (toJSON) or binary, with the
// method's descriptor: a retry that asks in the other codec.
func (d *rpcDescriptors) transcode(a *rpcAnswer, md protoreflect.MethodDescriptor, toJSON bool) error {
	if md == nil {
		return errors.New("the stored answer is in another codec than this call's, and the method has no descriptor to convert it (--proto-descriptor-set)")
	}
	m := dynamicpb.NewMessage(md.Output())
	var err error
	if a.json {
		err = protojson.UnmarshalOptions{DiscardUnknown: true, Resolver: d.types}.Unmarshal(a.msg, m)
	} else {
		err = proto.Unmarshal(a.msg, m)
	}
	if err != nil {
		return err
	}
	if toJSON {
		a.msg, err = protojson.MarshalOptions{Resolver: d.types}.Marshal(m)
	} else {
		a.msg, err = proto.Marshal(m)
	}
	a.json = toJSON
	return err
}

// captureWriter takes the upstream's answer to a protected call whole, up
// to limit bytes of body. Past it (over), what it held goes to the client,
// and the rest of the answer, trailers included, passes through.
type captureWriter struct {
	h      http.Header
	status int
	body   bytes.Buffer
	limit  int64
	over   bool
	client http.ResponseWriter
	// framed: the body is gRPC frames, counted as they come (next is
	// where the next one starts); a second message makes the answer a
	// stream (streamed), which passes through as over does.
	framed   bool
	next     int
	messages int
	streamed bool
}

func (c *captureWriter) Header() http.Header {
	if c.over {
		return c.client.Header()
	}
	return c.h
}

func (c *captureWriter) WriteHeader(code int) {
	if c.status == 0 && code >= 200 {
		c.status = code
	}
}

func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.over {
		_, _ = c.client.Write(b) // a client that left: the upstream is read to its end anyway
		return len(b), nil
	}
	if c.framed && c.secondMessage(b) {
		c.streamed = true
	}
	if c.streamed || c.limit >= 0 && int64(c.body.Len()+len(b)) > c.limit {
		c.over = true
		status, header, _ := c.result()
		for k, vs := range header {
			c.client.Header()[k] = vs
		}
		c.client.WriteHeader(status)
		_, _ = c.client.Write(c.body.Bytes())
		_, _ = c.client.Write(b)
		c.body = bytes.Buffer{}
		return len(b), nil
	}
	c.body.Write(b)
	return len(b), nil
}

// secondMessage reports whether b, added to the body, starts a second
// message: the call streams its answer.
func (c *captureWriter) secondMessage(b []byte) bool {
	body := append(c.body.Bytes()[:c.body.Len():c.body.Len()], b...)
	for c.next+prefixLen <= len(body) {
		if body[c.next]&flagTrailer == 0 {
			c.messages++
		}
		c.next += prefixLen + int(binary.BigEndian.Uint32(body[c.next+1:c.next+prefixLen]))
		if c.messages > 1 {
			return true
		}
	}
	return false
}

// FlushError lets ReverseProxy flush: nothing to do while the answer is
// held.
func (c *captureWriter) FlushError() error {
	if c.over {
		_ = http.NewResponseController(c.client).Flush()
	}
	return nil
}

// result splits the captured header into the answer's header and its
// trailers (announced in Trailer, or set under http.TrailerPrefix).
func (c *captureWriter) result() (status int, header, trailer http.Header) {
	header, trailer = http.Header{}, http.Header{}
	announced := map[string]bool{}
	for _, v := range c.h.Values("Trailer") {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				announced[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	for k, vs := range c.h {
		switch {
		case strings.HasPrefix(k, http.TrailerPrefix):
			trailer[http.CanonicalHeaderKey(k[len(http.TrailerPrefix):])] = vs
		case announced[k]:
			trailer[k] = vs
		case k == "Trailer":
		default:
			header[k] = vs
		}
	}
	status = c.status
	if status == 0 {
		status = http.StatusOK
	}
	return status, header, trailer
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// streamedAnswer settles the key of a call that turned out to stream its
// answer (more than one message), which idem cannot know without the
// method's descriptor: streams are never protected, so the key is
// released, as if the call had carried none, and the call counted and
// logged as a streaming call with a key. The stream passed through.
func (rr *rpcRoute) streamedAnswer(r *http.Request, lease *idem.Lease, rtErr, bodyErr error) {
	settlement := rr.fwd.settle(r.Context(), lease, true, "")
	rr.count(r, idem.Acquired.String(), settlement)
	rr.p.log.LogAttrs(r.Context(), slog.LevelWarn, "a call with an idempotency key streamed its answer; idem protects unary calls only, and released the key (give the method's descriptor, proto_descriptor_set, to pass such calls on unbuffered)",
		slog.String("route", rr.label), slog.String("method", r.URL.Path), slog.String("key_digest", idem.KeyDigest(lease.Key())))
	if rr.p.rpcMetrics != nil {
		rr.p.rpcMetrics.streamKeys.WithLabelValues(rr.label).Inc()
	}
	if rtErr != nil || bodyErr != nil {
		panic(http.ErrAbortHandler) // the stream broke: so does the client's
	}
}

// storedSize is the size of a stored answer: its body and its headers.
func storedSize(resp *idem.Response) int64 {
	n := int64(len(resp.Body))
	for k, vs := range resp.Header {
		for _, v := range vs {
			n += int64(len(k) + len(v))
		}
	}
	return n
}
