package audit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf16"

	"go.yaml.in/yaml/v3"
)

// written counts a yaml.v3 tree as written: its nodes (an alias is one),
// the pairs of keys of its mappings, aliases not followed, and its depth.
func written(n *yaml.Node, depth int) (nodes, pairs int64, deepest int) {
	if n.Kind != yaml.DocumentNode && n.Kind != 0 {
		nodes = 1
	} else {
		depth--
	}
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		deepest = depth
	}
	if n.Kind == yaml.MappingNode {
		k := int64(len(n.Content) / 2)
		pairs = k * (k - 1) / 2
	}
	for _, c := range n.Content {
		cn, cp, cd := written(c, depth+1)
		nodes, pairs, deepest = nodes+cn, pairs+cp, max(deepest, cd)
	}
	return nodes, pairs, deepest
}

// countCorpus is YAML of every shape the scan must read as yaml.v3 does.
func countCorpus(t *testing.T) []string {
	docs := []string{
		"",
		"a: 1\n",
		"# comment only\n",
		"--- \na: 1\n",
		"openapi: 3.1.0\npaths:\n  /a:\n    post: {responses: {'201': {description: ok}}}\n",
		"- [a]\n- [b, c]\n- {d: e}\n",
		"a: &x [1, 2, {b: 3}]\nb: *x\nc: [*x, *x]\n",
		"base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  z: 3\n",
		"? complex\n: value\n? [a, b]\n: c\n",
		"? a\n? b\n? c\n: d\nx: [? e, ? f : g]\ny: {? h, ? i: j, ? : k}\n",
		"s: |\n  block\n  - text: no\nf: >\n  folded\n  [x, y]\ng: 1\n",
		"{\"json\": [1, 2.5, true, null, \"s\"], \"o\": {}}",
		"a: &x 1\nb: &x [2, 3]\nc: [*x, *x]\n",
		"a:\n- x\n- y\nb:\n  - z\nc: 1\n",
		"- - - a\n  - b\n- c: 1\n  d:\n    - e\n",
		"a:\nb: ~\nc: ''\nd: \"\"\n",
		"[a, b: c, {d, e: f}, [], {}]\n",
		"[a: [b: [c: d]], e]\n",
		"{a, b: , ? c, ? d : e}\n",
		"- &a !!str x\n- !!map {k: v}\n- *a\n",
		"k: 'it''s: a [b] {c}'\nl: \"x: #y\"\nm: plain # comment: [x]\n",
		"x:\n  - a: 1\n    b:\n      c: [1, 2]\n  - d\n",
		"a: b\n  c\n  - d\n",
		"a: 'x\n\ny'\nb: \"x\\\n  y\"\n",
		"%YAML 1.1\n---\na: 1\n",
		"a: !!binary |\n  R0lG\nb: >-\n\n  x\n\nc: |2\n   x\n",
		"a:\n  b\n   c\nd:\tb\n",
		"&a a: b\n*a : c\n*a: d\nx:\n- *a:\n- {*a: 1, *a:}\n- [&b-_9 e, *b-_9]\n",
		"a: b #c\n#d\n  #e\n",
		"- ? a\n  : b\n- !<tag:x> b\n",
		"\ufeffa: 1\r\nb: 2\r\n",
		"- a\u2028- b\n",
		"a: x\n...\n",
		strings.Repeat("- [a]\n", 50),
		boundHead + "x-keys:\n" + manyKeys(100),
		string(benchDoc(20)),
	}
	for _, f := range []string{"issue-3.0.yaml", "issue-3.1.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	return docs
}

// TestScanMatchesTree: the tokens scanYAML reads place the nodes, the
// pairs of keys and the depth of the tree yaml.v3 builds, and countTree
// counts that tree with its aliases expanded.
func TestScanMatchesTree(t *testing.T) {
	t.Parallel()
	for _, doc := range countCorpus(t) {
		var root yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		nodes, pairs, depth := written(&root, 1)
		s, err := scanYAML([]byte(doc), scanLimits{})
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if s.nodes != nodes || s.pairs != pairs || s.depth != depth {
			t.Errorf("%q: scanned %d nodes, %d pairs, depth %d; yaml.v3 built %d, %d, %d", doc, s.nodes, s.pairs, s.depth, nodes, pairs, depth)
		}
		c, err := countTree(&root, scanLimits{})
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if c.aliases == 0 && (c.expanded != nodes || c.pairs != pairs) || c.depth != depth {
			t.Errorf("%q: counted %+v; yaml.v3 built %d nodes, %d pairs, depth %d", doc, c, nodes, pairs, depth)
		}
	}
}

// FuzzScanYAML: for any input yaml.v3 reads into one document, scanYAML
// counts no fewer nodes, and no shallower, than yaml.v3 builds, but for a
// node or two its scanner leaves out at the end of the input (a tag and
// nothing after it), so that what it lets through bounds the tree.
func FuzzScanYAML(f *testing.F) {
	for _, s := range []string{"a: 1\n", "- [a]\n- {b: c}\n", "a: &x [1]\nb: *x\n", "{\"a\": [1, 2]}", "? a\n: b\n", "a: |\n  x\n", "a:\n- b\n- c: d\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var root yaml.Node
		if yaml.Unmarshal(data, &root) != nil || strings.Contains(string(data), "---") || strings.Contains(string(data), "...") {
			return // not YAML, or several documents: yaml.v3 reads the first only
		}
		s, err := scanYAML(data, scanLimits{})
		if err != nil {
			return
		}
		nodes, _, depth := written(&root, 1)
		const slack = 2
		if s.nodes+slack < nodes || s.depth+slack < depth {
			t.Fatalf("scanned %d nodes, depth %d; yaml.v3 built %d, depth %d", s.nodes, s.depth, nodes, depth)
		}
	})
}

