package idemadmin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Keys reads and settles keys for operators over a store: what the admin
// API serves, and what idem's CLI uses when it is given a store directly.
// Every change is logged, with who made it and why, and the reason a
// completed key keeps says the same.
type Keys struct {
	// Store holds the keys. Required.
	Store idemstore.Store
	// Retention is how long an answer stored by a "complete" resolution
	// is kept. Defaults to 24h.
	Retention time.Duration
	// Logger receives the audit log of every change. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// OnChange, if set, is called after every change, with what changed.
	OnChange func(Result)
	// Sealer, if set, opens the sealed answers and requests of the keys
	// shown, and seals the answers operators store: give it the engine's
	// (idem.EngineConfig.Sealer). Without it, sealed parts are left out
	// and Item.Sealed says so, and answers are stored in clear.
	Sealer idemstore.Sealer
}

// ListQuery selects keys to list. The fields after Operation search, on a
// store that can (idemstore.Capabilities.Search); on another, a query that
// uses them is refused (501 not_supported). Filters combine.
type ListQuery struct {
	// State is pending, completed or needs_review; empty lists every
	// state.
	State string
	// Operation filters by operation, exactly ("POST /payments").
	Operation string
	// Key lists the keys whose value is exactly Key (the Idempotency-Key
	// a client sent), in every scope and operation.
	Key string
	// KeyPrefix lists the keys whose value starts with KeyPrefix, byte
	// for byte ('%' and '_' are characters, not wildcards). Empty lists
	// every key, a page at a time as always.
	KeyPrefix string
	// OlderThan lists the keys created at least OlderThan ago, by the
	// store's clock.
	OlderThan time.Duration
	// Reason lists the keys whose reason contains Reason, ignoring the
	// case of ASCII letters (at most MaxReasonQuery bytes).
	Reason string
	// Label lists the keys whose scope label is exactly Label, sealed
	// labels included (found by a keyed digest, never by a prefix).
	Label string
	// Order is "oldest" (created first, first), "newest" or "key" (by
	// scope, operation and key; with Key or KeyPrefix, by key). Defaults
	// to oldest for needs_review, key for the rest.
	Order string
	// Cursor continues a listing: a previous page's NextCursor.
	Cursor string
	// Limit is the page size, 1 to 1000. Defaults to 100.
	Limit int
}

// Page is one page of keys.
type Page struct {
	Items []Item `json:"items"`
	// Order is the order of the listing: oldest, newest or key.
	Order string `json:"order"`
	// NextCursor continues the listing; empty at the end.
	NextCursor string `json:"next_cursor"`
}

// ResolveRequest settles a key that needs review.
type ResolveRequest struct {
	// Action is "release" (the operation did not happen: the next retry
	// runs it) or "complete" (it happened: every retry gets Answer).
	Action string `json:"action"`
	// Answer is what retries get, with Action "complete".
	Answer
	// Note says why, for the audit log and the record.
	Note string `json:"note,omitempty"`
	// Attempt is the Item.Attempt the operator looked at: if the key went
	// to review again since (released, retried, reset once more), the
	// resolution is refused (409 stale_attempt) instead of settling an
	// attempt nobody looked at. Required: AnyAttempt settles whichever
	// attempt is in review; empty is refused (428 attempt_required).
	Attempt string `json:"attempt,omitempty"`
}

// DeleteRequest deletes a completed key.
type DeleteRequest struct {
	// Note says why, for the audit log.
	Note string `json:"note,omitempty"`
	// Attempt is the Item.Attempt of the completed key the operator looked
	// at: if its answer was deleted (or expired) and the operation ran
	// again since, the new answer is left alone and the deletion refused
	// (409 stale_attempt); otherwise the next request would run the
	// operation once more. Required: AnyAttempt deletes whichever answer
	// is stored; empty is refused (428 attempt_required).
	Attempt string `json:"attempt,omitempty"`
}

// The resolve actions.
const (
	ActionRelease  = "release"
	ActionComplete = "complete"
	ActionDelete   = "delete"
)

