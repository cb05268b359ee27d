package audit

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// DefaultRetention is what a fix writes for how long keys are kept when the
// document says nothing: idem's default retention.
const DefaultRetention = "24h"

// FixOptions tune Fix.
type FixOptions struct {
	// Retention is how long the server keeps keys, written as
	// x-idempotency-key-retention and in the added parameter's description
	// where the document says nothing. Defaults to DefaultRetention.
	Retention string
}

// Fix returns a copy of the document, in its own format, in which every
// operation that needs it declares the Idempotency-Key header parameter and
// documents the 400, 409 and 422 answers (as application/problem+json),
// and the document says how long keys are kept. What it adds goes under
// components and is referred to by $ref; everything else is left as it
// was. It also returns how many operations it changed. The copy is audited
// before it is returned, so a copy that would not audit clean is an error.
func (d *Document) Fix(ctx context.Context, opts FixOptions) ([]byte, int, error) {
	out, changed, _, err := d.FixAudit(ctx, opts)
	return out, changed, err
}

// FixAudit is Fix, and also returns the audit of the copy: what a report
// about the fixed document says. When nothing needed a change, the copy is
// the document as read, and so is its audit.
func (d *Document) FixAudit(ctx context.Context, opts FixOptions) ([]byte, int, []Finding, error) {
	if opts.Retention == "" {
		opts.Retention = DefaultRetention
	}
	fs, err := d.Audit()
	if err != nil {
		return nil, 0, nil, err
	}
	work := &Document{Name: d.Name, Format: d.Format, Version: d.Version, root: copyNode(d.root, map[*yaml.Node]*yaml.Node{}), loc: d.loc}
	top := docMapping(work.root)

	names := newComponentNames(work)
	changed := 0
	docRetention := false
	edited := map[*yaml.Node]bool{} // a path item may be shared by $ref
	for _, f := range fs {
		if !f.needsFix.any() {
			continue
		}
		op, err := work.operationNode(f.Path, f.Method)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("cannot fix %s %s: %w", f.Method, f.Path, err)
		}
		if edited[op] {
			changed++
			continue
		}
		edited[op] = true
		if f.needsFix.key {
			params, err := ensureSequence(op, "parameters", "requestBody", "responses")
			if err != nil {
				return nil, 0, nil, fmt.Errorf("cannot fix %s %s: %w", f.Method, f.Path, err)
			}
			params.Content = append(params.Content, mapping("$ref", "#/components/parameters/"+names.param(opts.Retention)))
			// A parameter the document already defined says how long
			// keys are kept only if its author wrote it there.
			if names.reused && !d.componentParamRetains(names.paramName) && d.docRetention() == "" {
				docRetention = true
			}
		} else if f.needsFix.retention {
			docRetention = true
		}
		if len(f.needsFix.responses) > 0 {
			resps, err := ensureMapping(op, "responses")
			if err != nil {
				return nil, 0, nil, fmt.Errorf("cannot fix %s %s: %w", f.Method, f.Path, err)
			}
			style := keyStyle(resps)
			for _, code := range f.needsFix.responses {
				k := str(code)
				k.Style = style
				resps.Content = append(resps.Content, k, mapping("$ref", "#/components/responses/"+names.response(code)))
			}
		}
		changed++
	}
	if changed == 0 {
		return bytes.Clone(d.data), 0, fs, nil
	}
	if docRetention {
		setValue(top, RetentionExtension, str(opts.Retention))
	}
	if err := names.write(top); err != nil {
		return nil, 0, nil, err
	}
	out, err := work.encode()
	if err != nil {
		return nil, 0, nil, err
	}
	fixed, err := verifyFixed(ctx, out, d, changed)
	if err != nil {
		return nil, 0, nil, err
	}
	return out, changed, fixed, nil
}

// componentParamRetains reports whether the parameter under
// components/parameters says how long keys are kept.
func (d *Document) componentParamRetains(name string) bool {
	if d.spec.Components == nil || d.spec.Components.Parameters[name] == nil {
		return false
	}
	p := d.spec.Components.Parameters[name].Value
	return p != nil && (extensionValue(p.Extensions) != "" || mentionsRetention(p.Description, true))
}

