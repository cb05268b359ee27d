package audit

import (
	"slices"
	"strings"
	"testing"
)

func TestAttackShapes(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.1.0
info: {title: t, version: "1"}
paths:
  /payments:
    $ref: '#/components/pathItems/Payments'
  /old-key:
    post:
      parameters:
        - {name: Idempotency-Key-Old, in: header, schema: {type: string}}
      responses: {"201": {description: ok}}
  /refunds:
    post:
      operationId: CREATEREFUND
      responses: {"201": {description: ok}}
  /transfers:
    POST:
      responses: {"201": {description: ok}}
components:
  pathItems:
    Payments:
      post:
        operationId: createPayment
        responses: {"201": {description: ok}}
`
	d, err := Parse(t.Context(), []byte(doc), "test", Options{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	fs := mustAudit(t, d)
	for _, f := range fs {
		t.Logf("%s %s %s %s %v", f.Method, f.Path, f.Verdict, f.Severity, f.Reasons)
	}
	want := []verdict{
		{"POST", "/payments", MissingKey, High},
		{"POST", "/old-key", MissingKey, Medium},
		{"POST", "/refunds", MissingKey, High},
	}
	// A $ref'd path item is audited as if inline, a look-alike header is
	// no key, and "POST:" (not an OpenAPI method) is no operation.
	if got := verdicts(fs); !slices.Equal(got, want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
}

func TestFixKeepsExisting409(t *testing.T) {
	t.Parallel()
	out := fixClean(t, `openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /payments:
    post:
      responses:
        "201": {description: ok}
        "409": {description: the payment is already captured}
`)
	if !strings.Contains(out, "already captured") || strings.Count(out, `"409"`)+strings.Count(out, "'409'")+strings.Count(out, "\n        409:") != 1 {
		t.Errorf("fixed:\n%s", out)
	}
	t.Log(out)
}
