package idemnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/msgdoor"
)

// HandlerFunc handles one message, at most once per key. It returns the
// messages to publish (nil for none), or an error: idem.Retryable when
// nothing happened and a redelivery may run it again, idem.Ambiguous when
// the outcome is unknown. ctx carries the message's lease (idem.LeaseFrom),
// for a store's CompleteTx (see CompleteTx), and ends when the consumer's
// context does. It must not acknowledge msg: the guard does, by what
// happened.
type HandlerFunc func(ctx context.Context, msg jetstream.Msg) ([]*nats.Msg, error)

// Guard runs JetStream messages' handlers once per key. It is safe for
// concurrent use: several goroutines may handle messages of one consumer
// through it (a Messages() or Fetch loop with workers).
type Guard struct {
	e   *idem.Engine
	cfg Config
	// serverVersion is the version of the server the Publisher is
	// connected to, "" when unknown.
	serverVersion func() string
	// defaultKey is set when Config.Key is DefaultKey, whose digests of
	// IDs that are not keys the guard logs; digestLogged once the first is
	// logged as a warning (the later ones at debug level).
	defaultKey   bool
	digestLogged atomic.Bool
	// businessKey is set when Config.Key is neither DefaultKey nor
	// StreamSequenceKey: the default operation then names the subject.
	businessKey bool
	// terminated remembers the messages the guard terminated.
	terminated terminated
}

// New returns a Guard over e. It fails on a nil engine or an invalid
// configuration.
func New(e *idem.Engine, cfg Config) (*Guard, error) {
	if e == nil {
		return nil, errors.New("idemnats: New needs an engine")
	}
	cfg = cfg.withDefaults(e)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &Guard{e: e, cfg: cfg, serverVersion: func() string { return "" }, defaultKey: isKey(cfg.Key, DefaultKey),
		businessKey: !isKey(cfg.Key, DefaultKey) && !isKey(cfg.Key, StreamSequenceKey)}
	if c, ok := cfg.Publisher.(interface{ Conn() *nats.Conn }); ok {
		g.serverVersion = func() string { return c.Conn().ConnectedServerVersion() }
	}
	return g, nil
}

// MessageHandler returns a jetstream.MessageHandler, for cons.Consume, that
// handles each message with h through Handle. ctx is the consumer's: when
// it ends, running handlers see their context end, and the messages not
// yet begun are nakked.
func (g *Guard) MessageHandler(ctx context.Context, h HandlerFunc) jetstream.MessageHandler {
	return func(msg jetstream.Msg) { _ = g.Handle(ctx, msg, h) }
}

// Handle runs h for msg at most once per key and acknowledges msg by what
// happened (Ack, Nak, NakWithDelay or Term; see the package
// doc). It returns nil when msg was acked after its handler ran or its
// stored answer was published again, and otherwise why not: an *Error for
// what idem found, or the handler's error after a release. The guard logs
// what it returns, so a MessageHandler needs nothing more.
func (g *Guard) Handle(ctx context.Context, msg jetstream.Msg, h HandlerFunc) (err error) {
	ev := Event{}
	start := time.Now()
	defer func() {
		if err != nil {
			g.logUnhandled(ctx, msg, &ev, err)
		}
		if g.cfg.OnOutcome != nil {
			ev.Duration = time.Since(start)
			g.cfg.OnOutcome(ev)
		}
	}()
	req, former, r := g.request(msg)
	if r == nil && former != nil {
		if req, err = msgdoor.Former(ctx, g.e, req, *former, msg.Subject()); err != nil {
			r = msgdoor.BeginError(err)
		}
	}
	ev.Operation = req.Key.Operation
	if g.terminated.has(place(msg)) {
		// Terminated before, and delivered again: the Term was lost or
		// ignored (a consumer leader older than 2.10.4 ignores one with a
		// reason). A plain Term, which every server honours, ends it.
		ev.Outcome, ev.Ack = "terminated", "term"
		g.ackErr(msg, msg.Term(), "term")
		return &Error{Situation: idem.SituationNotReplayable, Reason: "the message was terminated before and delivered again; terminated again, without a reason",
			errs: []error{ErrTerminatedBefore}, poisoned: true}
	}
	if r == nil {
		var res idem.Result
		res, err = g.e.Begin(ctx, req)
		switch {
		case err != nil:
			r = msgdoor.BeginError(err)
		case res.Outcome == idem.Acquired:
			ev.Outcome = res.Outcome.String()
			defer func() { ev.Settlement = res.Lease.State().String() }() // also after a panic
			return g.run(ctx, msg, h, res.Lease, &ev)
		case res.Outcome == idem.Replayed:
			ev.Outcome = res.Outcome.String()
			if r = msgdoor.Replayable(res.Response); r == nil {
				var out []*nats.Msg
				if out, err = decodeAnswer(res.Response.Body); err == nil {
					return g.publishAndAck(ctx, msg, out, &ev, false)
				}
				r = msgdoor.Undecodable(err)
			}
		default:
			if r = msgdoor.Found(res); r == nil {
				return fmt.Errorf("idemnats: Begin returned outcome %v", res.Outcome)
			}
		}
	}
	ev.Outcome = r.Situation.Name
	return g.refuse(msg, r, &ev)
}

