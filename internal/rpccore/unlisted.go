package rpccore

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/genproto/googleapis/rpc/code"

	"github.com/idem-dev/idem"
)

// ReasonMethodUnprotected is the ErrorInfo reason of a call refused because
// it carries a key to a method this server does not protect.
const ReasonMethodUnprotected = "METHOD_UNPROTECTED"

// SituationUnprotectedMethod is a call refused for carrying a key to a
// method the server's configuration does not protect (Options.RefuseUnlisted,
// or a method not in the protobuf registry). It is the RPC front doors'
// own: HTTP has no such thing (the middleware protects the routes it wraps).
var SituationUnprotectedMethod = idem.Situation{Name: "unprotected_method"}

// rowUnprotected answers a call refused for carrying a key to a method
// that is not protected.
var rowUnprotected = &Row{SituationUnprotectedMethod, code.Code_FAILED_PRECONDITION, ReasonMethodUnprotected, false,
	"the client believes the call protected, and would retry it with its key; run unprotected, a retry after a lost answer would run it twice, so it is not run at all"}

// unlisted answers a call that carries a key in its metadata to a method
// that the configuration does not protect (not in Methods nor Require, and
// without a key field, or with IgnoreKeyFields). The client believes the
// call protected and retries it with the key, so running it unprotected
// would run it twice after a lost answer. It is never silent:
//
//   - by default the method is protected with Options.Policy, as if it had
//     been listed in Methods;
//   - with RefuseUnlisted, or for a method that cannot be protected (not
//     in the protobuf registry), the call is refused with
//     FAILED_PRECONDITION (METHOD_UNPROTECTED) naming the method, and does
//     not run;
//
// (A method marked NO_SIDE_EFFECTS never gets here: it has no effect to
// run twice, and runs as it is, key or not; see noSideEffects.)
//
// Each such call is logged (at warn, by key digest) and reported in its
// Event with Unlisted set.
func (s *Server) unlisted(ctx context.Context, c *Call, ev *Event, handler func(context.Context) Result) Answer {
	ev.Unlisted = true
	m, why := s.unlistedMethod(c)
	digest := s.digestOf(ctx, c)
	switch {
	case why != nil || s.o.RefuseUnlisted:
		attrs := []slog.Attr{slog.String("method", c.Method), slog.String("key_digest", digest)}
		if why != nil {
			attrs = append(attrs, slog.Any("error", why))
		}
		s.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: a call carries an idempotency key to a method that is not protected; refused", attrs...)
		msg := "This server does not protect " + c.Method + " with an idempotency key, so the call was not run: run unprotected, a retry could run it twice. Ask the service's owners to protect the method, or call it without an " + MetadataKey + "."
		return s.refuse(ev, Refusal{Row: rowUnprotected, Method: c.Method, Field: c.Method, Message: msg})
	}
	s.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: a call carries an idempotency key to a method that is not configured; protected with the default policy",
		slog.String("method", c.Method), slog.String("key_digest", digest))
	return s.serve(ctx, c, m, ev, handler)
}

// noSideEffects reports whether the call's method, not configured, is
// marked NO_SIDE_EFFECTS: left alone deliberately, as methodFor leaves it.
func (s *Server) noSideEffects(c *Call) bool {
	_, why := s.unlistedMethod(c)
	return errors.Is(why, errNoSideEffects)
}

// unlistedMethod returns how a method that is not configured is protected
// when a call carries a key to it, or why it cannot be, once per method.
func (s *Server) unlistedMethod(c *Call) (*method, error) {
	if v, ok := s.unlistedMethods.Load(c.Method); ok {
		if err, ok := v.(error); ok {
			return nil, err
		}
		return v.(*method), nil
	}
	md := c.Desc
	var err error
	if md == nil {
		md, err = describe(s.o.Files, c.Method)
	}
	var m *method
	if err == nil {
		m, err = s.newMethod(c.Method, md, s.o.Policy)
	}
	if err == nil && m.fields.FirstSent != nil {
		err = checkSkew("method "+c.Method+":", s.retentionOf(m), s.o.MaxClockSkew)
	}
	if err != nil {
		s.unlistedMethods.Store(c.Method, err)
		return nil, err
	}
	v, _ := s.unlistedMethods.LoadOrStore(c.Method, m)
	return v.(*method), nil
}

// digestOf names the call's key on a log line (idem.KeyDigest), never the
// key itself: in its scope when the Scope function gives one.
func (s *Server) digestOf(ctx context.Context, c *Call) string {
	key := c.Keys[0]
	if k, err := idem.ParseKeyHeader(c.Keys); err == nil {
		key = canonicalKey(k)
	}
	scope, _ := s.o.Scope(ctx)
	return idem.KeyDigest(idem.Key{Scope: scope, Operation: c.Method, Key: key})
}
