package idemwatermill

import (
	"bytes"
	"errors"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/msgdoor"
)

// Config configures Middleware. The zero value protects every message by
// its UUID, as an External operation named after its handler.
type Config struct {
	// Scope names whose messages these are: the consumer group, such as the
	// service that consumes them. Two services that consume one topic and
	// share an idem store must use different scopes, or the second would
	// get the first one's answer. Defaults to the handler's name (every
	// instance of a service runs its handlers under the same names), or
	// the subscribed topic outside a router.
	Scope string

	// Operation returns the operation a message asks for. Several handlers
	// that consume one queue in parallel (competing consumers in one
	// router) must share it, and Scope. Defaults to the handler's name
	// (message.HandlerNameFromCtx), or the subscribed topic outside a
	// router.
	Operation func(msg *message.Message) string

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
	// "missing_key", "invalid_key", "sealed", "unavailable", or "no_key"
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
