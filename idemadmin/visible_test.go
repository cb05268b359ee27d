package idemadmin_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/idem-dev/idem/idemadmin"
)

func TestVisible(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"order-1", "order-1"},
		{"", ""},
		{"POST /pay\n", `POST /pay\n`},
		{"a\x1b[31mred", `a\x1b[31mred`},
		{"tab\there", `tab\there`},
		{"del\x7f", `del\x7f`},
		{"bidi\u202eevil", `bidi\u202eevil`},
		{"zero\u200bwidth", `zero\u200bwidth`},
		{"line\u2028sep", `line\u2028sep`},
		{"bad\xffutf8", `bad\xffutf8`},
		{`back\slash`, `back\\slash`},
		{"café ✓", "café ✓"},
		{"<b>&", "<b>&"}, // HTML is the page's business, not the terminal's
	} {
		if got := idemadmin.Visible(tc.in); got != tc.want {
			t.Errorf("Visible(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	good := []struct {
		in   string
		want map[string]string
	}{
		{"0123456789abcdef0123\n", map[string]string{"admin": "0123456789abcdef0123"}},
		{"# ops team\nalice:0123456789abcdef0123\n\nbob:fedcba9876543210fedc\n", map[string]string{"alice": "0123456789abcdef0123", "bob": "fedcba9876543210fedc"}},
		{"ci-bot@example:abc:0123456789abcdef", map[string]string{"ci-bot@example": "abc:0123456789abcdef"}},
		{"  spaced:0123456789abcdef0123  \r\n", map[string]string{"spaced": "0123456789abcdef0123"}},
	}
	for _, tc := range good {
		got, err := idemadmin.ParseTokens(tc.in)
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("ParseTokens(%q) = %v, %v", tc.in, got, err)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("ParseTokens(%q)[%s] = %q, want %q", tc.in, k, got[k], v)
			}
		}
	}
	for _, in := range []string{
		"",
		"# only a comment\n",
		"short",
		"alice:short",
		"alice:0123456789abcdef0123\nalice:fedcba9876543210fedc",
		"alice:0123456789abcdef0123\nbob:0123456789abcdef0123",
		"alice:0123456789 abcdef0123",
		"alice:0123456789abcdef\x01",
	} {
		if got, err := idemadmin.ParseTokens(in); err == nil {
			t.Errorf("ParseTokens(%q) = %v, want an error", in, got)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for name, cfg := range map[string]idemadmin.Config{
		"no store":    {Tokens: map[string]string{"ops": opsToken}},
		"no token":    {Store: f.store},
		"short token": {Store: f.store, Tokens: map[string]string{"ops": "short"}},
		"bad name":    {Store: f.store, Tokens: map[string]string{"o p": opsToken}},
	} {
		if _, err := idemadmin.New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}

func TestVisibleJSON(t *testing.T) {
	t.Parallel()
	in, err := json.MarshalIndent(map[string]string{"path": "/a\u009b31m\u202eb\x7fc\tü"}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	out := idemadmin.VisibleJSON(in)
	for _, raw := range []string{"\u009b", "\u202e", "\x7f"} {
		if bytes.Contains(out, []byte(raw)) {
			t.Errorf("%q is raw in %s", raw, out)
		}
	}
	var back map[string]string
	if err := json.Unmarshal(out, &back); err != nil || back["path"] != "/a\u009b31m\u202eb\x7fc\tü" {
		t.Fatalf("not the same value: %q, %v (%s)", back["path"], err, out)
	}
	if plain := []byte(`{"a": "b"}`); &idemadmin.VisibleJSON(plain)[0] != &plain[0] {
		t.Error("text with nothing to escape was copied")
	}
}
