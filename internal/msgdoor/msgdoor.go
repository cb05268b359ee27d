// Package msgdoor holds what the broker front doors (idemwatermill,
// idemnats) share: a message's idem request (key, scope, operation,
// fingerprint), and what each outcome of Begin means for a message that
// does not run. Each front door maps a Refusal to its own protocol (a
// Watermill error for the poison queue, a JetStream Nak or Term).
package msgdoor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// Refusal is why a message's handler did not run, or why its failure went
// to review.
type Refusal struct {
	// Situation is from idem's outcome table.
	Situation idem.Situation
	// Reason says why; it never contains the key.
	Reason string
	// RetryAfter is set with idem.SituationInFlight: about as long as the
	// holder has been at work, at least a second.
	RetryAfter time.Duration
	// LeaseLeft is set with idem.SituationInFlight: how long the holder's
	// lease had left when the record was read, on the store's clock. A
	// holder that died holds the key until then.
	LeaseLeft time.Duration
	// Errs are the situation's sentinel and, after a handler failure, the
	// handler's error.
	Errs []error
}

// Poison reports whether no redelivery can help: every situation but
// idem.SituationInFlight and idem.SituationUnavailable.
func (r *Refusal) Poison() bool {
	return r.Situation.Name != idem.SituationInFlight.Name && r.Situation.Name != idem.SituationUnavailable.Name
}

func refuse(s idem.Situation, reason string, errs ...error) *Refusal {
	return &Refusal{Situation: s, Reason: reason, Errs: errs}
}

// Input is what a message's request is made of.
type Input struct {
	Scope, Operation string
	// Key is the message's key, KeyErr the error of reading it.
	Key    string
	KeyErr error
	// Payload and Fields (the metadata or headers the configuration names)
	// are the message's meaning.
	Payload []byte
	Fields  url.Values
	// FingerprintKey keys the fingerprint.
	FingerprintKey []byte
	Kind           idem.Kind
	Lease          time.Duration
	Retention      time.Duration
	// Topic, when set, is kept on the record for operators (as its path).
	Topic string
}

// Request is the idem request of a message, or a Refusal (missing or
// malformed key) when the handler must not run.
func Request(in Input) (idem.Request, *Refusal) {
	req := idem.Request{Key: idem.Key{Scope: in.Scope, Operation: in.Operation, Key: in.Key},
		Kind: in.Kind, Lease: in.Lease, Retention: in.Retention}
	switch {
	case in.KeyErr != nil:
		return req, refuse(idem.SituationInvalidKey, "the message's key cannot be read: "+in.KeyErr.Error(), idem.ErrInvalidKey, in.KeyErr)
	case in.Key == "":
		return req, refuse(idem.SituationMissingKey, "the message has no key", idem.ErrMissingKey)
	}
	if err := idem.ValidateKey(in.Key); err != nil {
		var ke *idem.KeyError
		errors.As(err, &ke)
		return req, refuse(idem.SituationInvalidKey, ke.Reason, err)
	}
	// The source lets a record fingerprinted by an earlier version of
	// idem match its redelivery.
	src := &idem.FingerprintSource{Input: idem.FingerprintInput{Method: "MESSAGE", Operation: in.Operation, Query: in.Fields.Encode(), Body: in.Payload},
		Options: idem.FingerprintOptions{Key: in.FingerprintKey}}
	fp, err := idem.Fingerprint(src.Input, src.Options)
	if err != nil { // only for field pointers, which are not used here
		return req, refuse(idem.SituationInvalidKey, err.Error(), idem.ErrInvalidKey, err)
	}
	req.Fingerprint, req.FingerprintSource = fp, src
	if in.Topic != "" {
		req.Info = &idemstore.Request{Method: "MESSAGE", Path: in.Topic}
	}
	return req, nil
}

