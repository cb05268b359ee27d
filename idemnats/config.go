package idemnats

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/msgdoor"
)

// Config configures a Guard. The zero value protects every message by its
// Nats-Msg-Id (or stream sequence), as an External operation, and allows
// handlers that publish nothing.
type Config struct {
	// Scope names whose messages these are: the consumer group. Defaults to
	// the consumer's name (the durable name every instance of a service
	// shares), from the message's metadata.
	Scope string

	// ScopeFunc, if set, says whose each message is, from its headers or
	// subject: a tenant. The record's scope is then Scope (or its
	// default), a slash and what ScopeFunc returns ("billing/tenant-a"),
	// so that one tenant's business key never meets another's. A message
	// for which it returns "" or an error does not run: an error marked
	// idem.Retryable (a lookup that failed) is nakked with a delay, as
	// after a store failure; any other error, and "", terminate it
	// (scope_missing). Scope must then not contain a slash. Defaults to
	// nil: every message in Scope.
	ScopeFunc func(msg jetstream.Msg) (string, error)

	// Operation returns the operation a message asks for. Defaults to the
	// stream's name; with a business key (a Key other than DefaultKey and
	// StreamSequenceKey, such as HeaderKey), the stream's name, a space and
	// the message's subject ("ORDERS orders.created"), so that two event
	// types that carry one ID (an order created, then cancelled) never
	// share a key (a subject that a store cannot keep in an
	// operation, not UTF-8, with a control character or too long, is
	// named by its digest, "topic-sha256:<hex>").
	Operation func(msg jetstream.Msg) string

	// SkipFormerKeys turns off the lookup that keeps records stored before
	// the default operation of a business key named the subject: until
	// then, a message with a business key and the default Operation first
	// looks for a record under the stream's name alone, stored for its
	// subject, and is handled under it when there is one (so a message
	// handled before the upgrade and delivered again after it is not run
	// twice). That costs one store read per message. Set it once
	// Retention has passed since the upgrade, or for a new deployment.
	// A consumer still on the former version never looks under the new
	// operation: do not run both versions on one consumer group, or a
	// message handled by an upgraded consumer and delivered again to a
	// former one runs again. Defaults to false.
	SkipFormerKeys bool

	// Key returns the message's idempotency key: 1 to idem.MaxKeyLength
	// bytes of visible ASCII, or "" when it has none. Defaults to
	// DefaultKey.
	Key func(msg jetstream.Msg) (string, error)

	// FingerprintHeaders names the headers that are part of a message's
	// meaning, beside its data: the same key with other data or another
	// value of one of these headers is a mismatch, and the message is
	// terminated. Defaults to none: the data alone.
	FingerprintHeaders []string

	// FingerprintKey, if set, keys the fingerprint (see
	// idem.FingerprintOptions.Key). Defaults to none.
	FingerprintKey []byte

	// Kind says what a failure or a crash of the handler leaves behind:
	// External, when the handler acts outside the idem store's database (a
	// plain error sends the key to review), or Transactional, when its
	// effect commits with the store's CompleteTx (a plain error releases
	// the key; a crashed consumer's message is taken over once its lease
	// expires). Defaults to idem.External.
	Kind idem.Kind

	// Lease overrides the engine's lease for these messages when positive.
	// Defaults to the engine's (EngineConfig.Lease).
	Lease time.Duration

	// Retention overrides how long a completed message is remembered when
	// positive; it must outlast the stream's redeliveries (MaxDeliver
	// times AckWait and BackOff). Defaults to the engine's
	// (EngineConfig.Retention, 24h).
	Retention time.Duration

	// InProgressInterval is how often a running handler tells JetStream
	// that its message is in progress (InProgress), which restarts the
	// consumer's AckWait. Keep it well under AckWait: a message whose
	// AckWait runs out is delivered again while its handler runs (it is
	// nakked as in flight, never run twice, but every such delivery counts
	// toward the consumer's MaxDeliver). Defaults to a third of the lease,
	// the lease's own heartbeat, and at most DefaultInProgressInterval, a
	// third of JetStream's default AckWait (30s), however long the lease.
	InProgressInterval time.Duration

	// NakDelay is the delay of a NakWithDelay for a message whose store
	// failed, doubled at each later delivery of the message (at most 32
	// times over), so that an outage does not use up the consumer's
	// MaxDeliver. It is also the longest delay for a message delivered for
	// the first time while another message with its key is being handled
	// (the delay is then about as long as that handling has taken so far,
	// at least a second). A message delivered again while its key is in
	// flight (its consumer died, or AckWait ran out) is nakked until the
	// holder's lease would run out instead, however long that is, so that
	// these deliveries do not use up MaxDeliver before a dead holder's
	// lease expires. Defaults to 5s.
	NakDelay time.Duration

	// Publisher publishes the messages a handler produced (a
	// jetstream.JetStream), each with a Nats-Msg-Id header (one is set when
	// a produced message has none), waiting for JetStream's
	// acknowledgement before the consumed message is acked. A
	// jetstream.JetStream also tells the guard its server's version: a
	// Term carries its reason (TermWithReason) only to servers from
	// 2.10.4, since earlier ones ignore such a Term and deliver the message
	// again, forever; other Terms are plain, and their reason is logged.
	// (The consumer's leader may be older than the server the guard is
	// connected to: any delivery after a message's first gets a plain
	// Term, and a message the guard terminated before is terminated again,
	// plainly, without a lookup.)
	// Defaults to nil: a handler that produces messages then fails the
	// message, and Terms are plain.
	Publisher jetstream.Publisher

	// OnOutcome, if set, is called once per message with what happened,
	// for metrics and logs. Defaults to nil.
	OnOutcome func(Event)

	// Logger receives the guard's logs. Defaults to the engine's.
	Logger *slog.Logger
}

