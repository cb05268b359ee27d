package audit

import (
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Errors for a document over a limit; each wraps errLimit.
var (
	errLimit        = errors.New("too large")
	errTooManyNodes = fmt.Errorf("%w: too many nodes", errLimit)
	errTooDeep      = fmt.Errorf("%w: nested too deeply", errLimit)
	errTooManyKeys  = fmt.Errorf("%w: too many mapping keys", errLimit)
)

// counts is what a document holds: its nodes (scalars, sequences,
// mappings, mapping keys included) with every alias replaced by the nodes
// it names, the pairs of keys of its mappings added up, aliases expanded
// (a mapping of k keys has k(k-1)/2: YAML decoders that refuse duplicate
// keys compare every pair), and how deeply its collections nest.
type counts struct {
	expanded, pairs int64
	depth           int
	aliases         int64
}

// treeCounter counts a yaml.v3 node tree in document order, where every
// alias comes after the node it names: that node's count is known by
// then, so an alias adds it without walking it again.
type treeCounter struct {
	lim   scanLimits
	c     counts
	sizes map[*yaml.Node]counts // what an anchored node expands to
	open  map[*yaml.Node]bool   // anchored nodes being counted
}

// countTree counts root as counts says and stops with errTooManyNodes,
// errTooDeep or errTooManyKeys as soon as one passes lim, or with an error
// for an alias that names a node containing it (an expansion without end).
func countTree(root *yaml.Node, lim scanLimits) (counts, error) {
	t := &treeCounter{lim: lim, sizes: map[*yaml.Node]counts{}, open: map[*yaml.Node]bool{}}
	switch root.Kind {
	case 0: // an empty document
		return t.c, nil
	case yaml.DocumentNode:
		for _, n := range root.Content {
			if err := t.count(n, 1); err != nil {
				return t.c, err
			}
		}
		return t.c, nil
	}
	return t.c, t.count(root, 1)
}

func (t *treeCounter) count(n *yaml.Node, depth int) error {
	if n.Kind == yaml.AliasNode {
		t.c.aliases++
		switch {
		case n.Alias == nil:
			return fmt.Errorf("yaml: line %d: unknown anchor '%s' referenced", n.Line, n.Value)
		case t.open[n.Alias]:
			return fmt.Errorf("yaml: line %d: alias '%s' names a node that contains it, so it expands without end", n.Line, n.Value)
		}
		s := t.sizes[n.Alias]
		t.c.expanded = satAdd(t.c.expanded, s.expanded)
		t.c.pairs = satAdd(t.c.pairs, s.pairs)
		return t.check(n.Line)
	}
	start := t.c
	if n.Anchor != "" {
		t.open[n] = true
	}
	t.c.expanded++
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		t.c.depth = max(t.c.depth, depth)
		if t.lim.depth > 0 && depth > t.lim.depth {
			return fmt.Errorf("%w: deeper than %d levels (line %d)", errTooDeep, t.lim.depth, n.Line)
		}
	}
	if n.Kind == yaml.MappingNode {
		k := int64(len(n.Content) / 2)
		t.c.pairs = satAdd(t.c.pairs, k*(k-1)/2)
	}
	if err := t.check(n.Line); err != nil {
		return err
	}
	for _, c := range n.Content {
		if err := t.count(c, depth+1); err != nil {
			return err
		}
	}
	if n.Anchor != "" {
		delete(t.open, n)
		t.sizes[n] = counts{expanded: t.c.expanded - start.expanded, pairs: t.c.pairs - start.pairs}
	}
	return nil
}

// check reports the first limit passed, at line.
func (t *treeCounter) check(line int) error {
	switch {
	case t.lim.nodes > 0 && t.c.expanded > t.lim.nodes:
		what := "nodes"
		if t.c.aliases > 0 {
			what = "nodes once its aliases are expanded"
		}
		return fmt.Errorf("%w: more than %d %s (line %d)", errTooManyNodes, t.lim.nodes, what, line)
	case t.lim.pairs > 0 && t.c.pairs > t.lim.pairs:
		return fmt.Errorf("%w: its mappings hold more than %d pairs of keys (line %d), which decoders compare to find duplicates", errTooManyKeys, t.lim.pairs, line)
	}
	return nil
}

// satAdd adds without wrapping past the largest int64.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}
