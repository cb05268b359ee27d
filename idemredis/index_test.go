package idemredis

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// TestMembersKeepOrder checks that index members read back as the keys
// they were made of, and sort as the keys do, with NUL and 0x01 in any
// part.
func TestMembersKeepOrder(t *testing.T) {
	t.Parallel()
	parts := []string{"", "a", "a\x00", "a\x00b", "a\x01", "a\x01\x02", "a\x02", "ab", "\x00", "\x01", "é"}
	var keys []idemstore.Key
	for _, a := range parts {
		for _, b := range parts {
			keys = append(keys, idemstore.Key{Scope: a, Operation: b, Key: a + b})
		}
	}
	for _, k := range keys {
		if got, ok := parseKeyMember(keyMember(k)); !ok || got != k {
			t.Fatalf("key member of %q reads back as %q, %v", k, got, ok)
		}
		if got, ok := parseAgeMember(ageMember(k)); !ok || got != k {
			t.Fatalf("age member of %q reads back as %q, %v", k, got, ok)
		}
	}
	for _, a := range keys {
		for _, b := range keys {
			want := cmpParts(a.Scope, a.Operation, a.Key, b.Scope, b.Operation, b.Key)
			if got := strings.Compare(ageMember(a), ageMember(b)); got != want {
				t.Fatalf("age members of %q and %q compare %d, keys %d", a, b, got, want)
			}
			want = cmpParts(a.Key, a.Scope, a.Operation, b.Key, b.Scope, b.Operation)
			if got := strings.Compare(keyMember(a), keyMember(b)); got != want {
				t.Fatalf("key members of %q and %q compare %d, keys %d", a, b, got, want)
			}
		}
	}
}

func cmpParts(a1, a2, a3, b1, b2, b3 string) int {
	if c := strings.Compare(a1, b1); c != 0 {
		return c
	}
	if c := strings.Compare(a2, b2); c != 0 {
		return c
	}
	return strings.Compare(a3, b3)
}

// TestSlotTags checks that each index group's tag hashes to its slot.
func TestSlotTags(t *testing.T) {
	t.Parallel()
	for slot := range numSlots {
		if got := int(crc16(slotTag(slot)) % numSlots); got != slot {
			t.Fatalf("slotTag(%d) = %q, in slot %d", slot, slotTag(slot), got)
		}
	}
}

// indexEntries counts the entries of every index set of the groups of
// keys.
func indexEntries(t *testing.T, s *Store, keys []idemstore.Key) int64 {
	t.Helper()
	seen := map[int]bool{}
	var n int64
	for _, k := range keys {
		g := s.group(hashTag(k))
		if seen[g] {
			continue
		}
		seen[g] = true
		ix := s.indexes(g)
		for _, set := range []string{ix.key, ix.all, ix.review, ix.label} {
			c, err := s.client.Do(t.Context(), s.client.B().Zcard().Key(set).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			n += c
		}
	}
	return n
}

// labelled reserves a record of name with a label, and completes or
// escalates it as state says.
func labelled(t *testing.T, s *Store, name, label string, state idemstore.State) idemstore.Key {
	t.Helper()
	ctx := t.Context()
	k := idemstore.Key{Scope: "tenant-" + name, Operation: "POST /payments", Key: name}
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Hour, ScopeLabel: label}); err != nil || !created {
		t.Fatalf("Reserve(%v): created %v, %v", k, created, err)
	}
	var err error
	switch state {
	case idemstore.StateCompleted:
		err = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: &idemstore.Response{Status: 201}, Retention: time.Hour})
	case idemstore.StateNeedsReview:
		err = s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok", Reason: "timeout"})
	}
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestIndexOfGoneRecords checks that the index entries of records that
// vanished (as when their TTL runs out) are never listed, are dropped when
// a search meets them, and that Purge sweeps the rest, on a single node
// and on a Cluster.
func TestIndexOfGoneRecords(t *testing.T) {
	t.Parallel()
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, topo.client(t))
			ctx := t.Context()
			var keys []idemstore.Key
			for i, st := range []idemstore.State{idemstore.StateCompleted, idemstore.StatePending, idemstore.StateNeedsReview, idemstore.StateCompleted} {
				keys = append(keys, labelled(t, s, fmt.Sprintf("gone-%d", i), "acct_1", st))
			}
			if n := indexEntries(t, s, keys); n != 4*3+1 {
				t.Fatalf("%d index entries for 4 labelled records (3 each, and the one in review once more)", n)
			}
			for _, k := range keys {
				if err := s.client.Do(ctx, s.client.B().Del().Key(s.recordKey(k)).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range []idemstore.ListParams{
				{Key: "gone-0"}, {KeyPrefix: "gone-"}, {ScopeLabels: []string{"acct_1"}},
				{Order: idemstore.OrderOldest}, {State: idemstore.StateNeedsReview, Order: idemstore.OrderNewest},
			} {
				page, err := s.List(ctx, p)
				if err != nil || len(page.Records) != 0 {
					t.Fatalf("List(%+v) of gone records: %d records, %v", p, len(page.Records), err)
				}
			}
			// The key prefix met every record: only their label entries,
			// met by the label search first, may be left... none is.
			if n := indexEntries(t, s, keys); n != 0 {
				t.Fatalf("after searches met them, %d index entries of gone records remain", n)
			}
			c, err := s.Counts(ctx)
			if err != nil || c.Pending+c.NeedsReview+c.Completed != 0 {
				t.Fatalf("Counts = %+v, %v; want none", c, err)
			}
			// Purge sweeps what no search met.
			keys = append(keys[:0], labelled(t, s, "swept", "acct_2", idemstore.StateCompleted), labelled(t, s, "swept-2", "", idemstore.StateNeedsReview))
			for _, k := range keys {
				if err := s.client.Do(ctx, s.client.B().Del().Key(s.recordKey(k)).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			c, err = s.Counts(ctx)
			if err != nil || c.Completed != 0 || c.NeedsReview != 1 {
				t.Fatalf("Counts = %+v, %v; want the gone completed record left out", c, err)
			}
			if _, err := s.Purge(ctx, idemstore.PurgeParams{BatchSize: 1}); err != nil {
				t.Fatal(err)
			}
			if n := indexEntries(t, s, keys); n != 0 {
				t.Fatalf("after Purge, %d index entries of gone records remain", n)
			}
		})
	}
}

