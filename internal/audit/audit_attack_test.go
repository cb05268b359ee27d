package audit

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/extension"
)

// fixTwice fixes doc, checks that the copy audits clean and that fixing
// the copy changes nothing, and returns the copy.
func fixTwice(t *testing.T, doc string) string {
	t.Helper()
	out := fixClean(t, doc)
	again, changed, err := mustParse(t, out).Fix(t.Context(), FixOptions{Retention: "36h"})
	if err != nil || changed != 0 || !bytes.Equal(again, []byte(out)) {
		t.Errorf("fixing the fixed copy: changed %d, err %v, same bytes %v\n%s", changed, err, bytes.Equal(again, []byte(out)), again)
	}
	return out
}

// TestAttackJSONEscapes: valid JSON that YAML reads differently or not at
// all (an escaped slash, as PHP writes paths; a surrogate pair, as Python
// writes emoji; tabs; a raw U+0085) is audited as JSON, and the fixed copy
// stays JSON with every value as it was.
func TestAttackJSONEscapes(t *testing.T) {
	t.Parallel()
	doc := "{\n\t\"openapi\": \"3.0.3\",\n\t\"info\": {\"title\": \"shop \\ud83d\\uded2\", \"version\": \"1\", \"description\": \"a\u0085b\"},\n" +
		"\t\"paths\": {\n\t\t\"\\/v1\\/payments\": {\"post\": {\"summary\": \"pay \\ud83d\\udcb8\", \"responses\": {\"201\": {\"description\": \"ok\"}}}}\n\t}\n}\n"
	if !json.Valid([]byte(doc)) {
		t.Fatal("the test document is not JSON")
	}
	fs := mustAudit(t, mustParse(t, doc))
	if want := []verdict{{"POST", "/v1/payments", MissingKey, High}}; !slices.Equal(verdicts(fs), want) {
		t.Errorf("got %v, want %v", verdicts(fs), want)
	}
	out := fixTwice(t, doc)
	var before, after struct {
		Info  map[string]string          `json:"info"`
		Paths map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal([]byte(doc), &before); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &after); err != nil {
		t.Fatalf("the fixed copy is not JSON: %v\n%s", err, out)
	}
	if !maps.Equal(before.Info, after.Info) {
		t.Errorf("info changed: %q → %q", before.Info, after.Info)
	}
	if _, ok := after.Paths["/v1/payments"]; !ok || len(after.Paths) != 1 {
		t.Errorf("paths after the fix: %v", after.Paths)
	}
}

