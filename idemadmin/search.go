package idemadmin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// MaxReasonQuery bounds ListQuery.Reason, in bytes.
const MaxReasonQuery = 200

// shortDigits is the number of hex digits of a short ID's digest.
const shortDigits = 6

// ShortID returns the short ID of k: its key, '~', and the first six hex
// digits of the SHA-256 of its ID (KeyID). The key finds the records that
// carry it, through the store's index of keys, and the digits tell them
// apart; two records whose key and digits agree (about one pair in 16
// million among records of one key) make the short ID ambiguous, and an
// ID is then needed. Unlike an ID, it holds no scope, so it is short
// wherever the key is.
func ShortID(k idemstore.Key) string {
	sum := sha256.Sum256([]byte(KeyID(k)))
	return k.Key + "~" + hex.EncodeToString(sum[:])[:shortDigits]
}

// parseShortID returns the key of a short ID, and false for anything
// else (an ID never holds '~').
func parseShortID(id string) (string, bool) {
	i := len(id) - shortDigits - 1
	if i < 1 || id[i] != '~' {
		return "", false
	}
	for _, c := range []byte(id[i+1:]) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return id[:i], true
}

// IsShortID reports whether id has the form of a short ID (ShortID).
func IsShortID(id string) bool {
	_, ok := parseShortID(id)
	return ok
}

// maxShortIDMatches bounds the records a short ID's key is looked up
// among.
const maxShortIDMatches = 5000

// lookup returns the ID and the key that id names: an ID (KeyID), or a
// short ID, which it finds by its key.
func (k *Keys) lookup(ctx context.Context, id string) (string, idemstore.Key, error) {
	value, short := parseShortID(id)
	if !short {
		key, err := ParseKeyID(id)
		return id, key, err
	}
	if !k.Store.Capabilities().Search {
		return "", idemstore.Key{}, errUnsupported("short IDs: it cannot find keys by their value; use the key's id")
	}
	var matches []idemstore.Key
	p := idemstore.ListParams{Key: value, Limit: 1000}
	for seen := 0; ; {
		page, err := k.Store.List(ctx, p)
		if err != nil {
			return "", idemstore.Key{}, asError(err)
		}
		for _, rec := range page.Records {
			if ShortID(rec.Key) == id && !isSessionScope(rec.Key) {
				matches = append(matches, rec.Key)
			}
		}
		seen += len(page.Records)
		if p.Cursor = page.NextCursor; p.Cursor == "" {
			break
		}
		if seen >= maxShortIDMatches {
			// A key value many clients use ("1"): looking further costs
			// more than the short id saves.
			return "", idemstore.Key{}, badRequest("more than %d keys have the value %s, in as many scopes or operations; give the id of the one you mean", maxShortIDMatches, quote(value, 300))
		}
	}
	switch len(matches) {
	case 0:
		return "", idemstore.Key{}, &Error{Status: http.StatusNotFound, Code: CodeNotFound,
			Detail: "no key has the short id " + quote(id, 300) + " (it may have been released, deleted or purged)", Err: idemstore.ErrNotFound}
	case 1:
		return KeyID(matches[0]), matches[0], nil
	}
	var b strings.Builder
	for i, m := range matches {
		if i == 5 {
			fmt.Fprintf(&b, "; and %d more", len(matches)-i)
			break
		}
		fmt.Fprintf(&b, "; %s: id %s", describeKey(m), KeyID(m))
	}
	return "", idemstore.Key{}, &Error{Status: http.StatusConflict, Code: CodeAmbiguousID,
		Detail: fmt.Sprintf("the short id %s names %d keys; give the id of the one you mean%s", quote(id, 300), len(matches), b.String())}
}

// errUnsupported answers what the store cannot do.
func errUnsupported(what string) error {
	return &Error{Status: http.StatusNotImplemented, Code: CodeNotSupported, Detail: "not supported by this store: " + what, Err: idemstore.ErrSearchUnsupported}
}

// params checks q and turns it into the store's ListParams.
func (k *Keys) params(q ListQuery) (idemstore.ListParams, error) {
	p := idemstore.ListParams{State: idemstore.State(q.State), Operation: q.Operation, Key: q.Key, KeyPrefix: q.KeyPrefix,
		OlderThan: q.OlderThan, Reason: q.Reason, Cursor: q.Cursor, Limit: q.Limit}
	switch {
	case q.State != "" && !p.State.Valid():
		return p, badRequest("state %q must be needs_review, pending or completed", q.State)
	case q.Limit == 0:
		p.Limit = 100
	case q.Limit < 1 || q.Limit > 1000:
		return p, badRequest("limit %d must be between 1 and 1000", q.Limit)
	}
	switch {
	case len(q.Key) > idemstore.MaxKeyLength:
		return p, badRequest("key has %d bytes; a key has at most %d", len(q.Key), idemstore.MaxKeyLength)
	case len(q.KeyPrefix) > idemstore.MaxKeyLength:
		return p, badRequest("key_prefix has %d bytes; a key has at most %d", len(q.KeyPrefix), idemstore.MaxKeyLength)
	case len(q.Reason) > MaxReasonQuery:
		return p, badRequest("reason has %d bytes; search for at most %d", len(q.Reason), MaxReasonQuery)
	case len(q.Label) > 4*idemstore.MaxScopeLabelLength:
		return p, badRequest("label has %d bytes; a label has at most %d", len(q.Label), idemstore.MaxScopeLabelLength)
	case q.OlderThan < 0:
		return p, badRequest("older_than %v is negative", q.OlderThan)
	}
	search := k.Store.Capabilities().Search
	switch {
	case q.Order != "":
		o, err := idemstore.ParseOrder(q.Order)
		if err != nil {
			return p, badRequest("%v", err)
		}
		p.Order = o
	case p.State == idemstore.StateNeedsReview && search:
		// The review queue: the key waiting longest first.
		p.Order = idemstore.OrderOldest
	}
	if q.Label != "" {
		label := idemstore.CleanScopeLabel(q.Label)
		if label == "" {
			return p, badRequest("label %s is empty once cleaned of white space and control characters", quote(q.Label, 100))
		}
		p.ScopeLabels = []string{label}
		if ls, ok := k.Sealer.(idemstore.LabelSealer); ok {
			p.ScopeLabels = append(p.ScopeLabels, ls.ScopeLabelIndexes(label)...)
		}
		p.ScopeLabels = p.ScopeLabels[:min(len(p.ScopeLabels), idemstore.MaxScopeLabels)]
	}
	if p.Searches() && !search {
		return p, errUnsupported("searching keys by key, key prefix, label, age or reason, or listing them by age; list them by state and operation")
	}
	return p, nil
}

