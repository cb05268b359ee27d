package idemstore

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Order is the order in which Store.List returns records.
type Order int

const (
	// OrderKey lists in key order: by scope, operation and key; with
	// ListParams.Key or KeyPrefix set, by key, scope and operation (the
	// order of the index that finds keys by their value).
	OrderKey Order = iota
	// OrderOldest lists the records created first first (CreatedAt, then
	// scope, operation and key on a tie).
	OrderOldest
	// OrderNewest lists the records created last first: OrderOldest
	// reversed.
	OrderNewest
)

// String returns "key", "oldest" or "newest".
func (o Order) String() string {
	switch o {
	case OrderKey:
		return "key"
	case OrderOldest:
		return "oldest"
	case OrderNewest:
		return "newest"
	}
	return fmt.Sprintf("Order(%d)", int(o))
}

// ParseOrder reads an Order by its String.
func ParseOrder(s string) (Order, error) {
	switch s {
	case "key":
		return OrderKey, nil
	case "oldest":
		return OrderOldest, nil
	case "newest":
		return OrderNewest, nil
	}
	return 0, fmt.Errorf("order %q must be oldest, newest or key", s)
}

// MaxScopeLabels bounds ListParams.ScopeLabels.
const MaxScopeLabels = 16

// ErrSearchUnsupported is returned by List for ListParams that search
// (Searches) on a store whose Capabilities do not include Search.
var ErrSearchUnsupported = errors.New("idem: this store cannot search records by key, label, age or reason")

// Searches reports whether p uses any of the search fields (Key,
// KeyPrefix, ScopeLabels, OlderThan, Reason, an Order other than
// OrderKey), which only stores with Capabilities.Search implement.
func (p ListParams) Searches() bool {
	return p.Key != "" || p.KeyPrefix != "" || len(p.ScopeLabels) > 0 || p.OlderThan > 0 || p.Reason != "" || p.Order != OrderKey
}

// Check refuses ListParams that no store can serve: an unknown state or
// order, a negative OlderThan, too many ScopeLabels. Errors are plain.
func (p ListParams) Check() error {
	switch {
	case p.State != "" && !p.State.Valid():
		return fmt.Errorf("unknown state %q", p.State)
	case p.Order < OrderKey || p.Order > OrderNewest:
		return fmt.Errorf("unknown order %d", int(p.Order))
	case p.OlderThan < 0:
		return fmt.Errorf("OlderThan %v is negative", p.OlderThan)
	case len(p.ScopeLabels) > MaxScopeLabels:
		return fmt.Errorf("%d scope labels; at most %d", len(p.ScopeLabels), MaxScopeLabels)
	}
	return nil
}

// MatchesNothing reports whether p's Key or KeyPrefix is one that no
// stored key can have or start with: longer than MaxKeyLength, holding
// NUL, or not valid UTF-8 (keys reach a store as visible ASCII, and some
// stores cannot even be asked about the others). A store returns an empty
// page for it, and no error.
func (p ListParams) MatchesNothing() bool {
	for _, k := range [2]string{p.Key, p.KeyPrefix} {
		if len(k) > MaxKeyLength || strings.IndexByte(k, 0) >= 0 || !utf8.ValidString(k) {
			return true
		}
	}
	return false
}

// ByKeyValue reports whether p lists in the key index's order (key, scope,
// operation): OrderKey with Key or KeyPrefix set.
func (p ListParams) ByKeyValue() bool {
	return p.Order == OrderKey && (p.Key != "" || p.KeyPrefix != "")
}

// PrefixEnd returns the smallest string greater, in byte order, than every
// string that starts with prefix, for a range scan of an index in byte
// order (key >= prefix AND key < end). ok is false when there is none
// (prefix is empty or all 0xff bytes): scan to the end.
func PrefixEnd(prefix string) (end string, ok bool) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}

// RunePrefixEnd is PrefixEnd for a prefix that is valid UTF-8, whose end
// must be valid UTF-8 too (PostgreSQL text): the last rune that has a
// successor is replaced by it. Among valid UTF-8 strings, which sort by
// code point in byte order, exactly those that start with prefix lie in
// [prefix, end). ok is false when there is none.
func RunePrefixEnd(prefix string) (end string, ok bool) {
	for s := prefix; s != ""; {
		r, n := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-n]
		next := r + 1
		if next == 0xD800 { // skip the surrogates, which UTF-8 cannot hold
			next = 0xE000
		}
		if r != utf8.RuneError && next <= utf8.MaxRune {
			return s + string(next), true
		}
	}
	return "", false
}

