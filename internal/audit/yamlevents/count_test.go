package yamlevents_test

import (
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem/internal/audit/yamlevents"
)

// treeCounts counts a yaml.v3 node tree as Count counts the stream: nodes
// as written, and expanded through aliases. ok is false for an alias that
// names its own ancestor (yaml.v3 builds a cycle; Count refuses it).
func treeCounts(root *yaml.Node) (nodes, expanded int64, ok bool) {
	onPath := map[*yaml.Node]bool{}
	ok = true
	var walk func(n *yaml.Node) int64
	walk = func(n *yaml.Node) int64 {
		if onPath[n] || !ok {
			ok = false
			return 0
		}
		onPath[n] = true
		defer delete(onPath, n)
		var e int64 = 1
		if n.Kind == yaml.DocumentNode || n.Kind == 0 {
			e = 0
		}
		if n.Kind == yaml.AliasNode {
			return walk(n.Alias)
		}
		for _, c := range n.Content {
			e += walk(c)
		}
		return e
	}
	var written func(n *yaml.Node) int64
	written = func(n *yaml.Node) int64 {
		var w int64 = 1
		if n.Kind == yaml.DocumentNode || n.Kind == 0 {
			w = 0
		}
		for _, c := range n.Content {
			w += written(c)
		}
		return w
	}
	expanded = walk(root)
	return written(root), expanded, ok
}

// TestCountMatchesYAML: the copied parser sees the nodes yaml.v3 builds.
func TestCountMatchesYAML(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		"",
		"a: 1\n",
		"openapi: 3.1.0\npaths:\n  /a:\n    post: {responses: {'201': {description: ok}}}\n",
		"- [a]\n- [b, c]\n- {d: e}\n",
		"a: &x [1, 2, {b: 3}]\nb: *x\nc: [*x, *x]\n",
		"base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  z: 3\n",
		"? complex\n: value\n? [a, b]\n: c\n",
		"s: |\n  block\n  text\nf: >\n  folded\n",
		"{\"json\": [1, 2.5, true, null, \"s\"], \"o\": {}}",
		"a: &x 1\nb: &x [2, 3]\nc: [*x, *x]\n", // an anchor redefined
		"# comment only\n",
		"--- \na: 1\n", // document marker
	} {
		var root yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		wantNodes, wantExpanded, _ := treeCounts(&root)
		c, err := yamlevents.Count([]byte(doc), yamlevents.Limits{})
		if err != nil || !c.Complete {
			t.Fatalf("%q: %+v %v", doc, c, err)
		}
		if c.Nodes != wantNodes || c.Expanded != wantExpanded {
			t.Errorf("%q: counted %d nodes (%d expanded), yaml.v3 built %d (%d)", doc, c.Nodes, c.Expanded, wantNodes, wantExpanded)
		}
	}
}

