package rpccore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// Options configure a Server. The front doors fill them from their own
// Config, whose fields document them.
type Options struct {
	Scope           func(context.Context) (string, error)
	Methods         map[string]Policy
	Require         []string
	Policy          Policy
	IgnoreKeyFields bool
	AnyRequestID    bool
	FailOpen        bool
	FingerprintKey  []byte
	DropMetadata    []string
	MaxClockSkew    time.Duration
	RefuseUnlisted  bool
	OnOutcome       func(Event)
	Logger          *slog.Logger
	Files           *protoregistry.Files
	Types           *protoregistry.Types
	Now             func() time.Time

	// StatusOf returns the status the framework sends for err, and false
	// when err carries none (the framework then sends UNKNOWN).
	StatusOf func(err error) (*spb.Status, bool)
}

// Policy is how a method is protected.
type Policy struct {
	Kind                   idem.Kind
	Wait, Lease, Retention time.Duration
	// ReleaseCodes: nil means DefaultReleaseCodes.
	ReleaseCodes []code.Code
	// AmbiguousCodes: nil means DefaultAmbiguousCodes.
	AmbiguousCodes []code.Code
	// Ambiguous is what an ambiguous code does to the key of an External
	// method: "" or AmbiguousEscalate, or AmbiguousRelease.
	Ambiguous string
}

// DefaultReleaseCodes are the codes that mean "nothing happened, try
// again", as 503 and 429 do on HTTP (idem serve's release_statuses).
var DefaultReleaseCodes = []code.Code{code.Code_UNAVAILABLE, code.Code_RESOURCE_EXHAUSTED}

// DefaultAmbiguousCodes are the codes that mean "the effect is unknown":
// a handler that answers them, typically passing on a downstream call's
// error, may or may not have done its work (idem serve's ambiguous
// outcomes: an upstream that timed out or broke after the request went).
var DefaultAmbiguousCodes = []code.Code{code.Code_DEADLINE_EXCEEDED, code.Code_CANCELLED}

// The values of Policy.Ambiguous, as idem serve's ambiguous names them.
const (
	AmbiguousEscalate = "escalate"
	AmbiguousRelease  = "release"
)

// DefaultMaxClockSkew is how far in the future an AEP-155 first_sent may
// be before it is refused.
const DefaultMaxClockSkew = time.Minute

func (p Policy) withDefaults() Policy {
	if p.ReleaseCodes == nil {
		p.ReleaseCodes = DefaultReleaseCodes
	}
	if p.AmbiguousCodes == nil {
		p.AmbiguousCodes = DefaultAmbiguousCodes
	}
	if p.Ambiguous == "" {
		p.Ambiguous = AmbiguousEscalate
	}
	return p
}

func (p Policy) validate() error {
	switch {
	case p.Kind != idem.External && p.Kind != idem.Transactional:
		return fmt.Errorf("Policy.Kind %v is unknown", p.Kind)
	case p.Wait < 0 || p.Lease < 0 || p.Retention < 0:
		return errors.New("Policy.Wait, Lease and Retention must not be negative")
	}
	switch p.Ambiguous {
	case "", AmbiguousEscalate, AmbiguousRelease:
	default:
		return fmt.Errorf("Policy.Ambiguous must be %q or %q, got %q", AmbiguousEscalate, AmbiguousRelease, p.Ambiguous)
	}
	for _, c := range p.ReleaseCodes {
		if c == code.Code_OK {
			return errors.New("Policy.ReleaseCodes: OK is an answer, never a release")
		}
	}
	p = p.withDefaults()
	for _, c := range p.AmbiguousCodes {
		switch {
		case c == code.Code_OK:
			return errors.New("Policy.AmbiguousCodes: OK is an answer, never an unknown outcome")
		case slices.Contains(p.ReleaseCodes, c):
			return fmt.Errorf("%v is both in Policy.ReleaseCodes (nothing happened) and in Policy.AmbiguousCodes (the effect is unknown); choose one (an empty non-nil slice empties a default)", c)
		}
	}
	return nil
}

