package audit

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"go.yaml.in/yaml/v3"
)

// Verdicts: what an operation needs.
const (
	// Protected: the operation declares an Idempotency-Key header parameter.
	Protected = "protected"
	// MissingKey: a POST or PATCH (or another method that is not idempotent
	// by definition) without an Idempotency-Key header parameter.
	MissingKey = "missing_key"
	// IdempotentByMethod: GET, HEAD, OPTIONS, TRACE, QUERY, PUT or DELETE,
	// which a retry cannot repeat by the method's own meaning.
	IdempotentByMethod = "idempotent_by_method"
)

// Severities, from most to least urgent.
const (
	// High: a missing key on an operation that suggests money or messages.
	High = "high"
	// Medium: any other missing key.
	Medium = "medium"
	// Low: a protected operation whose documentation falls short of what
	// the IETF draft asks (how long keys are kept, the 400/409/422 errors).
	Low = "low"
	// Info: worth a look, nothing to do if the method keeps its promise
	// (PUT and DELETE).
	Info = "info"
	// None: nothing to do.
	None = "none"
)

// Finding is the verdict on one operation.
type Finding struct {
	Method      string   `json:"method"`
	Path        string   `json:"path"`
	OperationID string   `json:"operation_id"`
	Verdict     string   `json:"verdict"`
	Severity    string   `json:"severity"`
	Reasons     []string `json:"reasons"`

	needsFix fixNeeds
}

// fixNeeds is what a fix adds to an operation.
type fixNeeds struct {
	key       bool
	responses []string // status codes to add
	retention bool
}

func (n fixNeeds) any() bool { return n.key || len(n.responses) > 0 || n.retention }

// Failed reports whether any finding is a missing key of high severity:
// what makes idem audit exit with status 1.
func Failed(fs []Finding) bool {
	for _, f := range fs {
		if f.Verdict == MissingKey && f.Severity == High {
			return true
		}
	}
	return false
}

// HeaderName is the header the IETF draft defines.
const HeaderName = "Idempotency-Key"

// RetentionExtension is the specification extension idem audit reads (and a
// fix writes) to learn how long keys are kept: on the Idempotency-Key
// parameter, the operation, its path item, or the document. Any non-empty
// value counts, such as "24h" or "PT24H".
const RetentionExtension = "x-idempotency-key-retention"

// IgnoreExtension on an operation, with a reason as its value, says that a
// POST or PATCH is safe to run twice without a key (a PATCH that only
// overwrites settings, say): the finding stays missing_key, with severity
// info, and a fix leaves the operation alone.
const IgnoreExtension = "x-idem-ignore"

// draftErrors are the error statuses the draft asks a resource to document:
// 400 for a missing or malformed key, 409 for a request still in flight,
// 422 for a key reused with another request.
var draftErrors = []string{"400", "409", "422"}

// methodOrder is the order of operations in a path item when the document
// itself gives none.
var methodOrder = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace", "query"}

// Audit returns a finding for every operation under paths, in the
// document's order. Webhooks and callbacks are requests the API sends, not
// receives, and are left out.
func (d *Document) Audit() ([]Finding, error) {
	if d.spec.Paths == nil {
		return []Finding{}, nil
	}
	docRetention := d.docRetention()
	fs := []Finding{}
	for _, path := range d.pathOrder() {
		item := d.spec.Paths.Value(path)
		if item == nil {
			continue
		}
		ops := item.Operations()
		for _, method := range d.methodOrderOf(path, ops) {
			f, err := auditOp(path, method, item, ops[method], docRetention)
			if err != nil {
				return nil, err
			}
			fs = append(fs, f)
		}
	}
	return fs, nil
}

func auditOp(path, method string, item *openapi3.PathItem, op *openapi3.Operation, docRetention string) (Finding, error) {
	f := Finding{Method: method, Path: path, OperationID: op.OperationID, Reasons: []string{}}
	key, err := keyParam(item.Parameters, op.Parameters)
	if err != nil {
		return f, fmt.Errorf("%s %s: %w", method, path, err)
	}
	switch {
	case key != nil:
		f.Verdict, f.Severity = Protected, None
		if key.Required {
			f.Reasons = append(f.Reasons, "declares the Idempotency-Key header (required)")
		} else {
			f.Reasons = append(f.Reasons, "declares the Idempotency-Key header (optional: a request without one is not protected)")
		}
		if where := retentionOf(key, op, item, docRetention); where != "" {
			f.Reasons = append(f.Reasons, "says how long keys are kept ("+where+")")
		} else {
			f.Severity = Low
			f.needsFix.retention = true
			f.Reasons = append(f.Reasons, "does not say how long keys are kept (the IETF draft asks for it; set "+RetentionExtension+" or say so in the parameter's description)")
		}
		if missing := missingErrors(op); len(missing) > 0 {
			f.Severity = Low
			f.needsFix.responses = missing
			f.Reasons = append(f.Reasons, "does not document "+strings.Join(missing, ", ")+" (the IETF draft's errors: 400 missing or malformed key, 409 request in flight, 422 key reused with another request)")
		} else {
			f.Reasons = append(f.Reasons, "documents 400, 409 and 422")
		}
	case idempotentMethod(method):
		f.Verdict, f.Severity = IdempotentByMethod, None
		switch method {
		case http.MethodPut, http.MethodDelete:
			f.Severity = Info
			f.Reasons = append(f.Reasons, method+" is idempotent if it overwrites or deletes by ID; if it appends, counts or sends, it needs a key too")
		default:
			f.Reasons = append(f.Reasons, method+" is safe: a retry changes nothing")
		}
	default:
		f.Verdict, f.Severity = MissingKey, Medium
		f.Reasons = append(f.Reasons, method+" is not idempotent and declares no Idempotency-Key header: a retry after a lost answer runs it twice")
		if v, ok := op.Extensions[IgnoreExtension]; ok {
			if reason := strings.TrimSpace(fmt.Sprint(v)); v != nil && reason != "" {
				f.Severity = Info
				f.Reasons = append(f.Reasons, "ignored ("+IgnoreExtension+"): "+reason)
				break
			}
			f.Reasons = append(f.Reasons, IgnoreExtension+" needs a reason; it is not honoured without one")
		}
		f.needsFix = fixNeeds{key: true, responses: missingErrors(op), retention: true}
		for _, s := range []struct{ what, text string }{
			{"path", path}, {"operationId", op.OperationID}, {"summary", op.Summary}, {"tags", strings.Join(op.Tags, " ")},
		} {
			if w := sensitiveWord(s.text); w != "" {
				f.Severity = High
				f.Reasons = append(f.Reasons, fmt.Sprintf("its %s mentions %q: money or messages, where a duplicate costs", s.what, w))
				break
			}
		}
	}
	return f, nil
}

