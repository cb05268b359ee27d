package rpccore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idem-dev/idem"
)

// Server is the flow around a protected unary handler that idemgrpc and
// idemconnect share: find the key, scope and fingerprint the call, Begin,
// and then run the handler under the lease, replay, or refuse.
type Server struct {
	e               *idem.Engine // used through its public API only
	o               Options
	explicit        map[string]*method
	detected        sync.Map // method name → *method; nil: not protected
	drop            map[string]bool
	keep            func(string) bool
	unlistedMethods sync.Map // method name → *method, or the error that leaves it unprotected
	retention       time.Duration
	later           sync.WaitGroup // settlements going on after the answer
}

// New returns the server flow over e, or an error for a bad configuration.
func New(e *idem.Engine, o Options) (*Server, error) {
	if e == nil {
		return nil, errors.New("an engine is required")
	}
	if o.Scope == nil {
		return nil, errors.New("Config.Scope is required (use GlobalScope to put every call in one scope deliberately)")
	}
	if o.StatusOf == nil {
		return nil, errors.New("rpccore: Options.StatusOf is required")
	}
	if o.Files == nil {
		o.Files = protoregistry.GlobalFiles
	}
	if o.Types == nil {
		o.Types = protoregistry.GlobalTypes
	}
	if o.Logger == nil {
		o.Logger = e.Config().Logger
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxClockSkew == 0 {
		o.MaxClockSkew = DefaultMaxClockSkew
	}
	if o.MaxClockSkew < 0 {
		return nil, errors.New("Config.MaxClockSkew must not be negative")
	}
	if err := o.Policy.validate(); err != nil {
		return nil, err
	}
	s := &Server{e: e, o: o, explicit: map[string]*method{}, drop: map[string]bool{}, retention: e.Config().Retention}
	if !o.IgnoreKeyFields { // methods found by their key field, AEP-155 ones among them
		if err := checkSkew("the", s.retentionOf(&method{pol: o.Policy}), o.MaxClockSkew); err != nil {
			return nil, err
		}
	}
	for _, n := range o.DropMetadata {
		s.drop[lower(n)] = true
	}
	s.keep = func(name string) bool { return Keep(name, s.drop) }
	add := func(name string, pol Policy) (*method, error) {
		if m := s.explicit[name]; m != nil {
			return m, nil
		}
		if err := pol.validate(); err != nil {
			return nil, fmt.Errorf("method %s: %w", name, err)
		}
		md, err := describe(o.Files, name)
		if err != nil {
			return nil, err
		}
		m, err := s.newMethod(name, md, pol)
		if err != nil {
			return nil, err
		}
		if m.fields.FirstSent != nil {
			if err := checkSkew("method "+name+":", s.retentionOf(m), o.MaxClockSkew); err != nil {
				return nil, err
			}
		}
		s.explicit[name] = m
		return m, nil
	}
	for name, pol := range o.Methods {
		if _, err := add(name, pol); err != nil {
			return nil, err
		}
	}
	for _, name := range o.Require {
		m, err := add(name, o.Policy)
		if err != nil {
			return nil, err
		}
		m.require = true
	}
	return s, nil
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Call is one unary call, as a front door sees it.
type Call struct {
	// Method is the full method name, "/pkg.Service/Method".
	Method string
	// Desc describes the method when the framework knows it (Connect's
	// Spec.Schema); nil looks it up in the registry.
	Desc protoreflect.MethodDescriptor
	// Request is the request message.
	Request proto.Message
	// Keys are the values of the idempotency-key metadata.
	Keys []string
}

// Result is what a handler did: its message or its error, and the
// metadata it set.
type Result struct {
	Msg             proto.Message
	Err             error
	Header, Trailer MD
}

// Answer is what a front door sends: the handler's message or error as
// they are, or idem's own status (a refusal, a replayed status, or a
// handler's error that was marked Retryable or Ambiguous, without its
// mark), with the metadata to send (a replay's).
type Answer struct {
	Msg             proto.Message
	Err             error
	Status          *spb.Status
	Header, Trailer MD
}

// methodFor returns how the call's method is protected, or nil.
func (s *Server) methodFor(c *Call) *method {
	if m := s.explicit[c.Method]; m != nil {
		return m
	}
	if s.o.IgnoreKeyFields {
		return nil
	}
	if m, ok := s.detected.Load(c.Method); ok {
		return m.(*method)
	}
	var m *method
	if KeyFieldsOf(c.Request.ProtoReflect().Descriptor()).Any() {
		md := c.Desc
		var err error
		if md == nil {
			md, err = describe(s.o.Files, c.Method)
		}
		if err == nil {
			m, err = s.newMethod(c.Method, md, s.o.Policy)
		}
		switch {
		case errors.Is(err, errNoSideEffects): // deliberately unprotected
			m = nil
		case err != nil:
			s.o.Logger.LogAttrs(context.Background(), slog.LevelWarn, "idem: a method with a key field is left unprotected",
				slog.String("method", c.Method), slog.Any("error", err))
			m = nil
		}
	}
	s.detected.Store(c.Method, m)
	return m
}

// Serve handles one call. handler runs the framework's handler with the
// context it is given (which carries the lease; see idem.LeaseFrom) and
// reports what it did. A handler that panics settles the key and panics
// on.
func (s *Server) Serve(ctx context.Context, c *Call, handler func(context.Context) Result) Answer {
	m := s.methodFor(c)
	if m == nil && (len(c.Keys) == 0 || s.noSideEffects(c)) {
		return s.pass(ctx, handler)
	}
	ev := Event{Method: c.Method}
	var ans Answer
	if s.o.OnOutcome != nil {
		start := time.Now()
		defer func() {
			ev.Duration = time.Since(start)
			if ans.Status != nil {
				ev.Code = code.Code(ans.Status.Code)
			}
			s.o.OnOutcome(ev)
		}()
	}
	if m == nil {
		ans = s.unlisted(ctx, c, &ev, handler)
	} else {
		ans = s.serve(ctx, c, m, &ev, handler)
	}
	return ans
}

func (s *Server) serve(ctx context.Context, c *Call, m *method, ev *Event, handler func(context.Context) Result) Answer {
	// The rare branches (a refused key, a refused scope, a failed Begin,
	// a refusing outcome) are methods of their own, so that this frame,
	// which stays on the stack under the handler, is small: every call's
	// goroutine grows its stack less.
	k, kerr := findKey(c.Keys, c.Request.ProtoReflect(), m.fields, s.o.AnyRequestID)
	if kerr == nil {
		kerr = checkFirstSent(k, s.o.Now(), s.retentionOf(m), s.o.MaxClockSkew)
	}
	if kerr != nil {
		return s.keyRefused(ctx, m, ev, kerr, handler)
	}
	ev.Key = k.key
	scope, err := s.o.Scope(ctx)
	if err != nil {
		return s.scopeRefused(ev, c, &k, err)
	}
	res, st, err := s.begin(ctx, c, m, &k, scope)
	switch {
	case st != nil:
		return Answer{Status: st}
	case err != nil:
		return s.beginFailed(ctx, c, ev, &k, err, handler)
	}
	ev.Outcome = res.Outcome.String()
	switch res.Outcome {
	case idem.Acquired:
		return s.run(ctx, m, res.Lease, ev, handler)
	case idem.Replayed:
		return s.replay(ctx, c, m, ev, res.Response, k.key)
	}
	return s.refuseOutcome(ev, c, &k, &res)
}

// keyRefused answers a call without a valid key: it runs unprotected when
// the key is missing and the method does not require one, and is refused
// otherwise.
func (s *Server) keyRefused(ctx context.Context, m *method, ev *Event, kerr *keyError, handler func(context.Context) Result) Answer {
	switch {
	case kerr.missing && !m.require:
		ev.Outcome = idem.SituationNoKey.Name
		ans := s.pass(ctx, handler)
		ev.Code = s.codeOf(ans)
		return ans
	case kerr.missing:
		return s.refuse(ev, Refusal{Row: rowOf(idem.SituationMissingKey.Name), Field: kerr.field,
			Message: "This method requires an idempotency key: set " + kerr.field + " (a UUID), or the " + MetadataKey + " metadata, and keep it when you retry."})
	}
	return s.refuse(ev, Refusal{Row: rowOf(idem.SituationInvalidKey.Name), Field: kerr.field, Message: kerr.reason})
}

// refuseKey answers the situation name about the call's valid key k.
func (s *Server) refuseKey(ev *Event, c *Call, k *found, name, msg string) Answer {
	return s.refuse(ev, Refusal{Row: rowOf(name), Key: k.key, Method: c.Method, Field: k.field, Message: msg})
}

// scopeRefused answers a call whose Scope function failed with err.
func (s *Server) scopeRefused(ev *Event, c *Call, k *found, err error) Answer {
	if errors.Is(err, idem.ErrScopeMissing) {
		return s.refuseKey(ev, c, k, idem.SituationScopeMissing.Name, msgScopeMissing)
	}
	if st, ok := s.o.StatusOf(err); ok && st.Code != int32(code.Code_UNKNOWN) {
		ev.Outcome = idem.SituationScopeDenied.Name
		return Answer{Status: st}
	}
	return s.refuseKey(ev, c, k, idem.SituationScopeDenied.Name, "The call's credentials do not identify a client.")
}

// msgScopeMissing answers a call without credentials.
const msgScopeMissing = "The call carries no credentials, so its key cannot be told from another client's."

// begin fingerprints the call and begins its key in scope. A request that
// cannot be fingerprinted is answered st.
func (s *Server) begin(ctx context.Context, c *Call, m *method, k *found, scope string) (res idem.Result, st *spb.Status, err error) {
	fpBuf := fpBuffer()
	defer putFPBuffer(fpBuf) // src holds it, and Begin is done with src
	fp, src, err := Fingerprint(c.Method, c.Request, m.fields, *k, s.o.FingerprintKey, s.o.Types, fpBuf)
	if err != nil {
		return res, &spb.Status{Code: int32(code.Code_INTERNAL), Message: "idem: fingerprinting the request: " + err.Error()}, nil
	}
	wait := m.pol.Wait
	if dl, ok := ctx.Deadline(); ok && wait > 0 {
		// End the wait while the caller can still hear about it.
		wait = max(min(wait, time.Until(dl)*9/10), 0)
	}
	req := idem.Request{
		Key: idem.Key{Scope: scope, Operation: c.Method, Key: k.key}, Fingerprint: fp, FingerprintSource: src,
		Kind: m.pol.Kind, Wait: wait, Lease: m.pol.Lease, Retention: m.pol.Retention,
		Info: m.info,
	}
	res, err = s.e.Begin(ctx, req)
	if err == nil && res.Outcome == idem.Mismatch {
		// The record may be one that an earlier version of idem reserved,
		// whose fingerprint counted first_sent and Anys' bytes: then it
		// is begun again under that fingerprint. Only then: a key reused
		// with other arguments costs the store one Reserve, as any call.
		earlier, differs, ferr := earlierFingerprint(c.Method, c.Request, m.fields, *k, s.o.FingerprintKey)
		if ferr == nil && differs && earlier != fp && res.Record != nil && res.Record.Fingerprint == earlier {
			ereq := req
			ereq.Fingerprint, ereq.FingerprintSource = earlier, nil
			again, aerr := s.e.Begin(ctx, ereq)
			switch {
			case aerr != nil || again.Outcome == idem.Mismatch:
			case again.Outcome == idem.Acquired:
				// The mismatching record is gone (released, expired): no
				// earlier record to match. The call is reserved under
				// today's fingerprint, never the earlier one, which a
				// retry with another first_sent would not match.
				if rerr := again.Lease.Release(ctx); rerr != nil {
					again.Lease.Abandon() // nothing ran: it expires, and recovery settles it
					return idem.Result{}, nil, rerr
				}
				res, err = s.e.Begin(ctx, req)
				return res, nil, err
			default:
				return again, nil, nil
			}
		}
	}
	return res, nil, err
}

// beginFailed answers a call whose Begin failed with err: cancelled, a
// scope or record Begin refused, or a store that cannot be reached.
func (s *Server) beginFailed(ctx context.Context, c *Call, ev *Event, k *found, err error, handler func(context.Context) Result) Answer {
	switch {
	case ctx.Err() != nil:
		ev.Outcome = idem.SituationCanceled.Name
		return Answer{Status: &spb.Status{Code: int32(code.Code_CANCELLED), Message: ctx.Err().Error()}}
	case errors.Is(err, idem.ErrScopeMissing):
		// The Scope function gave an empty or white-space scope:
		// no credentials, as its own ErrScopeMissing would say.
		return s.refuseKey(ev, c, k, idem.SituationScopeMissing.Name, msgScopeMissing)
	case errors.Is(err, idem.ErrTooLong):
		return s.refuseKey(ev, c, k, idem.SituationTooLong.Name, fmt.Sprintf("The call's scope is longer than the %d bytes idem keeps.", idem.MaxScopeLength))
	case errors.Is(err, idem.ErrSealed):
		return s.refuseKey(ev, c, k, idem.SituationSealed.Name, "A call with this key was already processed, but its stored answer cannot be read. It will not run again; retry later with the same key.")
	}
	s.o.Logger.LogAttrs(ctx, slog.LevelError, "idem: store unavailable",
		slog.String("method", c.Method), slog.Any("error", err), slog.Bool("fail_open", s.o.FailOpen))
	if s.o.FailOpen {
		ev.Outcome = idem.SituationFailOpen.Name
		ans := s.pass(ctx, handler)
		ev.Code = s.codeOf(ans)
		return ans
	}
	r := Refusal{Row: rowOf(idem.SituationUnavailable.Name), Key: k.key, Method: c.Method, RetryAfter: time.Second,
		Message: "The call was not processed because its idempotency key could not be checked; retry with the same key."}
	return s.refuse(ev, r)
}

// refuseOutcome answers an outcome of Begin that refuses the call: a
// mismatch, a call in flight, a key that needs review.
func (s *Server) refuseOutcome(ev *Event, c *Call, k *found, res *idem.Result) Answer {
	switch res.Outcome {
	case idem.Mismatch:
		return s.refuseKey(ev, c, k, idem.SituationMismatch.Name, "This idempotency key was already used with a different request. Use a new key for a new request.")
	case idem.InFlight:
		r := Refusal{Row: rowOf(idem.SituationInFlight.Name), Key: k.key, Method: c.Method, RetryAfter: res.RetryAfter,
			Message: "A call with this idempotency key is still being processed. Retry after the RetryInfo delay to get its answer."}
		return s.refuse(ev, r)
	}
	return s.refuseKey(ev, c, k, idem.SituationNeedsReview.Name, "An earlier call with this idempotency key ended with an unknown outcome and is being reviewed. It will not run again; retry later to get its answer.")
}

// pass runs the handler unprotected.
func (s *Server) pass(ctx context.Context, handler func(context.Context) Result) Answer {
	r := handler(ctx)
	return Answer{Msg: r.Msg, Err: r.Err}
}

// refuse answers r, and records its situation.
func (s *Server) refuse(ev *Event, r Refusal) Answer {
	ev.Outcome = r.Row.Situation.Name
	return Answer{Status: r.Status()}
}

// replay answers a stored answer.
func (s *Server) replay(ctx context.Context, c *Call, m *method, ev *Event, resp *idem.Response, key string) Answer {
	if resp.NotReplayable != "" {
		ev.Outcome = idem.SituationNotReplayable.Name
		return Answer{Status: Refusal{Row: rowOf(idem.SituationNotReplayable.Name), Key: key, Method: c.Method,
			Message: fmt.Sprintf("The call with this idempotency key completed, but its answer was not kept (%s), so it cannot be replayed. It will not run again.", resp.NotReplayable)}.Status()}
	}
	r, err := Decode(resp, m.out)
	if err != nil {
		s.o.Logger.LogAttrs(ctx, slog.LevelError, "idem: a stored answer does not decode", slog.String("method", c.Method), slog.Any("error", err))
		ev.Outcome = idem.SituationSealed.Name
		return Answer{Status: Refusal{Row: rowOf(idem.SituationSealed.Name), Key: key, Method: c.Method,
			Message: "A call with this key was already processed, but its stored answer cannot be read. It will not run again."}.Status()}
	}
	if r.Header == nil {
		r.Header = make(MD, 1)
	}
	r.Header[HeaderReplayed] = replayedValue
	return Answer{Msg: r.Msg, Status: r.Status, Header: r.Header, Trailer: r.Trailer}
}

// replayedValue is HeaderReplayed's value, shared by every replay: the
// front doors copy metadata when they send it, and never change it.
var replayedValue = []string{"true"}[:1:1]

// codeOf is the code of an answer.
func (s *Server) codeOf(a Answer) code.Code {
	switch {
	case a.Status != nil:
		return code.Code(a.Status.Code)
	case a.Err != nil:
		if st, ok := s.o.StatusOf(a.Err); ok {
			return code.Code(st.Code)
		}
		return code.Code_UNKNOWN
	}
	return code.Code_OK
}

func (s *Server) retentionOf(m *method) time.Duration {
	if m.pol.Retention > 0 {
		return m.pol.Retention
	}
	return s.retention
}

// Wait waits for the settlements still going on after their answers (a
// release or an escalation the store refused at first), for tests and
// graceful shutdowns.
func (s *Server) Wait() { s.later.Wait() }