// Event describes one protected call, for metrics and audit hooks.
type Event struct {
	// Method is the full method name, "/pkg.Service/Method".
	Method string
	// Key is the call's key, when it sent a valid one.
	Key string
	// Outcome is the situation's name: "acquired", "replayed", "mismatch",
	// "in_flight", "needs_review", "not_replayable", "missing_key",
	// "invalid_key", "scope_missing", "scope_denied", "too_long",
	// "unavailable", "sealed", "fail_open", "no_key", "canceled"
	// or "unprotected_method".
	Outcome string
	// Settlement says what became of an acquired call's key, as
	// idem.Event.Settlement does.
	Settlement string
	// Code is the status code the client got.
	Code code.Code
	// Duration is the time spent in the interceptor and the handler.
	Duration time.Duration
	// Unlisted reports a call that carried a key in its metadata to a
	// method the configuration does not protect (see Server.unlisted).
	Unlisted bool
}

// method is how one method is protected.
type method struct {
	name    string
	out     protoreflect.MessageType
	fields  *KeyFields
	pol     Policy
	require bool
	// info is what the record shows of the call (stores copy it).
	info *idemstore.Request
}

// parseMethod splits "/pkg.Service/Method".
func parseMethod(name string) (svc protoreflect.FullName, m protoreflect.Name, ok bool) {
	rest, found := strings.CutPrefix(name, "/")
	if !found {
		return "", "", false
	}
	s, mm, found := strings.Cut(rest, "/")
	if !found || !protoreflect.FullName(s).IsValid() || !protoreflect.Name(mm).IsValid() {
		return "", "", false
	}
	return protoreflect.FullName(s), protoreflect.Name(mm), true
}

// describe returns the descriptor of the method named name, from files.
func describe(files *protoregistry.Files, name string) (protoreflect.MethodDescriptor, error) {
	svc, m, ok := parseMethod(name)
	if !ok {
		return nil, fmt.Errorf("%q is not a full method name such as /pkg.Service/Method", name)
	}
	d, err := files.FindDescriptorByName(svc)
	if err != nil {
		return nil, fmt.Errorf("method %s: service %s is not in the protobuf registry (import its generated package): %w", name, svc, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("method %s: %s is not a service", name, svc)
	}
	md := sd.Methods().ByName(m)
	if md == nil {
		return nil, fmt.Errorf("method %s: service %s has no method %s", name, svc, m)
	}
	return md, nil
}

// errNoSideEffects refuses to protect a method that declares it has no
// side effects: there is nothing to run only once, its calls may be sent
// as HTTP GETs (Connect) that caches and proxies repeat, and a replay would
// only serve a stale read.
var errNoSideEffects = errors.New("is marked idempotency_level = NO_SIDE_EFFECTS: it has no effect to run only once; retrying it is always safe")

// noSideEffects reports whether md is marked idempotency_level =
// NO_SIDE_EFFECTS.
func noSideEffects(md protoreflect.MethodDescriptor) bool {
	o, ok := md.Options().(*descriptorpb.MethodOptions)
	return ok && o.GetIdempotencyLevel() == descriptorpb.MethodOptions_NO_SIDE_EFFECTS
}

// newMethod describes how md is protected.
func (s *Server) newMethod(name string, md protoreflect.MethodDescriptor, pol Policy) (*method, error) {
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, fmt.Errorf("method %s streams: idem protects unary methods only", name)
	}
	if noSideEffects(md) {
		return nil, fmt.Errorf("method %s %w", name, errNoSideEffects)
	}
	out, err := s.o.Types.FindMessageByName(md.Output().FullName())
	if err != nil {
		out = dynamicpb.NewMessageType(md.Output())
	}
	return &method{name: name, out: out, fields: KeyFieldsOf(md.Input()), pol: pol.withDefaults(),
		info: &idemstore.Request{Method: "RPC", Path: name}}, nil
}
