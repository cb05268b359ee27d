package audit

import (
	"bytes"
	"encoding/json"
	"fmt"

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