// verifyFixed audits a fixed copy, in which changed operations were fixed:
// every operation must be protected with complete documentation, or
// idempotent by method. It returns the copy's findings.
func verifyFixed(ctx context.Context, out []byte, orig *Document, changed int) ([]Finding, error) {
	// The copy holds what the original held and what the fix added (a
	// parameter and three answers per operation, the components once), a
	// few levels deep: a document just under the limits still verifies.
	opts := orig.opts
	opts.MaxBytes = max(opts.MaxBytes, int64(len(out))+1)
	opts.MaxNodes += fixNodesPerOperation*int64(changed) + fixNodesOnce
	opts.MaxDepth = max(opts.MaxDepth, 16)
	fixed, err := parse(ctx, out, orig.Name+" (fixed)", orig.loc, opts)
	if err != nil {
		return nil, fmt.Errorf("the fixed copy does not load: %w", err)
	}
	fs, err := fixed.Audit()
	if err != nil {
		return nil, fmt.Errorf("the fixed copy does not audit: %w", err)
	}
	for _, f := range fs {
		if f.needsFix.any() {
			return nil, fmt.Errorf("the fixed copy still needs work on %s %s: %s", f.Method, f.Path, strings.Join(f.Reasons, "; "))
		}
	}
	return fs, nil
}

// At most what a fix adds, in nodes as Options.MaxNodes counts them: per
// operation a parameter $ref and three answers (with the keys and mappings
// that may hold them), and once the components and the retention.
const (
	fixNodesPerOperation = 32
	fixNodesOnce         = 1024
)

// operationNode returns the mapping of one operation in the node tree.
func (d *Document) operationNode(path, method string) (*yaml.Node, error) {
	item, err := d.pathItemNode(path)
	if err != nil {
		return nil, err
	}
	lower := strings.ToLower(method)
	if op := mapValue(item, lower); op != nil {
		return d.follow(op)
	}
	if extra := mapValue(item, "additionalOperations"); extra != nil {
		if op := mapValue(extra, method); op != nil {
			return d.follow(op)
		}
	}
	return nil, fmt.Errorf("operation not found in the document")
}

// componentNames picks the names of the components a fix adds, avoiding
// those the document already uses, and remembers which were used.
type componentNames struct {
	existing  map[string]map[string]bool // section → names
	paramName string                     // reused or added parameter
	reused    bool
	responses map[string]string // code → name
	problem   string            // the problem schema's name, once a response needs it
	retention string
}

var responseBase = map[string]string{
	"400": "IdempotencyKeyMissing",
	"409": "IdempotencyKeyInFlight",
	"422": "IdempotencyKeyMismatch",
}

func newComponentNames(d *Document) *componentNames {
	n := &componentNames{existing: map[string]map[string]bool{}, responses: map[string]string{}}
	comps := mapValue(docMapping(d.root), "components")
	for _, section := range []string{"parameters", "responses", "schemas"} {
		n.existing[section] = map[string]bool{}
		sec := mapValue(comps, section)
		if sec == nil || sec.Kind != yaml.MappingNode {
			continue
		}
		for i := 0; i+1 < len(sec.Content); i += 2 {
			name := sec.Content[i].Value
			n.existing[section][name] = true
			// An Idempotency-Key header parameter the document already
			// defines is reused, not added again.
			if section == "parameters" && n.paramName == "" {
				v, err := d.follow(sec.Content[i+1])
				if err == nil && strings.EqualFold(scalar(v, "in"), "header") && strings.EqualFold(scalar(v, "name"), HeaderName) {
					n.paramName, n.reused = name, true
				}
			}
		}
	}
	return n
}

func scalar(m *yaml.Node, key string) string {
	if v := mapValue(m, key); v != nil && v.Kind == yaml.ScalarNode {
		return v.Value
	}
	return ""
}

func (n *componentNames) unique(section, base string) string {
	name := base
	for i := 2; n.existing[section][name]; i++ {
		name = fmt.Sprintf("%s%d", base, i)
	}
	n.existing[section][name] = true
	return name
}