// BeginError maps an error of Begin: a key, scope or operation the store
// cannot keep, and a record that does not open, are poison; anything else
// (the store is unavailable) is SituationUnavailable, for a redelivery.
func BeginError(err error) *Refusal {
	switch {
	case errors.Is(err, idem.ErrInvalidKey), errors.Is(err, idem.ErrTooLong):
		return refuse(idem.SituationInvalidKey, err.Error(), idem.ErrInvalidKey, err)
	case errors.Is(err, idem.ErrSealed):
		return refuse(idem.SituationSealed, "the stored answer cannot be opened", err)
	}
	return refuse(idem.SituationUnavailable, "the idempotency store failed: "+err.Error(), err)
}

// Found is the Refusal of a Begin that found the key in flight, in review
// or used with another payload; nil for Acquired and Replayed.
func Found(res idem.Result) *Refusal {
	switch res.Outcome {
	case idem.InFlight:
		r := refuse(idem.SituationInFlight, fmt.Sprintf("the message's first handling still runs (retry after %v)", res.RetryAfter), idem.ErrInFlight)
		r.RetryAfter = res.RetryAfter
		if rec := res.Record; rec != nil {
			r.LeaseLeft = max(rec.LeaseUntil.Sub(rec.ReadAt), 0)
		}
		return r
	case idem.Mismatch:
		return refuse(idem.SituationMismatch, "the message's key was used with another payload", idem.ErrMismatch)
	case idem.NeedsReview:
		reason := "an earlier handling's outcome is unknown"
		if res.Record != nil && res.Record.Reason != "" {
			reason += ": " + res.Record.Reason
		}
		return refuse(idem.SituationNeedsReview, reason, idem.ErrNeedsReview)
	}
	return nil
}

// Replayable returns the Refusal of a stored answer that is not a
// handler's (not kept, or settled by an operator with a failure), or nil.
func Replayable(resp *idem.Response) *Refusal {
	switch {
	case resp == nil || resp.NotReplayable != "":
		reason := "the message was handled, but its produced messages were not kept"
		if resp != nil {
			reason += " (" + resp.NotReplayable + ")"
		}
		return refuse(idem.SituationNotReplayable, reason, idem.ErrNotReplayable)
	case resp.Status < 200 || resp.Status > 299:
		return refuse(idem.SituationNotReplayable, fmt.Sprintf("the key was settled with status %d, not by a handler", resp.Status), idem.ErrNotAResult)
	}
	return nil
}

// Undecodable is the Refusal of a stored answer that does not decode.
func Undecodable(err error) *Refusal {
	return refuse(idem.SituationNotReplayable, err.Error(), idem.ErrNotReplayable)
}

// Escalated is the Refusal of a handler whose failure sent its key to
// review.
func Escalated(err error) *Refusal {
	return refuse(idem.SituationNeedsReview, "the handler failed and its outcome is unknown: "+err.Error(), idem.ErrNeedsReview, err)
}

// Missing reports whether r is a message without a key.
func (r *Refusal) Missing() bool { return r.Situation.Name == idem.SituationMissingKey.Name }

// CheckConfig checks what both front doors' configurations share: a known
// kind, a scope the stores keep (not only white space), and no empty name among the fingerprinted
// fields (the setting fieldsName). pkg starts the errors.
func CheckConfig(pkg string, kind idem.Kind, scope, fieldsName string, fields []string) error {
	switch {
	case kind != idem.External && kind != idem.Transactional:
		return fmt.Errorf("%s: Config.Kind %v is unknown", pkg, kind)
	case scope != "" && strings.TrimSpace(scope) == "":
		// Every message's Begin would refuse it (idem.ErrScopeMissing),
		// and each would be held and nacked as on a store failure.
		return fmt.Errorf("%s: Config.Scope is only white space; name the consumer group, or leave it empty for the default", pkg)
	case len(scope) > idem.MaxScopeLength:
		return fmt.Errorf("%s: Config.Scope is %d bytes long; at most %d are kept", pkg, len(scope), idem.MaxScopeLength)
	case slices.Contains(fields, ""):
		return fmt.Errorf("%s: Config.%s names an empty field", pkg, fieldsName)
	}
	return nil
}

