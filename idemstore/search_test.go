package idemstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem/idemstore"
)

func TestPrefixEnd(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		prefix, end string
		ok          bool
	}{
		{"", "", false},
		{"a", "b", true},
		{"order-1", "order-2", true},
		{"a~", "a\x7f", true},
		{"a\xff", "b", true},
		{"\xff\xff", "", false},
		{"é", "\xc3\xaa", true},
	} {
		end, ok := idemstore.PrefixEnd(c.prefix)
		if end != c.end || ok != c.ok {
			t.Errorf("PrefixEnd(%q) = %q, %v; want %q, %v", c.prefix, end, ok, c.end, c.ok)
		}
	}
}

func TestRunePrefixEnd(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		prefix, end string
		ok          bool
	}{
		{"", "", false},
		{"a", "b", true},
		{"a\x7f", "a\u0080", true},
		{"é", "ê", true},
		{"a\ud7ff", "a\ue000", true}, // past the surrogates
		{"a\U0010FFFF", "b", true},
		{"\U0010FFFF", "", false},
	} {
		end, ok := idemstore.RunePrefixEnd(c.prefix)
		if end != c.end || ok != c.ok || (ok && !utf8.ValidString(end)) {
			t.Errorf("RunePrefixEnd(%q) = %q, %v; want %q, %v (valid UTF-8)", c.prefix, end, ok, c.end, c.ok)
		}
		// Every string that starts with the prefix sorts before the end.
		if ok {
			for _, tail := range []string{"", "\U0010FFFF", "zzz", "\x7f"} {
				if s := c.prefix + tail; s >= end {
					t.Errorf("RunePrefixEnd(%q) = %q, not above %q", c.prefix, end, s)
				}
			}
		}
	}
}

func TestCleanScopeLabel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"acct_1", "acct_1"},
		{"  acct_1\r\n", "acct_1"},
		{"a\x00b\x1bc\x7fd", "a\uFFFDb\uFFFDc\uFFFDd"},
		{"a\xffb", "a\uFFFDb"},
		{"a\u2028b\u0085c", "a\uFFFDb\uFFFDc"},
		{"用户 42", "用户 42"},
		{idemstore.SealedLabelPrefix + "x:y", "\uFFFDidem-sealed:x:y"},
	} {
		if got := idemstore.CleanScopeLabel(c.in); got != c.want {
			t.Errorf("CleanScopeLabel(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	for _, in := range []string{strings.Repeat("a", 10<<10), strings.Repeat("é", 200), strings.Repeat("\x00", 1000)} {
		got := idemstore.CleanScopeLabel(in)
		if len(got) > idemstore.MaxScopeLabelLength || !utf8.ValidString(got) || idemstore.IsSealedLabel(got) {
			t.Errorf("CleanScopeLabel of %d bytes = %d bytes, valid UTF-8 %v", len(in), len(got), utf8.ValidString(got))
		}
	}
}

func TestScopeLabelIndex(t *testing.T) {
	t.Parallel()
	p := idemstore.SealedLabelPrefix
	for in, want := range map[string]string{
		"":                 "",
		"acct:1":           "acct:1",
		p + "k1.abc:blob":  p + "k1.abc",
		p + "k1.abc:b:lob": p + "k1.abc",
		p + "nocolon":      p + "nocolon",
	} {
		if got := idemstore.ScopeLabelIndex(in); got != want {
			t.Errorf("ScopeLabelIndex(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTimeCursor(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 3, 0, 0, 123456789, time.UTC)
	k := idemstore.Key{Scope: "s\x00", Operation: "POST /x", Key: "k~"}
	c := idemstore.EncodeTimeCursor(at, k)
	gotAt, gotK, err := idemstore.DecodeTimeCursor(c)
	if err != nil || !gotAt.Equal(at) || gotK != k {
		t.Fatalf("DecodeTimeCursor = %v, %v, %v", gotAt, gotK, err)
	}
	for _, bad := range []string{"", "!!", idemstore.EncodeKeyCursor(k), c[:len(c)-2], c + "AA"} {
		if _, _, err := idemstore.DecodeTimeCursor(bad); !errors.Is(err, idemstore.ErrBadCursor) {
			t.Errorf("DecodeTimeCursor(%q): %v, want ErrBadCursor", bad, err)
		}
	}
	p := idemstore.ListParams{Order: idemstore.OrderNewest, Cursor: c}
	if cur, err := p.DecodeCursor(); err != nil || cur.Key != k || !cur.CreatedAt.Equal(at) {
		t.Fatalf("ListParams.DecodeCursor = %+v, %v", cur, err)
	}
}

func TestListParamsChecks(t *testing.T) {
	t.Parallel()
	if (idemstore.ListParams{State: idemstore.StateNeedsReview, Operation: "x"}).Searches() {
		t.Error("a listing by state and operation searches")
	}
	for _, p := range []idemstore.ListParams{{Key: "k"}, {KeyPrefix: "k"}, {ScopeLabels: []string{"l"}}, {OlderThan: time.Second}, {Reason: "r"}, {Order: idemstore.OrderOldest}} {
		if !p.Searches() {
			t.Errorf("%+v does not search", p)
		}
	}
	for _, p := range []idemstore.ListParams{{State: "done"}, {Order: 7}, {OlderThan: -1}, {ScopeLabels: make([]string, idemstore.MaxScopeLabels+1)}} {
		if p.Check() == nil {
			t.Errorf("Check(%+v) passed", p)
		}
	}
	for _, p := range []idemstore.ListParams{{Key: "a\x00"}, {KeyPrefix: "\xc3"}, {Key: strings.Repeat("k", idemstore.MaxKeyLength+1)}} {
		if !p.MatchesNothing() {
			t.Errorf("%q matches something", p.Key+p.KeyPrefix)
		}
	}
	if (idemstore.ListParams{Key: strings.Repeat("k", idemstore.MaxKeyLength), KeyPrefix: "é"}).MatchesNothing() {
		t.Error("a valid key matches nothing")
	}
}
