package audit

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxRefHops bounds a chain of $refs followed in the node tree, so that a
// loop ends with an error instead of running forever.
const maxRefHops = 32

// pathItemNode returns the mapping node of a path item, following local
// $refs, or an error when it lives in another file or cannot be found.
func (d *Document) pathItemNode(path string) (*yaml.Node, error) {
	paths := mapValue(docMapping(d.root), "paths")
	n := mapValue(paths, path)
	if n == nil {
		return nil, fmt.Errorf("path %q not found", path)
	}
	return d.follow(n)
}

// follow resolves n while it is a {$ref: "#/..."} mapping.
func (d *Document) follow(n *yaml.Node) (*yaml.Node, error) {
	for range maxRefHops {
		n = deAlias(n)
		ref := mapValue(n, "$ref")
		if ref == nil || ref.Kind != yaml.ScalarNode {
			if n == nil || n.Kind != yaml.MappingNode {
				return nil, fmt.Errorf("not a mapping")
			}
			return n, nil
		}
		target, err := d.pointer(ref.Value)
		if err != nil {
			return nil, err
		}
		n = target
	}
	return nil, fmt.Errorf("more than %d $refs in a row (a loop?)", maxRefHops)
}

// pointer resolves a local reference ("#/components/pathItems/Pay") in the
// node tree.
func (d *Document) pointer(ref string) (*yaml.Node, error) {
	frag, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, fmt.Errorf("$ref %q is in another file; bundle the document into one file to fix it", ref)
	}
	if f, err := url.PathUnescape(frag); err == nil {
		frag = f
	}
	n := docMapping(d.root)
	if frag == "" {
		return n, nil
	}
	if !strings.HasPrefix(frag, "/") {
		return nil, fmt.Errorf("$ref %q is not a JSON pointer", ref)
	}
	for _, tok := range strings.Split(frag[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		n = deAlias(n)
		switch {
		case n != nil && n.Kind == yaml.MappingNode:
			n = mapValue(n, tok)
		case n != nil && n.Kind == yaml.SequenceNode:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(n.Content) {
				return nil, fmt.Errorf("$ref %q does not resolve", ref)
			}
			n = n.Content[i]
		default:
			n = nil
		}
		if n == nil {
			return nil, fmt.Errorf("$ref %q does not resolve", ref)
		}
	}
	return n, nil
}

// setValue sets key in mapping m to v, replacing an existing value or
// appending the pair.
func setValue(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, str(key), v)
}

// mergedValue returns the value that m inherits under key through a YAML
// merge key ("<<: *base"), or nil.
func mergedValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value != "<<" {
			continue
		}
		src := deAlias(m.Content[i+1])
		srcs := []*yaml.Node{src}
		if src != nil && src.Kind == yaml.SequenceNode {
			srcs = src.Content
		}
		for _, s := range srcs {
			if v := mapValue(s, key); v != nil {
				return v
			}
		}
	}
	return nil
}

// inherit gives m its own copy of what it inherits under key through a
// merge key, so that adding to it keeps what was inherited.
func inherit(m *yaml.Node, key string) {
	if mapValue(m, key) != nil {
		return
	}
	if v := mergedValue(m, key); v != nil {
		c := copyNode(v, map[*yaml.Node]*yaml.Node{})
		c.Anchor = ""
		setValue(m, key, c)
	}
}

// ensureMapping returns the mapping under key in m, creating it (or
// replacing a null) when absent.
func ensureMapping(m *yaml.Node, key string) (*yaml.Node, error) {
	return ensure(m, key, yaml.MappingNode)
}

// ensureSequence is ensureMapping for a sequence. A new sequence goes
// before the first of the keys in before that m has, so that parameters
// come before the request body and responses, as people write them.
func ensureSequence(m *yaml.Node, key string, before ...string) (*yaml.Node, error) {
	return ensure(m, key, yaml.SequenceNode, before...)
}

func ensure(m *yaml.Node, key string, kind yaml.Kind, before ...string) (*yaml.Node, error) {
	inherit(m, key)
	v := mapValue(m, key)
	switch {
	case v != nil && v.Kind == kind:
		return v, nil
	case v != nil && !(v.Kind == yaml.ScalarNode && v.Tag == "!!null"):
		return nil, fmt.Errorf("%q is not a %s", key, map[yaml.Kind]string{yaml.MappingNode: "mapping", yaml.SequenceNode: "list"}[kind])
	}
	n := &yaml.Node{Kind: kind, Tag: map[yaml.Kind]string{yaml.MappingNode: "!!map", yaml.SequenceNode: "!!seq"}[kind]}
	if v == nil {
		for i := 0; i+1 < len(m.Content); i += 2 {
			if slices.Contains(before, m.Content[i].Value) {
				m.Content = slices.Insert(m.Content, i, str(key), n)
				return n, nil
			}
		}
	}
	setValue(m, key, n)
	return n, nil
}

// str is a string scalar.
func str(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

// mapping builds a mapping from alternating keys and values; a value may
// be a *yaml.Node, a string, a bool or an int.
func mapping(kv ...any) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for i := 0; i+1 < len(kv); i += 2 {
		var v *yaml.Node
		switch x := kv[i+1].(type) {
		case *yaml.Node:
			v = x
		case string:
			v = str(x)
		case bool:
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(x)}
		case int:
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(x)}
		default:
			panic(fmt.Sprintf("audit: mapping value %T", x))
		}
		m.Content = append(m.Content, str(kv[i].(string)), v)
	}
	return m
}