// Event is what happened to one message, for Config.OnOutcome.
type Event struct {
	// Operation is the record's operation.
	Operation string
	// Outcome is the name of an idem.Situation: "acquired", "replayed",
	// "in_flight", "mismatch", "needs_review", "not_replayable",
	// "missing_key", "invalid_key", "scope_missing", "sealed" or
	// "unavailable"; or "terminated", for a message the guard terminated
	// before and terminated again without a lookup.
	Outcome string
	// Settlement is, after "acquired", the lease's final state:
	// "completed", "released", "escalated", "abandoned", or "open" when the
	// lease was lost.
	Settlement string
	// Ack is what the message got: "ack", "nak", "nak_delay" or "term".
	Ack string
	// Duration is the time spent in the guard and the handler.
	Duration time.Duration
}

// DefaultNakDelay is Config.NakDelay's default.
const DefaultNakDelay = 5 * time.Second

// DefaultInProgressInterval bounds Config.InProgressInterval's default: a
// third of JetStream's default AckWait.
const DefaultInProgressInterval = 10 * time.Second

func (c Config) withDefaults(e *idem.Engine) Config {
	if c.Key == nil {
		c.Key = DefaultKey
	}
	if c.NakDelay == 0 {
		c.NakDelay = DefaultNakDelay
	}
	if c.Logger == nil {
		c.Logger = e.Config().Logger
	}
	c.FingerprintHeaders = msgdoor.SortedFields(c.FingerprintHeaders)
	c.FingerprintKey = bytes.Clone(c.FingerprintKey)
	return c
}

func (c Config) validate() error {
	if c.Lease < 0 || c.Retention < 0 || c.InProgressInterval < 0 || c.NakDelay < 0 {
		return errors.New("idemnats: Config.Lease, Retention, InProgressInterval and NakDelay must not be negative")
	}
	if c.ScopeFunc != nil && strings.Contains(c.Scope, "/") {
		return errors.New("idemnats: Config.Scope must not contain a slash with ScopeFunc: the record's scope is Scope, a slash and ScopeFunc's")
	}
	return msgdoor.CheckConfig("idemnats", c.Kind, c.Scope, "FingerprintHeaders", c.FingerprintHeaders)
}

