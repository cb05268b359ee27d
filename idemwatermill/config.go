package idemwatermill

import (
	"bytes"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/msgdoor"
)

// Config configures Middleware. Scope is required; the rest protects every
// message by its UUID, as an External operation named after its handler.
type Config struct {
	// Scope names whose messages these are: the consumer group, such as
	// the service that consumes them ("billing"). Two services that
	// consume one topic and share an idem store must use different
	// scopes, or the second would never run and would emit the first
	// one's answer. Required (New fails without it), unless HandlerScope
	// is set.
	Scope string

	// HandlerScope names the scope after the handler instead (or the
	// subscribed topic outside a router), as idem did when Scope was left
	// empty before it was required: set it, and leave Scope empty, to keep
	// the records a service stored that way. Two services whose handlers
	// share a name (handlers named after their topic) then share records,
	// and one gets the other's answers: move to a Scope once Retention has
	// passed. Defaults to false.
	HandlerScope bool

	// ScopeFunc, if set, says whose each message is, from its metadata: a
	// tenant. The record's scope is then Scope, a slash and what ScopeFunc
	// returns ("billing/tenant-a"), so that one tenant's business key
	// never meets another's. A message for which it returns "" or an error does not
	// run: an error marked idem.Retryable (a lookup that failed) is
	// returned as an *Error that is not poison (the message is nacked and
	// comes back), any other error, and "", as poison (scope_missing).
	// It is not asked about a message without a key, which keeps no
	// record: such a message runs unprotected with KeyOptional, and is
	// poison (missing_key) without it.
	// Scope must then not contain a slash, and HandlerScope must not be
	// set: a handler's name may hold a slash (handlers "a" and "a/b", with
	// tenants "b/c" and "c", would share the scope "a/b/c"), and the
	// records HandlerScope keeps have no tenant anyway. Defaults to nil:
	// every message in Scope.
	ScopeFunc func(msg *message.Message) (string, error)

	// Operation returns the operation a message asks for. Several handlers
	// that consume one queue in parallel (competing consumers in one
	// router) must share it, and Scope. Defaults to the handler's name
	// (message.HandlerNameFromCtx), or the subscribed topic outside a
	// router; with a business key (a Key other than UUIDKey, such as
	// MetadataKey), the handler's name, a space and the subscribed topic,
	// so that two event types that carry one ID (an order created, then
	// cancelled) never share a key (a topic that a store cannot keep in an
	// operation, not UTF-8, with a control character or too long, is
	// named by its digest, "topic-sha256:<hex>").
	Operation func(msg *message.Message) string

	// SkipFormerKeys turns off the lookup that keeps records stored before
	// the default operation of a business key named the topic: until
	// then, a message with a business key and the default Operation first
	// looks for a record under the handler's name alone, stored for its
	// topic, and is handled under it when there is one (so a message
	// handled before the upgrade and delivered again after it is not run
	// twice). That costs one store read per message. Set it once
	// Retention has passed since the upgrade, or for a new deployment.
	// A consumer still on the former version never looks under the new
	// operation: do not run both versions on one consumer group, or a
	// message handled by an upgraded consumer and delivered again to a
	// former one runs again. Defaults to false.
	SkipFormerKeys bool

	// Key returns the message's idempotency key: 1 to idem.MaxKeyLength
	// bytes of visible ASCII. It returns "" for a message without one.
	// Defaults to UUIDKey, the message's UUID, which Watermill keeps across
	// redeliveries; MetadataKey takes it from a metadata field (a business
	// ID set by the publisher).
	Key func(msg *message.Message) (string, error)

	// KeyOptional lets a message without a key (Key returned "") run
	// unprotected. Defaults to false: such a message is refused with an
	// *Error that IsPoison matches, and the handler does not run. A key
	// that is present but malformed is refused either way.
	KeyOptional bool

	// FingerprintMetadata names the metadata fields that are part of a
	// message's meaning, beside its payload: the same key with another
	// payload or another value of one of these fields is a mismatch, and
	// the message is poison. Metadata not named here (a redelivery flag,
	// trace IDs) never counts. Defaults to none: the payload alone.
	FingerprintMetadata []string

	// FingerprintKey, if set, keys the fingerprint (see
	// idem.FingerprintOptions.Key). Defaults to none.
	FingerprintKey []byte

	// Kind says what a failure or a crash of the handler leaves behind.
	// External (the default) when the handler acts outside the idem store's
	// database (an email, a payment): a plain error sends the key to review.
	// Transactional when its effect commits with CompleteTx: a plain error
	// releases the key, and a crashed consumer's message is taken over once
	// its lease expires. Defaults to idem.External.
	Kind idem.Kind

	// Lease overrides the engine's lease for these messages when positive:
	// how long a consumer that died mid-handler holds the key. Running
	// handlers renew it with heartbeats. Defaults to the engine's
	// (EngineConfig.Lease).
	Lease time.Duration

	// Retention overrides how long a completed message is remembered when
	// positive. It must outlast the broker's longest redelivery (the
	// queue's message TTL, a dead-letter round trip). Defaults to the
	// engine's (EngineConfig.Retention, 24h).
	Retention time.Duration

	// NackDelay is the longest a message is held before it is nacked when
	// its first handling still runs elsewhere; the delay is about as long
	// as that handling has taken so far (idem.Result.RetryAfter, at least
	// a second), at most NackDelay. A message whose store failed is held
	// for NackDelay. Most subscribers (AMQP, watermill-sql's
	// ResendInterval aside) redeliver a nacked message at once, so this
	// keeps the message from looping hot. Defaults to 5s; a negative value
	// nacks at once.
	NackDelay time.Duration

	// OnOutcome, if set, is called once per message with what happened,
	// for metrics and logs. Defaults to nil.
	OnOutcome func(Event)

	// Logger receives the middleware's logs. Defaults to the engine's.
	Logger *slog.Logger
}