// request is the idem request of msg, or a Refusal for a message whose key
// or scope is missing or malformed; former is, for a message with a
// business key and the default operation, its request under the operation
// idem named before (the stream alone), unless Config.SkipFormerKeys.
func (g *Guard) request(msg jetstream.Msg) (req idem.Request, former *idem.Request, r *msgdoor.Refusal) {
	in := msgdoor.Input{Scope: g.cfg.Scope, Payload: msg.Data(), FingerprintKey: g.cfg.FingerprintKey,
		Kind: g.cfg.Kind, Lease: g.cfg.Lease, Retention: g.cfg.Retention, Topic: msg.Subject()}
	if md, err := msg.Metadata(); err == nil {
		in.Operation = md.Stream
		if in.Scope == "" {
			in.Scope = md.Consumer
		}
	}
	formerOp := ""
	switch {
	case g.cfg.Operation != nil:
		in.Operation = g.cfg.Operation(msg)
	case g.businessKey && in.Operation != "":
		formerOp = in.Operation
		in.Operation = msgdoor.TopicOperation(in.Operation, msg.Subject())
	}
	in.Key, in.KeyErr = g.cfg.Key(msg)
	if id := msgID(msg); g.defaultKey && id != "" && in.Key != id {
		g.logDigestKey(msg)
	}
	h := msg.Headers()
	for _, name := range g.cfg.FingerprintHeaders {
		if vs, ok := h[name]; ok {
			if in.Fields == nil {
				in.Fields = url.Values{}
			}
			in.Fields[name] = vs
		}
	}
	if in.Scope == "" || in.Operation == "" {
		// A message without JetStream metadata (not from a consumer).
		return idem.Request{}, nil, &msgdoor.Refusal{Situation: idem.SituationInvalidKey,
			Reason: "the message has no JetStream metadata to name its stream and consumer; set Config.Scope and Config.Operation", Errs: []error{idem.ErrInvalidKey}}
	}
	if g.cfg.ScopeFunc != nil {
		own, err := g.cfg.ScopeFunc(msg)
		if err != nil || own == "" {
			return idem.Request{Key: idem.Key{Operation: in.Operation}}, nil, msgdoor.ScopeError(err)
		}
		if in.Scope, r = msgdoor.JoinScope(in.Scope, own); r != nil {
			return idem.Request{Key: idem.Key{Operation: in.Operation}}, nil, r
		}
	}
	req, r = msgdoor.Request(in)
	if r == nil && formerOp != "" && !g.cfg.SkipFormerKeys && g.cfg.ScopeFunc == nil {
		in.Operation = formerOp
		f, _ := msgdoor.Request(in)
		former = &f
	}
	return req, former, r
}

// logDigestKey logs that msg's Nats-Msg-Id is not a key, and that its
// digest keys it: as a warning the first time, then at debug level, since
// a producer whose IDs all have spaces would otherwise fill the log.
func (g *Guard) logDigestKey(msg jetstream.Msg) {
	level := slog.LevelDebug
	if g.digestLogged.CompareAndSwap(false, true) {
		level = slog.LevelWarn
	}
	g.cfg.Logger.LogAttrs(context.Background(), level, "idemnats: a Nats-Msg-Id is not a valid idem key (over 255 bytes, not visible ASCII, or starting with "+digestKeyPrefix+"); the message is keyed by the ID's digest",
		slog.String("subject", msg.Subject()), slog.Int("id_bytes", len(msgID(msg))))
}