// keyParam returns the Idempotency-Key header parameter an operation
// declares, itself or through its path item (the operation's own
// parameter of the same name wins). Names compare case-insensitively, as
// HTTP header names do.
func keyParam(pathParams, opParams openapi3.Parameters) (*openapi3.Parameter, error) {
	for _, params := range []openapi3.Parameters{opParams, pathParams} {
		for _, ref := range params {
			if ref == nil {
				continue
			}
			if ref.Value == nil {
				return nil, fmt.Errorf("parameter $ref %q does not resolve (a $ref loop?)", ref.Ref)
			}
			if strings.EqualFold(ref.Value.In, openapi3.ParameterInHeader) && strings.EqualFold(ref.Value.Name, HeaderName) {
				return ref.Value, nil
			}
		}
	}
	return nil, nil
}

// idempotentMethod reports whether RFC 9110 (and the QUERY draft) define
// the method as idempotent.
func idempotentMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, "QUERY", http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// missingErrors returns the draft's error statuses the operation does not
// document. A 4XX range documents them all; "default" does not.
func missingErrors(op *openapi3.Operation) []string {
	if op.Responses != nil && op.Responses.Value("4XX") != nil {
		return nil
	}
	var missing []string
	for _, code := range draftErrors {
		if op.Responses == nil || op.Responses.Value(code) == nil {
			missing = append(missing, code)
		}
	}
	return missing
}

// pathOrder returns the document's paths in the order it writes them.
func (d *Document) pathOrder() []string {
	var order []string
	seen := map[string]bool{}
	if paths := mapValue(docMapping(d.root), "paths"); paths != nil && paths.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(paths.Content); i += 2 {
			p := paths.Content[i].Value
			if d.spec.Paths.Value(p) != nil && !seen[p] {
				seen[p] = true
				order = append(order, p)
			}
		}
	}
	// Anything the node tree did not show (it always should), sorted.
	var rest []string
	for p := range d.spec.Paths.Map() {
		if !seen[p] {
			rest = append(rest, p)
		}
	}
	slices.Sort(rest)
	return append(order, rest...)
}

// methodOrderOf returns the upper-case methods of ops in the order the
// path item writes them (following a local $ref), then any others in
// methodOrder, then the rest sorted.
func (d *Document) methodOrderOf(path string, ops map[string]*openapi3.Operation) []string {
	var order []string
	seen := map[string]bool{}
	add := func(m string) {
		m = strings.ToUpper(m)
		if _, ok := ops[m]; ok && !seen[m] {
			seen[m] = true
			order = append(order, m)
		}
	}
	if item, _ := d.pathItemNode(path); item != nil {
		for i := 0; i+1 < len(item.Content); i += 2 {
			add(item.Content[i].Value)
		}
		if extra := mapValue(item, "additionalOperations"); extra != nil && extra.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(extra.Content); i += 2 {
				add(extra.Content[i].Value)
			}
		}
	}
	for _, m := range methodOrder {
		add(m)
	}
	var rest []string
	for m := range ops {
		if !seen[m] {
			rest = append(rest, m)
		}
	}
	slices.Sort(rest)
	return append(order, rest...)
}

// retentionOf says where an operation's documentation tells how long keys
// are kept, or "" when it does not: the retention extension on the key
// parameter, the operation, the path item or the document; or a sentence
// in the key parameter's description, the operation's, or the document's
// info.description.
func retentionOf(key *openapi3.Parameter, op *openapi3.Operation, item *openapi3.PathItem, docRetention string) string {
	for _, s := range []struct {
		where string
		exts  map[string]any
	}{{"on the parameter", key.Extensions}, {"on the operation", op.Extensions}, {"on the path", item.Extensions}} {
		if v := extensionValue(s.exts); v != "" {
			return RetentionExtension + ": " + v + " " + s.where
		}
	}
	if mentionsRetention(key.Description, true) {
		return "in the parameter's description"
	}
	if mentionsRetention(op.Description, false) {
		return "in the operation's description"
	}
	return docRetention
}
