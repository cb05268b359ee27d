package audit

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type verdict struct{ method, path, verdict, severity string }

func verdicts(fs []Finding) []verdict {
	var vs []verdict
	for _, f := range fs {
		vs = append(vs, verdict{f.Method, f.Path, f.Verdict, f.Severity})
	}
	return vs
}

func mustParse(t *testing.T, doc string) *Document {
	t.Helper()
	d, err := Parse(t.Context(), []byte(doc), "test", Options{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return d
}

func mustAudit(t *testing.T, d *Document) []Finding {
	t.Helper()
	fs, err := d.Audit()
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	return fs
}

// TestIssueDocuments is the check the feature was asked for, on OpenAPI
// 3.0 and 3.1, YAML and JSON: a protected POST /payments, an unprotected
// POST /orders, PUT /users/{id}/name and GET /orders get protected,
// missing_key (high), idempotent_by_method and idempotent_by_method; the
// audit fails; the fixed copy keeps the format and audits clean, and fixing
// it again changes nothing.
func TestIssueDocuments(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"issue-3.0.yaml", "issue-3.0.json", "issue-3.1.yaml", "issue-3.1.json"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join("testdata", name)
			d, err := Load(t.Context(), path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			wantFormat := YAML
			if strings.HasSuffix(name, ".json") {
				wantFormat = JSON
			}
			if d.Format != wantFormat {
				t.Errorf("format %v, want %v", d.Format, wantFormat)
			}
			fs := mustAudit(t, d)
			byOp := map[string]verdict{}
			for _, v := range verdicts(fs) {
				byOp[v.method+" "+v.path] = v
			}
			want := map[string]string{
				"POST /payments":       Protected,
				"POST /orders":         MissingKey,
				"PUT /users/{id}/name": IdempotentByMethod,
				"GET /orders":          IdempotentByMethod,
			}
			if len(fs) != len(want) {
				t.Errorf("%d findings, want %d: %v", len(fs), len(want), verdicts(fs))
			}
			for op, v := range want {
				if byOp[op].verdict != v {
					t.Errorf("%s: verdict %q, want %q", op, byOp[op].verdict, v)
				}
			}
			if s := byOp["POST /orders"].severity; s != High {
				t.Errorf("POST /orders: severity %q, want high", s)
			}
			if !Failed(fs) {
				t.Error("Failed = false with a high missing_key")
			}

			out, changed, err := d.Fix(t.Context(), FixOptions{})
			if err != nil {
				t.Fatalf("Fix: %v", err)
			}
			if changed == 0 {
				t.Error("Fix changed nothing")
			}
			if (wantFormat == JSON) != json.Valid(out) {
				t.Errorf("fixed copy is not in the input's format %v:\n%s", wantFormat, out)
			}
			// Written beside the input, as a user would, so that any
			// relative $ref still resolves.
			fixedPath := filepath.Join(t.TempDir(), name)
			if err := os.WriteFile(fixedPath, out, 0o644); err != nil {
				t.Fatal(err)
			}
			fixed, err := Load(t.Context(), fixedPath, Options{})
			if err != nil {
				t.Fatalf("the fixed copy does not load: %v\n%s", err, out)
			}
			ffs := mustAudit(t, fixed)
			if Failed(ffs) {
				t.Error("the fixed copy still fails")
			}
			for _, f := range ffs {
				if f.Verdict == MissingKey || (f.Severity != None && f.Severity != Info) {
					t.Errorf("fixed copy: %s %s is %s/%s: %v", f.Method, f.Path, f.Verdict, f.Severity, f.Reasons)
				}
			}
			if byOp["POST /orders"].verdict == MissingKey {
				for _, f := range ffs {
					if f.Method == "POST" && f.Path == "/orders" && f.Verdict != Protected {
						t.Errorf("POST /orders after the fix: %s", f.Verdict)
					}
				}
			}
			again, changed, err := fixed.Fix(t.Context(), FixOptions{})
			if err != nil || changed != 0 || !bytes.Equal(again, out) {
				t.Errorf("fixing the fixed copy: changed %d, err %v, same bytes %v", changed, err, bytes.Equal(again, out))
			}
		})
	}
}