// TestScanReadsUTF16: a document in UTF-16, which yaml.v3 reads when a
// byte order mark says so, is scanned as the characters yaml.v3 reads, in
// either byte order, so a list written in it is counted, not read as one
// scalar.
func TestScanReadsUTF16(t *testing.T) {
	t.Parallel()
	doc := "x:\n" + strings.Repeat("  - [a, \U0001F600]\n", 50)
	for _, bigEndian := range []bool{false, true} {
		enc := []byte{0xFF, 0xFE}
		if bigEndian {
			enc = []byte{0xFE, 0xFF}
		}
		for _, u := range utf16.Encode([]rune(doc)) {
			if bigEndian {
				enc = append(enc, byte(u>>8), byte(u))
			} else {
				enc = append(enc, byte(u), byte(u>>8))
			}
		}
		var root yaml.Node
		if err := yaml.Unmarshal(enc, &root); err != nil {
			t.Fatal(err)
		}
		nodes, _, depth := written(&root, 1)
		s, err := scanYAML(enc, scanLimits{})
		if err != nil || s.nodes != nodes || s.depth != depth || nodes != 153 {
			t.Errorf("big endian %v: scanned %+v, %v; yaml.v3 built %d nodes, depth %d", bigEndian, s, err, nodes, depth)
		}
	}
}

