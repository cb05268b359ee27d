package main_test

// What a newcomer meets first: the messages for mistakes one makes on the
// first day, the version, the help texts, and JSON bodies sent without a
// JSON Content-Type.

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBadConfigOpensNoStore: a config file with a mistake is refused before
// the store is opened, so the default ./idem.db is never created, and the
// message names the line and, for a misspelt field, the field meant.
func TestBadConfigOpensNoStore(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, yaml, want string }{
		{"misspelt field", "upstream: http://127.0.0.1:1\nretension: 24h\n", `line 2: unknown field "retension" (did you mean retention?)`},
		{"duplicate route", "upstream: http://127.0.0.1:1\nroutes:\n  - match: POST /pay\n  - match: POST /pay\n", `line 4: route "POST /pay" conflicts with the route on line 3`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cfg := filepath.Join(dir, "idem.yaml")
			os.WriteFile(cfg, []byte(tt.yaml), 0o600)
			cmd := exec.CommandContext(t.Context(), binary, "serve", "--config", cfg, "--listen", "127.0.0.1:0")
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("idem serve started with a bad file:\n%s", out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("output %q does not contain %q", out, tt.want)
			}
			if strings.Contains(string(out), ".go:") {
				t.Errorf("output shows a Go source path: %s", out)
			}
			if _, err := os.Stat(filepath.Join(dir, "idem.db")); err == nil {
				t.Error("a bad config file created ./idem.db")
			}
		})
	}
}

func TestFirstDayFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--upstream", "127.0.0.1:3000"}, `upstream "127.0.0.1:3000" has no scheme: add http:// (--upstream http://127.0.0.1:3000)`},
		{[]string{"serve", "--upstream", "http://127.0.0.1:1", "--store", "sqlite:" + dir + "/x.db"}, "write sqlite://" + dir + "/x.db for the absolute path " + dir + "/x.db"},
	}
	for _, tt := range tests {
		cmd := exec.CommandContext(t.Context(), binary, tt.args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tt.want) {
			t.Errorf("idem %s: %v\n%s\nwant %q", strings.Join(tt.args, " "), err, out, tt.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused command line left %v", entries)
	}
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	flag, err := exec.Command(binary, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("idem --version: %v\n%s", err, flag)
	}
	cmd, _ := exec.Command(binary, "version").CombinedOutput()
	if string(flag) != string(cmd) {
		t.Errorf("idem --version = %q, idem version = %q", flag, cmd)
	}
	if !regexp.MustCompile(`^idem \S`).Match(flag) || strings.Contains(string(flag), "idem (devel)") {
		t.Errorf("idem --version = %q: no version", flag)
	}
}

// TestVersionStamped builds the binary as make build does and finds the
// stamped version.
func TestVersionStamped(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "idem")
	out, err := exec.Command("go", "build", "-ldflags", "-X github.com/idem-dev/idem/internal/cli.version=v9.8.7-test", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "idem v9.8.7-test") {
		t.Errorf("stamped idem version = %q, %v", out, err)
	}
}

// TestHelpMatchesBehaviour: the help texts count what the commands do.
func TestHelpMatchesBehaviour(t *testing.T) {
	t.Parallel()
	demo, _ := exec.Command(binary, "demo", "--help").CombinedOutput()
	if !strings.Contains(string(demo), "five cases in six requests") {
		t.Errorf("idem demo --help does not count six requests:\n%s", demo)
	}
	serve, _ := exec.Command(binary, "serve", "--help").CombinedOutput()
	for _, w := range []string{"only with a token", "Content-Type is JSON"} {
		if !strings.Contains(string(serve), w) {
			t.Errorf("idem serve --help lacks %q", w)
		}
	}
}

// TestFormBodyMismatchSaysWhy: a body sent without a JSON Content-Type (as
// curl -d sends it) is compared byte for byte; the 422 says so.
func TestFormBodyMismatchSaysWhy(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t))
	base := "http://" + p.addr
	post := func(body string) (int, string) { // as curl -d sends it
		req, _ := http.NewRequest("POST", base+"/pay", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status, _ := post(`{"a":1,"b":2}`)
	want(t, "first", status, 201)
	status, body := post(`{"b":2,"a":1}`)
	want(t, "reordered form body", status, 422)
	if !strings.Contains(body, "compared byte for byte") {
		t.Errorf("422 detail does not say why: %s", body)
	}
	want(t, "JSON", do(t, "POST", base+"/json", "k", `{"a":1,"b":2}`).status, 201)
	want(t, "reordered JSON body", do(t, "POST", base+"/json", "k", `{"b":2,"a":1}`).header.Get("Idempotent-Replayed"), "true")
}

// TestUpstreamProblemsCarryTheKey: 502s echo the request's key, protected
// or not.
func TestUpstreamProblemsCarryTheKey(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	p := startProxy(t, "--upstream", dead, "--store", sqliteStore(t))
	for _, method := range []string{"POST", "GET"} {
		a := do(t, method, "http://"+p.addr+"/pay", "key-502", `{}`)
		var pd struct {
			Key string `json:"idempotency_key"`
		}
		json.Unmarshal([]byte(a.body), &pd)
		want(t, method+" status", a.status, 502)
		want(t, method+" idempotency_key", pd.Key, "key-502")
	}
	// The key by its digest (idem.KeyDigest), never in clear: not a review line.
	if !strings.Contains(p.log(), "outcome=upstream_unreachable") || strings.Contains(p.log(), "key-502") ||
		!regexp.MustCompile(`key_digest=[0-9a-f]{12} outcome=upstream_unreachable`).MatchString(p.log()) {
		t.Errorf("the upstream error log line lacks the key's digest and the outcome, or names the key:\n%s", p.log())
	}
}
