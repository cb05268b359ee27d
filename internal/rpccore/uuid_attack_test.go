package rpccore

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// uuidAttackSeeds are strings near the edge of a UUID's text form: the
// nil UUID and near-nil ones, every case, bytes >= 0x80 and invalid UTF-8
// in a digit's or a dash's place, multi-byte runes that keep the length
// at 36, and lengths 35, 36 and 37.
var uuidAttackSeeds = []string{
	"",
	"-",
	"0190a0e0-0000-7000-8000-000000000001",
	"0190A0E0-0000-7000-8000-00000000ABCD",
	"6BA7B810-9DAD-11D1-80B4-00C04FD430C8",
	"6ba7b810-9dad-11d1-80b4-00c04fd430c8",
	"6Ba7b810-9dAd-11d1-80B4-00c04fD430c8",
	"ffffffff-ffff-ffff-ffff-ffffffffffff",
	"FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
	"00000000-0000-0000-0000-000000000000",  // nil: refused
	"00000000-0000-0000-0000-000000000001",  // one digit not zero
	"10000000-0000-0000-0000-000000000000",  // the first digit
	"00000000-0000-0000-0000-00000000000A",  // upper, the last digit
	"00000000-0000-0000-0000-00000000000a",  // lower, the last digit
	"00000000-0000-0000-0000-0000000000000", // 37 bytes
	"00000000-0000-0000-0000-00000000001",   // 35 bytes
	"0190a0e0-0000-7000-8000-0000000000011", // 37 bytes, a UUID and one more
	"0190a0e0-0000-7000-8000-00000000001",   // 35 bytes
	"0190a0e0-0000-7000-8000-00000000000\x00",
	"0190a0e0-0000-7000-8000-00000000000\x80",
	"0190a0e0-0000-7000-8000-00000000000\xff",
	"0190a0e0-0000-7000-8000-0000000000\xe2\x80",   // a 3-byte rune cut off
	"0190a0e0-0000-7000-8000-00000000\u00e9\u00e9", // two é: 36 bytes, 34 runes
	"0190a0e0-0000-7000-8000-0000000000\xc3\xa9",   // é: 36 bytes, 35 runes
	"0190a0e0\u2010000-7000-8000-00000000001",      // U+2010 HYPHEN for a dash, a digit less
	"\uff10190a0e0-0000-7000-8000-0000000001",      // U+FF10 FULLWIDTH DIGIT ZERO, two digits less
	"0190a0e0-0000-7000-8000-0000000000\xc0\xb1",   // overlong '1', invalid UTF-8
	"0190a0e0-0000-7000-8000-00000000000\xb1",      // '1' | 0x80
	"0190a0e0-0000-7000-8000-00000000000\xc1",      // 'A' | 0x80
	"0190a0e0-0000-7000-8000-00000000000\xe1",      // 'a' | 0x80
	"0190a0e0\xad0000-7000-8000-000000000001",      // '-' | 0x80
	"0190a0e0-0000-7000-8000-00000000000G",
	"0190a0e0-0000-7000-8000-00000000000g",
	"0190a0e0-0000-7000-8000-00000000000@",
	"0190a0e0-0000-7000-8000-00000000000`",
	"0190a0e0-0000-7000-8000-00000000000/",
	"0190a0e0-0000-7000-8000-00000000000:",
	"0190a0e0-0000-7000-8000-00000000000-",
	"0190a0e0+0000-7000-8000-000000000001",
	"0190a0e00000-7000-8000-0000000000001-", // a dash moved
	"-0190a0e0-0000-7000-8000-00000000001",
	"0190a0e0-0000-7000-8000-000000000001-",
	"{0190a0e0-0000-7000-8000-00000000001}",
	"0190a0e000007000800000000000000000001", // 37 bytes, no dashes
	"0190a0e00000700080000000000000000001",  // 36 bytes, no dashes
	"urn:uuid:0190a0e0-0000-7000-8000-00000",
	strings.Repeat("-", 36),
	strings.Repeat("0", 36),
	strings.Repeat("\x00", 36),
	strings.Repeat("\xff", 36),
	strings.Repeat("\x80", 36),
	strings.Repeat("é", 18),
}

// FuzzUUIDForm compares uuidForm and canonicalKey with the byte-by-byte
// reading (uuidFormSlow), on any string. Its seeds run
// as a regular test.
func FuzzUUIDForm(f *testing.F) {
	for _, s := range uuidAttackSeeds {
		f.Add(s)
		// The seed with every byte's high bit set, and with upper-case
		// hex: the table must not read c and c|0x80, or c and c&^0x20,
		// alike.
		b := []byte(s)
		for i := range b {
			b[i] |= 0x80
		}
		f.Add(string(b))
		f.Add(strings.ToUpper(s))
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkUUIDForm(t, s)
		// The same string cut or padded to 36 bytes, so that the fuzzer's
		// inputs of any length reach the table.
		switch {
		case len(s) > 36:
			checkUUIDForm(t, s[:36])
		case len(s) < 36:
			checkUUIDForm(t, s+"0190a0e0-0000-7000-8000-000000000001"[len(s):])
		}
	})
}

