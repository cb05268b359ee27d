package idem_test

import (
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// hostileBodies are bodies of about 1 MiB (the default body limit) built
// to make the fingerprint slow or big: long runs of members that fold
// alike, nesting at the depth limit with members to reorder at every
// level, a boundary that nearly matches everywhere, escapes that grow.
func hostileBodies() []struct {
	name, ct, body string
	opts           idem.FingerprintOptions
} {
	const size = 1 << 20
	var twins strings.Builder
	twins.WriteString(`{"a":0`)
	for twins.Len() < size-16 {
		twins.WriteString(`,"a":1,"A":2`)
	}
	twins.WriteString("}")

	const depth = 512 // the deepest that still canonicalises
	deep := strings.Repeat(`{"b":`, depth) + `"` + strings.Repeat("x", size-depth*16) + `"` + strings.Repeat(`,"a":1}`, depth)

	var many strings.Builder
	many.WriteString("{")
	for i := 0; many.Len() < size-32; i++ {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`"k` + strings.Repeat("z", i%7) + string(rune('z'-i%26)) + `_` + string(rune('A'+i%26)) + `":1`)
	}
	many.WriteString("}")

	boundary := strings.Repeat("a", 69) + "b"
	nearly := strings.Repeat(strings.Repeat("a", 69)+"c", size/70)
	var parts strings.Builder
	for parts.Len() < size-16 {
		parts.WriteString("--x\r\n\r\n1\r\n")
	}
	parts.WriteString("--x--\r\n")

	return []struct {
		name, ct, body string
		opts           idem.FingerprintOptions
	}{
		{"twins", "application/json", twins.String(), idem.FingerprintOptions{}},
		{"twins excluded", "application/json", twins.String(), idem.FingerprintOptions{ExcludeFields: []string{"/a"}}},
		{"twins included", "application/json", twins.String(), idem.FingerprintOptions{IncludeFields: []string{"/a"}}},
		{"deep, reordered at every level", "application/json", deep, idem.FingerprintOptions{}},
		{"many members", "application/json", many.String(), idem.FingerprintOptions{}},
		{"many members excluded", "application/json", many.String(), idem.FingerprintOptions{ExcludeFields: []string{"/kza_A"}}},
		{"escapes that grow", "application/json", `"` + strings.Repeat(`\t`, size/2) + `"`, idem.FingerprintOptions{}},
		{"array of nulls to be", "application/json", "[" + strings.Repeat("0,", size/2) + "0]", idem.FingerprintOptions{IncludeFields: []string{"/0"}}},
		{"multipart, boundary nearly everywhere", "multipart/form-data; boundary=" + boundary, nearly, idem.FingerprintOptions{}},
		{"multipart, tiny parts", "multipart/form-data; boundary=x", parts.String(), idem.FingerprintOptions{}},
		{"query-like form", "application/x-www-form-urlencoded", strings.Repeat("%41=%2b&", size/8), idem.FingerprintOptions{}},
	}
}

// TestFingerprintHostileBodies: each hostile body fingerprints, the same
// every time, and means what it should. (BenchmarkFingerprintHostile
// measures them.)
func TestFingerprintHostileBodies(t *testing.T) {
	t.Parallel()
	for _, c := range hostileBodies() {
		in := idem.FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: c.ct, Body: []byte(c.body)}
		if a, b := mustFingerprint(t, in, c.opts), mustFingerprint(t, in, c.opts); a != b {
			t.Errorf("%s: two fingerprints, %s and %s", c.name, a, b)
		}
	}
	bodies := hostileBodies()
	// All "a" excluded: every "A" counts and keeps its place among them.
	out, err := idem.CanonicalJSON(nil, []byte(bodies[1].body), []string{"/a"})
	if err != nil || !strings.HasPrefix(string(out), `{"a":null,"a":null,"A":2,"a":null,"A":2`) {
		t.Errorf("twins excluded: %.60s, %v", out, err)
	}
	// One level deeper than the limit counts byte for byte, without error.
	deeper := `{"b":` + bodies[3].body + `}`
	if _, err := idem.CanonicalJSON(nil, []byte(deeper), nil); err == nil {
		t.Error("JSON nested past the limit canonicalised")
	}
	fpOf(t, "application/json", "", deeper)
}

// BenchmarkFingerprintHostile measures the hostile bodies of
// TestFingerprintHostileBodies.
func BenchmarkFingerprintHostile(b *testing.B) {
	for _, c := range hostileBodies() {
		in := idem.FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: c.ct, Body: []byte(c.body)}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(in.Body)))
			for i := 0; i < b.N; i++ {
				if _, err := idem.Fingerprint(in, c.opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
