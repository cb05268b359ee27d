package idemseal_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemstore"
)

func TestLabelRoundTrip(t *testing.T) {
	t.Parallel()
	k := ring(t, key1)
	const label = "acct_8842"
	sealed, err := k.SealLabel(recKey, label)
	if err != nil {
		t.Fatal(err)
	}
	if !idemstore.IsSealedLabel(sealed) || strings.Contains(sealed, label) {
		t.Fatalf("sealed label %q: want the marker and no label in clear", sealed)
	}
	got, err := k.OpenLabel(recKey, sealed)
	if err != nil || got != label {
		t.Fatalf("OpenLabel = %q, %v; want %q", got, err, label)
	}
	// The same label seals differently each time, but keeps one index: a
	// search by its exact value finds every record that carries it.
	again, _ := k.SealLabel(idemstore.Key{Scope: "user-2", Operation: "POST /x", Key: "k-2"}, label)
	if again == sealed {
		t.Fatal("a label sealed twice is the same string: the nonce is not random")
	}
	ix := idemstore.ScopeLabelIndex(sealed)
	if idemstore.ScopeLabelIndex(again) != ix || !slices.Equal(k.ScopeLabelIndexes(label), []string{ix}) {
		t.Fatalf("indexes %q, %q, searched %q: want one", ix, idemstore.ScopeLabelIndex(again), k.ScopeLabelIndexes(label))
	}
	// A search cleans what the operator typed as the engine cleans what
	// it stores.
	if !slices.Equal(k.ScopeLabelIndexes("  "+label+"\n"), []string{ix}) {
		t.Fatal("a label typed with white space around it is searched as another")
	}
	if other := k.ScopeLabelIndexes(label + "0"); slices.Contains(other, ix) {
		t.Fatal("two labels share an index")
	}
	if e, err := k.SealLabel(recKey, ""); e != "" || err != nil {
		t.Fatalf("SealLabel(\"\") = %q, %v; want it empty", e, err)
	}
	if plain, err := k.OpenLabel(recKey, label); plain != label || err != nil {
		t.Fatalf("OpenLabel of a label in clear = %q, %v", plain, err)
	}
}

func TestLabelDoesNotOpen(t *testing.T) {
	t.Parallel()
	k := ring(t, key1)
	sealed, _ := k.SealLabel(recKey, "acct_1")
	other, _ := k.SealLabel(recKey, "acct_2")
	moved := recKey
	moved.Key = "k-2"
	digestOf := func(s string) string { return idemstore.ScopeLabelIndex(s) }
	for name, tc := range map[string]struct {
		ring  *idemseal.Keyring
		key   idemstore.Key
		label string
	}{
		"moved to another key":       {k, moved, sealed},
		"another key's ring":         {ring(t, key2), recKey, sealed},
		"no ring":                    {nil, recKey, sealed},
		"its digest swapped":         {k, recKey, digestOf(other) + sealed[len(digestOf(sealed)):]},
		"cut":                        {k, recKey, sealed[:len(sealed)-4]},
		"no sealed part":             {k, recKey, digestOf(sealed)},
		"not base64url":              {k, recKey, digestOf(sealed) + ":%%%"},
		"a sealed part of an answer": {k, recKey, digestOf(sealed) + ":AQNvbmU"},
	} {
		if got, err := tc.ring.OpenLabel(tc.key, tc.label); !errors.Is(err, idemstore.ErrSealed) {
			t.Errorf("%s: OpenLabel = %q, %v; want ErrSealed", name, got, err)
		}
	}
}

func TestLabelRotation(t *testing.T) {
	t.Parallel()
	old := ring(t, key1)
	sealed, _ := old.SealLabel(recKey, "acct_1")
	rotated := ring(t, key2, key1)
	if got, err := rotated.OpenLabel(recKey, sealed); got != "acct_1" || err != nil {
		t.Fatalf("after a rotation, OpenLabel = %q, %v", got, err)
	}
	ixs := rotated.ScopeLabelIndexes("acct_1")
	if len(ixs) != 2 || !slices.Contains(ixs, idemstore.ScopeLabelIndex(sealed)) {
		t.Fatalf("after a rotation, the indexes searched %q miss the old key's %q", ixs, idemstore.ScopeLabelIndex(sealed))
	}
	fresh, _ := rotated.SealLabel(recKey, "acct_1")
	if idemstore.ScopeLabelIndex(fresh) != ixs[0] {
		t.Fatal("the sealing key's index is not searched first")
	}
}

func TestLabelFitsTheStore(t *testing.T) {
	t.Parallel()
	long := idemseal.Key{ID: strings.Repeat("i", idemseal.MaxIDLength), Secret: secret(3)}
	k := ring(t, long)
	label := idemstore.CleanScopeLabel(strings.Repeat("用", 200))
	sealed, err := k.SealLabel(recKey, label)
	if err != nil {
		t.Fatal(err)
	}
	if len(sealed) > idemstore.MaxStoredScopeLabelLength {
		t.Fatalf("a sealed label of %d bytes under a key ID of %d is %d bytes; stores keep %d", len(label), len(long.ID), len(sealed), idemstore.MaxStoredScopeLabelLength)
	}
	if strings.ContainsAny(sealed[len(idemstore.SealedLabelPrefix):], "\x00\x01") {
		t.Fatal("a sealed label holds control characters past its marker")
	}
}

func TestNilKeyringLabels(t *testing.T) {
	t.Parallel()
	var k *idemseal.Keyring
	if s, err := k.SealLabel(recKey, "acct_1"); s != "acct_1" || err != nil {
		t.Fatalf("a nil Keyring sealed a label: %q, %v", s, err)
	}
	if ixs := k.ScopeLabelIndexes("acct_1"); ixs != nil {
		t.Fatalf("a nil Keyring has indexes %q", ixs)
	}
}
