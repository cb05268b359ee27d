package idem_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// stored returns the record the engine's store keeps for key.
func stored(t *testing.T, s idemstore.Store, key string) *idemstore.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), req(key).Key)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestScopeLabelKept: a Request's label is kept on the record, cleaned and
// bounded, and a retry with another label changes neither the outcome nor
// the label.
func TestScopeLabelKept(t *testing.T) {
	t.Parallel()
	e, s := newEngine(t, idem.EngineConfig{})
	r := req("k1")
	r.ScopeLabel = "  acct_8842\n"
	res := mustBegin(t, e, r, idem.Acquired)
	if got := stored(t, s, "k1").ScopeLabel; got != "acct_8842" {
		t.Fatalf("stored label %q, want %q", got, "acct_8842")
	}
	if err := res.Lease.Complete(context.Background(), &idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	// The label is never part of the key: another label replays.
	r.ScopeLabel = "someone-else"
	mustBegin(t, e, r, idem.Replayed)
	if got := stored(t, s, "k1").ScopeLabel; got != "acct_8842" {
		t.Fatalf("a retry changed the label to %q", got)
	}

	// Hostile: 10 KB, control characters, invalid UTF-8.
	r = req("k2")
	r.ScopeLabel = "\x1b[31mred\x00" + strings.Repeat("A", 10<<10) + "\xff"
	mustBegin(t, e, r, idem.Acquired)
	got := stored(t, s, "k2").ScopeLabel
	if len(got) > idemstore.MaxScopeLabelLength || strings.ContainsAny(got, "\x1b\x00") || !strings.HasPrefix(got, "\uFFFD[31mred\uFFFD") || !strings.HasSuffix(got, "…") {
		t.Fatalf("a hostile label was kept as %d bytes: %q", len(got), got[:min(len(got), 40)])
	}
}

// TestScopeLabelSealed: with a Sealer, the label is kept sealed (no label
// in clear in the store), yet searchable through the Sealer's indexes; a
// Sealer that cannot seal labels drops it.
func TestScopeLabelSealed(t *testing.T) {
	t.Parallel()
	ring := keyring(t, "k1")
	e, s := newEngine(t, idem.EngineConfig{Sealer: ring})
	r := req("k1")
	r.ScopeLabel = "acct_SECRET"
	mustBegin(t, e, r, idem.Acquired)
	rec := stored(t, s, "k1")
	if !idemstore.IsSealedLabel(rec.ScopeLabel) || strings.Contains(rec.ScopeLabel, "SECRET") {
		t.Fatalf("with a Sealer, the label is stored as %q", rec.ScopeLabel)
	}
	if label, err := ring.OpenLabel(rec.Key, rec.ScopeLabel); err != nil || label != "acct_SECRET" {
		t.Fatalf("OpenLabel = %q, %v", label, err)
	}
	page, err := s.List(context.Background(), idemstore.ListParams{ScopeLabels: ring.ScopeLabelIndexes("acct_SECRET")})
	if err != nil || len(page.Records) != 1 || page.Records[0].Key != rec.Key {
		t.Fatalf("a search by the sealed label's indexes found %d records, %v", len(page.Records), err)
	}

	e2, s2 := newEngine(t, idem.EngineConfig{Sealer: noLabelSealer{ring}})
	mustBegin(t, e2, r, idem.Acquired)
	if got := stored(t, s2, "k1").ScopeLabel; got != "" {
		t.Fatalf("a Sealer that cannot seal labels kept the label %q", got)
	}
}

// noLabelSealer is a Sealer without idemstore.LabelSealer.
type noLabelSealer struct{ idemstore.Sealer }

// TestDoScopeLabel: a job run with Do keeps its Request's label.
func TestDoScopeLabel(t *testing.T) {
	t.Parallel()
	e, s := newEngine(t, idem.EngineConfig{})
	r := req("job-1")
	r.ScopeLabel = "batch-7"
	if _, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, "job-1").ScopeLabel; got != "batch-7" {
		t.Fatalf("Do kept the label %q, want batch-7", got)
	}
}
