// Package yamlevents measures what a YAML document expands to before it is
// decoded: how many nodes it holds once every alias is replaced by the node
// it names, and how deeply it nests. It reads the document as an event
// stream with the scanner and parser of go.yaml.in/yaml/v3 (copied here
// unchanged, since that module does not export them: apic.go, parserc.go,
// readerc.go, scannerc.go, yamlh.go and yamlprivateh.go, MIT licence, see
// LICENSE), so it sees exactly the nodes yaml.v3 would build, at a small
// fraction of the memory: no node tree is kept, only one count per anchor.
//
// Decoding into a yaml.Node costs about 200 bytes per node, and every
// decoder after it (one that expands aliases into values, as kin-openapi
// does) costs as much again per node of the expansion, so a 30 MB list of
// "- [a]" (ten million nodes) or a billion-laughs document of a few
// hundred bytes must be refused by what it expands to, not by its size.
//
// To update the copied files, copy them again from the module cache and
// replace their package clause; count.go is the only file of this package.
package yamlevents

import (
	"errors"
	"fmt"
)

// Limits bound what Count accepts. A zero limit is no limit.
type Limits struct {
	// MaxNodes bounds the stream's nodes (scalars, sequences, mappings,
	// mapping keys included) once every alias is replaced by the nodes it
	// names.
	MaxNodes int64
	// MaxDepth bounds how deeply sequences and mappings nest.
	MaxDepth int
	// MaxKeyPairs bounds the pairs of keys of one mapping, added up over
	// every mapping (k keys make k(k-1)/2 pairs), aliases expanded: YAML
	// decoders that refuse duplicate keys compare every pair.
	MaxKeyPairs int64
}

// Counts is what Count found.
type Counts struct {
	// Nodes are the nodes as written (each alias counts as one).
	Nodes int64
	// Aliases are the aliases.
	Aliases int64
	// Expanded are the nodes once every alias is replaced by the node it
	// names, recursively: what Limits.MaxNodes bounds.
	Expanded int64
	// KeyPairs is what Limits.MaxKeyPairs bounds.
	KeyPairs int64
	// Depth is the deepest nesting of sequences and mappings.
	Depth int
	// Complete says that the whole stream was read: false after a syntax
	// error.
	Complete bool
}

// Errors of Count for a document over a limit; each wraps ErrLimit.
var (
	ErrLimit        = errors.New("too large")
	ErrTooManyNodes = fmt.Errorf("%w: too many nodes", ErrLimit)
	ErrTooDeep      = fmt.Errorf("%w: nested too deeply", ErrLimit)
	ErrTooManyKeys  = fmt.Errorf("%w: too many mapping keys", ErrLimit)
)

// Count reads data's event stream (every document in it) and counts its
// nodes, stopping with ErrTooManyNodes, ErrTooDeep or ErrTooManyKeys as
// soon as a limit is passed, or with an error for an alias that names its
// own ancestor (an expansion without end) or no anchor. A syntax error
// ends the count without an error (Counts.Complete is false): the counts
// then cover the events before it, and the decoder that reads the document
// next reports the error in its own words.
func Count(data []byte, lim Limits) (Counts, error) {
	var c Counts
	var p yaml_parser_t
	if !yaml_parser_initialize(&p) {
		return c, errors.New("yaml: the parser did not start")
	}
	defer yaml_parser_delete(&p)
	if len(data) == 0 {
		data = []byte{'\n'} // as yaml.v3 reads an empty document
	}
	yaml_parser_set_input_string(&p, data)

	// anchors are the anchors defined so far, by name: what an alias to
	// one adds. An anchor whose node is still open is marked open.
	type anchor struct {
		nodes, pairs int64
		open         bool
	}
	anchors := map[string]anchor{}
	type frame struct {
		anchor       string
		mapping      bool
		children     int64 // nodes directly inside: keys and values
		nodes, pairs int64 // c.Expanded and c.KeyPairs at its start
	}
	var stack []frame
	child := func() {
		if n := len(stack); n > 0 {
			stack[n-1].children++
		}
	}
	for {
		var ev yaml_event_t
		if !yaml_parser_parse(&p, &ev) {
			return c, nil
		}
		line := ev.start_mark.line + 1
		switch ev.typ {
		case yaml_STREAM_END_EVENT:
			yaml_event_delete(&ev)
			c.Complete = true
			return c, nil
		case yaml_SCALAR_EVENT:
			child()
			c.Nodes++
			c.Expanded++
			if len(ev.anchor) > 0 {
				anchors[string(ev.anchor)] = anchor{nodes: 1}
			}
		case yaml_SEQUENCE_START_EVENT, yaml_MAPPING_START_EVENT:
			child()
			c.Nodes++
			stack = append(stack, frame{anchor: string(ev.anchor), mapping: ev.typ == yaml_MAPPING_START_EVENT, nodes: c.Expanded, pairs: c.KeyPairs})
			c.Expanded++
			if len(ev.anchor) > 0 {
				anchors[string(ev.anchor)] = anchor{open: true}
			}
			c.Depth = max(c.Depth, len(stack))
			if lim.MaxDepth > 0 && c.Depth > lim.MaxDepth {
				return c, fmt.Errorf("%w: deeper than %d levels (line %d)", ErrTooDeep, lim.MaxDepth, line)
			}
		case yaml_SEQUENCE_END_EVENT, yaml_MAPPING_END_EVENT:
			if n := len(stack); n > 0 {
				f := stack[n-1]
				stack = stack[:n-1]
				if f.mapping {
					k := f.children / 2
					c.KeyPairs = satAdd(c.KeyPairs, k*(k-1)/2)
				}
				if f.anchor != "" {
					anchors[f.anchor] = anchor{nodes: c.Expanded - f.nodes, pairs: c.KeyPairs - f.pairs}
				}
			}
		case yaml_ALIAS_EVENT:
			child()
			c.Nodes++
			c.Aliases++
			a, ok := anchors[string(ev.anchor)]
			switch {
			case !ok:
				return c, fmt.Errorf("yaml: line %d: unknown anchor '%s' referenced", line, ev.anchor)
			case a.open:
				return c, fmt.Errorf("yaml: line %d: alias '%s' names a node that contains it, so it expands without end", line, ev.anchor)
			}
			c.Expanded = satAdd(c.Expanded, a.nodes)
			c.KeyPairs = satAdd(c.KeyPairs, a.pairs)
		}
		yaml_event_delete(&ev)
		if err := lim.check(c, line); err != nil {
			return c, err
		}
	}
}

// check reports the first limit c passes, at line.
func (l Limits) check(c Counts, line int) error {
	switch {
	case l.MaxNodes > 0 && c.Expanded > l.MaxNodes:
		what := "nodes"
		if c.Aliases > 0 {
			what = "nodes once its aliases are expanded"
		}
		return fmt.Errorf("%w: more than %d %s (line %d)", ErrTooManyNodes, l.MaxNodes, what, line)
	case l.MaxKeyPairs > 0 && c.KeyPairs > l.MaxKeyPairs:
		return fmt.Errorf("%w: its mappings hold more than %d pairs of keys (line %d), which decoders compare to find duplicates", ErrTooManyKeys, l.MaxKeyPairs, line)
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
