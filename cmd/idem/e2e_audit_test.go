package main_test

// idem audit and idem vet through the built binary: output, exit status
// (0 clean, 1 findings, 2 cannot run), and the fixed copy.

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runCLI runs the binary and returns stdout, stderr and the exit status.
func runCLI(t *testing.T, dir string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	default:
		t.Fatalf("idem %v: %v", args, err)
		return "", "", -1
	}
}

type auditRow struct {
	Method      string   `json:"method"`
	Path        string   `json:"path"`
	OperationID string   `json:"operation_id"`
	Verdict     string   `json:"verdict"`
	Severity    string   `json:"severity"`
	Reasons     []string `json:"reasons"`
}

func auditJSON(t *testing.T, file string) ([]auditRow, int) {
	t.Helper()
	out, stderr, code := runCLI(t, "", "audit", "--openapi", file, "--format", "json")
	var rows []auditRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("audit --format json: %v\nstdout %s\nstderr %s", err, out, stderr)
	}
	return rows, code
}

// TestAuditIssueExample: the issue's check, on the binary, for 3.0 and
// 3.1, YAML and JSON.
func TestAuditIssueExample(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"issue-3.0.yaml", "issue-3.0.json", "issue-3.1.yaml", "issue-3.1.json"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src, err := filepath.Abs(filepath.Join("..", "..", "internal", "audit", "testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			rows, code := auditJSON(t, src)
			if code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			got := map[string]string{}
			for _, r := range rows {
				got[r.Method+" "+r.Path] = r.Verdict + "/" + r.Severity
				if r.Reasons == nil {
					t.Errorf("%s %s: reasons is null, want a list", r.Method, r.Path)
				}
			}
			for op, want := range map[string]string{
				"POST /payments":       "protected/",
				"POST /orders":         "missing_key/high",
				"PUT /users/{id}/name": "idempotent_by_method/",
				"GET /orders":          "idempotent_by_method/",
			} {
				if !strings.HasPrefix(got[op], want) {
					t.Errorf("%s: %q, want %q…", op, got[op], want)
				}
			}
			if len(rows) != 4 {
				t.Errorf("%d rows, want 4", len(rows))
			}

			fixed := filepath.Join(t.TempDir(), "fixed"+filepath.Ext(name))
			// The report and the exit status are the copy's.
			stdout, stderr, code := runCLI(t, "", "audit", "--openapi", src, "--fix", fixed, "--format", "json")
			if code != 0 || !strings.Contains(stderr, "wrote a fixed copy to "+fixed) || !strings.Contains(stderr, "the report is of the copy") ||
				strings.Contains(stdout, "missing_key") {
				t.Errorf("--fix: exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
			}
			rows, code = auditJSON(t, fixed)
			if code != 0 {
				t.Errorf("the fixed copy: exit status %d, want 0: %+v", code, rows)
			}
			for _, r := range rows {
				if r.Verdict == "missing_key" || (r.Severity != "none" && r.Severity != "info") {
					t.Errorf("the fixed copy: %+v", r)
				}
			}
		})
	}
}

