package idemadmin_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// tick returns a clock that moves a second at each reading, so that
// records created one after another have distinct ages at any precision.
func tick() func() time.Time {
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Second)
		return now
	}
}

// searchStores runs test on a fresh memory store and a fresh SQLite store,
// each on a clock of its own (tick).
func searchStores(t *testing.T, test func(t *testing.T, s idemstore.Store)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		s := idemmem.MustNew(idemmem.Config{Now: tick()})
		t.Cleanup(func() { s.Close() })
		test(t, s)
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), idemsqlite.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		s, err := idemsqlite.New(db, idemsqlite.Config{Now: tick()})
		if err != nil {
			t.Fatal(err)
		}
		test(t, s)
	})
}

// put stores a record of key in scope, in state, with label, and returns
// its key. Records are created in the order put is called.
func put(t *testing.T, s idemstore.Store, scope, key string, state idemstore.State, label, reason string) idemstore.Key {
	t.Helper()
	ctx := context.Background()
	k := idemstore.Key{Scope: scope, Operation: "POST /payments", Key: key}
	tok := "tok-" + scope + "-" + key
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: -time.Hour, ScopeLabel: label,
		Request: &idemstore.Request{Method: "POST", Path: "/payments"}}); err != nil || !created {
		t.Fatalf("Reserve(%v): %v, created %v", k, err, created)
	}
	var err error
	switch state {
	case idemstore.StateNeedsReview:
		err = s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: reason})
	case idemstore.StateCompleted:
		err = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: &idemstore.Response{Status: 201}, Retention: time.Hour})
	}
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func requireCode(t *testing.T, err error, code string) {
	t.Helper()
	var e *idemadmin.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("error %v, want code %s", err, code)
	}
}

func keysOfPage(p idemadmin.Page) []string {
	var out []string
	for _, it := range p.Items {
		out = append(out, it.Scope+"/"+it.Key)
	}
	return out
}