// TestAttackJSONShapes: what a JSON document may not be is refused
// clearly, and YAML written in flow style still reads.
func TestAttackJSONShapes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc, want string }{
		{"deep", `{"openapi": "3.0.3", "x": ` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, "deeper than 500 levels"},
		{"trailing", `{"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": {}} {}`, "not valid JSON"},
		{"duplicate member", `{"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": {"/a": {}, "/a": {}}}`, "twice"},
		{"truncated", `{"openapi": "3.0.3", "paths": {"/a": {"post": `, "not valid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(t.Context(), []byte(tc.doc), "test", Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	flow := `{openapi: 3.0.3, info: {title: t, version: "1"}, paths: {/orders: {post: {responses: {"201": {description: ok}}}}}}`
	if fs := mustAudit(t, mustParse(t, flow)); len(fs) != 1 || fs[0].Severity != High {
		t.Errorf("a YAML flow document: %v", verdicts(fs))
	}
}

// TestAttackPathLevelKey: a lower-case key declared once on the path item,
// through a $ref, protects every operation under it; the fix adds only the
// missing answers, reuses that parameter for an operation elsewhere, and
// is idempotent.
func TestAttackPathLevelKey(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /payments:
    parameters:
      - $ref: '#/components/parameters/Key'
    post:
      responses: {"201": {description: ok}}
    patch:
      responses: {"200": {description: ok}}
  /orders:
    post:
      responses: {"201": {description: ok}}
components:
  parameters:
    Key: {name: idempotency-key, in: header, required: true, schema: {type: string}, x-idempotency-key-retention: 48h}
`
	fs := mustAudit(t, mustParse(t, doc))
	want := []verdict{
		{"POST", "/payments", Protected, Low},
		{"PATCH", "/payments", Protected, Low},
		{"POST", "/orders", MissingKey, High},
	}
	if got := verdicts(fs); !slices.Equal(got, want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
	out := fixTwice(t, doc)
	if strings.Contains(out, "IdempotencyKey:") || strings.Count(out, "#/components/parameters/Key") != 2 {
		t.Errorf("the fix did not reuse the document's own key parameter once:\n%s", out)
	}
	if strings.Contains(out, RetentionExtension+": 36h") {
		t.Errorf("the fix wrote a retention the document already gave:\n%s", out)
	}
}

// TestAttackUnusedKeyComponent: the document defines an Idempotency-Key
// parameter but no operation uses it, and it says nothing of retention.
// The fix reuses it and still says how long keys are kept, rather than
// failing its own check.
func TestAttackUnusedKeyComponent(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /orders:
    post:
      responses: {"201": {description: ok}}
components:
  parameters:
    K: {name: idempotency-key, in: header, required: true, schema: {type: string}}
`
	out := fixTwice(t, doc)
	if !strings.Contains(out, "#/components/parameters/K'") || !strings.Contains(out, RetentionExtension+": 36h") {
		t.Errorf("fixed:\n%s", out)
	}
	// A document-level retention is kept, not overwritten.
	out = fixTwice(t, strings.Replace(doc, "paths:", RetentionExtension+": 72h\npaths:", 1))
	if !strings.Contains(out, RetentionExtension+": 72h") || strings.Contains(out, "36h") {
		t.Errorf("fixed:\n%s", out)
	}
}

// TestAttackWebhooks: OpenAPI 3.1 webhooks are requests the API sends;
// they get no findings and the fix leaves them alone.
func TestAttackWebhooks(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.1.0
info: {title: t, version: "1"}
webhooks:
  paymentSucceeded:
    post:
      operationId: sendPaymentEvent
      responses: {"200": {description: ok}}
paths:
  /charges:
    post:
      responses: {"201": {description: ok}}
`
	fs := mustAudit(t, mustParse(t, doc))
	if want := []verdict{{"POST", "/charges", MissingKey, High}}; !slices.Equal(verdicts(fs), want) {
		t.Errorf("got %v, want %v", verdicts(fs), want)
	}
	out := fixTwice(t, doc)
	d := mustParse(t, out)
	if wh := d.spec.Webhooks["paymentSucceeded"]; wh == nil || len(wh.Post.Parameters) != 0 || wh.Post.Responses.Len() != 1 {
		t.Errorf("the fix changed a webhook:\n%s", out)
	}
	// Webhooks alone: nothing to audit, nothing to fix.
	only := "openapi: 3.1.0\ninfo: {title: t, version: \"1\"}\nwebhooks:\n  refund: {post: {responses: {\"200\": {description: ok}}}}\n"
	if fs := mustAudit(t, mustParse(t, only)); len(fs) != 0 {
		t.Errorf("webhooks only: %v", verdicts(fs))
	}
	if out, changed, err := mustParse(t, only).Fix(t.Context(), FixOptions{}); err != nil || changed != 0 || string(out) != only {
		t.Errorf("fixing webhooks only: changed %d, err %v\n%s", changed, err, out)
	}
}

// TestAttackNotOpenAPI: documents that are something else are refused
// with an error that says what they are not.
func TestAttackNotOpenAPI(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc, want string }{
		{"kubernetes", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n", `no "openapi" field`},
		{"json list", `[{"openapi": "3.0.3"}]`, "top level is not a mapping"},
		{"json string", `"openapi"`, "top level is not a mapping"},
		{"binary", "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not valid YAML"},
		{"openapi as a number", "openapi: 3\ninfo: {title: t, version: '1'}\npaths: {}\n", `OpenAPI "3"`},
		{"openapi as a mapping", "openapi: {v: 3.0.3}\npaths: {}\n", `no "openapi" field`},
		{"swagger json", `{"swagger": "2.0", "info": {"title": "t", "version": "1"}, "paths": {}}`, "Swagger 2.0"},
		{"paths a list", "openapi: 3.0.3\ninfo: {title: t, version: '1'}\npaths: [/a]\n", "test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse(t.Context(), []byte(tc.doc), "test", Options{})
			if err == nil {
				_, err = d.Audit()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestAttackHugeFile: a 50 MB file is refused by its size, before it is
// parsed.
func TestAttackHugeFile(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "huge.yaml")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("openapi: 3.0.3\nx-pad: [1"); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(50 << 20); err != nil { // the rest is NUL bytes
		t.Fatal(err)
	}
	f.Close()
	_, err = Load(t.Context(), p, Options{})
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("error %v, want one about the size", err)
	}
}

// TestAttackRenderForgery: a path or operationId cannot add a row or a
// column to the table or the Markdown.
func TestAttackRenderForgery(t *testing.T) {
	t.Parallel()
	fs := []Finding{{
		Method: "POST", Path: "/a\n| GET | `/forged` | x | protected | none | ok |\\|b\r\u2028",
		OperationID: "op|x\t\u202e", Verdict: MissingKey, Severity: High, Reasons: []string{"r\nr"},
	}}
	var md, table bytes.Buffer
	if err := WriteMarkdown(&md, fs); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(md.String()), "\n")
	if len(lines) != 5 { // header, rule, one row, blank, summary
		t.Fatalf("markdown has %d lines:\n%s", len(lines), md.String())
	}
	row := lines[2]
	if unescaped := strings.Count(row, "|") - strings.Count(row, `\|`); unescaped != 7 {
		t.Errorf("markdown row has %d cell borders, want 7: %s", unescaped, row)
	}
	if strings.ContainsAny(row, "\r\t\u2028\u202e") || strings.Count(row, "`") != 2 {
		t.Errorf("markdown row: %q", row)
	}
	if err := WriteTable(&table, fs); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(table.String()), "\n"); len(lines) != 3 || strings.ContainsAny(table.String(), "\r\t\u2028\u202e") {
		t.Errorf("table:\n%q", table.String())
	}
}

