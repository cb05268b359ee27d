package rpccore

import (
	"slices"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idem-dev/idem"
)

// What idem serve shares with the front doors when it protects gRPC and
// Connect calls itself (idemproxy): it has no Server (it forwards bytes to
// an upstream instead of calling a handler), but it finds keys, names
// fingerprints and answers refusals exactly as they do.

// CallKey is a call's key and where it was found (FindCallKey).
type CallKey struct{ f found }

// Key is the key itself.
func (k CallKey) Key() string { return k.f.key }

// Field is where the key was read: the metadata name or a field path.
func (k CallKey) Field() string { return k.f.field }

// FindCallKey reads a call's key from its idempotency-key metadata values
// and, when m is not nil, from the key fields f of its request message
// (AIP-155 request_id, AEP-155 idempotency_key), by the front doors' rules:
// every source present must give the same key, a request_id must be a UUID
// unless anyRequestID, and an AEP-155 first_sent must be within retention
// and skew of now. missing reports a call with no key at all; a refused key
// is a Refusal (KEY_MISSING never: the caller decides whether a missing
// key is refused, with MissingKey).
func FindCallKey(values []string, m protoreflect.Message, f *KeyFields, anyRequestID bool, now time.Time, retention, skew time.Duration) (k CallKey, missing bool, refused *Refusal) {
	if f == nil {
		f = &KeyFields{}
	}
	fk, kerr := findKey(values, m, f, anyRequestID)
	if kerr == nil {
		kerr = checkFirstSent(fk, now, retention, skew)
	}
	switch {
	case kerr == nil:
		return CallKey{fk}, false, nil
	case kerr.missing:
		return CallKey{}, true, nil
	}
	return CallKey{}, false, &Refusal{Row: rowOf(idem.SituationInvalidKey.Name), Field: kerr.field, Message: kerr.reason}
}

// MissingKey is the refusal of a call without a key on a method that
// requires one; f names the field to set (nil: the metadata).
func MissingKey(f *KeyFields) Refusal {
	field := MetadataKey
	if f != nil {
		field = f.Name()
	}
	return Refusal{Row: rowOf(idem.SituationMissingKey.Name), Field: field,
		Message: "This method requires an idempotency key: set " + field + " (a UUID), or the " + MetadataKey + " metadata, and keep it when you retry."}
}

// FingerprintCall is Fingerprint for a key FindCallKey found: the
// canonical fingerprint of the decoded request m of op, the same as the
// front doors give it.
func FingerprintCall(op string, m proto.Message, f *KeyFields, k CallKey, key []byte, types *protoregistry.Types) (string, *idem.FingerprintSource, error) {
	if f == nil {
		f = &KeyFields{}
	}
	return Fingerprint(op, m, f, k.f, key, types, nil)
}

// RowOf returns the row of Table for the situation named name; it panics
// for a situation the table has no row for.
func RowOf(name string) *Row { return rowOf(name) }

// Settling is what an answered status code means for the key of a call
// that ran, by the policy's codes (see Server's run): Store the answer,
// Release the key (nothing happened), or Ambiguous (the effect is unknown:
// escalate an External key, unless Policy.Ambiguous releases it).
type Settling int

// The Settling values.
const (
	Store Settling = iota
	Release
	Ambiguous
)

// Settle says what an answered code c means under p's ReleaseCodes and
// AmbiguousCodes (their defaults when nil). OK is always stored.
func (p Policy) Settle(c code.Code) Settling {
	if c == code.Code_OK {
		return Store
	}
	p = p.withDefaults()
	switch {
	case slices.Contains(p.ReleaseCodes, c):
		return Release
	case slices.Contains(p.AmbiguousCodes, c):
		return Ambiguous
	}
	return Store
}

// Validate reports a policy whose codes or settings contradict each other.
func (p Policy) Validate() error { return p.validate() }

// UnprotectedMethod is the refusal of a call to method that idem does
// not protect (FAILED_PRECONDITION, METHOD_UNPROTECTED), saying why.
func UnprotectedMethod(method, why string) Refusal {
	return Refusal{Row: rowUnprotected, Method: method, Field: method, Message: why}
}

// ProxyTable is how idem serve answers the situations only a proxy
// meets, in the gRPC calls it protects: the upstream's failures, its own
// shutdown and limits. They follow Table's rules: RetryInfo where the same
// call with the same key can succeed.
var ProxyTable = []Row{
	{idem.SituationUpstreamUnreachable, code.Code_UNAVAILABLE, "UPSTREAM_UNREACHABLE", true,
		"the upstream could not be reached and nothing was sent; the key was released, so the same call can be retried as it is"},
	{idem.SituationUpstreamFailed, code.Code_UNKNOWN, "UPSTREAM_FAILED", false,
		"the call was sent and then failed (a reset stream, a GOAWAY, an answer cut short before its status): its effect is unknown, and the key waits for review"},
	{idem.SituationUpstreamTimeout, code.Code_DEADLINE_EXCEEDED, "UPSTREAM_TIMEOUT", false,
		"the upstream did not answer within the call's deadline after it was sent: its effect is unknown, and the key waits for review"},
	{idem.SituationShuttingDown, code.Code_UNAVAILABLE, "SHUTTING_DOWN", true,
		"the proxy is draining and forwarded nothing; another instance, or this one after its restart, runs the retry"},
	{idem.SituationBusy, code.Code_UNAVAILABLE, "PROXY_BUSY", true,
		"the proxy holds as many request bodies as its memory budget allows; nothing was forwarded"},
	{idem.SituationTooManyNewKeys, code.Code_RESOURCE_EXHAUSTED, "TOO_MANY_NEW_KEYS", true,
		"the client reserved as many new keys as new_keys_per_scope allows it in an interval; nothing was forwarded and the key was released, so the same call can be retried after the RetryInfo delay"},
	{idem.SituationBodyTooLarge, code.Code_RESOURCE_EXHAUSTED, "MESSAGE_TOO_LARGE", false,
		"the request message is larger than the route accepts; nothing was forwarded, and the same call will be refused again"},
}