// SortedFields is a sorted copy of the fingerprinted fields' names, so that
// the caller's slice can change without changing the fingerprints.
func SortedFields(fields []string) []string {
	fields = slices.Clone(fields)
	slices.Sort(fields)
	return fields
}

// Former returns the request to begin for a message whose operation idem
// named otherwise before (its business key's operation now names its topic
// or subject too): former when a record stored under former's key is this
// message's (stored for the same topic), so that a redelivery of a message
// handled before the upgrade finds its record; req otherwise. A record of
// another topic under former's key is another event type's, and is left
// alone. The record is read from the store as it is kept, not opened: its
// topic (the path) is kept in clear when it is sealed, and a record of
// another topic whose sealing key is no longer configured must not stop
// this message (a record of this topic that does not open is refused by
// Begin, as before). The error is the store's, for BeginError.
func Former(ctx context.Context, e *idem.Engine, req, former idem.Request, topic string) (idem.Request, error) {
	rec, err := e.Store().Get(ctx, former.Key)
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return req, nil
	case err != nil:
		return req, err
	case rec.Request != nil && rec.Request.Path == topic:
		return former, nil
	}
	return req, nil
}

// ScopeError is the Refusal of a message whose scope function failed or
// gave no scope: a failure marked idem.Retryable is SituationUnavailable,
// for a redelivery; any other, and an empty scope, SituationScopeMissing,
// which no redelivery can help.
func ScopeError(err error) *Refusal {
	if err == nil {
		return refuse(idem.SituationScopeMissing, "the message names no scope (Config.ScopeFunc returned none)", idem.ErrScopeMissing)
	}
	if idem.FailureMark(err) == idem.MarkedRetryable {
		return refuse(idem.SituationUnavailable, "Config.ScopeFunc failed: "+err.Error(), err)
	}
	return refuse(idem.SituationScopeMissing, "Config.ScopeFunc refused the message: "+err.Error(), idem.ErrScopeMissing, err)
}

// JoinScope is the scope of a message: the configured (or default) scope,
// a slash and the message's own (ScopeFunc's), or the Refusal of an own
// scope that is not valid UTF-8 or holds a control character (read from a
// header or metadata a producer controls, which a store may refuse: a
// NUL in PostgreSQL text, and the message would come back forever as a
// store failure).
func JoinScope(base, own string) (string, *Refusal) {
	if !utf8.ValidString(own) || strings.ContainsFunc(own, unicode.IsControl) {
		return "", refuse(idem.SituationScopeMissing, "the message's scope (from Config.ScopeFunc) is not valid UTF-8 or holds a control character", idem.ErrScopeMissing)
	}
	return base + "/" + own, nil
}

// topicDigestPrefix starts the name of a topic that an operation cannot
// hold as it is.
const topicDigestPrefix = "topic-sha256:"

// TopicOperation is the operation of a business key's message: base (the
// handler's or stream's name), a space and its topic or subject. A topic
// that a store cannot keep in an operation (not valid UTF-8, or holding a
// control character: PostgreSQL refuses them in text, and the message
// would come back forever as a store failure) or that would make the
// operation longer than idem.MaxOperationLength (its message refused as
// a key too long) is named by its digest, "topic-sha256:<64 hex
// digits>", as is one that starts with that prefix, so that no topic can
// pass for another's digest.
func TopicOperation(base, topic string) string {
	if utf8.ValidString(topic) && !strings.ContainsFunc(topic, unicode.IsControl) && !strings.HasPrefix(topic, topicDigestPrefix) &&
		len(base)+1+len(topic) <= idem.MaxOperationLength {
		return base + " " + topic
	}
	sum := sha256.Sum256([]byte(topic))
	return base + " " + topicDigestPrefix + hex.EncodeToString(sum[:])
}