// listParams are the query parameters of GET /api/v1/keys.
var listParams = []string{"state", "operation", "key", "key_prefix", "older_than", "reason", "label", "order", "cursor", "limit"}

// ParseListQuery reads a ListQuery from the query parameters of GET
// /api/v1/keys: state, operation, key, key_prefix, older_than (a Go
// duration: 90m, 48h), reason, label, order, cursor and limit. An unknown
// or repeated parameter is refused, so that a misspelt filter never lists
// more than was asked.
func ParseListQuery(q url.Values) (ListQuery, error) {
	for name, vals := range q {
		if !slices.Contains(listParams, name) {
			return ListQuery{}, badRequest("unknown parameter %s; GET /api/v1/keys takes %s", quote(name, 40), strings.Join(listParams, ", "))
		}
		if len(vals) > 1 {
			return ListQuery{}, badRequest("parameter %s given %d times; give it once", name, len(vals))
		}
	}
	lq := ListQuery{State: q.Get("state"), Operation: q.Get("operation"), Key: q.Get("key"), KeyPrefix: q.Get("key_prefix"),
		Reason: q.Get("reason"), Label: q.Get("label"), Order: q.Get("order"), Cursor: q.Get("cursor")}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			return lq, badRequest("limit %s is not a number", quote(s, 40))
		}
		lq.Limit = n
	}
	if s := q.Get("older_than"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return lq, badRequest("older_than %s is not a duration such as 90m or 48h", quote(s, 40))
		}
		lq.OlderThan = d
	}
	return lq, nil
}

// Values returns q as the query parameters ParseListQuery reads.
func (q ListQuery) Values() url.Values {
	v := url.Values{}
	for name, val := range map[string]string{"state": q.State, "operation": q.Operation, "key": q.Key, "key_prefix": q.KeyPrefix,
		"reason": q.Reason, "label": q.Label, "order": q.Order, "cursor": q.Cursor} {
		if val != "" {
			v.Set(name, val)
		}
	}
	if q.OlderThan != 0 {
		v.Set("older_than", q.OlderThan.String())
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// Counts is an overview of the keys a store holds.
type Counts struct {
	// Pending and NeedsReview count the keys in those states.
	Pending     int64 `json:"pending"`
	NeedsReview int64 `json:"needs_review"`
	// Completed counts completed keys: an estimate when
	// CompletedEstimated is set (stores holding many read it from their
	// statistics rather than count them).
	Completed          int64 `json:"completed"`
	CompletedEstimated bool  `json:"completed_estimated"`
	// Operations counts the pending and needs_review keys of each
	// operation that has any.
	Operations []OperationCounts `json:"operations"`
	// OldestNeedsReview is the key that has waited longest in review
	// (created first), or nil; its Age is how long it has been in review.
	OldestNeedsReview *Item `json:"oldest_needs_review,omitempty"`
	// ReadAt is the store's clock when it counted.
	ReadAt time.Time `json:"read_at"`
}

// OperationCounts counts the open keys of one operation.
type OperationCounts struct {
	Operation   string `json:"operation"`
	Pending     int64  `json:"pending"`
	NeedsReview int64  `json:"needs_review"`
}

// Counts returns an overview of the keys: how many are in each state and,
// of the open ones, in each operation, and the key waiting longest in
// review. It needs a store that counts (idemstore.Counter).
func (k *Keys) Counts(ctx context.Context) (Counts, error) {
	c, ok := k.Store.(idemstore.Counter)
	if !ok || !k.Store.Capabilities().Search {
		return Counts{}, errUnsupported("counting keys")
	}
	n, err := c.Counts(ctx)
	if errors.Is(err, idemstore.ErrSearchUnsupported) {
		return Counts{}, errUnsupported("counting keys")
	}
	if err != nil {
		return Counts{}, asError(err)
	}
	out := Counts{Pending: n.Pending, NeedsReview: n.NeedsReview, Completed: n.Completed, CompletedEstimated: n.CompletedEstimated,
		Operations: make([]OperationCounts, 0, len(n.Operations)), ReadAt: utc(n.ReadAt)}
	for _, o := range n.Operations {
		out.Operations = append(out.Operations, OperationCounts{Operation: o.Operation, Pending: o.Pending, NeedsReview: o.NeedsReview})
	}
	if n.NeedsReview > 0 && k.Store.Capabilities().Search {
		page, err := k.Store.List(ctx, idemstore.ListParams{State: idemstore.StateNeedsReview, Order: idemstore.OrderOldest, Limit: 1})
		if err != nil && !errors.Is(err, idemstore.ErrSearchUnsupported) {
			return Counts{}, asError(err)
		}
		if len(page.Records) == 1 {
			it := k.item(page.Records[0], false)
			out.OldestNeedsReview = &it
		}
	}
	return out, nil
}