// ScopeLabel: a name an operator reads to tell whose key a record is (an
// account or user ID that the upstream trusts). It is kept with the record
// and shown, searchable by its exact value, and never used for isolation:
// the scope alone says whose key it is.

// MaxScopeLabelLength bounds a scope label in clear, in bytes. Longer ones
// are cut (CleanScopeLabel).
const MaxScopeLabelLength = 128

// MaxStoredScopeLabelLength bounds a label as a store keeps it: sealed, it
// is longer than in clear. Stores must keep labels up to this length.
const MaxStoredScopeLabelLength = 512

// SealedLabelPrefix starts a sealed scope label: SealedLabelPrefix, the
// label's digest (no ':'), ':' and the sealed label. A label in clear
// never starts with it, as CleanScopeLabel leaves no control character.
const SealedLabelPrefix = "\x01idem-sealed:"

// CleanScopeLabel returns label as a store may keep it in clear: control
// characters and invalid UTF-8 replaced by U+FFFD, white space around it
// trimmed, cut to MaxScopeLabelLength bytes on a rune boundary (the cut
// ending in "…"). A label is for operators to read; a hostile one is made
// harmless rather than refused, since it never decides anything.
func CleanScopeLabel(label string) string {
	if len(label) > 4*MaxScopeLabelLength {
		label = label[:4*MaxScopeLabelLength] // no need to clean what is cut anyway
	}
	label = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0x2028 || r == 0x2029 {
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(strings.TrimSpace(label), string(utf8.RuneError)))
	label = strings.TrimSpace(label)
	if len(label) <= MaxScopeLabelLength {
		return label
	}
	const ell = "…"
	i := MaxScopeLabelLength - len(ell)
	for i > 0 && !utf8.RuneStart(label[i]) {
		i--
	}
	return label[:i] + ell
}

// IsSealedLabel reports whether a stored label is sealed.
func IsSealedLabel(stored string) bool { return strings.HasPrefix(stored, SealedLabelPrefix) }

// ScopeLabelIndex returns what ListParams.ScopeLabels matches a stored
// label by: the label itself in clear, or SealedLabelPrefix and the digest
// of a sealed one. Stores index it.
func ScopeLabelIndex(stored string) string {
	if !IsSealedLabel(stored) {
		return stored
	}
	rest := stored[len(SealedLabelPrefix):]
	if i := strings.IndexByte(rest, ':'); i >= 0 {
		return stored[:len(SealedLabelPrefix)+i]
	}
	return stored
}

// LabelSealer is implemented by Sealers that also seal scope labels
// (idemseal.Keyring does). A sealed label keeps a keyed digest of the
// label in clear, so that it stays searchable by its exact value (never
// by a prefix), and so records that share a label can be told apart from
// others by whoever reads the store, though not the label itself.
type LabelSealer interface {
	// SealLabel returns label sealed, bound to key: SealedLabelPrefix, a
	// digest of label, ':' and the sealed label, at most
	// MaxStoredScopeLabelLength bytes for a label of
	// MaxScopeLabelLength.
	SealLabel(key Key, label string) (string, error)
	// OpenLabel returns the label that sealed seals. A label that is not
	// sealed is returned as it is; one that does not open is an error
	// wrapping ErrSealed.
	OpenLabel(key Key, sealed string) (string, error)
	// ScopeLabelIndexes returns the ScopeLabelIndex of label as each key
	// the Sealer holds would have sealed it, for a search.
	ScopeLabelIndexes(label string) []string
}

// Counts is what a store holds, for an overview.
type Counts struct {
	// Pending and NeedsReview count the records in those states, exactly.
	Pending, NeedsReview int64
	// Completed counts completed records; an estimate when
	// CompletedEstimated is set (a store that keeps millions of answers
	// reads it from its statistics, not by counting them).
	Completed          int64
	CompletedEstimated bool
	// Operations counts the pending and needs_review records of each
	// operation that has any, exactly.
	Operations []OperationCounts
	// OldestNeedsReview is the CreatedAt of the oldest record in review;
	// zero when none is.
	OldestNeedsReview time.Time
	// ReadAt is the store's clock when it counted: the oldest record in
	// review is ReadAt - OldestNeedsReview old.
	ReadAt time.Time
}

