package main_test

// The line idem serve logs once it listens: what an operator looks for
// first.

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var readyRE = regexp.MustCompile(`msg="idem serve ready".*`)

// TestStartupSummary: idem serve says once, at startup, where the review
// page is, which admin tokens it loaded (by name, never a token), and
// which requests run in observe mode.
func TestStartupSummary(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "admin.tokens")
	if err := os.WriteFile(tokens, []byte("ops:"+adminToken+"\nalice:"+colonToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const envToken = "env-token-0123456789abcdef"
	cfg := writeConfig(t, "upstream: "+up.URL+"\nstore: memory://\nanonymous: shared\nroutes:\n"+
		"  - match: POST /observed\n    mode: observe\n  - match: POST /enforced\n  - match: POST /off\n    disabled: true\n")
	p := startProxyEnv(t, []string{"IDEM_ADMIN_TOKEN=carol:" + envToken}, "--config", cfg, "--admin", "127.0.0.1:0", "--admin-token-file", tokens)
	eventually(t, "the summary", func() bool { return readyRE.MatchString(p.log()) })
	log := p.log()
	lines := readyRE.FindAllString(log, -1)
	want(t, "summary lines", len(lines), 1)
	wantLine := `msg="idem serve ready" review_page=http://` + p.admin + `/ admin_tokens=alice,carol,ops observe="POST /observed"`
	if lines[0] != wantLine {
		t.Errorf("the summary:\n%s\nwant\n%s", lines[0], wantLine)
	}
	for _, tok := range []string{adminToken, colonToken, envToken} {
		if strings.Contains(log, tok) {
			t.Fatalf("the log holds a token:\n%s", log)
		}
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "observe"}, `review_page="off (no --admin listener)" admin_tokens=none observe=all`},
		{[]string{"--admin", "0.0.0.0:0"}, `review_page="off (no admin token: --admin-token-file or IDEM_ADMIN_TOKEN)" admin_tokens=none observe=none`},
		{[]string{"--admin", "0.0.0.0:0", "--admin-token-file", tokens}, `review_page=http://localhost:`},
	} {
		p := startProxy(t, append([]string{"--upstream", up.URL, "--store", "memory://"}, tc.args...)...)
		eventually(t, "the summary", func() bool { return readyRE.MatchString(p.log()) })
		if line := readyRE.FindString(p.log()); !strings.Contains(line, tc.want) {
			t.Errorf("with %v the summary is\n%s\nwant it to hold\n%s", tc.args, line, tc.want)
		}
	}
}
