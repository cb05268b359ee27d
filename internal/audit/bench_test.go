package audit

import (
	"fmt"
	"strings"
	"testing"
)

// benchDoc is a YAML document with n paths, each with a GET and a POST
// (every fourth POST protected).
func benchDoc(n int) []byte {
	var b strings.Builder
	b.WriteString("openapi: 3.0.3\ninfo: {title: bench, version: \"1\"}\npaths:\n")
	for i := range n {
		fmt.Fprintf(&b, "  /resources%d/{id}/payments:\n    get:\n      operationId: list%d\n      responses: {\"200\": {description: ok}}\n    post:\n      operationId: create%d\n      summary: Create a thing\n", i, i, i)
		if i%4 == 0 {
			b.WriteString("      parameters: [{$ref: '#/components/parameters/K'}]\n")
		}
		b.WriteString("      responses: {\"201\": {description: ok}}\n")
	}
	b.WriteString("components:\n  parameters:\n    K: {name: Idempotency-Key, in: header, required: true, schema: {type: string}}\n")
	return []byte(b.String())
}

// BenchmarkAudit parses and audits a document of 1,000 operations.
func BenchmarkAudit(b *testing.B) {
	data := benchDoc(500)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		d, err := Parse(b.Context(), data, "bench", Options{})
		if err != nil {
			b.Fatal(err)
		}
		if fs, err := d.Audit(); err != nil || len(fs) != 1000 {
			b.Fatal(len(fs), err)
		}
	}
}

// BenchmarkFix fixes the same document (and audits the copy, as Fix does).
func BenchmarkFix(b *testing.B) {
	d, err := Parse(b.Context(), benchDoc(500), "bench", Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, n, err := d.Fix(b.Context(), FixOptions{}); err != nil || n != 500 {
			b.Fatal(n, err)
		}
	}
}

// BenchmarkDecode measures and decodes the same document into its node
// tree, the step that bounds it, without kin-openapi's model.
func BenchmarkDecode(b *testing.B) {
	data := benchDoc(500)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := newBudget(Options{}.withDefaults()).decode("bench", data); err != nil {
			b.Fatal(err)
		}
	}
}
