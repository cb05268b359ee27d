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

// ensureMapping returns the mapping under key in m, creating it (or
// replacing a null) when absent.
func ensureMapping(m *yaml.Node, key string) (*yaml.Node, error) {
	if v := mapValue(m, key); v != nil {
		if v.Kind == yaml.MappingNode {
			return v, nil
		}
		if !(v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
			return nil, fmt.Errorf("%q is not a mapping", key)
		}
	}
	v := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	setValue(m, key, v)
	return v, nil
}

// ensureSequence is ensureMapping for a sequence. A new sequence goes
// before the first of the keys in before that m has, so that parameters
// come before the request body and responses, as people write them.
func ensureSequence(m *yaml.Node, key string, before ...string) (*yaml.Node, error) {
	if v := mapValue(m, key); v != nil {
		if v.Kind == yaml.SequenceNode {
			return v, nil
		}
		if !(v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
			return nil, fmt.Errorf("%q is not a list", key)
		}
	}
	v := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	if mapValue(m, key) == nil {
		for i := 0; i+1 < len(m.Content); i += 2 {
			if slices.Contains(before, m.Content[i].Value) {
				m.Content = slices.Insert(m.Content, i, str(key), v)
				return v, nil
			}
		}
	}
	setValue(m, key, v)
	return v, nil
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