func TestAuditCommandLine(t *testing.T) {
	t.Parallel()
	src, err := filepath.Abs(filepath.Join("..", "..", "internal", "audit", "testdata", "issue-3.0.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyPath := filepath.Join(dir, "api.yaml")
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("openapi: 3.0.3\npaths: {/a: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clean := filepath.Join(dir, "clean.json")
	if err := os.WriteFile(clean, []byte(`{"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {"/a": {"get": {"responses": {"200": {"description": "ok"}}}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		inStdout string
		inStderr string
	}{
		{"table", []string{"--openapi", src}, 1, "missing_key           high", "declare no Idempotency-Key"},
		{"markdown", []string{"--openapi", src, "--format", "markdown"}, 1, "| POST | `/orders` | createOrder | missing_key | high |", ""},
		{"clean", []string{"--openapi", clean}, 0, "1 operations: 0 protected", ""},
		{"fix to stdout", []string{"--openapi", src, "--fix", "-"}, 0, "#/components/parameters/IdempotencyKey", "the report is of the copy"},
		{"too many nodes", []string{"--openapi", src, "--max-nodes", "10"}, 2, "", "raise --max-nodes"},
		{"too deep", []string{"--openapi", src, "--max-depth", "2"}, 2, "", "raise --max-depth"},
		{"no --openapi", nil, 2, "", "--openapi FILE is required"},
		{"bad format", []string{"--openapi", src, "--format", "xml"}, 2, "", `--format "xml"`},
		{"missing file", []string{"--openapi", filepath.Join(dir, "nosuch.yaml")}, 2, "", "no such file"},
		{"malformed", []string{"--openapi", bad}, 2, "", "is not valid YAML"},
		{"too large", []string{"--openapi", src, "--max-bytes", "100"}, 2, "", "larger than 100 bytes"},
		{"fix over the input", []string{"--openapi", copyPath, "--fix", copyPath}, 2, "", "would overwrite the input"},
		{"fix over the input by another name", []string{"--openapi", copyPath, "--fix", filepath.Join(dir, ".", "api.yaml")}, 2, "", "would overwrite the input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runCLI(t, "", append([]string{"audit"}, tc.args...)...)
			if code != tc.code || !strings.Contains(stdout, tc.inStdout) || !strings.Contains(stderr, tc.inStderr) {
				t.Errorf("exit %d (want %d)\nstdout: %s\nstderr: %s\nwant %q in stdout, %q in stderr", code, tc.code, stdout, stderr, tc.inStdout, tc.inStderr)
			}
		})
	}
	if got, _ := os.ReadFile(copyPath); string(got) != string(data) {
		t.Error("the input was changed")
	}
}

// TestVetCommand: idem vet on a fixture that uses the real chi and idem
// packages reports exactly the unprotected routes and the FOR UPDATE
// reservation.
func TestVetCommand(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runCLI(t, root, "vet", "./cmd/idem-vet/testdata/app")
	want := []string{
		"cmd/idem-vet/testdata/app/app.go:20:2: POST /orders: mutating route without idempotency protection",
		"cmd/idem-vet/testdata/app/app.go:26:2: POST /legacy/refunds: mutating route without idempotency protection",
		"cmd/idem-vet/testdata/app/app.go:33:23: SELECT … FOR UPDATE on idempotency_keys before INSERT into it",
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != 1 || len(lines) != len(want) {
		t.Fatalf("exit %d (want 1), %d lines (want %d)\nstdout: %s\nstderr: %s", code, len(lines), len(want), stdout, stderr)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want %q…", i, lines[i], w)
		}
	}
	if !strings.Contains(stderr, "3 findings") {
		t.Errorf("stderr: %s", stderr)
	}
}

// TestVetCommandExitStatus: 0 for clean packages, 2 for packages that do
// not load, JSON on request. The temporary modules import nothing, so
// loading them is quick.
func TestVetCommandExitStatus(t *testing.T) {
	t.Parallel()
	mod := func(src string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/m\n\ngo 1.22\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "m.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	clean := mod("package m\n\nconst q = `SELECT 1 FROM idempotency_keys`\n")
	if stdout, stderr, code := runCLI(t, "", "vet", "-C", clean, "--json", "./..."); code != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Errorf("clean: exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}
	broken := mod("package m\n\nfunc f() int { return \"x\" }\n")
	if _, stderr, code := runCLI(t, "", "vet", "-C", broken); code != 2 || !strings.Contains(stderr, "loading the packages") {
		t.Errorf("broken: exit %d, stderr %s", code, stderr)
	}
	sql := mod("package m\n\nfunc f() []string {\n\treturn []string{`SELECT * FROM idempotency_keys WHERE k = $1 FOR UPDATE`, `INSERT INTO idempotency_keys (k) VALUES ($1)`}\n}\n")
	stdout, _, code := runCLI(t, "", "vet", "-C", sql, "--json")
	var got []struct {
		File    string `json:"file"`
		Line    int    `json:"line"`
		Column  int    `json:"column"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil || code != 1 || len(got) != 1 || got[0].File != "m.go" || got[0].Line != 4 || !strings.Contains(got[0].Message, "FOR UPDATE") {
		t.Errorf("sql: exit %d, %+v, %v\n%s", code, got, err, stdout)
	}
	if _, stderr, code := runCLI(t, "", "vet", "-C", clean, "./nosuch/..."); code != 2 {
		t.Errorf("no packages: exit %d, want 2; stderr %s", code, stderr)
	}
}

// TestAuditStdinAndFixErrors: --openapi - reads standard input; a fix that
// cannot be made exits 2 after the report.
func TestAuditStdinAndFixErrors(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binary, "audit", "--openapi", "-", "--format", "json")
	cmd.Stdin = strings.NewReader("openapi: 3.1.0\ninfo: {title: t, version: '1'}\npaths:\n  /refunds: {post: {responses: {'201': {description: ok}}}}\n")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), `"verdict": "missing_key"`) {
		t.Errorf("stdin: %v\n%s", err, out)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "items.yaml"), []byte("Pay:\n  post:\n    responses: {\"201\": {description: ok}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	api := filepath.Join(dir, "api.yaml")
	if err := os.WriteFile(api, []byte("openapi: 3.0.3\ninfo: {title: t, version: \"1\"}\npaths:\n  /pay: {$ref: 'items.yaml#/Pay'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fixed := filepath.Join(dir, "fixed.yaml")
	stdout, stderr, code := runCLI(t, "", "audit", "--openapi", api, "--fix", fixed)
	if code != 2 || !strings.Contains(stdout, "missing_key") || !strings.Contains(stderr, "bundle") {
		t.Errorf("fix of an operation in another file: exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	if _, err := os.Stat(fixed); !os.IsNotExist(err) {
		t.Errorf("a failed fix left %s: %v", fixed, err)
	}
}