// TestReindex checks that records written without index entries (by the
// previous versions: hashes, and strings before the indexes) are found by
// searches and counted once Reindex has run, and only then.
func TestReindex(t *testing.T) {
	t.Parallel()
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, topo.client(t))
			ctx := t.Context()
			w := oldWriter{t, s}
			hashPending := w.reserve("re-hash-pending", "tok", time.Hour)
			hashReview := w.reserve("re-hash-review", "tok", time.Hour)
			w.escalate(hashReview, "tok", "provider timeout")
			keys := []idemstore.Key{
				hashPending, hashReview,
				labelled(t, s, "re-done", "acct_9", idemstore.StateCompleted),
				labelled(t, s, "re-open", "", idemstore.StatePending),
			}
			// Forget the indexes, as before this version.
			for _, k := range keys {
				ix := s.keys(k).ix
				for _, set := range []string{ix.key, ix.all, ix.review, ix.label} {
					if err := s.client.Do(ctx, s.client.B().Del().Key(set).Build()).Error(); err != nil {
						t.Fatal(err)
					}
				}
			}
			search := func() []idemstore.Key {
				page, err := s.List(ctx, idemstore.ListParams{KeyPrefix: "re-"})
				if err != nil {
					t.Fatal(err)
				}
				return keysOf(page.Records)
			}
			if got := search(); len(got) != 0 {
				t.Fatalf("before Reindex, the search found %v", got)
			}
			var reported []int
			n, err := s.Reindex(ctx, func(done int) { reported = append(reported, done) })
			if err != nil || n != 4 || len(reported) == 0 || reported[len(reported)-1] != 4 {
				t.Fatalf("Reindex = %d, %v, progress %v; want 4", n, err, reported)
			}
			want := slices.Clone(keys)
			slices.SortFunc(want, func(a, b idemstore.Key) int { return strings.Compare(a.Key, b.Key) })
			if got := search(); !slices.Equal(got, want) {
				t.Fatalf("after Reindex, the search found %v, want %v", got, want)
			}
			page, err := s.List(ctx, idemstore.ListParams{State: idemstore.StateNeedsReview, Order: idemstore.OrderOldest})
			if err != nil || len(page.Records) != 1 || page.Records[0].Key != hashReview {
				t.Fatalf("the review queue after Reindex: %v, %v", page.Records, err)
			}
			page, err = s.List(ctx, idemstore.ListParams{ScopeLabels: []string{"acct_9"}})
			if err != nil || len(page.Records) != 1 || page.Records[0].Key != keys[2] {
				t.Fatalf("the label search after Reindex: %v, %v", page.Records, err)
			}
			c, err := s.Counts(ctx)
			if err != nil || c.Pending != 2 || c.NeedsReview != 1 || c.Completed != 1 {
				t.Fatalf("Counts after Reindex = %+v, %v", c, err)
			}
			// Again: nothing changes.
			if n, err := s.Reindex(ctx, nil); err != nil || n != 4 {
				t.Fatalf("Reindex again = %d, %v", n, err)
			}
			if c2, err := s.Counts(ctx); err != nil || c2.Pending != 2 || c2.NeedsReview != 1 || c2.Completed != 1 {
				t.Fatalf("Counts after a second Reindex = %+v, %v", c2, err)
			}
		})
	}
}

// TestLabelLayout checks that only a record with a scope label is written
// in layout 2, so that processes of the previous version, which read
// layout 1 alone, still read every record of a deployment without labels.
func TestLabelLayout(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	for label, want := range map[string]byte{"": recordLayout, "acct_1": labelLayout} {
		k := labelled(t, s, "layout-"+label, label, idemstore.StateCompleted)
		v, err := s.client.Do(t.Context(), s.client.B().Getrange().Key(s.recordKey(k)).Start(0).End(0).Build()).ToString()
		if err != nil || v != string([]byte{want}) {
			t.Fatalf("label %q: layout byte %q, %v; want %d", label, v, err, want)
		}
	}
}

func keysOf(recs []*idemstore.Record) []idemstore.Key {
	out := make([]idemstore.Key, len(recs))
	for i, r := range recs {
		out[i] = r.Key
	}
	return out
}