func TestHeaderParameterMatching(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /path-level:
    parameters:
      - {name: IDEMPOTENCY-KEY, in: header, schema: {type: string}}
    post:
      responses: {"201": {description: ok}}
  /by-ref:
    post:
      parameters:
        - $ref: '#/components/parameters/K'
      responses: {"201": {description: ok}}
  /in-query:
    post:
      parameters:
        - {name: Idempotency-Key, in: query, schema: {type: string}}
      responses: {"201": {description: ok}}
  /in-cookie:
    post:
      parameters:
        - {name: Idempotency-Key, in: cookie, schema: {type: string}}
      responses: {"201": {description: ok}}
  /other-header:
    post:
      parameters:
        - {name: X-Request-Id, in: header, schema: {type: string}}
      responses: {"201": {description: ok}}
  /put-with-key:
    put:
      parameters:
        - $ref: '#/components/parameters/K'
      responses: {"200": {description: ok}}
components:
  parameters:
    K: {name: idempotency-key, in: header, required: true, schema: {type: string}}
`
	fs := mustAudit(t, mustParse(t, doc))
	want := []verdict{
		{"POST", "/path-level", Protected, Low},
		{"POST", "/by-ref", Protected, Low},
		{"POST", "/in-query", MissingKey, Medium},
		{"POST", "/in-cookie", MissingKey, Medium},
		{"POST", "/other-header", MissingKey, Medium},
		{"PUT", "/put-with-key", Protected, Low},
	}
	if got := verdicts(fs); !slices.Equal(got, want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
	if !strings.Contains(fs[0].Reasons[0], "optional") || !strings.Contains(fs[1].Reasons[0], "(required)") {
		t.Errorf("required-ness not reported: %q, %q", fs[0].Reasons[0], fs[1].Reasons[0])
	}
}

func TestMethods(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /things/{id}:
    get: {responses: {"200": {description: ok}}}
    head: {responses: {"200": {description: ok}}}
    options: {responses: {"200": {description: ok}}}
    trace: {responses: {"200": {description: ok}}}
    put: {responses: {"200": {description: ok}}}
    delete: {responses: {"204": {description: ok}}}
    patch: {responses: {"200": {description: ok}}}
    post: {responses: {"200": {description: ok}}}
`
	want := []verdict{
		{"GET", "/things/{id}", IdempotentByMethod, None},
		{"HEAD", "/things/{id}", IdempotentByMethod, None},
		{"OPTIONS", "/things/{id}", IdempotentByMethod, None},
		{"TRACE", "/things/{id}", IdempotentByMethod, None},
		{"PUT", "/things/{id}", IdempotentByMethod, Info},
		{"DELETE", "/things/{id}", IdempotentByMethod, Info},
		{"PATCH", "/things/{id}", MissingKey, Medium},
		{"POST", "/things/{id}", MissingKey, Medium},
	}
	fs := mustAudit(t, mustParse(t, doc))
	if got := verdicts(fs); !slices.Equal(got, want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
	if !strings.Contains(fs[4].Reasons[0], "idempotent if it overwrites or deletes by ID") {
		t.Errorf("PUT reason: %q", fs[4].Reasons)
	}
	if Failed(fs) {
		t.Error("Failed with medium findings only")
	}
}

// TestSeverityFromWords: the path, operationId, summary or tags raise a
// missing key to high when a word part names money or messages.
func TestSeverityFromWords(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, op string
		want     string
	}{
		{"path", `/v1/refunds: {post: {responses: {"201": {description: ok}}}}`, High},
		{"operationId", `/x: {post: {operationId: sendWelcomeEmail, responses: {"201": {description: ok}}}}`, High},
		{"summary", `/x: {post: {summary: Transfer points to a friend, responses: {"201": {description: ok}}}}`, High},
		{"tags", `/x: {post: {tags: [Checkout], responses: {"201": {description: ok}}}}`, High},
		{"signup", `/sign_up: {post: {responses: {"201": {description: ok}}}}`, High},
		{"accountant", `/accountants: {post: {responses: {"201": {description: ok}}}}`, Medium},
		{"payload", `/payloads: {post: {operationId: uploadPayload, responses: {"201": {description: ok}}}}`, Medium},
		{"appointments", `/appointments: {post: {summary: Book an appointment, responses: {"201": {description: ok}}}}`, Medium},
		{"display", `/displays: {patch: {summary: Update the display, responses: {"200": {description: ok}}}}`, Medium},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			doc := "openapi: 3.0.3\ninfo: {title: t, version: \"1\"}\npaths:\n  " + tc.op + "\n"
			fs := mustAudit(t, mustParse(t, doc))
			if len(fs) != 1 || fs[0].Severity != tc.want {
				t.Fatalf("got %v, want severity %s", fs, tc.want)
			}
		})
	}
}