// TestUUIDFormSeedLengths makes sure the seeds reach what they are for:
// the multi-byte and invalid UTF-8 ones are 36 bytes, and some seeds are
// accepted, some refused.
func TestUUIDFormSeedLengths(t *testing.T) {
	var n36, multi, invalid, accepted int
	for _, s := range uuidAttackSeeds {
		if len(s) != 36 {
			continue
		}
		n36++
		if !utf8.ValidString(s) {
			invalid++
		} else if utf8.RuneCountInString(s) < 36 {
			multi++
		}
		if ok, _ := uuidFormSlow(s); ok {
			accepted++
		}
	}
	if multi < 3 || invalid < 5 || accepted < 5 || accepted == n36 {
		t.Fatalf("36-byte seeds: %d, with multi-byte runes %d, invalid UTF-8 %d, accepted %d", n36, multi, invalid, accepted)
	}
}

// TestUUIDFormNearNil: the all-zero check. Every string that is the nil
// UUID but for one or two digits, each set to every byte, is accepted
// exactly when the digits set are hex and one is not '0'.
func TestUUIDFormNearNil(t *testing.T) {
	nilUUID := []byte("00000000-0000-0000-0000-000000000000")
	digits := uuidDigitAt
	// Pairs: the first and last digits, digits either side of each dash,
	// and two in the middle.
	pairs := [][2]int{{0, 35}, {7, 9}, {12, 14}, {17, 19}, {22, 24}, {30, 31}}
	for _, p := range pairs {
		for a := range 256 {
			for b := range 256 {
				s := append([]byte(nil), nilUUID...)
				s[p[0]], s[p[1]] = byte(a), byte(b)
				checkUUIDForm(t, string(s))
			}
		}
	}
	// Every digit alone set to '1', 'a' and 'A': a UUID, not nil.
	for _, i := range digits {
		for _, c := range []byte("1aA") {
			s := append([]byte(nil), nilUUID...)
			s[i] = c
			if ok, _ := uuidForm(string(s)); !ok {
				t.Fatalf("uuidForm(%q) = false", s)
			}
			checkUUIDForm(t, string(s))
		}
	}
}

// TestUUIDFormRandom: many 36-byte strings, each byte drawn from hex
// digits, '-', their neighbours in ASCII and bytes >= 0x80, with the
// dashes mostly in place, from a fixed seed.
func TestUUIDFormRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("0000000000123456789abcdefABCDEF-/:@G`g\x00\x7f\x80\xb0\xc1\xe1\xff")
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	accepted := 0
	buf := make([]byte, 37)
	for range n {
		ln := 35 + r.IntN(3)
		b := buf[:ln]
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
			if (i == 8 || i == 13 || i == 18 || i == 23) && r.IntN(8) != 0 {
				b[i] = '-'
			}
			if r.IntN(3) == 0 && i != 8 && i != 13 && i != 18 && i != 23 {
				b[i] = "0123456789abcdefABCDEF"[r.IntN(22)]
			}
		}
		s := string(b)
		if ok, _ := uuidFormSlow(s); ok {
			accepted++
		}
		checkUUIDForm(t, s)
	}
	if accepted == 0 {
		t.Fatal("no random string was a UUID")
	}
}

// TestSameKeyUUIDCase: SameKey, which the client interceptors use, reads
// a UUID in any case as one key, and any other key byte for byte.
func TestSameKeyUUIDCase(t *testing.T) {
	id := "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{id, strings.ToUpper(id), true},
		{strings.ToUpper(id), id, true},
		{"6Ba7b810-9dAd-11d1-80B4-00c04fD430c8", strings.ToUpper(id), true},
		{" " + strings.ToUpper(id) + " ", id, true},
		{`"` + strings.ToUpper(id) + `"`, id, true},
		{strings.ToUpper(id) + "0", id + "0", false}, // 37 bytes: not a UUID
		{"00000000-0000-0000-0000-00000000000A", "00000000-0000-0000-0000-00000000000a", true},
		{"0000000G-0000-0000-0000-00000000000A", "0000000g-0000-0000-0000-00000000000a", false},
		{"ABC", "abc", false},
	} {
		if got := SameKey(tc.a, tc.b); got != tc.same {
			t.Errorf("SameKey(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}