// Result is what a change did.
type Result struct {
	ID        string `json:"id"`
	Scope     string `json:"scope"`
	Operation string `json:"operation"`
	Key       string `json:"key"`
	// Action is release, complete or delete.
	Action string `json:"action"`
	// Attempt is the attempt that was changed.
	Attempt string `json:"attempt"`
	// State is what became of the key: released, completed or deleted.
	State string `json:"state"`
	// By names who made the change (the admin token's name).
	By   string `json:"by"`
	Note string `json:"note,omitempty"`
	// Reason is what the record says from now on (completed keys), or
	// what was logged (released and deleted keys, which are gone).
	Reason string `json:"reason"`
	// Item is the completed key after the change.
	Item *Item `json:"item,omitempty"`
}

// MaxNoteLength bounds a change's note, in bytes.
const MaxNoteLength = 1000

func (k *Keys) logger() *slog.Logger {
	if k.Logger == nil {
		return slog.Default()
	}
	return k.Logger
}

// List returns a page of keys.
func (k *Keys) List(ctx context.Context, q ListQuery) (Page, error) {
	p, err := k.params(q)
	if err != nil {
		return Page{}, err
	}
	page, err := k.Store.List(ctx, p)
	if err != nil {
		return Page{}, asError(err)
	}
	out := Page{Items: make([]Item, 0, len(page.Records)), NextCursor: page.NextCursor, Order: p.Order.String()}
	for _, rec := range page.Records {
		if isSessionScope(rec.Key) {
			continue // a sign-out, not a key (see SessionScope)
		}
		out.Items = append(out.Items, k.item(rec, false))
	}
	return out, nil
}

// Get returns the key with the given ID, with what was asked (and the
// request body, where the route stored it) and, for a completed key, the
// stored answer.
func (k *Keys) Get(ctx context.Context, id string) (Item, error) {
	_, key, err := k.lookup(ctx, id)
	if err != nil {
		return Item{}, err
	}
	if isSessionScope(key) {
		return Item{}, keyError(key, "", idemstore.ErrNotFound)
	}
	rec, err := k.Store.Get(ctx, key)
	if err != nil {
		return Item{}, keyError(key, "", err)
	}
	return k.item(rec, true), nil
}

// Resolve settles a key in review as req says, on behalf of who: the
// attempt req.Attempt names, and nothing that went to review since. It is
// what a bulk action calls for each key.
func (k *Keys) Resolve(ctx context.Context, id, who string, req ResolveRequest) (Result, error) {
	id, key, err := k.lookup(ctx, id)
	if err != nil {
		return Result{}, err
	}
	note, err := cleanNote(req.Note)
	if err != nil {
		return Result{}, err
	}
	p := idemstore.ResolveParams{Key: key, Retention: k.Retention, Action: idemstore.ResolveRelease}
	resp, err := req.Check()
	if err != nil {
		return Result{}, badRequest("resolving %s: %v", describeKey(key), err)
	}
	if resp != nil {
		p.Action, p.Response = idemstore.ResolveComplete, resp
	}
	if p.Retention <= 0 {
		p.Retention = 24 * time.Hour
	}
	if p.Response, err = k.seal(key, p.Response); err != nil {
		return Result{}, err
	}
	res := Result{ID: id, Scope: key.Scope, Operation: key.Operation, Key: key.Key, Action: req.Action, By: who, Note: note}
	rec, err := k.change(ctx, key, req.Attempt, idemstore.StateNeedsReview, idemstore.ErrNotNeedsReview, func(rec *idemstore.Record) error {
		if p.Action == idemstore.ResolveRelease {
			res.State = "released"
			res.Reason = fmt.Sprintf("released by %s: %s (was: %s)", who, orNoNote(note), cut(rec.Reason, 500))
		} else {
			res.State = "completed"
			res.Reason = fmt.Sprintf("completed with status %d by %s: %s (was: %s)", p.Response.Status, who, orNoNote(note), cut(rec.Reason, 500))
		}
		p.Token, p.Reason = rec.Token, res.Reason
		return k.Store.Resolve(ctx, p)
	})
	if err != nil {
		return Result{}, err
	}
	res.Attempt = attemptOf(rec.Token)
	attrs := []slog.Attr{slog.String("by", who), slog.String("action", req.Action), slog.String("scope", key.Scope),
		slog.String("operation", key.Operation), slog.String("key", key.Key), slog.String("attempt", res.Attempt),
		slog.Bool("any_attempt", req.Attempt == AnyAttempt), slog.String("note", note), slog.String("was", rec.Reason)}
	if p.Response != nil {
		attrs = append(attrs, slog.Int("status", p.Response.Status))
	}
	k.logger().LogAttrs(ctx, slog.LevelInfo, "admin: key resolved", attrs...)
	if p.Action == idemstore.ResolveComplete {
		if rec, err := k.Store.Get(ctx, key); err == nil {
			it := k.item(rec, false)
			res.Item = &it
		}
	}
	k.changed(res)
	return res, nil
}