// run runs h under lease, telling JetStream the message is in progress at
// each heartbeat, and acknowledges it by how the lease ended.
func (g *Guard) run(ctx context.Context, msg jetstream.Msg, h HandlerFunc, lease *idem.Lease, ev *Event) error {
	var (
		produced []*nats.Msg
		answer   *idem.Response
	)
	stop := g.inProgress(msg, lease)
	stored, err := lease.Run(ctx, func(ctx context.Context) (*idem.Response, error) {
		defer stop()
		out, err := h(ctx, msg)
		if err != nil {
			return nil, err
		}
		if answer, produced, err = encodeAnswer(out); err != nil {
			// The handler did its work, but its answer cannot be kept
			// as it is: a person decides.
			return nil, idem.Ambiguous(err)
		}
		return answer, nil
	})
	switch {
	case err == nil && stored != answer && stored.NotReplayable != "":
		// The handler completed with CompleteTx, but its messages were too
		// large to keep: what it returned is all there is to publish.
		g.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idemnats: the produced messages stored with CompleteTx were not kept ("+stored.NotReplayable+"); publishing the returned ones, which a redelivery will not",
			slog.String("operation", ev.Operation), slog.Int("returned", len(produced)))
		return g.publishAndAck(ctx, msg, produced, ev, true)
	case err == nil && stored != answer:
		// The handler completed with CompleteTx: publish what committed,
		// which every redelivery publishes too.
		if produced, err = decodeAnswer(stored.Body); err != nil {
			return g.refuse(msg, msgdoor.Undecodable(err), ev)
		}
		fallthrough
	case err == nil:
		return g.publishAndAck(ctx, msg, produced, ev, true)
	}
	switch lease.State() {
	case idem.LeaseEscalated:
		return g.refuse(msg, msgdoor.Escalated(err), ev)
	case idem.LeaseReleased:
		// Nothing happened: the first failure comes back at once, later
		// ones back off, so that a handler that keeps failing does not
		// loop hot, nor use up MaxDeliver in a moment.
		if md, merr := msg.Metadata(); merr != nil || md.NumDelivered <= 1 {
			ev.Ack = "nak"
			g.ackErr(msg, msg.Nak(), "nak")
			return err
		}
	}
	// Released after an earlier failure, abandoned (the store failed; the
	// key is pending until its lease expires) or lost (settled by someone
	// else): a redelivery finds out which.
	ev.Ack = "nak_delay"
	g.ackErr(msg, msg.NakWithDelay(g.backoff(msg)), "nak")
	return err
}