// TestKeysSearch: the filters reach the store, needs_review lists the
// oldest first, items carry their short ID and label, and malformed
// queries are refused.
func TestKeysSearch(t *testing.T) {
	t.Parallel()
	searchStores(t, func(t *testing.T, s idemstore.Store) {
		k := &idemadmin.Keys{Store: s, Logger: slog.New(slog.DiscardHandler)}
		ctx := context.Background()
		put(t, s, "s2", "order-1001", idemstore.StateNeedsReview, "acct_7", "upstream TIMEOUT after send")
		put(t, s, "s1", "order-1001", idemstore.StateCompleted, "acct_8", "")
		put(t, s, "s1", "order-1002", idemstore.StateNeedsReview, "acct_7", "connection reset")
		put(t, s, "s3", "order-100", idemstore.StatePending, "", "")
		put(t, s, "s0", "other", idemstore.StateNeedsReview, "acct_9", "timeout")

		page, err := k.List(ctx, idemadmin.ListQuery{Key: "order-1001"})
		if err != nil || fmt.Sprint(keysOfPage(page)) != "[s1/order-1001 s2/order-1001]" || page.Order != "key" {
			t.Fatalf("key order-1001: %v (order %s), %v", keysOfPage(page), page.Order, err)
		}
		for _, it := range page.Items {
			if !strings.HasPrefix(it.ShortID, "order-1001~") || len(it.ShortID) != len("order-1001~")+6 {
				t.Fatalf("short id %q", it.ShortID)
			}
		}
		if page.Items[0].ScopeLabel != "acct_8" {
			t.Fatalf("label %q, want acct_8", page.Items[0].ScopeLabel)
		}
		// The review queue: oldest first by default (s2's key before s1's
		// and s0's, though not in key order).
		page, err = k.List(ctx, idemadmin.ListQuery{State: "needs_review"})
		if err != nil || fmt.Sprint(keysOfPage(page)) != "[s2/order-1001 s1/order-1002 s0/other]" || page.Order != "oldest" {
			t.Fatalf("needs_review: %v (order %s), %v", keysOfPage(page), page.Order, err)
		}
		for q, want := range map[string]idemadmin.ListQuery{
			"[s3/order-100 s1/order-1001 s2/order-1001 s1/order-1002]": {KeyPrefix: "order-100"},
			"[s1/order-1002 s2/order-1001]":                            {Label: " acct_7 ", Order: "newest"},
			"[s2/order-1001 s0/other]":                                 {Reason: "TimeOut", State: "needs_review"},
			"[s1/order-1002]":                                          {Label: "acct_7", Reason: "reset"},
			"[s0/other s1/order-1002 s2/order-1001]":                   {State: "needs_review", Order: "key"},
			"[]":                                                       {OlderThan: time.Hour},
		} {
			page, err := k.List(ctx, want)
			if err != nil || fmt.Sprint(keysOfPage(page)) != q {
				t.Errorf("%+v: %v, %v; want %s", want, keysOfPage(page), err, q)
			}
		}
		// Bounded: an empty prefix lists a page at a time, as always.
		page, err = k.List(ctx, idemadmin.ListQuery{KeyPrefix: "", Limit: 2})
		if err != nil || len(page.Items) != 2 || page.NextCursor == "" {
			t.Fatalf("an empty prefix, limit 2: %d items, cursor %q, %v", len(page.Items), page.NextCursor, err)
		}
		for _, bad := range []idemadmin.ListQuery{
			{Key: strings.Repeat("k", 256)},
			{KeyPrefix: strings.Repeat("k", 256)},
			{Order: "age"},
			{Label: " \t\n"},
			{Label: strings.Repeat("l", 10<<10)},
			{Reason: strings.Repeat("r", idemadmin.MaxReasonQuery+1)},
			{OlderThan: -time.Second},
			{Limit: 1001},
			{State: "done"},
		} {
			_, err := k.List(ctx, bad)
			requireCode(t, err, idemadmin.CodeBadRequest)
		}
		// Hostile values find nothing, and break nothing.
		for _, v := range []string{"%", "_", `\`, "'", `"`, "\x00", "order-100%", "order-10_1"} {
			for _, q := range []idemadmin.ListQuery{{Key: v}, {KeyPrefix: v}, {Label: v}, {Reason: v + "zz"}} {
				page, err := k.List(ctx, q)
				if err != nil || len(page.Items) != 0 {
					t.Errorf("%+v: %d items, %v", q, len(page.Items), err)
				}
			}
		}
	})
}

// collidingScopes returns two scopes whose keys key, of operation op,
// share a short ID.
func collidingScopes(t *testing.T, op, key string) (string, string) {
	seen := map[string]string{}
	for i := 0; i < 1<<20; i++ {
		scope := fmt.Sprintf("scope-%d", i)
		sum := sha256.Sum256([]byte(idemadmin.KeyID(idemstore.Key{Scope: scope, Operation: op, Key: key})))
		short := hex.EncodeToString(sum[:])[:6]
		if other, ok := seen[short]; ok {
			return other, scope
		}
		seen[short] = scope
	}
	t.Fatal("no two scopes share a short id")
	return "", ""
}