// Check validates req and returns the answer it stores: nil for a
// release.
func (req ResolveRequest) Check() (*idemstore.Response, error) {
	switch req.Action {
	case ActionRelease:
		if req.Status != 0 || req.Headers != nil || req.Body != nil || req.BodyBase64 != nil {
			return nil, errors.New("action release takes no answer (status, headers, body); to store an answer use action complete")
		}
		return nil, nil
	case ActionComplete:
		return req.Answer.Response(false)
	case "":
		return nil, errors.New(`action is required: "release" or "complete"`)
	}
	return nil, fmt.Errorf(`action %q must be "release" or "complete"`, req.Action)
}

// Delete removes a completed key before its retention ends, so that the
// next request with it runs the operation again: the answer of the attempt
// req.Attempt names, never one stored since. It is what a bulk action
// calls for each key.
func (k *Keys) Delete(ctx context.Context, id, who string, req DeleteRequest) (Result, error) {
	id, key, err := k.lookup(ctx, id)
	if err != nil {
		return Result{}, err
	}
	note, err := cleanNote(req.Note)
	if err != nil {
		return Result{}, err
	}
	rec, err := k.change(ctx, key, req.Attempt, idemstore.StateCompleted, idemstore.ErrNotCompleted, func(rec *idemstore.Record) error {
		return k.Store.Delete(ctx, idemstore.DeleteParams{Key: key, Token: rec.Token})
	})
	if err != nil {
		return Result{}, err
	}
	res := Result{ID: id, Scope: key.Scope, Operation: key.Operation, Key: key.Key, Action: ActionDelete, Attempt: attemptOf(rec.Token),
		State: "deleted", By: who, Note: note, Reason: fmt.Sprintf("deleted by %s: %s", who, orNoNote(note))}
	k.logger().LogAttrs(ctx, slog.LevelInfo, "admin: key deleted", slog.String("by", who), slog.String("scope", key.Scope),
		slog.String("operation", key.Operation), slog.String("key", key.Key), slog.String("attempt", res.Attempt),
		slog.Bool("any_attempt", req.Attempt == AnyAttempt), slog.String("note", note))
	k.changed(res)
	return res, nil
}

func (k *Keys) changed(r Result) {
	if k.OnChange != nil {
		k.OnChange(r)
	}
}

// cleanNote turns line breaks and other control characters into spaces
// and bounds the length.
func cleanNote(s string) (string, error) {
	if len(s) > MaxNoteLength {
		return "", badRequest("the note has %d bytes; at most %d", len(s), MaxNoteLength)
	}
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(s), nil
}

func orNoNote(note string) string {
	if note == "" {
		return "no note"
	}
	return note
}

// cut returns s cut at max bytes, on a UTF-8 boundary.
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && s[i]&0xc0 == 0x80 {
		i--
	}
	return s[:i] + "…"
}

func badRequest(format string, args ...any) error {
	return &Error{Status: http.StatusBadRequest, Code: CodeBadRequest, Detail: fmt.Sprintf(format, args...)}
}