// OperationCounts counts the open records of one operation.
type OperationCounts struct {
	Operation            string
	Pending, NeedsReview int64
}

// Add counts n records of operation op in state (pending or
// needs_review), the oldest created at oldest: a row of a store's count
// grouped by state and operation. Rows of one operation must come
// together.
func (c *Counts) Add(state State, op string, n int64, oldest time.Time) {
	if len(c.Operations) == 0 || c.Operations[len(c.Operations)-1].Operation != op {
		c.Operations = append(c.Operations, OperationCounts{Operation: op})
	}
	oc := &c.Operations[len(c.Operations)-1]
	switch state {
	case StatePending:
		c.Pending += n
		oc.Pending += n
	case StateNeedsReview:
		c.NeedsReview += n
		oc.NeedsReview += n
		if c.OldestNeedsReview.IsZero() || oldest.Before(c.OldestNeedsReview) {
			c.OldestNeedsReview = oldest.UTC()
		}
	}
}

// Counter is implemented by stores that can count their records cheaply
// enough for an overview that refreshes every few seconds.
type Counter interface {
	Counts(ctx context.Context) (Counts, error)
}

// ExactCountLimit is how many completed records a store counts exactly
// before it may give an estimate instead (Counts.CompletedEstimated).
const ExactCountLimit = 10_000

// timeCursor tags a cursor of OrderOldest or OrderNewest.
const timeCursor = 't'

// EncodeTimeCursor returns an opaque List cursor that resumes after the
// record created at t with key k, in OrderOldest or OrderNewest.
func EncodeTimeCursor(t time.Time, k Key) string {
	b := make([]byte, 0, 1+4*binary.MaxVarintLen64+len(k.Scope)+len(k.Operation)+len(k.Key))
	b = append(b, timeCursor)
	b = binary.AppendVarint(b, t.UnixNano())
	for _, part := range [3]string{k.Scope, k.Operation, k.Key} {
		b = appendString(b, part)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeTimeCursor reverses EncodeTimeCursor. Errors wrap ErrBadCursor.
func DecodeTimeCursor(c string) (time.Time, Key, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, Key{}, fmt.Errorf("%w: %v", ErrBadCursor, err)
	}
	if len(b) == 0 || b[0] != timeCursor {
		return time.Time{}, Key{}, fmt.Errorf("%w: not a cursor of a listing by age", ErrBadCursor)
	}
	ns, n := binary.Varint(b[1:])
	if n <= 0 {
		return time.Time{}, Key{}, fmt.Errorf("%w: malformed", ErrBadCursor)
	}
	d := decoder{b: b[1+n:]}
	k := Key{Scope: d.string(), Operation: d.string(), Key: d.string()}
	if d.err != nil || len(d.b) != 0 {
		return time.Time{}, Key{}, fmt.Errorf("%w: malformed", ErrBadCursor)
	}
	return time.Unix(0, ns).UTC(), k, nil
}

// ListCursor is a decoded List cursor: where the next page starts.
type ListCursor struct {
	// Key is the last record's key.
	Key Key
	// CreatedAt is the last record's CreatedAt, in OrderOldest and
	// OrderNewest.
	CreatedAt time.Time
}

// DecodeCursor decodes p.Cursor for p.Order; nil for no cursor. Errors
// wrap ErrBadCursor.
func (p ListParams) DecodeCursor() (*ListCursor, error) {
	if p.Cursor == "" {
		return nil, nil
	}
	if p.Order == OrderKey {
		k, err := DecodeKeyCursor(p.Cursor)
		if err != nil {
			return nil, err
		}
		return &ListCursor{Key: k}, nil
	}
	t, k, err := DecodeTimeCursor(p.Cursor)
	if err != nil {
		return nil, err
	}
	return &ListCursor{Key: k, CreatedAt: t}, nil
}

// Page turns the records a driver fetched for List, in p's order, up to
// p.Limit+1 of them (the extra one telling whether a next page exists),
// into a page with its cursor.
func (p ListParams) Page(recs []*Record) ListPage {
	if p.Order == OrderKey {
		return KeyPage(recs, p.Limit)
	}
	var page ListPage
	if len(recs) > p.Limit {
		recs = recs[:p.Limit]
		last := recs[len(recs)-1]
		page.NextCursor = EncodeTimeCursor(last.CreatedAt, last.Key)
	}
	page.Records = recs
	return page
}