// Event is what happened to one message, for Config.OnOutcome.
type Event struct {
	// Operation is the record's operation.
	Operation string
	// Outcome is the name of an idem.Situation: "acquired", "replayed",
	// "in_flight", "mismatch", "needs_review", "not_replayable",
	// "missing_key", "invalid_key", "scope_missing", "sealed",
	// "unavailable", or "no_key"
	// (a message without a key let through by KeyOptional).
	Outcome string
	// Settlement is, after "acquired", the lease's final state: "completed",
	// "released", "escalated" or "abandoned" (the store refused; the key
	// stays pending for recovery), or "open" when the lease was lost.
	Settlement string
	// Duration is the time spent in the middleware and the handler.
	Duration time.Duration
}

// DefaultNackDelay is Config.NackDelay's default.
const DefaultNackDelay = 5 * time.Second

func (c Config) withDefaults(e *idem.Engine) Config {
	if c.Key == nil {
		c.Key = UUIDKey
	}
	if c.NackDelay == 0 {
		c.NackDelay = DefaultNackDelay
	}
	if c.Logger == nil {
		c.Logger = e.Config().Logger
	}
	c.FingerprintMetadata = msgdoor.SortedFields(c.FingerprintMetadata)
	c.FingerprintKey = bytes.Clone(c.FingerprintKey)
	return c
}

func (c Config) validate() error {
	if c.Lease < 0 || c.Retention < 0 {
		return errors.New("idemwatermill: Config.Lease and Config.Retention must not be negative")
	}
	switch {
	case c.Scope == "" && !c.HandlerScope:
		return errors.New("idemwatermill: Config.Scope is required: name the service that consumes (two services on one topic must not share records); HandlerScope keeps the records of a service that left it empty")
	case c.Scope != "" && c.HandlerScope:
		return errors.New("idemwatermill: Config.Scope and Config.HandlerScope are exclusive")
	case c.ScopeFunc != nil && c.HandlerScope:
		return errors.New("idemwatermill: Config.ScopeFunc needs a Scope, not HandlerScope: a handler's name may contain a slash, and two handlers' tenants would share a scope (the records HandlerScope keeps have no tenant)")
	case c.ScopeFunc != nil && strings.Contains(c.Scope, "/"):
		return errors.New("idemwatermill: Config.Scope must not contain a slash with ScopeFunc: the record's scope is Scope, a slash and ScopeFunc's")
	}
	return msgdoor.CheckConfig("idemwatermill", c.Kind, c.Scope, "FingerprintMetadata", c.FingerprintMetadata)
}

// UUIDKey is the default Config.Key: the message's UUID. Watermill's
// marshalers carry it across redeliveries (watermill-amqp in the
// _watermill_message_uuid header, watermill-sql in the uuid column); a
// message published without one (by a producer that is not Watermill) has
// none.
func UUIDKey(msg *message.Message) (string, error) { return msg.UUID, nil }

// MetadataKey returns a Config.Key that takes the key from the metadata
// field name: a business ID (an order number, a payment ID) that the
// publisher sets, so that the same order published twice (a producer's own
// retry, with a new UUID) is still handled once.
func MetadataKey(name string) func(msg *message.Message) (string, error) {
	return func(msg *message.Message) (string, error) { return msg.Metadata.Get(name), nil }
}

// isUUIDKey reports whether f is UUIDKey.
func isUUIDKey(f func(*message.Message) (string, error)) bool {
	return reflect.ValueOf(f).Pointer() == reflect.ValueOf(UUIDKey).Pointer()
}
