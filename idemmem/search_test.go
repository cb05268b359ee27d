package idemmem_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// TestSearchByAgeOnItsClock: OlderThan and the orders by age follow the
// store's clock, to the nanosecond: a record created exactly OlderThan
// ago is listed, one a nanosecond younger is not.
func TestSearchByAgeOnItsClock(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	s := idemmem.MustNew(idemmem.Config{Now: func() time.Time { return now }})
	ctx := context.Background()
	reserve := func(key string) {
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: idemstore.Key{Scope: "s", Operation: "op", Key: key}, Fingerprint: "f", Token: key, Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	reserve("old")
	now = now.Add(time.Minute)
	reserve("young")
	now = now.Add(time.Nanosecond)
	list := func(p idemstore.ListParams) []string {
		t.Helper()
		page, err := s.List(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, r := range page.Records {
			keys = append(keys, r.Key.Key)
		}
		return keys
	}
	if got := list(idemstore.ListParams{OlderThan: time.Minute}); len(got) != 1 || got[0] != "old" {
		t.Fatalf("OlderThan 1m: %q, want [old]", got)
	}
	if got := list(idemstore.ListParams{OlderThan: time.Minute + time.Nanosecond}); len(got) != 1 {
		t.Fatalf("OlderThan 1m1ns: %q, want [old] (created exactly that long ago)", got)
	}
	if got := list(idemstore.ListParams{OlderThan: time.Nanosecond}); len(got) != 2 {
		t.Fatalf("OlderThan 1ns: %q, want both", got)
	}
	if got := list(idemstore.ListParams{Order: idemstore.OrderNewest}); len(got) != 2 || got[0] != "young" {
		t.Fatalf("OrderNewest: %q", got)
	}
	if got := list(idemstore.ListParams{Order: idemstore.OrderOldest}); len(got) != 2 || got[0] != "old" {
		t.Fatalf("OrderOldest: %q", got)
	}
}

// TestSearchIndexFollowsRecords: the key index forgets what is released,
// deleted, purged or evicted, and what Close drops.
func TestSearchIndexFollowsRecords(t *testing.T) {
	t.Parallel()
	s := idemmem.MustNew(idemmem.Config{MaxRecords: 2})
	ctx := context.Background()
	k := func(key string) idemstore.Key { return idemstore.Key{Scope: "s", Operation: "op", Key: key} }
	count := func(key string) int {
		t.Helper()
		page, err := s.List(ctx, idemstore.ListParams{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return len(page.Records)
	}
	for _, key := range []string{"a", "b"} {
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k(key), Fingerprint: "f", Token: key, Lease: time.Hour, ScopeLabel: "L"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Release(ctx, idemstore.ReleaseParams{Key: k("a"), Token: "a"}); err != nil {
		t.Fatal(err)
	}
	if count("a") != 0 || count("b") != 1 {
		t.Fatalf("after a release: a %d, b %d", count("a"), count("b"))
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k("b"), Token: "b", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// At MaxRecords, new keys evict the completed one.
	for _, key := range []string{"c", "d"} {
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k(key), Fingerprint: "f", Token: key, Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if count("b") != 0 {
		t.Fatal("an evicted record is still found by its key")
	}
	page, _ := s.List(ctx, idemstore.ListParams{ScopeLabels: []string{"L"}})
	if len(page.Records) != 0 {
		t.Fatal("an evicted record is still found by its label")
	}
	s.Close()
	if _, err := s.List(ctx, idemstore.ListParams{Key: "c"}); err == nil {
		t.Fatal("List after Close")
	}
}
