package audit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixClean fixes doc, checks that the copy audits clean, and returns it.
func fixClean(t *testing.T, doc string) string {
	t.Helper()
	d := mustParse(t, doc)
	before := verdicts(mustAudit(t, d))
	out, _, err := d.Fix(t.Context(), FixOptions{Retention: "36h"})
	if err != nil {
		t.Fatalf("Fix: %v", err)
	}
	if after := verdicts(mustAudit(t, d)); len(after) != len(before) || after[0] != before[0] {
		t.Errorf("Fix changed the document it was called on: %v → %v", before, after)
	}
	fixed := mustParse(t, string(out))
	for _, f := range mustAudit(t, fixed) {
		if f.needsFix.any() {
			t.Errorf("fixed copy: %s %s still %s/%s: %v\n%s", f.Method, f.Path, f.Verdict, f.Severity, f.Reasons, out)
		}
	}
	return string(out)
}

func TestFixKeepsTheRest(t *testing.T) {
	t.Parallel()
	doc := `# Head comment.
openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /orders: # line comment
    post:
      summary: Place an order
      requestBody:
        content:
          application/json:
            schema: {type: object}
      responses:
        201: {description: Created}
    get:
      responses:
        200: {description: OK}
`
	out := fixClean(t, doc)
	for _, want := range []string{
		"# Head comment.",
		"/orders: # line comment",
		"x-idempotency-key-retention: 36h",
		"Keys are kept for 36h",
		"application/problem+json",
		"Retry-After",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("fixed copy lacks %q:\n%s", want, out)
		}
	}
	// Parameters go before the request body, as people write them.
	if strings.Index(out, "parameters:") > strings.Index(out, "requestBody:") {
		t.Errorf("parameters after requestBody:\n%s", out)
	}
	// The GET is untouched.
	if strings.Count(out, "IdempotencyKey'") != 1 {
		t.Errorf("want the parameter on exactly one operation:\n%s", out)
	}
}

func TestFixJSONKeepsOrderAndValues(t *testing.T) {
	t.Parallel()
	doc := `{"openapi": "3.0.3", "info": {"title": "caf\u00e9 <&>", "version": "1"},
"x-z": 1.50, "x-big": 12345678901234567890, "x-null": null, "x-t": true, "x-list": [], "x-map": {},
"paths": {"/refunds": {"post": {"responses": {"201": {"description": "ok"}}}}}}`
	out := fixClean(t, doc)
	if !json.Valid([]byte(out)) {
		t.Fatalf("not JSON:\n%s", out)
	}
	for _, want := range []string{`"title": "café <&>"`, `"x-z": 1.50`, `"x-big": 12345678901234567890`, `"x-null": null`, `"x-t": true`, `"x-list": []`, `"x-map": {}`} {
		if !strings.Contains(out, want) {
			t.Errorf("fixed copy lacks %s:\n%s", want, out)
		}
	}
	if i, j := strings.Index(out, `"openapi"`), strings.Index(out, `"paths"`); i > j {
		t.Errorf("member order changed:\n%s", out)
	}
}

// TestFixSharedPathItem: two paths share one path item by $ref; the fix
// edits it once.
func TestFixSharedPathItem(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.1.0
info: {title: t, version: "1"}
paths:
  /v1/charges: {$ref: '#/components/pathItems/Charges'}
  /v2/charges: {$ref: '#/components/pathItems/Charges'}
components:
  pathItems:
    Charges:
      post:
        responses: {"201": {description: ok}}
`
	out := fixClean(t, doc)
	if n := strings.Count(out, "#/components/parameters/IdempotencyKey'"); n != 1 {
		t.Errorf("parameter added %d times:\n%s", n, out)
	}
}

// TestFixNameCollisions: components of the same names that mean something
// else are left alone; the fix picks other names.
func TestFixNameCollisions(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /payments:
    post:
      parameters: [{$ref: '#/components/parameters/IdempotencyKey'}]
      responses: {"201": {description: ok}}
components:
  parameters:
    IdempotencyKey: {name: Idempotency-Key, in: query, schema: {type: string}}
  responses:
    IdempotencyKeyMissing: {description: something else}
  schemas:
    Problem: {type: string}
`
	out := fixClean(t, doc)
	for _, want := range []string{"IdempotencyKey2:", "IdempotencyKeyMissing2:", "Problem2:", "Problem: {type: string}", "IdempotencyKeyMissing: {description: something else}"} {
		if !strings.Contains(out, want) {
			t.Errorf("fixed copy lacks %q:\n%s", want, out)
		}
	}
}

func TestFixNullSections(t *testing.T) {
	t.Parallel()
	fixClean(t, `openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /send:
    post:
      parameters:
      responses: {"200": {description: ok}}
components:
`)
}

// TestFixRefusesOperationsInOtherFiles: an operation that lives in
// another file cannot be edited in this one.
func TestFixRefusesOperationsInOtherFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "items.yaml"), []byte("Pay:\n  post:\n    responses: {\"201\": {description: ok}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(dir, "api.yaml")
	if err := os.WriteFile(main, []byte("openapi: 3.0.3\ninfo: {title: t, version: \"1\"}\npaths:\n  /pay: {$ref: 'items.yaml#/Pay'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := Load(t.Context(), main, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if fs := mustAudit(t, d); len(fs) != 1 || fs[0].Verdict != MissingKey || fs[0].Severity != High {
		t.Fatalf("audit through a file $ref: %v", verdicts(fs))
	}
	if _, _, err := d.Fix(t.Context(), FixOptions{}); err == nil || !strings.Contains(err.Error(), "bundle") {
		t.Errorf("Fix: %v, want an error asking to bundle", err)
	}
}

func TestFixNothingToDo(t *testing.T) {
	t.Parallel()
	doc := "openapi: 3.0.3\ninfo: {title: t, version: \"1\"}\npaths:\n  /a: {get: {responses: {\"200\": {description: ok}}}}\n"
	out, changed, err := mustParse(t, doc).Fix(t.Context(), FixOptions{})
	if err != nil || changed != 0 || string(out) != doc {
		t.Errorf("Fix of a clean document: changed %d, err %v, output %q", changed, err, out)
	}
}

// TestFixKeepsMergedParameters: an operation that inherits its parameters
// through a YAML merge key keeps them when the key is added.
func TestFixKeepsMergedParameters(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.0.3
info: {title: t, version: "1"}
x-base: &base
  parameters:
    - {name: X-Tenant, in: header, required: true, schema: {type: string}}
  responses:
    "500": {description: broken}
paths:
  /orders:
    post:
      <<: *base
      operationId: placeOrder
`
	out := fixClean(t, doc)
	d := mustParse(t, out)
	op := d.spec.Paths.Value("/orders").Post
	if op.Parameters.GetByInAndName("header", "X-Tenant") == nil || op.Responses.Value("500") == nil {
		t.Errorf("inherited parameters or responses lost:\n%s", out)
	}
	// The base itself is left as it was.
	if base := d.spec.Extensions["x-base"].(map[string]any); len(base["parameters"].([]any)) != 1 {
		t.Errorf("x-base changed:\n%s", out)
	}
}