func (n *componentNames) param(retention string) string {
	if n.paramName == "" {
		n.paramName = n.unique("parameters", "IdempotencyKey")
		n.retention = retention
	}
	return n.paramName
}

func (n *componentNames) response(code string) string {
	if name, ok := n.responses[code]; ok {
		return name
	}
	name := n.unique("responses", responseBase[code])
	n.responses[code] = name
	if n.problem == "" {
		n.problem = n.unique("schemas", "Problem")
	}
	return name
}

// write adds the components that were used to the document.
func (n *componentNames) write(top *yaml.Node) error {
	comps, err := ensureMapping(top, "components")
	if err != nil {
		return err
	}
	if n.paramName != "" && !n.reused {
		params, err := ensureMapping(comps, "parameters")
		if err != nil {
			return err
		}
		setValue(params, n.paramName, keyParameter(n.retention))
	}
	if len(n.responses) > 0 {
		resps, err := ensureMapping(comps, "responses")
		if err != nil {
			return err
		}
		for _, code := range draftErrors {
			if name, ok := n.responses[code]; ok {
				setValue(resps, name, problemResponse(code, "#/components/schemas/"+n.problem))
			}
		}
		schemas, err := ensureMapping(comps, "schemas")
		if err != nil {
			return err
		}
		setValue(schemas, n.problem, problemSchema())
	}
	return nil
}

// problemSchema describes an RFC 9457 problem document.
func problemSchema() *yaml.Node {
	return mapping(
		"description", "An RFC 9457 problem document.",
		"type", "object",
		"properties", mapping(
			"type", mapping("type", "string", "format", "uri-reference"),
			"title", mapping("type", "string"),
			"status", mapping("type", "integer"),
			"detail", mapping("type", "string"),
		),
	)
}

// keyStyle returns the quoting style of the keys already in a responses
// mapping, so that added status codes look like their neighbours.
func keyStyle(resps *yaml.Node) yaml.Style {
	for i := 0; i+1 < len(resps.Content); i += 2 {
		if k := resps.Content[i]; k.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) != 0 {
			return k.Style & (yaml.SingleQuotedStyle | yaml.DoubleQuotedStyle)
		}
	}
	return 0
}

func keyParameter(retention string) *yaml.Node {
	return mapping(
		"name", HeaderName,
		"in", "header",
		"required", true,
		"description", "A unique key for this request, such as a UUID (at most 255 visible ASCII characters). "+
			"The server runs the operation at most once per key and answers every retry with the first answer. "+
			"Keys are kept for "+retention+"; a retry after that runs the operation again. "+
			"See draft-ietf-httpapi-idempotency-key-header.",
		"schema", mapping("type", "string", "minLength", 1, "maxLength", 255),
		RetentionExtension, retention,
	)
}

func problemResponse(code, schemaRef string) *yaml.Node {
	desc := map[string]string{
		"400": "The Idempotency-Key header is missing or malformed.",
		"409": "A request with this Idempotency-Key is still being processed (retry after Retry-After), or its outcome awaits review.",
		"422": "This Idempotency-Key was already used with a different request.",
	}[code]
	r := mapping("description", desc)
	if code == "409" {
		setValue(r, "headers", mapping("Retry-After", mapping(
			"description", "Seconds to wait before retrying.",
			"schema", mapping("type", "integer"),
		)))
	}
	setValue(r, "content", mapping("application/problem+json", mapping("schema", mapping("$ref", schemaRef))))
	return r
}

// copyNode deep-copies a node tree, aliases included.
func copyNode(n *yaml.Node, seen map[*yaml.Node]*yaml.Node) *yaml.Node {
	if n == nil {
		return nil
	}
	if c, ok := seen[n]; ok {
		return c
	}
	c := *n
	seen[n] = &c
	c.Alias = copyNode(n.Alias, seen)
	c.Content = make([]*yaml.Node, len(n.Content))
	for i, k := range n.Content {
		c.Content[i] = copyNode(k, seen)
	}
	return &c
}

// encode writes the node tree in the document's format.
func (d *Document) encode() ([]byte, error) {
	if d.Format == JSON {
		return encodeJSON(d.root)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(d.root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
