package idemconnect

import (
	"context"
	"log/slog"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/rpccore"
)

// ScopeFunc says whose key a call carries (a user, a tenant). Keys are
// unique per scope. It may read the request's headers with
// connect.CallInfoForHandlerContext. Return idem.ErrScopeMissing for a call
// without credentials (UNAUTHENTICATED, SCOPE_MISSING), a *connect.Error to
// answer it, or any other error for UNAUTHENTICATED (SCOPE_DENIED).
type ScopeFunc func(ctx context.Context) (string, error)

// GlobalScope puts every call in one scope; see idemgrpc.GlobalScope.
func GlobalScope(context.Context) (string, error) { return "global", nil }

// Policy is how a procedure is protected. The zero Policy is the default.
type Policy struct {
	// Kind decides what an expired lease means (see idem.Kind). Defaults
	// to idem.External.
	Kind idem.Kind
	// Wait, when positive, makes a duplicate of a call in flight wait up to
	// this long (and at most nine tenths of the time left before its
	// deadline) for the first answer, instead of ABORTED (IN_FLIGHT).
	// Defaults to 0.
	Wait time.Duration
	// Lease overrides idem.EngineConfig.Lease when positive.
	Lease time.Duration
	// Retention overrides idem.EngineConfig.Retention when positive.
	Retention time.Duration
	// ReleaseCodes are the codes that release the key instead of storing
	// the error. Defaults to CodeUnavailable and CodeResourceExhausted; an
	// empty non-nil slice releases on none.
	ReleaseCodes []connect.Code
	// AmbiguousCodes are the codes that mean "the effect is unknown": a
	// handler that answers one, typically passing on a downstream call's
	// timeout, may or may not have done its work, so its answer is never
	// stored. The key goes to review (NEEDS_REVIEW until an operator or a
	// Resolver settles it) in an External method, and is released in a
	// Transactional one (nothing committed without CompleteTx). A code
	// may not be in both lists. Defaults to CodeDeadlineExceeded and CodeCanceled; an empty
	// non-nil slice leaves only the codes of a call that itself ended.
	AmbiguousCodes []connect.Code
	// Ambiguous is what an ambiguous code does to an External method's
	// key: AmbiguousEscalate, or AmbiguousRelease for a handler whose
	// downstream deduplicates by the key itself (as idem serve's
	// ambiguous: release). Defaults to AmbiguousEscalate.
	Ambiguous Ambiguous
}

// Ambiguous is what becomes of the key of an External method whose handler
// answered an ambiguous code (Policy.AmbiguousCodes).
type Ambiguous string

// The values of Policy.Ambiguous, named as idem serve's ambiguous.
const (
	// AmbiguousEscalate moves the key to review. The default.
	AmbiguousEscalate Ambiguous = rpccore.AmbiguousEscalate
	// AmbiguousRelease releases the key, so that a retry runs the handler
	// again. Choose it only when what the handler calls is itself
	// idempotent on the key it passes on.
	AmbiguousRelease Ambiguous = rpccore.AmbiguousRelease
)

func (p Policy) core() rpccore.Policy {
	return rpccore.Policy{Kind: p.Kind, Wait: p.Wait, Lease: p.Lease, Retention: p.Retention,
		ReleaseCodes: coreCodes(p.ReleaseCodes), AmbiguousCodes: coreCodes(p.AmbiguousCodes), Ambiguous: string(p.Ambiguous)}
}

// coreCodes are cs as google.rpc codes; nil stays nil (the default).
func coreCodes(cs []connect.Code) []code.Code {
	if cs == nil {
		return nil
	}
	out := make([]code.Code, len(cs))
	for i, c := range cs {
		out[i] = code.Code(c)
	}
	return out
}

