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

// maxJSONDepth is how deeply a JSON document may nest, as YAML documents
// may.
const maxJSONDepth = 10000

// decodeJSON parses a JSON document into a node tree like the one
// yaml.Unmarshal gives, numbers kept as written.
func decodeJSON(data []byte, root *yaml.Node) error {
	dec := json.NewDecoder(bytes.NewReader(bytes.TrimPrefix(data, []byte("\ufeff"))))
	dec.UseNumber()
	n, err := decodeJSONValue(dec, 0)
	if err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("data after the top-level value")
	}
	*root = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{n}}
	return nil
}

func decodeJSONValue(dec *json.Decoder, depth int) (*yaml.Node, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("exceeded max depth of %d", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Style: yaml.FlowStyle}
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				if seen[k] {
					return nil, fmt.Errorf("member %q appears twice in one object", k)
				}
				seen[k] = true
				val, err := decodeJSONValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				key := str(k)
				key.Style = yaml.DoubleQuotedStyle
				m.Content = append(m.Content, key, val)
			}
			_, err := dec.Token() // '}'
			return m, err
		}
		s := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle}
		for dec.More() {
			val, err := decodeJSONValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			s.Content = append(s.Content, val)
		}
		_, err := dec.Token() // ']'
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
