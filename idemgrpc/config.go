package idemgrpc

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"log/slog"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/rpccore"
)

// ScopeFunc says whose key a call carries: a user, a tenant, a hash of the
// client's certificate. Keys are unique per scope, so one client can never
// read another's answer. Return idem.ErrScopeMissing for a call without
// credentials (UNAUTHENTICATED, reason SCOPE_MISSING), a gRPC status to
// answer it (PERMISSION_DENIED, say), or any other error for
// UNAUTHENTICATED (SCOPE_DENIED).
type ScopeFunc func(ctx context.Context) (string, error)

// GlobalScope puts every call in one scope. Choose it only for a service
// with a single client, or keys that are unguessable and answers that hold
// nothing private.
func GlobalScope(context.Context) (string, error) { return "global", nil }

// PeerCertificateScope scopes keys by the client's TLS certificate (mutual
// TLS between services): the SHA-256 of the leaf certificate. A call
// without one gets idem.ErrScopeMissing.
func PeerCertificateScope(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", idem.ErrScopeMissing
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return "", idem.ErrScopeMissing
	}
	return certScope(ti.State.PeerCertificates[0]), nil
}

func certScope(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return "cert:" + hex.EncodeToString(sum[:])
}

// Policy is how a method is protected. The zero Policy is the default.
type Policy struct {
	// Kind decides what an expired lease means (see idem.Kind). Defaults
	// to idem.External. Choose idem.Transactional for handlers that
	// complete with a store's CompleteTx inside their transaction.
	Kind idem.Kind
	// Wait, when positive, makes a duplicate of a call in flight wait up to
	// this long (and at most nine tenths of the time left before its
	// deadline) and then get the first
	// answer, instead of ABORTED (IN_FLIGHT) with RetryInfo. Defaults to 0.
	Wait time.Duration
	// Lease overrides idem.EngineConfig.Lease when positive.
	Lease time.Duration
	// Retention overrides idem.EngineConfig.Retention when positive. It is
	// also how old an AEP-155 first_sent may be.
	Retention time.Duration
	// ReleaseCodes are the codes that mean "nothing happened, try again":
	// the key is released instead of storing the status. Defaults to
	// UNAVAILABLE and RESOURCE_EXHAUSTED; an empty non-nil slice releases on
	// none.
	ReleaseCodes []codes.Code
	// AmbiguousCodes are the codes that mean "the effect is unknown": a
	// handler that answers one, typically passing on a downstream call's
	// timeout, may or may not have done its work, so its answer is never
	// stored. The key goes to review (NEEDS_REVIEW until an operator or a
	// Resolver settles it) in an External method, and is released in a
	// Transactional one (nothing committed without CompleteTx). A code
	// may not be in both lists. Defaults to DEADLINE_EXCEEDED and CANCELLED; an empty
	// non-nil slice leaves only the codes of a call that itself ended.
	AmbiguousCodes []codes.Code
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
func coreCodes(cs []codes.Code) []code.Code {
	if cs == nil {
		return nil
	}
	out := make([]code.Code, len(cs))
	for i, c := range cs {
		out[i] = code.Code(c)
	}
	return out
}

// Config configures the server interceptor.
type Config struct {
	// Scope says whose key a call carries. Required: use GlobalScope to
	// choose a single scope deliberately.
	Scope ScopeFunc

	// Methods are protected methods by full name ("/pkg.Service/Method"),
	// each with its policy. Each must be a unary method of a service in the
	// protobuf registry (its generated package imported). Defaults to none:
	// only the methods found by their key field.
	Methods map[string]Policy

	// Require lists the methods (full names) whose calls must carry a key:
	// one without gets INVALID_ARGUMENT (KEY_MISSING). A call without a key
	// to another protected method runs unprotected. A method listed here
	// and not in Methods is protected with Policy. Defaults to none.
	Require []string

	// Policy protects the methods found by their key field (a request
	// message with a string request_id or an idempotency_key field), and
	// those in Require but not in Methods.
	Policy Policy

	// IgnoreKeyFields protects only the methods in Methods and Require,
	// whatever fields their requests have. Defaults to false.
	IgnoreKeyFields bool

	// AnyRequestID accepts a request_id that is not a UUID (any key of 1 to
	// 255 visible ASCII bytes). Defaults to false: a request_id must be a
	// UUID, as AIP-155 asks; an idempotency_key or the metadata may be any
	// valid key.
	AnyRequestID bool

	// MaxClockSkew is how far in the future an AEP-155 first_sent may be
	// before the key is refused as invalid. Defaults to one minute.
	MaxClockSkew time.Duration

	// RefuseUnlistedKeys refuses a call that carries a key in the
	// idempotency-key metadata to a method this configuration does not
	// protect (not in Methods or Require, and without a key field, or with
	// IgnoreKeyFields): FAILED_PRECONDITION, reason METHOD_UNPROTECTED,
	// naming the method; the handler does not run. Defaults to false: such
	// a call is protected with Policy, as its client believes it is (a
	// client that retries with its key must never run a call twice). Either
	// way the call is logged at warn by key digest and its Event has
	// Unlisted set. A method marked NO_SIDE_EFFECTS runs as it is, key or
	// not: it has no effect to run twice.
	RefuseUnlistedKeys bool

	// FailOpen runs the handler unprotected when the store cannot be
	// reached, instead of answering UNAVAILABLE. Defaults to false.
	FailOpen bool

	// FingerprintKey, if set, keys request fingerprints with HMAC-SHA-256
	// (see idem.FingerprintOptions.Key). Defaults to none.
	FingerprintKey []byte

	// DropMetadata names header and trailer metadata of the handler's that
	// are never stored nor replayed, besides those never stored anyway
	// (grpc-*, content-*, date, cookies, credentials). Defaults to none.
	DropMetadata []string

	// OnOutcome, if set, is called once per protected call, after the
	// handler returned.
	OnOutcome func(Event)

	// Types resolves the messages inside the google.protobuf.Any fields of
	// requests, so that an Any counts in the fingerprint by the message it
	// holds (maps in any order, unknown fields left out) rather than by its
	// bytes, and the response types of protected methods. Defaults to
	// protoregistry.GlobalTypes.
	Types *protoregistry.Types

	// Logger receives structured logs. Defaults to the engine's logger.
	Logger *slog.Logger

	now func() time.Time // test hook: the clock first_sent is checked on
}

// Event describes one protected call, for metrics and audit hooks.
type Event struct {
	// Method is the full method name.
	Method string
	// Key is the call's key, when it sent a valid one.
	Key string
	// Outcome is the situation's name, as idem.Event.Outcome has it
	// ("acquired", "replayed", "mismatch", "in_flight", "missing_key", …).
	Outcome string
	// Settlement says what became of an acquired call's key
	// ("completed", "released", "escalated", … as idem.Event.Settlement).
	Settlement string
	// Code is the status code the client got; UNKNOWN when the handler
	// panicked (what the client gets then is up to the interceptor that
	// recovers the panic).
	Code codes.Code
	// Duration is the time spent in the interceptor and the handler.
	Duration time.Duration
	// Unlisted reports a call that carried a key in its metadata to a
	// method the configuration does not protect: protected with Policy, or
	// refused (Outcome "unprotected_method"). Count these: they are clients
	// that expect a protection the configuration does not list.
	Unlisted bool
}

func (cfg Config) options() rpccore.Options {
	o := rpccore.Options{
		Scope: cfg.Scope, Require: cfg.Require, Policy: cfg.Policy.core(),
		IgnoreKeyFields: cfg.IgnoreKeyFields, AnyRequestID: cfg.AnyRequestID, MaxClockSkew: cfg.MaxClockSkew,
		RefuseUnlisted: cfg.RefuseUnlistedKeys, FailOpen: cfg.FailOpen, FingerprintKey: cfg.FingerprintKey, DropMetadata: cfg.DropMetadata,
		Logger: cfg.Logger, Types: cfg.Types, StatusOf: statusOf, Now: cfg.now,
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
			on(Event{Method: ev.Method, Key: ev.Key, Outcome: ev.Outcome, Settlement: ev.Settlement, Code: codes.Code(ev.Code), Duration: ev.Duration, Unlisted: ev.Unlisted})
		}
	}
	return o
}