// inProgress tells JetStream that msg is in progress every
// InProgressInterval (by default at each of the lease's heartbeats, at
// most every DefaultInProgressInterval) until stop is called.
func (g *Guard) inProgress(msg jetstream.Msg, lease *idem.Lease) (stop func()) {
	every := g.cfg.InProgressInterval
	if every == 0 {
		every = min(lease.Duration()/3, DefaultInProgressInterval)
	}
	if every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				g.ackErr(msg, msg.InProgress(), "in progress")
			case <-done:
				return
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// publishAndAck publishes the produced messages, waiting for JetStream to
// store each, and then acks msg. A publication that fails naks msg: its
// redelivery publishes the stored messages again. first says whether this
// is the answer's first publication: a redelivery's publication of a
// stored answer is dropped by JetStream as a duplicate when it was
// published before (its dedupe at work), but the first publication of a
// produced message must be stored; one that JetStream drops as a
// duplicate (its Nats-Msg-Id was used by another publication within the
// stream's duplicate window) is lost, and msg is terminated with the
// reason once every other produced message is published.
func (g *Guard) publishAndAck(ctx context.Context, msg jetstream.Msg, out []*nats.Msg, ev *Event, first bool) error {
	if len(out) > 0 {
		if g.cfg.Publisher == nil {
			err := errors.New("idemnats: the handler produced messages, but Config.Publisher is not set")
			ev.Ack = "nak_delay"
			g.ackErr(msg, msg.NakWithDelay(g.backoff(msg)), "nak")
			return err
		}
		var dropped []string
		for i, m := range out {
			ack, err := g.cfg.Publisher.PublishMsg(ctx, m)
			if err != nil {
				if dropped != nil { // a redelivery replays, and will not see them
					g.logDropped(ctx, msg, ev, dropped)
				}
				err = fmt.Errorf("idemnats: publishing a produced message (the message will be delivered again, and publish the stored ones): %w", err)
				ev.Ack = "nak_delay"
				g.ackErr(msg, msg.NakWithDelay(g.backoff(msg)), "nak")
				return err
			}
			if first && ack != nil && ack.Duplicate {
				dropped = append(dropped, fmt.Sprintf("%d (subject %s, stream %s)", i+1, m.Subject, ack.Stream))
			}
		}
		if dropped != nil {
			g.logDropped(ctx, msg, ev, dropped)
			return g.refuse(msg, &msgdoor.Refusal{Situation: idem.SituationNotReplayable,
				Reason: "JetStream dropped produced message " + strings.Join(dropped, ", ") + " as a duplicate of an earlier publication with its Nats-Msg-Id; the handler ran, and its answer is incomplete",
				Errs:   []error{ErrDuplicateID}}, ev)
		}
	}
	ev.Ack = "ack"
	if err := msg.Ack(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		return fmt.Errorf("idemnats: acking the message (JetStream delivers it again after AckWait): %w", err)
	}
	return nil
}

// logDropped logs the produced messages JetStream dropped as duplicates
// at their first publication.
func (g *Guard) logDropped(ctx context.Context, msg jetstream.Msg, ev *Event, dropped []string) {
	g.cfg.Logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelError, "idemnats: JetStream dropped produced messages as duplicates at their first publication (another publication used their Nats-Msg-Id); they are lost",
		slog.String("operation", ev.Operation), slog.String("subject", msg.Subject()), slog.Any("dropped", dropped))
}

// logUnhandled logs why msg was not acked after its handler ran or its
// answer was published: a key in flight at debug level (it is routine),
// anything else as a warning, a Term with its reason.
func (g *Guard) logUnhandled(ctx context.Context, msg jetstream.Msg, ev *Event, err error) {
	level := slog.LevelWarn
	if ev.Outcome == idem.SituationInFlight.Name {
		level = slog.LevelDebug
	}
	text := "idemnats: message not handled"
	if ev.Ack == "term" {
		text = "idemnats: message terminated"
	}
	g.cfg.Logger.LogAttrs(context.WithoutCancel(ctx), level, text, slog.String("operation", ev.Operation), slog.String("subject", msg.Subject()),
		slog.String("outcome", ev.Outcome), slog.String("ack", ev.Ack), slog.Any("error", err))
}

// refuse acknowledges a message whose handler did not run, or whose
// failure went to review: NakWithDelay when a later delivery can get past
// it, Term (with its reason where the server honours one) when none
// can.
func (g *Guard) refuse(msg jetstream.Msg, r *msgdoor.Refusal, ev *Event) error {
	e := refused(r)
	if e.Terminated() {
		ev.Ack = "term"
		g.terminated.add(place(msg))
		reason := termReason(e.Error())
		if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
			// An earlier delivery may have been terminated with a reason
			// that the consumer leader ignored (see terminated): a plain
			// Term, which every server honours.
			g.ackErr(msg, msg.Term(), "term")
		} else if g.termReasons() {
			g.ackErr(msg, msg.TermWithReason(reason), "term")
		} else {
			g.ackErr(msg, msg.Term(), "term")
		}
		return e
	}
	ev.Ack = "nak_delay"
	g.ackErr(msg, msg.NakWithDelay(g.nakDelay(msg, r)), "nak")
	return e
}

