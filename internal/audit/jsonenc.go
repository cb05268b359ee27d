package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// encodeJSON writes a node tree parsed from JSON back as JSON, members in
// their order, indented by two spaces.
func encodeJSON(root *yaml.Node) ([]byte, error) {
	var buf bytes.Buffer
	if err := writeJSON(&buf, root, 0); err != nil {
		return nil, err
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

func writeJSON(buf *bytes.Buffer, n *yaml.Node, depth int) error {
	if depth > 10000 {
		return fmt.Errorf("document nested too deeply")
	}
	n = deAlias(n)
	if n == nil {
		buf.WriteString("null")
		return nil
	}
	indent := func(d int) {
		buf.WriteByte('\n')
		for range d {
			buf.WriteString("  ")
		}
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			buf.WriteString("null")
			return nil
		}
		return writeJSON(buf, n.Content[0], depth)
	case yaml.MappingNode:
		if len(n.Content) == 0 {
			buf.WriteString("{}")
			return nil
		}
		buf.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				buf.WriteByte(',')
			}
			indent(depth + 1)
			writeString(buf, n.Content[i].Value)
			buf.WriteString(": ")
			if err := writeJSON(buf, n.Content[i+1], depth+1); err != nil {
				return err
			}
		}
		indent(depth)
		buf.WriteByte('}')
	case yaml.SequenceNode:
		if len(n.Content) == 0 {
			buf.WriteString("[]")
			return nil
		}
		buf.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			indent(depth + 1)
			if err := writeJSON(buf, c, depth+1); err != nil {
				return err
			}
		}
		indent(depth)
		buf.WriteByte(']')
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			buf.WriteString("null")
		case "!!bool", "!!int", "!!float":
			if json.Valid([]byte(n.Value)) {
				buf.WriteString(n.Value)
			} else {
				writeString(buf, n.Value)
			}
		default:
			writeString(buf, n.Value)
		}
	default:
		return fmt.Errorf("unexpected YAML node kind %v", n.Kind)
	}
	return nil
}

func writeString(buf *bytes.Buffer, s string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a string always encodes
	buf.Truncate(buf.Len() - 1) // Encode's newline
}

// decodeJSON parses a JSON document into a node tree like the one
// yaml.Unmarshal gives, numbers kept as written. It counts the nodes as it
// goes, as countTree counts a YAML tree (mapping keys included, the pairs
// of keys of each object), and stops at lim with errTooManyNodes,
// errTooManyKeys or errTooDeep.
func decodeJSON(data []byte, root *yaml.Node, lim scanLimits) (counts, error) {
	d := &jsonDecoder{dec: json.NewDecoder(bytes.NewReader(bytes.TrimPrefix(data, []byte("\ufeff")))), lim: lim}
	d.dec.UseNumber()
	n, err := d.value(0)
	if err != nil {
		return d.c, err
	}
	if _, err := d.dec.Token(); err != io.EOF {
		return d.c, fmt.Errorf("data after the top-level value")
	}
	*root = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{n}}
	return d.c, nil
}

type jsonDecoder struct {
	dec *json.Decoder
	lim scanLimits
	c   counts
}

// count notes one more node.
func (d *jsonDecoder) count() error {
	d.c.expanded++
	return d.check()
}

func (d *jsonDecoder) check() error {
	switch {
	case d.lim.nodes > 0 && d.c.expanded > d.lim.nodes:
		return fmt.Errorf("%w: more than %d nodes (at byte %d)", errTooManyNodes, d.lim.nodes, d.dec.InputOffset())
	case d.lim.pairs > 0 && d.c.pairs > d.lim.pairs:
		return fmt.Errorf("%w: its objects hold more than %d pairs of keys (at byte %d), which decoders compare to find duplicates", errTooManyKeys, d.lim.pairs, d.dec.InputOffset())
	}
	return nil
}

func (d *jsonDecoder) value(depth int) (*yaml.Node, error) {
	tok, err := d.dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if err := d.count(); err != nil {
		return nil, err
	}
	if delim, ok := tok.(json.Delim); ok {
		d.c.depth = max(d.c.depth, depth+1)
		if d.lim.depth > 0 && depth >= d.lim.depth {
			return nil, fmt.Errorf("%w: deeper than %d levels (%c at byte %d)", errTooDeep, d.lim.depth, delim, d.dec.InputOffset())
		}
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Style: yaml.FlowStyle}
			seen := map[string]bool{}
			for d.dec.More() {
				kt, err := d.dec.Token()
				if err != nil {
					return nil, err
				}
				if err := d.count(); err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				if seen[k] {
					return nil, fmt.Errorf("member %q appears twice in one object", k)
				}
				seen[k] = true
				val, err := d.value(depth + 1)
				if err != nil {
					return nil, err
				}
				key := str(k)
				key.Style = yaml.DoubleQuotedStyle
				m.Content = append(m.Content, key, val)
			}
			k := int64(len(seen))
			d.c.pairs += k * (k - 1) / 2
			if err := d.check(); err != nil {
				return nil, err
			}
			_, err := d.dec.Token() // '}'
			return m, err
		}
		s := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle}
		for d.dec.More() {
			val, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			s.Content = append(s.Content, val)
		}
		_, err := d.dec.Token() // ']'
		return s, err
	case string:
		n := str(v)
		n.Style = yaml.DoubleQuotedStyle
		return n, nil
	case json.Number:
		tag := "!!int"
		if strings.ContainsAny(string(v), ".eE") {
			tag = "!!float"
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: string(v)}, nil
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(v)}, nil
	default: // nil
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
	}
}