// TestIgnoreExtension: x-idem-ignore with a reason lowers a missing key to
// info, and the fix leaves the operation alone; without a reason it does
// nothing.
func TestIgnoreExtension(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /accounts/{id}/settings:
    patch:
      x-idem-ignore: overwrites the settings it is sent
      responses: {"200": {description: ok}}
  /accounts/{id}/avatar:
    patch:
      x-idem-ignore: ""
      responses: {"200": {description: ok}}
`
	d := mustParse(t, doc)
	fs := mustAudit(t, d)
	want := []verdict{
		{"PATCH", "/accounts/{id}/settings", MissingKey, Info},
		{"PATCH", "/accounts/{id}/avatar", MissingKey, High},
	}
	if got := verdicts(fs); !slices.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	if !strings.Contains(strings.Join(fs[1].Reasons, ";"), "needs a reason") {
		t.Errorf("empty reason not reported: %v", fs[1].Reasons)
	}
	out, changed, err := d.Fix(t.Context(), FixOptions{})
	if err != nil || changed != 1 {
		t.Fatalf("Fix: changed %d, %v", changed, err)
	}
	fixed := mustAudit(t, mustParse(t, string(out)))
	if fixed[0].Verdict != MissingKey || fixed[1].Verdict != Protected {
		t.Errorf("after the fix: %v", verdicts(fixed))
	}
}

func TestSensitiveWord(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/payments":               "payments",
		"createPayment":           "payment",
		"create_payment_intent":   "payment",
		"/v1/refunds/{id}":        "refunds",
		"HTTPOrders":              "orders",
		"sendEmail":               "send",
		"e-mail the receipt":      "email",
		"signUp":                  "signup",
		"check-out":               "checkout",
		"loyaltyPoints":           "points",
		"INVITATIONS":             "invitations",
		"accountant":              "",
		"payload":                 "",
		"display":                 "",
		"appointments":            "",
		"ordinal":                 "",
		"pointer":                 "",
		"sendgrid":                "",
		"paymentintents (glued)":  "",
		"":                        "",
		"Überweisung / transfers": "transfers",
	} {
		if got := sensitiveWord(in); got != want {
			t.Errorf("sensitiveWord(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRetention(t *testing.T) {
	t.Parallel()
	op := func(extra string) string {
		return `openapi: 3.0.3
info: {title: t, version: "1"` + extra + `}
paths:
  /p:
    post:
      parameters: [{$ref: '#/components/parameters/K'}]
      responses: {"400": {description: a}, "409": {description: b}, "422": {description: c}}
components:
  parameters:
    K: {name: Idempotency-Key, in: header, schema: {type: string}}
`
	}
	for _, tc := range []struct {
		name, doc string
		want      bool
	}{
		{"nothing", op(""), false},
		{"info sentence", op(`, description: "Welcome. Idempotency keys expire after 24 hours."`), true},
		{"info unrelated", op(`, description: "Sessions expire after an hour. Use an Idempotency-Key on writes."`), false},
		{"root extension", strings.Replace(op(""), "paths:", "x-idempotency-key-retention: PT24H\npaths:", 1), true},
		{"empty extension", strings.Replace(op(""), "paths:", "x-idempotency-key-retention: ''\npaths:", 1), false},
		{"param description", strings.Replace(op(""), "in: header,", "in: header, description: Kept for 7 days.,", 1), true},
		{"param extension", strings.Replace(op(""), "in: header,", "in: header, x-idempotency-key-retention: 48h,", 1), true},
		{"operation extension", strings.Replace(op(""), "    post:\n", "    post:\n      x-idempotency-key-retention: 1d\n", 1), true},
		{"path extension", strings.Replace(op(""), "  /p:\n", "  /p:\n    x-idempotency-key-retention: 1d\n", 1), true},
		{"operation description", strings.Replace(op(""), "    post:\n", "    post:\n      description: The key is retained for a day.\n", 1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := mustAudit(t, mustParse(t, tc.doc))
			got := fs[0].Severity == None
			if got != tc.want {
				t.Errorf("retention documented = %v, want %v: %v", got, tc.want, fs[0].Reasons)
			}
		})
	}
}

func TestErrorResponses(t *testing.T) {
	t.Parallel()
	doc := func(responses string) string {
		return `openapi: 3.0.3
info: {title: t, version: "1"}
x-idempotency-key-retention: 24h
paths:
  /p:
    post:
      parameters: [{name: Idempotency-Key, in: header, schema: {type: string}}]
      responses: ` + responses + "\n"
	}
	for _, tc := range []struct {
		responses string
		missing   string // "" when complete
	}{
		{`{"201": {description: a}}`, "400, 409, 422"},
		{`{"400": {description: a}, "422": {description: c}}`, "409"},
		{`{"4XX": {description: any client error}}`, ""},
		{`{default: {description: anything}}`, "400, 409, 422"},
		{`{"400": {description: a}, "409": {description: b}, "422": {description: c}}`, ""},
	} {
		fs := mustAudit(t, mustParse(t, doc(tc.responses)))
		reasons := strings.Join(fs[0].Reasons, "; ")
		if tc.missing == "" {
			if fs[0].Severity != None {
				t.Errorf("%s: %s", tc.responses, reasons)
			}
		} else if !strings.Contains(reasons, "does not document "+tc.missing+" ") {
			t.Errorf("%s: %s, want missing %s", tc.responses, reasons, tc.missing)
		}
	}
}

func TestDocumentOrder(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /z:
    post: {responses: {"200": {description: ok}}}
    get: {responses: {"200": {description: ok}}}
  /a:
    delete: {responses: {"200": {description: ok}}}
`
	var got []string
	for _, f := range mustAudit(t, mustParse(t, doc)) {
		got = append(got, f.Method+" "+f.Path)
	}
	if want := []string{"POST /z", "GET /z", "DELETE /a"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

func TestNoPaths(t *testing.T) {
	t.Parallel()
	fs := mustAudit(t, mustParse(t, "openapi: 3.1.0\ninfo: {title: t, version: \"1\"}\nwebhooks: {}\n"))
	if fs == nil || len(fs) != 0 {
		t.Errorf("got %#v, want an empty list", fs)
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, fs); err != nil || strings.TrimSpace(buf.String()) != "[]" {
		t.Errorf("JSON %q, %v", buf.String(), err)
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	fs := []Finding{{Method: "POST", Path: "/a|b", OperationID: "pay\x1b[2J", Verdict: MissingKey, Severity: High, Reasons: []string{"x | y", "<b>"}}}
	var md, table, js bytes.Buffer
	if err := WriteMarkdown(&md, fs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), `| POST | `+"`/a\\|b`"+` | pay\\x1b\[2J | missing_key | high | x \| y; &lt;b&gt; |`) {
		t.Errorf("markdown:\n%s", md.String())
	}
	if err := WriteTable(&table, fs); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(table.String(), "\x1b") || !strings.Contains(table.String(), `\x1b[2J`) {
		t.Errorf("a terminal escape in an operationId reached the table:\n%q", table.String())
	}
	if !strings.Contains(table.String(), "1 operations: 0 protected (0 with incomplete documentation), 1 missing a key (1 high), 0 idempotent by method") {
		t.Errorf("table:\n%s", table.String())
	}
	if err := WriteJSON(&js, fs); err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range got[0] {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"method", "operation_id", "path", "reasons", "severity", "verdict"}; !slices.Equal(keys, want) {
		t.Errorf("JSON fields %v, want exactly %v", keys, want)
	}
}

// TestHostileInput: what cannot be audited fails with a clear error, and
// nothing reaches the network or leaves the document's directory.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	head := "openapi: 3.0.3\ninfo: {title: t, version: \"1\"}\n"
	refTo := func(ref string) string {
		return head + "paths:\n  /a:\n    post:\n      parameters: [{$ref: '" + ref + "'}]\n      responses: {\"200\": {description: ok}}\n"
	}
	write("outside.yaml", "K: {name: Idempotency-Key, in: header, schema: {type: string}}\n")
	write("api/params.yaml", "K: {name: Idempotency-Key, in: header, schema: {type: string}}\n")

	big := head + "x-pad: '" + strings.Repeat("a", 2000) + "'\npaths: {}\n"
	laughs := "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	for i, prev := 0, "a"; i < 9; i++ {
		name := string(rune('b' + i))
		laughs += name + ": &" + name + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n"
		prev = name
	}

	for _, tc := range []struct {
		name, file, content string
		maxBytes            int64
		want                string // in the error
	}{
		{name: "missing file", file: "nosuch.yaml", want: "no such file"},
		{name: "directory", file: "api", want: "is a directory"},
		{name: "malformed YAML", content: "openapi: 3.0.3\npaths: {/a: [\n", want: "is not valid YAML"},
		{name: "malformed JSON", content: `{"openapi": "3.0.3", "paths": {`, want: "is not valid JSON"},
		{name: "empty", content: "", want: "not an OpenAPI document"},
		{name: "a list", content: "- 1\n- 2\n", want: "top level is not a mapping"},
		{name: "swagger 2", content: "swagger: '2.0'\npaths: {}\n", want: "Swagger 2.0"},
		{name: "openapi 2", content: "openapi: 2.0.0\npaths: {}\n", want: "reads 3.0 and 3.1"},
		{name: "too large", content: big, maxBytes: 1000, want: "larger than 1000 bytes"},
		{name: "alias bomb", content: head + laughs + "paths: {}\n", want: "nodes once its aliases are expanded"},
		{name: "parameter $ref loop", content: refTo("#/components/parameters/A") + "components:\n  parameters:\n    A: {$ref: '#/components/parameters/B'}\n    B: {$ref: '#/components/parameters/A'}\n", want: "does not resolve"},
		{name: "remote $ref", content: refTo("http://127.0.0.1:1/params.yaml#/K"), want: "remote $ref refused"},
		{name: "remote $ref https", content: refTo("https://example.invalid/p.yaml#/K"), want: "remote $ref refused"},
		{name: "file $ref outside the directory", file: "api/doc.yaml", content: refTo("../outside.yaml#/K"), want: "leaves the document's directory"},
		{name: "absolute file $ref", file: "api/abs.yaml", content: refTo(filepath.Join(dir, "outside.yaml") + "#/K"), want: "leaves the document's directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			file := tc.file
			if file == "" {
				file = strings.ReplaceAll(tc.name, " ", "-") + ".yaml"
			}
			path := filepath.Join(dir, file)
			if tc.content != "" || tc.name == "empty" {
				path = write(file, tc.content)
			}
			d, err := Load(t.Context(), path, Options{MaxBytes: tc.maxBytes})
			if err == nil {
				_, err = d.Audit()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}

	// A $ref to a local file inside the directory is followed.
	p := write("api/ok.yaml", refTo("params.yaml#/K"))
	d, err := Load(t.Context(), p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if fs := mustAudit(t, d); fs[0].Verdict != Protected {
		t.Errorf("key behind a file $ref: %v", fs[0])
	}
	// Parsed from memory there is no directory: file $refs are refused.
	if _, err := Parse(t.Context(), []byte(refTo("params.yaml#/K")), "mem", Options{}); err == nil {
		t.Error("a file $ref without a directory was followed")
	}
	// A schema that refers to itself is fine.
	self := head + "paths:\n  /a:\n    post:\n      requestBody: {content: {application/json: {schema: {$ref: '#/components/schemas/N'}}}}\n      responses: {\"200\": {description: ok}}\ncomponents:\n  schemas:\n    N: {type: object, properties: {next: {$ref: '#/components/schemas/N'}}}\n"
	if fs := mustAudit(t, mustParse(t, self)); len(fs) != 1 || fs[0].Verdict != MissingKey {
		t.Errorf("recursive schema: %v", fs)
	}
}