// TestShortIDs: a short ID names a key wherever an ID does; an ambiguous
// or unknown one is refused, saying so.
func TestShortIDs(t *testing.T) {
	t.Parallel()
	searchStores(t, func(t *testing.T, s idemstore.Store) {
		k := &idemadmin.Keys{Store: s, Logger: slog.New(slog.DiscardHandler)}
		ctx := context.Background()
		key := put(t, s, "s1", "order/1 ~x", idemstore.StateNeedsReview, "", "timeout")
		other := put(t, s, "s2", "order/1 ~x", idemstore.StateCompleted, "", "")
		short := idemadmin.ShortID(key)
		if !idemadmin.IsShortID(short) || idemadmin.IsShortID(idemadmin.KeyID(key)) {
			t.Fatalf("IsShortID(%q) or IsShortID of an id", short)
		}
		it, err := k.Get(ctx, short)
		if err != nil || it.ID != idemadmin.KeyID(key) || it.ShortID != short {
			t.Fatalf("Get(%q) = %s, %v", short, it.ID, err)
		}
		res, err := k.Resolve(ctx, short, "ops", idemadmin.ResolveRequest{Action: idemadmin.ActionRelease, Attempt: it.Attempt})
		if err != nil || res.ID != idemadmin.KeyID(key) {
			t.Fatalf("Resolve(%q) = %+v, %v", short, res, err)
		}
		if _, err := k.Get(ctx, short); err == nil {
			t.Fatal("a released key is still found by its short id")
		} else {
			requireCode(t, err, idemadmin.CodeNotFound)
		}
		otherShort := idemadmin.ShortID(other)
		if _, err := k.Delete(ctx, otherShort, "ops", idemadmin.DeleteRequest{Attempt: idemadmin.AnyAttempt}); err != nil {
			t.Fatalf("Delete(%q): %v", otherShort, err)
		}
		// A short id of the right form whose digits match nothing.
		_, err = k.Get(ctx, "order/1 ~x~000000")
		requireCode(t, err, idemadmin.CodeNotFound)

		a, b := collidingScopes(t, "POST /payments", "dup")
		put(t, s, a, "dup", idemstore.StateNeedsReview, "", "r")
		put(t, s, b, "dup", idemstore.StateNeedsReview, "", "r")
		_, err = k.Get(ctx, idemadmin.ShortID(idemstore.Key{Scope: a, Operation: "POST /payments", Key: "dup"}))
		requireCode(t, err, idemadmin.CodeAmbiguousID)
		if !strings.Contains(err.Error(), idemadmin.KeyID(idemstore.Key{Scope: b, Operation: "POST /payments", Key: "dup"})) {
			t.Fatalf("the ambiguity does not list the ids: %v", err)
		}
	})
}

// noSearch is a store that cannot search, nor count.
type noSearch struct{ idemstore.Store }

func (n noSearch) Capabilities() idemstore.Capabilities {
	c := n.Store.Capabilities()
	c.Search = false
	return c
}

// TestSearchNotSupported: a store without Capabilities.Search refuses
// searches and short IDs with not_supported, rather than list keys that
// were not asked for, and still lists the review queue, in key order.
func TestSearchNotSupported(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	k := &idemadmin.Keys{Store: noSearch{mem}}
	ctx := context.Background()
	key := put(t, mem, "s", "order-1", idemstore.StateNeedsReview, "acct", "r")
	for _, q := range []idemadmin.ListQuery{{Key: "x"}, {KeyPrefix: "x"}, {Label: "acct"}, {Reason: "r"}, {OlderThan: time.Second}, {Order: "oldest"}} {
		_, err := k.List(ctx, q)
		requireCode(t, err, idemadmin.CodeNotSupported)
	}
	page, err := k.List(ctx, idemadmin.ListQuery{State: "needs_review"})
	if err != nil || len(page.Items) != 1 || page.Order != "key" {
		t.Fatalf("the review queue: %d items, order %s, %v", len(page.Items), page.Order, err)
	}
	_, err = k.Get(ctx, idemadmin.ShortID(key))
	requireCode(t, err, idemadmin.CodeNotSupported)
	if _, err := k.Get(ctx, idemadmin.KeyID(key)); err != nil {
		t.Fatalf("Get by id: %v", err)
	}
	_, err = k.Counts(ctx)
	requireCode(t, err, idemadmin.CodeNotSupported)
}

