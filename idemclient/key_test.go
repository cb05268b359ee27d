package idemclient_test

import (
	"net/http"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
)

func TestKeyFrom(t *testing.T) {
	t.Parallel()
	k := idemclient.KeyFrom("pay-invoice", "in_42")
	if k != idemclient.KeyFrom("pay-invoice", "in_42") {
		t.Fatal("KeyFrom is not deterministic")
	}
	u, err := uuid.Parse(k)
	if err != nil || u.Version() != 8 || u.Variant() != uuid.RFC4122 || idem.ValidateKey(k) != nil {
		t.Fatalf("KeyFrom = %q: version %v, variant %v, %v", k, u.Version(), u.Variant(), err)
	}
	// Length prefixes keep the parts apart.
	distinct := map[string][]string{}
	for _, parts := range [][]string{
		{"ab", "c"}, {"a", "bc"}, {"abc"}, {"a", "b", "c"}, {"abc", ""}, {"", "abc"}, {}, {""}, {"", ""},
	} {
		k := idemclient.KeyFrom(parts...)
		if prev, ok := distinct[k]; ok {
			t.Fatalf("KeyFrom(%q) = KeyFrom(%q)", parts, prev)
		}
		distinct[k] = parts
	}
}

func TestNewKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		k := idemclient.NewKey()
		u, err := uuid.Parse(k)
		if err != nil || u.Version() != 7 || seen[k] {
			t.Fatalf("NewKey = %q (%v)", k, err)
		}
		seen[k] = true
	}
}

func TestReplayedAndKeyOfNil(t *testing.T) {
	t.Parallel()
	if idemclient.Replayed(nil) || idemclient.KeyOf(nil) != "" || idemclient.KeyOf(&http.Response{}) != "" {
		t.Fatal("nil responses")
	}
	if !idemclient.Replayed(&http.Response{Header: http.Header{"Idempotent-Replayed": {" TRUE"}}}) {
		t.Fatal("Replayed is not case-insensitive")
	}
	if idemclient.Replayed(&http.Response{Header: http.Header{"Idempotent-Replayed": {"false"}}}) {
		t.Fatal("Replayed: false")
	}
}