// TestCountLimits: each limit stops the scan of the tokens and the count
// of the tree as soon as it is passed, a document exactly at a limit
// passes, aliases are counted as what they expand to, and aliases that
// never end or name nothing are refused.
func TestCountLimits(t *testing.T) {
	t.Parallel()
	laughs := "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
	for i := 1; i < 10; i++ {
		laughs += "a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [" + strings.TrimSuffix(strings.Repeat("*a"+string(rune('0'+i-1))+", ", 10), ", ") + "]\n"
	}
	merges := "m0: &m0 {k: v}\n"
	for i := 1; i < 10; i++ {
		merges += "m" + string(rune('0'+i)) + ": &m" + string(rune('0'+i)) + " {<<: [" + strings.TrimSuffix(strings.Repeat("*m"+string(rune('0'+i-1))+", ", 10), ", ") + "]}\n"
	}
	keys := func(n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString("k")
			b.WriteString(strings.Repeat("x", i%7))
			b.WriteString(string(rune('a' + i%26)))
			b.WriteString(strings.Repeat("y", i/26))
			b.WriteString(": 1\n")
		}
		return b.String()
	}
	for _, tc := range []struct {
		name string
		doc  string
		lim  scanLimits
		want error // nil: passes
	}{
		{"list at the limit", strings.Repeat("- [a]\n", 50), scanLimits{nodes: 101}, nil},
		{"list one over", strings.Repeat("- [a]\n", 50) + "- b\n", scanLimits{nodes: 101}, errTooManyNodes},
		{"long flow sequence", "[" + strings.Repeat("a,", 1000) + "a]", scanLimits{nodes: 1000}, errTooManyNodes},
		{"billion laughs", laughs, scanLimits{nodes: 1_000_000}, errTooManyNodes},
		{"merge-key bomb", merges, scanLimits{nodes: 1_000_000}, errTooManyNodes},
		{"aliases at the limit", "a: &x [1, 2, 3]\nb: [*x, *x]\n", scanLimits{nodes: 16}, nil},
		{"aliases one over", "a: &x [1, 2, 3]\nb: [*x, *x, *x]\n", scanLimits{nodes: 19}, errTooManyNodes},
		{"depth at the limit", strings.Repeat("[", 10) + strings.Repeat("]", 10), scanLimits{depth: 10}, nil},
		{"depth one over", strings.Repeat("[", 11) + strings.Repeat("]", 11), scanLimits{depth: 10}, errTooDeep},
		{"pairs in flow sequences at the limit", strings.Repeat("[a: ", 5) + "b" + strings.Repeat("]", 5), scanLimits{depth: 10}, nil},
		{"pairs in flow sequences one over", "[" + strings.Repeat("[a: ", 5) + "b" + strings.Repeat("]", 6), scanLimits{depth: 10}, errTooDeep},
		{"block depth at the limit", strings.Repeat("- ", 10) + "a\n", scanLimits{depth: 10}, nil},
		{"block depth one over", strings.Repeat("- ", 11) + "a\n", scanLimits{depth: 10}, errTooDeep},
		{"deep beyond yaml.v3's own limit", strings.Repeat("[", 20000), scanLimits{depth: 500}, errTooDeep},
		{"block sequences deep beyond yaml.v3's own limit", strings.Repeat("- ", 20000) + "a\n", scanLimits{depth: 500}, errTooDeep},
		{"block mappings at the limit", deepMappings(500), scanLimits{depth: 500}, nil},
		{"block mappings one over", deepMappings(501), scanLimits{depth: 500}, errTooDeep},
		{"keys at the limit", keys(100), scanLimits{pairs: 4950}, nil},
		{"keys one over", keys(101), scanLimits{pairs: 4950}, errTooManyKeys},
		// 1 pair (a, b) + 1 (p, q) + 1 per alias of m.
		{"key pairs of aliased mappings add up", "a: &m {p: 1, q: 2}\nb: [*m, *m]\n", scanLimits{pairs: 4}, nil},
		{"key pairs of aliased mappings, one over", "a: &m {p: 1, q: 2}\nb: [*m, *m, *m]\n", scanLimits{pairs: 4}, errTooManyKeys},
	} {
		_, err := scanYAML([]byte(tc.doc), tc.lim)
		if err == nil {
			var root yaml.Node
			if err = yaml.Unmarshal([]byte(tc.doc), &root); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			_, err = countTree(&root, tc.lim)
		}
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		case tc.want != nil && !errors.Is(err, errLimit):
			t.Errorf("%s: %v does not wrap errLimit", tc.name, err)
		}
	}
	for doc, want := range map[string]string{
		"a: &x [1, *x]\n":   "contains it",
		"a: &x {b: [*x]}\n": "contains it",
	} {
		var root yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
			t.Fatal(err)
		}
		if _, err := countTree(&root, scanLimits{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", doc, err, want)
		}
	}
	if _, err := Parse(t.Context(), []byte("openapi: 3.1.0\na: *nothing\n"), "t", Options{}); err == nil || !strings.Contains(err.Error(), "unknown anchor") {
		t.Errorf("an alias to no anchor: %v", err)
	}
}

// deepMappings is n block mappings, each the value of the one before.
func deepMappings(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(strings.Repeat(" ", i))
		b.WriteString("k:\n")
	}
	return b.String()
}