// TestCountLimits: each limit stops the count as soon as it is passed, a
// document exactly at a limit passes, and aliases that never end or name
// nothing are refused.
func TestCountLimits(t *testing.T) {
	t.Parallel()
	laughs := "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
	for i := 1; i < 10; i++ {
		laughs += "a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [" + strings.TrimSuffix(strings.Repeat("*a"+string(rune('0'+i-1))+", ", 10), ", ") + "]\n"
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
		lim  yamlevents.Limits
		want error // nil: passes
	}{
		{"list at the limit", strings.Repeat("- [a]\n", 50), yamlevents.Limits{MaxNodes: 101}, nil},
		{"list one over", strings.Repeat("- [a]\n", 50) + "- b\n", yamlevents.Limits{MaxNodes: 101}, yamlevents.ErrTooManyNodes},
		{"long flow sequence", "[" + strings.Repeat("a,", 1000) + "a]", yamlevents.Limits{MaxNodes: 1000}, yamlevents.ErrTooManyNodes},
		{"billion laughs", laughs, yamlevents.Limits{MaxNodes: 1_000_000}, yamlevents.ErrTooManyNodes},
		{"aliases at the limit", "a: &x [1, 2, 3]\nb: [*x, *x]\n", yamlevents.Limits{MaxNodes: 16}, nil},
		{"aliases one over", "a: &x [1, 2, 3]\nb: [*x, *x, *x]\n", yamlevents.Limits{MaxNodes: 19}, yamlevents.ErrTooManyNodes},
		{"depth at the limit", strings.Repeat("[", 10) + strings.Repeat("]", 10), yamlevents.Limits{MaxDepth: 10}, nil},
		{"depth one over", strings.Repeat("[", 11) + strings.Repeat("]", 11), yamlevents.Limits{MaxDepth: 10}, yamlevents.ErrTooDeep},
		{"block depth", strings.Repeat("- ", 11) + "a\n", yamlevents.Limits{MaxDepth: 10}, yamlevents.ErrTooDeep},
		{"deep beyond yaml.v3's own limit", strings.Repeat("[", 20000), yamlevents.Limits{MaxDepth: 500}, yamlevents.ErrTooDeep},
		{"keys at the limit", keys(100), yamlevents.Limits{MaxKeyPairs: 4950}, nil},
		{"keys one over", keys(101), yamlevents.Limits{MaxKeyPairs: 4950}, yamlevents.ErrTooManyKeys},
		// 1 pair (a, b) + 1 (p, q) + 1 per alias of m.
		{"key pairs of aliased mappings add up", "a: &m {p: 1, q: 2}\nb: [*m, *m]\n", yamlevents.Limits{MaxKeyPairs: 4}, nil},
		{"key pairs of aliased mappings, one over", "a: &m {p: 1, q: 2}\nb: [*m, *m, *m]\n", yamlevents.Limits{MaxKeyPairs: 4}, yamlevents.ErrTooManyKeys},
	} {
		c, err := yamlevents.Count([]byte(tc.doc), tc.lim)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: %v (%+v)", tc.name, err, c)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%s: error %v, want %v (%+v)", tc.name, err, tc.want, c)
		case tc.want != nil && !errors.Is(err, yamlevents.ErrLimit):
			t.Errorf("%s: %v does not wrap ErrLimit", tc.name, err)
		}
	}
	for doc, want := range map[string]string{
		"a: &x [1, *x]\n": "contains it",
		"a: *nothing\n":   "unknown anchor",
	} {
		if _, err := yamlevents.Count([]byte(doc), yamlevents.Limits{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", doc, err, want)
		}
	}
	// A syntax error ends the count without an error, incomplete.
	if c, err := yamlevents.Count([]byte("a: [1, 2\nb: ]]"), yamlevents.Limits{}); err != nil || c.Complete {
		t.Errorf("syntax error: %+v %v", c, err)
	}
}

// FuzzCount: for any input yaml.v3 reads, Count counts the nodes it
// builds, and never more expanded nodes than a limit lets through.
func FuzzCount(f *testing.F) {
	for _, s := range []string{"a: 1\n", "- [a]\n- {b: c}\n", "a: &x [1]\nb: *x\n", "{\"a\": [1, 2]}", "? a\n: b\n", "a: |\n  x\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := yamlevents.Count(data, yamlevents.Limits{MaxNodes: 10000, MaxDepth: 100})
		if err == nil && c.Expanded > 10000 {
			t.Fatalf("passed with %d expanded nodes", c.Expanded)
		}
		if err != nil || !c.Complete || strings.Contains(string(data), "---") || strings.Contains(string(data), "...") {
			return // refused, cut short, or several documents: yaml.v3 reads the first only
		}
		var root yaml.Node
		if yaml.Unmarshal(data, &root) != nil {
			return
		}
		nodes, expanded, ok := treeCounts(&root)
		if !ok {
			t.Fatalf("yaml.v3 built a cycle that Count let through")
		}
		if nodes != c.Nodes || expanded != c.Expanded {
			t.Fatalf("counted %d nodes (%d expanded), yaml.v3 built %d (%d)", c.Nodes, c.Expanded, nodes, expanded)
		}
	})
}