// TestAttackMarkdownInjection: what a document writes (an operationId, a
// reason quoting it) renders as the same text in a GitHub-flavoured
// Markdown table, never as a link, an image, an autolink, HTML, an entity
// or code that could hide or dress up a finding in a pull request comment.
func TestAttackMarkdownInjection(t *testing.T) {
	t.Parallel()
	md := goldmark.New(goldmark.WithExtensions(extension.GFM))
	for _, hostile := range []string{
		"[Approve](https://evil.example/x)",
		"![pixel](https://evil.example/p.png)",
		"[ref][1]\n\n[1]: https://evil.example",
		"<https://evil.example>",
		"<img src=x onerror=alert(1)>",
		"<a href='https://evil.example'>ok</a>",
		"&lt;b&gt; &#91;x&#93;(https://evil.example)",
		"`code` and ``two``",
		`\[escaped\](https://evil.example)`,
		"[a](<https://evil.example> \"t\")",
		"https://evil.example/approve",
		"see www.evil.example or WwW.evil.example",
		"mail admin@evil.example",
		"ftp://evil.example mailto:x@evil.example",
	} {
		fs := []Finding{{Method: "POST", Path: "/p", OperationID: hostile, Verdict: MissingKey, Severity: High, Reasons: []string{"quoting " + hostile}}}
		var src, out bytes.Buffer
		if err := WriteMarkdown(&src, fs); err != nil {
			t.Fatal(err)
		}
		if err := md.Convert(src.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		html := out.String()
		for _, tag := range []string{"<a ", "<img", "<code>ref", "<script", "onerror=alert(1)>"} {
			if strings.Contains(html, tag) {
				t.Errorf("operationId %q renders %q:\n%s", hostile, tag, html)
			}
		}
		// The cell shows the operationId as written (control characters
		// aside, which printable spells out).
		want := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(printable(hostile))
		if !strings.Contains(html, "<td>"+want+"</td>") {
			t.Errorf("operationId %q: its cell does not read as written (%q):\n%s", hostile, want, html)
		}
	}
}
