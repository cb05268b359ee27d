package idemadmin

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// MaxBulkKeys bounds the keys of one bulk action.
const MaxBulkKeys = 100

// bulkKeyTimeout bounds the settling of one key of a bulk action, which
// runs detached from the caller's request: a caller that hangs up must
// not cut a write in two.
const bulkKeyTimeout = 10 * time.Second

// BulkKey is one key of a bulk action: its ID, and the attempt the
// operator looked at.
type BulkKey struct {
	// ID is the key's ID, or its short ID (on a store that searches).
	ID      string `json:"id"`
	Attempt string `json:"attempt"`
}

// BulkRequest settles many keys in review at once, each as a
// ResolveRequest would, with one answer for all.
type BulkRequest struct {
	// Action is "release" or "complete".
	Action string `json:"action"`
	// Keys are the keys to settle, each with the attempt that was looked
	// at: a key that holds another attempt by then, or is no longer in
	// review, is skipped and reported, never settled. At most MaxBulkKeys;
	// AnyAttempt is not accepted here.
	Keys []BulkKey `json:"keys"`
	// Answer is what every retry of every key gets, with Action
	// "complete".
	Answer
	// Note says why, for the audit log and the records.
	Note string `json:"note,omitempty"`
}

// The outcomes of one key of a bulk action (BulkItem.Outcome): Settled,
// or why it was skipped. Besides these, a key skipped on an error has
// that error's code (CodeStaleAttempt, CodeNotNeedsReview, CodeNotFound,
// CodeBadRequest, CodeUnavailable, CodeInternal).
const (
	// OutcomeSettled: the key was released or completed.
	OutcomeSettled = "settled"
	// OutcomeDuplicate: the key was named earlier in the same request.
	OutcomeDuplicate = "duplicate"
	// OutcomeNotAttempted: the action stopped before this key (the store
	// became unavailable, or the caller went away).
	OutcomeNotAttempted = "not_attempted"
)

// BulkItem is what became of one key of a bulk action.
type BulkItem struct {
	ID string `json:"id"`
	// Key and Operation name the key, when its ID could be read.
	Key       string `json:"key,omitempty"`
	Operation string `json:"operation,omitempty"`
	Attempt   string `json:"attempt"`
	// Outcome is OutcomeSettled, or why the key was skipped.
	Outcome string `json:"outcome"`
	// State is what became of a settled key: released or completed.
	State string `json:"state,omitempty"`
	// Detail says why a key was skipped.
	Detail string `json:"detail,omitempty"`
}

// BulkResult is what a bulk action did, key by key, in the order asked.
type BulkResult struct {
	Action  string     `json:"action"`
	Results []BulkItem `json:"results"`
	// Settled and Skipped count the results.
	Settled int `json:"settled"`
	Skipped int `json:"skipped"`
}

// Bulk settles the keys of req on behalf of who, one after another, each
// through Resolve: fenced to the attempt given for it, logged and
// reported on its own. A key that cannot be settled is skipped and the
// others go on; after a key the store could not reach, and once ctx ends,
// the rest are not attempted. The error is for a request that is wrong as
// a whole (an action, an answer, a note, a number of keys), when nothing
// was changed.
func (k *Keys) Bulk(ctx context.Context, who string, req BulkRequest) (BulkResult, error) {
	if err := req.check(); err != nil {
		return BulkResult{}, err
	}
	out := BulkResult{Action: req.Action, Results: make([]BulkItem, 0, len(req.Keys))}
	seen := make(map[idemstore.Key]bool, len(req.Keys))
	stop := ""
	for _, bk := range req.Keys {
		item := BulkItem{ID: bk.ID, Attempt: bk.Attempt}
		id, key, err := k.lookup(ctx, bk.ID) // an ID, or a short ID
		if err == nil {
			item.Key, item.Operation = key.Key, key.Operation
			if seen[key] {
				item.Outcome, item.Detail = OutcomeDuplicate, "named earlier in this request"
			}
			seen[key] = true
		}
		switch {
		case item.Outcome != "":
		case stop != "":
			item.Outcome, item.Detail = OutcomeNotAttempted, stop
		case err != nil:
			e := asError(err)
			item.Outcome, item.Detail = e.Code, e.Detail
			if e.Code == CodeUnavailable {
				stop = "not attempted: the store was unavailable for a key before it"
			}
		case bk.Attempt == AnyAttempt:
			item.Outcome, item.Detail = CodeBadRequest, fmt.Sprintf("a bulk action applies to the attempt named for each key; %q is not accepted here", AnyAttempt)
		default:
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bulkKeyTimeout)
			res, err := k.Resolve(kctx, id, who, ResolveRequest{Action: req.Action, Answer: req.Answer, Note: req.Note, Attempt: bk.Attempt})
			cancel()
			if err != nil {
				e := asError(err)
				item.Outcome, item.Detail = e.Code, e.Detail
				if e.Code == CodeUnavailable {
					stop = "not attempted: the store was unavailable for a key before it"
				}
			} else {
				item.Outcome, item.State = OutcomeSettled, res.State
			}
		}
		if stop == "" && ctx.Err() != nil {
			stop = "not attempted: the request was cancelled"
		}
		if item.Outcome == OutcomeSettled {
			out.Settled++
		} else {
			out.Skipped++
		}
		out.Results = append(out.Results, item)
	}
	k.logger().LogAttrs(ctx, slog.LevelInfo, "admin: bulk action", slog.String("by", who), slog.String("action", req.Action),
		slog.Int("keys", len(req.Keys)), slog.Int("settled", out.Settled), slog.Int("skipped", out.Skipped))
	return out, nil
}

// check refuses a bulk request that is wrong as a whole.
func (req BulkRequest) check() error {
	switch n := len(req.Keys); {
	case n == 0:
		return badRequest("keys is empty: name the keys to settle, each with its id and attempt")
	case n > MaxBulkKeys:
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge,
			Detail: fmt.Sprintf("%d keys in one bulk action; at most %d (send the rest in another request)", n, MaxBulkKeys)}
	}
	if req.Action != ActionRelease && req.Action != ActionComplete {
		return badRequest(`action %q must be "release" or "complete"`, req.Action)
	}
	if _, err := (ResolveRequest{Action: req.Action, Answer: req.Answer}).Check(); err != nil {
		return badRequest("%v", err)
	}
	if _, err := cleanNote(req.Note); err != nil {
		return err
	}
	return nil
}
