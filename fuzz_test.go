package idem_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idem-dev/idem"
)

func FuzzParseKeyHeader(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, "a,b", "", " ", "\x00", "é", `"`, `"\`, `"a";b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := idem.ParseKeyHeader([]string{v})
		if err != nil {
			return
		}
		if err := idem.ValidateKey(k); err != nil {
			t.Fatalf("ParseKeyHeader(%q) = %q, which ValidateKey refuses: %v", v, k, err)
		}
		// A valid key sent back as an sf-string means the same; so does a
		// bare token, unless it starts with a quote (then it is an sf-string).
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		if k2, err := idem.ParseKeyHeader([]string{quoted}); err != nil || k2 != k {
			t.Fatalf("quoted %q reparsed as %q, %v", quoted, k2, err)
		}
		if k[0] != '"' && !strings.Contains(k, ",") {
			if k2, err := idem.ParseKeyHeader([]string{k}); err != nil || k2 != k {
				t.Fatalf("bare %q reparsed as %q, %v", k, k2, err)
			}
		}
	})
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1,2.50,{"c":null}]}`, `"\u00e9"`, `1e-7`, `[]`, `{"a":{"a":{"a":1}}}`, `-0`, `"\ud83d\ude00"`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c1, err := idem.CanonicalJSON(nil, in, nil)
		if err != nil {
			return
		}
		// Stable: canonicalising again gives the same bytes.
		c2, err := idem.CanonicalJSON(nil, c1, nil)
		if err != nil {
			t.Fatalf("canonical form %q does not parse: %v", c1, err)
		}
		if string(c1) != string(c2) {
			t.Fatalf("not stable: %q -> %q -> %q", in, c1, c2)
		}
		if !utf8.Valid(c1) {
			t.Fatalf("canonical form is not UTF-8: %q", c1)
		}
		// Whatever the canonicaliser accepts, encoding/json accepts too.
		if !json.Valid(in) {
			t.Fatalf("accepted invalid JSON %q", in)
		}
		// Same meaning, same form: encoding/json (numbers kept as written)
		// re-spells the text with sorted members and no whitespace.
		if containsDuplicateNames(in) {
			return // encoding/json keeps only the last duplicate
		}
		dec := json.NewDecoder(bytes.NewReader(in))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("encoding/json cannot decode %q: %v", in, err)
		}
		re, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		c3, err := idem.CanonicalJSON(nil, re, nil)
		if err != nil {
			t.Fatalf("re-encoding %q does not canonicalise: %v", re, err)
		}
		if string(c3) != string(c1) {
			t.Fatalf("%q and its re-encoding %q canonicalise differently: %q vs %q", in, re, c1, c3)
		}
	})
}

func containsDuplicateNames(in []byte) bool {
	var walk func(d *json.Decoder) bool
	walk = func(d *json.Decoder) bool {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for d.More() {
				k, _ := d.Token()
				ks, _ := k.(string)
				if seen[ks] {
					return true
				}
				seen[ks] = true
				if walk(d) {
					return true
				}
			}
			_, _ = d.Token()
		case json.Delim('['):
			for d.More() {
				if walk(d) {
					return true
				}
			}
			_, _ = d.Token()
		}
		return false
	}
	return walk(json.NewDecoder(bytes.NewReader(in)))
}