// Config configures the handler side of the interceptor. Its fields mean
// what idemgrpc.Config's do, procedures standing for methods.
type Config struct {
	// Scope says whose key a call carries. Required.
	Scope ScopeFunc
	// Methods are protected procedures ("/pkg.Service/Method") with their
	// policies; each must be a unary method of a service in the protobuf
	// registry. Defaults to none: only those found by their key field.
	Methods map[string]Policy
	// Require lists the procedures whose calls must carry a key
	// (INVALID_ARGUMENT, KEY_MISSING, without one). Defaults to none.
	Require []string
	// Policy protects the procedures found by their key field and those in
	// Require but not in Methods.
	Policy Policy
	// IgnoreKeyFields protects only Methods and Require. Defaults to false.
	IgnoreKeyFields bool
	// AnyRequestID accepts a request_id that is not a UUID. Defaults to
	// false.
	AnyRequestID bool
	// MaxClockSkew is how far in the future an AEP-155 first_sent may be.
	// Defaults to one minute.
	MaxClockSkew time.Duration
	// RefuseUnlistedKeys refuses a call that carries an Idempotency-Key
	// header to a procedure this configuration does not protect
	// (FAILED_PRECONDITION, METHOD_UNPROTECTED) instead of protecting it
	// with Policy; see idemgrpc.Config.RefuseUnlistedKeys. Defaults to
	// false.
	RefuseUnlistedKeys bool
	// FailOpen runs the handler unprotected when the store cannot be
	// reached, instead of answering UNAVAILABLE. Defaults to false.
	FailOpen bool
	// FingerprintKey, if set, keys fingerprints with HMAC-SHA-256; it must
	// match idemgrpc's for records shared with it. Defaults to none.
	FingerprintKey []byte
	// DropMetadata names response headers and trailers never stored nor
	// replayed. Defaults to none.
	DropMetadata []string
	// OnOutcome, if set, is called once per protected call.
	OnOutcome func(Event)
	// Types resolves the messages inside the google.protobuf.Any fields of
	// requests, so that an Any counts in the fingerprint by the message it
	// holds (maps in any order, unknown fields left out) rather than by its
	// bytes, and the response types of protected methods. Defaults to
	// protoregistry.GlobalTypes.
	Types *protoregistry.Types

	// Logger receives structured logs. Defaults to the engine's logger.
	Logger *slog.Logger
}

// Event describes one protected call, as idemgrpc.Event does.
type Event struct {
	// Procedure is the full procedure name.
	Procedure string
	// Key is the call's key, when it sent a valid one.
	Key string
	// Outcome is the situation's name ("acquired", "replayed", …).
	Outcome string
	// Settlement says what became of an acquired call's key.
	Settlement string
	// Code is the code the client got (0 for success); CodeUnknown when the
	// handler panicked.
	Code connect.Code
	// Duration is the time spent in the interceptor and the handler.
	Duration time.Duration
	// Unlisted reports a call that carried a key to a procedure the
	// configuration does not protect (see idemgrpc.Event.Unlisted).
	Unlisted bool
}

func (cfg Config) options() rpccore.Options {
	o := rpccore.Options{
		Scope: cfg.Scope, Require: cfg.Require, Policy: cfg.Policy.core(),
		IgnoreKeyFields: cfg.IgnoreKeyFields, AnyRequestID: cfg.AnyRequestID, MaxClockSkew: cfg.MaxClockSkew,
		RefuseUnlisted: cfg.RefuseUnlistedKeys, FailOpen: cfg.FailOpen, FingerprintKey: cfg.FingerprintKey, DropMetadata: cfg.DropMetadata,
		Logger: cfg.Logger, Types: cfg.Types, StatusOf: statusOf,
	}
	if len(cfg.Methods) > 0 {
		o.Methods = make(map[string]rpccore.Policy, len(cfg.Methods))
		for name, p := range cfg.Methods {
			o.Methods[name] = p.core()
		}
	}
	if cfg.OnOutcome != nil {
		on := cfg.OnOutcome
		o.OnOutcome = func(ev rpccore.Event) {
			on(Event{Procedure: ev.Method, Key: ev.Key, Outcome: ev.Outcome, Settlement: ev.Settlement, Code: connect.Code(ev.Code), Duration: ev.Duration, Unlisted: ev.Unlisted})
		}
	}
	return o
}
