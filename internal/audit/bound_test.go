package audit

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"go.yaml.in/yaml/v3"
)

const boundHead = "openapi: 3.1.0\ninfo: {title: t, version: \"1\"}\npaths:\n  /orders:\n    post: {responses: {\"201\": {description: ok}}}\n"

// TestBoundedByExpansion: what a document expands to is bounded, not only
// its size: each hostile shape under the byte limit is refused by a node,
// depth or key limit before a node tree is built, and a document at a
// limit still loads (and its fixed copy still verifies).
func TestBoundedByExpansion(t *testing.T) {
	t.Parallel()
	laughs := "x-a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
	for i := 1; i < 10; i++ {
		p, n := "a"+string(rune('0'+i-1)), "a"+string(rune('0'+i))
		laughs += "x-" + n + ": &" + n + " [" + strings.TrimSuffix(strings.Repeat("*"+p+", ", 10), ", ") + "]\n"
	}
	merges := "x-m0: &m0 {k: v}\n"
	for i := 1; i < 10; i++ {
		p, n := "m"+string(rune('0'+i-1)), "m"+string(rune('0'+i))
		merges += "x-" + n + ": &" + n + " {<<: [" + strings.TrimSuffix(strings.Repeat("*"+p+", ", 10), ", ") + "]}\n"
	}
	jsonHead := `{"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {}, `
	for _, tc := range []struct {
		name, doc string
		want      error
	}{
		// The default limits: 600,001 nodes of "- [a]" are 3.6 MB.
		{"a long list of tiny sequences", boundHead + "x-junk:\n" + strings.Repeat("  - [a]\n", DefaultMaxNodes/2), errTooManyNodes},
		{"a long flow sequence", boundHead + "x-junk: [" + strings.Repeat("a,", DefaultMaxNodes) + "a]\n", errTooManyNodes},
		{"billion laughs", boundHead + laughs, errTooManyNodes},
		{"a merge-key bomb", boundHead + merges, errTooManyNodes},
		{"a long list in UTF-16", "\xff\xfe" + utf16le(boundHead+"x-junk:\n"+strings.Repeat("  - [a]\n", DefaultMaxNodes/2)), errTooManyNodes},
		{"deep flow nesting", boundHead + "x-deep: " + strings.Repeat("[", DefaultMaxDepth) + strings.Repeat("]", DefaultMaxDepth) + "\n", errTooDeep},
		{"deep block nesting", boundHead + "x-deep:\n" + strings.Repeat("- ", DefaultMaxDepth) + "a\n", errTooDeep},
		{"a mapping of many keys", boundHead + "x-keys:\n" + manyKeys(10_000), errTooManyKeys},
		{"JSON: many nodes", jsonHead + `"x-junk": [` + strings.Repeat("[],", DefaultMaxNodes) + `[]]}`, errTooManyNodes},
		{"JSON: deep", jsonHead + `"x-deep": ` + strings.Repeat("[", DefaultMaxDepth) + strings.Repeat("]", DefaultMaxDepth) + `}`, errTooDeep},
		{"JSON: many keys", jsonHead + `"x-keys": {` + jsonKeys(10_000) + `}}`, errTooManyKeys},
		{"JSON that is YAML: many nodes", `{openapi: 3.1.0, x-junk: [` + strings.Repeat("a,", DefaultMaxNodes) + `a]}`, errTooManyNodes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			doc := tc.doc
			if int64(len(doc)) > DefaultMaxBytes {
				t.Fatalf("the document is %d bytes, over the byte limit", len(doc))
			}
			_, err := Parse(t.Context(), []byte(doc), "hostile", Options{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}

	// At the limits, a document loads, and its fixed copy verifies (the
	// fix adds nodes and levels of its own).
	at := boundHead + "x-junk:\n" + strings.Repeat("  - [a]\n", 100)
	d, err := Parse(t.Context(), []byte(at), "at the limit", Options{MaxNodes: nodesOf(t, at), MaxDepth: 6})
	if err != nil {
		t.Fatalf("a document exactly at the limits: %v", err)
	}
	if _, changed, fixed, err := d.FixAudit(t.Context(), FixOptions{}); err != nil || changed != 1 || Failed(fixed) {
		t.Fatalf("fixing a document at the limits: changed %d, %v", changed, err)
	}
	if _, err := Parse(t.Context(), []byte(at+"x-more: 1\n"), "over", Options{MaxNodes: nodesOf(t, at)}); !errors.Is(err, errTooManyNodes) {
		t.Fatalf("one key and value over the limit: %v", err)
	}
}

// utf16le is s in UTF-16, little-endian.
func utf16le(s string) string {
	var b strings.Builder
	for _, u := range utf16.Encode([]rune(s)) {
		b.WriteByte(byte(u))
		b.WriteByte(byte(u >> 8))
	}
	return b.String()
}

// nodesOf is what the budget counts for doc.
func nodesOf(t *testing.T, doc string) int64 {
	t.Helper()
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
		t.Fatal(err)
	}
	c, err := countTree(&root, scanLimits{})
	if err != nil {
		t.Fatal(err)
	}
	return c.expanded
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("  k")
		b.WriteString(strings.Repeat("0", 6-len(itoa(i))))
		b.WriteString(itoa(i))
		b.WriteString(": 1\n")
	}
	return b.String()
}

func jsonKeys(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`"k` + itoa(i) + `": 1`)
	}
	return b.String()
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var d []byte
	for ; i > 0; i /= 10 {
		d = append([]byte{byte('0' + i%10)}, d...)
	}
	return string(d)
}

