package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// hexDigest writes what hex.Encode writes, for every byte value in every
// position.
func TestHexDigestIsHexEncode(t *testing.T) {
	for start := 0; start < 256; start++ {
		var d [sha256.Size]byte
		for i := range d {
			d[i] = byte(start + i)
		}
		var got [2 * sha256.Size]byte
		hexDigest(&got, &d)
		if want := hex.EncodeToString(d[:]); string(got[:]) != want {
			t.Fatalf("hexDigest(%x) = %s, want %s", d, got, want)
		}
	}
}
