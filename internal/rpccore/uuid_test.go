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
	check := func(s string) {
		t.Helper()
		ok, upper := uuidForm(s)
		wantOK, wantUpper := uuidFormSlow(s)
		if ok != wantOK || (ok && upper != wantUpper) {
			t.Fatalf("uuidForm(%q) = %v, %v; want %v, %v", s, ok, upper, wantOK, wantUpper)
		}
		if isUUID(s) != wantOK {
			t.Fatalf("isUUID(%q) = %v, want %v", s, !wantOK, wantOK)
		}
		want := s
		if wantOK && wantUpper {
			want = strings.ToLower(s)
		}
		if got := canonicalKey(s); got != want {
			t.Fatalf("canonicalKey(%q) = %q, want %q", s, got, want)
		}
	}
	accepted := 0
	for _, seed := range seeds {
		check(seed)
		for i := 0; i <= len(seed); i++ {
			if i < len(seed) {
				check(seed[:i] + seed[i+1:])
				for c := range 256 {
					s := seed[:i] + string([]byte{byte(c)}) + seed[i+1:]
					check(s)
					if ok, _ := uuidFormSlow(s); ok {
						accepted++
					}
				}
			}
			check(seed[:i] + "a" + seed[i:])
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
