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
	"github.com/idem-dev/idem/idemstore"
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
	g := &guard{e: e, cfg: cfg}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) { return g.handle(msg, h) }
	}, nil
}

type guard struct {
	e   *idem.Engine
	cfg Config
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
	req, err := g.request(msg)
	ev.Operation = req.Key.Operation
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Situation.Name == idem.SituationMissingKey.Name && g.cfg.KeyOptional {
			ev.Outcome = idem.SituationNoKey.Name
			return h(msg)
		}
		ev.Outcome = situationOf(err)
		return nil, err
	}
	res, err := g.e.Begin(ctx, req)
	if err != nil {
		err = beginError(err)
		ev.Outcome = situationOf(err)
		return nil, err
	}
	ev.Outcome = res.Outcome.String()
	switch res.Outcome {
	case idem.Acquired:
		out, err = g.run(msg, h, res.Lease)
		ev.Settlement = res.Lease.State().String()
		return out, err
	case idem.Replayed:
		out, err = replay(res.Response)
		if err != nil {
			ev.Outcome = situationOf(err)
		}
		return out, err
	case idem.InFlight:
		g.pause(ctx, min(res.RetryAfter, g.cfg.NackDelay))
		e := newError(idem.SituationInFlight, fmt.Sprintf("the message's first handling still runs (retry after %v)", res.RetryAfter), idem.ErrInFlight)
		e.RetryAfter = res.RetryAfter
		return nil, e
	case idem.Mismatch:
		return nil, newError(idem.SituationMismatch, "the message's key was used with another payload", idem.ErrMismatch)
	case idem.NeedsReview:
		reason := "an earlier handling's outcome is unknown"
		if res.Record != nil && res.Record.Reason != "" {
			reason += ": " + res.Record.Reason
		}
		return nil, newError(idem.SituationNeedsReview, reason, idem.ErrNeedsReview)
	}
	return nil, fmt.Errorf("idemwatermill: Begin returned outcome %v", res.Outcome)
}

// request is the idem request of msg, or an *Error for a message whose key
// is missing or malformed.
func (g *guard) request(msg *message.Message) (idem.Request, error) {
	ctx := msg.Context()
	topic := message.SubscribeTopicFromCtx(ctx)
	name := message.HandlerNameFromCtx(ctx)
	if name == "" {
		name = topic
	}
	if name == "" {
		name = "message"
	}
	req := idem.Request{Kind: g.cfg.Kind, Lease: g.cfg.Lease, Retention: g.cfg.Retention}
	req.Key.Scope, req.Key.Operation = g.cfg.Scope, name
	if req.Key.Scope == "" {
		req.Key.Scope = name
	}
	if g.cfg.Operation != nil {
		req.Key.Operation = g.cfg.Operation(msg)
	}
	key, err := g.cfg.Key(msg)
	switch {
	case err != nil:
		return req, newError(idem.SituationInvalidKey, "the message's key cannot be read: "+err.Error(), idem.ErrInvalidKey, err)
	case key == "":
		return req, newError(idem.SituationMissingKey, "the message has no key", idem.ErrMissingKey)
	}
	if err := idem.ValidateKey(key); err != nil {
		var ke *idem.KeyError
		errors.As(err, &ke)
		return req, newError(idem.SituationInvalidKey, ke.Reason, err)
	}
	req.Key.Key = key
	var meta url.Values
	for _, name := range g.cfg.FingerprintMetadata {
		if v, ok := msg.Metadata[name]; ok {
			if meta == nil {
				meta = url.Values{}
			}
			meta.Set(name, v)
		}
	}
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "MESSAGE", Operation: req.Key.Operation, Query: meta.Encode(), Body: msg.Payload},
		idem.FingerprintOptions{Key: g.cfg.FingerprintKey})
	if err != nil {
		return req, err
	}
	req.Fingerprint = fp
	if topic != "" {
		req.Info = &idemstore.Request{Method: "MESSAGE", Path: topic}
	}
	return req, nil
}

// run runs the handler under lease and maps how it ended.
func (g *guard) run(msg *message.Message, h message.HandlerFunc, lease *idem.Lease) ([]*message.Message, error) {
	ctx := msg.Context()
	defer msg.SetContext(ctx)
	var (
		produced []*message.Message
		answer   *idem.Response
	)
	stored, err := lease.Run(ctx, func(ctx context.Context) (*idem.Response, error) {
		msg.SetContext(ctx)
		out, err := h(msg)
		if err != nil {
			return nil, err
		}
		produced = out
		answer, err = Answer(out)
		return answer, err
	})
	switch {
	case err == nil && stored == answer:
		return produced, nil
	case err == nil:
		// The handler completed with CompleteTx: what committed is what
		// every redelivery emits, so emit it now too.
		out, rerr := decodeAnswer(stored)
		if rerr != nil {
			return nil, newError(idem.SituationNotReplayable, rerr.Error(), idem.ErrNotReplayable)
		}
		if !sameUUIDs(out, produced) {
			g.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idemwatermill: the handler returned other messages than it stored with CompleteTx; emitting the stored ones",
				slog.String("operation", lease.Key().Operation), slog.Int("returned", len(produced)), slog.Int("stored", len(out)))
		}
		return out, nil
	case lease.State() == idem.LeaseEscalated:
		return nil, newError(idem.SituationNeedsReview, "the handler failed and its outcome is unknown: "+err.Error(), idem.ErrNeedsReview, err)
	}
	return nil, err
}

// replay returns the stored messages of a completed key.
func replay(resp *idem.Response) ([]*message.Message, error) {
	switch {
	case resp == nil || resp.NotReplayable != "":
		reason := "the message was handled, but its produced messages were not kept"
		if resp != nil {
			reason += " (" + resp.NotReplayable + ")"
		}
		return nil, newError(idem.SituationNotReplayable, reason, idem.ErrNotReplayable)
	case resp.Status < 200 || resp.Status > 299:
		return nil, newError(idem.SituationNotReplayable, fmt.Sprintf("the key was settled with status %d, not by a handler", resp.Status), idem.ErrNotAResult)
	}
	out, err := decodeAnswer(resp)
	if err != nil {
		return nil, newError(idem.SituationNotReplayable, err.Error(), idem.ErrNotReplayable)
	}
	return out, nil
}

// beginError maps an error of Begin: a key or a name the store cannot
// keep, and a record that does not open, are poison; anything else (the
// store is unavailable) is returned as it is, for the router to nack.
func beginError(err error) error {
	switch {
	case errors.Is(err, idem.ErrInvalidKey), errors.Is(err, idem.ErrTooLong):
		return newError(idem.SituationInvalidKey, err.Error(), idem.ErrInvalidKey, err)
	case errors.Is(err, idem.ErrSealed):
		return newError(idem.SituationSealed, "the stored answer cannot be opened", err)
	}
	return err
}

// situationOf names what err says for Event.Outcome.
func situationOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Situation.Name
	}
	return idem.SituationUnavailable.Name
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

func sameUUIDs(a, b []*message.Message) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].UUID != b[i].UUID {
			return false
		}
	}
	return true
}