// TestBoundedRefs: the files a document's $refs name share its node
// budget, and a JSON file among them is counted as JSON.
func TestBoundedRefs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	doc := "openapi: 3.1.0\ninfo: {title: t, version: \"1\"}\npaths:\n  /orders:\n    post:\n      parameters: [{$ref: 'params.%s#/K'}]\n      responses: {\"201\": {description: ok}}\n"
	write("params.yaml", "K: {name: Idempotency-Key, in: header, required: true, schema: {type: string}}\nx-junk: ["+strings.Repeat("a,", 5000)+"a]\n")
	write("params.json", `{"K": {"name": "Idempotency-Key", "in": "header", "required": true, "schema": {"type": "string"}}, "x-junk": [`+strings.Repeat(`"\/",`, 5000)+`1]}`)
	for _, ext := range []string{"yaml", "json"} {
		p := write("doc-"+ext+".yaml", strings.ReplaceAll(doc, "%s", ext))
		if _, err := Load(t.Context(), p, Options{MaxNodes: 6000}); err != nil {
			t.Fatalf("%s: under the budget: %v", ext, err)
		}
		if _, err := Load(t.Context(), p, Options{MaxNodes: 4000}); !errors.Is(err, errTooManyNodes) {
			t.Fatalf("%s: the referred file over what the budget leaves: %v", ext, err)
		}
	}
}

// TestJSONAtTheNodeLimitStaysSmall: a JSON document just under the node
// limit, all of it small flow objects (the costliest shape per node for a
// YAML parser, which holds a flow mapping's content as tokens until the
// entry ends), is read with a few hundred MB allocated in all, not the
// gigabyte kin-openapi's YAML path takes. Not parallel: it counts the
// bytes the whole process allocates while it runs.
func TestJSONAtTheNodeLimitStaysSmall(t *testing.T) {
	objects := (DefaultMaxNodes - 100) / 3 // {"a":"b"}: a mapping, a key, a value
	doc := `{"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {}, "x-junk": [` +
		strings.TrimSuffix(strings.Repeat(`{"a":"b"},`, objects), ",") + `]}`
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := Parse(t.Context(), []byte(doc), "flow objects", Options{}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	const limit = 400 << 20
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > limit {
		t.Errorf("parsing %d bytes of JSON (%d objects) allocated %d MB in all; want at most %d MB", len(doc), objects, alloc>>20, limit>>20)
	} else {
		t.Logf("%d objects: %d MB allocated", objects, alloc>>20)
	}
}

// TestBoundedRefFanOut: $refs in files a document refers to, which
// kin-openapi resolves once for every place that refers to them, count as
// what they expand to: a file of 8 schemas, each referring four times to
// the one before, is 4^7 copies of the first (the chain of 30 held 8 GB
// and never ended), and is refused by the node limit before kin-openapi
// resolves anything; the same file with a short chain loads.
func TestBoundedRefFanOut(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	chain := func(n int) string {
		s := "S0: {type: string}\n"
		for i := 1; i < n; i++ {
			s += "S" + strconv.Itoa(i) + ":\n  type: object\n  properties:\n"
			for j := 0; j < 4; j++ {
				s += "    p" + strconv.Itoa(j) + ": {$ref: '#/S" + strconv.Itoa(i-1) + "'}\n"
			}
		}
		return s
	}
	for _, tc := range []struct {
		n    int
		want error
	}{{3, nil}, {8, errTooManyNodes}} {
		ext := filepath.Join(dir, "ext"+strconv.Itoa(tc.n)+".yaml")
		doc := filepath.Join(dir, "doc"+strconv.Itoa(tc.n)+".yaml")
		if err := os.WriteFile(ext, []byte(chain(tc.n)), 0o644); err != nil {
			t.Fatal(err)
		}
		body := "openapi: 3.1.0\ninfo: {title: t, version: \"1\"}\npaths:\n  /orders:\n    post:\n      requestBody: {content: {application/json: {schema: {$ref: 'ext" +
			strconv.Itoa(tc.n) + ".yaml#/S" + strconv.Itoa(tc.n-1) + "'}}}}\n      responses: {\"201\": {description: ok}}\n"
		if err := os.WriteFile(doc, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(t.Context(), doc, Options{MaxNodes: 20_000})
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Fatalf("a chain of %d: %v, want %v", tc.n, err, tc.want)
		}
	}
}
