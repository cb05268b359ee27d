package rpccore

import (
	"strings"
	"testing"
)

// uuidFormSlow is uuidForm written out plainly, byte by byte.
func uuidFormSlow(s string) (ok, upper bool) {
	if len(s) != 36 {
		return false, false
	}
	zero := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false, false
			}
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
			zero = zero && c == '0'
		case c >= 'A' && c <= 'F':
			zero, upper = false, true
		default:
			return false, false
		}
	}
	return !zero, upper
}

// checkUUIDForm fails unless uuidForm and canonicalKey agree with
// uuidFormSlow on s. uuidForm's upper is compared only for UUIDs: for
// other strings nothing reads it.
func checkUUIDForm(t testing.TB, s string) {
	t.Helper()
	wantOK, wantUpper := uuidFormSlow(s)
	ok, upper := uuidForm(s)
	if ok != wantOK || (ok && upper != wantUpper) {
		t.Fatalf("uuidForm(%q) = %v, %v; want %v, %v", s, ok, upper, wantOK, wantUpper)
	}
	want := s
	if wantOK && wantUpper {
		want = strings.ToLower(s)
	}
	got := canonicalKey(s)
	if got != want {
		t.Fatalf("canonicalKey(%q) = %q, want %q", s, got, want)
	}
	// canonicalKey changes nothing but the case of a UUID's digits, and
	// is idempotent.
	if len(got) != len(s) || (!wantOK && got != s) || canonicalKey(got) != got {
		t.Fatalf("canonicalKey(%q) = %q: not a canonical form", s, got)
	}
	if wantOK && got != strings.ToLower(s) {
		t.Fatalf("canonicalKey(%q) = %q, want it in lower case", s, got)
	}
}

// TestUUIDForm checks uuidForm against uuidFormSlow on UUIDs and on every
// string one byte away from them: each byte replaced by each of the 256,
// one byte dropped, one added.
func TestUUIDForm(t *testing.T) {
	seeds := []string{
		"0190a0e0-0000-7000-8000-000000000001",
		"00000000-0000-0000-0000-000000000000", // the nil UUID: refused
		"6BA7B810-9DAD-11D1-80B4-00C04FD430C8",
		"6ba7b810-9dad-11d1-80b4-00c04fd430c8",
		"ffffffff-ffff-ffff-ffff-ffffffffffff",
		"0000000000000000000000000000000000000", // 37 bytes, no dashes
		"",
	}
	accepted := 0
	for _, seed := range seeds {
		checkUUIDForm(t, seed)
		for i := 0; i <= len(seed); i++ {
			if i < len(seed) {
				checkUUIDForm(t, seed[:i]+seed[i+1:])
				for c := range 256 {
					s := seed[:i] + string([]byte{byte(c)}) + seed[i+1:]
					checkUUIDForm(t, s)
					if ok, _ := uuidFormSlow(s); ok {
						accepted++
					}
				}
			}
			checkUUIDForm(t, seed[:i]+"a"+seed[i:])
		}
	}
	// The mutations must have reached both answers, not one only.
	if accepted == 0 {
		t.Fatal("no mutated string was a UUID")
	}
	if ok, upper := uuidForm(seeds[2]); !ok || !upper {
		t.Fatalf("uuidForm(%q) = %v, %v; want true, true", seeds[2], ok, upper)
	}
	if ok, _ := uuidForm(seeds[1]); ok {
		t.Fatal("the nil UUID was accepted")
	}
}
