package idemwatermill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/msgdoor"
)

// Middleware returns Watermill middleware that runs each message's handler
// at most once per key and makes every redelivery emit the first run's
// produced messages. It panics on an invalid configuration; use New to get
// the error instead.
func Middleware(e *idem.Engine, cfg Config) message.HandlerMiddleware {
	mw, err := New(e, cfg)
	if err != nil {
		panic(err)
	}
	return mw
}

// New is Middleware, returning configuration errors.
func New(e *idem.Engine, cfg Config) (message.HandlerMiddleware, error) {
	if e == nil {
		return nil, errors.New("idemwatermill: Middleware needs an engine")
	}
	cfg = cfg.withDefaults(e)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &guard{e: e, cfg: cfg, businessKey: !isUUIDKey(cfg.Key)}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) { return g.handle(msg, h) }
	}, nil
}

type guard struct {
	e   *idem.Engine
	cfg Config
	// businessKey is set when Config.Key is not UUIDKey: the default
	// operation then names the topic.
	businessKey bool
}

// handle runs one message through the protocol.
func (g *guard) handle(msg *message.Message, h message.HandlerFunc) (out []*message.Message, err error) {
	ctx := msg.Context()
	var ev Event
	if g.cfg.OnOutcome != nil {
		start := time.Now()
		defer func() {
			ev.Duration = time.Since(start)
			g.cfg.OnOutcome(ev)
		}()
	}
	req, former, r := g.request(msg)
	if r == nil && former != nil {
		if req, err = msgdoor.Former(ctx, g.e, req, *former, message.SubscribeTopicFromCtx(ctx)); err != nil {
			r = msgdoor.BeginError(err)
		}
	}
	if r != nil && r.Situation.Name == idem.SituationUnavailable.Name {
		g.pause(ctx, g.cfg.NackDelay)
	}
	ev.Operation = req.Key.Operation
	if r != nil && r.Missing() && g.cfg.KeyOptional {
		ev.Outcome = idem.SituationNoKey.Name
		return h(msg)
	}
	if r == nil {
		var res idem.Result
		res, err = g.e.Begin(ctx, req)
		switch {
		case err != nil:
			if r = msgdoor.BeginError(err); r.Situation.Name == idem.SituationUnavailable.Name {
				g.pause(ctx, g.cfg.NackDelay)
			}
		case res.Outcome == idem.Acquired:
			ev.Outcome = res.Outcome.String()
			defer func() { ev.Settlement = res.Lease.State().String() }() // also after a panic
			return g.run(msg, h, res.Lease)
		case res.Outcome == idem.Replayed:
			ev.Outcome = res.Outcome.String()
			if r = msgdoor.Replayable(res.Response); r == nil {
				if out, err = decodeAnswer(res.Response); err == nil {
					return out, nil
				}
				r = msgdoor.Undecodable(err)
			}
		default:
			r = msgdoor.Found(res)
			if r == nil {
				return nil, fmt.Errorf("idemwatermill: Begin returned outcome %v", res.Outcome)
			}
			if r.Situation.Name == idem.SituationInFlight.Name {
				g.pause(ctx, min(r.RetryAfter, g.cfg.NackDelay))
			}
		}
	}
	ev.Outcome = r.Situation.Name
	return nil, refused(r)
}

// request is the idem request of msg, or a Refusal for a message whose key
// or scope is missing or malformed; former is, for a message with a
// business key and the default operation, its request under the operation
// idem named before (the handler's name alone), unless
// Config.SkipFormerKeys.
func (g *guard) request(msg *message.Message) (req idem.Request, former *idem.Request, r *msgdoor.Refusal) {
	ctx := msg.Context()
	topic := message.SubscribeTopicFromCtx(ctx)
	name := message.HandlerNameFromCtx(ctx)
	if name == "" {
		name = topic
	}
	if name == "" {
		name = "message"
	}
	in := msgdoor.Input{Scope: g.cfg.Scope, Operation: name, Payload: msg.Payload, FingerprintKey: g.cfg.FingerprintKey,
		Kind: g.cfg.Kind, Lease: g.cfg.Lease, Retention: g.cfg.Retention, Topic: topic}
	if g.cfg.HandlerScope {
		in.Scope = name
	}
	formerOp := ""
	switch {
	case g.cfg.Operation != nil:
		in.Operation = g.cfg.Operation(msg)
	case g.businessKey && topic != "" && topic != name:
		formerOp = in.Operation
		in.Operation = msgdoor.TopicOperation(in.Operation, topic)
	}
	in.Key, in.KeyErr = g.cfg.Key(msg)
	for _, name := range g.cfg.FingerprintMetadata {
		if v, ok := msg.Metadata[name]; ok {
			if in.Fields == nil {
				in.Fields = url.Values{}
			}
			in.Fields.Set(name, v)
		}
	}
	if g.cfg.ScopeFunc != nil && (in.Key != "" || in.KeyErr != nil) {
		// (A message without a key is refused, or runs unprotected
		// with KeyOptional, whatever its scope: no record is kept.)
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

// run runs the handler under lease and maps how it ended.
func (g *guard) run(msg *message.Message, h message.HandlerFunc, lease *idem.Lease) ([]*message.Message, error) {
	ctx := msg.Context()
	defer msg.SetContext(ctx)
	var (
		returned, produced []*message.Message
		answer             *idem.Response
	)
	stored, err := lease.Run(ctx, func(ctx context.Context) (*idem.Response, error) {
		msg.SetContext(ctx)
		out, err := h(msg)
		if err != nil {
			return nil, err
		}
		returned = out
		if answer, produced, err = encodeAnswer(out); err != nil {
			// The handler did its work, but its answer cannot be kept
			// as it is: a person decides.
			return nil, idem.Ambiguous(err)
		}
		return answer, nil
	})
	switch {
	case err == nil && stored == answer:
		return produced, nil
	case err == nil && stored.NotReplayable != "":
		// The handler completed with CompleteTx, but its messages were too
		// large to keep: what it returned is all there is to emit.
		g.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idemwatermill: the produced messages stored with CompleteTx were not kept ("+stored.NotReplayable+"); emitting the returned ones, which a redelivery will not",
			slog.String("operation", lease.Key().Operation), slog.Int("returned", len(produced)))
		return produced, nil
	case err == nil:
		// The handler completed with CompleteTx: what committed is what
		// every redelivery emits, so emit it now too.
		out, rerr := decodeAnswer(stored)
		if rerr != nil {
			return nil, refused(msgdoor.Undecodable(rerr))
		}
		if !sameUUIDs(out, returned) {
			g.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idemwatermill: the handler returned other messages than it stored with CompleteTx; emitting the stored ones",
				slog.String("operation", lease.Key().Operation), slog.Int("returned", len(produced)), slog.Int("stored", len(out)))
		}
		return out, nil
	case lease.State() == idem.LeaseEscalated:
		return nil, refused(msgdoor.Escalated(err))
	}
	return nil, err
}

// pause holds the message for d, or until its context ends.
func (g *guard) pause(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// sameUUIDs reports whether the handler returned the stored messages: b,
// the returned ones, as many as a, the stored ones, each with a's UUID or
// none (CompleteTx gave the stored copy its UUID).
func sameUUIDs(a, b []*message.Message) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if b[i] != nil && b[i].UUID != "" && a[i].UUID != b[i].UUID {
			return false
		}
	}
	return true
}