// TestSealedLabels: a sealed label is found by its value and shown
// opened; without the key it is left out, and the item says why.
func TestSealedLabels(t *testing.T) {
	t.Parallel()
	ring, err := idemseal.New(idemseal.Key{ID: "k1", Secret: bytes.Repeat([]byte{7}, idemseal.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	mem := idemmem.MustNew(idemmem.Config{})
	key := idemstore.Key{Scope: "s", Operation: "POST /payments", Key: "order-1"}
	sealed, _ := ring.SealLabel(key, "acct_SECRET")
	if _, _, err := mem.Reserve(context.Background(), idemstore.ReserveParams{Key: key, Fingerprint: "f", Token: "t", Lease: time.Hour, ScopeLabel: sealed}); err != nil {
		t.Fatal(err)
	}
	put(t, mem, "s", "order-2", idemstore.StatePending, "acct_SECRET", "") // in clear, from before sealing
	with := &idemadmin.Keys{Store: mem, Sealer: ring}
	page, err := with.List(context.Background(), idemadmin.ListQuery{Label: "acct_SECRET"})
	if err != nil || len(page.Items) != 2 {
		t.Fatalf("a search by a sealed label: %d items, %v", len(page.Items), err)
	}
	for _, it := range page.Items {
		if it.ScopeLabel != "acct_SECRET" || it.Sealed != "" {
			t.Fatalf("item %s: label %q, sealed %q", it.Key, it.ScopeLabel, it.Sealed)
		}
	}
	without := &idemadmin.Keys{Store: mem}
	it, err := without.Get(context.Background(), idemadmin.KeyID(key))
	if err != nil || it.ScopeLabel != "" || !strings.Contains(it.Sealed, "scope label") {
		t.Fatalf("without the key: label %q, sealed %q, %v", it.ScopeLabel, it.Sealed, err)
	}
	// Without the key, only the label in clear is found.
	page, _ = without.List(context.Background(), idemadmin.ListQuery{Label: "acct_SECRET"})
	if len(page.Items) != 1 || page.Items[0].Key != "order-2" {
		t.Fatalf("without the key, a search finds %d items", len(page.Items))
	}
}

// TestKeysCounts: counts by state and operation, and the key waiting
// longest in review.
func TestKeysCounts(t *testing.T) {
	t.Parallel()
	searchStores(t, func(t *testing.T, s idemstore.Store) {
		k := &idemadmin.Keys{Store: s, Logger: slog.New(slog.DiscardHandler)}
		put(t, s, "s", "first", idemstore.StateNeedsReview, "acct", "r")
		put(t, s, "s", "second", idemstore.StateNeedsReview, "", "r")
		put(t, s, "s", "third", idemstore.StatePending, "", "")
		put(t, s, "s", "fourth", idemstore.StateCompleted, "", "")
		c, err := k.Counts(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if c.NeedsReview != 2 || c.Pending != 1 || c.Completed != 1 || c.CompletedEstimated || len(c.Operations) != 1 ||
			c.Operations[0] != (idemadmin.OperationCounts{Operation: "POST /payments", Pending: 1, NeedsReview: 2}) {
			t.Fatalf("counts %+v", c)
		}
		if c.OldestNeedsReview == nil || c.OldestNeedsReview.Key != "first" || c.OldestNeedsReview.ScopeLabel != "acct" || c.ReadAt.IsZero() {
			t.Fatalf("oldest in review: %+v", c.OldestNeedsReview)
		}
	})
}

// TestShortIDOfACommonKey: a short id whose key value more than
// maxShortIDMatches records share is refused, saying to use the id,
// rather than looked for at length or reported missing.
func TestShortIDOfACommonKey(t *testing.T) {
	t.Parallel()
	s := idemmem.MustNew(idemmem.Config{MaxRecords: -1})
	ctx := context.Background()
	var last idemstore.Key
	for i := range 5001 {
		last = idemstore.Key{Scope: fmt.Sprintf("s%05d", i), Operation: "POST /x", Key: "1"}
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: last, Fingerprint: "f", Token: "t", Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	k := &idemadmin.Keys{Store: s, Logger: slog.New(slog.DiscardHandler)}
	_, err := k.Get(ctx, idemadmin.ShortID(last))
	requireCode(t, err, idemadmin.CodeBadRequest)
	if !strings.Contains(err.Error(), "give the id") {
		t.Fatalf("error %v", err)
	}
	if _, err := k.Get(ctx, idemadmin.KeyID(last)); err != nil {
		t.Fatalf("by its id: %v", err)
	}
}