// isKey reports whether f is the function key.
func isKey(f, key func(jetstream.Msg) (string, error)) bool {
	return reflect.ValueOf(f).Pointer() == reflect.ValueOf(key).Pointer()
}

// DefaultKey is the default Config.Key: the message's Nats-Msg-Id header,
// which its publisher chose (JetStream drops a second publication with the
// same ID within the stream's duplicate window), or else StreamSequenceKey,
// its place in the stream, which JetStream keeps across redeliveries. The
// stream sequence protects against processing a stored message twice; only
// a Nats-Msg-Id (or a business ID, with Config.Key) also covers a publisher
// that stored the same message twice, outside the duplicate window.
//
// DefaultKey reads the header as JetStream does: an empty one is no ID,
// and of several the first counts. An ID that JetStream accepts but idem
// cannot keep as a key (longer than idem.MaxKeyLength, or with spaces,
// control or non-ASCII bytes) is replaced by its digest,
// "nats-msg-id-sha256:<64 hex digits>": the same for every delivery and
// every republication of the ID, so its dedupe holds; the guard logs it.
// An ID that starts with "nats-msg-id-sha256:" is replaced by its digest
// too, so that no ID can name another's digest and pass for its message.
func DefaultKey(msg jetstream.Msg) (string, error) {
	if id := msgID(msg); id != "" {
		if idem.ValidateKey(id) != nil || strings.HasPrefix(id, digestKeyPrefix) {
			return digestKey(id), nil
		}
		return id, nil
	}
	return StreamSequenceKey(msg)
}

// msgID is msg's Nats-Msg-Id as JetStream reads it: the first value, ""
// for none.
func msgID(msg jetstream.Msg) string {
	if vs := msg.Headers()[jetstream.MsgIDHeader]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// digestKeyPrefix starts the key of a Nats-Msg-Id that is not a key.
const digestKeyPrefix = "nats-msg-id-sha256:"

func digestKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return digestKeyPrefix + hex.EncodeToString(sum[:])
}

// StreamSequenceKey is a Config.Key: the message's place in its stream,
// whatever its headers say. That is its stream, its stream sequence and
// the time JetStream stored it, in nanoseconds ("ORDERS:42:1717171717171717171"):
// a stream deleted and created again numbers its messages from 1 again,
// and the time tells its new messages from the old ones. A stream whose
// name would make the key longer than idem.MaxKeyLength, or is not
// visible ASCII, is named by a digest of its name instead
// ("sha256-<32 hex digits>:42:…").
func StreamSequenceKey(msg jetstream.Msg) (string, error) {
	md, err := msg.Metadata()
	if err != nil {
		return "", err
	}
	place := ":" + strconv.FormatUint(md.Sequence.Stream, 10)
	if !md.Timestamp.IsZero() {
		place += ":" + strconv.FormatInt(md.Timestamp.UnixNano(), 10)
	}
	key := md.Stream + place
	if len(key) > idem.MaxKeyLength || idem.ValidateKey(key) != nil {
		sum := sha256.Sum256([]byte(md.Stream))
		key = "sha256-" + hex.EncodeToString(sum[:16]) + place
	}
	return key, nil
}

// HeaderKey returns a Config.Key that takes the key from the header name
// (a business ID that the publisher sets).
func HeaderKey(name string) func(msg jetstream.Msg) (string, error) {
	return func(msg jetstream.Msg) (string, error) {
		vs := msg.Headers()[name]
		if len(vs) > 1 {
			return "", fmt.Errorf("the message has %d %s headers", len(vs), name)
		}
		if len(vs) == 0 {
			return "", nil
		}
		return vs[0], nil
	}
}