// nakDelay is how long a refused message that a later delivery can get
// past waits. A store failure waits NakDelay on the message's first
// delivery and twice as long on each later one, at most
// maxStoreBackoff × NakDelay: every delivery counts toward the consumer's
// MaxDeliver, and an outage must not use them up in a few NakDelays. A
// key in flight waits about
// as long as its holder has been at work (at most NakDelay) on the
// message's first delivery, when the holder handles another message with
// the same key; on a later delivery the holder may be this very message's
// consumer, dead or too slow to call InProgress, and the message waits
// until the holder's lease would run out (and a second more): every
// delivery counts toward the consumer's MaxDeliver, and JetStream stops
// delivering a message that used them up, which must not happen before a
// dead holder's key can be taken over.
func (g *Guard) nakDelay(msg jetstream.Msg, r *msgdoor.Refusal) time.Duration {
	if r.Situation.Name != idem.SituationInFlight.Name {
		return g.backoff(msg)
	}
	if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
		return r.LeaseLeft + time.Second
	}
	delay := g.cfg.NakDelay
	if r.RetryAfter > 0 {
		delay = min(r.RetryAfter, delay)
	}
	return delay
}

// backoff is how long a message waits after a failure of the store or of
// JetStream: NakDelay on its first delivery, twice as long on each later
// one, at most maxStoreBackoff × NakDelay.
func (g *Guard) backoff(msg jetstream.Msg) time.Duration {
	delay, most := g.cfg.NakDelay, maxStoreBackoff*g.cfg.NakDelay
	if md, err := msg.Metadata(); err == nil {
		for i := uint64(1); i < md.NumDelivered && delay < most; i++ {
			delay *= 2
		}
	}
	return min(delay, most)
}

// termReasons reports whether a Term may carry its reason: whether the
// server is known to be 2.10.4 or later. Earlier servers ignore a Term
// with a reason (TermWithReason) and deliver the message again after
// AckWait, forever; they get a plain Term, and the reason is only logged.
func (g *Guard) termReasons() bool {
	return versionAtLeast(g.serverVersion(), 2, 10, 4)
}

// versionAtLeast reports whether v, a server version such as "2.10.4" or
// "2.11.0-RC.1", is at least major.minor.patch; an unknown one is not.
func versionAtLeast(v string, major, minor, patch int) bool {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) != 3 {
		return false
	}
	var got [3]int
	for i, p := range parts {
		end := strings.IndexFunc(p, func(r rune) bool { return r < '0' || r > '9' })
		if end == 0 || i < 2 && end > 0 {
			return false
		}
		if end > 0 {
			p = p[:end]
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return false
		}
		got[i] = n
	}
	want := [3]int{major, minor, patch}
	for i := range got {
		if got[i] != want[i] {
			return got[i] > want[i]
		}
	}
	return true
}

// maxStoreBackoff bounds the delay of a message whose store failed, in
// NakDelays.
const maxStoreBackoff = 32

// maxTermReason bounds a Term's reason: it travels in the server's
// advisory, and a handler's error can be long.
const maxTermReason = 256

// termReason is reason on one line, at most maxTermReason bytes.
func termReason(reason string) string {
	reason = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, reason)
	if len(reason) > maxTermReason {
		reason = strings.ToValidUTF8(reason[:maxTermReason], "")
	}
	return reason
}

func (g *Guard) ackErr(msg jetstream.Msg, err error, what string) {
	if err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		g.cfg.Logger.LogAttrs(context.Background(), slog.LevelWarn, "idemnats: "+what+" failed; JetStream delivers the message again after AckWait",
			slog.String("subject", msg.Subject()), slog.Any("error", err))
	}
}

// ErrNoLease is returned by CompleteTx when the context carries no lease:
// the message is not being handled through a Guard.
var ErrNoLease = errors.New("idemnats: the context carries no lease; is the handler run through a Guard?")

// CompleteTx stores produced as the answer of the message being handled,
// inside tx, the handler's own transaction in the idem store's database
// (ctx is the handler's), so that its change and idem's record commit
// together or not at all. store is the engine's store (*idempg.Store with
// pgx.Tx, *idemsqlite.Store or *idemmysql.Store with *sql.Tx). The handler
// then returns the same messages; the guard publishes the stored ones.
func CompleteTx[Tx any](ctx context.Context, store idem.TxCompleter[Tx], tx Tx, produced ...*nats.Msg) error {
	lease := idem.LeaseFrom(ctx)
	if lease == nil {
		return ErrNoLease
	}
	resp, err := Answer(produced)
	if err != nil {
		return err
	}
	return store.CompleteTx(ctx, tx, lease, resp)
}
